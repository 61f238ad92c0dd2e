// Mistral 3 / Ministral 3, as llama.cpp stores them in GGUF (`mistral3`): Llama's pre-norm
// decoder (interleaved-pair RoPE over whole heads, GQA, SwiGLU, heads that may be wider than
// embedding / heads), with YaRN RoPE (rope.scaling.yarn_log_multiplier: transformers'
// mscale_all_dim) and Llama 4's attention temperature: past rope.scaling.original_context_length
// the queries at position p are multiplied by 1 + β · ln(⌊p / original⌋ + 1), β =
// attention.temperature_scale (transformers' llama_4_scaling_beta), after RoPE. The file's
// mixture-of-experts variant is refused. Sources: transformers' modeling_ministral3.py
// (get_llama_4_attn_scale); llama.cpp's src/models/mistral3.cpp, llm_graph_input_attn_temp
// and llama_context's yarn_attn_factor; its conversion/mistral3.py.
import type { Backend, KvLayer, Weight, YarnOptions } from "../backend/backend.ts";
import { InferError } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";
import { Hparams, LIMITS } from "./hparams.ts";
import {
  decoderBuffers, decoderOutput, ffnWeights, forwardOne, gatedFfn, LogitsHead, setBatchInputs,
  WeightTable, type DecoderBuffers, type FfnWeights, type QueryTemperature,
} from "./layers.ts";
import { decoderConfig, loadAttentionHalf, preNormBlocks, type DecoderConfig, type PreNormLayer } from "./llama.ts";
import type { Batch, ForwardOptions, LogitsSink, Model, ModelInfo } from "./model.ts";

// ---- hyperparameters ------------------------------------------------------------------------

export interface Mistral3Config extends DecoderConfig {
  /** YaRN where rope.scaling.type is "yarn" (the released models: factor 16 over 16384). */
  readonly yarn: YarnOptions | null;
  /** ggml's attn_factor for YaRN: llama.cpp's yarn_attn_factor (see yarnAttnFactor). */
  readonly ropeAttnFactor: number;
  /** Llama 4's query temperature; null where attention.temperature_scale is absent or 0. */
  readonly queryTemperature: QueryTemperature | null;
}

/** get_mscale in llama_context, in f32: 0.1 · mscale · ln(scale) + 1 (1 for scale ≤ 1). */
function mscale(scale: number, m: number): number {
  if (scale <= 1) return 1;
  const f = Math.fround;
  return f(f(f(f(0.1) * f(m)) * f(Math.log(scale))) + 1);
}

/**
 * llama.cpp's yarn_attn_factor for a YaRN factor: get_mscale(factor, 1) / get_mscale(factor,
 * log_mul) where the file has a log multiplier (else get_mscale(factor, 1)), times
 * 1 / (1 + 0.1 ln factor), which the kernel multiplies back, times rope.scaling.attn_factor.
 */
function yarnAttnFactor(factor: number, logMul: number, attnFactor: number): number {
  const f = Math.fround;
  let af = logMul !== 0 ? f(mscale(factor, 1) / mscale(factor, logMul)) : mscale(factor, 1);
  af = f(af * f(1 / f(1 + f(f(0.1) * f(Math.log(factor))))));
  return f(af * f(attnFactor));
}

export function mistral3Config(meta: Hparams, vocab: number): Mistral3Config {
  const base = decoderConfig(meta, vocab, { ropeNeox: false, qkNorm: false, yarn: true });
  if (meta.has(".expert_count") && meta.int(".expert_count", { min: 0, max: LIMITS.experts }) > 0) {
    throw new InferError("unsupported", `${meta.architecture} with experts (expert_count) is not ` +
      "supported; the dense Mistral 3 / Ministral 3 models are");
  }
  const original = meta.int(".rope.scaling.original_context_length",
    { min: 1, max: LIMITS.context, fallback: base.contextLength });
  let yarn: YarnOptions | null = null, ropeAttnFactor = 1;
  if (meta.string(".rope.scaling.type", "none") === "yarn") {
    // llama.cpp's factor: 1 / freq_scale, both f32
    const factor = Math.fround(1 / Math.fround(base.ropeScale));
    meta.require(factor > 1, ".rope.scaling.factor", "must be above 1 for YaRN");
    yarn = {
      extFactor: 1,
      betaFast: meta.float(".rope.scaling.yarn_beta_fast", { min: 1e-3, max: 1e3, fallback: 32 }),
      betaSlow: meta.float(".rope.scaling.yarn_beta_slow", { min: 1e-3, max: 1e3, fallback: 1 }),
      originalContext: original,
    };
    ropeAttnFactor = yarnAttnFactor(factor,
      meta.float(".rope.scaling.yarn_log_multiplier", { min: 0, max: 1e3, fallback: 0 }),
      meta.float(".rope.scaling.attn_factor", { min: 1e-3, max: 1e3, fallback: 1 }));
  }
  const beta = meta.float(".attention.temperature_scale", { min: 0, max: 1e3, fallback: 0 });
  return Object.freeze({
    ...base, yarn, ropeAttnFactor,
    queryTemperature: beta === 0 ? null : { scale: beta, floor: original },
  });
}

