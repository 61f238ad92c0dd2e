// Random-weight GGUFs with the real shapes of Qwen3-0.6B and Llama-3.2-1B, written by the project's
// own GGUF writer so that a benchmark never needs a download. Every 2-D weight, token_embd (the
// tied LM head) included, is in the chosen type, as `llama-quantize --pure` writes it; norms are
// F32. MXFP4_MOE is llama-quantize's type of that name, the released gpt-oss GGUFs' mix: the
// experts MXFP4, every other weight Q8_0. Routers, biases and sinks stay F32, as llama.cpp's
// converter keeps them. The blocks are random but valid (finite, moderate scales), so logits stay finite. A
// synthetic byte-level BPE vocabulary of the real size (256 byte tokens, merges among the
// non-ASCII bytes, the real special tokens) makes the files load in llama.cpp too; ASCII text
// never merges, so a prompt of N ASCII letters is N tokens in both engines.
//   bun bench/random-model.ts [--models qwen3-0.6b,llama-3.2-1b] [--quants Q4_0,Q8_0,Q4_K] [--force]
//   (also qwen3-4b, llama-3.1-8b, qwen3-30b-a3b and gpt-oss-20b, written only when named;
//   --layers N: N layers; gpt-oss-20b's quant defaults to MXFP4_MOE)
// Files land in $INFER_CACHE/bench-models (default ~/.cache/infer/bench-models); a file already
// there (same name, same generator version) is reused.
import { closeSync, existsSync, mkdirSync, openSync, renameSync, writeSync } from "node:fs";
import { join } from "node:path";
import { cacheDir } from "../ts/models/cache.ts";
import { GgmlType, ggmlTypes } from "../ts/gguf/types.ts";
import {
  gguf, ggufLayout, type GgufLayout, type GgufTensorHeader, type GgufTypedValue,
} from "../ts/gguf/writer.ts";

/**
 * Bump when the files' content changes, so stale caches are rewritten. 2: the three types' weights
 * have one spread (v1's Q8_0 weights were 1.6x and Q4_K's 4.4x Q4_0's, which made those models
 * chaotic: their logits moved by 1e-2..1 when only rounding changed, f16 against f32 KV on the CPU
 * alone, so no two engines summing in different orders could agree on their greedy tokens).
 */
const GENERATOR_VERSION = 2;

export interface RandomShape {
  readonly key: string; // as --models names it
  readonly label: string;
  readonly arch: "qwen3" | "llama" | "qwen3moe" | "gpt-oss";
  /** qwen3moe, gpt-oss: experts per layer, chosen per token, one expert's FFN width (every layer MoE). */
  readonly moe?: { readonly experts: number; readonly used: number; readonly feedForward: number };
  /** gpt-oss: the sliding layers' window (the even layers), YaRN's factor over an original context. */
  readonly window?: number;
  readonly yarn?: { readonly factor: number; readonly originalContext: number };
  /** The quants written when --quants is not given (default: Q4_0, Q8_0, Q4_K). */
  readonly quants?: readonly RandomQuant[];
  readonly layers: number;
  readonly embedding: number;
  readonly feedForward: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly vocab: number;
  readonly contextLength: number;
  readonly ropeBase: number;
  readonly normEps: number;
  readonly pre: string; // tokenizer.ggml.pre
  readonly firstSpecial: number; // ids from here up are control tokens
  readonly specials: Readonly<Record<string, number>>;
  readonly bos: number;
  readonly eos: number;
  readonly addBos: boolean;
}

