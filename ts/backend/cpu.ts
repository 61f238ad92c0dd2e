// The CPU backend: each op is one native call over whole rows (lib/cpu/*.zig through
// ts/native/lib.ts). Weights stay in the mmap'd GGUF and are passed by address; activations and
// the KV cache's rings live in an arena planned when the context is created; full-attention cache
// layers get pages of their own on Linux, so that the prefix cache's blocks can be mapped over
// their rows (cpu-kv-share.ts).
import { InferError } from "../errors.ts";
import type { GgufFile, GgufTensorInfo } from "../gguf/reader.ts";
import { GgmlType } from "../gguf/types.ts";
import { packed } from "../native/abi.ts";
import { allocPages, check, native, offsetAddress, type Pointer } from "../native/lib.ts";
import { Arena } from "./arena.ts";
import {
  CpuKvBlockStore, kvPages, kvSharing, type CpuKvRows, type KvFileRows, type SharedRows,
} from "./cpu-kv-share.ts";
import { cpuAltUpOps } from "./cpu-altup.ts";
import { copyAnchoredKeys, pendKeys, setAnchor } from "./cpu-kv-anchor.ts";
import { repackForMatmul, type MatmulLayout } from "./cpu-repack.ts";
import {
  kvBytes, kvTypesOf, type Activation, type AttentionOptions, type Backend, type ExpertOps,
  type BatchedRounding, type KvBlockStore, type KvLayer, type KvLayerShape, type KvType, type KvTypes,
  type RopeOptions, type RowRange, type YarnOptions,
  type Weight,
} from "./backend.ts";

/** Types the CPU kernels compute with (lib/quant/types.zig). */
export const cpuWeightTypes = new Set<number>([
  GgmlType.F32, GgmlType.F16, GgmlType.BF16, GgmlType.Q4_0, GgmlType.Q5_0, GgmlType.Q8_0,
  GgmlType.Q4_K, GgmlType.Q5_K, GgmlType.Q6_K, GgmlType.MXFP4,
]);

class CpuWeight implements Weight {
  /** What matmul reads (a repacked copy, or the weight as stored); undefined until decided. */
  layout: MatmulLayout | null | undefined;
  constructor(readonly name: string, readonly typeName: string, readonly typeId: number,
    readonly dims: readonly number[], readonly address: Pointer, readonly byteLength: number,
    /** Drops bytes [offset, offset + bytes) of the mapped weight from memory (once copied). */
    readonly release: (offset: number, bytes: number) => void,
    /** The weight's bytes as the file maps them (an F32 vector read by TypeScript ops). */
    readonly bytes: () => Uint8Array = () => {
      throw new InferError("internal", `no bytes of '${name}'`);
    }) {}
}

class CpuActivation implements Activation {
  constructor(readonly name: string, readonly rows: number, readonly cols: number,
    readonly f32: Float32Array, readonly address: Pointer) {}
}

/** The ggml type id lib/cpu/attention.zig reads a cache of this type as. */
const kvTypeIds: Record<KvType, number> = {
  f32: GgmlType.F32, f16: GgmlType.F16, q8_0: GgmlType.Q8_0, q4_0: GgmlType.Q4_0,
  // infer's own ids, past ggml's (lib/cpu/kv_turbo.zig)
  tq3: 103, tq4: 104,
};

class CpuKvLayer implements CpuKvRows {
  /** A layer in pages of its own, whose rows blocks of a CpuKvBlockStore can be mapped over. */
  held?: Map<number, SharedRows>;
  /** A block of a CpuKvBlockStore. */
  file?: KvFileRows;
  constructor(readonly cells: number, readonly ring: boolean, readonly kvHeads: number,
    readonly headDim: number, readonly kTypeId: number, readonly vTypeId: number,
    /** Bytes of one cell (position) of keys, of values. */
    readonly kRowBytes: number, readonly vRowBytes: number,
    readonly k: Pointer, readonly v: Pointer, readonly kBytes: Uint8Array,
    readonly vBytes: Uint8Array) {}

  /** What a tq3/tq4 K layer codes its keys less (cpu-kv-anchor.ts); undefined: not set yet. */
  kAnchor: Float32Array | undefined = undefined;
  /** While a tq K layer has no anchor: the exact keys of the cells written, by cell. */
  kPending?: Map<number, Float32Array>;

