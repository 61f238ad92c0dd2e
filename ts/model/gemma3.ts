// Gemma 3 (text), as llama.cpp stores it in GGUF. Read top to bottom in the paper's order:
// hyperparameters → attention → feed-forward → block → model. Sources: the Gemma 3 technical
// report; Hugging Face transformers' modeling_gemma3.py; ../shared/MODELS.md.
import type { Backend, KvLayer, Weight } from "../backend/backend.ts";
import type { GgufFile } from "../gguf/reader.ts";
import { attentionHparams, Hparams, LIMITS } from "./hparams.ts";
import {
  attentionWeights, decoderBuffers, decoderOutput, ffnWeights, forwardOne, gatedFfn, LogitsHead,
  selfAttention, setBatchInputs, WeightTable,
  type AttentionWeights, type DecoderBuffers, type FfnWeights, type SelfAttentionOptions,
} from "./layers.ts";
import type { Batch, ForwardOptions, LogitsSink, Model, ModelInfo, ModelShape } from "./model.ts";

// ---- hyperparameters ------------------------------------------------------------------------

/** Five local (sliding-window) layers, then one global layer: layer i is global when i % 6 == 5. */
const SLIDING_PATTERN = 6;
/** Local layers rotate with base 10k; global layers use rope.freq_base (1M). */
const LOCAL_ROPE_BASE = 10_000;

export interface Gemma3Config extends ModelShape {
  readonly name: string;
  readonly normEps: number;
  readonly globalRopeBase: number;
  readonly globalRopeScale: number;
  readonly slidingWindow: number;
  /** 1/sqrt(query_pre_attn_scalar); the GGUF keeps head_dim as that scalar. */
  readonly attentionScale: number;
}

export function gemma3Config(meta: Hparams, vocab: number): Gemma3Config {
  const { embedding, heads, kvHeads, headDim } = attentionHparams(meta);
  // llama.cpp rotates whole heads here (n_rot = head size).
  meta.int(".rope.dimension_count", { min: headDim, max: headDim, fallback: headDim });
  const scaling = meta.float(".rope.scaling.factor", { min: 1e-3, max: 1e3, fallback: 1 });
  const layers = meta.int(".block_count", { min: 1, max: LIMITS.layers });
  const slidingWindow = meta.int(".attention.sliding_window", { min: 1, max: LIMITS.context });
  return Object.freeze({
    architecture: "gemma3",
    name: meta.string("general.name", "gemma3"),
    layers,
    embedding,
    feedForward: meta.int(".feed_forward_length", { min: 1, max: LIMITS.feedForward }),
    heads, kvHeads, headDim, vocab,
    contextLength: meta.int(".context_length", { min: 1, max: LIMITS.context }),
    kvShapes: Array.from({ length: layers }, (_, i) =>
      ({ kvHeads, headDim, window: isGlobalLayer(i) ? 0 : slidingWindow })),
    normEps: meta.float(".attention.layer_norm_rms_epsilon", { min: 0, max: 1 }),
    globalRopeBase: meta.float(".rope.freq_base", { min: 1, fallback: 1_000_000 }),
    globalRopeScale: 1 / scaling,
    slidingWindow,
    attentionScale: 1 / Math.sqrt(headDim),
  });
}

export function isGlobalLayer(layer: number): boolean {
  return layer % SLIDING_PATTERN === SLIDING_PATTERN - 1;
}

// ---- one block ------------------------------------------------------------------------------

interface Gemma3Layer {
  readonly attentionNorm: Weight;
  readonly attention: AttentionWeights;
  readonly postAttentionNorm: Weight;
  readonly ffnNorm: Weight;
  readonly ffn: FfnWeights;
  readonly postFfnNorm: Weight;
  readonly options: SelfAttentionOptions;
}

