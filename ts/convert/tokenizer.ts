// The tokenizer of a Hugging Face folder as GGUF metadata, the way llama.cpp's converter writes it
// (convert_hf_to_gguf's get_vocab_base / _set_vocab_gpt2 and gguf-py's SpecialVocab): the token
// list padded to the model's vocab_size, token types (added special tokens are control tokens),
// BPE merges, the pre-tokenizer named by its regex, special token ids from tokenizer_config.json
// and config.json, add_bos/add_eos, and the chat template. A folder with a SentencePiece
// tokenizer.model is read from it, as the converter does (_create_vocab_sentencepiece: the
// pieces with their scores and types, then added_tokens.json and tokenizer_config.json's
// added_tokens_decoder on top); otherwise tokenizer.json must hold a byte-level BPE.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { InferError } from "../errors.ts";
import { gguf, type GgufTypedValue } from "../gguf/writer.ts";
import { PieceType, readSentencePieceModel } from "./sentencepiece.ts";

/** GGUF token types. */
const TokenType = { normal: 1, unknown: 2, control: 3, userDefined: 4, unused: 5,
  byte: 6 } as const;

// Pre-tokenizer regexes as the families' tokenizer.json files spell them, and the name llama.cpp
// gives each (it identifies them by hashing a tokenization; the regex is the same fact).
const PRE_BY_REGEX: Record<string, string> = {
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+":
    "llama-bpe",
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+":
    "qwen2",
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+":
    "gpt-4o",
};

type Json = Record<string, unknown>;

function bad(msg: string): never {
  throw new InferError("bad_model", msg);
}

function readJson(path: string): Json | null {
  if (!existsSync(path)) return null;
  try {
    const v = JSON.parse(readFileSync(path, "utf8"));
    if (typeof v !== "object" || v === null || Array.isArray(v)) bad(`${path}: not a JSON object`);
    return v as Json;
  } catch (err) {
    if (err instanceof InferError) throw err;
    return bad(`${path}: not valid JSON (${(err as Error).message})`);
  }
}

interface AddedToken { id: number; content: string; special: boolean }

export interface TokenizerOptions {
  /** tokenizer.ggml.add_space_prefix for a SentencePiece model (Gemma 3: false); default: the
   * model's own add_dummy_prefix. */
  readonly addSpacePrefix?: boolean;
}

/** GGUF tokenizer.* entries for the folder; `vocabSize` is the model's embedding rows. */
export function tokenizerMetadata(folder: string, vocabSize: number,
  o: TokenizerOptions = {}): [string, GgufTypedValue][] {
  if (existsSync(join(folder, "tokenizer.model"))) {
    return sentencePieceMetadata(folder, vocabSize, o);
  }
  const tokenizerPath = join(folder, "tokenizer.json");
  const tok = readJson(tokenizerPath);
  if (!tok) throw new InferError("unsupported", `${folder}: no tokenizer.json or tokenizer.model`);
  const model = tok.model as Json | undefined;
  if (model?.type !== "BPE" || !hasByteLevel(tok)) {
    throw new InferError("unsupported",
      `${tokenizerPath}: only byte-level BPE tokenizers are imported ` +
      `(model type ${String(model?.type)})`);
  }
  const vocab = model.vocab as Record<string, unknown>;
  if (typeof vocab !== "object" || vocab === null) bad(`${tokenizerPath}: model.vocab is missing`);
  const added = addedTokens(tok, tokenizerPath);

  const tokens: (string | undefined)[] = new Array(vocabSize);
  const types = new Int32Array(vocabSize);
  const place = (text: string, id: unknown, type: number) => {
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0) bad(
      `${tokenizerPath}: token ${JSON.stringify(text)} has id ${String(id)}`);
    if (id >= vocabSize) bad(
      `${tokenizerPath}: token ${JSON.stringify(text)} has id ${id}, beyond vocab_size ${vocabSize}`);
    tokens[id] = text;
    types[id] = type;
  };
  for (const [text, id] of Object.entries(vocab)) place(text, id, TokenType.normal);
  for (const t of added) {
    place(t.content, t.id, t.special || looksSpecial(t.content) ? TokenType.control
      : TokenType.userDefined);
  }
  for (let i = 0; i < vocabSize; i++) {
    if (tokens[i] === undefined) { tokens[i] = `[PAD${i}]`; types[i] = TokenType.unused; }
  }

  const out: [string, GgufTypedValue][] = [
    ["tokenizer.ggml.model", gguf.str("gpt2")],
    ["tokenizer.ggml.pre", gguf.str(preTokenizerName(tok, tokenizerPath))],
    ["tokenizer.ggml.tokens", gguf.strs(tokens as string[])],
    ["tokenizer.ggml.token_type", gguf.i32s(types)],
    ["tokenizer.ggml.merges", gguf.strs(merges(model, tokenizerPath))],
  ];
  out.push(...specialMetadata(folder, tok, added, vocabSize));
  return out;
}

