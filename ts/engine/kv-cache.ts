// A sequence's KV cache: one layer of keys and values per transformer block, for every position
// up to the context length, allocated once. F16 by default, as llama.cpp stores it.
import type { Backend, KvLayer, KvType } from "../backend/backend.ts";
import type { ModelInfo } from "../model/model.ts";

export interface KvCache {
  readonly layers: readonly KvLayer[];
  readonly contextLength: number;
  readonly type: KvType;
}

export function createKvCache(be: Backend, info: ModelInfo, contextLength: number, type: KvType): KvCache {
  const layers = info.kvShapes.map((s) => be.kvLayer(contextLength, s.kvHeads, s.headDim, type));
  return { layers, contextLength, type };
}
