// GptOssForCausalLM (gpt-oss), as llama.cpp's convert_hf_to_gguf (GptOssModel) writes an
// unquantized checkpoint: the experts' fused gate_up_proj ([experts, hidden, 2 · ff], gate and
// up interleaved along the last axis, stored input-major) split into ffn_gate_exps and
// ffn_up_exps and transposed, down_proj transposed, the gate_up bias split the same way, the
// router as ffn_gate_inp with its bias, the sinks as attn_sinks.weight, and the norm before the
// experts as post_attention_norm. Settings the gpt-oss GGUF cannot carry are refused.
import { InferError } from "../errors.ts";
import { gguf, type GgufTypedValue } from "../gguf/writer.ts";
import { LIMITS } from "../model/hparams.ts";
import type { ArchitecturePlan, PlannedTensor } from "./architectures.ts";
import { refusedSettings } from "./config-checks.ts";
import type { HfConfig } from "./hf-config.ts";

/** What the gpt-oss runtimes fix: the clamped SwiGLU's constants (ggml's swiglu_oai). */
const SWIGLU = { alpha: 1.702, limit: 7 } as const;

/** One of the interleaved halves (0: gate, 1: up) of [experts][rows][2 · n], as [experts][n][rows]. */
function splitExperts(data: Float32Array, experts: number, rows: number, n: number,
  which: 0 | 1): Float32Array {
  const out = new Float32Array(experts * n * rows);
  for (let e = 0; e < experts; e++) {
    for (let r = 0; r < rows; r++) {
      const from = (e * rows + r) * 2 * n + which;
      for (let f = 0; f < n; f++) out[(e * n + f) * rows + r] = data[from + 2 * f];
    }
  }
  return out;
}

/** [experts][a][b] as [experts][b][a]. */
function transposeExperts(data: Float32Array, experts: number, a: number, b: number): Float32Array {
  const out = new Float32Array(experts * a * b);
  for (let e = 0; e < experts; e++) {
    for (let i = 0; i < a; i++) {
      for (let j = 0; j < b; j++) out[(e * b + j) * a + i] = data[(e * a + i) * b + j];
    }
  }
  return out;
}

/** One interleaved half of [experts][2 · n] biases, as [experts][n]. */
function splitBiases(data: Float32Array, experts: number, n: number, which: 0 | 1): Float32Array {
  const out = new Float32Array(experts * n);
  for (let e = 0; e < experts; e++) {
    for (let f = 0; f < n; f++) out[e * n + f] = data[e * 2 * n + 2 * f + which];
  }
  return out;
}

