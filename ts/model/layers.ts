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
    const t = this.file.tensors.get(name);
    if (t && t.type.name !== "F32") {
      throw new InferError("unsupported", `norm tensor '${name}' is ${t.type.name}; only F32 norms are supported`);
    }
    return this.get(name, dims);
  }

  optionalNorm(name: string, dims: readonly number[]): Weight | null {
    return this.file.tensors.has(name) ? this.norm(name, dims) : null;
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
