// The Backend interface: what a model graph may ask of the hardware. Tensors are opaque handles
// with a shape; the model never touches pointers or knows which backend runs it. Activations
// hold up to `rows` rows (tokens) of `cols` values; every op takes the number of rows in use, so
// buffers are planned once per context and never reallocated per token.
import type { KvPagePool } from "./kv-pages.ts";
import type { GgufFile, GgufTensorInfo } from "../gguf/reader.ts";

/** Rows first .. first + rows - 1 of a batch. */
export interface RowRange {
  readonly first: number;
  readonly rows: number;
}

/**
 * Rows of a batch that llama.cpp would compute through its batched (prompt) kernels, which round
 * otherwise than its single-token ones: an embedding's, so that it equals llama-embedding's
 * (docs/embeddings.md). Ranges ascend and do not overlap.
 */
export interface BatchedRounding {
  /** Rows of a llama.cpp batch of two rows or more: attention sums in its batched order. */
  readonly rows: readonly RowRange[];
  /** Of those, the rows its batched Q4_K kernel takes four at a time. */
  readonly fourRows: readonly RowRange[];
}

export interface Weight {
  readonly name: string;
  readonly typeName: string;
  /** ggml order: dims[0] is the row length (inputs), dims[1] the number of rows (outputs). */
  readonly dims: readonly number[];
}

export interface Activation {
  readonly name: string;
  readonly rows: number;
  readonly cols: number;
}

/**
 * How a KV cache stores a key or value: f16 (the default), f32 (tests), llama.cpp's block
 * quantizations q8_0 and q4_0 (32 values share an f16 scale; head_dim a multiple of 32), or
 * infer's rotated codes tq3 and tq4 (each head vector rotated, then 3 or 4 bits a value and one
 * f16 scale; head_dim a power of two). See docs/generation.md.
 */
export type KvType = "f16" | "f32" | "q8_0" | "q4_0" | "tq3" | "tq4";
export const kvTypes: readonly KvType[] = ["f16", "f32", "q8_0", "q4_0", "tq3", "tq4"];

/** The types of a cache's keys and its values (they may differ: keys are the sensitive half). */
export interface KvTypes {
  readonly k: KvType;
  readonly v: KvType;
}

/** One type for keys and values both, or each its own. */
export function kvTypesOf(t: KvType | KvTypes): KvTypes {
  return typeof t === "string" ? { k: t, v: t } : t;
}

/**
 * Bytes of `values` values of heads of `headDim` (a whole number of 32-value blocks for q8_0 and
 * q4_0, of head vectors for tq3 and tq4: their f16 scale is per vector).
 */
export function kvBytes(type: KvType, values: number, headDim: number): number {
  switch (type) {
    case "f32": return 4 * values;
    case "f16": return 2 * values;
    case "q8_0": return (values / 32) * 34;
    case "q4_0": return (values / 32) * 18;
    case "tq3": return (values / headDim) * (2 + (headDim * 3) / 8);
    case "tq4": return (values / headDim) * (2 + headDim / 2);
  }
}

/** "q8_0" where both are, else "k q8_0, v f16": for messages and listings. */
export function kvTypesName(t: KvTypes): string {
  return t.k === t.v ? t.k : `k ${t.k}, v ${t.v}`;
}

/**
 * One layer's keys and values for one sequence: `cells` rows. A full layer holds position p in
 * row p; a ring (a sliding-window layer) holds it in row p % cells, keeping only what the window
 * can still see.
 */
export interface KvLayer {
  readonly cells: number;
  readonly ring: boolean;
  readonly kvHeads: number;
  readonly headDim: number;
}

export interface KvLayerShape {
  readonly kvHeads: number;
  readonly headDim: number;
}

/**
 * Blocks of keys and values that sequences share by reference, copy-on-write (the CPU backend on
 * Linux: ts/backend/cpu-kv-share.ts). A sequence holding a block's rows reads the block's memory;
 * its first write to them gives it its own copy of what it writes.
 */