/** A SentencePiece model as convert_hf_to_gguf's _set_vocab_sentencepiece writes it. */
function sentencePieceMetadata(folder: string, vocabSize: number,
  o: TokenizerOptions): [string, GgufTypedValue][] {
  const model = readSentencePieceModel(join(folder, "tokenizer.model"));
  const tokens = Array.from({ length: vocabSize }, (_, i) => `[PAD${i}]`);
  const scores = new Float32Array(vocabSize).fill(-10000);
  const types = new Int32Array(vocabSize).fill(TokenType.unused);
  model.pieces.forEach((p, id) => {
    if (id >= vocabSize) return; // the converter drops pieces past the embedding, too
    tokens[id] = p.text;
    scores[id] = p.score;
    // The converter asks IsUnknown / IsControl / IsUnused / IsByte; user-defined pieces end up
    // normal unless tokenizer_config.json names them below.
    types[id] = p.type === PieceType.userDefined ? TokenType.normal : p.type;
  });
  const place = (id: number, text: string, type: number) => {
    if (id >= vocabSize) return;
    tokens[id] = text;
    scores[id] = -1000;
    types[id] = type;
  };
  const addedPath = join(folder, "added_tokens.json");
  for (const [text, id] of Object.entries(readJson(addedPath) ?? {})) {
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0) bad(
      `${addedPath}: token ${JSON.stringify(text)} has id ${String(id)}`);
    place(id, text, TokenType.userDefined);
  }
  const configPath = join(folder, "tokenizer_config.json");
  const decoder = readJson(configPath)?.added_tokens_decoder ?? {};
  for (const [key, entry] of Object.entries(decoder as Record<string, Json>)) {
    const id = Number(key), content = entry?.content;
    if (!Number.isInteger(id) || id < 0 || typeof content !== "string") bad(
      `${configPath}: bad added_tokens_decoder entry ${JSON.stringify(key)}`);
    if (entry.special === true || looksSpecial(content)) place(id, content, TokenType.control);
    else place(id, content.replaceAll("\u2581", " "), TokenType.userDefined);
  }
  const tok = readJson(join(folder, "tokenizer.json")) ?? {};
  return [
    ["tokenizer.ggml.model", gguf.str("llama")],
    ["tokenizer.ggml.pre", gguf.str("default")],
    ["tokenizer.ggml.tokens", gguf.strs(tokens)],
    ["tokenizer.ggml.scores", gguf.f32s(scores)],
    ["tokenizer.ggml.token_type", gguf.i32s(types)],
    ...specialMetadata(folder, tok, addedTokens(tok, join(folder, "tokenizer.json")), vocabSize),
    ["tokenizer.ggml.add_space_prefix", gguf.bool(o.addSpacePrefix ?? model.addDummyPrefix)],
  ];
}

function hasByteLevel(tok: Json): boolean {
  const isByteLevel = (p: unknown): boolean => {
    const o = p as Json | null;
    if (!o) return false;
    if (o.type === "ByteLevel") return true;
    return o.type === "Sequence" && Array.isArray(o.pretokenizers) && o.pretokenizers.some(
      isByteLevel);
  };
  return isByteLevel(tok.pre_tokenizer) || (tok.decoder as Json | null)?.type === "ByteLevel";
}

