// What the converter knows per architecture, one table each, as llama.cpp's convert_hf_to_gguf.py
// does: the Hugging Face class names it accepts, the GGUF metadata its hyperparameters become,
// the tensors the GGUF must hold (name, shape, required or not) and the Hugging Face name of each,
// and the per-tensor changes the runtime's layout needs (Llama's Q/K row permutation for normal
// RoPE, Llama 3's RoPE frequency factors written as a tensor, Gemma's 1 + w norm weights).
import { InferError } from "../errors.ts";
import { gguf, type GgufTypedValue } from "../gguf/writer.ts";
import { LIMITS } from "../model/hparams.ts";
import { checkRope, refusedSettings, type ConfigRules } from "./config-checks.ts";
import type { HfConfig, RopeParameters } from "./hf-config.ts";
import { gemma3nPlan } from "./gemma3n.ts";
import { gptossPlan } from "./gptoss.ts";
import type { TokenizerOptions } from "./tokenizer.ts";

export interface PlannedTensor {
  /** GGUF name, e.g. blk.0.attn_q.weight. */
  readonly name: string;
  /** ggml order: dims[0] is the row length. */
  readonly dims: readonly number[];
  /** The Hugging Face tensor it comes from; null for a tensor computed here or stacked. */
  readonly source: string | null;
  /**
   * A mixture of experts' 3-D tensor: the Hugging Face tensors (one per expert, each of dims
   * without the last) stacked along the outermost dimension, expert 0 first.
   */
  readonly stacked?: readonly string[];
  readonly required: boolean;
  /**
   * The source's PyTorch shape where it is not dims reversed (a fused tensor one of whose parts
   * this is, or one stored transposed: gpt-oss's experts); `transform` makes dims of it.
   */
  readonly sourceShape?: readonly number[];
  /** Rewrites the f32 data in place or returns new data (permutations, generated tables). */
  readonly transform?: (data: Float32Array) => Float32Array;
}

export interface ArchitecturePlan {
  readonly architecture: string;
  readonly metadata: [string, GgufTypedValue][];
  readonly tensors: readonly PlannedTensor[];
  /** Hugging Face tensors that are dropped on purpose (tied heads, cached RoPE tables). */
  readonly ignored: (hfName: string) => boolean;
  readonly tokenizer?: TokenizerOptions;
}

interface Architecture {
  readonly gguf: string;
  readonly hfClasses: readonly string[];
  plan(c: HfConfig): ArchitecturePlan;
}

// ---- the llama-like decoder (Llama, Qwen 2, Qwen 3) -------------------------------------------

interface DecoderOptions {
  readonly arch: string;
  /** Llama: undo Hugging Face's rotate-half row order so that GGUF pairs are adjacent (2i, 2i+1). */
  readonly permuteQk: boolean;
  readonly qkNorm: boolean;
  readonly qkvBias: "required" | "optional" | "none";
  readonly tiedDefault: boolean;
  readonly writeRopeDims: boolean;
  readonly writeVocabSize: boolean;
  /** Qwen 2 / 3: use_sliding_window and max_window_layers decide which layers slide. */
  readonly qwenSlidingWindow: boolean;
  /** attention_bias: true adds an output bias too, which the plan has no place for. */
  readonly refuseAttentionBias: boolean;
  /** Qwen3-MoE: every layer's FFN a mixture of experts (moeShape). */
  readonly moe?: boolean;
  /** Mistral 3: YaRN is taken (yarnMetadata), not refused. */
  readonly yarn?: boolean;
}

/** A Qwen3-MoE config's experts; the GGUF runtimes route every layer, renormalising the top k. */
function moeShape(c: HfConfig, arch: string): { experts: number; used: number; feedForward: number } {
  const refuse = (key: string, why: string): never => {
    throw new InferError("unsupported", `${c.path}: '${key}' ${why}`);
  };
  // transformers 5 spells num_experts num_local_experts; released configs have the former.
  const key = c.has("num_experts") ? "num_experts" : "num_local_experts";
  const experts = c.int(key, { min: 1, max: LIMITS.experts });
  const used = c.int("num_experts_per_tok", { min: 1, max: experts });
  const feedForward = c.int("moe_intermediate_size", { min: 1, max: LIMITS.feedForward });
  const dense = c.raw("mlp_only_layers");
  if (Array.isArray(dense) && dense.length > 0) refuse("mlp_only_layers", `lists dense ` +
    `layers; ${arch} runtimes run a mixture of experts in every layer`);
  if (c.int("decoder_sparse_step", { min: 1, fallback: 1 }) !== 1) refuse("decoder_sparse_step",
    `is not 1; ${arch} runtimes run a mixture of experts in every layer`);
  if (!c.bool("norm_topk_prob", false)) refuse("norm_topk_prob", `is false; ${arch} runtimes ` +
    "renormalise the chosen experts' probabilities to sum to 1");
  return { experts, used, feedForward };
}

