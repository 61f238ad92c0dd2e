// Which type each tensor is stored in, and the packing itself. Vectors (norms, biases, RoPE
// factors) stay F32 as llama.cpp keeps them; matrices take the requested type, or llama.cpp's
// fallback when their rows do not fill whole blocks (K-quants need rows of 256: Q4_K falls back
// to Q5_0, then to F16); a low-bit model's LM head is kept at 6 or 8 bits, as llama.cpp does. Quantizing is libinfer's ggml reference quantizer, one native call per
// tensor, so the blocks are bit-identical to what llama.cpp's tools write.
import { InferError } from "../errors.ts";
import { GgmlType, ggmlTypes, rowBytes } from "../gguf/types.ts";
import { check, native } from "../native/lib.ts";

export const QUANT_NAMES = ["F32", "F16", "BF16", "Q8_0", "Q5_0", "Q4_0", "Q4_K"] as const;
export type QuantName = (typeof QUANT_NAMES)[number];

const QUANT_IDS: Record<QuantName, number> = {
  F32: GgmlType.F32, F16: GgmlType.F16, BF16: GgmlType.BF16, Q8_0: GgmlType.Q8_0,
  Q5_0: GgmlType.Q5_0, Q4_0: GgmlType.Q4_0, Q4_K: GgmlType.Q4_K,
};

/** llama.cpp's general.file_type (enum llama_ftype) for each choice. */
const FILE_TYPES: Record<QuantName, number> = {
  F32: 0, F16: 1, Q4_0: 2, Q8_0: 7, Q5_0: 8, Q4_K: 14 /* Q4_K_S */, BF16: 32,
};

/** Where a row length does not fill whole blocks of a type, the type llama.cpp uses instead. */
const FALLBACK: Partial<Record<number, number>> = {
  [GgmlType.Q4_K]: GgmlType.Q5_0,
  [GgmlType.Q5_0]: GgmlType.F16,
  [GgmlType.Q4_0]: GgmlType.F16,
  [GgmlType.Q8_0]: GgmlType.F16,
};

export function parseQuant(name: string): QuantName {
  const upper = name.toUpperCase();
  if (!(QUANT_NAMES as readonly string[]).includes(upper)) {
    throw new InferError("invalid_argument",
      `--quant ${name} is not one of ${QUANT_NAMES.join(", ")}`);
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

/** Types below 8 bits, whose LM head llama.cpp's quantizer keeps at Q6_K (or Q8_0). */
const LOW_BITS = new Set<number>([GgmlType.Q4_0, GgmlType.Q5_0, GgmlType.Q4_K]);

let q6kAvailable: boolean | null = null;

/**
 * The type a tensor is stored in: vectors stay F32; matrices take `quant` or its fallback. The
 * LM head (output.weight, or token_embd.weight when the head is tied to it) of a low-bit model
 * is kept at Q6_K as llama.cpp's quantizer does, at Q8_0 where Q6_K cannot be packed here or
 * its rows do not fill 256-value blocks (llama.cpp's own fallback for Q6_K).
 */
export function storageType(name: string, dims: readonly number[], quant: QuantName,
  o: { lmHead?: boolean } = {}): number {
  if (dims.length < 2) return GgmlType.F32;
  let type: number | undefined = QUANT_IDS[quant];
  if (o.lmHead && LOW_BITS.has(type)) {
    q6kAvailable ??= canQuantize(GgmlType.Q6_K);
    type = q6kAvailable && dims[0] % 256 === 0 ? GgmlType.Q6_K : GgmlType.Q8_0;
  }
  while (type !== undefined && dims[0] % ggmlTypes.get(type)!.blockValues !== 0) type = FALLBACK[type];
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