// ---- one block ------------------------------------------------------------------------------

interface Mistral3Layer extends PreNormLayer {
  readonly ffn: FfnWeights;
}

function loadLayer(t: WeightTable, c: Mistral3Config, i: number): Mistral3Layer {
  const p = `blk.${i}`;
  for (const name of ["ffn_gate_inp.weight", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"]) {
    if (t.has(`${p}.${name}`)) {
      throw new InferError("unsupported", `tensor '${p}.${name}': ${c.architecture} with experts ` +
        "or FFN biases is not supported");
    }
  }
  const half = loadAttentionHalf(t, c, i, t.optionalVector("rope_freqs.weight", [c.headDim / 2]));
  const rope = { attnFactor: c.ropeAttnFactor, ...(c.yarn ? { yarn: c.yarn } : {}) };
  const o = half.options;
  return {
    ...half,
    options: {
      ...o,
      ropeQ: { ...o.ropeQ, ...rope },
      ropeK: { ...o.ropeK, ...rope },
      ...(c.queryTemperature ? { queryTemperature: c.queryTemperature } : {}),
    },
    ffnNorm: t.norm(`${p}.ffn_norm.weight`, [c.embedding]),
    ffn: ffnWeights(t, p, c.embedding, c.feedForward),
  };
}

// ---- the model ------------------------------------------------------------------------------

/** x += attn(norm(x)); x += swiglu_ffn(norm(x)), then a final norm and the LM head. */
export class Mistral3 implements Model {
  readonly info: ModelInfo;
  private readonly tokenEmbedding: Weight;
  private readonly outputNorm: Weight;
  private readonly head: LogitsHead;
  private readonly blocks: Mistral3Layer[];
  private readonly buf: DecoderBuffers;

  constructor(readonly config: Mistral3Config, file: GgufFile, private readonly be: Backend,
    readonly maxBatch: number) {
    const c = config;
    // Refused before any weight is read or uploaded: the query temperature scales rows in place
    // with the host-routed expert ops' scatterScaled (a backend that routes experts on the device
    // has none), and RoPE has YaRN on the backends with expert ops (CPU and CUDA).
    if ((c.queryTemperature && (!be.experts || be.experts.routedFfn)) || (c.yarn && !be.experts)) {
      throw new InferError("unsupported", `the ${be.name} backend does not run ${c.architecture} ` +
        "(YaRN RoPE, Llama 4's query temperature) yet; use --backend cpu");
    }
    if (c.ropeAttnFactor !== 1 && !be.ropeAttnFactor) {
      throw new InferError("unsupported", `the ${be.name} backend does not scale RoPE by ` +
        `YaRN's attention factor (${c.architecture}); use --backend cpu`);
    }
    const t = new WeightTable(file, be);
    this.tokenEmbedding = t.get("token_embd.weight", [c.embedding, c.vocab]);
    this.outputNorm = t.norm("output_norm.weight", [c.embedding]);
    // Tied embeddings (Ministral 3 3B) unless the file carries its own output.weight.
    const output = t.optional("output.weight", [c.embedding, c.vocab]) ?? this.tokenEmbedding;
    this.head = new LogitsHead(be, output, null, c.vocab, maxBatch);
    this.blocks = Array.from({ length: c.layers }, (_, i) => loadLayer(t, c, i));
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
