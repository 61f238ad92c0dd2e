// Layers shared by the architectures, written once: weight lookup, self-attention with grouped
// KV heads (optional QK-norm, RoPE, sliding window) and the gated feed-forward network.
import type { Activation, AttentionOptions, Backend, KvLayer, RopeOptions, Weight } from "../backend/backend.ts";
import { InferError } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";
import type { Batch, ForwardOptions, IdsSink, LogitsSink, Model, SequenceRows } from "./model.ts";

/** Looks up tensors by GGUF name, checking each one's shape against what the graph expects. */
export class WeightTable {
  constructor(private readonly file: GgufFile, private readonly backend: Backend) {}

  get(name: string, dims: readonly number[]): Weight {
    const t = this.file.tensors.get(name);
    if (!t) throw new InferError("bad_model", `model has no tensor '${name}'`);
    this.checkShape(name, t.dims, dims);
    return this.backend.weight(this.file, t);
  }

  private checkShape(name: string, have: readonly number[], dims: readonly number[]): void {
    if (have.length !== dims.length || have.some((d, i) => d !== dims[i])) {
      throw new InferError("bad_model", `tensor '${name}' has shape [${have}], expected [${dims}]`);
    }
  }

  /**
   * Whether an optional F32 vector is present, its type and shape checked without loading it: a
   * table the graph may not use at this context is still refused when malformed.
   */
  checkVector(name: string, dims: readonly number[]): boolean {
    const t = this.file.tensors.get(name);
    if (!t) return false;
    if (t.type.name !== "F32") {
      throw new InferError("unsupported",
        `vector tensor '${name}' is ${t.type.name}; only F32 is supported`);
    }
    this.checkShape(name, t.dims, dims);
    return true;
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

  /** A required F32 vector (a bias, attention sinks). */
  vector(name: string, dims: readonly number[], what = "vector"): Weight {
    const t = this.file.tensors.get(name);
    if (t && t.type.name !== "F32") {
      throw new InferError("unsupported", `${what} tensor '${name}' is ${t.type.name}; only F32 is supported`);
    }
    return this.get(name, dims);
  }

  /**
   * Rows first .. first + count - 1 of a 2-D tensor of shape `dims`, as a weight of its own: a
   * fused tensor's part (Phi-3's attn_qkv, its gate and up in ffn_up). A row is whole blocks of
   * any quant type, so the part is the file's bytes from the first row's on.
   */
  rows(name: string, dims: readonly [number, number] | readonly number[], first: number,
    count: number): Weight {
    const t = this.file.tensors.get(name);
    if (!t) throw new InferError("bad_model", `model has no tensor '${name}'`);
    if (t.dims.length !== 2 || t.dims.some((d, i) => d !== dims[i])) {
      throw new InferError("bad_model", `tensor '${name}' has shape [${t.dims}], expected [${dims}]`);
    }
    if (!(first >= 0 && count > 0 && first + count <= t.dims[1])) {
      throw new InferError("internal", `rows ${first}..${first + count} of '${name}'`);
    }
    const rowBytes = t.byteLength / t.dims[1];
    return this.backend.weight(this.file, {
      ...t, name: `${name}[${first}:${first + count}]`, dims: [t.dims[0], count],
      elementCount: t.dims[0] * count, byteLength: rowBytes * count,
      fileOffset: t.fileOffset + rowBytes * first,
    });
  }

  /** A 3-D tensor of experts' matrices ([n_in, n_out, experts]): one weight per expert. */
  experts(name: string, dims: readonly [number, number, number]): readonly Weight[] {
    const ops = this.backend.experts;
    if (!ops) {
      throw new InferError("unsupported", `the ${this.backend.name} backend does not run ` +
        "mixture-of-experts models yet");
    }
    const t = this.file.tensors.get(name);
    if (!t) throw new InferError("bad_model", `model has no tensor '${name}'`);
    if (t.dims.length !== 3 || t.dims.some((d, i) => d !== dims[i])) {
      throw new InferError("bad_model", `tensor '${name}' has shape [${t.dims}], expected [${dims}]`);
    }
    return ops.split(this.file, t);
  }

  /**
   * A 2-D F32 table of one vector per expert ([n, experts]: gpt-oss's expert biases): one
   * weight per expert, a view of its row.
   */
  expertVectors(name: string, dims: readonly [number, number]): readonly Weight[] {
    const t = this.file.tensors.get(name);
    if (!t) throw new InferError("bad_model", `model has no tensor '${name}'`);
    if (t.type.name !== "F32") {
      throw new InferError("unsupported", `bias tensor '${name}' is ${t.type.name}; only F32 is supported`);
    }
    if (t.dims.length !== 2 || t.dims.some((d, i) => d !== dims[i])) {
      throw new InferError("bad_model", `tensor '${name}' has shape [${t.dims}], expected [${dims}]`);
    }
    const n = dims[0];
    if (this.backend.experts?.splitVectors) return this.backend.experts.splitVectors(this.file, t);
    return Array.from({ length: dims[1] }, (_, e) => this.backend.weight(this.file, {
      ...t, name: `${name}[${e}]`, dims: [n], elementCount: n, byteLength: 4 * n,
      fileOffset: t.fileOffset + 4 * n * e,
    }));
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
  /** Llama 4's attention temperature on the queries after RoPE (Mistral 3); absent: none. */
  readonly queryTemperature?: QueryTemperature;
}

/**
 * The query at position p is multiplied by 1 + scale · ln(⌊p / floor⌋ + 1): 1 within the first
 * `floor` positions. (transformers' get_llama_4_attn_scale; llama.cpp's llm_graph_input_attn_temp.)
 */
export interface QueryTemperature {
  readonly scale: number;
  readonly floor: number;
}

/**
 * Each row's factor as llama.cpp computes it (the quotient in f32, the logarithm in f64, the
 * factor rounded to f32), applied in place with the expert ops' row scaling; rows all within
 * `floor` are left as they are, which multiplying by 1 would not change.
 */
function temperQueries(be: Backend, q: Activation, segments: readonly SequenceRows[],
  t: QueryTemperature): void {
  if (segments.every((s) => s.position + s.rows <= t.floor)) return;
  let rows = 0;
  for (const s of segments) rows += s.rows;
  const slots = new Int32Array(rows), factors = new Float32Array(rows), f = Math.fround;
  const beta = f(t.scale), floor = f(t.floor);
  let r = 0;
  for (const s of segments) {
    for (let i = 0; i < s.rows; i++, r++) {
      slots[r] = r;
      factors[r] = Math.log(Math.floor(f(f(s.position + i) / floor)) + 1) * beta + 1;
    }
  }
  if (!be.experts) throw new InferError("unsupported", `the ${be.name} backend has no query temperature`);
  be.experts.scatterScaled(q, slots, factors, rows, q);
}

/**
 * out = W_o · softmax(scale · rope(norm(W_q x)) · rope(norm(W_k x))ᵀ + mask) · W_v x. The
 * projections run over every row of the batch; each segment then appends its keys and values to
 * its own sequence's layer `layer` and attends over it (a batch of one row per sequence, the
 * server's decode step, in one call where the backend has attendRows).
 */
export function selfAttention(be: Backend, x: Activation, rows: number,
  segments: readonly SequenceRows[], layer: number, positions: Activation, w: AttentionWeights,
  o: SelfAttentionOptions, b: AttentionBuffers, out: Activation): void {
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
  if (o.queryTemperature) temperQueries(be, b.q, segments, o.queryTemperature);
  const attention = o.scaleQueries ? { ...o.attention, scale: 1 } : o.attention;
  if (o.scaleQueries) be.scale(b.q, rows, o.attention.scale);
  // Each run of two or more one-row segments (decoding sequences; in a step that also carries
  // prompt rows, they are the batch's last rows) is one attendRows call where the backend has
  // it: one launch pair a layer, not two per sequence.
  let first = 0;
  for (let i = 0; i < segments.length;) {
    let run = 0;
    if (be.attendRows) while (i + run < segments.length && segments[i + run].rows === 1) run++;
    if (run >= 2) {
      const group = segments.slice(i, i + run);
      if (be.attendRows!(b.q, b.k, b.v, group.map((s) => s.cache[layer]), group.map((s) => s.position),
        attention, b.mixed, first)) {
        first += run;
        i += run;
        continue;
      }
    }
    for (const s of segments.slice(i, i + Math.max(run, 1))) {
      const kv = s.cache[layer];
      be.storeKv(kv, b.k, b.v, s.rows, s.position, first);
      be.attention(b.q, kv, s.rows, s.position, attention, b.mixed, first);
      first += s.rows;
    }
    i += Math.max(run, 1);
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

/** Rows of logits one chunk holds when many rows' logits are asked for: about 32 MiB. */
const LOGIT_CHUNK_VALUES = 8 << 20;

/**
 * The LM head: logits = W_out · x (+ bias) for the rows that need them: the last row (decoding
 * one sequence), one row per sequence (a batch of sequences) or every row (perplexity), the
 * latter in chunks of rows into a buffer allocated on first use so that a 262k-entry vocabulary
 * never needs maxBatch full rows.
 */
export class LogitsHead {
  private readonly last: Activation;
  private chunk: Activation | null = null;

  constructor(private readonly be: Backend, private readonly output: Weight,
    private readonly bias: Weight | null, private readonly vocab: number, private readonly maxBatch: number) {
    this.last = be.activation("logits", 1, vocab);
  }

  /**
   * Hands the logits of rows first .. first + count - 1 of x to `sink`, a chunk at a time; with
   * `greedyIds` (Batch.greedy), the one row's argmax goes to those ids on the device instead.
   */
  rows(x: Activation, first: number, count: number, sink: LogitsSink,
    greedyIds: Activation | null = null, argmaxSink: IdsSink | null = null): void {
    if (count === 0) return;
    const argmaxRows = this.be.deviceGreedy?.argmaxRows;
    if (argmaxSink && !argmaxRows) {
      throw new InferError("invalid_argument", `the ${this.be.name} backend takes no argmax of rows`);
    }
    // Batch.argmaxSink: the rows' argmaxes instead of their logits
    // (true from it: some rows need their logits all the same, and the sink gets them too)
    const hand = (row: number, rows: number, logits: Activation) => {
      if (!argmaxSink || argmaxSink(row, rows, argmaxRows!(logits, rows)) === true) {
        sink(row, rows, this.be.read(logits, rows));
      }
    };
    if (greedyIds) {
      const be = this.be;
      if (count !== 1 || !be.deviceGreedy) {
        throw new InferError("invalid_argument", `greedy decoding on the ${be.name} backend with ` +
          `${count} rows of logits`);
      }
      be.matmul(this.output, x, 1, this.last, first);
      if (this.bias) be.addBias(this.last, this.bias, 1);
      be.deviceGreedy.argmaxToken(this.last, greedyIds);
      return;
    }
    if (count === 1) {
      this.be.matmul(this.output, x, 1, this.last, first);
      if (this.bias) this.be.addBias(this.last, this.bias, 1);
      hand(first, 1, this.last);
      return;
    }
    const chunkRows = Math.max(1, Math.min(this.maxBatch, Math.floor(LOGIT_CHUNK_VALUES / this.vocab)));
    this.chunk ??= this.be.activation("logits_all", chunkRows, this.vocab);
    for (let row = first; row < first + count; row += chunkRows) {
      const rows = Math.min(chunkRows, first + count - row);
      this.be.matmul(this.output, x, rows, this.chunk, row);
      if (this.bias) this.be.addBias(this.chunk, this.bias, rows);
      hand(row, rows, this.chunk);
    }
  }
}

/**
 * The end of a decoder's forward pass: the final norm, the hidden rows a batch asks for
 * (embeddings), then the LM head over the rows that need logits. A batch that wants neither (a
 * prompt's body) stops before the norm: only its keys and values were needed.
 */
export function decoderOutput(be: Backend, b: DecoderBuffers, batch: Batch, rows: number,
  norm: Weight, normEps: number, head: LogitsHead, sink: LogitsSink): void {
  const hidden = batch.hidden;
  if (batch.logitRows === 0 && !hidden?.ranges.length) return;
  be.rmsNorm(b.x, norm, rows, normEps, b.normed);
  if (hidden && hidden.ranges.length > 0) {
    const end = Math.max(...hidden.ranges.map((r) => r.first + r.rows));
    if (end > rows || hidden.ranges.some((r) => !(r.first >= 0 && r.rows > 0))) {
      throw new InferError("invalid_argument", `hidden rows up to ${end} of a batch of ${rows}`);
    }
    const values = be.read(b.normed, end), width = b.normed.cols;
    for (const r of hidden.ranges) {
      hidden.sink(r.first, r.rows, values.subarray(r.first * width, (r.first + r.rows) * width));
    }
  }
  head.rows(b.normed, rows - batch.logitRows, batch.logitRows, sink,
    batch.greedy ? b.ids : null, batch.argmaxSink ?? null);
}

/** Checks a batch against the model's plan and uploads its token ids and per-row positions. */
export function setBatchInputs(be: Backend, b: DecoderBuffers, batch: Batch, maxBatch: number): number {
  let rows = 0;
  for (const s of batch.segments) {
    if (!(s.rows > 0) || s.position < 0) {
      throw new InferError("invalid_argument", `a segment of ${s.rows} rows at ${s.position}`);
    }
    rows += s.rows;
  }
  // Before any position is written, so an oversized batch is named as such.
  if (rows > maxBatch) {
    throw new InferError("invalid_argument", `${rows} rows exceed the batch of ${maxBatch}`);
  }
  be.setBatchedRounding?.(batch.batchedRounding ?? null);
  rows = 0;
  for (const s of batch.segments) {
    be.setPositions(b.positions, s.position, s.rows, rows);
    rows += s.rows;
  }
  if (!(batch.logitRows >= 0 && batch.logitRows <= rows)) {
    throw new InferError("invalid_argument", `logits of ${batch.logitRows} rows of ${rows} asked`);
  }
  if (batch.greedy && (rows !== 1 || batch.logitRows !== 1)) {
    throw new InferError("invalid_argument", `greedy decoding on the device takes one row, not ${rows}`);
  }
  if (batch.greedy?.tokenOnDevice) {
    if (!be.deviceGreedy) throw new InferError("unsupported", `the ${be.name} backend keeps no tokens`);
    be.deviceGreedy.keepTokens(b.ids, rows);
  } else be.setTokens(b.ids, batch.tokens, rows);
  return rows;
}

/**
 * Model.forward in terms of forwardBatch: `count` tokens of one sequence; every row's logits to
 * options.onLogits when given, else only the last row's; returns the last row's logits.
 */
export function forwardOne(m: Model, tokens: ArrayLike<number>, count: number, position: number,
  cache: readonly KvLayer[], options: ForwardOptions = {}): Float32Array {
  let last: Float32Array = new Float32Array(0);
  const sink: LogitsSink = (first, rows, logits) => {
    options.onLogits?.(first, rows, logits);
    last = logits;
  };
  m.forwardBatch({ tokens, segments: [{ rows: count, position, cache }],
    logitRows: options.onLogits ? count : 1 }, sink);
  return last.subarray(last.length - m.info.vocabSize);
}

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