export const randomShapes: readonly RandomShape[] = [
  {
    key: "qwen3-0.6b", label: "Qwen3-0.6B-shape", arch: "qwen3", layers: 28, embedding: 1024, feedForward: 3072,
    heads: 16, kvHeads: 8, headDim: 128, vocab: 151936, contextLength: 40960, ropeBase: 1e6, normEps: 1e-6,
    pre: "qwen2", firstSpecial: 151643,
    specials: { "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645 },
    bos: 151643, eos: 151645, addBos: false,
  },
  {
    key: "llama-3.2-1b", label: "Llama-3.2-1B-shape", arch: "llama", layers: 16, embedding: 2048, feedForward: 8192,
    heads: 32, kvHeads: 8, headDim: 64, vocab: 128256, contextLength: 131072, ropeBase: 500000, normEps: 1e-5,
    pre: "llama-bpe", firstSpecial: 128000,
    specials: { "<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|eot_id|>": 128009 },
    bos: 128000, eos: 128009, addBos: true,
  },
];

/** Larger shapes, written only when named (issue 7's GPU bench: --models qwen3-4b,llama-3.1-8b);
 * the CPU bench's defaults stay the two above. Llama 3.1's RoPE frequency scaling is not written
 * (it changes no kernel's cost). */
export const largeShapes: readonly RandomShape[] = [
  {
    ...randomShapes[0], key: "qwen3-4b", label: "Qwen3-4B-shape", layers: 36, embedding: 2560, feedForward: 9728,
    heads: 32, kvHeads: 8,
  },
  {
    ...randomShapes[1], key: "llama-3.1-8b", label: "Llama-3.1-8B-shape", layers: 32, embedding: 4096,
    feedForward: 14336, heads: 32, kvHeads: 8, headDim: 128,
  },
  { // mixture of experts (bench/cuda-moe-device.sh): 128 experts of 768, 8 chosen; the router F32
    ...randomShapes[0], key: "qwen3-30b-a3b", label: "Qwen3-30B-A3B-shape", arch: "qwen3moe", layers: 48,
    embedding: 2048, feedForward: 6144, heads: 32, kvHeads: 4, headDim: 128,
    moe: { experts: 128, used: 8, feedForward: 768 },
  },
  { // gpt-oss-20b (bench/gpt-oss-device.sh): 32 experts of 2880, 4 chosen; 64 query heads to 8 of 64,
    // q/k/v/o biases, a sink per head, a window of 128 on the even layers, YaRN 32 over 4096, an
    // LM head of its own; the o200k_harmony vocabulary's size and special tokens
    key: "gpt-oss-20b", label: "gpt-oss-20b-shape", arch: "gpt-oss", layers: 24, embedding: 2880,
    feedForward: 2880, heads: 64, kvHeads: 8, headDim: 64, vocab: 201088, contextLength: 131072,
    ropeBase: 150000, normEps: 1e-5, pre: "gpt-4o", firstSpecial: 199998,
    specials: { "<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002,
      "<|constrain|>": 200003, "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007,
      "<|message|>": 200008, "<|call|>": 200012 },
    bos: 199998, eos: 200002, addBos: false,
    moe: { experts: 32, used: 4, feedForward: 2880 }, window: 128,
    yarn: { factor: 32, originalContext: 4096 }, quants: ["MXFP4_MOE"],
  },
  { // tensor parallelism's bench (bench/tensor-parallel.sh): Q8_0 (~75 GB) outgrows one H100
    ...randomShapes[1], key: "llama-3.1-70b", label: "Llama-3.1-70B-shape", layers: 80, embedding: 8192,
    feedForward: 28672, heads: 64, kvHeads: 8, headDim: 128,
  },
];

/** A shape by key, default or large. */
export function findShape(key: string): RandomShape | undefined {
  return randomShapes.find((s) => s.key === key) ?? largeShapes.find((s) => s.key === key);
}

export type RandomQuant = "Q4_0" | "Q8_0" | "Q4_K" | "MXFP4_MOE";
/** The quants benches write by default. */
export const randomQuants: readonly RandomQuant[] = ["Q4_0", "Q8_0", "Q4_K"];
/** Every quant a file can be written in (MXFP4_MOE only where named: it is for MoE shapes). */
export const allRandomQuants: readonly RandomQuant[] = [...randomQuants, "MXFP4_MOE"];
/** The type of a weight in a file of `quant`: MXFP4_MOE's experts MXFP4, its other weights Q8_0. */
function weightType(quant: RandomQuant, expert: boolean): number {
  if (quant === "MXFP4_MOE") return expert ? GgmlType.MXFP4 : GgmlType.Q8_0;
  return { Q4_0: GgmlType.Q4_0, Q8_0: GgmlType.Q8_0, Q4_K: GgmlType.Q4_K }[quant];
}
/** llama.cpp's enum llama_ftype for the file (pure files: the most common type names them). */
const fileType: Record<RandomQuant, number> = { Q4_0: 2, Q8_0: 7, Q4_K: 15, MXFP4_MOE: 38 };

export function randomModelPath(shape: RandomShape, quant: RandomQuant): string {
  return join(cacheDir(), "bench-models", `random-${shape.key}-${quant.toLowerCase()}-v${GENERATOR_VERSION}.gguf`);
}

// ---- random but valid blocks -----------------------------------------------------------------

/** xorshift32, seeded per tensor so that a file is reproducible. */
function rng(seed: number): () => number {
  let s = (seed >>> 0) || 0x9e3779b9;
  return () => {
    s ^= s << 13; s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5; s >>>= 0;
    return s;
  };
}

/** f32 → IEEE half bits (round to nearest; below 2^-14 as subnormals, steps of 2^-24). */
export function f16Bits(v: number): number {
  const f = new Float32Array([v]);
  const u = new Uint32Array(f.buffer)[0];
  const sign = (u >>> 16) & 0x8000;
  const exp = ((u >>> 23) & 0xff) - 127 + 15;
  if (v === 0) return sign;
  if (exp <= 0) return sign | Math.min(Math.round(Math.abs(f[0]) * 2 ** 24), 0x3ff);
  if (exp >= 31) return sign | 0x7bff;
  const mant = u & 0x7fffff;
  let h = sign | (exp << 10) | (mant >>> 13);
  if ((mant & 0x1fff) > 0x1000) h++;
  return h;
}

/** Random bytes, then each block's f16 scale(s) overwritten with a moderate value. */
function quantData(type: number, count: number, seed: number): Uint8Array {
  const info = ggmlTypes.get(type)!;
  const blocks = count / info.blockValues;
  const data = new Uint8Array(blocks * info.blockBytes);
  const next = rng(seed);
  const words = new Uint32Array(data.buffer, 0, data.length >>> 2);
  for (let i = 0; i < words.length; i++) words[i] = next();
  // A small table of scales (random per block) avoids an f16 conversion per block.
  const table = (base: number) => Array.from({ length: 64 }, (_, i) => f16Bits(base * (0.5 + i / 64)));
  const view = new DataView(data.buffer);
  // Every type's weights have a standard deviation of 9.65e-3 (E[u^2] = 13/12 for the scales'
  // factor u in [0.5, 1.5)): Q4_0 d·(q-8), E[(q-8)^2] = 21.5: 2e-3·sqrt(13/12·21.5); Q8_0 d·q,
  // E[q^2] = 5461.5; Q4_K d·sc·q - dmin·m with 6-bit sc, m and 4-bit q, dmin = 7.5·d centring the
  // weights on zero: variance 81,591·d^2 (E[(d·sc·q)^2] + E[(dmin·m)^2] - 2·E[d·sc·q·dmin·m]).
  if (type === GgmlType.Q4_0 || type === GgmlType.Q8_0) {
    const d = table(type === GgmlType.Q4_0 ? 2e-3 : 1.255e-4);
    for (let b = 0; b < blocks; b++) view.setUint16(b * info.blockBytes, d[next() & 63], true);
  } else if (type === GgmlType.Q4_K) {
    const d = table(3.38e-5), dmin = table(2.535e-4);
    for (let b = 0; b < blocks; b++) {
      const r = next();
      view.setUint16(b * info.blockBytes, d[r & 63], true);
      view.setUint16(b * info.blockBytes + 2, dmin[(r >>> 6) & 63], true);
    }
  } else if (type === GgmlType.MXFP4) {
    // e2m1 values k·2^(e-128) (ggml's kvalues_mxfp4, E[k^2] = 34.25 for random nibbles) with the
    // e8m0 scale e 119 in 5 blocks of 8 and 118 in the rest: a spread of 9.69e-3.
    for (let b = 0; b < blocks; b++) data[b * info.blockBytes] = (next() & 7) < 5 ? 119 : 118;
  } else {
    throw new Error(`random-model: no generator for ${info.name}`);
  }
  return data;
}

function f32Data(count: number, seed: number, centre: number, spread: number): Uint8Array {
  const next = rng(seed);
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) out[i] = centre + spread * (next() / 2 ** 32 * 2 - 1);
  return new Uint8Array(out.buffer);
}

