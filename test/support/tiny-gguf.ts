// Writes small GGUFs for tests: a tiny Gemma 3 with random F32/F16 weights and a toy
// SentencePiece vocabulary, whose metadata or tensors a test can then break on purpose.
import { GgmlType, ggmlTypes } from "../../ts/gguf/types.ts";
import { gguf, writeGguf, type GgufTensorToWrite, type GgufTypedValue } from "../../ts/gguf/writer.ts";

export interface TinyShape {
  layers: number; embedding: number; feedForward: number; heads: number; kvHeads: number; headDim: number;
}

export const tinyGemma3: TinyShape = { layers: 2, embedding: 64, feedForward: 128, heads: 4, kvHeads: 2, headDim: 32 };

function random(seed: number): () => number {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32) * 2 - 1;
}

export function toyVocabulary(): { tokens: string[]; scores: number[]; types: number[] } {
  const tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"];
  const types = [3, 3, 3, 2, 3, 3];
  for (let b = 0; b < 256; b++) { tokens.push(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`); types.push(6); }
  for (const w of ["▁the", "▁a", "▁cat", "▁sat", "the", "at", "▁", "e", "t", "h", "a", "c", "s"]) { tokens.push(w); types.push(1); }
  const scores = tokens.map((_, i) => -i);
  return { tokens, scores, types };
}

/** The toy vocabulary as a SentencePiece tokenizer's GGUF metadata (BOS 2, EOS 1, UNK 3). */
export function toyTokenizerMetadata(): [string, GgufTypedValue][] {
  const vocab = toyVocabulary();
  return [
    ["tokenizer.ggml.model", gguf.str("llama")],
    ["tokenizer.ggml.tokens", gguf.strs(vocab.tokens)],
    ["tokenizer.ggml.scores", gguf.f32s(vocab.scores)],
    ["tokenizer.ggml.token_type", gguf.i32s(vocab.types)],
    ["tokenizer.ggml.bos_token_id", gguf.u32(2)],
    ["tokenizer.ggml.eos_token_id", gguf.u32(1)],
    ["tokenizer.ggml.unknown_token_id", gguf.u32(3)],
    ["tokenizer.ggml.padding_token_id", gguf.u32(0)],
    ["tokenizer.ggml.add_bos_token", gguf.bool(true)],
    ["tokenizer.ggml.add_space_prefix", gguf.bool(false)],
  ];
}

export function tinyGemma3Gguf(options: {
  shape?: TinyShape; architecture?: string; embeddingType?: number; seed?: number;
  dropMetadata?: string[];
  /** Metadata set (replaced or added) after the defaults. */
  setMetadata?: [string, GgufTypedValue][];
  /**
   * Scale of the post-attention and post-FFN norms (default 1). At 1 the scaled embedding
   * dominates the residual and greedy decoding repeats the last token; a larger gain makes the
   * output depend on the context, as tests of attention and caches need.
   */
  branchGain?: number;
} = {}): Uint8Array {
  const s = options.shape ?? tinyGemma3;
  const arch = options.architecture ?? "gemma3";
  const rand = random(options.seed ?? 1);
  const gain = options.branchGain ?? 1;
  const vocab = toyVocabulary();
  const f32 = (name: string, dims: number[], scale = 0.2, offset = 0): GgufTensorToWrite => {
    const n = dims.reduce((a, b) => a * b, 1);
    const data = new Float32Array(n);
    for (let i = 0; i < n; i++) data[i] = offset + rand() * scale;
    return { name, type: GgmlType.F32, dims, data: new Uint8Array(data.buffer) };
  };
  const e = s.embedding, q = s.heads * s.headDim, kv = s.kvHeads * s.headDim;
  const tensors: GgufTensorToWrite[] = [];
  if (options.embeddingType !== undefined) {
    const t = ggmlTypes.get(options.embeddingType)!; // raw zero blocks: only the type matters here
    tensors.push({ name: "token_embd.weight", type: t.id, dims: [e, vocab.tokens.length],
      data: new Uint8Array((e / t.blockValues) * t.blockBytes * vocab.tokens.length) });
  } else {
    tensors.push(f32("token_embd.weight", [e, vocab.tokens.length], 1));
  }
  tensors.push(f32("output_norm.weight", [e], 0.1, 1));
  for (let i = 0; i < s.layers; i++) {
    const p = `blk.${i}`;
    tensors.push(
      f32(`${p}.attn_norm.weight`, [e], 0.1, 1), f32(`${p}.attn_q.weight`, [e, q]),
      f32(`${p}.attn_k.weight`, [e, kv]), f32(`${p}.attn_v.weight`, [e, kv]),
      f32(`${p}.attn_q_norm.weight`, [s.headDim], 0.1, 1), f32(`${p}.attn_k_norm.weight`, [s.headDim], 0.1, 1),
      f32(`${p}.attn_output.weight`, [q, e]), f32(`${p}.post_attention_norm.weight`, [e], 0.1, gain),
      f32(`${p}.ffn_norm.weight`, [e], 0.1, 1), f32(`${p}.ffn_gate.weight`, [e, s.feedForward]),
      f32(`${p}.ffn_up.weight`, [e, s.feedForward]), f32(`${p}.ffn_down.weight`, [s.feedForward, e]),
      f32(`${p}.post_ffw_norm.weight`, [e], 0.1, gain),
    );
  }
  const metadata: [string, GgufTypedValue][] = [
    ["general.architecture", gguf.str(arch)],
    ["general.name", gguf.str("tiny-gemma3")],
    [`${arch}.context_length`, gguf.u32(512)],
    [`${arch}.embedding_length`, gguf.u32(e)],
    [`${arch}.block_count`, gguf.u32(s.layers)],
    [`${arch}.feed_forward_length`, gguf.u32(s.feedForward)],
    [`${arch}.attention.head_count`, gguf.u32(s.heads)],
    [`${arch}.attention.head_count_kv`, gguf.u32(s.kvHeads)],
    [`${arch}.attention.key_length`, gguf.u32(s.headDim)],
    [`${arch}.attention.value_length`, gguf.u32(s.headDim)],
    [`${arch}.attention.layer_norm_rms_epsilon`, gguf.f32(1e-6)],
    [`${arch}.rope.freq_base`, gguf.f32(1e6)],
    [`${arch}.attention.sliding_window`, gguf.u32(8)],
    ...toyTokenizerMetadata(),
  ];
  const set = options.setMetadata ?? [];
  const drop = new Set([...options.dropMetadata ?? [], ...set.map(([k]) => k)]);
  return writeGguf([...metadata.filter(([k]) => !drop.has(k)), ...set], tensors);
}
