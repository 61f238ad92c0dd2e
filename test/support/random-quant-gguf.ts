// Small random-weight GGUFs in quantized types, for comparing backends end to end: a Gemma 3, Llama,
// Qwen 3, Qwen3-MoE, gpt-oss, Phi-3 or Mistral 3 graph whose tensors are Q4_0/Q5_0/Q8_0/F16/BF16/MXFP4 (random f32
// quantized by the library's reference quantizer) or Q4_K/Q5_K/Q6_K (random valid blocks with
// moderate scales), with the toy
// SentencePiece vocabulary of tiny-gguf.ts. Deterministic for a given spec.
import { GgmlType, ggmlTypes } from "../../ts/gguf/types.ts";
import { gguf, writeGguf, type GgufTensorToWrite, type GgufTypedValue } from "../../ts/gguf/writer.ts";
import { check, native } from "../../ts/native/lib.ts";
import { toyTokenizerMetadata, toyVocabulary } from "./tiny-gguf.ts";

export interface RandomQuantSpec {
  readonly arch: "gemma3" | "llama" | "qwen3" | "qwen3moe" | "phi3" | "gpt-oss" | "mistral3";
  /** llama: write Llama 3's rope_freqs table (default true; Mistral has none). */
  readonly ropeFreqs?: boolean;
  /** phi3: values of each head that RoPE rotates (default headDim). */
  readonly rotaryDims?: number;
  /**
   * phi3: LongRoPE's long and short factors (random, 1..8 and 1..2) for the given original
   * context, and the attention factor on cos and sin; the file's context is 32× the original.
   */
  readonly longRope?: { readonly original: number; readonly attnFactor: number };
  /** qwen3moe, gpt-oss: experts per layer, chosen per token, and one expert's FFN width. */
  readonly moe?: { readonly experts: number; readonly used: number; readonly feedForward: number };
  readonly layers: number;
  readonly embedding: number;
  readonly feedForward: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** Gemma 3's and gpt-oss's sliding window (local layers). */
  readonly window?: number;
  readonly types: {
    readonly embed: number;
    readonly attn: number;
    readonly attnOut: number;
    readonly ffn: number;
    readonly ffnDown: number;
    /** A separate LM head (output.weight); tied to token_embd when absent. */
    readonly output?: number;
  };
  readonly seed?: number;
  /** Metadata added last (a key written twice is refused by the writer). */
  readonly metadata?: readonly [string, GgufTypedValue][];
  /** Changes the tensors and metadata before writing (malformed files for the hostile tests). */
  readonly edit?: (tensors: GgufTensorToWrite[], metadata: [string, GgufTypedValue][]) => void;
}

function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13; s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5; s >>>= 0;
    return s;
  };
}

/** Uniform in [-1, 1). */
function uniform(next: () => number): number {
  return (next() / 2 ** 32) * 2 - 1;
}

/** The library's f16 bits of v (round to nearest even). */
function f16Bits(v: number): number {
  const out = new Uint8Array(2);
  check(native().infer_quantize_row(GgmlType.F16, new Float32Array([v]), 1, out), "f16");
  return out[0] | (out[1] << 8);
}

/** `count` values of `type`: random f32 with the given spread, quantized, or random K blocks. */
export function randomTensorData(type: number, count: number, seed: number, spread: number): Uint8Array {
  const info = ggmlTypes.get(type);
  if (!info) throw new Error(`random-quant-gguf: unknown type ${type}`);
  const next = rng(seed * 2654435761);
  if (type === GgmlType.Q4_K || type === GgmlType.Q5_K || type === GgmlType.Q6_K) {
    const blocks = count / 256;
    const data = new Uint8Array(blocks * info.blockBytes);
    for (let i = 0; i < data.length; i++) data[i] = next() & 255;
    const view = new DataView(data.buffer);
    // Scales chosen so that the weights spread about `spread` around zero (see quant.cuh layouts).
    const table = (base: number) => Array.from({ length: 16 }, (_, i) => f16Bits(base * (0.75 + i / 32)));
    if (type === GgmlType.Q6_K) {
      const d = table(spread / 83);
      for (let b = 0; b < blocks; b++) {
        const o = b * info.blockBytes;
        for (let k = 0; k < 16; k++) data[o + 192 + k] = ((next() % 16) - 8) & 255; // int8 scales -8..7
        view.setUint16(o + 208, d[next() & 15], true);
      }
    } else {
      const q5 = type === GgmlType.Q5_K;
      const d = table(spread / (q5 ? 330 : 160)), dmin = table((spread / (q5 ? 330 : 160)) * (q5 ? 15.5 : 7.5));
      for (let b = 0; b < blocks; b++) {
        const o = b * info.blockBytes, r = next();
        view.setUint16(o, d[r & 15], true);
        view.setUint16(o + 2, dmin[(r >>> 4) & 15], true);
      }
    }
    return data;
  }
  const values = new Float32Array(count);
  for (let i = 0; i < count; i++) values[i] = uniform(next) * spread * 1.7;
  if (type === GgmlType.F32) return new Uint8Array(values.buffer);
  const out = new Uint8Array((count / info.blockValues) * info.blockBytes);
  check(native().infer_quantize_row(type, values, count, out), `quantize ${info.name}`);
  return out;
}