/** The RoPE variants a llama-like GGUF runtime computes (llama3: the rope_freqs tensor). */
const DECODER_ROPE = ["default", "linear", "llama3", "dynamic"] as const;

function decoderPlan(c: HfConfig, o: DecoderOptions): ArchitecturePlan {
  refusedSettings(c, {
    arch: o.arch, activation: { key: "hidden_act", name: "silu" },
    refuseAttentionBias: o.refuseAttentionBias,
    qwenSlidingWindow: o.qwenSlidingWindow, runsSlidingWindow: false,
  } satisfies ConfigRules);
  const s = c.decoderShape();
  const tied = c.bool("tie_word_embeddings", o.tiedDefault);
  const rope = c.rope(10_000);
  checkRope(c, rope, o.arch, o.yarn ? [...DECODER_ROPE, "yarn"] : DECODER_ROPE);
  const a = o.arch, e = s.embedding, q = s.heads * s.headDim, kv = s.kvHeads * s.headDim;
  const metadata: [string, GgufTypedValue][] = [
    [`${a}.block_count`, gguf.u32(s.layers)],
    [`${a}.context_length`, gguf.u32(s.contextLength)],
    [`${a}.embedding_length`, gguf.u32(e)],
    [`${a}.feed_forward_length`, gguf.u32(s.feedForward)],
    [`${a}.attention.head_count`, gguf.u32(s.heads)],
    [`${a}.attention.head_count_kv`, gguf.u32(s.kvHeads)],
    [`${a}.rope.freq_base`, gguf.f32(rope.theta)],
    [`${a}.attention.layer_norm_rms_epsilon`, gguf.f32(s.normEps)],
  ];
  if (c.has("head_dim")) {
    metadata.push([`${a}.attention.key_length`, gguf.u32(s.headDim)],
      [`${a}.attention.value_length`, gguf.u32(s.headDim)]);
  }
  if (o.writeVocabSize) metadata.push([`${a}.vocab_size`, gguf.u32(s.vocab)]);
  if (o.writeRopeDims) metadata.push([`${a}.rope.dimension_count`, gguf.u32(s.headDim)]);
  const moe = o.moe ? moeShape(c, a) : null;
  if (moe) {
    metadata.push([`${a}.expert_count`, gguf.u32(moe.experts)],
      [`${a}.expert_used_count`, gguf.u32(moe.used)],
      [`${a}.expert_feed_forward_length`, gguf.u32(moe.feedForward)]);
  }
  metadata.push(...(rope.type === "yarn" ? yarnMetadata(c, a, rope) : ropeScalingMetadata(a, rope)));

  const t: PlannedTensor[] = [];
  const add = (name: string, dims: number[], source: string | null, required = true,
    transform?: (d: Float32Array) => Float32Array) => t.push({ name, dims, source, required,
      transform });
  add("token_embd.weight", [e, s.vocab], "model.embed_tokens.weight");
  add("output_norm.weight", [e], "model.norm.weight");
  if (!tied) add("output.weight", [e, s.vocab], "lm_head.weight");
  if (rope.type === "llama3") {
    const factors = llama3RopeFactors(rope, s.headDim);
    add("rope_freqs.weight", [s.headDim / 2], null, true, () => factors);
  }
  const permuteQ = o.permuteQk ? (d: Float32Array) => permuteRope(d, s.heads, s.headDim)
    : undefined;
  const permuteK = o.permuteQk ? (d: Float32Array) => permuteRope(d, s.kvHeads, s.headDim)
    : undefined;
  for (let i = 0; i < s.layers; i++) {
    const p = `blk.${i}`, h = `model.layers.${i}`;
    add(`${p}.attn_norm.weight`, [e], `${h}.input_layernorm.weight`);
    add(`${p}.attn_q.weight`, [e, q], `${h}.self_attn.q_proj.weight`, true, permuteQ);
    add(`${p}.attn_k.weight`, [e, kv], `${h}.self_attn.k_proj.weight`, true, permuteK);
    add(`${p}.attn_v.weight`, [e, kv], `${h}.self_attn.v_proj.weight`);
    if (o.qkvBias !== "none") {
      const required = o.qkvBias === "required";
      add(`${p}.attn_q.bias`, [q], `${h}.self_attn.q_proj.bias`, required, permuteQ);
      add(`${p}.attn_k.bias`, [kv], `${h}.self_attn.k_proj.bias`, required, permuteK);
      add(`${p}.attn_v.bias`, [kv], `${h}.self_attn.v_proj.bias`, required);
    }
    add(`${p}.attn_output.weight`, [q, e], `${h}.self_attn.o_proj.weight`);
    if (o.qkNorm) {
      add(`${p}.attn_q_norm.weight`, [s.headDim], `${h}.self_attn.q_norm.weight`);
      add(`${p}.attn_k_norm.weight`, [s.headDim], `${h}.self_attn.k_norm.weight`);
    }
    add(`${p}.ffn_norm.weight`, [e], `${h}.post_attention_layernorm.weight`);
    if (moe) {
      const f = moe.feedForward, n = moe.experts;
      const experts = (proj: string) =>
        Array.from({ length: n }, (_, x) => `${h}.mlp.experts.${x}.${proj}.weight`);
      add(`${p}.ffn_gate_inp.weight`, [e, n], `${h}.mlp.gate.weight`);
      t.push({ name: `${p}.ffn_gate_exps.weight`, dims: [e, f, n], source: null, required: true,
        stacked: experts("gate_proj") });
      t.push({ name: `${p}.ffn_up_exps.weight`, dims: [e, f, n], source: null, required: true,
        stacked: experts("up_proj") });
      t.push({ name: `${p}.ffn_down_exps.weight`, dims: [f, e, n], source: null, required: true,
        stacked: experts("down_proj") });
      continue;
    }
    add(`${p}.ffn_gate.weight`, [e, s.feedForward], `${h}.mlp.gate_proj.weight`);
    add(`${p}.ffn_up.weight`, [e, s.feedForward], `${h}.mlp.up_proj.weight`);
    add(`${p}.ffn_down.weight`, [s.feedForward, e], `${h}.mlp.down_proj.weight`);
  }
  return {
    architecture: a, metadata, tensors: t,
    ignored: (n) => n.endsWith(".rotary_emb.inv_freq") || (tied && n === "lm_head.weight"),
  };
}

