// The valid files the fuzzer mutates: a small random-weight model of every architecture infer
// runs (gemma3, llama, qwen2, qwen3) in every weight type it reads (F32, F16, BF16, Q4_0, Q5_0,
// Q8_0, Q4_K, Q5_K, Q6_K), kept as metadata and tensors so that mutations can work on the
// structure before it is written. Each architecture has its own options (Gemma's sandwich norms
// and a global layer, Llama's rope_freqs, Qwen 2's biases and a byte-level BPE vocabulary, Qwen
// 3's QK-norm); half the seeds tie the LM head to the embedding. Deterministic.
import { GgmlType, ggmlTypes } from "../../ts/gguf/types.ts";
import { gguf, type GgufTensorToWrite, type GgufTypedValue } from "../../ts/gguf/writer.ts";
import { gpt2ByteToChar } from "../../ts/tokenizer/unicode.ts";
import { randomTensorData } from "../support/random-quant-gguf.ts";
import { toyTokenizerMetadata, toyVocabulary } from "../support/tiny-gguf.ts";

export const architectures = ["gemma3", "llama", "qwen2", "qwen3"] as const;
export type Architecture = (typeof architectures)[number];

export const weightTypes = [
  GgmlType.F32, GgmlType.F16, GgmlType.BF16, GgmlType.Q4_0, GgmlType.Q5_0, GgmlType.Q8_0,
  GgmlType.Q4_K, GgmlType.Q5_K, GgmlType.Q6_K,
] as const;

export interface SeedModel {
  readonly name: string;
  readonly architecture: Architecture;
  readonly metadata: [string, GgufTypedValue][];
  readonly tensors: GgufTensorToWrite[];
}

/** A byte-level BPE vocabulary (Qwen 2's tokenizer type): 256 bytes, a few merges, specials. */
function bpeVocabulary(): { tokens: string[]; types: number[]; merges: string[] } {
  const chars = gpt2ByteToChar();
  const tokens = [...chars];
  const types = tokens.map(() => 1);
  const merges = ["Ġ t", "h e", "Ġt he", "a t", "Ġ c", "Ġc at", "Ġ s", "Ġs at", "i n", "o n"];
  for (const m of merges) {
    tokens.push(m.replace(" ", ""));
    types.push(1);
  }
  for (const special of ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) {
    tokens.push(special);
    types.push(3);
  }
  return { tokens, types, merges };
}

function tokenizerMetadata(arch: Architecture): { metadata: [string, GgufTypedValue][];
  vocab: number } {
  if (arch === "qwen2") {
    const v = bpeVocabulary();
    const end = v.tokens.indexOf("<|endoftext|>");
    return { vocab: v.tokens.length, metadata: [
      ["tokenizer.ggml.model", gguf.str("gpt2")],
      ["tokenizer.ggml.pre", gguf.str("qwen2")],
      ["tokenizer.ggml.tokens", gguf.strs(v.tokens)],
      ["tokenizer.ggml.token_type", gguf.i32s(v.types)],
      ["tokenizer.ggml.merges", gguf.strs(v.merges)],
      ["tokenizer.ggml.eos_token_id", gguf.u32(end)],
      ["tokenizer.ggml.padding_token_id", gguf.u32(end)],
      ["tokenizer.ggml.add_bos_token", gguf.bool(false)],
      ["tokenizer.chat_template", gguf.str("{% for m in messages %}<|im_start|>{{ m.role }}\n" +
        "{{ m.content }}<|im_end|>\n{% endfor %}")],
    ] };
  }
  return { vocab: toyVocabulary().tokens.length, metadata: toyTokenizerMetadata() };
}

/** Rows a multiple of 256 for the K-quants' blocks, 32 for the rest: small, every kernel runs. */
function shapeFor(type: number, arch: Architecture) {
  const k = type === GgmlType.Q4_K || type === GgmlType.Q5_K || type === GgmlType.Q6_K;
  const width = k ? 256 : 64;
  return {
    embedding: width, feedForward: width, heads: 2, kvHeads: arch === "llama" ? 2 : 1,
    headDim: width / 2, layers: arch === "gemma3" ? 6 : 2, window: 4,
  };
}

