// The tokenizer: text <-> token ids, equal to llama.cpp's llama_tokenize / llama_detokenize for
// SentencePiece ("llama") and byte-level BPE ("gpt2") vocabularies. Built from GGUF metadata
// alone; the 262k-entry maps are built once, on first use.
import { InferError, quote } from "../errors.ts";
import { BpeModel } from "./bpe.ts";
import { preTokenizer } from "./pretokenize.ts";
import { partition, type ParseSpecial } from "./special.ts";
import { spmTokenize } from "./spm.ts";
import { decodeAll, PieceStreamDecoder, type PieceSource, type StreamDecoder } from "./stream.ts";
import { gpt2CharToByte, utf8Bytes } from "./unicode.ts";
import { Attr, getString, getStringArray, loadVocab, type Vocab } from "./vocab.ts";

export type { StreamDecoder } from "./stream.ts";

export interface EncodeOptions {
  /** Add BOS/EOS as the model asks (llama.cpp `add_special`). Default true. */
  addSpecial?: boolean;
  /**
   * Turn control-token texts such as `<start_of_turn>` into their ids: never (the default),
   * everywhere, or where a predicate over the occurrence's span [start, end) allows it.
   */
  parseSpecial?: ParseSpecial;
}

export interface DecodeOptions {
  /** Render control tokens as their text (llama.cpp `unparse_special`). Default false. */
  special?: boolean;
}

export interface Tokenizer {
  readonly vocabSize: number;
  readonly bos: number | null;
  readonly eos: number | null;
  readonly addBos: boolean;
  encode(text: string, options?: EncodeOptions): number[];
  decode(ids: readonly number[], options?: DecodeOptions): string;
  tokenText(id: number): string;
  /** The bytes token `id` stands for in text (llama.cpp's token_to_piece; none for control tokens). */
  tokenBytes(id: number): Uint8Array;
  isEndOfGeneration(id: number): boolean;
  /** The texts that become tokens only where control tokens are parsed (parseSpecial). */
  controlTexts(): readonly string[];
  decoder(options?: DecodeOptions): StreamDecoder;
}

const SPACE_MARK = "\u2581"; // SentencePiece's visible space
const HEX_BYTE = /^<0x([0-9A-Fa-f]{2})>$/;

export function tokenizerFromMetadata(meta: ReadonlyMap<string, unknown>): Tokenizer {
  const model = getString(meta, "tokenizer.ggml.model");
  if (model === undefined) throw new InferError("bad_model", "metadata lacks tokenizer.ggml.model");
  const pre = getString(meta, "tokenizer.ggml.pre") ?? "";
  if (model === "llama") {
    const vocab = loadVocab(meta, {
      kind: "spm", model, pre, addBosDefault: true, addSpacePrefixDefault: true,
      defaults: { bos: 1, eos: 2, unk: 0 },
    });
    return new LlamaTokenizer(vocab, null);
  }
  if (model === "gpt2") {
    const p = preTokenizer(pre);
    const merges = getStringArray(meta, "tokenizer.ggml.merges");
    if (merges === undefined) {
      throw new InferError("bad_model", "cannot find tokenizer merges (tokenizer.ggml.merges)");
    }
    const vocab = loadVocab(meta, {
      kind: "bpe", model, pre, addBosDefault: p.addBos, addSpacePrefixDefault: false,
      defaults: { bos: 11, eos: 11 },
    });
    return new LlamaTokenizer(vocab, new BpeModel(vocab, p, merges));
  }
  throw new InferError("bad_model", `unknown tokenizer model: ${quote(model)}`);
}

class LlamaTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly bos: number | null;
  readonly eos: number | null;
  readonly addBos: boolean;
  private readonly pieces: (Uint8Array | undefined)[][] = [[], []];

  constructor(private readonly vocab: Vocab, private readonly bpe: BpeModel | null) {
    this.vocabSize = vocab.tokens.length;
    this.bos = vocab.special.bos;
    this.eos = vocab.special.eos;
    this.addBos = vocab.addBos;
  }

  encode(text: string, options: EncodeOptions = {}): number[] {
    const addSpecial = options.addSpecial ?? true;
    const v = this.vocab;
    const raw = text.toWellFormed();
    const out: number[] = [];
    if (addSpecial && v.addBos) out.push(v.special.bos!);
    let prevSpecial = true;
    for (const f of partition(v, raw, options.parseSpecial ?? false)) {
      if (f.kind === "token") {
        out.push(f.id);
        prevSpecial = true;
        continue;
      }
      const piece = raw.slice(f.start, f.end);
      if (this.bpe) this.bpe.tokenize(piece, out);
      else {
        const spaced = v.addSpacePrefix && prevSpecial ? " " + piece : piece;
        spmTokenize(v, spaced.replaceAll(" ", SPACE_MARK), out);
      }
      prevSpecial = false;
    }
    if (addSpecial && v.addEos) out.push(v.special.eos!);
    return out;
  }

  decode(ids: readonly number[], options: DecodeOptions = {}): string {
    return decodeAll(this.source(options.special ?? false), ids);
  }

  decoder(options: DecodeOptions = {}): StreamDecoder {
    return new PieceStreamDecoder(this.source(options.special ?? false));
  }

  tokenText(id: number): string {
    this.check(id);
    return this.vocab.tokens[id];
  }

  tokenBytes(id: number): Uint8Array {
    return this.piece(id, false);
  }

  isEndOfGeneration(id: number): boolean {
    return this.vocab.eog.has(id);
  }

  controlTexts(): readonly string[] {
    const v = this.vocab;
    return v.specialTokens.filter((id) => (v.attrs[id] & (Attr.control | Attr.unknown)) !== 0)
      .map((id) => v.tokens[id]).filter((t) => t !== "");
  }

  private check(id: number): void {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
      throw new InferError("invalid_argument", `token id ${id} is outside the vocabulary`);
    }
  }

  private source(special: boolean): PieceSource {
    // llama_detokenize with remove_special = false: a leading space of the first piece is
    // dropped when the model adds a space prefix.
    return {
      cleanSpaces: this.bpe?.pre.cleanSpaces ?? false,
      piece: (id, first) => {
        const p = this.piece(id, special);
        return first && this.vocab.addSpacePrefix && p[0] === 0x20 ? p.subarray(1) : p;
      },
    };
  }

  /** llama.cpp's token_to_piece. */
  private piece(id: number, special: boolean): Uint8Array {
    this.check(id);
    const cache = this.pieces[special ? 1 : 0];
    let p = cache[id];
    if (p === undefined) {
      p = this.makePiece(id, special);
      cache[id] = p;
    }
    return p;
  }

  private makePiece(id: number, special: boolean): Uint8Array {
    const attr = this.vocab.attrs[id];
    const text = this.vocab.tokens[id];
    if (attr & (Attr.unknown | Attr.control)) return special ? utf8Bytes(text) : new Uint8Array();
    if (attr & Attr.userDefined) return utf8Bytes(text);
    if (attr & Attr.normal) {
      return this.bpe ? gpt2Decode(text) : utf8Bytes(text.replaceAll(SPACE_MARK, " "));
    }
    if (attr & Attr.byte) {
      const m = HEX_BYTE.exec(text);
      if (m) return Uint8Array.of(parseInt(m[1], 16));
    }
    return new Uint8Array(); // unused / undefined tokens render as nothing
  }
}

/** Undo GPT-2's byte-to-unicode mapping (llama_decode_text). */
function gpt2Decode(text: string): Uint8Array {
  const c2b = gpt2CharToByte();
  const out: number[] = [];
  for (const ch of text) {
    const b = c2b.get(ch.codePointAt(0)!);
    if (b !== undefined) {
      out.push(b);
      continue;
    }
    const hex = Array.from(utf8Bytes(ch), (x) => x.toString(16).padStart(2, "0")).join("");
    out.push(...utf8Bytes(`[UNK_BYTE_0x${hex}${text}]`));
  }
  return Uint8Array.from(out);
}

