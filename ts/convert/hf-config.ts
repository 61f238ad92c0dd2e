// A Hugging Face config.json, parsed at the boundary: every hyperparameter the converter uses is
// read through here, checked for type and range, and a missing or bad key is an error naming the
// key and the file. RoPE settings are normalised across transformers' two spellings
// (`rope_theta` + `rope_scaling` before v5, `rope_parameters` from v5 on).
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { InferError } from "../errors.ts";
import { LIMITS } from "../model/hparams.ts";

export interface IntBounds { min?: number; max?: number; fallback?: number }

export interface RopeParameters {
  readonly theta: number;
  /** "default", "linear", "llama3", "yarn", ... (rope_type, or the older `type`). */
  readonly type: string;
  readonly raw: Readonly<Record<string, unknown>>;
}

export class HfConfig {
  private constructor(readonly path: string, private readonly json: Record<string, unknown>) {}

  static read(folder: string): HfConfig {
    const path = join(folder, "config.json");
    if (!existsSync(path)) throw new InferError("io",
      `${folder}: no config.json (is this a Hugging Face model folder?)`);
    let json: unknown;
    try {
      json = JSON.parse(readFileSync(path, "utf8"));
    } catch (err) {
      throw new InferError("bad_model", `${path}: not valid JSON (${(err as Error).message})`);
    }
    if (typeof json !== "object" || json === null || Array.isArray(json)) {
      throw new InferError("bad_model", `${path}: not a JSON object`);
    }
    // Multimodal wrappers keep the language model's settings under text_config.
    const o = json as Record<string, unknown>;
    const text = o.text_config;
    const merged = typeof text === "object" && text !== null ? { ...o, ...(text as object) } : o;
    return new HfConfig(path, merged);
  }

  private bad(key: string, why: string): never {
    throw new InferError("bad_model", `${this.path}: '${key}' ${why}`);
  }

  has(key: string): boolean {
    return this.json[key] !== undefined && this.json[key] !== null;
  }

  raw(key: string): unknown {
    return this.json[key];
  }

  int(key: string, bounds: IntBounds = {}): number {
    const v = this.json[key];
    if (v === undefined || v === null) {
      if (bounds.fallback !== undefined) return bounds.fallback;
      return this.bad(key, "is missing");
    }
    if (typeof v !== "number" || !Number.isInteger(v)) return this.bad(key,
      `is not an integer (${JSON.stringify(v)})`);
    const min = bounds.min ?? 0, max = bounds.max ?? 2 ** 31 - 1;
    if (v < min || v > max) return this.bad(key, `is ${v}, outside ${min}..${max}`);
    return v;
  }

  float(key: string, fallback?: number): number {
    const v = this.json[key];
    if (v === undefined || v === null) {
      if (fallback !== undefined) return fallback;
      return this.bad(key, "is missing");
    }
    if (typeof v !== "number" || !Number.isFinite(v)) return this.bad(key,
      `is not a number (${JSON.stringify(v)})`);
    return v;
  }

  bool(key: string, fallback: boolean): boolean {
    const v = this.json[key];
    if (v === undefined || v === null) return fallback;
    if (typeof v !== "boolean") return this.bad(key, `is not true or false (${JSON.stringify(v)})`);
    return v;
  }

  string(key: string, fallback?: string): string {
    const v = this.json[key];
    if (v === undefined || v === null) {
      if (fallback !== undefined) return fallback;
      return this.bad(key, "is missing");
    }
    if (typeof v !== "string") return this.bad(key, `is not a string (${JSON.stringify(v)})`);
    return v;
  }

  /** The first name in `architectures` (e.g. "LlamaForCausalLM"). */
  architecture(): string {
    const a = this.json.architectures;
    if (!Array.isArray(a) || typeof a[0] !== "string") return this.bad("architectures",
      "is missing or empty");
    return a[0];
  }

  rope(defaultTheta: number): RopeParameters {
    const params = this.json.rope_parameters;
    const scaling = this.json.rope_scaling;
    const raw: Record<string, unknown> = {};
    if (typeof scaling === "object" && scaling !== null) Object.assign(raw, scaling);
    if (typeof params === "object" && params !== null) {
      // rope_parameters may be keyed by layer type (Gemma 3: full_attention / sliding_attention).
      const p = params as Record<string, unknown>;
      Object.assign(raw, typeof p.full_attention === "object" && p.full_attention !== null
        ? p.full_attention : p);
    }
    const theta = raw.rope_theta ?? this.json.rope_theta ?? defaultTheta;
    if (typeof theta !== "number" || !(theta > 0)) this.bad("rope_theta",
      `is not a positive number (${JSON.stringify(theta)})`);
    const type = raw.rope_type ?? raw.type ?? "default";
    if (typeof type !== "string") this.bad("rope_parameters.rope_type", "is not a string");
    return { theta, type, raw };
  }

  /** The shape every llama-like decoder shares, bounded as the GGUF loader will bound it. */
  decoderShape(): DecoderShape {
    const embedding = this.int("hidden_size", { min: 1, max: LIMITS.embedding });
    const heads = this.int("num_attention_heads", { min: 1, max: LIMITS.heads });
    const kvHeads = this.int("num_key_value_heads", { min: 1, max: heads, fallback: heads });
    if (heads % kvHeads !== 0) this.bad("num_key_value_heads",
      `(${kvHeads}) does not divide num_attention_heads (${heads})`);
    const headDim = this.int("head_dim", { min: 2, max: LIMITS.headDim, fallback: Math.floor(
      embedding / heads) });
    if (headDim % 2 !== 0) this.bad("head_dim", `is ${headDim}; RoPE needs an even head size`);
    return {
      layers: this.int("num_hidden_layers", { min: 1, max: LIMITS.layers }),
      embedding, heads, kvHeads, headDim,
      feedForward: this.int("intermediate_size", { min: 1, max: LIMITS.feedForward }),
      vocab: this.int("vocab_size", { min: 1, max: LIMITS.vocab }),
      contextLength: this.int("max_position_embeddings", { min: 1, max: LIMITS.context,
        fallback: 4096 }),
      normEps: this.float("rms_norm_eps", 1e-6),
      tied: this.bool("tie_word_embeddings", false),
    };
  }
}

export interface DecoderShape {
  readonly layers: number;
  readonly embedding: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly feedForward: number;
  readonly vocab: number;
  readonly contextLength: number;
  readonly normEps: number;
  readonly tied: boolean;
}
