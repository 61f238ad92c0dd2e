// The context shift on the CUDA backend (Backend.shiftKv / compactKv; ts/engine/kv-cache.ts
// shiftSlot and shiftSlotHeavy): rows of one layer's cache move to lower cells and their keys are
// rotated back by the move with the layer's RoPE, as ts/backend/cpu.ts does it (the same
// dequantize, rotate, quantize again; lib/cuda/kv_shift.zig, shaders/cuda/kv_shift.cuh). The
// kernels go through scratch, so the moves may overlap; the scratch grows to the largest shift
// seen and is kept.
import { InferError } from "../errors.ts";
import { callNamed } from "../native/calls.ts";
import { check, native } from "../native/lib.ts";
import type { RopeOptions } from "./backend.ts";

type Lib = ReturnType<typeof native>;

/** What the shift reads of a CUDA cache layer (ts/backend/cuda.ts CudaKvLayer). */
export interface ShiftLayer {
  readonly cells: number;
  readonly ring: boolean;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly k: number;
  readonly v: number;
  readonly kTypeId: number;
  readonly vTypeId: number;
}

export interface ShiftDevice {
  alloc(bytes: number, what: string): number;
  release(address: number): void;
  /** Waits for the queued work (before the scratch it may read is released). */
  sync(): void;
}

/**
 * The factor that divides the kernel's own YaRN mscale out of a pure rotation: the keys were
 * scaled when they were stored (to within an ulp, as on the CPU, whose expression this is).
 */
function rotationAttnFactor(rope: RopeOptions): number {
  return rope.yarn ? Math.fround(1 / Math.fround(1 + 0.1 * Math.log(1 / rope.scale))) : 1;
}

/** tq3 and tq4 (lib/cuda/attention.zig isTurbo): their keys would need the anchor and re-coding. */
const isTurboId = (id: number) => id === 103 || id === 104;

export class KvShifter {
  private scratch = 0;
  private scratchBytes = 0;

  constructor(private readonly lib: Lib, private readonly device: ShiftDevice) {}

  /** shiftKv: positions keep .. keep + discard - 1 dropped, the later ones moved down by `discard`. */
  shift(l: ShiftLayer, rope: RopeOptions, factors: number, keep: number, discard: number, length: number): void {
    if (!(Number.isInteger(keep) && Number.isInteger(discard) && Number.isInteger(length)) || keep < 0 ||
      discard < 0 || keep + discard > length || (!l.ring && length > l.cells)) {
      throw new InferError("internal", `shiftKv: keep ${keep}, discard ${discard}, length ${length} of ${l.cells} cells`);
    }
    if (discard === 0) return;
    if (!l.ring) {
      const from = keep + discard, rows = length - from;
      if (rows > 0) this.launch(l, rope, factors, { rows, first: from, to: keep, move: -discard, list: null });
      return;
    }
    // A ring, as the CPU turns one: every cell rotated back, cell c moved to (c - discard) mod cells.
    this.launch(l, rope, factors, { rows: l.cells, first: discard % l.cells, to: 0, move: -discard, list: null });
  }

  /** compactKv: the rows at positions from[i] (ascending, from[0] >= to) to position to + i. */
  compact(l: ShiftLayer, rope: RopeOptions, factors: number, from: Int32Array, to: number): void {
    if (l.ring) throw new InferError("internal", "compactKv: a ring layer");
    const rows = from.length;
    if (rows === 0) return;
    for (let i = 0; i < rows; i++) {
      if (from[i] < to + i || from[i] >= l.cells || (i > 0 && from[i] <= from[i - 1])) {
        throw new InferError("internal", `compactKv: row ${i} from ${from[i]} to ${to + i} of ${l.cells} cells`);
      }
    }
    this.launch(l, rope, factors, { rows, first: 0, to, move: 0, list: from });
  }

  private launch(l: ShiftLayer, rope: RopeOptions, factors: number,
    m: { rows: number; first: number; to: number; move: number; list: Int32Array | null }): void {
    if (isTurboId(l.kTypeId) || isTurboId(l.vTypeId)) {
      throw new InferError("unsupported", "the context shift of tq3/tq4 caches runs on the CPU backend " +
        "(on CUDA: --cache-type-k/--cache-type-v f16, q8_0 or q4_0)");
    }
    const rowBytes = Number(this.lib.infer_cuda_kv_shift_scratch(l.kvHeads, l.headDim, m.rows, l.vTypeId));
    const listOffset = Math.ceil(rowBytes / 256) * 256;
    const scratch = this.ensure(listOffset + (m.list ? m.list.length * 4 : 0));
    if (m.list) check(this.lib.infer_cuda_upload(scratch + listOffset, m.list, m.list.length * 4), "upload kv_shift rows");
    const y = rope.yarn;
    check(callNamed("infer_cuda_kv_shift", { k_cache: l.k, v_cache: l.v, kv_heads: l.kvHeads, head_dim: l.headDim,
      n_rows: m.rows, from: m.list ? scratch + listOffset : 0, first: m.first, cells: l.cells, to: m.to,
      move: m.move, scratch, n_rot: rope.rotaryDims, freq_factors: factors, freq_base: rope.base,
      freq_scale: rope.scale, mode: rope.neox ? 2 : 0, k_type: l.kTypeId, v_type: l.vTypeId,
      attn_factor: rotationAttnFactor(rope),
      ...(y ? { ext_factor: y.extFactor, beta_fast: y.betaFast, beta_slow: y.betaSlow, n_ctx_orig: y.originalContext } : {}),
    }), "kv_shift");
  }

  /** The scratch, grown (the old one released once the work queued on it is done) to `bytes`. */
  private ensure(bytes: number): number {
    if (bytes <= this.scratchBytes) return this.scratch;
    if (this.scratch !== 0) {
      this.device.sync();
      this.device.release(this.scratch);
    }
    this.scratch = 0;
    this.scratchBytes = 0;
    this.scratch = this.device.alloc(bytes, "context shift scratch");
    this.scratchBytes = bytes;
    return this.scratch;
  }
}
