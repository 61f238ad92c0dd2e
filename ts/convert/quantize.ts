// Which type each tensor is stored in, and the packing itself, following llama-quantize
// (llama.cpp's src/llama-quant.cpp, llama_tensor_get_type) for the architectures infer imports:
//  - vectors (norms, biases, RoPE factors) stay F32;
//  - a quantized model's LM head (output.weight, or token_embd.weight when the head is tied to
//    it) is kept at Q6_K (Q8_0 where its rows do not fill 256-value blocks), unless the model is
//    Q8_0 or Q6_K already;
//  - the mixes Q4_K_M and Q4_K_S give attn_v and ffn_down of some layers more bits (Q4_K_M: a
//    fused attn_qkv Q5_K in every layer);
//  - a matrix whose rows do not fill whole blocks of its type falls back as llama.cpp's does.
// Quantizing is libinfer's port of ggml's reference quantizers, one native call per tensor, so
// the blocks are byte-identical to llama-quantize's (test/quantize-k.test.ts,
// test/fixtures/quant-k-golden.py).
import { InferError, quote } from "../errors.ts";
import { GgmlType, ggmlTypes, rowBytes } from "../gguf/types.ts";
import { check, native } from "../native/lib.ts";

export const QUANT_NAMES = ["F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_0", "Q4_K_M",
  "Q4_K_S", "Q4_K", "Q4_0"] as const;
export type QuantName = (typeof QUANT_NAMES)[number];

/** The type of every matrix that no rule below singles out. */
const QUANT_IDS: Record<QuantName, number> = {
  F32: GgmlType.F32, F16: GgmlType.F16, BF16: GgmlType.BF16, Q8_0: GgmlType.Q8_0,
  Q6_K: GgmlType.Q6_K, Q5_K: GgmlType.Q5_K, Q5_0: GgmlType.Q5_0, Q4_K_M: GgmlType.Q4_K,
  Q4_K_S: GgmlType.Q4_K, Q4_K: GgmlType.Q4_K, Q4_0: GgmlType.Q4_0,
};

/**
 * llama.cpp's general.file_type (enum llama_ftype) for each choice. Q4_K (every matrix Q4_K
 * but the LM head) is not one of llama.cpp's mixes; it is written as "mostly Q4_K" (Q4_K_S's
 * number, which `llama-quantize --pure Q4_K_S` writes too). Q5_K is llama.cpp's Q5_K_S.
 */
const FILE_TYPES: Record<QuantName, number> = {
  F32: 0, F16: 1, Q4_0: 2, Q8_0: 7, Q5_0: 8, Q4_K: 14, Q4_K_S: 14, Q4_K_M: 15, Q5_K: 16,
  Q6_K: 18, BF16: 32,
};

/**
 * Where a row length does not fill whole blocks of a type, the type llama.cpp uses instead
 * (tensor_type_fallback). One deviation: llama.cpp demotes Q5_K to Q5_1, which infer does not
 * compute; infer uses Q5_0, the same size class (5.5 against 6 bits per value).
 */
const FALLBACK: Partial<Record<number, number>> = {
  [GgmlType.Q6_K]: GgmlType.Q8_0,
  [GgmlType.Q5_K]: GgmlType.Q5_0,
  [GgmlType.Q4_K]: GgmlType.Q5_0,
  [GgmlType.Q5_0]: GgmlType.F16,
  [GgmlType.Q4_0]: GgmlType.F16,
  [GgmlType.Q8_0]: GgmlType.F16,
};

export function parseQuant(name: string): QuantName {
  const upper = name.toUpperCase();
  if (!(QUANT_NAMES as readonly string[]).includes(upper)) {
    throw new InferError("invalid_argument",
      `--quant must be one of ${QUANT_NAMES.join(", ")}, got ${quote(name, 40)}`);
  }
  const quant = upper as QuantName;
  assertCanQuantize(QUANT_IDS[quant], quant);
  return quant;
}

export function fileType(quant: QuantName): number {
  return FILE_TYPES[quant];
}

function canQuantize(type: number): boolean {
  if (type === GgmlType.F32) return true;
  const probe = new Float32Array(256), out = new Uint8Array(rowBytes(ggmlTypes.get(type)!, 256));
  return native().infer_quantize_row(type, probe, 256, out) === 0;
}

/** Fails early, before any file is written, when libinfer cannot pack this type. */
function assertCanQuantize(type: number, name: string): void {
  if (!canQuantize(type)) {
    throw new InferError("unsupported",
      `--quant ${name}: this build of libinfer cannot quantize to ` +
      `${name} (${String(native().infer_last_error())})`);
  }
}

/** Quantized types whose LM head llama-quantize raises to Q6_K (Q8_0 and Q6_K keep theirs). */
const HEAD_TO_Q6_K = new Set<number>([GgmlType.Q4_0, GgmlType.Q5_0, GgmlType.Q4_K,
  GgmlType.Q5_K]);

/** What the per-layer rules of a mix need to know about the model. */
export interface ModelShape {
  /** block_count: llama.cpp's n_layer for ffn_down, and the count of attn_v tensors. */
  readonly layers: number;
  /** llama.cpp's LLM_TYPE_70B (80-layer Llama with GQA, 80-layer Qwen 2): attn_v gets Q5_K. */
  readonly is70b: boolean;
}

