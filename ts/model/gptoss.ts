// gpt-oss (gpt-oss-20b, gpt-oss-120b), as llama.cpp stores it in GGUF (`gpt-oss`): a pre-norm
// decoder whose layers alternate sliding-window (even layers) and full attention, with q/k/v/o
// biases, a learned per-head sink logit in every softmax (attn_sinks), NeoX RoPE with YaRN
// scaling, and in every layer a mixture of experts: a router with a bias, the top k of its raw
// logits weighted by a softmax over those k, experts with biases and a clamped SwiGLU
// (ts/model/moe.ts). Sources: OpenAI's gpt-oss model card; transformers' modeling_gpt_oss.py;
// llama.cpp's src/models/openai-moe.cpp and build_moe_ffn (LLM_FFN_SWIGLU_OAI_MOE,
// LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT).
import type { Backend, KvLayer, Weight, YarnOptions } from "../backend/backend.ts";
import { InferError } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";
import { Hparams, LIMITS } from "./hparams.ts";
import {
  decoderBuffers, decoderOutput, forwardOne, LogitsHead, setBatchInputs, WeightTable,
  type DecoderBuffers,
} from "./layers.ts";
import {
  decoderConfig, loadAttentionHalf, preNormBlocks, type DecoderConfig, type PreNormLayer,
} from "./llama.ts";
import type { Batch, ForwardOptions, LogitsSink, Model, ModelInfo } from "./model.ts";
import {
  expertBiases, MoeBuffers, moeFfn, moeRowFloats, moeWeights, type MoeShape, type MoeWeights,
} from "./moe.ts";

// ---- hyperparameters ------------------------------------------------------------------------

export interface GptOssConfig extends DecoderConfig, MoeShape {
  /** The sliding layers' window (attention.sliding_window); layer i slides when i is even. */
  readonly slidingWindow: number;
  /** The sliding layers' RoPE base (rope.freq_base_swa, else rope.freq_base). */
  readonly ropeBaseSliding: number;
  /** YaRN where rope.scaling.type is "yarn" (the released models: factor 32 over 4096). */
  readonly yarn: YarnOptions | null;
  /** ggml's attn_factor for YaRN: llama.cpp's yarn_attn_factor (see gptossConfig). */
  readonly ropeAttnFactor: number;
}

/** llama.cpp's swa pattern for gpt-oss: period 2, the first layer of each pair slides. */
const SLIDING_PERIOD = 2;

export function isSlidingLayer(i: number): boolean {
  return i % SLIDING_PERIOD < SLIDING_PERIOD - 1;
}

export function gptossConfig(meta: Hparams, vocab: number): GptOssConfig {
  const base = decoderConfig(meta, vocab, { ropeNeox: true, qkNorm: false, yarn: true });
  const experts = meta.int(".expert_count", { min: 1, max: LIMITS.experts });
  const expertsUsed = meta.int(".expert_used_count", { min: 1, max: experts });
  const expertFeedForward = meta.int(".expert_feed_forward_length",
    { min: 1, max: LIMITS.feedForward });
  const slidingWindow = meta.int(".attention.sliding_window", { min: 1, max: LIMITS.context });
  const period = meta.int(".attention.sliding_window_pattern",
    { min: 1, max: LIMITS.layers, fallback: SLIDING_PERIOD });
  meta.require(period === SLIDING_PERIOD, ".attention.sliding_window_pattern",
    `is ${period}; gpt-oss alternates sliding and full layers (2)`);
  const yarn = meta.string(".rope.scaling.type", "none") === "yarn";
  let yarnOptions: YarnOptions | null = null, ropeAttnFactor = 1;
  if (yarn) {
    const factor = 1 / base.ropeScale;
    meta.require(factor > 1, ".rope.scaling.factor", "must be above 1 for YaRN");
    yarnOptions = {
      extFactor: 1,
      betaFast: meta.float(".rope.scaling.yarn_beta_fast", { min: 1e-3, max: 1e3, fallback: 32 }),
      betaSlow: meta.float(".rope.scaling.yarn_beta_slow", { min: 1e-3, max: 1e3, fallback: 1 }),
      originalContext: meta.int(".rope.scaling.original_context_length",
        { min: 1, max: LIMITS.context, fallback: base.contextLength }),
    };
    // llama.cpp (llama_context): yarn_attn_factor = get_mscale(factor) / (1 + 0.1 ln factor),
    // both in f32, the kernel then multiplying by 1 + 0.1 ln factor again: about
    // 1 + 0.1 ln factor on cos and sin in all, as transformers' attention_factor.
    const mscale = Math.fround(Math.fround(Math.fround(0.1) * Math.fround(Math.log(factor))) + 1);
    ropeAttnFactor = Math.fround(mscale * Math.fround(1 / mscale));
  }
  const moe: MoeShape = {
    embedding: base.embedding, experts, expertsUsed, expertFeedForward, normalizeTopK: false,
    gating: "topk-softmax", activation: "swiglu-oai",
  };
  return Object.freeze({
    ...base, ...moe, feedForward: expertFeedForward, extraRowFloats: moeRowFloats(moe),
    kvShapes: base.kvShapes.map((s, i) => ({ ...s, window: isSlidingLayer(i) ? slidingWindow : 0 })),
    slidingWindow,
    ropeBaseSliding: meta.float(".rope.freq_base_swa", { min: 1, fallback: base.ropeBase }),
    yarn: yarnOptions, ropeAttnFactor,
  });
}

