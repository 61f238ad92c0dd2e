// A sequence's KV cache: one layer of keys and values per transformer block, allocated once, F16 by
// default as llama.cpp stores it (or q8_0/q4_0 blocks or tq3/tq4 rotated codes, keys and values each their own type). Full-attention layers hold every position up to the context
// length. Sliding-window layers hold a ring of roundUp(window + batch, 256) cells: enough for the
// window plus the batch being written, and the same ring llama.cpp's SWA cache uses when it
// evaluates one token per ubatch (768 cells for a 512 window), so that attention sums its terms in
// the same cell order and the logits stay equal to llama.cpp's past the ring's first wrap. A
// backend with a page pool (CUDA: ts/backend/kv-pages.ts) maps a full layer's memory only as
// positions are written.
import { kvTypesOf, type Backend, type KvLayer, type KvType, type KvTypes } from "../backend/backend.ts";
import { InferError } from "../errors.ts";
import type { ModelInfo } from "../model/model.ts";

export interface KvCache {
  readonly layers: readonly KvLayer[];
  readonly contextLength: number;
  readonly type: KvTypes;
}

const RING_PAD = 256;

export function ringCells(window: number, maxBatch: number): number {
  return Math.ceil((window + maxBatch) / RING_PAD) * RING_PAD;
}

export function createKvCache(be: Backend, info: ModelInfo, contextLength: number, types: KvType | KvTypes,
  maxBatch: number): KvCache {
  const type = kvTypesOf(types);
  const layers = info.kvShapes.map((s) => {
    const ring = s.window > 0 ? ringCells(s.window, maxBatch) : 0;
    return ring > 0 && ring < contextLength
      ? be.kvLayer(ring, s.kvHeads, s.headDim, type, true)
      : be.kvLayer(contextLength, s.kvHeads, s.headDim, type, false, true);
  });
  return { layers, contextLength, type };
}

/**
 * A KV cache and the tokens it holds: the engine's sequence, or one of the scheduler's slots.
 * What a sequence leaves there is kept when it ends, for the next one that begins the same way.
 */
export interface Slot {
  readonly cache: KvCache;
  /** The token at each position the cache holds. */
  readonly history: Int32Array;
  /** Positions 0..length-1 hold history's tokens. */
  length: number;
  /**
   * One past the furthest position written since the slot last started over from position 0:
   * a rewind keeps it, because the ring cells those writes took are lost to earlier positions
   * (a speculative device step writes one position past the length).
   */
  reach: number;
  /**
   * The H2O shift's accumulated attention, one array a full-attention layer (null for a ring):
   * entry p sums the softmax weight every query head gave position p since tracking began
   * (trackAttention). Absent: not tracked.
   */
  mass?: (Float32Array | null)[];
  /**
   * Positions below it were held when tracking began (a prefix continued in place or restored
   * from the prefix cache): their mass lacks the attention of the queries before it, which
   * shiftSlotHeavy estimates.
   */
  massFrom?: number;
}

export function createSlot(cache: KvCache): Slot {
  return { cache, history: new Int32Array(cache.contextLength), length: 0, reach: 0 };
}

/**
 * Whether a cache whose cells were written up to position reach - 1 can drop back to
 * `position`. A sliding-window ring reuses cells, so the positions the next query sees (the
 * window before `position`) must not have been overwritten by positions past it: at most
 * cells - window positions may lie between.
 */
export function canRewind(cache: KvCache, info: ModelInfo, reach: number,
  position: number): boolean {
  if (position === 0 || position >= reach) return true;
  return cache.layers.every((layer, i) => {
    if (!layer.ring) return true;
    return reach - position <= layer.cells - info.kvShapes[i].window;
  });
}

/**
 * How many of the prompt's first tokens the slot holds and can continue from in place: their
 * common prefix, short of the prompt's last token (whose logits are needed), or 0 where the
 * cache cannot drop back to it (canRewind).
 */
export function reusablePrefix(slot: Slot, info: ModelInfo, prompt: readonly number[]): number {
  const limit = Math.min(slot.length, prompt.length - 1);
  let common = 0;
  while (common < limit && slot.history[common] === prompt[common]) common++;
  return canRewind(slot.cache, info, slot.reach, common) ? common : 0;
}

/** Makes the slot continue from `position` (at most its length); 0 starts it over. */
export function rewindSlot(slot: Slot, position: number): void {
  if (position > slot.length) {
    throw new InferError("internal", `a slot of ${slot.length} positions rewound to ${position}`);
  }
  slot.length = position;
  if (position === 0) slot.reach = 0;
}

/** Positions the context shift keeps at the start by default: StreamingLLM's attention sinks. */
export const SHIFT_KEEP = 4;

/**
 * How many positions the context shift drops from a slot holding `length` positions, keeping
 * the first `keep`: half of the rest, as llama.cpp's context shift, but no more than leaves each
 * sliding-window ring's window clear of the kept first positions (a ring has forgotten them;
 * llama.cpp's sliding-window cache has too, so those layers do not see them). 0: none can go.
 */
export function shiftDiscard(cache: KvCache, info: ModelInfo, keep: number, length: number): number {
  let discard = Math.floor((length - keep) / 2);
  cache.layers.forEach((layer, i) => {
    if (layer.ring) discard = Math.min(discard, length - keep - info.kvShapes[i].window);
  });
  return Math.max(0, discard);
}

