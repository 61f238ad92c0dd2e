// The Metal dispatch plan, as data: for each op and shape, which kernel runs, on how many
// threadgroups of how many threads, with how much threadgroup memory, which buffer goes to which
// [[buffer(n)]] (by the kernel's parameter names) and the constant arguments, packed as args.h
// declares them. The Metal backend (metal.ts) encodes exactly these dispatches, on a Mac through
// lib/metal and on Linux through the CPU emulation of the same kernels (test/support/
// metal-emu.ts); test/metal-plan.test.ts checks every plan against the signatures parsed from
// shaders/metal, so a renamed parameter, a moved index or a changed struct fails a test here.
import { InferError } from "../errors.ts";
import { ggmlTypes, type GgmlTypeInfo } from "../gguf/types.ts";
import type { KvType, KvTypes } from "./backend.ts";

export type Dim3 = readonly [number, number, number];

export interface KernelDispatch {
  readonly kernel: string;
  /** Threadgroups per grid. */
  readonly grid: Dim3;
  /** Threads per threadgroup. */
  readonly threads: Dim3;
  /** Bytes of the [[threadgroup(0)]] buffer; 0 when the kernel has none. */
  readonly threadgroupBytes: number;
  /** [[buffer(index)]] of each buffer parameter, by parameter name. */
  readonly buffers: Readonly<Record<string, number>>;
  /** The buffers the kernel writes (its non-const device parameters); it reads the others. */
  readonly writes: readonly string[];
  /** The constant arguments: struct name (args.h), buffer index, and bytes. */
  readonly args: { readonly struct: string; readonly index: number; readonly bytes: Uint8Array };
}

type FieldType = "u32" | "i32" | "f32";

/** args.h, field by field (test/metal-plan.test.ts checks this table against the header). */
export const argStructs: Readonly<Record<string, readonly (readonly [string, FieldType])[]>> = {
  MatvecArgs: [["n_in", "u32"], ["n_out", "u32"], ["n_tok", "u32"], ["row_bytes", "u32"]],
  MatmulArgs: [["n_in", "u32"], ["n_out", "u32"], ["n_tok", "u32"], ["row_bytes", "u32"]],
  GetRowsArgs: [["n_cols", "u32"], ["row_bytes", "u32"], ["n_ids", "u32"], ["n_rows", "u32"]],
  RmsNormArgs: [["n_cols", "u32"], ["eps", "f32"], ["has_weight", "u32"]],
  RopeArgs: [["n_tok", "u32"], ["n_heads", "u32"], ["head_dim", "u32"], ["n_rot", "u32"],
    ["freq_base", "f32"], ["freq_scale", "f32"], ["mode", "u32"], ["has_freq_factors", "u32"]],
  EltwiseArgs: [["n", "u32"], ["n_cols", "u32"], ["scale", "f32"]],
  KvStoreArgs: [["kv_dim", "u32"], ["n_tok", "u32"], ["pos0", "u32"], ["cells", "u32"], ["ring", "u32"],
    ["k_type", "u32"], ["v_type", "u32"]],
  AttentionArgs: [["n_tok", "u32"], ["n_head", "u32"], ["n_kv_head", "u32"], ["head_dim", "u32"],
    ["pos0", "u32"], ["window", "u32"], ["cells", "u32"], ["ring", "u32"], ["scale", "f32"], ["k_type", "u32"],
    ["v_type", "u32"]],
  AttentionDecodeArgs: [["n_tok", "u32"], ["n_head", "u32"], ["n_kv_head", "u32"], ["head_dim", "u32"],
    ["pos0", "u32"], ["window", "u32"], ["cells", "u32"], ["ring", "u32"], ["scale", "f32"], ["group", "u32"],
    ["n_split", "u32"], ["k_type", "u32"], ["v_type", "u32"]],
  AttentionCombineArgs: [["n_tok", "u32"], ["n_head", "u32"], ["head_dim", "u32"], ["n_split", "u32"]],
  NormRopeStoreArgs: [["n_tok", "u32"], ["heads_q", "u32"], ["heads_k", "u32"], ["head_dim", "u32"],
    ["has_norm", "u32"], ["eps", "f32"], ["n_rot", "u32"], ["freq_base", "f32"], ["freq_scale", "f32"],
    ["mode", "u32"], ["has_freq_factors", "u32"], ["q_scale", "f32"], ["pos0", "u32"], ["cells", "u32"],
    ["ring", "u32"], ["k_type", "u32"], ["v_type", "u32"]],
};