/**
 * Hugging Face keeps Q and K rows in "rotate half" order (pair i = rows i, i + d/2 of a head);
 * llama.cpp runs Llama with normal RoPE (pair i = rows 2i, 2i+1), so the converter interleaves
 * the two halves of every head: new row 2i + j = old row j·d/2 + i (convert_hf_to_gguf's permute).
 */
export function permuteRope(data: Float32Array, heads: number, headDim: number): Float32Array {
  const rowLength = data.length / (heads * headDim), half = headDim / 2;
  if (!Number.isInteger(rowLength)) throw new InferError("bad_model",
    "Q/K tensor size is not heads × head_dim rows");
  const out = new Float32Array(data.length);
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < half; i++) {
      for (let j = 0; j < 2; j++) {
        const from = (h * headDim + j * half + i) * rowLength, to = (
          h * headDim + 2 * i + j) * rowLength;
        out.set(data.subarray(from, from + rowLength), to);
      }
    }
  }
  return out;
}

/**
 * Llama 3.1's RoPE scaling as per-pair divisors of the angle (Meta's reference code; llama.cpp
 * stores them as rope_freqs): high frequencies are kept, low ones divided by `factor`, and the
 * band between interpolated smoothly by wavelength against the original context.
 */
export function llama3RopeFactors(rope: RopeParameters, headDim: number): Float32Array {
  const num = (k: string, fallback: number): number => {
    const v = rope.raw[k];
    if (v === undefined || v === null) return fallback;
    if (typeof v !== "number" || !Number.isFinite(v)) {
      throw new InferError("bad_model", `config.json: rope parameter '${k}' is not a number`);
    }
    return v;
  };
  const factor = num("factor", 8), low = num("low_freq_factor", 1), high = num("high_freq_factor", 4);
  const original = num("original_max_position_embeddings", 8192);
  const lowWavelength = original / low, highWavelength = original / high;
  const out = new Float32Array(headDim / 2);
  for (let i = 0; i < out.length; i++) {
    const freq = 1 / Math.pow(rope.theta, (2 * i) / headDim);
    const wavelength = (2 * Math.PI) / freq;
    if (wavelength < highWavelength) out[i] = 1;
    else if (wavelength > lowWavelength) out[i] = factor;
    else {
      const smooth = (original / wavelength - low) / (high - low);
      out[i] = 1 / ((1 - smooth) / factor + smooth);
    }
  }
  return out;
}