export function randomQuantGguf(spec: RandomQuantSpec): Uint8Array {
  const s = spec, arch = s.arch, vocab = toyVocabulary();
  const e = s.embedding, qd = s.heads * s.headDim, kvd = s.kvHeads * s.headDim, ff = s.feedForward;
  let seed = (s.seed ?? 1) * 1000;
  const tensors: GgufTensorToWrite[] = [];
  const matrix = (name: string, type: number, dims: number[]) => {
    tensors.push({ name, type, dims, data: randomTensorData(type, dims[0] * dims[1], ++seed, 1 / Math.sqrt(dims[0])) });
  };
  const experts = (name: string, type: number, dims: number[]) => {
    tensors.push({ name, type, dims, data: randomTensorData(type, dims[0] * dims[1] * dims[2], ++seed,
      1 / Math.sqrt(dims[0])) });
  };
  const vector = (name: string, n: number, centre: number, spread: number) => {
    const next = rng(++seed);
    const v = new Float32Array(n);
    for (let i = 0; i < n; i++) v[i] = centre + spread * uniform(next);
    tensors.push({ name, type: GgmlType.F32, dims: [n], data: new Uint8Array(v.buffer) });
  };
  const oss = arch === "gpt-oss", ministral = arch === "mistral3";
  tensors.push({ name: "token_embd.weight", type: s.types.embed, dims: [e, vocab.tokens.length],
    data: randomTensorData(s.types.embed, e * vocab.tokens.length, ++seed, 1) });
  vector("output_norm.weight", e, 1, 0.1);
  if (s.types.output !== undefined) matrix("output.weight", s.types.output, [e, vocab.tokens.length]);
  if (arch === "llama" && s.ropeFreqs !== false) vector("rope_freqs.weight", s.headDim / 2, 2, 1);
  const rotaryDims = s.rotaryDims ?? s.headDim;
  if (s.longRope) {
    vector("rope_factors_long.weight", rotaryDims / 2, 4.5, 3.5);
    vector("rope_factors_short.weight", rotaryDims / 2, 1.5, 0.5);
  }
  for (let i = 0; i < s.layers; i++) {
    const p = `blk.${i}`;
    vector(`${p}.attn_norm.weight`, e, 1, 0.1);
    if (arch === "phi3") { // Q, K and V fused, as llama.cpp's converter writes Phi-3
      matrix(`${p}.attn_qkv.weight`, s.types.attn, [e, qd + 2 * kvd]);
    } else {
      matrix(`${p}.attn_q.weight`, s.types.attn, [e, qd]);
      matrix(`${p}.attn_k.weight`, s.types.attn, [e, kvd]);
      matrix(`${p}.attn_v.weight`, s.types.attn, [e, kvd]);
    }
    if (oss) { // q/k/v/o biases and a sink logit per query head
      vector(`${p}.attn_q.bias`, qd, 0, 0.1);
      vector(`${p}.attn_k.bias`, kvd, 0, 0.1);
      vector(`${p}.attn_v.bias`, kvd, 0, 0.1);
      vector(`${p}.attn_output.bias`, e, 0, 0.1);
      vector(`${p}.attn_sinks.weight`, s.heads, 0, 2);
    } else if (arch !== "llama" && arch !== "phi3" && arch !== "mistral3") {
      vector(`${p}.attn_q_norm.weight`, s.headDim, 1, 0.1);
      vector(`${p}.attn_k_norm.weight`, s.headDim, 1, 0.1);
    }
    matrix(`${p}.attn_output.weight`, s.types.attnOut, [qd, e]);
    if (arch === "gemma3") vector(`${p}.post_attention_norm.weight`, e, 1, 0.1);
    // gpt-oss: norms near 5, so that the clamped SwiGLU's gate and up pass its clamp at 7
    if (oss) vector(`${p}.post_attention_norm.weight`, e, 5, 1);
    else vector(`${p}.ffn_norm.weight`, e, 1, 0.1);
    if (s.moe) {
      const n = s.moe.experts, f = s.moe.feedForward;
      matrix(`${p}.ffn_gate_inp.weight`, GgmlType.F32, [e, n]);
      experts(`${p}.ffn_gate_exps.weight`, s.types.ffn, [e, f, n]);
      experts(`${p}.ffn_up_exps.weight`, s.types.ffn, [e, f, n]);
      experts(`${p}.ffn_down_exps.weight`, s.types.ffnDown, [f, e, n]);
      if (oss) {
        vector(`${p}.ffn_gate_inp.bias`, n, 0, 0.5);
        matrix(`${p}.ffn_gate_exps.bias`, GgmlType.F32, [f, n]);
        matrix(`${p}.ffn_up_exps.bias`, GgmlType.F32, [f, n]);
        matrix(`${p}.ffn_down_exps.bias`, GgmlType.F32, [e, n]);
      }
    } else if (arch === "phi3") { // gate and up fused in ffn_up, gate rows first
      matrix(`${p}.ffn_up.weight`, s.types.ffn, [e, 2 * ff]);
      matrix(`${p}.ffn_down.weight`, s.types.ffnDown, [ff, e]);
    } else {
      matrix(`${p}.ffn_gate.weight`, s.types.ffn, [e, ff]);
      matrix(`${p}.ffn_up.weight`, s.types.ffn, [e, ff]);
      matrix(`${p}.ffn_down.weight`, s.types.ffnDown, [ff, e]);
    }
    if (arch === "gemma3") vector(`${p}.post_ffw_norm.weight`, e, 1, 0.1);
  }
  const metadata: [string, GgufTypedValue][] = [
    ["general.architecture", gguf.str(arch)],
    // Not "phi3": llama.cpp's vocabulary then looks up Phi-3's chat tokens, which the toy lacks.
    ["general.name", gguf.str(arch === "phi3" ? "random-phi" : `random-${arch}`)],
    [`${arch}.context_length`, gguf.u32(s.longRope ? 32 * s.longRope.original : oss ? 32 * 4096 : 4096)],
    [`${arch}.embedding_length`, gguf.u32(e)],
    [`${arch}.block_count`, gguf.u32(s.layers)],
    [`${arch}.feed_forward_length`, gguf.u32(ff)],
    [`${arch}.attention.head_count`, gguf.u32(s.heads)],
    [`${arch}.attention.head_count_kv`, gguf.u32(s.kvHeads)],
    [`${arch}.attention.key_length`, gguf.u32(s.headDim)],
    [`${arch}.attention.value_length`, gguf.u32(s.headDim)],
    [`${arch}.attention.layer_norm_rms_epsilon`, gguf.f32(1e-6)],
    [`${arch}.rope.freq_base`, gguf.f32(arch === "llama" ? 500000 : oss ? 150000 : ministral ? 1e9 : 1e6)],
    [`${arch}.rope.dimension_count`, gguf.u32(rotaryDims)],
    ...toyTokenizerMetadata(),
  ];
  if (s.longRope) {
    metadata.push([`${arch}.rope.scaling.original_context_length`, gguf.u32(s.longRope.original)],
      [`${arch}.rope.scaling.attn_factor`, gguf.f32(s.longRope.attnFactor)]);
  }
  if (oss) { // YaRN as gpt-oss: factor 32 over an original context of 4096
    metadata.push([`${arch}.rope.scaling.type`, gguf.str("yarn")],
      [`${arch}.rope.scaling.factor`, gguf.f32(32)],
      [`${arch}.rope.scaling.original_context_length`, gguf.u32(4096)]);
  }
  if (ministral) {
    // Ministral 3's YaRN (factor 16, betas 32 and 1, mscale_all_dim 1) and Llama 4's query
    // temperature over an original context of 8, so that a short prompt passes it, with β 0.5
    // (the released 0.1 moves these random models' tokens too little to test it).
    // Keys the spec's own metadata sets are left to it.
    const own = new Set(s.metadata?.map(([k]) => k));
    const yarn: [string, GgufTypedValue][] = [[`${arch}.rope.scaling.type`, gguf.str("yarn")],
      [`${arch}.rope.scaling.factor`, gguf.f32(16)],
      [`${arch}.rope.scaling.original_context_length`, gguf.u32(8)],
      [`${arch}.rope.scaling.yarn_beta_fast`, gguf.f32(32)],
      [`${arch}.rope.scaling.yarn_beta_slow`, gguf.f32(1)],
      [`${arch}.rope.scaling.yarn_log_multiplier`, gguf.f32(1)],
      [`${arch}.attention.temperature_scale`, gguf.f32(0.5)]];
    metadata.push(...yarn.filter(([k]) => !own.has(k)));
  }
  if (s.metadata) metadata.push(...s.metadata);
  if (arch === "gemma3" || oss) {
    metadata.push([`${arch}.attention.sliding_window`, gguf.u32(s.window ?? 16)]);
  }
  if (s.moe) {
    metadata.push([`${arch}.expert_count`, gguf.u32(s.moe.experts)],
      [`${arch}.expert_used_count`, gguf.u32(s.moe.used)],
      [`${arch}.expert_feed_forward_length`, gguf.u32(s.moe.feedForward)]);
  }
  s.edit?.(tensors, metadata);
  return writeGguf(metadata, tensors);
}