// ---- one block ------------------------------------------------------------------------------

interface GptOssLayer extends PreNormLayer {
  readonly moe: MoeWeights;
}

function loadLayer(t: WeightTable, c: GptOssConfig, i: number): GptOssLayer {
  const p = `blk.${i}`;
  const half = loadAttentionHalf(t, c, i, null);
  const a = half.attention;
  for (const [bias, name] of [[a.qBias, "attn_q"], [a.kBias, "attn_k"], [a.vBias, "attn_v"],
    [a.outputBias, "attn_output"]] as const) {
    if (!bias) throw new InferError("bad_model", `model has no tensor '${p}.${name}.bias'`);
  }
  const sliding = isSlidingLayer(i);
  const rope = { base: sliding ? c.ropeBaseSliding : c.ropeBase, attnFactor: c.ropeAttnFactor,
    ...(c.yarn ? { yarn: c.yarn } : {}) };
  const o = half.options;
  return {
    ...half,
    options: {
      ...o,
      attention: { ...o.attention, window: sliding ? c.slidingWindow : 0,
        sinks: t.vector(`${p}.attn_sinks.weight`, [c.heads], "attention sinks") },
      ropeQ: { ...o.ropeQ, ...rope },
      ropeK: { ...o.ropeK, ...rope },
    },
    // llama.cpp's name for the norm before the FFN in this family
    ffnNorm: t.norm(`${p}.post_attention_norm.weight`, [c.embedding]),
    moe: { ...moeWeights(t, p, c), biases: expertBiases(t, p, c) },
  };
}

// ---- the model ------------------------------------------------------------------------------

/** x += attn(norm(x)); x += moe(norm(x)), then a final norm and the LM head. */
export class GptOss implements Model {
  readonly info: ModelInfo;
  private readonly tokenEmbedding: Weight;
  private readonly outputNorm: Weight;
  private readonly head: LogitsHead;
  private readonly blocks: GptOssLayer[];
  private readonly buf: DecoderBuffers;
  private readonly moeBuf: MoeBuffers;

  constructor(readonly config: GptOssConfig, file: GgufFile, private readonly be: Backend,
    readonly maxBatch: number) {
    // Refused before any weight is read or uploaded.
    if (!be.experts || !be.swigluOaiMul) {
      throw new InferError("unsupported", `the ${be.name} backend does not run gpt-oss ` +
        "(attention sinks, YaRN, the clamped SwiGLU) yet; use --backend cpu");
    }
    const t = new WeightTable(file, be), c = config;
    this.tokenEmbedding = t.get("token_embd.weight", [c.embedding, c.vocab]);
    this.outputNorm = t.norm("output_norm.weight", [c.embedding]);
    const output = t.optional("output.weight", [c.embedding, c.vocab]) ?? this.tokenEmbedding;
    this.head = new LogitsHead(be, output, null, c.vocab, maxBatch);
    this.blocks = Array.from({ length: c.layers }, (_, i) => loadLayer(t, c, i));
    this.info = {
      architecture: c.architecture, name: c.name, vocabSize: c.vocab,
      contextLength: c.contextLength, embedding: c.embedding, kvShapes: c.kvShapes,
      keyRope: this.blocks.map((l) => l.options.ropeK),
    };
    this.buf = decoderBuffers(be, maxBatch, c);
    this.moeBuf = new MoeBuffers(be, maxBatch, c);
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
      (l) => moeFfn(be, b.normed, n, l.moe, c, this.moeBuf, b.branch));
    decoderOutput(be, b, batch, n, this.outputNorm, c.normEps, this.head, sink);
  }
}