/** The ModelShape of a model from its GGUF metadata (architecture prefix included). */
export function modelShape(architecture: string, get: (key: string) => unknown): ModelShape {
  const num = (key: string): number => {
    const v = get(`${architecture}.${key}`);
    return typeof v === "number" ? v : typeof v === "bigint" ? Number(v) : 0;
  };
  const layers = num("block_count");
  const gqa = num("attention.head_count") !== num("attention.head_count_kv");
  return {
    layers,
    is70b: layers === 80 && ((architecture === "llama" && gqa) || architecture === "qwen2"),
  };
}

/** llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between. */
function useMoreBits(layer: number, layers: number): boolean {
  const eighth = Math.floor(layers / 8);
  return layer < eighth || layer >= Math.floor((7 * layers) / 8) || (layer - eighth) % 3 === 2;
}

/** The per-layer rules of llama-quantize's Q4_K_M and Q4_K_S for attn_v and ffn_down. */
function mixRule(quant: QuantName, type: number, name: string, model?: ModelShape): number {
  if (quant !== "Q4_K_M" && quant !== "Q4_K_S") return type;
  if (!model || model.layers < 1) {
    throw new InferError("bad_model", `--quant ${quant} needs the model's block_count`);
  }
  const m = /^blk\.(\d+)\./.exec(name);
  if (!m) return type;
  const layer = Number(m[1]);
  if (name.includes("attn_v.weight")) {
    if (quant === "Q4_K_M" && useMoreBits(layer, model.layers)) type = GgmlType.Q6_K;
    else if (quant === "Q4_K_S" && layer < 4) type = GgmlType.Q5_K;
    return model.is70b && type === GgmlType.Q4_K ? GgmlType.Q5_K : type;
  }
  // A fused Q/K/V (Phi-3's attn_qkv) takes Q5_K in the whole of Q4_K_M, as llama-quantize.
  if (name.includes("attn_qkv.weight")) return quant === "Q4_K_M" ? GgmlType.Q5_K : type;
  if (name.includes("ffn_down")) {
    if (quant === "Q4_K_M" && useMoreBits(layer, model.layers)) return GgmlType.Q6_K;
    if (quant === "Q4_K_S" && layer < Math.floor(model.layers / 8)) return GgmlType.Q5_K;
  }
  return type;
}

export interface StorageOptions {
  /** output.weight, or token_embd.weight when the model has no output.weight. */
  readonly lmHead?: boolean;
  /** Needed by the Q4_K_M / Q4_K_S layer rules. */
  readonly model?: ModelShape;
  /**
   * Every matrix in the chosen type, the LM head too (no Q6_K head, no mix rules; rows that do
   * not fill blocks still fall back): the cheapest pass, for a self-speculation draft.
   */
  readonly pure?: boolean;
}

/** The type a tensor is stored in (see the top of this file). */
export function storageType(name: string, dims: readonly number[], quant: QuantName,
  o: StorageOptions = {}): number {
  // A router stays f32, as llama-quantize keeps it: its few logits choose the experts.
  // Biases (gpt-oss's per-expert tables are 2-D) stay f32 too: llama-quantize quantizes only "weight"s.
  if (dims.length < 2 || !name.endsWith(".weight") || name.endsWith("ffn_gate_inp.weight")) {
    return GgmlType.F32;
  }
  let type: number | undefined = QUANT_IDS[quant];
  if (o.pure) {
    // the chosen type everywhere
  } else if (o.lmHead && HEAD_TO_Q6_K.has(type)) {
    type = dims[0] % 256 === 0 ? GgmlType.Q6_K : GgmlType.Q8_0;
  } else if (!o.lmHead) {
    type = mixRule(quant, type, name, o.model);
  }
  while (type !== undefined && dims[0] % ggmlTypes.get(type)!.blockValues !== 0) {
    type = FALLBACK[type];
  }
  if (type === undefined) throw new InferError("unsupported",
    `tensor '${name}': no type fits rows of ${dims[0]}`);
  return type;
}

/** Packs f32 values (whole rows) into `type`. */
export function quantize(values: Float32Array, type: number, name: string): Uint8Array {
  if (type === GgmlType.F32) return new Uint8Array(values.buffer, values.byteOffset,
    values.byteLength);
  const info = ggmlTypes.get(type)!;
  if (values.length % info.blockValues !== 0) {
    throw new InferError("internal",
      `tensor '${name}': ${values.length} values do not fill ${info.name} blocks`);
  }
  const out = new Uint8Array(rowBytes(info, values.length));
  check(native().infer_quantize_row(type, values, values.length, out),
    `quantizing '${name}' to ${info.name}`);
  return out;
}

/** A tensor's data widened to f32 (F32, F16, BF16 and every quant type libinfer computes). */
export function dequantize(bytes: Uint8Array, type: number, count: number,
  name: string): Float32Array {
  const out = new Float32Array(count);
  if (type === GgmlType.F32) {
    new Uint8Array(out.buffer).set(bytes.subarray(0, count * 4));
    return out;
  }
  check(native().infer_dequantize(type, bytes, count, out), `reading '${name}'`);
  return out;
}
