// Decode attention on Metal: which kernels attend a few query rows over the f16 cache, chosen by
// a cost model of the dispatch, since no Apple GPU is at hand to time them. The candidates:
//  - attention.metal: one threadgroup per (query head, row), each reading every visible key and
//    value of its KV head;
//  - attention_decode.metal with n splits: one threadgroup per (group of query heads sharing a KV
//    head, split, row), each reading 1/n of the keys once for the whole group, then (n > 1)
//    attention_decode_combine, a dependent dispatch, merging the splits.
// The model (AttentionCostModel) counts bytes and threadgroups: a threadgroup runs on one GPU core
// and reads at that core's share of the bandwidth; T threadgroups on C cores take ceil(T / C)
// waves, each as long as one threadgroup's bytes take; every dispatch costs a fixed gap (it waits
// behind a barrier for the one before). A short context stays on attention.metal (one dispatch,
// and a grouped threadgroup's queries and outputs outweigh a few keys); a long one splits until
// the cores are busy; a model with many query heads per KV head groups them even unsplit.
import { InferError } from "../errors.ts";
import {
  ATTENTION_HEAD_DIM_MAX, ATTENTION_PROMPT_TOKENS_MIN, attentionKvTypeArgs, packArgs, planAttention,
  type AttentionPlanOptions, type KernelDispatch,
} from "./metal-plan.ts";

/**
 * Rows (tokens) up to which attention is a decode, and attention_decode.metal is a candidate;
 * from one more row on, planAttention takes attention_prompt.metal.
 */
export const ATTENTION_DECODE_TOKENS_MAX = ATTENTION_PROMPT_TOKENS_MIN - 1;
/** Splits of a row's keys at most. */
export const ATTENTION_DECODE_SPLITS_MAX = 64;
/**
 * attention_decode.metal's kernels: the head_dim each holds at most and the query heads a
 * threadgroup takes at most (ATTENTION_DECODE_GROUP_D* in args.h; test/metal-plan.test.ts checks).
 */
export const attentionDecodeVariants: readonly { readonly headDim: number; readonly groupMax: number }[] = [
  { headDim: 64, groupMax: 8 }, { headDim: 128, groupMax: 8 }, { headDim: 256, groupMax: 4 },
  { headDim: 512, groupMax: 2 },
];
const SIMD_WIDTH = 32;
const DECODE_SIMDGROUPS = 4;
const COMBINE_THREADS_MAX = 256;

/** What the cost model knows of a GPU. */
export interface AttentionCostModel {
  /** GPU cores (each runs a threadgroup's reads at its share of the bandwidth). */
  readonly cores: number;
  /** Bytes a core reads or writes per microsecond. */
  readonly coreBytesPerUs: number;
  /** The fixed cost of one more dispatch behind a barrier, in microseconds. */
  readonly dispatchUs: number;
}

/**
 * The base Apple-silicon GPU (M1 to M4: 8 to 10 cores, 68 to 120 GB/s, ~10 GB/s a core; the
 * larger chips have more cores at about the same bandwidth a core, so they split further than
 * this model and lose little by it), and a dependent dispatch of a concurrent encoder taken as
 * 5 µs. The choices depend on the dispatch gap only as bytes a core reads in it (50 KB here).
 */
export const baseAppleGpu: AttentionCostModel = { cores: 10, coreBytesPerUs: 10_000, dispatchUs: 5 };

/** One dispatch's threadgroups and the bytes each reads and writes. */
interface Phase { readonly groups: number; readonly bytesPerGroup: number }

export function phasesCostUs(phases: readonly Phase[], m: AttentionCostModel): number {
  let us = 0;
  for (const p of phases) us += m.dispatchUs + Math.ceil(p.groups / m.cores) * (p.bytesPerGroup / m.coreBytesPerUs);
  return us;
}

/** A decode attention as planned: its dispatches in order, their scratch and the model's cost. */
export interface AttentionStep {
  /** Buffers by name: q, k_cache, v_cache, out, and partials (the scratch) for the split kernels. */
  readonly dispatches: readonly KernelDispatch[];
  /** f32 values of the partials buffer the dispatches need (0: none). */
  readonly scratchFloats: number;
  readonly costUs: number;
  /** The splits of the keys (0: attention.metal). */
  readonly splits: number;
}

/** Keys the last (most-seeing) row sees. */
function visibleKeys(o: AttentionPlanOptions): number {
  const last = o.pos0 + o.nTok;
  return o.window > 0 ? Math.min(last, o.window) : last;
}

function checkShape(o: AttentionPlanOptions): void {
  if (o.headDim > ATTENTION_HEAD_DIM_MAX) {
    throw new InferError("unsupported", `head_dim ${o.headDim} is over the Metal backend's ${ATTENTION_HEAD_DIM_MAX}`);
  }
  if (o.kvHeads <= 0 || o.heads % o.kvHeads !== 0) {
    throw new InferError("invalid_argument", `attention: ${o.heads} heads are not a multiple of ${o.kvHeads} KV heads`);
  }
}

/** The variant holding headDim, and the most query heads of one KV head a threadgroup may take. */
function decodeShape(o: AttentionPlanOptions): { kernel: string; group: number } {
  const v = attentionDecodeVariants.find((x) => o.headDim <= x.headDim);
  if (!v) throw new InferError("unsupported", `head_dim ${o.headDim} is over the Metal backend's ${ATTENTION_HEAD_DIM_MAX}`);
  const perKv = o.heads / o.kvHeads;
  let group = Math.min(perKv, v.groupMax);
  while (perKv % group !== 0) group--;
  return { kernel: `attention_decode_d${v.headDim}`, group };
}

