// The vocabulary as llama.cpp's llama_vocab::load leaves it: token texts, scores and attributes
// (with the same text-based fix-ups: EOT/EOG/FIM detection, "unused" marking), special ids with
// llama.cpp's per-model defaults, the add_bos/add_eos flags, and the list of special tokens
// that are split out of the text before the tokenizer proper runs. Built from GGUF metadata only.
import { InferError, quote } from "../errors.ts";
import { utf8Length } from "./unicode.ts";

/** GGUF `tokenizer.ggml.token_type` values. */
export const TokenType = {
  undefined: 0, normal: 1, unknown: 2, control: 3, userDefined: 4, unused: 5, byte: 6,
} as const;

/** llama.cpp's llama_token_attr bits. */
export const Attr = {
  undefined: 0,
  unknown: 1 << 0,
  unused: 1 << 1,
  normal: 1 << 2,
  control: 1 << 3,
  userDefined: 1 << 4,
  byte: 1 << 5,
  normalized: 1 << 6,
  lstrip: 1 << 7,
  rstrip: 1 << 8,
  singleWord: 1 << 9,
} as const;

export type VocabKind = "spm" | "bpe";

export interface SpecialIds {
  bos: number | null; eos: number | null; eot: number | null; eom: number | null;
  unk: number | null; sep: number | null; pad: number | null; mask: number | null;
  fimPre: number | null; fimSuf: number | null; fimMid: number | null;
  fimPad: number | null; fimRep: number | null; fimSep: number | null;
}

export interface Vocab {
  readonly kind: VocabKind;
  readonly model: string;
  /** `tokenizer.ggml.pre` ("" when absent). */
  readonly pre: string;
  readonly tokens: readonly string[];
  readonly scores: Float32Array;
  readonly attrs: Uint16Array;
  readonly special: Readonly<SpecialIds>;
  readonly addBos: boolean;
  readonly addEos: boolean;
  readonly addSpacePrefix: boolean;
  readonly eog: ReadonlySet<number>;
  /** Control, user-defined and unknown tokens, longest (in UTF-8 bytes) first. */
  readonly specialTokens: readonly number[];
  /** Text → id for every token; built on first use. */
  tokenToId(): ReadonlyMap<string, number>;
}

const KEY = "tokenizer.ggml.";
type Meta = ReadonlyMap<string, unknown>;

function bad(msg: string): never {
  throw new InferError("bad_model", msg);
}

export function getString(meta: Meta, key: string): string | undefined {
  const v = meta.get(key);
  if (v === undefined) return undefined;
  if (typeof v !== "string") bad(`metadata ${key} must be a string`);
  return v;
}

export function getBool(meta: Meta, key: string): boolean | undefined {
  const v = meta.get(key);
  if (v === undefined) return undefined;
  if (typeof v === "boolean") return v;
  if (typeof v === "number" || typeof v === "bigint") return v !== 0 && v !== 0n;
  bad(`metadata ${key} must be a boolean`);
}

function getUint(meta: Meta, key: string): number | undefined {
  const v = meta.get(key);
  if (v === undefined) return undefined;
  const n = typeof v === "bigint" ? Number(v) : v;
  if (typeof n !== "number" || !Number.isInteger(n) || n < 0) {
    bad(`metadata ${key} must be a non-negative integer`);
  }
  return n;
}

export function getStringArray(meta: Meta, key: string): string[] | undefined {
  const v = meta.get(key);
  if (v === undefined) return undefined;
  if (!Array.isArray(v) || v.some((s) => typeof s !== "string")) {
    bad(`metadata ${key} must be an array of strings`);
  }
  return v as string[];
}

function getNumberArray(meta: Meta, key: string): ArrayLike<number> | undefined {
  const v = meta.get(key);
  if (v === undefined) return undefined;
  if (ArrayBuffer.isView(v) && !(v instanceof DataView) && !(v instanceof BigInt64Array) &&
      !(v instanceof BigUint64Array)) {
    return v as unknown as ArrayLike<number>;
  }
  if (Array.isArray(v) && v.every((x) => typeof x === "number")) return v as number[];
  bad(`metadata ${key} must be a numeric array`);
}

function attrOfType(type: number): number {
  switch (type) {
    case TokenType.unknown: return Attr.unknown;
    case TokenType.unused: return Attr.unused;
    case TokenType.normal: return Attr.normal;
    case TokenType.control: return Attr.control;
    case TokenType.userDefined: return Attr.userDefined;
    case TokenType.byte: return Attr.byte;
    default: return Attr.undefined;
  }
}

// Texts llama.cpp recognises as end-of-turn, end-of-generation and fill-in-the-middle tokens
// (llama-vocab.cpp, "auto-detect special tokens by text").
const EOT_TEXTS = new Set([
  "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
  "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
]);
const EOM_TEXTS = new Set(["<|eom_id|>"]);
const FIM_PRE_TEXTS = new Set(["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>",
  "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"]);