  /**
   * Accumulated attention a cell (Backend.trackAttention), in pages of its own, allocated the
   * first time and kept; `tracking` says whether attention adds to it.
   */
  mass?: { address: Pointer; values: Float32Array; tracking: boolean };
}

function isTurbo(typeId: number): boolean {
  return typeId === kvTypeIds.tq3 || typeId === kvTypeIds.tq4;
}

/**
 * Rows first .. first + count - 1 in runs, each wholly inside or outside `ranges` (ascending):
 * fn(first row of the run, its rows, inside).
 */
function forRuns(first: number, count: number, ranges: readonly RowRange[],
  fn: (row: number, count: number, inside: boolean) => void): void {
  let row = first;
  const end = first + count;
  for (const r of ranges) {
    const lo = Math.max(row, Math.min(end, r.first)), hi = Math.max(lo, Math.min(end, r.first + r.rows));
    if (lo > row) fn(row, lo - row, false);
    if (hi > lo) fn(lo, hi - lo, true);
    row = hi;
  }
  if (end > row) fn(row, end - row, false);
}

function w(x: Weight): CpuWeight { return x as CpuWeight; }

/** RopeShape's YaRN fields (ext_factor 0: none). */
function yarnFields(y: YarnOptions | undefined): { ext_factor: number; beta_fast: number;
  beta_slow: number; n_ctx_orig: number } {
  return y ? { ext_factor: y.extFactor, beta_fast: y.betaFast, beta_slow: y.betaSlow,
    n_ctx_orig: y.originalContext } : { ext_factor: 0, beta_fast: 32, beta_slow: 1, n_ctx_orig: 0 };
}

/** The address of an attention-sinks tensor: F32, one logit per query head. */
function sinksAddress(t: CpuWeight, heads: number): number {
  if (t.typeId !== GgmlType.F32 || t.byteLength !== heads * 4) {
    throw new InferError("bad_model", `attention sinks '${t.name}' must be ${heads} F32 values, not ${t.typeName} ${t.dims.join("x")}`);
  }
  return Number(t.address);
}
function a(x: Activation): CpuActivation { return x as CpuActivation; }

export class CpuBackend implements Backend {
  readonly name = "cpu";
  readonly sequenceBatches = true;
  readonly ropeAttnFactor = true;
  readonly preferredBatch = 256;
  private readonly arena = new Arena();
  /** Repacked weights, packed back to back (one huge page's slack in all, not one per tensor). */
  private readonly weights = new Arena({ blockBytes: 64 << 20, hugePages: true });
  private readonly lib = native();
  /** The rows of the current forward pass that take llama.cpp's batched rounding. */
  private batchedRounding: BatchedRounding | null = null;
  private readonly batchedTypes = new Map<number, number>();
  /** Full-attention cache layers in pages of their own (cpu-kv-share.ts), and the block stores. */
  private readonly kvRegions: { bytes: Uint8Array; free(): void }[] = [];
  private readonly kvStores: CpuKvBlockStore[] = [];

  weight(file: GgufFile, t: GgufTensorInfo): Weight {
    if (!cpuWeightTypes.has(t.type.id)) {
      throw new InferError("unsupported", `tensor '${t.name}' has quant type ${t.type.name}, ` +
        "which the CPU backend does not compute yet");
    }
    const weight = new CpuWeight(t.name, t.type.name, t.type.id, t.dims,
      file.tensorAddress(t) as Pointer, t.byteLength,
      (offset, bytes) => file.releaseTensorBytes(t, offset, bytes), () => file.tensorBytes(t));
    // Repacked now, so the first token does not pay for it. The token embedding is a matmul
    // weight only where the LM head is tied to it (no output.weight): then now as well, while
    // few other copies are resident (repacked after every other weight, at its first matmul,
    // its mapped pages and its copy came on top of them all: Llama-3.2-1B-shape Q8_0's peak RSS).
    if (t.name !== "token_embd.weight" || !file.tensors.has("output.weight")) this.layoutOf(weight);
    return weight;
  }

