// Gemma 3n (text), as llama.cpp stores it in GGUF (`gemma3n`; E2B, E4B). Gemma 3's sandwich-norm
// block with QK-norm, plus:
// - AltUp (Baykal et al. 2023): the hidden state is `altup.num_inputs` streams; each layer predicts
//   every stream from all of them (coefficients from a router over the active stream), runs the
//   block on the active one, and corrects every stream by the block's innovation;
// - per-layer embeddings: a second token table of embedding_length_per_layer_input values per
//   layer, mixed with a projection of the embedding, gates a small update of every stream but the
//   first after each layer;
// - the laurel residual (a low-rank linear branch beside attention);
// - gaussian top-k activation sparsity of the FFN gate in the layers whose
//   `activation_sparsity_scale` (a normal quantile, -inf for none) is finite;
// - KV sharing: the last `attention.shared_kv_layers` layers compute no keys or values and attend
//   over those of the last earlier layer of the same kind (sliding or full);
// - unscaled values normalised per head, attention scale 1, final logit soft-capping.
// Sources: transformers' modeling_gemma3n.py (the reference maths); llama.cpp's
// src/models/gemma3n.cpp and conversion/gemma.py (tensor names, metadata keys).
import type { Activation, AltUpOps, Backend, KvLayer, RopeOptions, Weight } from "../backend/backend.ts";
import { InferError } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";
import { attentionHparams, Hparams, LIMITS } from "./hparams.ts";
import {
  attentionBuffers, decoderBuffers, decoderOutput, ffnBuffers, forwardOne, LogitsHead,
  setBatchInputs, WeightTable, type AttentionBuffers, type DecoderBuffers, type FfnBuffers,
} from "./layers.ts";
import type {
  Batch, ForwardOptions, LogitsSink, Model, ModelInfo, ModelShape, SequenceRows,
} from "./model.ts";

// ---- hyperparameters ------------------------------------------------------------------------

/** llama.cpp's defaults where a key is absent (src/models/gemma3n.cpp, llama-hparams.h). */
const DEFAULTS = {
  slidingPeriod: 5, kvLayersFromStart: 20, sparseLayers: 10, altupStreams: 4, perLayerDim: 256,
  // normal_dist.icdf(0.95) in f32: transformers' multiplier for a sparsity of 0.95
  sparsityMultiplier: 1.6448533535003662, softcap: 30, slidingRopeBase: 10_000,
} as const;
/** transformers clamps a projected stream's mean square at this before matching magnitudes. */
const MAGNITUDE_FLOOR = 1e-5;

export interface Gemma3nConfig extends ModelShape {
  readonly name: string;
  readonly normEps: number;
  readonly ropeBase: number;
  readonly ropeScale: number;
  readonly ropeBaseSliding: number;
  readonly slidingWindow: number;
  readonly sliding: readonly boolean[];
  /** Each layer's FFN width (feed_forward_length may be an array). */
  readonly feedForwards: readonly number[];
  /** Each layer's gaussian top-k multiplier; null: no sparsity in that layer. */
  readonly sparsity: readonly (number | null)[];
  readonly altupStreams: number;
  readonly altupActive: number;
  readonly perLayerDim: number;
  /** Layers 0 .. kvLayers - 1 have keys and values of their own (one cache layer each). */
  readonly kvLayers: number;
  /** Each layer's cache layer: its own, or the one it shares. */
  readonly kvSource: readonly number[];
  /** logits = cap · tanh(logits / cap); 0: none. */
  readonly softcap: number;
}