/** The KV cache types the Metal kernels store and read, as kv.h's KV_* ids (ggml's type ids). */
export const metalKvTypeIds: Readonly<Partial<Record<KvType, number>>> = { f16: 1, q4_0: 2, q8_0: 8 };
const F16_CACHE: KvTypes = { k: "f16", v: "f16" };

/**
 * kv.h's ids of a K/V pair; a block type needs every KV head's row to be whole 32-value blocks.
 * `dim` is head_dim (or the row's kv_dim, a multiple of it).
 */
export function kvTypeArgs(types: KvTypes, dim: number): { k_type: number; v_type: number } {
  const k = metalKvTypeIds[types.k], v = metalKvTypeIds[types.v];
  if (k === undefined || v === undefined) {
    throw new InferError("unsupported", `the Metal backend keeps the KV cache in f16, q8_0 or q4_0, not ` +
      `${types.k === types.v ? types.k : `k ${types.k}, v ${types.v}`} (use --backend cpu for it)`);
  }
  if ((types.k !== "f16" || types.v !== "f16") && dim % 32 !== 0) {
    throw new InferError("unsupported", `a q8_0/q4_0 KV cache needs head_dim a multiple of 32, not ${dim}`);
  }
  return { k_type: k, v_type: v };
}

/** Constants of args.h the plan depends on (checked by the test). */
/** matmul.metal's tile (rows × tokens) and threads: its simdgroup layout is built for these. */
export const MATMUL_TILE_OUT = 64;
export const MATMUL_TILE_TOK = 32;
export const MATMUL_THREADS = 128;
export const ATTENTION_HEAD_DIM_MAX = 512;
/** attention_prompt.metal: queries per threadgroup, its threads, and its largest head_dim. */
export const ATTENTION_PROMPT_QUERIES = 32;
export const ATTENTION_PROMPT_THREADS = 128;
export const ATTENTION_PROMPT_HEAD_DIM_MAX = 256;
/**
 * matvec_rows.metal's kernels: rows per simdgroup (MATVEC_ROWS_* of args.h) and simdgroups per
 * threadgroup, by weight type suffix. Types not here take matvec.metal's one row per simdgroup.
 */
export const matvecRows: Readonly<Record<string, { readonly rows: number; readonly simdgroups: number }>> = {
  q4_0: { rows: 4, simdgroups: 2 }, q5_0: { rows: 4, simdgroups: 2 },
  q8_0: { rows: 2, simdgroups: 4 }, q4_k: { rows: 2, simdgroups: 2 }, q5_k: { rows: 2, simdgroups: 2 },
  q6_k: { rows: 2, simdgroups: 2 },
};

const SIMD_WIDTH = 32;
/** Decode matvec (matvec.metal): rows per threadgroup, one simdgroup each. */
const MATVEC_SIMDGROUPS = 4;
/** Above this many tokens a matmul uses the tiled kernel. */
export const MATVEC_TOKENS_MAX = 4;
/** From this many queries (a prompt, as for the matmuls) attention takes the flash-attention kernel. */
export const ATTENTION_PROMPT_TOKENS_MIN = MATVEC_TOKENS_MAX + 1;
const NORM_THREADS = 256;
const ELTWISE_THREADS = 256;
const ATTENTION_SIMDGROUPS = 4;

/** The kernel name suffix of each weight type the Metal kernels read. */
export const metalWeightTypes: Readonly<Record<string, string>> = {
  F32: "f32", F16: "f16", BF16: "bf16", Q4_0: "q4_0", Q5_0: "q5_0", Q8_0: "q8_0",
  Q4_K: "q4_k", Q5_K: "q5_k", Q6_K: "q6_k",
};