  private layoutOf(t: CpuWeight): MatmulLayout | null {
    if (t.layout === undefined) {
      t.layout = repackForMatmul(t.typeId, t.dims, t.address, t.byteLength, this.weights, t.release);
    }
    return t.layout;
  }

  /** Per expert tensor: its experts' matmul addresses (what infer_moe_ffn reads) and type. */
  private readonly expertTables = new WeakMap<readonly Weight[], { table: BigUint64Array; typeId: number }>();

  private expertTable(experts: readonly Weight[]): { table: BigUint64Array; typeId: number } {
    let entry = this.expertTables.get(experts);
    if (!entry) {
      const table = new BigUint64Array(experts.length);
      let typeId = -1;
      experts.forEach((e, i) => {
        const t = w(e), layout = this.layoutOf(t);
        table[i] = BigInt(layout?.address ?? t.address);
        const id = layout?.typeId ?? t.typeId;
        if (typeId >= 0 && id !== typeId) {
          throw new InferError("bad_model", `expert ${i} of '${t.name}' is laid out unlike expert 0`);
        }
        typeId = id;
      });
      this.expertTables.set(experts, entry = { table, typeId });
    }
    return entry;
  }


  readonly experts: ExpertOps = {
    // Expert e is the matrix at byte e × (its bytes) of the tensor: a weight of its own, repacked
    // on its own, so decoding reads only the experts the router chose.
    split: (file, t) => {
      if (!cpuWeightTypes.has(t.type.id)) {
        throw new InferError("unsupported", `tensor '${t.name}' has quant type ${t.type.name}, ` +
          "which the CPU backend does not compute yet");
      }
      if (t.dims.length !== 3) throw new InferError("bad_model", `tensor '${t.name}' is not 3-D`);
      const [cols, rows, experts] = t.dims as [number, number, number];
      const bytes = t.byteLength / experts, base = file.tensorAddress(t);
      return Array.from({ length: experts }, (_, e) => {
        const weight = new CpuWeight(`${t.name}[${e}]`, t.type.name, t.type.id, [cols, rows],
          offsetAddress(base as Pointer, e * bytes), bytes,
          (offset, length) => file.releaseTensorBytes(t, e * bytes + offset, length));
        this.layoutOf(weight);
        return weight;
      });
    },
    gatherRows: (src, rows, count, dst) => {
      const from = a(src).f32, to = a(dst).f32, n = src.cols;
      for (let i = 0; i < count; i++) to.set(from.subarray(rows[i] * n, rows[i] * n + n), i * n);
    },
    scatterScaled: (src, slots, weights, count, dst) => {
      const from = a(src).f32, to = a(dst).f32, n = src.cols;
      for (let i = 0; i < count; i++) {
        const w = weights[i], s = i * n, d = slots[i] * n;
        for (let j = 0; j < n; j++) to[d + j] = Math.fround(w * from[s + j]);
      }
    },
    ffn: (gate, up, down, x, rows, chosen, weights, k, out) => {
      const g = this.expertTable(gate), u = this.expertTable(up), d = this.expertTable(down);
      const shape = packed("MoeShape", { gate_type: g.typeId, up_type: u.typeId, down_type: d.typeId,
        n_embd: x.cols, n_ff: w(gate[0]).dims[1], n_expert: gate.length, n_used: k, n_tok: rows });
      check(this.lib.infer_moe_ffn(g.table, u.table, d.table, chosen, weights, a(x).address, a(out).address,
        shape), "moe_ffn");
    },
    // Several rows: the per-expert path's SwiGLU runs over all of an expert's rows at once, which
    // lib/cpu/moe.zig's per-row SwiGLU equals only where each row is whole 16-value vector runs.
    ffnSupports: (rows, feedForward) => rows === 1 || feedForward % 16 === 0,
    sumGroups: (src, k, rows, out) => {
      const from = a(src).f32, to = a(out).f32, n = src.cols;
      for (let r = 0; r < rows; r++) {
        const d = r * n;
        to.set(from.subarray(r * k * n, r * k * n + n), d);
        for (let e = 1; e < k; e++) {
          const s = (r * k + e) * n;
          // f32 + f32 in float64 is exact; the store rounds once, as an f32 add does.
          for (let j = 0; j < n; j++) to[d + j] += from[s + j];
        }
      }
    },
  };