export function gemma3nConfig(meta: Hparams, vocab: number): Gemma3nConfig {
  const { embedding, heads, kvHeads, headDim } = attentionHparams(meta);
  meta.int(".rope.dimension_count", { min: headDim, max: headDim, fallback: headDim });
  const layers = meta.int(".block_count", { min: 1, max: LIMITS.layers });
  const feedForwards = meta.perLayerInt(".feed_forward_length", layers,
    { min: 1, max: LIMITS.feedForward });
  const slidingWindow = meta.int(".attention.sliding_window", { min: 1, max: LIMITS.context });
  // The converter writes one boolean per layer; llama.cpp takes a period (5) where there is none.
  const pattern = meta.bools(".attention.sliding_window_pattern", layers);
  const period = pattern ? 0 : meta.int(".attention.sliding_window_pattern",
    { min: 1, max: LIMITS.layers, fallback: DEFAULTS.slidingPeriod });
  const sliding = Array.from({ length: layers }, (_, i) => pattern ? pattern[i] : i % period < period - 1);
  const shared = meta.int(".attention.shared_kv_layers",
    { min: 0, max: layers - 1, fallback: Math.max(0, layers - DEFAULTS.kvLayersFromStart) });
  const kvLayers = layers - shared;
  // transformers' kv_sharing_modes: the last layer of the same kind before the sharing ones.
  const kvSource = sliding.map((kind, i) => {
    if (i < kvLayers) return i;
    const source = sliding.slice(0, kvLayers).lastIndexOf(kind);
    meta.require(source >= 0, ".attention.shared_kv_layers", `is ${shared}: layer ${i} ` +
      `(${kind ? "sliding" : "full"}) has no earlier layer of its kind to share keys with`);
    return source;
  });
  const scales = meta.floats(".activation_sparsity_scale", layers);
  const sparsity = Array.from({ length: layers }, (_, i) => scales
    ? (scales[i] > -Infinity ? Math.fround(scales[i]) : null)
    : (i < DEFAULTS.sparseLayers ? DEFAULTS.sparsityMultiplier : null));
  const altupStreams = meta.int(".altup.num_inputs", { min: 2, max: 16, fallback: DEFAULTS.altupStreams });
  const perLayerDim = meta.int(".embedding_length_per_layer_input",
    { min: 1, max: LIMITS.embedding, fallback: DEFAULTS.perLayerDim });
  meta.require(perLayerDim * layers <= LIMITS.feedForward * 4, ".embedding_length_per_layer_input",
    `is ${perLayerDim}: ${layers} layers of it are too wide`);
  const scaling = meta.float(".rope.scaling.factor", { min: 1e-3, max: 1e3, fallback: 1 });
  const feedForward = Math.max(...feedForwards);
  const n = altupStreams, e = embedding;
  return Object.freeze({
    architecture: "gemma3n",
    name: meta.string("general.name", "gemma3n"),
    layers, embedding, feedForward, heads, kvHeads, headDim, vocab,
    contextLength: meta.int(".context_length", { min: 1, max: LIMITS.context }),
    kvShapes: Array.from({ length: kvLayers }, (_, i) =>
      ({ kvHeads, headDim, window: sliding[i] ? slidingWindow : 0 })),
    // streams and predictions, the per-layer inputs (two tables of layers · perLayerDim and one
    // layer's), router and coefficients, and four embedding-wide rows (laurel's rank is below).
    extraRowFloats: 2 * n * e + 2 * layers * perLayerDim + 2 * perLayerDim + n + n * n + 5 * e,
    normEps: meta.float(".attention.layer_norm_rms_epsilon", { min: 0, max: 1 }),
    ropeBase: meta.float(".rope.freq_base", { min: 1, fallback: 1_000_000 }),
    ropeScale: 1 / scaling,
    ropeBaseSliding: meta.float(".rope.freq_base_swa", { min: 1, fallback: DEFAULTS.slidingRopeBase }),
    slidingWindow, sliding, feedForwards, sparsity, altupStreams,
    altupActive: meta.int(".altup.active_idx", { min: 0, max: n - 1, fallback: 0 }),
    perLayerDim, kvLayers, kvSource,
    softcap: meta.float(".final_logit_softcapping", { min: 0, max: 1e6, fallback: DEFAULTS.softcap }),
  });
}

// ---- one block ------------------------------------------------------------------------------

