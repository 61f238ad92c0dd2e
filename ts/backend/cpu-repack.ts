// Weights the CPU kernels multiply faster in another layout than the file's. Q4_0, Q8_0 and Q4_K
// matrices (rows a multiple of 8) are copied once into lib/quant/q4_0_x8.zig's, q8_0_x8.zig's and
// q4_k_x8.zig's layouts, eight rows interleaved (Q4_0 and Q4_K as llama.cpp repacks them): the
// same bytes, the same sums in the same order, vector FMAs over eight rows instead of one row's
// chain at a time. The mapped file stays what embedding lookups read. INFER_REPACK=0 keeps every
// weight as stored.
import { setting } from "../config/env.ts";
import { check, native, type Pointer } from "../native/lib.ts";
import type { Arena } from "./arena.ts";

/** The copy: its type and address in the backend's weight arena, which owns it. */
export interface MatmulLayout {
  readonly typeId: number;
  readonly address: Pointer;
}

export function repackEnabled(): boolean {
  return setting("INFER_REPACK");
}

/**
 * The repacked copy of a weight of `typeId` (dims in ggml order: [n_in, n_out]) stored at
 * `address` (mapped from its file: `release(offset, bytes)` drops bytes of it, relative to
 * `address`, from memory), or null where the kernels use it as stored.
 */
export function repackForMatmul(typeId: number, dims: readonly number[], address: Pointer,
  byteLength: number, arena: Arena, release: (offset: number, bytes: number) => void): MatmulLayout | null {
  if (!repackEnabled() || dims.length !== 2) return null;
  const lib = native();
  const packedType = lib.infer_repacked_type(typeId, dims[1]);
  if (packedType === 0) return null;
  const region = arena.alloc(byteLength);
  check(lib.infer_repack(typeId, address, dims[1], dims[0], region.address), "repack");
  // The copy is what matmul reads: the mapped bytes, paged in to be copied, leave the process's
  // memory (a later read, e.g. a tied embedding's rows, faults them back from the page cache),
  // so a repacked model is resident once, not twice. Per tensor: releasing every 8 MiB as it
  // was copied held one chunk at a time but made loads 3-4x slower (Llama-3.2-1B Q4_0 1.3-2.0 s
  // against 0.4-0.5 s), for the transient of the largest tensor only.
  release(0, byteLength);
  return { typeId: packedType, address: region.address };
}
