// What every architecture provides to the engine: its shape, and a forward pass over a batch of
// rows from one or several sequences, each writing into (and attending over) its own KV cache.
import type { BatchedRounding, KvLayer, RopeOptions, RowRange } from "../backend/backend.ts";

export interface KvShape {
  readonly kvHeads: number;
  readonly headDim: number;
  /** Sliding window of the layer's attention (0: it sees every earlier position). */
  readonly window: number;
}

/**
 * What an architecture's validated hyperparameters say about the memory it needs, known before
 * any weight is touched: the engine checks that the model fits before it is built.
 */
export interface ModelShape {
  readonly architecture: string;
  readonly layers: number;
  readonly embedding: number;
  readonly feedForward: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly vocab: number;
  readonly contextLength: number;
  readonly kvShapes: readonly KvShape[];
  /** Activation floats per batch row beyond the dense decoder's (a mixture of experts' routing). */
  readonly extraRowFloats?: number;
}

export interface ModelInfo {
  readonly architecture: string;
  readonly name: string;
  readonly vocabSize: number;
  readonly contextLength: number;
  /** Width of the hidden state (an embedding's dimensions). */
  readonly embedding: number;
  /** One entry per layer: the shape of its keys and values. */
  readonly kvShapes: readonly KvShape[];
  /** One entry per layer: how its keys are rotated (the context shift re-rotates them). */
  readonly keyRope: readonly RopeOptions[];
}

export interface ForwardOptions {
  /**
   * Receives the logits of every row of the batch, a chunk of rows at a time (views valid during
   * the call). Without it only the last row's logits are computed.
   */
  readonly onLogits?: (firstRow: number, rows: number, logits: Float32Array) => void;
}

/** One sequence's rows in a batch: contiguous rows at consecutive positions, its own KV cache. */
export interface SequenceRows {
  readonly rows: number;
  /** The position of the segment's first row. */
  readonly position: number;
  readonly cache: readonly KvLayer[];
}

/**
 * A forward pass over several sequences at once: every weight is read once for all rows, and each
 * row is computed with the single-token arithmetic, so a sequence's logits do not depend on what
 * else shares its batch. A sequence may appear in more than one segment when its earlier
 * positions come first (a prompt's body, then its last token among the rows that need logits).
 */
export interface Batch {
  /** Token ids of every row, segment after segment. */
  readonly tokens: ArrayLike<number>;
  readonly segments: readonly SequenceRows[];
  /**
   * Logits are computed for the last `logitRows` rows only (0: none, a prompt's body): the LM
   * head is the largest matmul.
   */
  readonly logitRows: number;
  /**
   * Greedy decoding on the device (a backend with deviceGreedy; one row, logitRows 1): the argmax
   * of the logits becomes the next batch's token in device memory and is queued for the
   * backend's deviceGreedy.takeToken(); the sink is not called. tokenOnDevice: this batch's
   * token is the one the previous greedy batch left there (`tokens` is not read).
   */
  readonly greedy?: { readonly tokenOnDevice: boolean };
  /**
   * Every logit row is decoded greedily (a backend with deviceGreedy.argmaxRows): each row's
   * argmax is taken on the device and handed to this sink instead of the row's logits, which
   * stay on the device (a speculative verification pass: K+1 ids, not K+1 rows of logits).
   * When the sink returns true, those rows' logits are read and handed to the logits sink too
   * (a row whose argmax a logit bias bans is picked from its logits).
   */
  readonly argmaxSink?: IdsSink;
  /**
   * Rows whose last hidden state (after the final norm, where the LM head would read it) is
   * wanted, for embeddings: each range's rows are handed to the sink before any logits.
   */
  readonly hidden?: HiddenRequest;
  /**
   * Rows computed with the rounding of llama.cpp's batched (prompt) kernels where it differs
   * from a single token's: an embedding's (docs/embeddings.md). Never rows that need logits: a
   * token's row keeps the single-token arithmetic. A backend without the variant kernels
   * (setBatchedRounding) ignores it.
   */
  readonly batchedRounding?: BatchedRounding;
}

/** Receives `rows` hidden rows starting at batch row `firstRow` (a view valid during the call). */
export type HiddenSink = (firstRow: number, rows: number, values: Float32Array) => void;

export interface HiddenRequest {
  readonly ranges: readonly RowRange[];
  readonly sink: HiddenSink;
}

/**
 * Receives the argmax of `rows` rows starting at batch row `firstRow` (a view valid during the
 * call); true: it wants those rows' logits as well.
 */
export type IdsSink = (firstRow: number, rows: number, ids: Int32Array) => boolean | void;

/** Receives `rows` rows of logits starting at batch row `firstRow` (a view valid during the call). */
export type LogitsSink = (firstRow: number, rows: number, logits: Float32Array) => void;

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
  /** Runs a batch of segments (at most maxBatch rows in all), handing logits to `sink`. */
  forwardBatch(batch: Batch, sink: LogitsSink): void;
}