interface Gemma3nLayer {
  readonly attentionNorm: Weight;
  readonly q: Weight;
  readonly qNorm: Weight;
  /** Keys and values of its own; null in a layer that shares an earlier layer's. */
  readonly kv: { readonly k: Weight; readonly v: Weight; readonly kNorm: Weight } | null;
  readonly output: Weight;
  readonly postAttentionNorm: Weight;
  readonly laurelLeft: Weight;
  readonly laurelRight: Weight;
  readonly laurelNorm: Weight;
  readonly ffnNorm: Weight;
  readonly gate: Weight;
  readonly up: Weight;
  readonly down: Weight;
  readonly postFfnNorm: Weight;
  readonly perLayerGate: Weight;
  readonly perLayerProjection: Weight;
  readonly perLayerNorm: Weight;
  readonly routerNorm: Weight;
  readonly router: Weight;
  readonly predictCoefs: Weight;
  readonly correctCoefs: Weight;
  readonly correctScale: Weight;
  readonly rope: Omit<RopeOptions, "heads">;
  readonly window: number;
}

function loadLayer(t: WeightTable, c: Gemma3nConfig, i: number, rank: number): Gemma3nLayer {
  const p = `blk.${i}`, e = c.embedding, f = c.feedForwards[i], n = c.altupStreams;
  const q = c.heads * c.headDim, kv = c.kvHeads * c.headDim, P = c.perLayerDim;
  // A sharing layer's k/v tensors (llama.cpp's files carry them) are not read.
  const own = i < c.kvLayers;
  return {
    attentionNorm: t.norm(`${p}.attn_norm.weight`, [e]),
    q: t.get(`${p}.attn_q.weight`, [e, q]),
    qNorm: t.norm(`${p}.attn_q_norm.weight`, [c.headDim]),
    kv: own ? {
      k: t.get(`${p}.attn_k.weight`, [e, kv]), v: t.get(`${p}.attn_v.weight`, [e, kv]),
      kNorm: t.norm(`${p}.attn_k_norm.weight`, [c.headDim]),
    } : null,
    output: t.get(`${p}.attn_output.weight`, [q, e]),
    postAttentionNorm: t.norm(`${p}.post_attention_norm.weight`, [e]),
    laurelLeft: t.get(`${p}.laurel_l.weight`, [e, rank]),
    laurelRight: t.get(`${p}.laurel_r.weight`, [rank, e]),
    laurelNorm: t.norm(`${p}.laurel_post_norm.weight`, [e]),
    ffnNorm: t.norm(`${p}.ffn_norm.weight`, [e]),
    gate: t.get(`${p}.ffn_gate.weight`, [e, f]),
    up: t.get(`${p}.ffn_up.weight`, [e, f]),
    down: t.get(`${p}.ffn_down.weight`, [f, e]),
    postFfnNorm: t.norm(`${p}.post_ffw_norm.weight`, [e]),
    perLayerGate: t.get(`${p}.inp_gate.weight`, [e, P]),
    perLayerProjection: t.get(`${p}.proj.weight`, [P, e]),
    perLayerNorm: t.norm(`${p}.post_norm.weight`, [e]),
    routerNorm: t.norm(`${p}.altup_router_norm.weight`, [e]),
    router: t.get(`${p}.altup_router.weight`, [e, n]),
    predictCoefs: t.get(`${p}.altup_predict_coef.weight`, [n, n * n]),
    correctCoefs: t.get(`${p}.altup_correct_coef.weight`, [n, n]),
    correctScale: t.vector(`${p}.altup_correct_scale.weight`, [e]),
    rope: {
      headDim: c.headDim, rotaryDims: c.headDim, neox: true,
      base: c.sliding[i] ? c.ropeBaseSliding : c.ropeBase, scale: c.sliding[i] ? 1 : c.ropeScale,
    },
    window: c.sliding[i] ? c.slidingWindow : 0,
  };
}

/** Activations beyond the dense decoder's, planned once for maxBatch rows. */
interface Gemma3nBuffers {
  readonly streams: Activation[];
  readonly predictions: Activation[];
  /** Every layer's input (rows × layers · perLayerDim), the token table's rows, one layer's. */
  readonly perLayer: Activation;
  readonly perLayerTokens: Activation;
  readonly perLayerOne: Activation;
  readonly perLayerGate: Activation;
  readonly router: Activation;
  readonly coefs: Activation;
  readonly correctCoefs: Activation;
  readonly laurelMid: Activation;
  readonly laurel: Activation;
  readonly attnLaurel: Activation;
  readonly scratch: Activation;
  readonly attention: AttentionBuffers;
  /** FFN buffers per distinct width. */
  readonly ffn: Map<number, FfnBuffers>;
}