function addedTokens(tok: Json, path: string): AddedToken[] {
  const list = tok.added_tokens ?? [];
  if (!Array.isArray(list)) bad(`${path}: added_tokens is not a list`);
  return list.map((t: Json) => {
    if (typeof t?.content !== "string" || typeof t.id !== "number") bad(
      `${path}: bad added token ${JSON.stringify(t)}`);
    return { id: t.id, content: t.content, special: t.special === true };
  });
}

/** Added tokens some models forget to mark special (
  convert_hf_to_gguf's does_token_look_special). */
function looksSpecial(text: string): boolean {
  return ["<pad>", "<mask>", "<2mass>", "[@BOS@]"].includes(text) ||
    (text.startsWith("<|") && text.endsWith("|>")) || (text.startsWith("<｜") && text.endsWith("｜>")) ||
    (text.startsWith("<unused") && text.endsWith(">"));
}

function preTokenizerName(tok: Json, path: string): string {
  const splits: string[] = [];
  let byteLevelRegex = false;
  const walk = (p: unknown) => {
    const o = p as Json | null;
    if (!o) return;
    if (o.type === "Sequence" && Array.isArray(o.pretokenizers)) o.pretokenizers.forEach(walk);
    if (o.type === "Split") {
      const pattern = (o.pattern as Json | undefined)?.Regex;
      if (typeof pattern === "string") splits.push(pattern);
    }
    if (o.type === "ByteLevel" && o.use_regex !== false) byteLevelRegex = true;
  };
  walk(tok.pre_tokenizer);
  if (splits.length === 0 && byteLevelRegex) return "gpt-2";
  if (splits.length === 1 && !byteLevelRegex && PRE_BY_REGEX[splits[0]]) return PRE_BY_REGEX[splits[0]];
  throw new InferError("unsupported", `${path}: the pre-tokenizer ` +
    `${JSON.stringify(splits)} is not one infer recognises (Llama 3, Qwen 2 and GPT-2 patterns are)`);
}

function merges(model: Json, path: string): string[] {
  const list = model.merges;
  if (!Array.isArray(list)) bad(`${path}: model.merges is missing`);
  // Newer tokenizer.json files store pairs; a space inside a part is written as U+0120 so that
  // "a b" stays splittable (gguf-py's SpecialVocab does the same).
  return list.map((m: unknown) => {
    if (typeof m === "string") return m;
    if (Array.isArray(m) && m.length === 2 && typeof m[0] === "string" && typeof m[
      1] === "string") {
      return m.map((part: string) => part.replaceAll(" ", "\u0120")).join(" ");
    }
    return bad(`${path}: bad merge ${JSON.stringify(m)}`);
  });
}

const SPECIAL_KINDS = [
  ["bos", "bos_token_id"], ["eos", "eos_token_id"], ["unk", "unknown_token_id"],
  ["sep", "seperator_token_id"], ["pad", "padding_token_id"], ["cls", "cls_token_id"],
  ["mask", "mask_token_id"],
] as const;