/**
 * The context shift (StreamingLLM, llama.cpp's context shift): drops the slot's positions keep ..
 * keep + discard - 1 and moves the later ones down, their keys rotated back by `discard`
 * positions with each layer's RoPE, so that generation goes on past the end of the context. The
 * kept keys and values are those computed with the dropped tokens in view, as in llama.cpp.
 * Returns the positions dropped (0: the backend cannot shift, or nothing can go).
 */
export function shiftSlot(be: Backend, slot: Slot, info: ModelInfo, keep = SHIFT_KEEP): number {
  const rope = info.keyRope, length = slot.length;
  if (!be.shiftKv || keep >= length) return 0;
  const discard = shiftDiscard(slot.cache, info, keep, length);
  if (discard < 1) return 0;
  slot.cache.layers.forEach((layer, i) => be.shiftKv!(layer, rope[i], keep, discard, length));
  slot.history.copyWithin(keep, keep + discard, length);
  slot.length = length - discard;
  slot.reach = slot.length;
  return discard;
}

/** The context shift's policies: which positions past the sinks a full sequence keeps. */
export type ShiftPolicy = "streaming" | "h2o";
export const SHIFT_POLICIES: readonly ShiftPolicy[] = ["streaming", "h2o"];

/**
 * Makes the slot's attention over its full-attention layers accumulate each position's softmax
 * weight (for shiftSlotHeavy), from zero; false where the backend cannot. Positions the slot
 * already holds (a reused prefix, whose queries ran in another sequence or none) start at zero
 * too, and are marked (massFrom) for shiftSlotHeavy to estimate what they missed.
 */
export function trackAttention(be: Backend, slot: Slot): boolean {
  if (!be.trackAttention || !be.compactKv) return false;
  slot.mass = slot.cache.layers.map((layer) => layer.ring ? null : be.trackAttention!(layer, true));
  slot.massFrom = slot.length;
  return true;
}

/** Stops trackAttention's accumulation (a later sequence of the slot shifts another way). */
export function untrackAttention(be: Backend, slot: Slot): void {
  if (!slot.mass) return;
  slot.cache.layers.forEach((layer) => { if (!layer.ring) be.trackAttention?.(layer, false); });
  slot.mass = undefined;
  slot.massFrom = undefined;
}

/** The context shift by the slot's policy: shiftSlot ("streaming") or shiftSlotHeavy ("h2o"). */
export function shiftSlotBy(policy: ShiftPolicy, be: Backend, slot: Slot, info: ModelInfo,
  keep = SHIFT_KEEP): number {
  return policy === "h2o" && slot.mass ? shiftSlotHeavy(be, slot, info, keep) : shiftSlot(be, slot, info, keep);
}

/**
 * H2O's context shift (Zhang et al. 2023, "Heavy-Hitter Oracle"): drops as many positions as
 * shiftSlot does, but of the positions kept past the first `keep` (the sinks), half (at least
 * every sliding window) are the most recent and the rest the heavy hitters: the positions
 * before them with the largest attention accumulated so far (slot.mass, summed over layers and
 * heads). Kept positions close up in order, each key rotated by its own move with the layer's
 * RoPE; the recent ones move by the dropped count, which is all a sliding-window ring holds, so
 * a ring shifts as shiftSlot shifts it. Returns the positions dropped.
 *
 * A position held before tracking began (p < slot.massFrom: a reused prefix) has the attention
 * of the queries from massFrom on, length - massFrom of them, where one the sequence computed
 * itself has that of all length - p queries after it. Its mass is scaled by (length - p) /
 * (length - massFrom) before the ranking, and kept so: the attention the missing queries gave it
 * taken as the average the counted ones did. Zero instead would make a reused prefix the first to
 * go; the estimate is exact where a position draws the same attention from every query.
 */
export function shiftSlotHeavy(be: Backend, slot: Slot, info: ModelInfo, keep = SHIFT_KEEP): number {
  const length = slot.length, mass = slot.mass;
  if (!be.shiftKv || !be.compactKv || !mass || keep >= length) return 0;
  const discard = shiftDiscard(slot.cache, info, keep, length);
  if (discard < 1) return 0;
  const budget = length - keep - discard;
  const window = Math.max(0, ...slot.cache.layers.map((l, i) => l.ring ? info.kvShapes[i].window : 0));
  const recent = Math.min(budget, Math.max(window, Math.ceil(budget / 2)));
  const heavy = budget - recent, middleEnd = length - recent;
  const reused = Math.min(slot.massFrom ?? 0, length - 1);
  for (const m of mass) {
    if (m) for (let p = 0; p < reused; p++) m[p] *= (length - p) / (length - reused);
  }
  slot.massFrom = 0;
  const total = new Float64Array(length);
  for (const m of mass) if (m) for (let p = 0; p < length; p++) total[p] += m[p];
  const candidates = Array.from({ length: middleEnd - keep }, (_, i) => keep + i);
  candidates.sort((a, b) => total[b] - total[a] || a - b);
  const from = new Int32Array(budget);
  from.set(candidates.slice(0, heavy).sort((a, b) => a - b));
  for (let i = 0; i < recent; i++) from[heavy + i] = middleEnd + i;
  const rope = info.keyRope;
  slot.cache.layers.forEach((layer, i) => {
    if (layer.ring) be.shiftKv!(layer, rope[i], keep, discard, length);
    else be.compactKv!(layer, rope[i], from, keep);
  });
  for (const m of mass) {
    if (!m) continue;
    for (let i = 0; i < budget; i++) m[keep + i] = m[from[i]];
    m.fill(0, keep + budget);
  }
  for (let i = 0; i < budget; i++) slot.history[keep + i] = slot.history[from[i]];
  slot.length = length - discard;
  slot.reach = slot.length;
  return discard;
}