// ---- the model ------------------------------------------------------------------------------

export class Gemma3n implements Model {
  readonly info: ModelInfo;
  private readonly ops: AltUpOps;
  private readonly tokenEmbedding: Weight;
  private readonly perLayerEmbedding: Weight;
  private readonly perLayerModelProjection: Weight;
  private readonly perLayerProjectionNorm: Weight;
  private readonly altupProjections: readonly Weight[];
  private readonly altupUnembedProjections: readonly Weight[];
  private readonly outputNorm: Weight;
  private readonly head: LogitsHead;
  private readonly blocks: Gemma3nLayer[];
  private readonly buf: DecoderBuffers;
  private readonly g: Gemma3nBuffers;

  constructor(readonly config: Gemma3nConfig, file: GgufFile, private readonly be: Backend,
    readonly maxBatch: number) {
    if (!be.altup || !be.experts) {
      throw new InferError("unsupported", `the ${be.name} backend does not run gemma3n ` +
        "(AltUp, per-layer embeddings) yet; use --backend cpu");
    }
    this.ops = be.altup;
    const t = new WeightTable(file, be), c = config, e = c.embedding, n = c.altupStreams;
    const all = c.layers * c.perLayerDim;
    const rank = file.tensors.get("blk.0.laurel_l.weight")?.dims[1] ?? 0;
    if (!(rank >= 1 && rank <= e)) {
      throw new InferError("bad_model", `blk.0.laurel_l.weight: a laurel rank of ${rank} (1..${e})`);
    }
    this.tokenEmbedding = t.get("token_embd.weight", [e, c.vocab]);
    this.perLayerEmbedding = t.get("per_layer_token_embd.weight", [all, c.vocab]);
    this.perLayerModelProjection = t.get("per_layer_model_proj.weight", [e, all]);
    this.perLayerProjectionNorm = t.norm("per_layer_proj_norm.weight", [c.perLayerDim]);
    this.altupProjections = t.experts("altup_proj.weight", [e, e, n - 1]);
    this.altupUnembedProjections = t.experts("altup_unembd_proj.weight", [e, e, n - 1]);
    this.outputNorm = t.norm("output_norm.weight", [e]);
    const output = t.optional("output.weight", [e, c.vocab]) ?? this.tokenEmbedding;
    this.head = new LogitsHead(be, output, null, c.vocab, maxBatch);
    this.blocks = Array.from({ length: c.layers }, (_, i) => loadLayer(t, c, i, rank));
    this.info = {
      architecture: "gemma3n", name: c.name, vocabSize: c.vocab, contextLength: c.contextLength,
      embedding: e, kvShapes: c.kvShapes,
      keyRope: this.blocks.slice(0, c.kvLayers).map((l) => ({ ...l.rope, heads: c.kvHeads })),
    };
    // The dense decoder's x is stream 0; its FFN buffers are not used (ffn below, per width).
    this.buf = decoderBuffers(be, maxBatch, { ...c, feedForward: 1 });
    const rows = maxBatch, act = (name: string, cols: number) => be.activation(name, rows, cols);
    this.g = {
      streams: [this.buf.x, ...Array.from({ length: n - 1 }, (_, i) => act(`altup_${i + 1}`, e))],
      predictions: Array.from({ length: n }, (_, i) => act(`altup_prediction_${i}`, e)),
      perLayer: act("per_layer", all), perLayerTokens: act("per_layer_tokens", all),
      perLayerOne: act("per_layer_one", c.perLayerDim),
      perLayerGate: act("per_layer_gate", c.perLayerDim),
      router: act("altup_router", n), coefs: act("altup_coefs", n * n),
      correctCoefs: act("altup_correct_coefs", n),
      laurelMid: act("laurel_mid", rank), laurel: act("laurel", e),
      attnLaurel: act("attn_laurel", e), scratch: act("scratch", e),
      attention: attentionBuffers(be, rows, c),
      ffn: new Map([...new Set(c.feedForwards)].map((f) => [f, ffnBuffers(be, rows, f)])),
    };
  }