export function packArgs(struct: string, values: Readonly<Record<string, number>>): Uint8Array {
  const fields = argStructs[struct];
  if (!fields) throw new InferError("internal", `metal plan: no argument struct ${struct}`);
  const bytes = new Uint8Array(fields.length * 4);
  const view = new DataView(bytes.buffer);
  fields.forEach(([name, type], i) => {
    const v = values[name];
    if (v === undefined || !Number.isFinite(v)) {
      throw new InferError("internal", `metal plan: ${struct}.${name} is ${v}`);
    }
    if (type === "f32") view.setFloat32(i * 4, v, true);
    else if (type === "i32") view.setInt32(i * 4, v, true);
    else {
      if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) {
        throw new InferError("invalid_argument", `metal plan: ${struct}.${name} = ${v} is not a u32`);
      }
      view.setUint32(i * 4, v, true);
    }
  });
  for (const name of Object.keys(values)) {
    if (!fields.some(([f]) => f === name)) throw new InferError("internal", `metal plan: ${struct} has no ${name}`);
  }
  return bytes;
}

const ceilDiv = (a: number, b: number) => Math.ceil(a / b);

function weightType(typeId: number): { info: GgmlTypeInfo; suffix: string } {
  const info = ggmlTypes.get(typeId);
  const suffix = info ? metalWeightTypes[info.name] : undefined;
  if (!info || !suffix) {
    throw new InferError("unsupported", `the Metal backend does not compute ${info?.name ?? `type ${typeId}`} weights`);
  }
  return { info, suffix };
}

function checkedRowBytes(info: GgmlTypeInfo, nIn: number): number {
  if (nIn % info.blockValues !== 0) {
    throw new InferError("invalid_argument", `${nIn} inputs are not whole ${info.name} blocks of ${info.blockValues}`);
  }
  return (nIn / info.blockValues) * info.blockBytes;
}

/** y[t][o] = W[o] · x[t]: matvec for a few tokens, the tiled matmul beyond. Buffers w, x, y. */
export function planMatmul(typeId: number, nIn: number, nOut: number, nTok: number): KernelDispatch {
  const { info, suffix } = weightType(typeId);
  const rowBytes = checkedRowBytes(info, nIn);
  const buffers = { w: 0, x: 1, y: 2 };
  if (nTok <= MATVEC_TOKENS_MAX) {
    const { rows, simdgroups } = matvecRows[suffix] ?? { rows: 1, simdgroups: MATVEC_SIMDGROUPS };
    return {
      kernel: `matvec_${suffix}`, grid: [ceilDiv(nOut, rows * simdgroups), nTok, 1],
      threads: [simdgroups * SIMD_WIDTH, 1, 1], threadgroupBytes: 0, buffers, writes: ["y"],
      args: { struct: "MatvecArgs", index: 3,
        bytes: packArgs("MatvecArgs", { n_in: nIn, n_out: nOut, n_tok: nTok, row_bytes: rowBytes }) },
    };
  }
  return {
    kernel: `matmul_${suffix}`, grid: [ceilDiv(nOut, MATMUL_TILE_OUT), ceilDiv(nTok, MATMUL_TILE_TOK), 1],
    threads: [MATMUL_THREADS, 1, 1], threadgroupBytes: (MATMUL_TILE_OUT + MATMUL_TILE_TOK) * 32 * 4, buffers,
    writes: ["y"],
    args: { struct: "MatmulArgs", index: 3,
      bytes: packArgs("MatmulArgs", { n_in: nIn, n_out: nOut, n_tok: nTok, row_bytes: rowBytes }) },
  };
}