export interface KvBlockStore {
  /** Block `index`'s layers (one per shape, `cells` rows each, never rings); index < blocks. */
  block(index: number): readonly KvLayer[];
  /**
   * Makes rows dstCell .. dstCell + cells - 1 of `dst` those of the block layer from blockCell on,
   * by reference (or, where the system refuses the mapping, by a copy). False, having changed
   * nothing, where it cannot (a ring, rows not on page boundaries, a layer not the backend's own
   * pages): the caller copies them (copyKv) if it needs them.
   */
  share(block: KvLayer, blockCell: number, dst: KvLayer, dstCell: number, cells: number): boolean;
  /** Gives every layer holding rows of these block layers its own copy, before they are rewritten. */
  detach(block: readonly KvLayer[]): void;
  /** Rows held by reference now, summed over the layers holding them. */
  readonly sharedRows: number;
}

export interface RopeOptions {
  readonly heads: number;
  readonly headDim: number;
  readonly rotaryDims: number;
  readonly base: number;
  readonly scale: number;
  readonly neox: boolean;
  /** Per-pair divisors of the angle (Llama 3's `rope_freqs`, rotaryDims/2 f32 values), if any. */
  readonly freqFactors?: Weight | null;
  /**
   * Multiplies the rotated dims (ggml's mscale on every cosine and sine: LongRoPE's attention
   * factor); 1 or absent: a plain rotation. Only a backend with ropeAttnFactor takes another.
   */
  readonly attnFactor?: number;
  /** YaRN (gpt-oss), as ggml's rope_yarn computes it; absent: none. The CPU and CUDA backends take it. */
  readonly yarn?: YarnOptions;
}

/**
 * YaRN (Peng et al. 2023): pairs that turn more than betaFast times over the original context
 * keep their angle, those under betaSlow are divided by the scaling factor (1 / scale), a linear
 * ramp between (ggml_rope_yarn_corr_dims, rounded outward); cos and sin are multiplied by
 * attnFactor · (1 + 0.1 · ln(1 / scale)).
 */
export interface YarnOptions {
  /** ggml's ext_factor: 1 for YaRN, the ramp's weight. */
  readonly extFactor: number;
  readonly betaFast: number;
  readonly betaSlow: number;
  /** rope.scaling.original_context_length. */
  readonly originalContext: number;
}

export interface AttentionOptions {
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** 0: full causal attention; otherwise a key at p0 is hidden from a query at p1 when p1 - p0 >= window. */
  readonly window: number;
  readonly scale: number;
  /** One F32 logit per query head added to the softmax's denominator (gpt-oss's attention sinks). */
  readonly sinks?: Weight;
}

export interface Backend {
  readonly name: string;
  /**
   * The backend honours `firstRow` in setPositions, storeKv and attention, so one batch may hold
   * rows of several sequences (the server's continuous batching); without it, one at a time.
   */
  readonly sequenceBatches?: boolean;
  /** rope() takes an attnFactor other than 1 (RopeOptions.attnFactor); without it, refused. */
  readonly ropeAttnFactor?: boolean;
  weight(file: GgufFile, tensor: GgufTensorInfo): Weight;
  activation(name: string, rows: number, cols: number): Activation;
  /**
   * `paged`: a sequence's cache layer (not a ring), which a backend with a page pool (kvPages)
   * maps only as positions are written; elsewhere the flag changes nothing.
   */
  kvLayer(cells: number, kvHeads: number, headDim: number, type: KvType | KvTypes, ring: boolean,
    paged?: boolean): KvLayer;
  /**
   * The pool paged cache layers map their memory from (kv-pages.ts: the scheduler admits
   * sequences by it); null or absent where caches are allocated whole.
   */
  kvPages?(): KvPagePool | null;
  positions(rows: number): Activation;