  forward(tokens: ArrayLike<number>, n: number, position: number, cache: readonly KvLayer[],
    options: ForwardOptions = {}): Float32Array {
    return forwardOne(this, tokens, n, position, cache, options);
  }

  forwardBatch(batch: Batch, sink: LogitsSink): void {
    const be = this.be, c = this.config, b = this.buf, g = this.g, ops = this.ops;
    const n = setBatchInputs(be, b, batch, this.maxBatch);
    const streams = g.streams, eps = c.normEps;
    be.embed(this.tokenEmbedding, b.ids, n, streams[0]);
    be.scale(streams[0], n, Math.sqrt(c.embedding));
    this.perLayerInputs(n);
    // The other streams: projections of the embedding, each at the embedding's magnitude.
    for (let i = 1; i < c.altupStreams; i++) {
      be.matmul(this.altupProjections[i - 1], streams[0], n, streams[i]);
      ops.matchMagnitude(streams[i], streams[0], n, MAGNITUDE_FLOOR);
    }
    for (let i = 0; i < this.blocks.length; i++) this.block(i, n, batch.segments);
    // Back to one stream: the others unprojected to stream 0's magnitude, then the mean of all.
    for (let i = 1; i < c.altupStreams; i++) {
      be.matmul(this.altupUnembedProjections[i - 1], streams[i], n, g.predictions[i]);
      ops.matchMagnitude(g.predictions[i], streams[0], n, MAGNITUDE_FLOOR);
    }
    for (let i = 1; i < c.altupStreams; i++) be.add(streams[0], g.predictions[i], n, streams[0]);
    be.scale(streams[0], n, 1 / c.altupStreams);
    const cap = c.softcap;
    const capped: LogitsSink = cap > 0 ? (first, rows, logits) => {
      for (let j = 0; j < logits.length; j++) logits[j] = Math.tanh(logits[j] / cap) * cap;
      sink(first, rows, logits);
    } : sink;
    decoderOutput(be, b, batch, n, this.outputNorm, eps, this.head, capped);
  }

  /**
   * Every layer's input, rows × layers · perLayerDim: (norm(W x / sqrt(embedding)) + the per-layer
   * table's row · sqrt(perLayerDim)) / sqrt(2), the norm over each layer's part.
   */
  private perLayerInputs(n: number): void {
    const be = this.be, c = this.config, g = this.g;
    be.embed(this.perLayerEmbedding, this.buf.ids, n, g.perLayerTokens);
    be.scale(g.perLayerTokens, n, Math.sqrt(c.perLayerDim));
    be.matmul(this.perLayerModelProjection, this.g.streams[0], n, g.perLayer);
    be.scale(g.perLayer, n, 1 / Math.sqrt(c.embedding));
    be.rmsNormHeads(g.perLayer, this.perLayerProjectionNorm, n, c.layers, c.normEps);
    be.add(g.perLayer, g.perLayerTokens, n, g.perLayer);
    be.scale(g.perLayer, n, Math.SQRT1_2);
  }

  /** AltUp's router: tanh(W · norm(x) / embedding), one coefficient per stream. */
  private route(l: Gemma3nLayer, x: Activation, n: number): Activation {
    const be = this.be, g = this.g;
    be.rmsNorm(x, l.routerNorm, n, this.config.normEps, g.scratch);
    be.scale(g.scratch, n, 1 / this.config.embedding);
    be.matmul(l.router, g.scratch, n, g.router);
    this.ops.tanh(g.router, n);
    return g.router;
  }