/** Llama 3's RoPE frequency divisors (rope_freqs.weight): factor 32, low 1, high 4, original 8192. */
function llama3RopeFactors(headDim: number, base: number): Uint8Array {
  const out = new Float32Array(headDim / 2);
  const lowWavelen = 8192 / 1, highWavelen = 8192 / 4;
  for (let i = 0; i < out.length; i++) {
    const freq = Math.pow(base, (-2 * i) / headDim);
    const wavelen = (2 * Math.PI) / freq;
    if (wavelen < highWavelen) out[i] = 1;
    else if (wavelen > lowWavelen) out[i] = 32;
    else {
      const smooth = (8192 / wavelen - 1) / (4 - 1);
      out[i] = 1 / ((1 - smooth) / 32 + smooth);
    }
  }
  return new Uint8Array(out.buffer);
}

// ---- vocabulary ------------------------------------------------------------------------------

/** GPT-2's byte → printable character table (byte-level BPE stores tokens in these characters). */
function byteChars(): string[] {
  const keep: number[] = [];
  for (let b = 33; b <= 126; b++) keep.push(b);
  for (let b = 161; b <= 172; b++) keep.push(b);
  for (let b = 174; b <= 255; b++) keep.push(b);
  const chars: string[] = new Array(256);
  let n = 0;
  for (let b = 0; b < 256; b++) chars[b] = String.fromCodePoint(keep.includes(b) ? b : 256 + n++);
  return chars;
}

