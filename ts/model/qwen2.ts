// Qwen 2 / 2.5, as llama.cpp stores it in GGUF: Llama's pre-norm decoder with biases on the
// query, key and value projections and NeoX ("rotate half") RoPE, usually with tied embeddings.
// Sources: the Qwen2 technical report; transformers' modeling_qwen2.py; llama.cpp's
// src/models/qwen2.cpp. The graph is ts/model/llama.ts; the biases are found by name
// (blk.N.attn_{q,k,v}.bias) and added by the shared attention block.
import type { Hparams } from "./hparams.ts";
import { decoderConfig, type DecoderConfig } from "./llama.ts";

export function qwen2Config(meta: Hparams, vocab: number): DecoderConfig {
  return decoderConfig(meta, vocab, { ropeNeox: true, qkNorm: false });
}
