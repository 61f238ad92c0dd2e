// A sequence's KV cache: one layer of keys and values per transformer block, allocated once, F16 by
// default as llama.cpp stores it. Full-attention layers hold every position up to the context
// length. Sliding-window layers hold a ring of roundUp(window + batch, 256) cells: enough for the
// window plus the batch being written, and the same ring llama.cpp's SWA cache uses when it
// evaluates one token per ubatch (768 cells for a 512 window), so that attention sums its terms in
// the same cell order and the logits stay equal to llama.cpp's past the ring's first wrap.
import type { Backend, KvLayer, KvType } from "../backend/backend.ts";
import type { ModelInfo } from "../model/model.ts";

export interface KvCache {
  readonly layers: readonly KvLayer[];
  readonly contextLength: number;
  readonly type: KvType;
}

const RING_PAD = 256;

export function ringCells(window: number, maxBatch: number): number {
  return Math.ceil((window + maxBatch) / RING_PAD) * RING_PAD;
}

export function createKvCache(be: Backend, info: ModelInfo, contextLength: number, type: KvType,
  maxBatch: number): KvCache {
  const layers = info.kvShapes.map((s) => {
    const ring = s.window > 0 ? ringCells(s.window, maxBatch) : 0;
    return ring > 0 && ring < contextLength
      ? be.kvLayer(ring, s.kvHeads, s.headDim, type, true)
      : be.kvLayer(contextLength, s.kvHeads, s.headDim, type, false);
  });
  return { layers, contextLength, type };
}

/**
 * Whether a cache holding `length` positions can drop back to `position`. A sliding-window ring
 * reuses cells, so the positions the next query sees (the window before `position`) must not
 * have been overwritten by positions past it: at most cells - window positions may be dropped.
 */
export function canRewind(cache: KvCache, info: ModelInfo, length: number, position: number): boolean {
  if (position === 0 || position >= length) return true;
  return cache.layers.every((layer, i) => {
    if (!layer.ring) return true;
    return length - position <= layer.cells - info.kvShapes[i].window;
  });
}