/**
 * Tokens 0..255 are the bytes (id = byte value); then pairs and triples of non-ASCII bytes, each
 * with its merge; from `firstSpecial` up, control tokens (the real names where known).
 */
export function syntheticVocab(shape: RandomShape): { tokens: string[]; types: number[]; merges: string[] } {
  const chars = byteChars();
  const tokens = chars.slice(), types = new Array<number>(256).fill(1), merges: string[] = [];
  const high = chars.slice(128);
  const add = (token: string, merge: string) => {
    if (tokens.length >= shape.firstSpecial) return false;
    tokens.push(token); types.push(1); merges.push(merge);
    return true;
  };
  const pairs: string[] = [];
  outer: for (const a of high) {
    for (const b of high) {
      if (!add(a + b, `${a} ${b}`)) break outer;
      pairs.push(a + b);
    }
  }
  outer2: for (const p of pairs) {
    for (const c of high) if (!add(p + c, `${p} ${c}`)) break outer2;
  }
  if (tokens.length !== shape.firstSpecial) throw new Error("random-model: vocabulary generator fell short");
  const byId = new Map(Object.entries(shape.specials).map(([t, id]) => [id, t]));
  for (let id = shape.firstSpecial; id < shape.vocab; id++) {
    tokens.push(byId.get(id) ?? `<|reserved_special_token_${id - shape.firstSpecial}|>`);
    types.push(3);
  }
  return { tokens, types, merges };
}

// ---- the file --------------------------------------------------------------------------------

interface PlannedTensor extends GgufTensorHeader {
  make(): Uint8Array;
}