/** dst[i] = dequantized row ids[i] of a table of nRows rows of nCols. Buffers table, ids, dst. */
export function planGetRows(typeId: number, nCols: number, nRows: number, nIds: number): KernelDispatch {
  const { info, suffix } = weightType(typeId);
  const rowBytes = checkedRowBytes(info, nCols);
  const chunks = ceilDiv(nCols, 32);
  const threads = Math.min(64, chunks);
  return {
    kernel: `get_rows_${suffix}`, grid: [ceilDiv(chunks, threads), nIds, 1], threads: [threads, 1, 1],
    threadgroupBytes: 0, buffers: { table: 0, ids: 1, dst: 2 }, writes: ["dst"],
    args: { struct: "GetRowsArgs", index: 3,
      bytes: packArgs("GetRowsArgs", { n_cols: nCols, row_bytes: rowBytes, n_ids: nIds, n_rows: nRows }) },
  };
}

/** Threads of a row's RMSNorm (norm_rope_store takes as many per head, to sum in the same order). */
function normThreads(nCols: number): number {
  return Math.min(NORM_THREADS, ceilDiv(nCols, SIMD_WIDTH) * SIMD_WIDTH);
}

function planNorm(kernel: string, out: string, nRows: number, nCols: number, eps: number,
  hasWeight: boolean): KernelDispatch {
  const threads = normThreads(nCols);
  return {
    kernel, grid: [nRows, 1, 1], threads: [threads, 1, 1], threadgroupBytes: (threads / SIMD_WIDTH) * 4,
    buffers: { x: 0, weight: 1, [out]: 2 }, writes: [out],
    args: { struct: "RmsNormArgs", index: 3,
      bytes: packArgs("RmsNormArgs", { n_cols: nCols, eps, has_weight: hasWeight ? 1 : 0 }) },
  };
}

/** out = rms_norm(x) · weight per row. Buffers x, weight (any buffer when hasWeight is false), out. */
export function planRmsNorm(nRows: number, nCols: number, eps: number, hasWeight: boolean): KernelDispatch {
  return planNorm("rms_norm", "out", nRows, nCols, eps, hasWeight);
}

/** residual += rms_norm(x) · weight. Buffers x, weight, residual. */
export function planRmsNormAdd(nRows: number, nCols: number, eps: number): KernelDispatch {
  return planNorm("rms_norm_add", "residual", nRows, nCols, eps, true);
}

export interface NormRopeStorePlanOptions {
  readonly nTok: number; readonly headsQ: number; readonly headsK: number; readonly headDim: number;
  /** RMSNorm of each head first (then eps applies). */
  readonly norm: boolean; readonly eps: number;
  readonly rotaryDims: number; readonly base: number; readonly scale: number; readonly neox: boolean;
  readonly freqFactors: boolean;
  /** The queries' factor after RoPE (1: none). */
  readonly qScale: number;
  readonly pos0: number; readonly cells: number; readonly ring: boolean;
  /** The caches' types (default f16). */
  readonly types?: KvTypes;
}

/**
 * One step's [head norms,] RoPE of q and k[, q scale] and KV store in one dispatch. Buffers q, k,
 * v, q_norm, k_norm (any buffer without norms), positions, freq_factors (any buffer without),
 * k_cache, v_cache.
 */
export function planNormRopeStore(o: NormRopeStorePlanOptions): KernelDispatch {
  checkRotaryDims(o.rotaryDims, o.headDim);
  const threads = normThreads(o.headDim);
  return {
    kernel: "norm_rope_store", grid: [o.headsQ + o.headsK, o.nTok, 1], threads: [threads, 1, 1],
    threadgroupBytes: (threads / SIMD_WIDTH) * 4,
    buffers: { q: 0, k: 1, v: 2, q_norm: 3, k_norm: 4, positions: 5, freq_factors: 6, k_cache: 7, v_cache: 8 },
    writes: ["q", "k", "k_cache", "v_cache"],
    args: { struct: "NormRopeStoreArgs", index: 9, bytes: packArgs("NormRopeStoreArgs", {
      n_tok: o.nTok, heads_q: o.headsQ, heads_k: o.headsK, head_dim: o.headDim, has_norm: o.norm ? 1 : 0,
      eps: o.eps, n_rot: o.rotaryDims, freq_base: o.base, freq_scale: o.scale, mode: o.neox ? 2 : 0,
      has_freq_factors: o.freqFactors ? 1 : 0, q_scale: o.qScale, pos0: o.pos0, cells: o.cells, ring: o.ring ? 1 : 0,
      ...kvTypeArgs(o.types ?? F16_CACHE, o.headDim),
    }) },
  };
}