/** rope.scaling.* as convert_hf_to_gguf writes them (llama3 becomes the rope_freqs tensor). */
function ropeScalingMetadata(a: string, rope: RopeParameters): [string, GgufTypedValue][] {
  if (rope.type !== "linear") return []; // checkRope let through only what needs no keys
  return [[`${a}.rope.scaling.type`, gguf.str("linear")],
    [`${a}.rope.scaling.factor`, gguf.f32(rope.raw.factor as number)]];
}

/**
 * YaRN's keys as convert_hf_to_gguf writes them for Ministral 3 (mscale_all_dim as
 * yarn_log_multiplier). llama.cpp's attention factor is get_mscale(factor, 1) / get_mscale(factor,
 * log multiplier), transformers' get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
 * where both are set and get_mscale(factor) otherwise: the same where mscale is 1 or
 * mscale_all_dim unset, so other settings are refused, as are those with no GGUF key.
 */
function yarnMetadata(c: HfConfig, a: string, rope: RopeParameters): [string, GgufTypedValue][] {
  const r = rope.raw;
  const unsupported = (key: string, why: string): never => {
    throw new InferError("unsupported", `${c.path}: 'rope_parameters.${key}' ${why}`);
  };
  for (const key of ["attention_factor", "extrapolation_factor"]) {
    if (r[key] !== undefined && r[key] !== null) unsupported(key, `is set; ${a} runtimes ` +
      "compute YaRN's attention factor from factor, mscale and mscale_all_dim");
  }
  // transformers ramps between unrounded correction dims where truncate is false; ggml rounds.
  if (r.truncate === false) unsupported("truncate", `is false; ${a} runtimes round YaRN's ` +
    "correction range as ggml does");
  const factor = r.factor, original = r.original_max_position_embeddings;
  if (typeof factor !== "number" || !(factor > 1)) unsupported("factor",
    "must be a number above 1 for YaRN");
  if (typeof original !== "number" || !(original >= 1)) unsupported(
    "original_max_position_embeddings", "must be a positive number for YaRN");
  const metadata: [string, GgufTypedValue][] = [[`${a}.rope.scaling.type`, gguf.str("yarn")],
    [`${a}.rope.scaling.factor`, gguf.f32(factor as number)],
    [`${a}.rope.scaling.original_context_length`, gguf.u32(original as number)]];
  for (const [key, name] of [["beta_fast", "yarn_beta_fast"], ["beta_slow", "yarn_beta_slow"]]) {
    const v = r[key];
    if (v === undefined || v === null) continue;
    if (typeof v !== "number" || !(v > 0)) unsupported(key, "is not a positive number");
    metadata.push([`${a}.rope.scaling.${name}`, gguf.f32(v as number)]);
  }
  const all = r.mscale_all_dim;
  if (all !== undefined && all !== null && all !== 0) {
    if (typeof all !== "number" || !(all > 0)) unsupported("mscale_all_dim", "is not a positive number");
    if (r.mscale !== 1) unsupported("mscale", `is ${JSON.stringify(r.mscale ?? null)} beside ` +
      `mscale_all_dim; ${a} runtimes compute YaRN's attention factor with mscale 1`);
    metadata.push([`${a}.rope.scaling.yarn_log_multiplier`, gguf.f32(all as number)]);
  }
  return metadata;
}

// ---- Mistral 3 / Ministral 3 (text) -----------------------------------------------------------

/**
 * Ministral3ForCausalLM (model_type ministral3), as convert_hf_to_gguf's Ministral3Model writes
 * it: Llama's tensors (Q/K rows permuted for normal RoPE), YaRN (yarnMetadata) and
 * llama_4_scaling_beta as attention.temperature_scale, the queries' temperature past
 * original_max_position_embeddings.
 */
function mistral3Plan(c: HfConfig): ArchitecturePlan {
  const a = "mistral3";
  const plan = decoderPlan(c, {
    arch: a, permuteQk: true, qkNorm: false, qkvBias: "none", tiedDefault: false,
    writeRopeDims: true, writeVocabSize: true, qwenSlidingWindow: false,
    refuseAttentionBias: true, yarn: true,
  });
  const rope = c.rope(1_000_000);
  const beta = rope.raw.llama_4_scaling_beta;
  if (beta === undefined || beta === null || beta === 0) return plan;
  if (typeof beta !== "number" || !(beta > 0)) throw new InferError("bad_model",
    `${c.path}: 'rope_parameters.llama_4_scaling_beta' is not a positive number`);
  // The temperature's floor is original_max_position_embeddings, which the GGUF carries as
  // YaRN's original context only.
  if (rope.type !== "yarn") throw new InferError("unsupported", `${c.path}: ` +
    `'rope_parameters.llama_4_scaling_beta' without YaRN; ${a} runtimes take its floor from YaRN's original context`);
  return { ...plan, metadata: [...plan.metadata, [`${a}.attention.temperature_scale`, gguf.f32(beta)]] };
}