/**
 * A Gemma 3 270M-like mix: Q8_0 embeddings, Q5_0/Q8_0 where rows are 640 long, Q4_K/Q6_K elsewhere.
 * Every spec has its own LM head: with random tied embeddings the input token's own row dominates
 * and greedy decoding repeats one token, which would test little.
 */
export const gemmaMixed: RandomQuantSpec = {
  arch: "gemma3", layers: 6, embedding: 640, feedForward: 2048, heads: 4, kvHeads: 1, headDim: 256, window: 16,
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q5_0, attnOut: GgmlType.Q4_K, ffn: GgmlType.Q8_0, ffnDown: GgmlType.Q6_K,
    output: GgmlType.Q8_0 },
  seed: 3,
};

export const llamaQ4_0: RandomQuantSpec = {
  arch: "llama", layers: 4, embedding: 512, feedForward: 1536, heads: 8, kvHeads: 2, headDim: 64,
  types: { embed: GgmlType.Q4_0, attn: GgmlType.Q4_0, attnOut: GgmlType.Q4_0, ffn: GgmlType.Q4_0, ffnDown: GgmlType.Q4_0,
    output: GgmlType.Q6_K },
  seed: 5,
};

export const qwen3KQuants: RandomQuantSpec = {
  arch: "qwen3", layers: 3, embedding: 256, feedForward: 768, heads: 4, kvHeads: 2, headDim: 128,
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q4_K, attnOut: GgmlType.Q5_K, ffn: GgmlType.Q4_K, ffnDown: GgmlType.Q6_K,
    output: GgmlType.Q6_K },
  seed: 7,
};

