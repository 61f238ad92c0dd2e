// What every architecture provides to the engine: its shape, and a forward pass over a batch of
// tokens at consecutive positions of one sequence, writing into that sequence's KV cache.
import type { KvLayer } from "../backend/backend.ts";

export interface KvShape {
  readonly kvHeads: number;
  readonly headDim: number;
  /** Sliding window of the layer's attention (0: it sees every earlier position). */
  readonly window: number;
}

export interface ModelInfo {
  readonly architecture: string;
  readonly name: string;
  readonly vocabSize: number;
  readonly contextLength: number;
  /** One entry per layer: the shape of its keys and values. */
  readonly kvShapes: readonly KvShape[];
}

export interface ForwardOptions {
  /**
   * Receives the logits of every row of the batch, a chunk of rows at a time (views valid during
   * the call). Without it only the last row's logits are computed.
   */
  readonly onLogits?: (firstRow: number, rows: number, logits: Float32Array) => void;
}

export interface Model {
  readonly info: ModelInfo;
  /** Largest number of tokens one forward() takes (longer prompts go in chunks). */
  readonly maxBatch: number;
  /**
   * Runs `count` tokens at positions position..position+count-1 and returns the logits of the
   * last one (a view, valid until the next call).
   */
  forward(tokens: ArrayLike<number>, count: number, position: number, cache: readonly KvLayer[],
    options?: ForwardOptions): Float32Array;
}