// ---- Gemma 3 (text) -------------------------------------------------------------------------

/** The global layers' RoPE variants the gemma3 runtimes compute (they read only a factor). */
const GEMMA3_ROPE = ["default", "linear", "dynamic"] as const;

/** What infer's and llama.cpp's gemma3 runtimes fix rather than read from the GGUF. */
const GEMMA3_FIXED = { slidingPattern: 6, localRopeTheta: 10_000 } as const;

/**
 * Gemma3ForCausalLM (model_type gemma3_text), as convert_hf_to_gguf's Gemma3Model writes it:
 * sandwich norms, QK-norm, tied embeddings by default, and every norm weight stored as 1 + w
 * because Gemma3RMSNorm multiplies by (1 + w) (added in f32, as transformers computes it and as
 * the converter does for F32/BF16 checkpoints; for F16 ones it adds in f16). The
 * GGUF has no keys for the layer pattern, the local RoPE base or query_pre_attn_scalar, so a
 * config that departs from what the runtimes assume is refused rather than converted wrongly.
 */
function gemma3Plan(c: HfConfig): ArchitecturePlan {
  const a = "gemma3", s = c.decoderShape();
  const unsupported = (key: string, why: string): never => {
    throw new InferError("unsupported", `${c.path}: '${key}' ${why}`);
  };
  refusedSettings(c, {
    arch: a, activation: { key: "hidden_activation", name: "gelu_pytorch_tanh" },
    refuseAttentionBias: true, qwenSlidingWindow: false, runsSlidingWindow: true,
  });
  if (c.bool("use_bidirectional_attention", false)) unsupported("use_bidirectional_attention",
    "is true; only causal attention is supported");
  const scalar = c.int("query_pre_attn_scalar", { min: 1, fallback: s.headDim });
  if (scalar !== s.headDim) unsupported("query_pre_attn_scalar",
    `is ${scalar}; the GGUF runtimes scale attention by 1/sqrt(head_dim = ${s.headDim})`);
  checkGemma3Layers(c, s.layers, unsupported);
  const rope = c.rope(1_000_000);
  checkRope(c, rope, a, GEMMA3_ROPE);
  const window = c.int("sliding_window", { min: 1, max: LIMITS.context });
  const tied = c.bool("tie_word_embeddings", true);
  const e = s.embedding, q = s.heads * s.headDim, kv = s.kvHeads * s.headDim;
  const metadata: [string, GgufTypedValue][] = [
    [`${a}.context_length`, gguf.u32(c.int("max_position_embeddings", { min: 1,
      max: LIMITS.context, fallback: 131_072 }))],
    [`${a}.embedding_length`, gguf.u32(e)],
    [`${a}.block_count`, gguf.u32(s.layers)],
    [`${a}.feed_forward_length`, gguf.u32(s.feedForward)],
    [`${a}.attention.head_count`, gguf.u32(s.heads)],
    [`${a}.attention.head_count_kv`, gguf.u32(s.kvHeads)],
    [`${a}.attention.layer_norm_rms_epsilon`, gguf.f32(s.normEps)],
    [`${a}.attention.key_length`, gguf.u32(s.headDim)],
    [`${a}.attention.value_length`, gguf.u32(s.headDim)],
    [`${a}.rope.freq_base`, gguf.f32(rope.theta)],
    [`${a}.rope.freq_base_swa`, gguf.f32(GEMMA3_FIXED.localRopeTheta)],
    [`${a}.attention.sliding_window`, gguf.u32(window)],
    ...ropeScalingMetadata(a, rope),
  ];
  const t: PlannedTensor[] = [];
  const add = (name: string, dims: number[], source: string) => t.push({
    name, dims, source, required: true,
    transform: name.endsWith("norm.weight") ? addOne : undefined,
  });
  add("token_embd.weight", [e, s.vocab], "model.embed_tokens.weight");
  add("output_norm.weight", [e], "model.norm.weight");
  if (!tied) add("output.weight", [e, s.vocab], "lm_head.weight");
  for (let i = 0; i < s.layers; i++) {
    const p = `blk.${i}`, h = `model.layers.${i}`;
    add(`${p}.attn_norm.weight`, [e], `${h}.input_layernorm.weight`);
    add(`${p}.attn_q.weight`, [e, q], `${h}.self_attn.q_proj.weight`);
    add(`${p}.attn_k.weight`, [e, kv], `${h}.self_attn.k_proj.weight`);
    add(`${p}.attn_v.weight`, [e, kv], `${h}.self_attn.v_proj.weight`);
    add(`${p}.attn_q_norm.weight`, [s.headDim], `${h}.self_attn.q_norm.weight`);
    add(`${p}.attn_k_norm.weight`, [s.headDim], `${h}.self_attn.k_norm.weight`);
    add(`${p}.attn_output.weight`, [q, e], `${h}.self_attn.o_proj.weight`);
    add(`${p}.post_attention_norm.weight`, [e], `${h}.post_attention_layernorm.weight`);
    add(`${p}.ffn_norm.weight`, [e], `${h}.pre_feedforward_layernorm.weight`);
    add(`${p}.ffn_gate.weight`, [e, s.feedForward], `${h}.mlp.gate_proj.weight`);
    add(`${p}.ffn_up.weight`, [e, s.feedForward], `${h}.mlp.up_proj.weight`);
    add(`${p}.ffn_down.weight`, [s.feedForward, e], `${h}.mlp.down_proj.weight`);
    add(`${p}.post_ffw_norm.weight`, [e], `${h}.post_feedforward_layernorm.weight`);
  }
  return {
    architecture: a, metadata, tensors: t,
    ignored: (n) => n.endsWith(".rotary_emb.inv_freq") || n.endsWith(".rotary_emb_local.inv_freq")
      || (tied && n === "lm_head.weight"),
    tokenizer: { addSpacePrefix: false },
  };
}