function plan(shape: RandomShape, quant: RandomQuant): PlannedTensor[] {
  const e = shape.embedding, qd = shape.heads * shape.headDim;
  const kvd = shape.kvHeads * shape.headDim, ff = shape.feedForward, oss = shape.arch === "gpt-oss";
  let seed = 1;
  const weight = (name: string, dims: number[], expert = false): PlannedTensor => {
    const s = seed++, type = weightType(quant, expert), info = ggmlTypes.get(type)!;
    if (dims[0] % info.blockValues !== 0) {
      throw new Error(`random-model: ${shape.key}'s ${name} has rows of ${dims[0]}, not a multiple of ` +
        `${info.name}'s blocks of ${info.blockValues}; write it in another quant`);
    }
    return { name, type, dims, make: () => quantData(type, dims.reduce((n, d) => n * d, 1), s) };
  };
  const float = (name: string, dims: number[], centre: number, spread: number): PlannedTensor => {
    const s = seed++, n = dims.reduce((m, d) => m * d, 1);
    return { name, type: GgmlType.F32, dims, make: () => f32Data(n, s, centre, spread) };
  };
  const norm = (name: string, n: number) => float(name, [n], 1, 0.1);
  const out: PlannedTensor[] = [weight("token_embd.weight", [e, shape.vocab]), norm("output_norm.weight", e)];
  // gpt-oss's LM head is a tensor of its own (llama.cpp requires it); the others' tied to token_embd
  if (oss) out.push(weight("output.weight", [e, shape.vocab]));
  if (shape.arch === "llama") {
    out.push({ name: "rope_freqs.weight", type: GgmlType.F32, dims: [shape.headDim / 2],
      make: () => llama3RopeFactors(shape.headDim, shape.ropeBase) });
  }
  for (let i = 0; i < shape.layers; i++) {
    const p = `blk.${i}`;
    out.push(norm(`${p}.attn_norm.weight`, e), weight(`${p}.attn_q.weight`, [e, qd]),
      weight(`${p}.attn_k.weight`, [e, kvd]), weight(`${p}.attn_v.weight`, [e, kvd]));
    if (oss) { // q/k/v/o biases and a sink logit per query head
      out.push(float(`${p}.attn_q.bias`, [qd], 0, 0.1), float(`${p}.attn_k.bias`, [kvd], 0, 0.1),
        float(`${p}.attn_v.bias`, [kvd], 0, 0.1), float(`${p}.attn_output.bias`, [e], 0, 0.1),
        float(`${p}.attn_sinks.weight`, [shape.heads], 0, 2));
    } else if (shape.arch !== "llama") {
      out.push(norm(`${p}.attn_q_norm.weight`, shape.headDim), norm(`${p}.attn_k_norm.weight`, shape.headDim));
    }
    // gpt-oss's norm before the FFN is llama.cpp's post_attention_norm
    out.push(weight(`${p}.attn_output.weight`, [qd, e]),
      norm(`${p}.${oss ? "post_attention_norm" : "ffn_norm"}.weight`, e));
    if (shape.moe) {
      const n = shape.moe.experts, f = shape.moe.feedForward;
      out.push(float(`${p}.ffn_gate_inp.weight`, [e, n], 0, 0.05),
        weight(`${p}.ffn_gate_exps.weight`, [e, f, n], true), weight(`${p}.ffn_up_exps.weight`, [e, f, n], true),
        weight(`${p}.ffn_down_exps.weight`, [f, e, n], true));
      if (oss) { // the router's and every expert's biases
        out.push(float(`${p}.ffn_gate_inp.bias`, [n], 0, 0.5), float(`${p}.ffn_gate_exps.bias`, [f, n], 0, 0.1),
          float(`${p}.ffn_up_exps.bias`, [f, n], 0, 0.1), float(`${p}.ffn_down_exps.bias`, [e, n], 0, 0.1));
      }
    } else {
      out.push(weight(`${p}.ffn_gate.weight`, [e, ff]), weight(`${p}.ffn_up.weight`, [e, ff]),
        weight(`${p}.ffn_down.weight`, [ff, e]));
    }
  }
  return out;
}