  setTokens(dst: Activation, ids: ArrayLike<number>, count: number): void;
  /** Rows firstRow .. firstRow + count - 1 of dst get positions start .. start + count - 1. */
  setPositions(dst: Activation, start: number, count: number, firstRow?: number): void;
  embed(table: Weight, ids: Activation, rows: number, out: Activation): void;
  scale(x: Activation, rows: number, factor: number): void;
  rmsNorm(x: Activation, weight: Weight | null, rows: number, eps: number, out: Activation): void;
  /** residual += rmsNorm(x) * weight, over the first `rows` rows. */
  rmsNormAdd(x: Activation, weight: Weight, rows: number, eps: number, residual: Activation): void;
  /** Per-head RMSNorm: x is viewed as rows*heads rows of headDim. */
  rmsNormHeads(x: Activation, weight: Weight, rows: number, heads: number, eps: number): void;
  /**
   * Rows of the forward pass that begins which round as llama.cpp's batched kernels do where
   * those differ from its single-token ones (Batch.batchedRounding); null for none. Absent where
   * the backend has no such variants (the rows then round as any other).
   */
  setBatchedRounding?(rounding: BatchedRounding | null): void;
  /** out[r] = W · x[r] for the first `rows` rows of x, starting at row `firstRow`. */
  matmul(w: Weight, x: Activation, rows: number, out: Activation, firstRow?: number): void;
  rope(x: Activation, positions: Activation, rows: number, options: RopeOptions): void;
  /**
   * Writes rows firstRow .. firstRow + rows - 1 of k and v into the layer at `position`. A batch
   * of several sequences stores each sequence's rows into its own layers.
   */
  storeKv(layer: KvLayer, k: Activation, v: Activation, rows: number, position: number,
    firstRow?: number): void;
  /** Attention of q's rows firstRow .. (at positions position ..) into the same rows of out. */
  attention(q: Activation, layer: KvLayer, rows: number, position: number, options: AttentionOptions,
    out: Activation, firstRow?: number): void;
  /**
   * Rows firstRow .. firstRow + layers.length - 1 of q, k and v are one row each of different
   * sequences (the server's batched decode), row i at positions[i] with its cache layer layers[i]:
   * stores each row's key and value and attends over its own cache, in fewer launches than a
   * sequence at a time. Returns false, having done nothing, where it cannot (selfAttention then
   * takes one sequence at a time).
   */
  attendRows?(q: Activation, k: Activation, v: Activation, layers: readonly KvLayer[], positions: readonly number[],
    options: AttentionOptions, out: Activation, firstRow?: number): boolean;
  /**
   * Copies `cells` rows of keys and values from one layer to another of the same shape (the
   * prefix cache; without it, prefixes are not shared across sequences).
   */
  copyKv?(src: KvLayer, srcCell: number, dst: KvLayer, dstCell: number, cells: number): void;
  /**
   * Storage for the prefix cache's blocks whose rows sequences can hold by reference (KvBlockStore);
   * null or absent where the backend cannot (the blocks are then kvLayers, their rows copied).
   */
  kvBlockStore?(shapes: readonly KvLayerShape[], types: KvTypes, cells: number, blocks: number): KvBlockStore | null;
  /**
   * The context shift (ts/engine/kv-cache.ts shiftSlot): a layer holding positions 0 ..
   * length - 1 drops positions keep .. keep + discard - 1; the later ones move down by `discard`
   * (into cell p - discard, or (p - discard) % cells in a ring) and their keys are rotated back
   * by `discard` positions with the layer's RoPE. Absent where the backend cannot.
   */
  shiftKv?(layer: KvLayer, rope: RopeOptions, keep: number, discard: number, length: number): void;
  /**
   * The H2O context shift (kv-cache.ts shiftSlotHeavy) on a linear layer: the rows at positions
   * from[i] (ascending, from[0] >= to) move to position to + i, each key rotated by its move.
   */
  compactKv?(layer: KvLayer, rope: RopeOptions, from: Int32Array, to: number): void;
  /**
   * From now on attention over the linear layer adds each key's softmax weight (summed over query
   * heads and tokens) to the returned array's entry for its cell (one a cell, zeroed): the
   * accumulated attention of the H2O shift. on = false stops it (and returns null).
   */
  trackAttention?(layer: KvLayer, on: boolean): Float32Array | null;
  geluMul(gate: Activation, up: Activation, rows: number, out: Activation): void;
  siluMul(gate: Activation, up: Activation, rows: number, out: Activation): void;
  /**
   * gpt-oss's clamped SwiGLU: min(g, 7) · σ(1.702 · min(g, 7)) · (clamp(u, ±7) + 1) (ggml's
   * swiglu_oai); absent on backends that do not run gpt-oss.
   */
  swigluOaiMul?(gate: Activation, up: Activation, rows: number, out: Activation): void;
  add(a: Activation, b: Activation, rows: number, out: Activation): void;
  /** x[r] += bias for the first `rows` rows; bias is an f32 vector of x.cols values. */
  addBias(x: Activation, bias: Weight, rows: number): void;
  /** Prompt rows a forward pass takes by default (longer prompts run in chunks). */
  readonly preferredBatch: number;
  /**
   * Prompt rows a batched step takes while other sequences decode, unless the scheduler is told
   * (default 64). A GPU step of a few dozen rows costs about what one of a few hundred does, so
   * small chunks there only spread a prompt over more slow, mixed steps.
   */
  readonly prefillChunk?: number;
  /** Greedy decoding with the argmax on the device (GPU backends); absent elsewhere. */
  readonly deviceGreedy?: DeviceGreedy;
  /** Mixture-of-experts layers; absent where the backend runs no such model (it refuses one). */
  readonly experts?: ExpertOps;
  /** Gemma 3n's AltUp and activation-sparsity ops; absent where the backend runs no such model. */
  readonly altup?: AltUpOps;
  /** A view of the first `rows` rows (valid until the next op that writes `x`). */
  read(x: Activation, rows: number): Float32Array;
  setThreads(n: number): void;
  /**
   * A GPU backend's free memory, where weights, activations and KV caches go (the engine checks
   * that a model fits before it loads); absent where they live in host memory.
   */
  deviceMemory?(): { readonly freeBytes: number; readonly name: string };
  /** Releases device memory (GPU backends); the backend is unusable afterwards. */
  dispose?(): void;
}