/** Gemma's RMSNorm scales by (1 + w); GGUF runtimes scale by the stored weight. */
function addOne(data: Float32Array): Float32Array {
  for (let i = 0; i < data.length; i++) data[i] += 1;
  return data;
}

/** Local layers must be the 5-of-6 pattern with RoPE base 10k, which the runtimes hard-code. */
function checkGemma3Layers(c: HfConfig, layers: number,
  unsupported: (key: string, why: string) => never): void {
  const types = c.raw("layer_types");
  if (types !== undefined && types !== null) {
    if (!Array.isArray(types) || types.length !== layers) unsupported("layer_types",
      `is not a list of ${layers} layer types`);
    types.forEach((type, i) => {
      const want = i % GEMMA3_FIXED.slidingPattern === GEMMA3_FIXED.slidingPattern - 1
        ? "full_attention" : "sliding_attention";
      if (type !== want) unsupported("layer_types", `[${i}] is ${JSON.stringify(type)}; Gemma 3 ` +
        `runtimes make layer i global exactly when i % 6 == 5 (expected "${want}")`);
    });
  } else {
    const pattern = c.int("sliding_window_pattern", { fallback: GEMMA3_FIXED.slidingPattern });
    if (pattern !== GEMMA3_FIXED.slidingPattern) unsupported("sliding_window_pattern",
      `is ${pattern}; Gemma 3 runtimes use 6`);
  }
  const params = c.raw("rope_parameters") as Record<string, unknown> | undefined | null;
  const local = (params?.sliding_attention ?? {}) as Record<string, unknown>;
  const theta = local.rope_theta ?? c.raw("rope_local_base_freq") ?? GEMMA3_FIXED.localRopeTheta;
  if (theta !== GEMMA3_FIXED.localRopeTheta) unsupported("rope_local_base_freq",
    `is ${JSON.stringify(theta)}; Gemma 3 runtimes rotate local layers with base 10000`);
  const localType = local.rope_type ?? "default";
  if (localType !== "default") unsupported("rope_parameters.sliding_attention.rope_type",
    `is ${JSON.stringify(localType)}; local layers are not scaled`);
}

// ---- Phi-3 / Phi-4 (dense) ----------------------------------------------------------------------

/**
 * Phi3ForCausalLM, as convert_hf_to_gguf's Phi3MiniModel writes it: attn_qkv and ffn_up (gate
 * then up) stay fused as the checkpoint holds them, NeoX RoPE over rope.dimension_count values of
 * each head (partial_rotary_factor), and for LongRoPE the long and short factors as
 * rope_factors_long / rope_factors_short with rope.scaling.attn_factor. The attention factor is
 * transformers' (its attention_factor where the config sets one, else from factor or
 * max / original positions); llama.cpp's converter computes the latter only, the same for every
 * released Phi-3 config. The sliding window is written as llama.cpp does; its phi3 and infer's
 * do not apply it.
 */
