// Phi-3 / Phi-3.5 / Phi-4 (dense), as llama.cpp stores them in GGUF (`phi3`): Llama's pre-norm
// decoder with the query, key and value projections fused in one tensor (attn_qkv: the rows of
// Q, then K, then V) and the FFN's gate and up projections fused in ffn_up (gate rows first),
// NeoX RoPE, possibly over part of each head only (Phi-4-mini rotates 96 of 128 values), and
// LongRoPE for the long-context models: per-pair divisors of the angle, `rope_factors_short`
// while the context stays within rope.scaling.original_context_length and `rope_factors_long`
// past it (llama.cpp picks by the context size; transformers by the sequence's length, the same
// within the original context), with the rotated values scaled by rope.scaling.attn_factor.
// Phi-3's sliding window is not applied, as in llama.cpp (its phi3 turns it off). Sources:
// Abdin et al. 2024 ("Phi-3 technical report"); transformers' modeling_phi3.py and
// modeling_rope_utils.py (longrope); llama.cpp's src/models/phi3.cpp and conversion/phi.py.
import type { Backend, KvLayer, RopeOptions, Weight } from "../backend/backend.ts";
import { InferError, quote } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";
import { attentionHparams, Hparams, LIMITS } from "./hparams.ts";
import {
  attentionWeights, decoderBuffers, decoderOutput, forwardOne, gatedFfn, LogitsHead,
  setBatchInputs, WeightTable,
  type AttentionWeights, type DecoderBuffers, type FfnWeights,
} from "./layers.ts";
import { preNormBlocks, type DecoderConfig, type PreNormLayer } from "./llama.ts";
import type { Batch, ForwardOptions, LogitsSink, Model, ModelInfo } from "./model.ts";

// ---- hyperparameters ------------------------------------------------------------------------

export interface Phi3Config extends DecoderConfig {
  /** Values of each head that RoPE rotates (rope.dimension_count); the rest pass through. */
  readonly rotaryDims: number;
  /** LongRoPE's scale on the rotated values (rope.scaling.attn_factor; 1 without LongRoPE). */
  readonly ropeAttnFactor: number;
  /** The context the short factors serve; a longer one takes the long factors. */
  readonly ropeOriginalContext: number;
}

export function phi3Config(meta: Hparams, vocab: number): Phi3Config {
  const { embedding, heads, kvHeads, headDim } = attentionHparams(meta);
  const rotaryDims = meta.int(".rope.dimension_count", { min: 2, max: headDim, fallback: headDim });
  meta.require(rotaryDims % 2 === 0, ".rope.dimension_count", `is ${rotaryDims}: RoPE rotates pairs`);
  // llama.cpp's phi3 sizes attn_qkv and attn_output with the embedding as the query width.
  meta.require(heads * headDim === embedding, ".attention.head_count",
    `is ${heads}: ${heads} heads of ${headDim} are not the embedding of ${embedding}`);
  const scalingType = meta.string(".rope.scaling.type", "none");
  if (scalingType !== "none" && scalingType !== "longrope") {
    throw new InferError("unsupported", `RoPE scaling ${quote(scalingType)} ` +
      `(${meta.architecture}.rope.scaling.type) is not supported for phi3`);
  }
  const factor = meta.float(".rope.scaling.factor", { min: 0, max: 1e3, fallback: 0 });
  meta.require(factor === 0 || factor === 1, ".rope.scaling.factor",
    `is ${factor}; phi3 scales RoPE through its long and short factors only`);
  const contextLength = meta.int(".context_length", { min: 1, max: LIMITS.context });
  const layers = meta.int(".block_count", { min: 1, max: LIMITS.layers });
  return Object.freeze({
    architecture: meta.architecture,
    name: meta.string("general.name", meta.architecture),
    layers,
    embedding,
    feedForward: meta.int(".feed_forward_length", { min: 1, max: LIMITS.feedForward }),
    heads, kvHeads, headDim, vocab, contextLength,
    kvShapes: Array.from({ length: layers }, () => ({ kvHeads, headDim, window: 0 })),
    normEps: meta.float(".attention.layer_norm_rms_epsilon", { min: 0, max: 1 }),
    ropeBase: meta.float(".rope.freq_base", { min: 1, fallback: 10_000 }),
    ropeScale: 1,
    ropeNeox: true,
    // 1.0f / sqrtf(head_dim) in f32 as llama.cpp's phi3 scales the queries (for 96-value heads
    // one ulp from 1/sqrt(96) rounded once, which moves some queries' f16 rounding).
    attentionScale: Math.fround(1 / Math.fround(Math.sqrt(headDim))),
    qkNorm: false,
    rotaryDims,
    ropeAttnFactor: meta.float(".rope.scaling.attn_factor", { min: 1e-3, max: 1e3, fallback: 1 }),
    ropeOriginalContext: meta.int(".rope.scaling.original_context_length",
      { min: 1, max: LIMITS.context, fallback: contextLength }),
  });
}

// ---- one block ------------------------------------------------------------------------------

interface Phi3Layer extends PreNormLayer {
  readonly ffn: FfnWeights;
}