  readonly altup = cpuAltUpOps({
    address: (x) => a(x).address,
    vector: (v, n) => {
      const t = w(v);
      if (t.typeId !== GgmlType.F32 || t.dims.length !== 1 || t.dims[0] !== n) {
        throw new InferError("bad_model", `'${t.name}' is not ${n} f32 values`);
      }
      return t.address;
    },
  });

  /** Frees the repacked weights, caches and activations: nothing of this backend is usable after. */
  dispose(): void {
    this.weights.free();
    this.arena.free();
    for (const store of this.kvStores.splice(0)) store.close();
    for (const region of this.kvRegions.splice(0)) region.free();
  }

  activation(name: string, rows: number, cols: number): Activation {
    const region = this.arena.alloc(rows * cols * 4);
    const f32 = new Float32Array(region.bytes.buffer, region.bytes.byteOffset, rows * cols);
    return new CpuActivation(name, rows, cols, f32, region.address);
  }

  positions(rows: number): Activation {
    return this.activation("positions", rows, 1);
  }

  kvLayer(cells: number, kvHeads: number, headDim: number, types: KvType | KvTypes, ring: boolean): KvLayer {
    const type = kvTypesOf(types);
    for (const t of [type.k, type.v]) {
      if (!(t in kvTypeIds)) {
        throw new InferError("invalid_argument", `KV cache type '${t}' is not f16, f32, q8_0, q4_0, tq3 or tq4`);
      }
      if ((t === "q8_0" || t === "q4_0") && headDim % 32 !== 0) {
        throw new InferError("unsupported", `a ${t} KV cache needs head_dim a multiple of 32; this model's is ${headDim}`);
      }
      // The rotation is a Walsh-Hadamard transform over the head vector.
      const powerOfTwo = headDim >= 8 && headDim <= 1024 && (headDim & (headDim - 1)) === 0;
      if ((t === "tq3" || t === "tq4") && !powerOfTwo) {
        throw new InferError("unsupported",
          `a ${t} KV cache needs head_dim a power of two from 8 to 1024; this model's is ${headDim}`);
      }
    }
    const kRowBytes = kvBytes(type.k, kvHeads * headDim, headDim);
    const vRowBytes = kvBytes(type.v, kvHeads * headDim, headDim);
    if (ring || !kvSharing) {
      const k = this.arena.alloc(cells * kRowBytes), v = this.arena.alloc(cells * vRowBytes);
      return new CpuKvLayer(cells, ring, kvHeads, headDim, kvTypeIds[type.k], kvTypeIds[type.v],
        kRowBytes, vRowBytes, k.address, v.address, k.bytes, v.bytes);
    }
    // A full layer gets pages of its own, so the prefix cache's blocks can be mapped over its rows.
    const k = kvPages(cells * kRowBytes);
    this.kvRegions.push(k);
    const v = kvPages(cells * vRowBytes);
    this.kvRegions.push(v);
    const layer = new CpuKvLayer(cells, ring, kvHeads, headDim, kvTypeIds[type.k], kvTypeIds[type.v],
      kRowBytes, vRowBytes, k.address, v.address, k.bytes, v.bytes);
    layer.held = new Map();
    return layer;
  }

  kvBlockStore(shapes: readonly KvLayerShape[], types: KvTypes, cells: number, blocks: number): KvBlockStore | null {
    // A tq key layer stores keys less an anchor of its own (lib/cpu/kv_turbo.zig): a block
    // mapped into another layer would be read against the wrong anchor, so those are copied.
    if (types.k === "tq3" || types.k === "tq4") return null;
    const store = CpuKvBlockStore.open(shapes, types, cells, blocks, (n, shape, k, v, kBytes, vBytes, file) => {
      const layer = new CpuKvLayer(n, false, shape.kvHeads, shape.headDim, kvTypeIds[types.k],
        kvTypeIds[types.v], kvBytes(types.k, shape.kvHeads * shape.headDim, shape.headDim),
        kvBytes(types.v, shape.kvHeads * shape.headDim, shape.headDim), k, v, kBytes, vBytes);
      layer.file = file;
      return layer;
    });
    if (store) this.kvStores.push(store);
    return store;
  }