export function seedModel(arch: Architecture, type: number, index: number): SeedModel {
  const s = shapeFor(type, arch);
  const tok = tokenizerMetadata(arch);
  const e = s.embedding, qd = s.heads * s.headDim, kvd = s.kvHeads * s.headDim;
  const tied = index % 2 === 0;
  let seed = index * 1000 + 1;
  const tensors: GgufTensorToWrite[] = [];
  const matrix = (name: string, dims: number[], t = type) => tensors.push({ name, type: t, dims,
    data: randomTensorData(t, dims[0] * dims[1], ++seed, 1 / Math.sqrt(dims[0])) });
  const vector = (name: string, n: number, centre: number, spread: number) => {
    const data = randomTensorData(GgmlType.F32, n, ++seed, spread);
    const v = new Float32Array(data.buffer, data.byteOffset, n);
    for (let i = 0; i < n; i++) v[i] += centre;
    tensors.push({ name, type: GgmlType.F32, dims: [n], data });
  };
  matrix("token_embd.weight", [e, tok.vocab]);
  vector("output_norm.weight", e, 1, 0.1);
  if (!tied) matrix("output.weight", [e, tok.vocab]);
  if (arch === "llama") vector("rope_freqs.weight", s.headDim / 2, 2, 1);
  for (let i = 0; i < s.layers; i++) {
    const p = `blk.${i}`;
    vector(`${p}.attn_norm.weight`, e, 1, 0.1);
    matrix(`${p}.attn_q.weight`, [e, qd]);
    matrix(`${p}.attn_k.weight`, [e, kvd]);
    matrix(`${p}.attn_v.weight`, [e, kvd]);
    if (arch === "qwen2") {
      vector(`${p}.attn_q.bias`, qd, 0, 0.1);
      vector(`${p}.attn_k.bias`, kvd, 0, 0.1);
      vector(`${p}.attn_v.bias`, kvd, 0, 0.1);
    }
    if (arch === "gemma3" || arch === "qwen3") {
      vector(`${p}.attn_q_norm.weight`, s.headDim, 1, 0.1);
      vector(`${p}.attn_k_norm.weight`, s.headDim, 1, 0.1);
    }
    matrix(`${p}.attn_output.weight`, [qd, e]);
    if (arch === "gemma3") vector(`${p}.post_attention_norm.weight`, e, 1, 0.1);
    vector(`${p}.ffn_norm.weight`, e, 1, 0.1);
    matrix(`${p}.ffn_gate.weight`, [e, s.feedForward]);
    matrix(`${p}.ffn_up.weight`, [e, s.feedForward]);
    matrix(`${p}.ffn_down.weight`, [s.feedForward, e]);
    if (arch === "gemma3") vector(`${p}.post_ffw_norm.weight`, e, 1, 0.1);
  }
  const metadata: [string, GgufTypedValue][] = [
    ["general.architecture", gguf.str(arch)],
    ["general.name", gguf.str(`fuzz-${arch}`)],
    [`${arch}.context_length`, gguf.u32(256)],
    [`${arch}.embedding_length`, gguf.u32(e)],
    [`${arch}.block_count`, gguf.u32(s.layers)],
    [`${arch}.feed_forward_length`, gguf.u32(s.feedForward)],
    [`${arch}.attention.head_count`, gguf.u32(s.heads)],
    [`${arch}.attention.head_count_kv`, gguf.u32(s.kvHeads)],
    [`${arch}.attention.key_length`, gguf.u32(s.headDim)],
    [`${arch}.attention.value_length`, gguf.u32(s.headDim)],
    [`${arch}.attention.layer_norm_rms_epsilon`, gguf.f32(1e-6)],
    [`${arch}.rope.freq_base`, gguf.f32(arch === "gemma3" ? 1e6 : 5e5)],
    [`${arch}.rope.dimension_count`, gguf.u32(s.headDim)],
    ...tok.metadata,
  ];
  if (arch === "gemma3") metadata.push([`${arch}.attention.sliding_window`, gguf.u32(s.window)]);
  if (arch === "llama") {
    metadata.push([`${arch}.rope.scaling.type`, gguf.str("linear")],
      [`${arch}.rope.scaling.factor`, gguf.f32(2)]);
  }
  const typeName = ggmlTypes.get(type)?.name ?? String(type);
  const name = `${arch}-${typeName}${tied ? "-tied" : ""}`;
  return { name, architecture: arch, metadata, tensors };
}

/** Every architecture in every weight type. */
export function seedModels(): SeedModel[] {
  const out: SeedModel[] = [];
  let index = 0;
  for (const arch of architectures) for (const type of weightTypes) {
    out.push(seedModel(arch, type, index++));
  }
  return out;
}