const FIM_SUF_TEXTS = new Set(["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>",
  "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"]);
const FIM_MID_TEXTS = new Set(["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>",
  "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"]);
const FIM_PAD_TEXTS = new Set(["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"]);
const FIM_REP_TEXTS = new Set(["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
  "<reponame>"]);
const FIM_SEP_TEXTS = new Set(["<|file_sep|>"]);
const EOG_TEXTS = new Set([
  "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
  "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
  "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
  "<｜end▁of▁sentence｜>", "[e~[",
]);
const ALWAYS_USER_DEFINED = new Set(["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"]);

export interface VocabOptions {
  kind: VocabKind;
  model: string;
  pre: string;
  /** Defaults that depend on the pre-tokenizer (llama.cpp's per-pre `add_bos`). */
  addBosDefault: boolean;
  addSpacePrefixDefault: boolean;
  /** Default special ids for this tokenizer model, before metadata overrides them. */
  defaults: Partial<SpecialIds>;
}

export function loadVocab(meta: Meta, opt: VocabOptions): Vocab {
  const tokensIn = getStringArray(meta, KEY + "tokens");
  if (tokensIn === undefined) bad("tokenizer metadata lacks tokenizer.ggml.tokens");
  const n = tokensIn.length;
  if (n === 0) bad("tokenizer.ggml.tokens is empty");
  const scoresIn = getNumberArray(meta, KEY + "scores");
  if (scoresIn !== undefined && scoresIn.length < n) bad("tokenizer.ggml.scores is too short");
  const typesIn = getNumberArray(meta, KEY + "token_type");
  if (typesIn !== undefined && typesIn.length < n) bad("tokenizer.ggml.token_type is too short");

  const tokens = tokensIn.map((t, i) => (t === "" ? `[EMPTY_${i}]` : t));
  const scores = new Float32Array(n);
  if (scoresIn) for (let i = 0; i < n; i++) scores[i] = scoresIn[i];
  const attrs = new Uint16Array(n);
  for (let i = 0; i < n; i++) attrs[i] = typesIn ? attrOfType(typesIn[i]) : Attr.normal;

  let map: Map<string, number> | null = null;
  const tokenToId = (): ReadonlyMap<string, number> => {
    if (map !== null) return map;
    const m = new Map<string, number>();
    for (let i = 0; i < n; i++) {
      const prev = m.get(tokens[i]);
      if (prev !== undefined) {
        bad(`duplicate token in vocabulary: ${quote(tokens[i])} has ids ${prev} and ${i}`);
      }
      m.set(tokens[i], i);
    }
    map = m;
    return m;
  };
  tokenToId(); // duplicates are a load error in llama.cpp

  const sp: SpecialIds = {
    bos: null, eos: null, eot: null, eom: null, unk: null, sep: null, pad: null, mask: null,
    fimPre: null, fimSuf: null, fimMid: null, fimPad: null, fimRep: null, fimSep: null,
    ...opt.defaults,
  };
  const idKeys: [keyof SpecialIds, string][] = [
    ["bos", "bos_token_id"], ["eos", "eos_token_id"], ["eot", "eot_token_id"],
    ["eom", "eom_token_id"], ["unk", "unknown_token_id"], ["sep", "seperator_token_id"],
    ["pad", "padding_token_id"], ["mask", "mask_token_id"], ["fimPre", "fim_pre_token_id"],
    ["fimSuf", "fim_suf_token_id"], ["fimMid", "fim_mid_token_id"],
    ["fimPad", "fim_pad_token_id"], ["fimRep", "fim_rep_token_id"],
    ["fimSep", "fim_sep_token_id"], ["fimPre", "prefix_token_id"],
    ["fimSuf", "suffix_token_id"], ["fimMid", "middle_token_id"],
  ];
  for (const [field, key] of idKeys) {
    const cur = sp[field];
    if (cur !== null && cur >= n) sp[field] = null; // a default outside the vocab is disabled
    const v = getUint(meta, KEY + key);
    if (v !== undefined && v < n) sp[field] = v; // an out-of-range id keeps the default
  }

  const addBos = getBool(meta, KEY + "add_bos_token") ?? opt.addBosDefault;
  const addEos = getBool(meta, KEY + "add_eos_token") ?? false;
  const addSpacePrefix = getBool(meta, KEY + "add_space_prefix") ?? opt.addSpacePrefixDefault;
  if (addBos && sp.bos === null) bad("add_bos_token is true, but bos_token_id is not set");
  if (addEos && sp.eos === null) bad("add_eos_token is true, but eos_token_id is not set");

  const eog = fixUpSpecials(tokens, attrs, sp);
  applyNameHeuristics(meta, tokens, attrs, tokenToId());

  const specialTokens: number[] = [];
  for (let i = 0; i < n; i++) {
    if (attrs[i] & (Attr.control | Attr.userDefined | Attr.unknown)) specialTokens.push(i);
  }
  const byteLen = new Map(specialTokens.map((id) => [id, utf8Length(tokens[id])]));
  // llama.cpp sorts by length only (std::sort, unstable); ties are kept in id order here.
  specialTokens.sort((a, b) => byteLen.get(b)! - byteLen.get(a)! || a - b);

  return {
    kind: opt.kind, model: opt.model, pre: opt.pre, tokens, scores, attrs, special: sp,
    addBos, addEos, addSpacePrefix, eog, specialTokens, tokenToId,
  };
}