function metadata(shape: RandomShape, quant: RandomQuant): [string, GgufTypedValue][] {
  const a = shape.arch, vocab = syntheticVocab(shape);
  const m: [string, GgufTypedValue][] = [
    ["general.architecture", gguf.str(a)],
    ["general.name", gguf.str(`random ${shape.label} ${quant}`)],
    ["general.file_type", gguf.u32(fileType[quant])],
    [`${a}.context_length`, gguf.u32(shape.contextLength)],
    [`${a}.embedding_length`, gguf.u32(shape.embedding)],
    [`${a}.block_count`, gguf.u32(shape.layers)],
    [`${a}.feed_forward_length`, gguf.u32(shape.feedForward)],
    [`${a}.attention.head_count`, gguf.u32(shape.heads)],
    [`${a}.attention.head_count_kv`, gguf.u32(shape.kvHeads)],
    [`${a}.attention.key_length`, gguf.u32(shape.headDim)],
    [`${a}.attention.value_length`, gguf.u32(shape.headDim)],
    [`${a}.attention.layer_norm_rms_epsilon`, gguf.f32(shape.normEps)],
    [`${a}.rope.freq_base`, gguf.f32(shape.ropeBase)],
    [`${a}.rope.dimension_count`, gguf.u32(shape.headDim)],
    [`${a}.vocab_size`, gguf.u32(shape.vocab)],
    ["tokenizer.ggml.model", gguf.str("gpt2")],
    ["tokenizer.ggml.pre", gguf.str(shape.pre)],
    ["tokenizer.ggml.tokens", gguf.strs(vocab.tokens)],
    ["tokenizer.ggml.token_type", gguf.i32s(vocab.types)],
    ["tokenizer.ggml.merges", gguf.strs(vocab.merges)],
    ["tokenizer.ggml.bos_token_id", gguf.u32(shape.bos)],
    ["tokenizer.ggml.eos_token_id", gguf.u32(shape.eos)],
    ["tokenizer.ggml.add_bos_token", gguf.bool(shape.addBos)],
  ];
  if (shape.moe) {
    m.push([`${a}.expert_count`, gguf.u32(shape.moe.experts)], [`${a}.expert_used_count`, gguf.u32(shape.moe.used)],
      [`${a}.expert_feed_forward_length`, gguf.u32(shape.moe.feedForward)]);
  }
  if (shape.window !== undefined) m.push([`${a}.attention.sliding_window`, gguf.u32(shape.window)]);
  if (shape.yarn) { // as llama.cpp's converter writes gpt-oss's rope_scaling (betas 32 and 1)
    m.push([`${a}.rope.scaling.type`, gguf.str("yarn")], [`${a}.rope.scaling.factor`, gguf.f32(shape.yarn.factor)],
      [`${a}.rope.scaling.original_context_length`, gguf.u32(shape.yarn.originalContext)],
      [`${a}.rope.scaling.yarn_beta_fast`, gguf.f32(32)], [`${a}.rope.scaling.yarn_beta_slow`, gguf.f32(1)]);
  }
  return m;
}

/** The file's tensors (each with its data's generator) and header, before anything is written. */
export function randomModelLayout(shape: RandomShape, quant: RandomQuant): {
  tensors: (GgufTensorHeader & { make(): Uint8Array })[]; layout: GgufLayout;
} {
  const tensors = plan(shape, quant);
  return { tensors, layout: ggufLayout(metadata(shape, quant), tensors) };
}

/** Writes the file unless it is cached; returns its path. Streams tensor by tensor. */
export function ensureRandomModel(shape: RandomShape, quant: RandomQuant, force = false): string {
  const path = randomModelPath(shape, quant);
  if (existsSync(path) && !force) return path;
  const { tensors, layout } = randomModelLayout(shape, quant);
  mkdirSync(join(cacheDir(), "bench-models"), { recursive: true });
  const tmp = `${path}.${process.pid}.tmp`;
  const fd = openSync(tmp, "w");
  try {
    writeSync(fd, layout.header);
    tensors.forEach((t, i) => {
      const data = t.make();
      if (data.length !== layout.dataBytes[i]) throw new Error(`random-model: ${t.name} has the wrong size`);
      writeSync(fd, data);
      if (layout.paddingBytes[i] > 0) writeSync(fd, new Uint8Array(layout.paddingBytes[i]));
    });
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, path);
  return path;
}

if (import.meta.main) {
  const arg = (name: string) => {
    const i = process.argv.indexOf(name);
    return i >= 0 ? process.argv[i + 1] : undefined;
  };
  const keys = (arg("--models") ?? randomShapes.map((s) => s.key).join(",")).split(",");
  const quantsArg = arg("--quants")?.split(",") as RandomQuant[] | undefined;
  // --layers N: the shape with N layers (a file of its own, "<key>-<N>l"): a large shape's per-layer
  // cost in a file that a short GPU session can write.
  const layers = arg("--layers");
  for (const key of keys) {
    const known = findShape(key);
    if (!known) throw new Error(`unknown model '${key}' (known: ${[...randomShapes, ...largeShapes].map((s) => s.key).join(", ")})`);
    const shape = layers === undefined ? known
      : { ...known, key: `${known.key}-${layers}l`, label: `${known.label} (${layers} layers)`, layers: Number(layers) };
    for (const quant of quantsArg ?? shape.quants ?? randomQuants) {
      if (!allRandomQuants.includes(quant)) throw new Error(`unknown quant '${quant}' (${allRandomQuants.join(", ")})`);
      const t0 = performance.now();
      const path = ensureRandomModel(shape, quant, process.argv.includes("--force"));
      console.log(`${path} (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
    }
  }
}