function phi3Plan(c: HfConfig): ArchitecturePlan {
  const a = "phi3", s = c.decoderShape();
  refusedSettings(c, {
    arch: a, activation: { key: "hidden_act", name: "silu" }, refuseAttentionBias: true,
    qwenSlidingWindow: false, runsSlidingWindow: true,
  });
  const unsupported = (key: string, why: string): never => {
    throw new InferError("unsupported", `${c.path}: '${key}' ${why}`);
  };
  const e = s.embedding, q = s.heads * s.headDim, kv = s.kvHeads * s.headDim;
  if (q !== e) unsupported("head_dim", `makes the queries ${q} wide, not the embedding of ${e}; ` +
    "phi3 runtimes size attn_qkv by the embedding");
  const rope = c.rope(10_000);
  if (rope.type !== "default" && rope.type !== "longrope" && rope.type !== "su") {
    unsupported("rope_parameters.rope_type", `is ${JSON.stringify(rope.type)}; phi3 runtimes ` +
      "compute default RoPE and LongRoPE");
  }
  const partial = rope.raw.partial_rotary_factor ?? c.raw("partial_rotary_factor") ?? 1;
  if (typeof partial !== "number" || !(partial > 0 && partial <= 1)) {
    unsupported("partial_rotary_factor", `is ${JSON.stringify(partial)}, not in (0, 1]`);
  }
  const rotaryDims = Math.floor(s.headDim * (partial as number));
  if (rotaryDims < 2 || rotaryDims % 2 !== 0) unsupported("partial_rotary_factor",
    `rotates ${rotaryDims} of a head's ${s.headDim} values; RoPE rotates pairs`);
  const window = c.has("sliding_window") && c.raw("sliding_window") !== null
    ? c.int("sliding_window", { min: 0 }) : 0;
  const metadata: [string, GgufTypedValue][] = [
    [`${a}.context_length`, gguf.u32(s.contextLength)],
    [`${a}.embedding_length`, gguf.u32(e)],
    [`${a}.feed_forward_length`, gguf.u32(s.feedForward)],
    [`${a}.block_count`, gguf.u32(s.layers)],
    [`${a}.attention.head_count`, gguf.u32(s.heads)],
    [`${a}.attention.head_count_kv`, gguf.u32(s.kvHeads)],
    [`${a}.attention.layer_norm_rms_epsilon`, gguf.f32(s.normEps)],
    [`${a}.rope.dimension_count`, gguf.u32(rotaryDims)],
    [`${a}.rope.freq_base`, gguf.f32(rope.theta)],
    [`${a}.attention.sliding_window`, gguf.u32(window)],
  ];
  const t: PlannedTensor[] = [];
  const add = (name: string, dims: number[], source: string | null,
    transform?: (d: Float32Array) => Float32Array) => t.push({ name, dims, source,
      required: true, transform });
  add("token_embd.weight", [e, s.vocab], "model.embed_tokens.weight");
  add("output_norm.weight", [e], "model.norm.weight");
  if (!s.tied) add("output.weight", [e, s.vocab], "lm_head.weight");
  if (rope.type !== "default") {
    const original = c.int("original_max_position_embeddings", { min: 1, max: LIMITS.context,
      fallback: typeof rope.raw.original_max_position_embeddings === "number"
        ? rope.raw.original_max_position_embeddings : s.contextLength });
    metadata.push([`${a}.rope.scaling.original_context_length`, gguf.u32(original)],
      [`${a}.rope.scaling.attn_factor`, gguf.f32(longRopeAttentionFactor(c, rope, s.contextLength,
        original))]);
    for (const which of ["long", "short"] as const) {
      const factors = ropeFactorList(c, rope, `${which}_factor`, rotaryDims / 2);
      add(`rope_factors_${which}.weight`, [rotaryDims / 2], null, () => factors);
    }
  }
  for (let i = 0; i < s.layers; i++) {
    const p = `blk.${i}`, h = `model.layers.${i}`;
    add(`${p}.attn_norm.weight`, [e], `${h}.input_layernorm.weight`);
    add(`${p}.attn_qkv.weight`, [e, q + 2 * kv], `${h}.self_attn.qkv_proj.weight`);
    add(`${p}.attn_output.weight`, [q, e], `${h}.self_attn.o_proj.weight`);
    add(`${p}.ffn_norm.weight`, [e], `${h}.post_attention_layernorm.weight`);
    add(`${p}.ffn_up.weight`, [e, 2 * s.feedForward], `${h}.mlp.gate_up_proj.weight`);
    add(`${p}.ffn_down.weight`, [s.feedForward, e], `${h}.mlp.down_proj.weight`);
  }
  return {
    architecture: a, metadata, tensors: t,
    ignored: (n) => n.endsWith(".rotary_emb.inv_freq") || (s.tied && n === "lm_head.weight"),
  };
}

