// What the importer refuses in a config.json, by name: settings that change a model's arithmetic
// in ways the GGUF runtimes (infer's and llama.cpp's, for the architecture written) would not
// reproduce. Converting such a model would succeed and then compute something else, silently,
// from some position or layer on; a refusal names the key and what the runtime does instead.
import { InferError, quote } from "../errors.ts";
import type { HfConfig, RopeParameters } from "./hf-config.ts";

export interface ConfigRules {
  /** The GGUF architecture being written, for the messages. */
  readonly arch: string;
  /** The activation of the feed-forward gate the runtime computes (transformers' name). */
  readonly activation: { readonly key: string; readonly name: string };
  /**
   * Refuse attention_bias: true (in Llama and Qwen 3 it puts a bias on every projection, the
   * output's included, which the GGUF plan has no place for).
   */
  readonly refuseAttentionBias: boolean;
  /** Qwen 2 / Qwen 3's per-layer sliding window (use_sliding_window, max_window_layers). */
  readonly qwenSlidingWindow: boolean;
  /** Whether the runtime applies a sliding window from sliding_window (Gemma 3's local layers). */
  readonly runsSlidingWindow: boolean;
}

export function refusedSettings(c: HfConfig, r: ConfigRules): void {
  const refuse = (key: string, why: string): never => {
    throw new InferError("unsupported", `${c.path}: ${key} ${why}`);
  };
  const quantization = c.raw("quantization_config");
  if (quantization !== undefined && quantization !== null) {
    const method = (quantization as { quant_method?: unknown }).quant_method;
    refuse("'quantization_config'", `is set (${quote(String(method ?? "?"), 24)}): the ` +
      "checkpoint was quantized by another tool; import the unquantized model");
  }
  const activation = c.string(r.activation.key, r.activation.name);
  if (activation !== r.activation.name) refuse(`'${r.activation.key}'`, `is ` +
    `${quote(activation, 40)}; ${r.arch} runtimes compute ${r.activation.name}`);
  for (const key of ["attn_logit_softcapping", "final_logit_softcapping"]) {
    if (c.has(key)) refuse(`'${key}'`, `is set; ${r.arch} runtimes do not soft-cap`);
  }
  if (r.refuseAttentionBias && c.bool("attention_bias", false)) refuse("'attention_bias'",
    `is true (a bias on every attention projection, o_proj's included); the ${r.arch} ` +
    "import does not carry them");
  if (c.bool("mlp_bias", false)) refuse("'mlp_bias'",
    `is true; ${r.arch} runtimes have no feed-forward biases`);
  if (r.qwenSlidingWindow) qwenSlidingLayers(c, refuse);
  else if (!r.runsSlidingWindow) wholeModelWindow(c, r.arch, refuse);
}

/**
 * Qwen2Config / Qwen3Config: layer i attends to the last sliding_window tokens only when
 * use_sliding_window is true and i >= max_window_layers (transformers' layer_types, which the
 * config may also spell out). llama.cpp's qwen2 and qwen3 attend to the whole context on every
 * layer, so a GGUF for them cannot carry the window: a config where some layer would slide
 * within the model's context is refused; one where none does imports as it is.
 */
function qwenSlidingLayers(c: HfConfig, refuse: (key: string, why: string) => never): void {
  if (!c.bool("use_sliding_window", false)) return;
  const layers = c.int("num_hidden_layers", { min: 1 });
  const context = c.int("max_position_embeddings", { min: 1, fallback: 4096 });
  const window = c.has("sliding_window") ? c.int("sliding_window", { min: 1 }) : null;
  if (window === null || window >= context) return;
  const firstSliding = c.int("max_window_layers", { min: 0, fallback: layers });
  const types = c.raw("layer_types");
  const sliding = Array.isArray(types)
    ? types.flatMap((t, i) => (t === "sliding_attention" ? [i] : []))
    : Array.from({ length: Math.max(layers - firstSliding, 0) }, (_, i) => firstSliding + i);
  if (sliding.length === 0) return;
  const first = sliding[0], last = sliding[sliding.length - 1];
  const contiguous = sliding.length === last - first + 1;
  const which = sliding.length === 1 ? `layer ${first}`
    : `layers ${first}${contiguous ? "-" : ", ..., "}${last}`;
  refuse("'use_sliding_window'", `is true with 'sliding_window' ${window} (under the context ` +
    `of ${context}) and 'max_window_layers' ${firstSliding}: ${which} would attend to the ` +
    `last ${window} tokens only, which a qwen GGUF cannot express (llama.cpp and infer ` +
    "attend to the whole context), so the output would be wrong from there on");
}

/** Llama / Mistral: a sliding_window under the context slides every layer in transformers. */
function wholeModelWindow(c: HfConfig, arch: string,
  refuse: (key: string, why: string) => never): void {
  const context = c.int("max_position_embeddings", { min: 1, fallback: 4096 });
  if (c.has("sliding_window")) {
    const window = c.int("sliding_window", { min: 1 });
    if (window < context) refuse("'sliding_window'", `is ${window}, under the context of ` +
      `${context}: every layer attends to the last ${window} tokens only, which a ${arch} ` +
      "GGUF cannot express (llama.cpp and infer attend to the whole context)");
  }
  const types = c.raw("layer_types");
  if (Array.isArray(types) && types.some((t) => t !== "full_attention")) {
    refuse("'layer_types'", `has layers other than "full_attention"; ${arch} runtimes ` +
      "attend to the whole context on every layer");
  }
}

/**
 * RoPE variants the runtimes compute from a GGUF: none, linear position interpolation, and
 * Llama 3's frequency factors (a rope_freqs tensor). "dynamic" (NTK) scaling changes nothing
 * within the trained context, as in transformers, and llama.cpp reads such a model unscaled.
 */
export function checkRope(c: HfConfig, rope: RopeParameters, arch: string,
  allowed: readonly string[]): void {
  if (!allowed.includes(rope.type)) {
    throw new InferError("unsupported", `${c.path}: RoPE scaling ${quote(rope.type, 24)} ` +
      `(rope_type) is not supported for ${arch} (supported: ${allowed.join(", ")})`);
  }
  const partial = rope.raw.partial_rotary_factor ?? c.raw("partial_rotary_factor");
  if (partial !== undefined && partial !== null && partial !== 1) {
    throw new InferError("unsupported", `${c.path}: 'partial_rotary_factor' is ` +
      `${quote(JSON.stringify(partial), 24)}; ${arch} runtimes rotate the whole head`);
  }
  if (rope.type === "linear" && !(typeof rope.raw.factor === "number" && rope.raw.factor > 0)) {
    throw new InferError("bad_model", `${c.path}: linear RoPE scaling needs a positive 'factor'`);
  }
}
