// Layers shared by the architectures, written once: weight lookup, self-attention with grouped
// KV heads (optional QK-norm, RoPE, sliding window) and the gated feed-forward network.
import type { Activation, AttentionOptions, Backend, KvLayer, RopeOptions, Weight } from "../backend/backend.ts";
import { InferError } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";

/** Looks up tensors by GGUF name, checking each one's shape against what the graph expects. */
export class WeightTable {
  constructor(private readonly file: GgufFile, private readonly backend: Backend) {}

  get(name: string, dims: readonly number[]): Weight {
    const t = this.file.tensors.get(name);
    if (!t) throw new InferError("bad_model", `model has no tensor '${name}'`);
    if (t.dims.length !== dims.length || t.dims.some((d, i) => d !== dims[i])) {
      throw new InferError("bad_model", `tensor '${name}' has shape [${t.dims}], expected [${dims}]`);
    }
    return this.backend.weight(this.file, t);
  }

  optional(name: string, dims: readonly number[]): Weight | null {
    return this.file.tensors.has(name) ? this.get(name, dims) : null;
  }

  /** A norm's weight vector; the norm kernels read it as f32. */
  norm(name: string, dims: readonly number[]): Weight {
    return this.vector(name, dims, "norm");
  }

  optionalNorm(name: string, dims: readonly number[]): Weight | null {
    return this.file.tensors.has(name) ? this.norm(name, dims) : null;
  }

  /** A bias vector (or RoPE frequency factors), read by the kernels as f32. */
  optionalVector(name: string, dims: readonly number[]): Weight | null {
    return this.file.tensors.has(name) ? this.vector(name, dims, "vector") : null;
  }

  private vector(name: string, dims: readonly number[], what: string): Weight {
    const t = this.file.tensors.get(name);
    if (t && t.type.name !== "F32") {
      throw new InferError("unsupported", `${what} tensor '${name}' is ${t.type.name}; only F32 is supported`);
    }
    return this.get(name, dims);
  }

  has(name: string): boolean {
    return this.file.tensors.has(name);
  }
}

export interface AttentionWeights {
  readonly q: Weight;
  readonly k: Weight;
  readonly v: Weight;
  readonly output: Weight;
  readonly qNorm: Weight | null;
  readonly kNorm: Weight | null;
  /** Optional biases (Qwen 2 has q/k/v biases; some Llama variants an output bias). */
  readonly qBias: Weight | null;
  readonly kBias: Weight | null;
  readonly vBias: Weight | null;
  readonly outputBias: Weight | null;
}

export interface AttentionShape {
  readonly embedding: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
}

export function attentionWeights(t: WeightTable, prefix: string, s: AttentionShape): AttentionWeights {
  const qDim = s.heads * s.headDim, kvDim = s.kvHeads * s.headDim;
  return {
    q: t.get(`${prefix}.attn_q.weight`, [s.embedding, qDim]),
    k: t.get(`${prefix}.attn_k.weight`, [s.embedding, kvDim]),
    v: t.get(`${prefix}.attn_v.weight`, [s.embedding, kvDim]),
    output: t.get(`${prefix}.attn_output.weight`, [qDim, s.embedding]),
    qNorm: t.optionalNorm(`${prefix}.attn_q_norm.weight`, [s.headDim]),
    kNorm: t.optionalNorm(`${prefix}.attn_k_norm.weight`, [s.headDim]),
    qBias: t.optionalVector(`${prefix}.attn_q.bias`, [qDim]),
    kBias: t.optionalVector(`${prefix}.attn_k.bias`, [kvDim]),
    vBias: t.optionalVector(`${prefix}.attn_v.bias`, [kvDim]),
    outputBias: t.optionalVector(`${prefix}.attn_output.bias`, [s.embedding]),
  };
}

/** Activations one attention call needs, sized for `rows` tokens. */
export interface AttentionBuffers {
  readonly q: Activation;
  readonly k: Activation;
  readonly v: Activation;
  readonly mixed: Activation;
}

export function attentionBuffers(be: Backend, rows: number, s: AttentionShape): AttentionBuffers {
  return {
    q: be.activation("q", rows, s.heads * s.headDim),
    k: be.activation("k", rows, s.kvHeads * s.headDim),
    v: be.activation("v", rows, s.kvHeads * s.headDim),
    mixed: be.activation("attn_mixed", rows, s.heads * s.headDim),
  };
}

export interface SelfAttentionOptions {
  readonly attention: AttentionOptions;
  readonly ropeQ: RopeOptions;
  readonly ropeK: RopeOptions;
  readonly normEps: number;
  /**
   * Multiply the queries by the attention scale before attention (then attend with scale 1), as
   * Gemma's reference code and llama.cpp do; the product is rounded differently from scaling the
   * scores, and llama.cpp's greedy tokens follow that rounding.
   */
  readonly scaleQueries?: boolean;
}

/**
 * out = W_o · softmax(scale · rope(norm(W_q x)) · rope(norm(W_k x))ᵀ + mask) · W_v x, with this
 * batch's keys and values appended to the cache at `position` first.
 */