/** Special ids, add_bos/add_eos and the chat template, as gguf-py's SpecialVocab finds them. */
function specialMetadata(folder: string, tok: Json, added: AddedToken[], vocabSize: number): [
  string, GgufTypedValue][] {
  const config = readJson(join(folder, "tokenizer_config.json"));
  const modelConfig = readJson(join(folder, "config.json")) ?? {};
  const ids = new Map<string, number>();
  const add = new Map<string, boolean>();
  const tokenText = (v: unknown): string | null =>
    typeof v === "string" ? v : typeof (v as Json | null)?.content === "string" ? (
      v as Json).content as string : null;

  // A TemplateProcessing post-processor that starts with BOS means "add BOS" (Llama 3).
  const post = tok.post_processor as Json | null;
  const processors = post ? (Array.isArray(post.processors) ? post.processors as Json[] : [post]) : [];
  let templateFirst: string | null = null;
  for (const p of processors) {
    if (p?.type !== "TemplateProcessing" || !Array.isArray(p.single)) continue;
    const single = p.single as Json[];
    const first = (single[0]?.SpecialToken as Json | undefined)?.id;
    if (single.length > 1 && typeof first === "string") templateFirst = first;
    const last = (single[single.length - 1]?.SpecialToken as Json | undefined)?.id;
    if (single.length > 1 && typeof last === "string") add.set("eos", last === tokenText(
      config?.eos_token));
    const sep = addSepFromPair(p, single.length > 1 ? first : undefined,
      single.length > 1 ? last : undefined, [tokenText(config?.sep_token), tokenText(
        config?.eos_token)]);
    if (sep !== null) add.set("sep", sep);
  }
  const bosText = tokenText(config?.bos_token) ?? (config ? null : templateFirst);
  if (templateFirst !== null) add.set("bos", templateFirst === bosText);
  for (const [kind] of SPECIAL_KINDS) {
    const entry = config?.[`add_${kind}_token`];
    if (typeof entry === "boolean") add.set(kind, entry);
    const text = kind === "bos" ? bosText : tokenText(config?.[`${kind}_token`]);
    const id = text === null ? undefined : added.find((t) => t.content === text)?.id;
    if (id !== undefined && id < vocabSize) ids.set(kind, id);
  }
  for (const [kind] of SPECIAL_KINDS) {
    const id = modelConfig[`${kind}_token_id`];
    if (!ids.has(kind) && typeof id === "number" && Number.isInteger(id) && id >= 0
      && id < vocabSize) ids.set(kind, id);
  }

  const out: [string, GgufTypedValue][] = [];
  for (const [kind, key] of SPECIAL_KINDS) {
    if (ids.has(kind)) out.push([`tokenizer.ggml.${key}`, gguf.u32(ids.get(kind)!)]);
  }
  for (const kind of ["bos", "eos", "sep"]) {
    if (add.has(kind)) out.push([`tokenizer.ggml.add_${kind}_token`, gguf.bool(add.get(kind)!)]);
  }
  const template = chatTemplate(folder, config);
  if (template !== null) out.push(["tokenizer.chat_template", gguf.str(template)]);
  return out;
}

/**
 * SpecialVocab's reading of a TemplateProcessing `pair` ("A [sep] B" between the single
 * template's leading and trailing specials): add_sep when the separator is the sep or EOS token.
 * null where the pair template says nothing.
 */
function addSepFromPair(p: Json, first: unknown, last: unknown,
  sepOrEos: (string | null)[]): boolean | null {
  const pair = Array.isArray(p.pair) ? p.pair as Json[] : [];
  const special = (e: Json | undefined) => (e?.SpecialToken as Json | undefined)?.id;
  const sequence = (e: Json | undefined) => (e?.Sequence as Json | undefined)?.id;
  const start = first && special(pair[0]) === first ? 1 : 0;
  const stop = last && special(pair[pair.length - 1]) === last ? pair.length - 1 : pair.length;
  const inner = pair.slice(start, stop);
  if (inner.length < 3 || sequence(inner[0]) !== "A" || sequence(inner[inner.length - 1]) !== "B") {
    return null;
  }
  const middle = inner.slice(1, -1);
  const isSep = (e: Json | undefined) => {
    const id = special(e);
    return typeof id === "string" && sepOrEos.includes(id);
  };
  return (isSep(middle[0]) && !last) || (middle.length === 2 && isSep(middle[1]));
}

function chatTemplate(folder: string, config: Json | null): string | null {
  const inline = config?.chat_template;
  if (typeof inline === "string") return inline;
  if (Array.isArray(inline)) {
    // Named templates: llama.cpp keeps "default" as tokenizer.chat_template.
    const d = inline.find((t: Json) => t?.name === "default") as Json | undefined;
    if (typeof d?.template === "string") return d.template;
  }
  const jinja = join(folder, "chat_template.jinja");
  if (existsSync(jinja)) return readFileSync(jinja, "utf8");
  const json = readJson(join(folder, "chat_template.json"));
  return typeof json?.chat_template === "string" ? json.chat_template : null;
}
