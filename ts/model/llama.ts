// Llama (2, 3, 3.1, 3.2), as llama.cpp stores it in GGUF; Qwen 2 and Qwen 3 are the same
// pre-norm decoder with other RoPE and attention options and reuse this graph. Read top to
// bottom: hyperparameters → one block → the model. Sources: Touvron et al. 2023 ("Llama 2");
// Meta's Llama 3 report (RoPE frequency scaling); transformers' modeling_llama.py; llama.cpp's
// src/models/llama.cpp.
import type { Backend, KvLayer, Weight } from "../backend/backend.ts";
import { InferError, quote } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";
import { attentionHparams, Hparams, LIMITS } from "./hparams.ts";
import {
  attentionWeights, decoderBuffers, decoderOutput, ffnWeights, forwardOne, gatedFfn, LogitsHead,
  selfAttention, setBatchInputs, WeightTable,
  type AttentionWeights, type DecoderBuffers, type FfnWeights, type SelfAttentionOptions,
} from "./layers.ts";
import type { Batch, ForwardOptions, LogitsSink, Model, ModelInfo, ModelShape } from "./model.ts";

// ---- hyperparameters ------------------------------------------------------------------------

export interface DecoderConfig extends ModelShape {
  readonly name: string;
  readonly normEps: number;
  readonly ropeBase: number;
  /** 1 / rope.scaling.factor for linear scaling (position interpolation); 1 otherwise. */
  readonly ropeScale: number;
  /** NeoX ("rotate half") RoPE, as Qwen uses; Llama's GGUF Q/K rows are permuted for pairs. */
  readonly ropeNeox: boolean;
  readonly attentionScale: number;
  /** Qwen 3 normalises each query and key head (RMSNorm over head_dim) before RoPE. */
  readonly qkNorm: boolean;
}

export interface DecoderTraits {
  readonly ropeNeox: boolean;
  readonly qkNorm: boolean;
  /** The family computes YaRN (gpt-oss): rope.scaling.type "yarn" is taken, not refused. */
  readonly yarn?: boolean;
}

/** The hyperparameters every llama-like decoder shares, validated as llama.cpp loads them. */
export function decoderConfig(meta: Hparams, vocab: number, traits: DecoderTraits): DecoderConfig {
  const { embedding, heads, kvHeads, headDim } = attentionHparams(meta);
  // llama.cpp requires RoPE over whole heads for these architectures.
  meta.int(".rope.dimension_count", { min: headDim, max: headDim, fallback: headDim });
  const scalingType = meta.string(".rope.scaling.type", "linear");
  if (scalingType !== "linear" && scalingType !== "none" && !(traits.yarn && scalingType === "yarn")) {
    throw new InferError("unsupported", `RoPE scaling ${quote(scalingType)} ` +
      `(${meta.architecture}.rope.scaling.type) is not supported yet`);
  }
  const factor = meta.float(".rope.scaling.factor", { min: 0, max: 1e3, fallback: 0 });
  meta.require(factor === 0 || factor >= 1e-3, ".rope.scaling.factor", `is ${factor} (0: none)`);
  const attentionScale = meta.float(".attention.scale", { min: 0, max: 1e3, fallback: 0 });
  const layers = meta.int(".block_count", { min: 1, max: LIMITS.layers });
  return Object.freeze({
    architecture: meta.architecture,
    name: meta.string("general.name", meta.architecture),
    layers,
    embedding,
    feedForward: meta.int(".feed_forward_length", { min: 1, max: LIMITS.feedForward }),
    heads, kvHeads, headDim, vocab,
    contextLength: meta.int(".context_length", { min: 1, max: LIMITS.context }),
    kvShapes: Array.from({ length: layers }, () => ({ kvHeads, headDim, window: 0 })),
    normEps: meta.float(".attention.layer_norm_rms_epsilon", { min: 0, max: 1 }),
    ropeBase: meta.float(".rope.freq_base", { min: 1, fallback: 10_000 }),
    // llama.cpp's freq_scale, 1 / factor for linear scaling and YaRN alike
    ropeScale: scalingType !== "none" && factor !== 0 ? 1 / factor : 1,
    ropeNeox: traits.ropeNeox,
    attentionScale: attentionScale === 0 ? 1 / Math.sqrt(headDim) : attentionScale,
    qkNorm: traits.qkNorm,
  });
}

export function llamaConfig(meta: Hparams, vocab: number): DecoderConfig {
  return decoderConfig(meta, vocab, { ropeNeox: false, qkNorm: false });
}

// ---- one block ------------------------------------------------------------------------------

/** A pre-norm block's attention half: its norm, projections and options. */
export interface AttentionHalf {
  readonly attentionNorm: Weight;
  readonly attention: AttentionWeights;
  readonly options: SelfAttentionOptions;
}

/** A pre-norm block: its attention half and its FFN's norm (the FFN is the family's own). */
export interface PreNormLayer extends AttentionHalf {
  readonly ffnNorm: Weight;
}

interface DecoderLayer extends PreNormLayer {
  readonly ffn: FfnWeights;
}