function checkRotaryDims(rotaryDims: number, headDim: number): void {
  if (rotaryDims <= 0 || rotaryDims % 2 !== 0 || rotaryDims > headDim) {
    throw new InferError("invalid_argument", `rope: ${rotaryDims} rotary dims for head_dim ${headDim}`);
  }
}

export interface RopePlanOptions {
  readonly nTok: number; readonly heads: number; readonly headDim: number; readonly rotaryDims: number;
  readonly base: number; readonly scale: number; readonly neox: boolean; readonly freqFactors: boolean;
}

/** In-place RoPE. Buffers x, positions (i32), freq_factors (any buffer when there are none). */
export function planRope(o: RopePlanOptions): KernelDispatch {
  checkRotaryDims(o.rotaryDims, o.headDim);
  const pairs = o.rotaryDims / 2;
  const threads = Math.min(64, pairs);
  return {
    kernel: "rope", grid: [ceilDiv(pairs, threads), o.heads, o.nTok], threads: [threads, 1, 1],
    threadgroupBytes: 0, buffers: { x: 0, positions: 1, freq_factors: 2 }, writes: ["x"],
    args: { struct: "RopeArgs", index: 3, bytes: packArgs("RopeArgs", {
      n_tok: o.nTok, n_heads: o.heads, head_dim: o.headDim, n_rot: o.rotaryDims, freq_base: o.base,
      freq_scale: o.scale, mode: o.neox ? 2 : 0, has_freq_factors: o.freqFactors ? 1 : 0,
    }) },
  };
}

function planEltwise(kernel: string, buffers: Record<string, number>, writes: string[], argsIndex: number,
  n: number, nCols = 1, scale = 1): KernelDispatch {
  return {
    kernel, grid: [Math.max(1, ceilDiv(n, ELTWISE_THREADS)), 1, 1], threads: [ELTWISE_THREADS, 1, 1],
    threadgroupBytes: 0, buffers, writes,
    args: { struct: "EltwiseArgs", index: argsIndex, bytes: packArgs("EltwiseArgs", { n, n_cols: nCols, scale }) },
  };
}

/** out = act(gate) · up. Buffers gate, up, out. */
export function planGatedAct(kind: "gelu" | "silu", n: number): KernelDispatch {
  return planEltwise(kind === "gelu" ? "gelu_mul" : "silu_mul", { gate: 0, up: 1, out: 2 }, ["out"], 3, n);
}

/** out = a + b. Buffers a, b, out. */
export function planAdd(n: number): KernelDispatch {
  return planEltwise("add", { a: 0, b: 1, out: 2 }, ["out"], 3, n);
}

/** x *= factor. Buffer x. */
export function planScale(n: number, factor: number): KernelDispatch {
  return planEltwise("scale", { x: 0 }, ["x"], 1, n, 1, factor);
}

/** x[r] += bias over rows of nCols. Buffers x, bias. */
export function planAddRowBias(nRows: number, nCols: number): KernelDispatch {
  return planEltwise("add_row_bias", { x: 0, bias: 1 }, ["x"], 2, nRows * nCols, nCols);
}

/** k and v rows into the caches (f16 unless `types` says), a thread per 32 values. Buffers k, v,
 * k_cache, v_cache. */
export function planKvStore(kvDim: number, nTok: number, pos0: number, cells: number, ring: boolean,
  types: KvTypes = F16_CACHE): KernelDispatch {
  const chunks = ceilDiv(kvDim, 32);
  const threads = Math.min(64, chunks);
  return {
    kernel: "kv_store", grid: [ceilDiv(chunks, threads), nTok, 1], threads: [threads, 1, 1], threadgroupBytes: 0,
    buffers: { k: 0, v: 1, k_cache: 2, v_cache: 3 }, writes: ["k_cache", "v_cache"],
    args: { struct: "KvStoreArgs", index: 4, bytes: packArgs("KvStoreArgs", {
      kv_dim: kvDim, n_tok: nTok, pos0, cells, ring: ring ? 1 : 0, ...kvTypeArgs(types, kvDim),
    }) },
  };
}