/**
 * Greedy decoding on the device: a step ends with its argmax written where the next step's
 * embedding reads it, so the host can queue step k+1 before it reads token k.
 */
export interface DeviceGreedy {
  /**
   * The index of the largest value of logits' first row becomes token 0 of `ids` in device
   * memory (the next step's input, see keepTokens) and is queued for takeToken(). Ends the step:
   * its work is queued and nothing waits for it.
   */
  argmaxToken(logits: Activation, ids: Activation): void;
  /** As setTokens, for the `count` ids an argmaxToken() left in dst on the device. */
  keepTokens(dst: Activation, count: number): void;
  /** Waits for the oldest token argmaxToken() queued and returns it. */
  takeToken(): number;
  /** Forgets the queued tokens (steps queued past the end of a generation); waits for them. */
  dropTokens(): void;
  /**
   * The argmax of each of the first `rows` rows of `logits` (the first maximum, as the host's),
   * taken on the device: only the ids come back, not the rows (a greedy batch, such as a
   * speculative verification pass of K+1 rows). Ends the step and waits for it; the view is
   * valid until the next call.
   */
  argmaxRows?(logits: Activation, rows: number): Int32Array;
}

/**
 * What a mixture-of-experts layer needs beyond the dense ops: each expert's matrices as weights of
 * their own (so a matmul reads only the chosen experts' bytes), and moving rows between the batch
 * and the rows routed to one expert.
 */
export interface ExpertOps {
  /**
   * The experts of a 3-D tensor (ggml dims [n_in, n_out, experts], expert e's rows stored after
   * expert e - 1's): one 2-D weight per expert, each a view of its own slice.
   */
  split(file: GgufFile, tensor: GgufTensorInfo): readonly Weight[];
  /**
   * The rows of a 2-D F32 tensor (ggml dims [n, experts]: one vector per expert, gpt-oss's
   * biases) as one upload, each row a view; absent: each row is a weight of its own.
   */
  splitVectors?(file: GgufFile, tensor: GgufTensorInfo): readonly Weight[];
  /** Row i of dst = row rows[i] of src, for i < count. */
  gatherRows(src: Activation, rows: Int32Array, count: number, dst: Activation): void;
  /** Row slots[i] of dst = weights[i] × row i of src (each product rounded to f32), for i < count. */
  scatterScaled(src: Activation, slots: Int32Array, weights: Float32Array, count: number,
    dst: Activation): void;
  /** Row r of out = ((src[r·k] + src[r·k + 1]) + …) + src[r·k + k - 1], in that order, for r < rows. */
  sumGroups(src: Activation, k: number, rows: number, out: Activation): void;
  /**
   * The FFN of `rows` tokens (x's first rows) over their chosen experts in one call (as ggml's
   * mul_mat_id): row r of out = Σ_j weights[r·k + j] · down[e_j] · (silu(gate[e_j] x_r) ⊙
   * up[e_j] x_r), e_j = chosen[r·k + j], summed in rank order; several rows grouped by expert.
   * Equal to the per-expert ops above, bit for bit; `supports` says where it can run.
   */
  ffn?(gate: readonly Weight[], up: readonly Weight[], down: readonly Weight[], x: Activation, rows: number,
    chosen: Int32Array, weights: Float32Array, k: number, out: Activation): void;
  /** Whether ffn runs `rows` tokens of experts `feedForward` wide. */
  ffnSupports?(rows: number, feedForward: number): boolean;
  /**
   * The whole layer with the router on the device (GPU backends): logits = router · x, each
   * row's experts chosen as `routing` says, then ffn's sum; the expert ids and weights never
   * reach the host, so a decode step with experts stays one recorded step (a CUDA graph); with
   * `w.biases` and `routing.activation` as gpt-oss has them. Absent where the host routes
   * (moeFfn then reads the logits).
   */
  routedFfn?(w: ExpertWeights, x: Activation, rows: number, routing: Routing, out: Activation): void;
}