  get bytesReserved(): number {
    return this.arena.bytesReserved + this.kvRegions.reduce((sum, r) => sum + r.bytes.length, 0);
  }

  setTokens(dst: Activation, ids: ArrayLike<number>, count: number): void {
    const view = new Int32Array(a(dst).f32.buffer, a(dst).f32.byteOffset, count);
    for (let i = 0; i < count; i++) view[i] = ids[i];
  }

  setPositions(dst: Activation, start: number, count: number, firstRow = 0): void {
    const view = new Int32Array(a(dst).f32.buffer, a(dst).f32.byteOffset + firstRow * 4, count);
    for (let i = 0; i < count; i++) view[i] = start + i;
  }

  embed(table: Weight, ids: Activation, rows: number, out: Activation): void {
    const t = w(table);
    check(this.lib.infer_get_rows(t.typeId, t.address, t.dims[0], t.dims[1], a(ids).address, rows,
      a(out).address), `embed ${t.name}`);
  }

  scale(x: Activation, rows: number, factor: number): void {
    check(this.lib.infer_scale(a(x).address, rows * x.cols, factor), "scale");
  }

  rmsNorm(x: Activation, weight: Weight | null, rows: number, eps: number, out: Activation): void {
    check(this.lib.infer_rms_norm(a(x).address, weight ? w(weight).address : null, rows, x.cols, eps,
      a(out).address), "rms_norm");
  }

  rmsNormAdd(x: Activation, weight: Weight, rows: number, eps: number, residual: Activation): void {
    check(this.lib.infer_rms_norm_add(a(x).address, w(weight).address, rows, x.cols, eps,
      a(residual).address), "rms_norm_add");
  }

  rmsNormHeads(x: Activation, weight: Weight, rows: number, heads: number, eps: number): void {
    const headDim = x.cols / heads;
    check(this.lib.infer_rms_norm(a(x).address, w(weight).address, rows * heads, headDim, eps,
      a(x).address), "rms_norm (heads)");
  }

  setBatchedRounding(rounding: BatchedRounding | null): void {
    this.batchedRounding = rounding;
  }

  matmul(weight: Weight, x: Activation, rows: number, out: Activation, firstRow = 0): void {
    const t = w(weight);
    const layout = this.layoutOf(t);
    const address = layout?.address ?? t.address, typeId = layout?.typeId ?? t.typeId;
    const fourRows = this.batchedRounding?.fourRows ?? [];
    const batchedType = fourRows.length > 0 ? this.batchedRoundingType(typeId) : 0;
    // x's rows firstRow.. go to out's rows 0..; rows that llama.cpp's batched kernel takes four
    // at a time read the same weight bytes through the layout that rounds as it does.
    forRuns(firstRow, rows, batchedType !== 0 ? fourRows : [], (row, count, batched) => {
      check(this.lib.infer_matmul(address, batched ? batchedType : typeId, t.dims[1], t.dims[0],
        offsetAddress(a(x).address, row * x.cols * 4), count,
        offsetAddress(a(out).address, (row - firstRow) * out.cols * 4)), `matmul ${t.name}`);
    });
  }

  /** The layout rounding as llama.cpp's batched kernel for weights of `typeId`, or 0: the same. */
  private batchedRoundingType(typeId: number): number {
    let t = this.batchedTypes.get(typeId);
    if (t === undefined) {
      t = this.lib.infer_prompt_rounding_type(typeId);
      this.batchedTypes.set(typeId, t);
    }
    return t;
  }

  rope(x: Activation, positions: Activation, rows: number, o: RopeOptions): void {
    let factors: Pointer | null = null;
    if (o.freqFactors) {
      const f = w(o.freqFactors);
      if (f.typeId !== GgmlType.F32 || f.dims[0] * 2 !== o.rotaryDims) {
        throw new InferError("bad_model", `rope factors '${f.name}' must be ${o.rotaryDims / 2} f32 values`);
      }
      factors = f.address;
    }
    const shape = packed("RopeShape", { n_tok: rows, n_heads: o.heads, head_dim: o.headDim, n_rot: o.rotaryDims,
      freq_base: o.base, freq_scale: o.scale, mode: o.neox ? 2 : 0, attn_factor: o.attnFactor ?? 1,
      ...yarnFields(o.yarn) });
    check(this.lib.infer_rope(a(x).address, a(positions).address, factors, shape), "rope");
  }