/** The text-based fix-ups of llama_vocab::load; returns the end-of-generation set. */
function fixUpSpecials(tokens: string[], attrs: Uint16Array, sp: SpecialIds): Set<number> {
  const n = tokens.length;
  const makeControl = (id: number) => { attrs[id] |= Attr.control; };
  // llama.cpp walks an unordered_map here; id order decides ties between several candidates.
  const detect: [keyof SpecialIds, Set<string>][] = [
    ["eot", EOT_TEXTS], ["eom", EOM_TEXTS], ["fimPre", FIM_PRE_TEXTS], ["fimSuf", FIM_SUF_TEXTS],
    ["fimMid", FIM_MID_TEXTS], ["fimPad", FIM_PAD_TEXTS], ["fimRep", FIM_REP_TEXTS],
    ["fimSep", FIM_SEP_TEXTS],
  ];
  for (let id = 0; id < n; id++) {
    for (const [field, texts] of detect) {
      if (sp[field] === null && texts.has(tokens[id])) {
        sp[field] = id;
        makeControl(id);
      }
    }
  }
  for (let id = 0; id < n; id++) {
    if ((attrs[id] & Attr.control) && !(attrs[id] & Attr.unused) && tokens[id].includes("unused")) {
      attrs[id] |= Attr.unused;
    }
  }
  const eog = new Set<number>();
  for (const f of ["fimPad", "fimRep", "fimSep"] as const) if (sp[f] !== null) eog.add(sp[f]!);
  for (let id = 0; id < n; id++) {
    if (EOG_TEXTS.has(tokens[id])) {
      eog.add(id);
      makeControl(id);
    }
  }
  for (let id = 0; id < n; id++) {
    if (ALWAYS_USER_DEFINED.has(tokens[id])) attrs[id] = Attr.userDefined;
  }
  for (const f of ["eos", "eot", "eom"] as const) if (sp[f] !== null) eog.add(sp[f]!);

  // o200k_harmony / solar-open: "<|end|>" is not end-of-generation when these are present.
  const texts = new Set([...eog].map((id) => tokens[id]));
  const endId = [...eog].find((id) => tokens[id] === "<|end|>");
  if (endId !== undefined &&
      ((texts.has("<|return|>") && (texts.has("<|call|>") || texts.has("<|calls|>"))) ||
       ((texts.has("<|call|>") || texts.has("<|calls|>")) && texts.has("<|flush|>")))) {
    eog.delete(endId);
    attrs[endId] = Attr.userDefined;
  }
  // gemma4 / paddleocr: "</s>" is not end-of-generation next to "<|tool_response>".
  const sId = [...eog].find((id) => tokens[id] === "</s>");
  if (sId !== undefined && texts.has("<|tool_response>")) {
    eog.delete(sId);
    attrs[sId] = Attr.normal;
  }
  return eog;
}

/** Per-model token attributes llama.cpp sets from the model's name (lstrip / rstrip). */
function applyNameHeuristics(meta: Meta, tokens: string[],
                             attrs: Uint16Array, ids: ReadonlyMap<string, number>): void {
  const name = (getString(meta, "general.name") ?? "").toLowerCase();
  const pre = getString(meta, KEY + "pre") ?? "";
  const arch = getString(meta, "general.architecture") ?? "";
  const set = (text: string, bit: number, on: boolean) => {
    const id = ids.get(text);
    if (id === undefined) return;
    attrs[id] = on ? attrs[id] | bit : attrs[id] & ~bit;
  };
  if (["jina-v2-de", "jina-v2-es", "jina-v2-code"].some((s) => pre.includes(s)) ||
      ["nomic-bert-moe", "jina-bert-v3"].some((s) => arch.includes(s))) {
    set("<mask>", Attr.lstrip, true);
  } else if (name.includes("phi-3") || name.includes("phi3")) {
    for (let id = 0; id < tokens.length; id++) {
      if (attrs[id] & (Attr.control | Attr.userDefined | Attr.unknown)) attrs[id] |= Attr.rstrip;
    }
    set("</s>", Attr.rstrip, true);
    for (const t of ["<unk>", "<s>", "<|endoftext|>"]) set(t, Attr.rstrip, false);
  } else if (name.includes("modern-bert")) {
    set("[MASK]", Attr.lstrip, true);
  }
}