/** A mixture-of-experts layer's matrices: the router and each expert's (ExpertOps.split). */
export interface ExpertWeights {
  /** One logit per expert ([embedding, experts]). */
  readonly router: Weight;
  readonly gate: readonly Weight[];
  readonly up: readonly Weight[];
  readonly down: readonly Weight[];
  /** gpt-oss's biases: the router's (one per expert) and each expert's gate, up and down. */
  readonly biases?: {
    readonly router: Weight;
    readonly gate: readonly Weight[];
    readonly up: readonly Weight[];
    readonly down: readonly Weight[];
  };
}

/** How a token's experts are chosen from its router logits (ts/model/moe.ts route). */
export interface Routing {
  readonly experts: number;
  /** Experts each token runs. */
  readonly k: number;
  /** "softmax": softmax, then the top k; "topk-softmax": the top k logits, softmax over them. */
  readonly gating: "softmax" | "topk-softmax";
  /** With "softmax": the k probabilities divided by their sum. */
  readonly normalizeTopK: boolean;
  /** The experts' gated activation: SwiGLU, or gpt-oss's clamped one (swigluOaiMul). */
  readonly activation: "silu" | "swiglu-oai";
}

/**
 * What Gemma 3n (ts/model/gemma3n.ts) needs beyond the dense ops: AltUp's several hidden streams
 * (Baykal et al. 2023, "Alternating Updates for Efficient Transformers"), the magnitude matching
 * of its projected streams, gaussian top-k activation sparsity, and an unscaled per-head RMSNorm
 * (the values' norm). Each op works on the first `rows` rows.
 */
export interface AltUpOps {
  /** Row r of dst = columns first .. first + dst.cols - 1 of row r of src. */
  copyColumns(src: Activation, first: number, rows: number, dst: Activation): void;
  /** x = tanh(x), elementwise. */
  tanh(x: Activation, rows: number): void;
  /** Row r of x ⊙= weight (an f32 vector of x.cols values). */
  mulWeight(x: Activation, weight: Weight, rows: number): void;
  /** Per-head RMSNorm without a weight: x is viewed as rows·heads rows of x.cols / heads. */
  rmsNormHeads(x: Activation, rows: number, heads: number, eps: number): void;
  /**
   * Row r of x ·= rms(target[r]) / sqrt(max(mean(x[r]²), floor)): a projected stream given the
   * magnitude of the stream it came from.
   */
  matchMagnitude(x: Activation, target: Activation, rows: number, floor: number): void;
  /**
   * Gaussian top-k: row r of x = relu(x[r] − (mean + multiplier · std)): the values above the
   * row's `multiplier` quantile of a normal with its mean and deviation survive. std is the
   * sample standard deviation (the squares over n − 1), as llama.cpp's gemma3n graph computes it
   * on the same GGUF; transformers' population deviation (over n) differs by a factor
   * sqrt(n / (n − 1)), 6e-5 relative for the released models' 8192-wide gates.
   */
  gaussianTopK(x: Activation, rows: number, multiplier: number): void;
  /**
   * AltUp's prediction: out[i] = x[i] + Σ_j coefs[r][i·n + j] · x[j], row by row, for the n
   * streams x (coefs: rows × n² values).
   */
  predict(x: readonly Activation[], coefs: Activation, rows: number, out: readonly Activation[]): void;
  /**
   * AltUp's correction: out[i] = predictions[i] + (coefs[r][i] + 1) · (activated − predictions[active]),
   * row by row (coefs: rows × n values); out may be predictions.
   */
  correct(predictions: readonly Activation[], activated: Activation, coefs: Activation, active: number,
    rows: number, out: readonly Activation[]): void;
}