/** Q, K and V: rows of the fused attn_qkv where the file has it, else three tensors. */
function phi3Attention(t: WeightTable, p: string, c: Phi3Config): AttentionWeights {
  const fused = `${p}.attn_qkv.weight`;
  if (!t.has(fused)) return attentionWeights(t, p, c);
  if (t.has(`${p}.attn_qkv.bias`)) {
    throw new InferError("unsupported", `tensor '${p}.attn_qkv.bias': phi3 has no attention biases`);
  }
  const e = c.embedding, q = c.heads * c.headDim, kv = c.kvHeads * c.headDim;
  const dims = [e, q + 2 * kv];
  return {
    q: t.rows(fused, dims, 0, q),
    k: t.rows(fused, dims, q, kv),
    v: t.rows(fused, dims, q + kv, kv),
    output: t.get(`${p}.attn_output.weight`, [q, e]),
    qNorm: null, kNorm: null, qBias: null, kBias: null, vBias: null, outputBias: null,
  };
}

/** Gate and up: the two halves of ffn_up's rows (gate first), or two tensors where split. */
function phi3Ffn(t: WeightTable, p: string, c: Phi3Config): FfnWeights {
  const e = c.embedding, f = c.feedForward;
  const down = t.get(`${p}.ffn_down.weight`, [f, e]);
  if (t.has(`${p}.ffn_gate.weight`)) {
    return { gate: t.get(`${p}.ffn_gate.weight`, [e, f]), up: t.get(`${p}.ffn_up.weight`, [e, f]),
      down };
  }
  const dims = [e, 2 * f];
  return { gate: t.rows(`${p}.ffn_up.weight`, dims, 0, f),
    up: t.rows(`${p}.ffn_up.weight`, dims, f, f), down };
}

function loadLayer(t: WeightTable, c: Phi3Config, i: number, rope: Omit<RopeOptions, "heads">):
  Phi3Layer {
  const p = `blk.${i}`, e = c.embedding;
  return {
    attentionNorm: t.norm(`${p}.attn_norm.weight`, [e]),
    attention: phi3Attention(t, p, c),
    options: {
      attention: { heads: c.heads, kvHeads: c.kvHeads, headDim: c.headDim, scale: c.attentionScale,
        window: 0 },
      ropeQ: { ...rope, heads: c.heads },
      ropeK: { ...rope, heads: c.kvHeads },
      normEps: c.normEps,
      // llama.cpp scales the queries by 1/sqrt(head_dim) before attention, then attends with 1.
      scaleQueries: true,
    },
    ffnNorm: t.norm(`${p}.ffn_norm.weight`, [e]),
    ffn: phi3Ffn(t, p, c),
  };
}

// ---- the model ------------------------------------------------------------------------------

/** x += attn(norm(x)); x += swiglu_ffn(norm(x)), then a final norm and the LM head. */
export class Phi3 implements Model {
  readonly info: ModelInfo;
  private readonly tokenEmbedding: Weight;
  private readonly outputNorm: Weight;
  private readonly head: LogitsHead;
  private readonly blocks: Phi3Layer[];
  private readonly buf: DecoderBuffers;

  /** `contextLength`: each sequence's context, which picks LongRoPE's long or short factors. */
  constructor(readonly config: Phi3Config, file: GgufFile, private readonly be: Backend,
    readonly maxBatch: number, contextLength = 0) {
    const c = config;
    if (c.ropeAttnFactor !== 1 && !be.ropeAttnFactor) {
      throw new InferError("unsupported", `the ${be.name} backend does not scale RoPE by ` +
        `LongRoPE's attention factor (${c.ropeAttnFactor}, ${c.architecture}); use --backend cpu`);
    }
    const t = new WeightTable(file, be);
    this.tokenEmbedding = t.get("token_embd.weight", [c.embedding, c.vocab]);
    this.outputNorm = t.norm("output_norm.weight", [c.embedding]);
    const output = t.optional("output.weight", [c.embedding, c.vocab]) ?? this.tokenEmbedding;
    this.head = new LogitsHead(be, output, t.optionalVector("output.bias", [c.vocab]), c.vocab,
      maxBatch);
    // One table for every layer (llama.cpp's blk.N copies are views of blk.0's).
    const long = contextLength > c.ropeOriginalContext;
    const tables = (["short", "long"] as const).map((which) =>
      t.checkVector(`rope_factors_${which}.weight`, [c.rotaryDims / 2]));
    if (long && tables[0] && !tables[1]) {
      // The short factors alone past the original context rotate as the model was never trained.
      throw new InferError("bad_model", `a context of ${contextLength} is past ` +
        `${c.architecture}'s original ${c.ropeOriginalContext} and the model has no tensor ` +
        `'rope_factors_long.weight'; use -c ${c.ropeOriginalContext} or less`);
    }
    const factors = t.optionalVector(`rope_factors_${long ? "long" : "short"}.weight`,
      [c.rotaryDims / 2]);
    const rope = {
      headDim: c.headDim, rotaryDims: c.rotaryDims, neox: true, base: c.ropeBase, scale: 1,
      freqFactors: factors, attnFactor: c.ropeAttnFactor,
    };
    this.blocks = Array.from({ length: c.layers }, (_, i) => loadLayer(t, c, i, rope));
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