export function selfAttention(be: Backend, x: Activation, rows: number, position: number,
  positions: Activation, w: AttentionWeights, kv: KvLayer, o: SelfAttentionOptions,
  b: AttentionBuffers, out: Activation): void {
  be.matmul(w.q, x, rows, b.q);
  be.matmul(w.k, x, rows, b.k);
  be.matmul(w.v, x, rows, b.v);
  if (w.qBias) be.addBias(b.q, w.qBias, rows);
  if (w.kBias) be.addBias(b.k, w.kBias, rows);
  if (w.vBias) be.addBias(b.v, w.vBias, rows);
  if (w.qNorm) be.rmsNormHeads(b.q, w.qNorm, rows, o.attention.heads, o.normEps);
  if (w.kNorm) be.rmsNormHeads(b.k, w.kNorm, rows, o.attention.kvHeads, o.normEps);
  be.rope(b.q, positions, rows, o.ropeQ);
  be.rope(b.k, positions, rows, o.ropeK);
  be.storeKv(kv, b.k, b.v, rows, position);
  if (o.scaleQueries) {
    be.scale(b.q, rows, o.attention.scale);
    be.attention(b.q, kv, rows, position, { ...o.attention, scale: 1 }, b.mixed);
  } else {
    be.attention(b.q, kv, rows, position, o.attention, b.mixed);
  }
  be.matmul(w.output, b.mixed, rows, out);
  if (w.outputBias) be.addBias(out, w.outputBias, rows);
}

export interface FfnWeights {
  readonly gate: Weight;
  readonly up: Weight;
  readonly down: Weight;
}

export function ffnWeights(t: WeightTable, prefix: string, embedding: number, hidden: number): FfnWeights {
  return {
    gate: t.get(`${prefix}.ffn_gate.weight`, [embedding, hidden]),
    up: t.get(`${prefix}.ffn_up.weight`, [embedding, hidden]),
    down: t.get(`${prefix}.ffn_down.weight`, [hidden, embedding]),
  };
}

export interface FfnBuffers {
  readonly gate: Activation;
  readonly up: Activation;
}

export function ffnBuffers(be: Backend, rows: number, hidden: number): FfnBuffers {
  return { gate: be.activation("ffn_gate", rows, hidden), up: be.activation("ffn_up", rows, hidden) };
}

/** out = W_down · (act(W_gate x) ⊙ W_up x): GeGLU for Gemma, SwiGLU for Llama and Qwen. */
export function gatedFfn(be: Backend, x: Activation, rows: number, w: FfnWeights,
  activation: "gelu" | "silu", b: FfnBuffers, out: Activation): void {
  be.matmul(w.gate, x, rows, b.gate);
  be.matmul(w.up, x, rows, b.up);
  if (activation === "gelu") be.geluMul(b.gate, b.up, rows, b.gate);
  else be.siluMul(b.gate, b.up, rows, b.gate);
  be.matmul(w.down, b.gate, rows, out);
}

/** Rows of logits one chunk holds when every row's logits are asked for: about 32 MiB. */
const LOGIT_CHUNK_VALUES = 8 << 20;

/**
 * The LM head: logits = W_out · x (+ bias), for the last row only (decoding) or for every row
 * (perplexity, scoring), the latter in chunks of rows into a buffer allocated on first use so
 * that a 262k-entry vocabulary never needs maxBatch full rows.
 */
export class LogitsHead {
  private readonly last: Activation;
  private chunk: Activation | null = null;

  constructor(private readonly be: Backend, private readonly output: Weight,
    private readonly bias: Weight | null, private readonly vocab: number, private readonly maxBatch: number) {
    this.last = be.activation("logits", 1, vocab);
  }

  /** Logits of row n - 1 of x (a view valid until the next call). */
  lastRow(x: Activation, n: number): Float32Array {
    this.be.matmul(this.output, x, 1, this.last, n - 1);
    if (this.bias) this.be.addBias(this.last, this.bias, 1);
    return this.be.read(this.last, 1);
  }

  /** Hands every row's logits to `sink`, chunk by chunk; returns the last row's. */
  allRows(x: Activation, n: number, sink: LogitsSink): Float32Array {
    const chunkRows = Math.max(1, Math.min(this.maxBatch, Math.floor(LOGIT_CHUNK_VALUES / this.vocab)));
    this.chunk ??= this.be.activation("logits_all", chunkRows, this.vocab);
    let view: Float32Array = new Float32Array(0);
    for (let first = 0; first < n; first += chunkRows) {
      const rows = Math.min(chunkRows, n - first);
      this.be.matmul(this.output, x, rows, this.chunk, first);
      if (this.bias) this.be.addBias(this.chunk, this.bias, rows);
      view = this.be.read(this.chunk, rows);
      sink(first, rows, view);
    }
    return view.subarray(view.length - this.vocab);
  }
}

/** Receives `rows` rows of logits starting at batch row `firstRow` (a view valid during the call). */
export type LogitsSink = (firstRow: number, rows: number, logits: Float32Array) => void;

/** The activations one decoder forward pass needs, planned once for `rows` tokens. */
export interface DecoderBuffers {
  readonly ids: Activation;
  readonly positions: Activation;
  readonly x: Activation;
  readonly normed: Activation;
  readonly branch: Activation;
  readonly attn: AttentionBuffers;
  readonly ffn: FfnBuffers;
}

export function decoderBuffers(be: Backend, rows: number,
  s: AttentionShape & { readonly feedForward: number }): DecoderBuffers {
  return {
    ids: be.positions(rows),
    positions: be.positions(rows),
    x: be.activation("x", rows, s.embedding),
    normed: be.activation("x_normed", rows, s.embedding),
    branch: be.activation("branch", rows, s.embedding),
    attn: attentionBuffers(be, rows, s),
    ffn: ffnBuffers(be, rows, s.feedForward),
  };
}