/**
 * The blocks of a pre-norm decoder over the batch's n rows in b.x: x += attn(norm(x)), then
 * x += ffn(norm(x)), where `ffn` writes block l's FFN of b.normed to b.branch (a gated FFN, or a
 * mixture of experts).
 */
export function preNormBlocks<L extends PreNormLayer>(be: Backend, c: DecoderConfig,
  b: DecoderBuffers, batch: Batch, n: number, blocks: readonly L[], ffn: (l: L) => void): void {
  const x = b.x;
  for (let i = 0; i < blocks.length; i++) {
    const l = blocks[i];
    be.rmsNorm(x, l.attentionNorm, n, c.normEps, b.normed);
    selfAttention(be, b.normed, n, batch.segments, i, b.positions, l.attention, l.options,
      b.attn, b.branch);
    be.add(x, b.branch, n, x);
    be.rmsNorm(x, l.ffnNorm, n, c.normEps, b.normed);
    ffn(l);
    be.add(x, b.branch, n, x);
  }
}

export function loadAttentionHalf(t: WeightTable, c: DecoderConfig, i: number,
  ropeFactors: Weight | null): AttentionHalf {
  const p = `blk.${i}`, e = c.embedding;
  const attention = attentionWeights(t, p, c);
  if (c.qkNorm && (!attention.qNorm || !attention.kNorm)) {
    throw new InferError("bad_model",
      `model has no tensor '${p}.attn_${attention.qNorm ? "k" : "q"}_norm.weight'`);
  }
  const rope = {
    headDim: c.headDim, rotaryDims: c.headDim, neox: c.ropeNeox, base: c.ropeBase,
      scale: c.ropeScale,
    freqFactors: ropeFactors,
  };
  return {
    attentionNorm: t.norm(`${p}.attn_norm.weight`, [e]),
    attention,
    options: {
      attention: { heads: c.heads, kvHeads: c.kvHeads, headDim: c.headDim, scale: c.attentionScale,
        window: 0 },
      ropeQ: { ...rope, heads: c.heads },
      ropeK: { ...rope, heads: c.kvHeads },
      normEps: c.normEps,
    },
  };
}

function loadLayer(t: WeightTable, c: DecoderConfig, i: number,
  ropeFactors: Weight | null): DecoderLayer {
  const p = `blk.${i}`, e = c.embedding;
  return {
    ...loadAttentionHalf(t, c, i, ropeFactors),
    ffnNorm: t.norm(`${p}.ffn_norm.weight`, [e]),
    ffn: ffnWeights(t, p, e, c.feedForward),
  };
}

// ---- the model ------------------------------------------------------------------------------

/** x += attn(norm(x)); x += swiglu_ffn(norm(x)), then a final norm and the LM head. */
export class Llama implements Model {
  readonly info: ModelInfo;
  private readonly tokenEmbedding: Weight;
  private readonly outputNorm: Weight;
  private readonly head: LogitsHead;
  private readonly blocks: DecoderLayer[];
  /** Activations, planned once for maxBatch rows. */
  private readonly buf: DecoderBuffers;

  constructor(readonly config: DecoderConfig, file: GgufFile, private readonly be: Backend,
    readonly maxBatch: number) {
    const t = new WeightTable(file, be), c = config;
    this.tokenEmbedding = t.get("token_embd.weight", [c.embedding, c.vocab]);
    this.outputNorm = t.norm("output_norm.weight", [c.embedding]);
    // Tied embeddings: the LM head is token_embd unless the file carries its own output.weight.
    const output = t.optional("output.weight", [c.embedding, c.vocab]) ?? this.tokenEmbedding;
    this.head = new LogitsHead(be, output, t.optionalVector("output.bias", [c.vocab]), c.vocab,
      maxBatch);
    // Llama 3.1+: per-pair frequency divisors, one table shared by every layer.
    const ropeFactors = t.optionalVector("rope_freqs.weight", [c.headDim / 2]);
    this.blocks = Array.from({ length: c.layers }, (_, i) => loadLayer(t, c, i, ropeFactors));
    this.info = {
      architecture: c.architecture, name: c.name, vocabSize: c.vocab,
      contextLength: c.contextLength, embedding: c.embedding, kvShapes: c.kvShapes,
      keyRope: this.blocks.map((l) => l.options.ropeK),
    };
    this.buf = decoderBuffers(be, maxBatch, c);
  }

  forward(tokens: ArrayLike<number>, n: number, position: number, cache: readonly KvLayer[],
    options: ForwardOptions = {}): Float32Array {
    return forwardOne(this, tokens, n, position, cache, options);
  }

  forwardBatch(batch: Batch, sink: LogitsSink): void {
    const be = this.be, c = this.config, b = this.buf;
    const n = setBatchInputs(be, b, batch, this.maxBatch);
    be.embed(this.tokenEmbedding, b.ids, n, b.x);
    preNormBlocks(be, c, b, batch, n, this.blocks,
      (l) => gatedFfn(be, b.normed, n, l.ffn, "silu", b.ffn, b.branch));
    decoderOutput(be, b, batch, n, this.outputNorm, c.normEps, this.head, sink);
  }
}