export interface AttentionPlanOptions {
  readonly nTok: number; readonly heads: number; readonly kvHeads: number; readonly headDim: number;
  readonly pos0: number; readonly window: number; readonly cells: number; readonly ring: boolean;
  readonly scale: number;
  /** The caches' types (default f16). */
  readonly types?: KvTypes;
}

/** The k_type and v_type arguments of an attention kernel. */
export function attentionKvTypeArgs(o: AttentionPlanOptions): { k_type: number; v_type: number } {
  return kvTypeArgs(o.types ?? F16_CACHE, o.headDim);
}

function attentionArgs(o: AttentionPlanOptions): KernelDispatch["args"] {
  return { struct: "AttentionArgs", index: 4, bytes: packArgs("AttentionArgs", {
    n_tok: o.nTok, n_head: o.heads, n_kv_head: o.kvHeads, head_dim: o.headDim, pos0: o.pos0,
    window: o.window, cells: o.cells, ring: o.ring ? 1 : 0, scale: o.scale, ...attentionKvTypeArgs(o),
  }) };
}

/**
 * Flash attention for a prompt (attention_prompt.metal): tiles of 32 queries against blocks of 16
 * keys on simdgroup matrices; the kernel holding the head_dim (d128 or d256).
 */
export function planAttentionPrompt(o: AttentionPlanOptions): KernelDispatch {
  if (o.headDim > ATTENTION_PROMPT_HEAD_DIM_MAX) {
    throw new InferError("internal", `attention_prompt: head_dim ${o.headDim} over ${ATTENTION_PROMPT_HEAD_DIM_MAX}`);
  }
  const dp = Math.ceil(o.headDim / 8) * 8;
  return {
    kernel: dp <= 128 ? "attention_prompt_d128" : "attention_prompt_d256",
    grid: [o.heads, ceilDiv(o.nTok, ATTENTION_PROMPT_QUERIES), 1], threads: [ATTENTION_PROMPT_THREADS, 1, 1],
    // Per simdgroup 192 floats of scratch, then the K and V blocks: 16 × dp halves each.
    threadgroupBytes: (ATTENTION_PROMPT_THREADS / SIMD_WIDTH) * 192 * 4 + 2 * 16 * dp * 2,
    buffers: { q: 0, k_cache: 1, v_cache: 2, out: 3 }, writes: ["out"], args: attentionArgs(o),
  };
}

/**
 * Attention over the cache: the flash-attention prompt kernel for prompts with head_dim up to
 * 256, else one threadgroup per (head, query). Buffers q, k_cache, v_cache, out.
 */
export function planAttention(o: AttentionPlanOptions): KernelDispatch {
  if (o.headDim > ATTENTION_HEAD_DIM_MAX) {
    throw new InferError("unsupported", `head_dim ${o.headDim} is over the Metal backend's ${ATTENTION_HEAD_DIM_MAX}`);
  }
  if (o.kvHeads <= 0 || o.heads % o.kvHeads !== 0) {
    throw new InferError("invalid_argument", `attention: ${o.heads} heads are not a multiple of ${o.kvHeads} KV heads`);
  }
  if (o.nTok >= ATTENTION_PROMPT_TOKENS_MIN && o.headDim <= ATTENTION_PROMPT_HEAD_DIM_MAX) return planAttentionPrompt(o);
  return {
    kernel: "attention", grid: [o.heads, o.nTok, 1], threads: [ATTENTION_SIMDGROUPS * SIMD_WIDTH, 1, 1],
    threadgroupBytes: ATTENTION_SIMDGROUPS * (o.headDim + 2) * 4,
    buffers: { q: 0, k_cache: 1, v_cache: 2, out: 3 }, writes: ["out"], args: attentionArgs(o),
  };
}