export const llamaFloat: RandomQuantSpec = {
  arch: "llama", layers: 2, embedding: 128, feedForward: 256, heads: 4, kvHeads: 4, headDim: 32,
  types: { embed: GgmlType.F16, attn: GgmlType.F16, attnOut: GgmlType.BF16, ffn: GgmlType.F32, ffnDown: GgmlType.F16,
    output: GgmlType.BF16 },
  seed: 9,
};

/** Qwen3-30B-A3B's routing (128 experts, 8 chosen) and head shape, scaled down: Q4_0 experts. */
export const qwen3moeQ4_0: RandomQuantSpec = {
  arch: "qwen3moe", layers: 3, embedding: 256, feedForward: 768, heads: 4, kvHeads: 2, headDim: 128,
  moe: { experts: 128, used: 8, feedForward: 64 },
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q4_0, attnOut: GgmlType.Q4_0, ffn: GgmlType.Q4_0,
    ffnDown: GgmlType.Q4_0, output: GgmlType.Q6_K },
  seed: 11,
};

/** MXFP4 experts (gpt-oss's format, and llama-quantize's MXFP4_MOE: the rest Q8_0), 32 experts,
 * 4 chosen; expert rows a multiple of 8, so llama.cpp runs them repacked as on gpt-oss. */
export const qwen3moeMxfp4: RandomQuantSpec = {
  arch: "qwen3moe", layers: 2, embedding: 256, feedForward: 512, heads: 4, kvHeads: 2, headDim: 64,
  moe: { experts: 32, used: 4, feedForward: 160 },
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q8_0, attnOut: GgmlType.Q8_0, ffn: GgmlType.MXFP4,
    ffnDown: GgmlType.MXFP4, output: GgmlType.Q8_0 },
  seed: 17,
};