function loadLayer(t: WeightTable, c: Gemma3Config, i: number): Gemma3Layer {
  const p = `blk.${i}`, e = c.embedding;
  const global = isGlobalLayer(i);
  const rope = {
    headDim: c.headDim, rotaryDims: c.headDim, neox: true,
    base: global ? c.globalRopeBase : LOCAL_ROPE_BASE, scale: global ? c.globalRopeScale : 1,
  };
  return {
    attentionNorm: t.norm(`${p}.attn_norm.weight`, [e]),
    attention: attentionWeights(t, p, c),
    postAttentionNorm: t.norm(`${p}.post_attention_norm.weight`, [e]),
    ffnNorm: t.norm(`${p}.ffn_norm.weight`, [e]),
    ffn: ffnWeights(t, p, e, c.feedForward),
    postFfnNorm: t.norm(`${p}.post_ffw_norm.weight`, [e]),
    options: {
      attention: {
        heads: c.heads, kvHeads: c.kvHeads, headDim: c.headDim, scale: c.attentionScale,
        window: global ? 0 : c.slidingWindow,
      },
      ropeQ: { ...rope, heads: c.heads },
      ropeK: { ...rope, heads: c.kvHeads },
      normEps: c.normEps,
      scaleQueries: true,
    },
  };
}

// ---- the model ------------------------------------------------------------------------------

export class Gemma3 implements Model {
  readonly info: ModelInfo;
  private readonly tokenEmbedding: Weight;
  private readonly outputNorm: Weight;
  private readonly head: LogitsHead;
  private readonly blocks: Gemma3Layer[];
  /** Activations, planned once for maxBatch rows. */
  private readonly buf: DecoderBuffers;

  constructor(readonly config: Gemma3Config, file: GgufFile, private readonly be: Backend,
    readonly maxBatch: number) {
    const t = new WeightTable(file, be), c = config;
    this.tokenEmbedding = t.get("token_embd.weight", [c.embedding, c.vocab]);
    this.outputNorm = t.norm("output_norm.weight", [c.embedding]);
    // Tied embeddings: the LM head is token_embd unless the file carries its own output.weight.
    const output = t.optional("output.weight", [c.embedding, c.vocab]) ?? this.tokenEmbedding;
    this.head = new LogitsHead(be, output, null, c.vocab, maxBatch);
    this.blocks = Array.from({ length: c.layers }, (_, i) => loadLayer(t, c, i));
    this.info = {
      architecture: "gemma3", name: c.name, vocabSize: c.vocab, contextLength: c.contextLength,
      embedding: c.embedding,
      kvShapes: c.kvShapes, keyRope: this.blocks.map((l) => l.options.ropeK),
    };
    this.buf = decoderBuffers(be, maxBatch, c);
  }

  forward(tokens: ArrayLike<number>, n: number, position: number, cache: readonly KvLayer[],
    options: ForwardOptions = {}): Float32Array {
    return forwardOne(this, tokens, n, position, cache, options);
  }

  forwardBatch(batch: Batch, sink: LogitsSink): void {
    const be = this.be, c = this.config, b = this.buf, x = b.x;
    const n = setBatchInputs(be, b, batch, this.maxBatch);
    be.embed(this.tokenEmbedding, b.ids, n, x);
    be.scale(x, n, Math.sqrt(c.embedding)); // Gemma scales embeddings by sqrt(hidden)
    for (let i = 0; i < this.blocks.length; i++) {
      const l = this.blocks[i];
      // Sandwich norms: x += post_norm(attn(pre_norm(x))); x += post_norm(ffn(pre_norm(x)))
      be.rmsNorm(x, l.attentionNorm, n, c.normEps, b.normed);
      selfAttention(be, b.normed, n, batch.segments, i, b.positions, l.attention, l.options,
        b.attn, b.branch);
      be.rmsNormAdd(b.branch, l.postAttentionNorm, n, c.normEps, x);
      be.rmsNorm(x, l.ffnNorm, n, c.normEps, b.normed);
      gatedFfn(be, b.normed, n, l.ffn, "gelu", b.ffn, b.branch);
      be.rmsNormAdd(b.branch, l.postFfnNorm, n, c.normEps, x);
    }
    decoderOutput(be, b, batch, n, this.outputNorm, c.normEps, this.head, sink);
  }
}
