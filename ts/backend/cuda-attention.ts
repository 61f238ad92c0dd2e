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
 * keys a split took an 8B decode from 483 to 451 / 460 tok/s on an H200).
 */
const SPLIT_KEYS = 128;
/** Tables of cache addresses kept for attendRows (one per layer and set of sequences batched). */
const KV_TABLES_MAX = 4096;

/**
 * Splits a decode row's keys take at most (lib/cuda/attention.zig split_max). The kernels give
 * each split whole 128-key tiles and leave the splits past the keys empty (shaders/cuda/
 * attend_decode.cuh decode_span_at), so up to 8,192 keys no split takes a second tile: at 4,100
 * to 4,224 keys (an 8B model's decode after a 4,096-token prompt) 33 splits of a 64-split launch
 * run, where a cap of 32 gave every split a tile and a sliver of 4 to 5 keys.
 */
const SPLITS_MAX = 64;
/** The splits of `keys` keys, about SPLIT_KEYS a split: a power of two, at most SPLITS_MAX. */
function splitFor(keys: number): number {
  let split = 1;
  while (split < SPLITS_MAX && split * SPLIT_KEYS < keys) split *= 2;
  return split;
}

/**
 * The splits of a decode row (or two) over the keys it sees: about SPLIT_KEYS a split, rounded up
 * to a power of two, at most SPLITS_MAX, so that a long context fills the GPU with blocks (a
 * block per KV head and split, every key and value row read once for the group's query heads:
 * attn_decode_*). A graph is captured per split count the context passes.
 */
export function decodeSplit(l: KvLayer, visible: number): number {
  return splitFor(Math.min(visible, l.ring ? l.cells : visible));
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