/** LongRoPE's scale on cos and sin, as transformers' _compute_longrope_parameters sets it. */
function longRopeAttentionFactor(c: HfConfig, rope: RopeParameters, context: number,
  original: number): number {
  const given = rope.raw.attention_factor;
  if (given !== undefined && given !== null) {
    if (typeof given !== "number" || !(given > 0)) throw new InferError("bad_model",
      `${c.path}: rope parameter 'attention_factor' is not a positive number`);
    return given;
  }
  const factor = typeof rope.raw.factor === "number" ? rope.raw.factor : context / original;
  return factor <= 1 ? 1 : Math.sqrt(1 + Math.log(factor) / Math.log(original));
}

function ropeFactorList(c: HfConfig, rope: RopeParameters, key: string, count: number):
  Float32Array {
  const v = rope.raw[key];
  if (!Array.isArray(v) || v.length !== count || v.some((x) => typeof x !== "number" || !(x > 0))) {
    throw new InferError("bad_model", `${c.path}: rope parameter '${key}' is not a list of ` +
      `${count} positive numbers (half the rotated values of a head)`);
  }
  return Float32Array.from(v as number[]);
}

const architectures: readonly Architecture[] = [
  {
    gguf: "llama", hfClasses: ["LlamaForCausalLM", "LLaMAForCausalLM", "MistralForCausalLM"],
    plan: (c) => decoderPlan(c, {
      arch: "llama", permuteQk: true, qkNorm: false, qkvBias: "optional", tiedDefault: false,
      writeRopeDims: true, writeVocabSize: true, qwenSlidingWindow: false,
      refuseAttentionBias: true,
    }),
  },
  {
    gguf: "qwen2", hfClasses: ["Qwen2ForCausalLM"],
    plan: (c) => decoderPlan(c, {
      arch: "qwen2", permuteQk: false, qkNorm: false, qkvBias: "required", tiedDefault: false,
      writeRopeDims: false, writeVocabSize: false, qwenSlidingWindow: true,
      // transformers' Qwen2 reads no attention_bias: q/k/v always have biases, o never
      refuseAttentionBias: false,
    }),
  },
  {
    gguf: "qwen3", hfClasses: ["Qwen3ForCausalLM"],
    plan: (c) => decoderPlan(c, {
      arch: "qwen3", permuteQk: false, qkNorm: true, qkvBias: "none", tiedDefault: false,
      writeRopeDims: false, writeVocabSize: false, qwenSlidingWindow: true,
      refuseAttentionBias: true,
    }),
  },
  {
    gguf: "qwen3moe", hfClasses: ["Qwen3MoeForCausalLM"],
    plan: (c) => decoderPlan(c, {
      arch: "qwen3moe", permuteQk: false, qkNorm: true, qkvBias: "none", tiedDefault: false,
      writeRopeDims: false, writeVocabSize: false, qwenSlidingWindow: true,
      refuseAttentionBias: true, moe: true,
    }),
  },
  { gguf: "gemma3", hfClasses: ["Gemma3ForCausalLM"], plan: gemma3Plan },
  { gguf: "gemma3n", hfClasses: ["Gemma3nForCausalLM"], plan: gemma3nPlan },
  { gguf: "phi3", hfClasses: ["Phi3ForCausalLM"], plan: phi3Plan },
  { gguf: "mistral3", hfClasses: ["Ministral3ForCausalLM"], plan: mistral3Plan },
  { gguf: "gpt-oss", hfClasses: ["GptOssForCausalLM"], plan: gptossPlan },
];

export function supportedHfClasses(): string[] {
  return architectures.flatMap((a) => a.hfClasses);
}

/** The conversion plan for the folder's config, or an error naming the unsupported class. */
export function planConversion(c: HfConfig): ArchitecturePlan {
  const hfClass = c.architecture();
  const arch = architectures.find((a) => a.hfClasses.includes(hfClass));
  if (!arch) {
    throw new InferError("unsupported", `${c.path}: architecture '${hfClass}' is not supported ` +
      `(supported: ${supportedHfClasses().join(", ")})`);
  }
  return arch.plan(c);
}
