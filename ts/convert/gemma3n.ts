// Gemma3nForCausalLM (model_type gemma3n_text: Gemma 3n's text decoder), as llama.cpp's
// convert_hf_to_gguf (Gemma3NModel, conversion/gemma.py) writes it: the AltUp projections stacked
// into 3-D altup_proj / altup_unembd_proj, the per-layer token table (padded with zero rows to the
// vocabulary), norms as stored (Gemma 3n's RMSNorm scales by w, not 1 + w), the sparsity pattern
// as each layer's normal quantile (-inf for none), the layer types as one boolean per layer.
import { InferError } from "../errors.ts";
import { gguf, type GgufTypedValue } from "../gguf/writer.ts";
import { LIMITS } from "../model/hparams.ts";
import type { ArchitecturePlan, PlannedTensor } from "./architectures.ts";
import type { HfConfig } from "./hf-config.ts";

/**
 * The quantile of the standard normal at p, in f32, as transformers' Normal(0, 1).icdf computes
 * it: 0.95 (every released model's sparsity) is torch's float32 result itself, which llama.cpp
 * hard-codes; other p by Acklam's rational approximation (relative error below 1.2e-9).
 */
export function normalQuantile(p: number): number {
  if (p === 0.95) return 1.6448533535003662;
  if (p <= 0) return -Infinity;
  if (p >= 1) return Infinity;
  const a = [-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.357751867269,
    -30.66479806614716, 2.506628277459239];
  const b = [-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972,
    -13.28068155288572];
  const c = [-0.007784894002430293, -0.3223964580411365, -2.400758277161838, -2.549732539343734,
    4.374664141464968, 2.938163982698783];
  const d = [0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416];
  const tail = (q: number) => (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
    ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  let x: number;
  if (p < 0.02425) x = tail(Math.sqrt(-2 * Math.log(p)));
  else if (p > 1 - 0.02425) x = -tail(Math.sqrt(-2 * Math.log(1 - p)));
  else {
    const q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
      (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  }
  return Math.fround(x);
}

export function gemma3nPlan(c: HfConfig): ArchitecturePlan {
  const a = "gemma3n";
  const unsupported = (key: string, why: string): never => {
    throw new InferError("unsupported", `${c.path}: '${key}' ${why}`);
  };
  const bad = (key: string, why: string): never => {
    throw new InferError("bad_model", `${c.path}: '${key}' ${why}`);
  };
  if (c.raw("quantization_config") !== undefined && c.raw("quantization_config") !== null) {
    unsupported("quantization_config", "is set: import the unquantized model");
  }
  if (c.string("hidden_activation", "gelu_pytorch_tanh") !== "gelu_pytorch_tanh") {
    unsupported("hidden_activation", "is not gelu_pytorch_tanh; gemma3n runtimes compute GELU (tanh)");
  }
  if (c.bool("attention_bias", false)) unsupported("attention_bias", "is true; gemma3n has no biases");
  if (!c.bool("altup_correct_scale", true)) unsupported("altup_correct_scale",
    "is false; gemma3n runtimes always scale the corrected stream");
  const e = c.int("hidden_size", { min: 1, max: LIMITS.embedding });
  const heads = c.int("num_attention_heads", { min: 1, max: LIMITS.heads });
  const kvHeads = c.int("num_key_value_heads", { min: 1, max: heads, fallback: heads });
  const headDim = c.int("head_dim", { min: 2, max: LIMITS.headDim });
  const layers = c.int("num_hidden_layers", { min: 1, max: LIMITS.layers });
  const vocab = c.int("vocab_size", { min: 1, max: LIMITS.vocab });
  const perLayerVocab = c.int("vocab_size_per_layer_input", { min: 1, max: vocab, fallback: vocab });
  const P = c.int("hidden_size_per_layer_input", { min: 1, max: LIMITS.embedding });
  const rank = c.int("laurel_rank", { min: 1, max: e });
  const streams = c.int("altup_num_inputs", { min: 2, max: 16 });
  const active = c.int("altup_active_idx", { min: 0, max: streams - 1, fallback: 0 });
  const shared = c.int("num_kv_shared_layers", { min: 0, max: layers - 1, fallback: 0 });
  const window = c.int("sliding_window", { min: 1, max: LIMITS.context });
  const softcap = c.float("final_logit_softcapping", 30);
  const perLayer = (key: string, check: (v: unknown) => boolean): unknown[] => {
    const v = c.raw(key);
    if (!Array.isArray(v) || v.length !== layers || !v.every(check)) {
      return bad(key, `is not a list of ${layers} values`);
    }
    return v;
  };
  const ffRaw = c.raw("intermediate_size");
  const ff = (Array.isArray(ffRaw) ? perLayer("intermediate_size", Number.isInteger)
    : Array(layers).fill(c.int("intermediate_size", { min: 1, max: LIMITS.feedForward }))) as number[];
  if (ff.some((f) => !(f >= 1 && f <= LIMITS.feedForward))) bad("intermediate_size", "is out of range");
  const types = perLayer("layer_types", (t) => t === "sliding_attention" || t === "full_attention");
  const sparsity = perLayer("activation_sparsity_pattern",
    (s) => typeof s === "number" && s >= 0 && s < 1) as number[];
  const params = (c.raw("rope_parameters") ?? {}) as Record<string, Record<string, unknown>>;
  const theta = (kind: string, fallback: number): number => {
    const p = params[kind] ?? {};
    if ((p.rope_type ?? "default") !== "default") unsupported(`rope_parameters.${kind}.rope_type`,
      `is ${JSON.stringify(p.rope_type)}; gemma3n runtimes rotate without scaling`);
    const t = p.rope_theta ?? fallback;
    return typeof t === "number" && t > 0 ? t : bad(`rope_parameters.${kind}.rope_theta`, "is not positive");
  };
  const uniform = ff.every((f) => f === ff[0]);
  const metadata: [string, GgufTypedValue][] = [
    [`${a}.context_length`, gguf.u32(c.int("max_position_embeddings", { min: 1,
      max: LIMITS.context, fallback: 32_768 }))],
    [`${a}.embedding_length`, gguf.u32(e)],
    [`${a}.block_count`, gguf.u32(layers)],
    [`${a}.feed_forward_length`, uniform ? gguf.u32(ff[0]) : { type: "arr", element: "u32", value: ff }],
    [`${a}.attention.head_count`, gguf.u32(heads)],
    [`${a}.attention.head_count_kv`, gguf.u32(kvHeads)],
    [`${a}.attention.layer_norm_rms_epsilon`, gguf.f32(c.float("rms_norm_eps", 1e-6))],
    [`${a}.attention.key_length`, gguf.u32(headDim)],
    [`${a}.attention.value_length`, gguf.u32(headDim)],
    [`${a}.rope.freq_base`, gguf.f32(theta("full_attention", 1_000_000))],
    [`${a}.rope.freq_base_swa`, gguf.f32(theta("sliding_attention", 10_000))],
    [`${a}.attention.sliding_window`, gguf.u32(window)],
    [`${a}.final_logit_softcapping`, gguf.f32(softcap)],
    [`${a}.altup.active_idx`, gguf.u32(active)],
    [`${a}.altup.num_inputs`, gguf.u32(streams)],
    [`${a}.embedding_length_per_layer_input`, gguf.u32(P)],
    [`${a}.attention.shared_kv_layers`, gguf.u32(shared)],
    [`${a}.activation_sparsity_scale`, gguf.f32s(sparsity.map(normalQuantile))],
    [`${a}.attention.sliding_window_pattern`,
      { type: "arr", element: "bool", value: types.map((t) => t === "sliding_attention") }],
  ];
  const tied = c.bool("tie_word_embeddings", true);
  const q = heads * headDim, kv = kvHeads * headDim;
  const t: PlannedTensor[] = [];
  const add = (name: string, dims: number[], source: string, required = true) =>
    t.push({ name, dims, source, required });
  add("token_embd.weight", [e, vocab], "model.embed_tokens.weight");
  // The per-layer table's rows past vocab_size_per_layer_input (multimodal ids) are zeros.
  t.push({ name: "per_layer_token_embd.weight", dims: [layers * P, vocab],
    source: "model.embed_tokens_per_layer.weight", required: true,
    sourceShape: [perLayerVocab, layers * P], transform: (d) => {
      const out = new Float32Array(vocab * layers * P);
      out.set(d);
      return out;
    } });
  add("per_layer_model_proj.weight", [e, layers * P], "model.per_layer_model_projection.weight");
  add("per_layer_proj_norm.weight", [P], "model.per_layer_projection_norm.weight");
  for (const [name, hf] of [["altup_proj", "altup_projections"],
    ["altup_unembd_proj", "altup_unembed_projections"]]) {
    t.push({ name: `${name}.weight`, dims: [e, e, streams - 1], source: null, required: true,
      stacked: Array.from({ length: streams - 1 }, (_, i) => `model.${hf}.${i}.weight`) });
  }
  add("output_norm.weight", [e], "model.norm.weight");
  if (!tied) add("output.weight", [e, vocab], "lm_head.weight");
  for (let i = 0; i < layers; i++) {
    const p = `blk.${i}`, h = `model.layers.${i}`, f = ff[i];
    // transformers 5 neither builds nor saves a sharing layer's k/v; released checkpoints have them.
    const own = i < layers - shared;
    add(`${p}.attn_norm.weight`, [e], `${h}.input_layernorm.weight`);
    add(`${p}.attn_q.weight`, [e, q], `${h}.self_attn.q_proj.weight`);
    add(`${p}.attn_k.weight`, [e, kv], `${h}.self_attn.k_proj.weight`, own);
    add(`${p}.attn_v.weight`, [e, kv], `${h}.self_attn.v_proj.weight`, own);
    add(`${p}.attn_q_norm.weight`, [headDim], `${h}.self_attn.q_norm.weight`);
    add(`${p}.attn_k_norm.weight`, [headDim], `${h}.self_attn.k_norm.weight`, own);
    add(`${p}.attn_output.weight`, [q, e], `${h}.self_attn.o_proj.weight`);
    add(`${p}.post_attention_norm.weight`, [e], `${h}.post_attention_layernorm.weight`);
    add(`${p}.ffn_norm.weight`, [e], `${h}.pre_feedforward_layernorm.weight`);
    add(`${p}.ffn_gate.weight`, [e, f], `${h}.mlp.gate_proj.weight`);
    add(`${p}.ffn_up.weight`, [e, f], `${h}.mlp.up_proj.weight`);
    add(`${p}.ffn_down.weight`, [f, e], `${h}.mlp.down_proj.weight`);
    add(`${p}.post_ffw_norm.weight`, [e], `${h}.post_feedforward_layernorm.weight`);
    add(`${p}.inp_gate.weight`, [e, P], `${h}.per_layer_input_gate.weight`);
    add(`${p}.proj.weight`, [P, e], `${h}.per_layer_projection.weight`);
    add(`${p}.post_norm.weight`, [e], `${h}.post_per_layer_input_norm.weight`);
    add(`${p}.altup_correct_coef.weight`, [streams, streams], `${h}.altup.correction_coefs.weight`);
    add(`${p}.altup_correct_scale.weight`, [e], `${h}.altup.correct_output_scale`);
    add(`${p}.altup_predict_coef.weight`, [streams, streams * streams],
      `${h}.altup.prediction_coefs.weight`);
    add(`${p}.altup_router.weight`, [e, streams], `${h}.altup.modality_router.weight`);
    add(`${p}.altup_router_norm.weight`, [e], `${h}.altup.router_norm.weight`);
    add(`${p}.laurel_l.weight`, [e, rank], `${h}.laurel.linear_left.weight`);
    add(`${p}.laurel_r.weight`, [rank, e], `${h}.laurel.linear_right.weight`);
    add(`${p}.laurel_post_norm.weight`, [e], `${h}.laurel.post_laurel_norm.weight`);
  }
  return {
    architecture: a, metadata, tensors: t,
    ignored: (n) => n.endsWith(".inv_freq") || (tied && n === "lm_head.weight"),
    tokenizer: { addSpacePrefix: false },
  };
}