  storeKv(layer: KvLayer, k: Activation, v: Activation, rows: number, position: number,
    firstRow = 0): void {
    const l = layer as CpuKvLayer;
    if (!l.ring && position + rows > l.cells) {
      throw new InferError("context_overflow", `KV cache holds ${l.cells} positions, ${position + rows} needed`);
    }
    if (rows > l.cells) throw new InferError("invalid_argument", `${rows} rows do not fit a ring of ${l.cells}`);
    // A ring wraps at most once per batch: store the rows before and after the wrap separately.
    const cell = l.ring ? position % l.cells : position;
    const first = Math.min(rows, l.cells - cell);
    this.storeRows(l, k, v, firstRow, cell, first);
    if (first < rows) this.storeRows(l, k, v, firstRow + first, 0, rows - first);
  }

  private storeRows(l: CpuKvLayer, k: Activation, v: Activation, row: number, cell: number, rows: number): void {
    const n = rows * l.kvHeads * l.headDim, src = row * k.cols * 4;
    if (isTurbo(l.kTypeId) && l.kAnchor === undefined) {
      pendKeys(l, a(k).f32.subarray(row * k.cols, row * k.cols + n), cell, rows);
    } else {
      check(this.lib.infer_kv_store(offsetAddress(a(k).address, src), offsetAddress(l.k, cell * l.kRowBytes), l.kTypeId,
        n, l.headDim, l.kAnchor ?? null, l.kAnchor?.length ?? 0), "kv_store k");
    }
    check(this.lib.infer_kv_store(offsetAddress(a(v).address, src), offsetAddress(l.v, cell * l.vRowBytes), l.vTypeId, n,
      l.headDim, null, 0), "kv_store v");
  }

  attention(q: Activation, layer: KvLayer, rows: number, position: number, o: AttentionOptions,
    out: Activation, firstRow = 0): void {
    const l = layer as CpuKvLayer;
    const qAddress = offsetAddress(a(q).address, firstRow * q.cols * 4);
    const outAddress = offsetAddress(a(out).address, firstRow * out.cols * 4);
    // Rows that llama.cpp computes in a batch of several sum in its batched order (F16 caches).
    const sinks = o.sinks ? sinksAddress(w(o.sinks), o.heads) : 0;
    forRuns(firstRow, rows, this.batchedRounding?.rows ?? [], (row, count, batched) => {
      const shape = packed("AttentionShape", { k_type: l.kTypeId, v_type: l.vTypeId, n_tok: count,
        n_head: o.heads, n_kv_head: o.kvHeads, head_dim: o.headDim, pos0: position + row - firstRow,
        kv_stride: l.kvHeads * l.headDim, window: o.window, ring: l.ring ? l.cells : 0, scale: o.scale,
        order: batched ? 1 : 0, sinks, mass: l.mass?.tracking ? l.mass.address : 0 });
      check(this.lib.infer_attention(offsetAddress(qAddress, (row - firstRow) * q.cols * 4), l.k, l.v,
        offsetAddress(outAddress, (row - firstRow) * out.cols * 4), shape), "attention");
    });
  }

  copyKv(src: KvLayer, srcCell: number, dst: KvLayer, dstCell: number, cells: number): void {
    const s = src as CpuKvLayer, d = dst as CpuKvLayer;
    if (s.kRowBytes !== d.kRowBytes || s.vRowBytes !== d.vRowBytes || s.kTypeId !== d.kTypeId ||
      s.vTypeId !== d.vTypeId) {
      throw new InferError("invalid_argument", "copyKv: the layers differ in shape or type");
    }
    if (srcCell < 0 || dstCell < 0 || srcCell + cells > s.cells || dstCell + cells > d.cells) {
      throw new InferError("invalid_argument", `copyKv: ${cells} cells from ${srcCell} to ${dstCell} ` +
        `overrun ${s.cells} / ${d.cells}`);
    }
    const kb = s.kRowBytes, vb = s.vRowBytes;
    if (isTurbo(s.kTypeId)) copyAnchoredKeys(s, srcCell, d, dstCell, cells);
    else d.kBytes.set(s.kBytes.subarray(srcCell * kb, (srcCell + cells) * kb), dstCell * kb);
    d.vBytes.set(s.vBytes.subarray(srcCell * vb, (srcCell + cells) * vb), dstCell * vb);
  }

