// Qwen 3 (dense), as llama.cpp stores it in GGUF: Llama's pre-norm decoder with QK-norm (an
// RMSNorm over head_dim on every query and key head, before RoPE), no attention biases, NeoX
// RoPE, and head_dim set on its own (128 even where hidden / heads differs). Sources: the Qwen3
// technical report; transformers' modeling_qwen3.py; llama.cpp's src/models/qwen3.cpp. The graph
// is ts/model/llama.ts; QK-norm is required here (blk.N.attn_{q,k}_norm.weight).
import type { Hparams } from "./hparams.ts";
import { decoderConfig, type DecoderConfig } from "./llama.ts";

export function qwen3Config(meta: Hparams, vocab: number): DecoderConfig {
  return decoderConfig(meta, vocab, { ropeNeox: true, qkNorm: true });
}