export function gptossPlan(c: HfConfig): ArchitecturePlan {
  const a = "gpt-oss", s = c.decoderShape();
  refusedSettings(c, {
    arch: a, activation: { key: "hidden_act", name: "silu" }, refuseAttentionBias: false,
    qwenSlidingWindow: false, runsSlidingWindow: true,
  });
  const unsupported = (key: string, why: string): never => {
    throw new InferError("unsupported", `${c.path}: '${key}' ${why}`);
  };
  if (!c.bool("attention_bias", true)) unsupported("attention_bias", "is false; gpt-oss " +
    "runtimes require q/k/v/o biases");
  for (const [key, want] of [["swiglu_alpha", SWIGLU.alpha], ["swiglu_limit", SWIGLU.limit]] as const) {
    const v = c.float(key, want);
    if (v !== want) unsupported(key, `is ${v}; gpt-oss runtimes fix it at ${want}`);
  }
  const experts = c.int(c.has("num_local_experts") ? "num_local_experts" : "num_experts",
    { min: 1, max: LIMITS.experts });
  const used = c.int("num_experts_per_tok", { min: 1, max: experts });
  const window = c.int("sliding_window", { min: 1, max: LIMITS.context });
  const types = c.raw("layer_types");
  if (types !== undefined && types !== null) {
    if (!Array.isArray(types) || types.length !== s.layers) unsupported("layer_types",
      `is not a list of ${s.layers} layer types`);
    (types as unknown[]).forEach((type, i) => {
      const want = i % 2 === 0 ? "sliding_attention" : "full_attention";
      if (type !== want) unsupported("layer_types", `[${i}] is ${JSON.stringify(type)}; gpt-oss ` +
        `runtimes slide exactly the even layers (expected "${want}")`);
    });
  }
  const rope = c.rope(150_000);
  const e = s.embedding, q = s.heads * s.headDim, kv = s.kvHeads * s.headDim, f = s.feedForward;
  const metadata: [string, GgufTypedValue][] = [
    [`${a}.block_count`, gguf.u32(s.layers)],
    [`${a}.context_length`, gguf.u32(s.contextLength)],
    [`${a}.embedding_length`, gguf.u32(e)],
    [`${a}.feed_forward_length`, gguf.u32(f)],
    [`${a}.attention.head_count`, gguf.u32(s.heads)],
    [`${a}.attention.head_count_kv`, gguf.u32(s.kvHeads)],
    [`${a}.rope.freq_base`, gguf.f32(rope.theta)],
    [`${a}.attention.layer_norm_rms_epsilon`, gguf.f32(s.normEps)],
    [`${a}.expert_count`, gguf.u32(experts)],
    [`${a}.expert_used_count`, gguf.u32(used)],
    [`${a}.attention.key_length`, gguf.u32(s.headDim)],
    [`${a}.attention.value_length`, gguf.u32(s.headDim)],
    [`${a}.attention.sliding_window`, gguf.u32(window)],
    [`${a}.expert_feed_forward_length`, gguf.u32(f)],
  ];
  if (rope.type === "yarn") {
    const r = rope.raw;
    for (const key of ["attention_factor", "extrapolation_factor", "mscale", "mscale_all_dim"]) {
      if (r[key] !== undefined && r[key] !== null) unsupported(`rope_parameters.${key}`,
        "is set; gpt-oss runtimes compute YaRN's attention factor from 'factor' alone");
    }
    const factor = r.factor;
    if (typeof factor !== "number" || !(factor > 1)) unsupported("rope_parameters.factor",
      "must be a number above 1 for YaRN");
    const original = r.original_max_position_embeddings;
    if (typeof original !== "number" || !(original >= 1)) unsupported(
      "rope_parameters.original_max_position_embeddings", "must be a positive number for YaRN");
    // 'truncate' (false in the released configs: transformers ramps between the unrounded
    // correction dims) has no GGUF key; llama.cpp and infer round them as ggml does.
    metadata.push([`${a}.rope.scaling.type`, gguf.str("yarn")],
      [`${a}.rope.scaling.factor`, gguf.f32(factor as number)],
      [`${a}.rope.scaling.original_context_length`, gguf.u32(original as number)]);
    for (const [key, name] of [["beta_fast", "yarn_beta_fast"], ["beta_slow", "yarn_beta_slow"]]) {
      const v = r[key];
      if (v === undefined || v === null) continue;
      if (typeof v !== "number" || !(v > 0)) unsupported(`rope_parameters.${key}`,
        "is not a positive number");
      metadata.push([`${a}.rope.scaling.${name}`, gguf.f32(v as number)]);
    }
  } else if (rope.type !== "default") {
    unsupported("rope_parameters.rope_type", `is ${JSON.stringify(rope.type)}; gpt-oss ` +
      "runtimes compute YaRN or plain RoPE");
  }

  const t: PlannedTensor[] = [];
  const add = (name: string, dims: number[], source: string,
    derive?: { shape: number[]; transform: (d: Float32Array) => Float32Array }) =>
    t.push({ name, dims, source, required: true, sourceShape: derive?.shape,
      transform: derive?.transform });
  add("token_embd.weight", [e, s.vocab], "model.embed_tokens.weight");
  add("output_norm.weight", [e], "model.norm.weight");
  if (!s.tied) add("output.weight", [e, s.vocab], "lm_head.weight");
  const n = experts;
  for (let i = 0; i < s.layers; i++) {
    const p = `blk.${i}`, h = `model.layers.${i}`, x = `${h}.mlp.experts`;
    add(`${p}.attn_norm.weight`, [e], `${h}.input_layernorm.weight`);
    for (const [name, proj, width] of [["attn_q", "q_proj", q], ["attn_k", "k_proj", kv],
      ["attn_v", "v_proj", kv]] as const) {
      add(`${p}.${name}.weight`, [e, width], `${h}.self_attn.${proj}.weight`);
      add(`${p}.${name}.bias`, [width], `${h}.self_attn.${proj}.bias`);
    }
    add(`${p}.attn_output.weight`, [q, e], `${h}.self_attn.o_proj.weight`);
    add(`${p}.attn_output.bias`, [e], `${h}.self_attn.o_proj.bias`);
    add(`${p}.attn_sinks.weight`, [s.heads], `${h}.self_attn.sinks`);
    add(`${p}.post_attention_norm.weight`, [e], `${h}.post_attention_layernorm.weight`);
    add(`${p}.ffn_gate_inp.weight`, [e, n], `${h}.mlp.router.weight`);
    add(`${p}.ffn_gate_inp.bias`, [n], `${h}.mlp.router.bias`);
    const gateUp = [n, e, 2 * f];
    add(`${p}.ffn_gate_exps.weight`, [e, f, n], `${x}.gate_up_proj`,
      { shape: gateUp, transform: (d) => splitExperts(d, n, e, f, 0) });
    add(`${p}.ffn_up_exps.weight`, [e, f, n], `${x}.gate_up_proj`,
      { shape: gateUp, transform: (d) => splitExperts(d, n, e, f, 1) });
    add(`${p}.ffn_down_exps.weight`, [f, e, n], `${x}.down_proj`,
      { shape: [n, f, e], transform: (d) => transposeExperts(d, n, f, e) });
    add(`${p}.ffn_gate_exps.bias`, [f, n], `${x}.gate_up_proj_bias`,
      { shape: [n, 2 * f], transform: (d) => splitBiases(d, n, f, 0) });
    add(`${p}.ffn_up_exps.bias`, [f, n], `${x}.gate_up_proj_bias`,
      { shape: [n, 2 * f], transform: (d) => splitBiases(d, n, f, 1) });
    add(`${p}.ffn_down_exps.bias`, [e, n], `${x}.down_proj_bias`);
  }
  return {
    architecture: a, metadata, tensors: t,
    ignored: (name) => name.endsWith(".rotary_emb.inv_freq") || (s.tied && name === "lm_head.weight"),
  };
}