/** K-quants experts (Q4_K gate/up, Q6_K down) over 256-wide rows, 16 experts, 4 chosen. */
export const qwen3moeKQuants: RandomQuantSpec = {
  arch: "qwen3moe", layers: 2, embedding: 256, feedForward: 512, heads: 4, kvHeads: 2, headDim: 64,
  moe: { experts: 16, used: 4, feedForward: 256 },
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q8_0, attnOut: GgmlType.Q4_K, ffn: GgmlType.Q4_K,
    ffnDown: GgmlType.Q6_K, output: GgmlType.Q8_0 },
  seed: 13,
};

/**
 * Phi-4-mini's head shape (128 values, 96 rotated; 24 query heads to 8 key/value heads there,
 * 4 to 1 here) and LongRoPE (original context 4096, 32× longer, attention factor
 * sqrt(1 + ln 32 / ln 4096)), scaled down, in Q4_K_M's types (attn_qkv Q5_K).
 */
export const phi4MiniKQuants: RandomQuantSpec = {
  arch: "phi3", layers: 3, embedding: 512, feedForward: 768, heads: 4, kvHeads: 1, headDim: 128,
  rotaryDims: 96, longRope: { original: 4096, attnFactor: Math.fround(Math.sqrt(1 + Math.log(32) / Math.log(4096))) },
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q5_K, attnOut: GgmlType.Q4_K, ffn: GgmlType.Q4_K,
    ffnDown: GgmlType.Q6_K, output: GgmlType.Q6_K },
  seed: 29,
};

/** Phi-3-mini's shape scaled down: 96-value heads rotated whole, no GQA, no LongRoPE; Q4_0. */
export const phi3MiniQ4_0: RandomQuantSpec = {
  arch: "phi3", layers: 3, embedding: 384, feedForward: 1024, heads: 4, kvHeads: 4, headDim: 96,
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q4_0, attnOut: GgmlType.Q4_0, ffn: GgmlType.Q4_0,
    ffnDown: GgmlType.Q4_0, output: GgmlType.Q8_0 },
  seed: 19,
};

/**
 * Mistral Nemo's shape (a `llama` GGUF: 128-value heads wider than embedding / heads, 32 query
 * heads to 8 key/value heads there, 4 to 1 here, no RoPE frequency table), scaled down; Q4_0.
 */
export const mistralNemoQ4_0: RandomQuantSpec = {
  arch: "llama", ropeFreqs: false, layers: 3, embedding: 320, feedForward: 896, heads: 4, kvHeads: 1,
  headDim: 128,
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q4_0, attnOut: GgmlType.Q4_0, ffn: GgmlType.Q4_0,
    ffnDown: GgmlType.Q4_0, output: GgmlType.Q8_0 },
  seed: 23,
};

/**
 * Ministral 3's shape (a `mistral3` GGUF: 128-value heads, 32 query heads to 8 key/value heads,
 * 4 to 1 here, query width above the embedding, YaRN and the query temperature, see
 * randomQuantGguf), scaled down; Q4_0 with a Q8_0 head.
 */
export const ministral3Q4_0: RandomQuantSpec = {
  arch: "mistral3", layers: 3, embedding: 384, feedForward: 1152, heads: 4, kvHeads: 1, headDim: 128,
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q4_0, attnOut: GgmlType.Q4_0, ffn: GgmlType.Q4_0,
    ffnDown: GgmlType.Q4_0, output: GgmlType.Q8_0 },
  seed: 37,
};

/**
 * gpt-oss-20b's shape scaled down (64-value heads, 32 experts of which 4 are chosen, sliding
 * window on the even layers, YaRN, sinks, biases everywhere) in the released GGUFs' types:
 * MXFP4 experts, the rest Q8_0.
 */
export const gptossMxfp4: RandomQuantSpec = {
  arch: "gpt-oss", layers: 4, embedding: 256, feedForward: 160, heads: 4, kvHeads: 2, headDim: 64,
  window: 8, moe: { experts: 32, used: 4, feedForward: 160 },
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q8_0, attnOut: GgmlType.Q8_0, ffn: GgmlType.MXFP4,
    ffnDown: GgmlType.MXFP4, output: GgmlType.Q8_0 },
  seed: 31,
};
