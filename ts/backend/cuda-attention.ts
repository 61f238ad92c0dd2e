// How the CUDA backend attends: the decode plan (which kernels, how many splits of the keys) and
// the device buffers attention needs beside its inputs: scratch (scores of the per-head kernels,
// the splits' partial outputs), zeroed split counters, and tables of cache addresses for rows of
// several sequences (attendRows).
import { check, native } from "../native/lib.ts";
import type { AttentionOptions, KvLayer } from "./backend.ts";

type Lib = ReturnType<typeof native>;

/** Attention scratch above this many f32 values is split into chunks of query rows. */
const ATTENTION_SCRATCH_BUDGET = 64 << 20;
/**
 * Keys a split of the grouped decode attention aims at: one tile of attn_decode_* (a split of
 * one tile needs no second pass; more splits pay for the last block's combine, ~3 µs: 16 or 32
 * keys a split took an 8B decode from 483 to 451 / 460 tok/s on an H200), and 4 a split for the
 * per-head kernels (INFER_CUDA_ATTN=heads).
 */
const GROUP_SPLIT_KEYS = Number(process.env.INFER_CUDA_SPLIT_KEYS) || 128; // INFER_CUDA_SPLIT_KEYS=n: comparisons
const PER_HEAD_SPLIT_KEYS = 4;
/** Tables of cache addresses kept for attendRows (one per layer and set of sequences batched). */
const KV_TABLES_MAX = 4096;

/**
 * Splits a decode row's keys take at most: 64, or INFER_CUDA_SPLIT_MAX (a power of two up to 64,
 * lib/cuda/attention.zig split_max; comparisons). The kernels give each split whole 128-key
 * tiles and leave the splits past the keys empty (shaders/cuda/attend_decode.cuh decode_span_at),
 * so up to 8,192 keys no split takes a second tile: at 4,100 to 4,224 keys (an 8B model's decode
 * after a 4,096-token prompt) 33 splits of a 64-split launch run, where a cap of 32 gave every
 * split a tile and a sliver of 4 to 5 keys.
 */
const SPLITS_MAX = (() => {
  const n = Number(process.env.INFER_CUDA_SPLIT_MAX);
  return Number.isInteger(n) && n >= 1 && n <= 64 && (n & (n - 1)) === 0 ? n : 64;
})();

/** The splits of `keys` keys, about `perSplit` a split: a power of two, at most SPLITS_MAX. */
function splitFor(keys: number, perSplit: number): number {
  let split = 1;
  while (split < SPLITS_MAX && split * perSplit < keys) split *= 2;
  return split;
}

/**
 * How one decode row (or two) attends: attn_decode_* (a block per KV head and split, every key
 * and value row read once for the group's query heads; `kernels` "heads", from
 * INFER_CUDA_ATTN=heads: the per-head attn_scores + attn_values instead, slower at every context
 * measured, kept for comparison), the keys split about GROUP_SPLIT_KEYS a split
 * (PER_HEAD_SPLIT_KEYS per head), rounded up to a power of two, at most SPLITS_MAX, so that a
 * long context fills the GPU with blocks: a graph is captured per split the context passes.
 * `byCells` (INFER_CUDA_SPLIT=cells): a fixed split from the cache size (one graph for every
 * position; slower as the context grows).
 */
export function decodePlan(kernels: "heads" | "groups", byCells: boolean, l: KvLayer, visible: number):
  { split: number; perHead: boolean } {
  const keys = Math.min(visible, l.ring ? l.cells : visible);
  const perHead = kernels === "heads";
  if (byCells) return { split: Math.min(32, Math.max(1, Math.ceil(l.cells / 256))), perHead };
  return { split: splitFor(keys, perHead ? PER_HEAD_SPLIT_KEYS : GROUP_SPLIT_KEYS), perHead };
}

export interface DeviceMemory {
  alloc(bytes: number, what: string): number;
  release(address: number): void;
  /** Stops recording and waits for the GPU: queued kernels and graphs may use what is freed next. */
  beforeRealloc(): void;
}

export class AttentionBuffers {
  scratch = 0;
  scratchFloats = 0;
  /** Zeroed u32 counters of split attention (one per query row; every launch leaves them zero). */
  arrived = 0;
  private arrivedRows = 0;
  private readonly kvTables = new Map<string, number>();

  constructor(private readonly lib: Lib, private readonly mem: DeviceMemory) {}

  /**
   * Scratch (and split counters) for attention of `rows` rows: the rows a launch may take within
   * ATTENTION_SCRATCH_BUDGET (all of them, unless a prompt is long), the scratch grown to fit.
   */
  ensure(rows: number, maxRows: number, o: AttentionOptions, cells: number, split: number): number {
    const need = (n: number) => Number(this.lib.infer_cuda_attention_scratch(n, o.heads, o.headDim, cells, split));
    let chunk = rows;
    while (chunk > 1 && need(chunk) > ATTENTION_SCRATCH_BUDGET) chunk = Math.ceil(chunk / 2);
    const floats = need(chunk);
    if (floats > this.scratchFloats) {
      if (this.scratch !== 0) this.mem.beforeRealloc();
      this.mem.release(this.scratch);
      this.scratch = 0;
      const capacity = Math.max(floats, Math.min(ATTENTION_SCRATCH_BUDGET, need(maxRows)));
      this.scratch = this.mem.alloc(capacity * 4, "attention scratch");
      this.scratchFloats = capacity;
    }
    if (split > 1 && rows * o.heads > this.arrivedRows) {
      if (this.arrived !== 0) this.mem.beforeRealloc();
      this.mem.release(this.arrived);
      this.arrived = 0;
      const capacity = Math.max(rows * o.heads, 2 * o.heads);
      this.arrived = this.mem.alloc(capacity * 4, "attention counters");
      check(this.lib.infer_cuda_fill32(this.arrived, 0, capacity), "zero attention counters");
      this.arrivedRows = capacity;
    }
    return chunk;
  }

  /** A device table of the layers' key and value cache addresses (attendRows), kept per set of caches. */
  kvTable(layers: readonly { readonly k: number; readonly v: number }[]): number {
    let key = "";
    for (const l of layers) key += `${l.k}:${l.v},`;
    const known = this.kvTables.get(key);
    if (known !== undefined) return known;
    if (this.kvTables.size >= KV_TABLES_MAX) {
      this.mem.beforeRealloc(); // queued kernels may read the tables
      for (const t of this.kvTables.values()) this.mem.release(t);
      this.kvTables.clear();
    }
    const host = new BigUint64Array(2 * layers.length);
    layers.forEach((l, i) => {
      host[2 * i] = BigInt(l.k);
      host[2 * i + 1] = BigInt(l.v);
    });
    const table = this.mem.alloc(host.byteLength, "KV cache table");
    check(this.lib.infer_cuda_upload(table, host, host.byteLength), "upload KV cache table");
    this.kvTables.set(key, table);
    return table;
  }
}