  shiftKv(layer: KvLayer, rope: RopeOptions, keep: number, discard: number, length: number): void {
    const l = layer as CpuKvLayer;
    const kvDim = l.kvHeads * l.headDim;
    // Keys moved are coded again: less an anchor from then on, the mean of the few held so far.
    setAnchor(l);
    if (!l.ring) {
      const from = keep + discard, rows = length - from;
      if (rows <= 0) return;
      const keys = this.rotatedKeys(l, from, rows, rope, discard);
      check(this.lib.infer_kv_store(keys, offsetAddress(l.k, keep * l.kRowBytes), l.kTypeId, rows * kvDim, l.headDim,
        l.kAnchor ?? null, l.kAnchor?.length ?? 0), "kv_store k");
      l.vBytes.copyWithin(keep * l.vRowBytes, from * l.vRowBytes, length * l.vRowBytes);
      return;
    }
    // A ring: every cell rotated back, then the ring turned so that position p - discard sits in
    // cell (p - discard) % cells. Cells whose positions were dropped hold what no query sees.
    const cells = l.cells, turn = discard % cells;
    const keys = this.rotatedKeys(l, 0, cells, rope, discard);
    const tail = (cells - turn) * kvDim;
    const anchor = l.kAnchor ?? null, anchorLength = anchor?.length ?? 0;
    check(this.lib.infer_kv_store(keys.subarray(turn * kvDim), l.k, l.kTypeId, tail, l.headDim, anchor, anchorLength),
      "kv_store k");
    if (turn > 0) {
      check(this.lib.infer_kv_store(keys.subarray(0, turn * kvDim), offsetAddress(l.k, (cells - turn) * l.kRowBytes),
        l.kTypeId, turn * kvDim, l.headDim, anchor, anchorLength), "kv_store k");
    }
    const values = l.vBytes.slice(0, cells * l.vRowBytes);
    l.vBytes.set(values.subarray(turn * l.vRowBytes), 0);
    l.vBytes.set(values.subarray(0, turn * l.vRowBytes), (cells - turn) * l.vRowBytes);
  }

  compactKv(layer: KvLayer, rope: RopeOptions, from: Int32Array, to: number): void {
    const l = layer as CpuKvLayer, rows = from.length;
    if (l.ring) throw new InferError("internal", "compactKv: a ring layer");
    if (rows === 0) return;
    const lo = from[0], hi = from[rows - 1] + 1, kvDim = l.kvHeads * l.headDim;
    if (lo < to || hi > l.cells) throw new InferError("internal", `compactKv: rows ${lo}..${hi} to ${to}`);
    setAnchor(l); // as shiftKv
    const span = new Float32Array((hi - lo) * kvDim);
    check(this.lib.infer_kv_load(l.kBytes.subarray(lo * l.kRowBytes, hi * l.kRowBytes), l.kTypeId, span.length,
      l.headDim, l.kAnchor ?? null, l.kAnchor?.length ?? 0, span), "kv_load keys");
    const keys = new Float32Array(rows * kvDim), moves = new Int32Array(rows);
    for (let i = 0; i < rows; i++) {
      keys.set(span.subarray((from[i] - lo) * kvDim, (from[i] - lo + 1) * kvDim), i * kvDim);
      moves[i] = to + i - from[i];
    }
    this.rotateKeys(l, keys, rows, rope, moves);
    check(this.lib.infer_kv_store(keys, offsetAddress(l.k, to * l.kRowBytes), l.kTypeId, rows * kvDim, l.headDim,
      l.kAnchor ?? null, l.kAnchor?.length ?? 0), "kv_store k");
    const vb = l.vRowBytes, values = l.vBytes.slice(lo * vb, hi * vb);
    for (let i = 0; i < rows; i++) l.vBytes.set(values.subarray((from[i] - lo) * vb, (from[i] - lo + 1) * vb), (to + i) * vb);
  }