  private block(i: number, n: number, segments: readonly SequenceRows[]): void {
    const be = this.be, c = this.config, b = this.buf, g = this.g, ops = this.ops;
    const l = this.blocks[i], eps = c.normEps, active = c.altupActive;
    // predict
    be.matmul(l.predictCoefs, this.route(l, g.streams[active], n), n, g.coefs);
    ops.predict(g.streams, g.coefs, n, g.predictions);
    const prediction = g.predictions[active];
    be.rmsNorm(prediction, l.attentionNorm, n, eps, b.normed);
    // laurel: normed + norm(R · L · normed)
    be.matmul(l.laurelLeft, b.normed, n, g.laurelMid);
    be.matmul(l.laurelRight, g.laurelMid, n, g.scratch);
    ops.copyColumns(b.normed, 0, n, g.laurel);
    be.rmsNormAdd(g.scratch, l.laurelNorm, n, eps, g.laurel);
    // attention, then (prediction + norm(attn) + laurel) / sqrt(2)
    this.attention(l, c.kvSource[i], n, segments, b.branch);
    ops.copyColumns(prediction, 0, n, g.attnLaurel);
    be.rmsNormAdd(b.branch, l.postAttentionNorm, n, eps, g.attnLaurel);
    be.add(g.attnLaurel, g.laurel, n, g.attnLaurel);
    be.scale(g.attnLaurel, n, Math.SQRT1_2);
    // feed-forward: down(gelu(sparse(gate x)) ⊙ up x)
    be.rmsNorm(g.attnLaurel, l.ffnNorm, n, eps, b.normed);
    const f = g.ffn.get(c.feedForwards[i])!, multiplier = c.sparsity[i];
    be.matmul(l.gate, b.normed, n, f.gate);
    if (multiplier !== null) ops.gaussianTopK(f.gate, n, multiplier);
    be.matmul(l.up, b.normed, n, f.up);
    be.geluMul(f.gate, f.up, n, f.gate);
    be.matmul(l.down, f.gate, n, b.branch);
    be.rmsNormAdd(b.branch, l.postFfnNorm, n, eps, g.attnLaurel);
    // correct: every stream moves by the active stream's innovation
    be.matmul(l.correctCoefs, this.route(l, g.attnLaurel, n), n, g.correctCoefs);
    ops.correct(g.predictions, g.attnLaurel, g.correctCoefs, active, n, g.streams);
    // the per-layer input gates an update of streams 1..
    ops.copyColumns(g.streams[active], 0, n, g.scratch);
    ops.mulWeight(g.scratch, l.correctScale, n);
    be.matmul(l.perLayerGate, g.scratch, n, g.perLayerGate);
    ops.copyColumns(g.perLayer, i * c.perLayerDim, n, g.perLayerOne);
    be.geluMul(g.perLayerGate, g.perLayerOne, n, g.perLayerGate);
    be.matmul(l.perLayerProjection, g.perLayerGate, n, g.laurel);
    be.rmsNorm(g.laurel, l.perLayerNorm, n, eps, g.scratch);
    for (let s = 1; s < c.altupStreams; s++) be.add(g.streams[s], g.scratch, n, g.streams[s]);
  }

  /**
   * Self-attention with normalised queries, keys and (unscaled) values and scale 1; a sharing
   * layer attends over cache layer `cacheLayer`, which an earlier layer filled in this pass.
   */
  private attention(l: Gemma3nLayer, cacheLayer: number, n: number,
    segments: readonly SequenceRows[], out: Activation): void {
    const be = this.be, c = this.config, b = this.g.attention, x = this.buf.normed;
    const positions = this.buf.positions;
    be.matmul(l.q, x, n, b.q);
    be.rmsNormHeads(b.q, l.qNorm, n, c.heads, c.normEps);
    be.rope(b.q, positions, n, { ...l.rope, heads: c.heads });
    if (l.kv) {
      be.matmul(l.kv.k, x, n, b.k);
      be.matmul(l.kv.v, x, n, b.v);
      be.rmsNormHeads(b.k, l.kv.kNorm, n, c.kvHeads, c.normEps);
      this.ops.rmsNormHeads(b.v, n, c.kvHeads, c.normEps);
      be.rope(b.k, positions, n, { ...l.rope, heads: c.kvHeads });
    }
    const options = { heads: c.heads, kvHeads: c.kvHeads, headDim: c.headDim, scale: 1, window: l.window };
    let first = 0;
    for (const s of segments) {
      const kv = s.cache[cacheLayer];
      if (l.kv) be.storeKv(kv, b.k, b.v, s.rows, s.position, first);
      be.attention(b.q, kv, s.rows, s.position, options, b.mixed, first);
      first += s.rows;
    }
    be.matmul(l.output, b.mixed, n, out);
  }
}