/**
 * planAttention's one dispatch as a step: attention.metal for decode rows, attention_prompt.metal
 * for a prompt. The cost is attention.metal's by the model; only decode rows are chosen by it.
 */
export function planAttentionSingle(o: AttentionPlanOptions, m: AttentionCostModel = baseAppleGpu): AttentionStep {
  const d = planAttention(o);
  const rowBytes = o.headDim * 4;
  const costUs = phasesCostUs([{ groups: o.heads * o.nTok, bytesPerGroup: visibleKeys(o) * rowBytes + 2 * rowBytes }], m);
  return { dispatches: [d], scratchFloats: 0, costUs, splits: 0 };
}

/** attention_decode.metal over `splits` spans of the keys, and the combine when splits > 1. */
export function planAttentionDecode(o: AttentionPlanOptions, splits: number,
  m: AttentionCostModel = baseAppleGpu): AttentionStep {
  checkShape(o);
  if (o.nTok > ATTENTION_DECODE_TOKENS_MAX) {
    throw new InferError("internal", `attention_decode: ${o.nTok} rows are over ${ATTENTION_DECODE_TOKENS_MAX}`);
  }
  if (!Number.isInteger(splits) || splits < 1 || splits > ATTENTION_DECODE_SPLITS_MAX) {
    throw new InferError("invalid_argument", `attention_decode: ${splits} splits (1 to ${ATTENTION_DECODE_SPLITS_MAX})`);
  }
  const { kernel, group } = decodeShape(o);
  const stride = o.headDim + 2;
  const decode: KernelDispatch = {
    kernel, grid: [o.heads / group, splits, o.nTok], threads: [DECODE_SIMDGROUPS * SIMD_WIDTH, 1, 1],
    threadgroupBytes: DECODE_SIMDGROUPS * group * stride * 4,
    buffers: { q: 0, k_cache: 1, v_cache: 2, out: 3, partials: 4 }, writes: ["out", "partials"],
    args: { struct: "AttentionDecodeArgs", index: 5, bytes: packArgs("AttentionDecodeArgs", {
      n_tok: o.nTok, n_head: o.heads, n_kv_head: o.kvHeads, head_dim: o.headDim, pos0: o.pos0, window: o.window,
      cells: o.cells, ring: o.ring ? 1 : 0, scale: o.scale, group, n_split: splits, ...attentionKvTypeArgs(o),
    }) },
  };
  const costUs = phasesCostUs(decodePhases(o, group, splits), m);
  if (splits === 1) return { dispatches: [decode], scratchFloats: 0, costUs, splits };
  const combine: KernelDispatch = {
    kernel: "attention_decode_combine", grid: [o.heads, o.nTok, 1],
    threads: [Math.min(COMBINE_THREADS_MAX, Math.ceil(o.headDim / SIMD_WIDTH) * SIMD_WIDTH), 1, 1],
    threadgroupBytes: 0, buffers: { partials: 0, out: 1 }, writes: ["out"],
    args: { struct: "AttentionCombineArgs", index: 2, bytes: packArgs("AttentionCombineArgs", {
      n_tok: o.nTok, n_head: o.heads, head_dim: o.headDim, n_split: splits,
    }) },
  };
  return { dispatches: [decode, combine], scratchFloats: o.nTok * o.heads * splits * stride, costUs, splits };
}

/**
 * attention_decode.metal's threadgroups and bytes: each reads its span of K and V rows and its
 * group's queries and writes the group's outputs (or partials); the combine reads every split's
 * partials of a head and writes its output.
 */
function decodePhases(o: AttentionPlanOptions, group: number, splits: number): Phase[] {
  const stride = o.headDim + 2;
  const keysPerSplit = Math.ceil(visibleKeys(o) / splits);
  const phases: Phase[] = [{ groups: (o.heads / group) * splits * o.nTok,
    bytesPerGroup: keysPerSplit * o.headDim * 4 + group * o.headDim * 4 + group * stride * 4 }];
  if (splits > 1) phases.push({ groups: o.heads * o.nTok, bytesPerGroup: splits * stride * 4 + o.headDim * 4 });
  return phases;
}

/**
 * The attention of `o`: over a few rows, the cheapest by the cost model of attention.metal and
 * attention_decode.metal at every split count (the fewest splits among equals; attention.metal
 * unless another is cheaper); `splits` forces that split count instead. Prompts take
 * planAttention's choice (flash attention on simdgroup matrices up to head_dim 256).
 */
export function planAttentionStep(o: AttentionPlanOptions, m: AttentionCostModel = baseAppleGpu,
  splits?: number): AttentionStep {
  checkShape(o);
  if (o.nTok > ATTENTION_DECODE_TOKENS_MAX) return planAttentionSingle(o, m);
  if (splits !== undefined) return planAttentionDecode(o, splits, m);
  const single = planAttentionSingle(o, m);
  const { group } = decodeShape(o);
  let bestUs = single.costUs, bestSplits = 0;
  const most = Math.min(ATTENTION_DECODE_SPLITS_MAX, visibleKeys(o));
  for (let s = 1; s <= most; s++) {
    const us = phasesCostUs(decodePhases(o, group, s), m);
    if (us < bestUs) [bestUs, bestSplits] = [us, s];
  }
  return bestSplits === 0 ? single : planAttentionDecode(o, bestSplits, m);
}