  trackAttention(layer: KvLayer, on: boolean): Float32Array | null {
    const l = layer as CpuKvLayer;
    if (!on) {
      if (l.mass) l.mass.tracking = false;
      return null;
    }
    if (l.ring) throw new InferError("internal", "trackAttention: a ring layer");
    if (!l.mass) {
      const region = allocPages(l.cells * 4);
      this.kvRegions.push(region);
      l.mass = { address: region.address, tracking: true,
        values: new Float32Array(region.bytes.buffer, region.bytes.byteOffset, l.cells) };
    }
    l.mass.tracking = true;
    l.mass.values.fill(0);
    return l.mass.values;
  }

  /** Keys of cells first .. first + rows - 1 as f32, rotated by -discard positions. */
  private rotatedKeys(l: CpuKvLayer, first: number, rows: number, rope: RopeOptions, discard: number): Float32Array {
    const kvDim = l.kvHeads * l.headDim, keys = new Float32Array(rows * kvDim);
    const src = l.kBytes.subarray(first * l.kRowBytes, (first + rows) * l.kRowBytes);
    check(this.lib.infer_kv_load(src, l.kTypeId, rows * kvDim, l.headDim, l.kAnchor ?? null, l.kAnchor?.length ?? 0, keys),
      "kv_load keys");
    this.rotateKeys(l, keys, rows, rope, new Int32Array(rows).fill(-discard));
    return keys;
  }

  /** Rotates each row i of keys by moves[i] positions with the layer's RoPE, in place. */
  private rotateKeys(l: CpuKvLayer, keys: Float32Array, rows: number, rope: RopeOptions, moves: Int32Array): void {
    let factors: Pointer | null = null;
    if (rope.freqFactors) factors = w(rope.freqFactors).address;
    // A pure rotation: the keys were scaled by the attention factor when they were stored (with
    // YaRN, the kernel's own 1 + 0.1·ln(1/scale) divided out again, to within an ulp).
    const attnFactor = rope.yarn ? Math.fround(1 / Math.fround(1 + 0.1 * Math.log(1 / rope.scale))) : 1;
    const shape = packed("RopeShape", { n_tok: rows, n_heads: l.kvHeads, head_dim: l.headDim, n_rot: rope.rotaryDims,
      freq_base: rope.base, freq_scale: rope.scale, mode: rope.neox ? 2 : 0, attn_factor: attnFactor,
      ...yarnFields(rope.yarn) });
    check(this.lib.infer_rope(keys, moves, factors, shape), "rope (shift)");
  }

  geluMul(gate: Activation, up: Activation, rows: number, out: Activation): void {
    check(this.lib.infer_gelu_mul(a(gate).address, a(up).address, rows * gate.cols, a(out).address), "gelu_mul");
  }

  siluMul(gate: Activation, up: Activation, rows: number, out: Activation): void {
    check(this.lib.infer_silu_mul(a(gate).address, a(up).address, rows * gate.cols, a(out).address), "silu_mul");
  }

  swigluOaiMul(gate: Activation, up: Activation, rows: number, out: Activation): void {
    check(this.lib.infer_swiglu_oai_mul(a(gate).address, a(up).address, rows * gate.cols, a(out).address),
      "swiglu_oai_mul");
  }

  add(x: Activation, y: Activation, rows: number, out: Activation): void {
    check(this.lib.infer_add(a(x).address, a(y).address, rows * x.cols, a(out).address), "add");
  }

  addBias(x: Activation, bias: Weight, rows: number): void {
    const b = w(bias);
    if (b.typeId !== GgmlType.F32 || b.dims.length !== 1 || b.dims[0] !== x.cols) {
      throw new InferError("bad_model", `bias '${b.name}' must be ${x.cols} f32 values`);
    }
    check(this.lib.infer_add_row_bias(a(x).address, b.address, rows, x.cols), `add bias ${b.name}`);
  }

  read(x: Activation, rows: number): Float32Array {
    return a(x).f32.subarray(0, rows * x.cols);
  }

  setThreads(n: number): void {
    check(this.lib.infer_threads_set(n), "set threads");
  }
}
