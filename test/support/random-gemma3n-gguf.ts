// A small random-weight Gemma 3n GGUF with the shapes llama.cpp's gemma3n graph hard-codes
// (src/models/gemma3n.cpp, llama-hparams.h): 20 layers with keys and values of their own, then
// layers that share them (their k/v tensors present, as llama.cpp's loader requires), laurel
// rank 64, 256 per-layer values, 4 AltUp streams, gaussian top-k in the first 10 layers, a
// soft-cap of 30 and sliding layers in a period of 5; the metadata as llama.cpp's converter
// writes it (conversion/gemma.py, Gemma3NModel), which infer reads and llama.cpp ignores. Narrow
// embedding and FFN widths and the toy vocabulary keep it quick. Deterministic for a given spec.
import { GgmlType } from "../../ts/gguf/types.ts";
import {
  gguf, writeGguf, type GgufTensorToWrite, type GgufTypedValue,
} from "../../ts/gguf/writer.ts";
import { randomTensorData } from "./random-quant-gguf.ts";
import { toyTokenizerMetadata, toyVocabulary } from "./tiny-gguf.ts";

/** llama.cpp's fixed values (n_layer_kv_from_start, laurel_rank, n_embd_altup, n_altup). */
const KV_LAYERS = 20, LAUREL_RANK = 64, PER_LAYER = 256, STREAMS = 4, SPARSE_LAYERS = 10;
/** normal_dist.icdf(0.95) in f32, the converter's activation_sparsity_scale for 0.95. */
const SPARSITY_SCALE = 1.6448533535003662;

export interface RandomGemma3nSpec {
  /** At least 20 + 5, so that a full-attention layer is among the sharing ones. */
  readonly layers: number;
  readonly embedding: number;
  readonly feedForward: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly window: number;
  readonly types: {
    readonly embed: number;
    readonly perLayerEmbed: number;
    /** attn_q, attn_k, attn_output, laurel_l, inp_gate, proj, the projections. */
    readonly matrix: number;
    readonly attnV: number;
    readonly ffn: number;
    readonly ffnDown: number;
    /** Matrices whose rows are laurel's 64 values (too short for a K-quant block). */
    readonly narrow: number;
    readonly output: number;
  };
  readonly seed: number;
}

function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13; s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5; s >>>= 0;
    return s / 2 ** 32;
  };
}

export function randomGemma3nGguf(s: RandomGemma3nSpec): Uint8Array {
  const vocab = toyVocabulary().tokens.length, e = s.embedding, f = s.feedForward, t = s.types;
  const q = s.heads * s.headDim, kv = s.kvHeads * s.headDim, all = PER_LAYER * s.layers;
  if (s.layers < KV_LAYERS + 5) throw new Error("random-gemma3n-gguf: at least 25 layers");
  let seed = s.seed * 1000;
  const tensors: GgufTensorToWrite[] = [];
  const matrix = (name: string, type: number, dims: number[], spread = 1 / Math.sqrt(dims[0])) => {
    const count = dims.reduce((a, b) => a * b, 1);
    tensors.push({ name, type, dims, data: randomTensorData(type, count, ++seed, spread) });
  };
  const vector = (name: string, n: number, centre: number, spread: number) => {
    const next = rng(++seed), v = new Float32Array(n);
    for (let i = 0; i < n; i++) v[i] = centre + spread * (next() * 2 - 1);
    tensors.push({ name, type: GgmlType.F32, dims: [n], data: new Uint8Array(v.buffer) });
  };
  matrix("token_embd.weight", t.embed, [e, vocab], 1);
  // A head 4× the usual spread: logits of a few units, so greedy margins are not all tiny.
  matrix("output.weight", t.output, [e, vocab], 4 / Math.sqrt(e));
  vector("output_norm.weight", e, 1, 0.1);
  matrix("altup_proj.weight", t.matrix, [e, e, STREAMS - 1]);
  matrix("altup_unembd_proj.weight", t.matrix, [e, e, STREAMS - 1]);
  matrix("per_layer_token_embd.weight", t.perLayerEmbed, [all, vocab], 1);
  matrix("per_layer_model_proj.weight", t.matrix, [e, all]);
  vector("per_layer_proj_norm.weight", PER_LAYER, 1, 0.1);
  for (let i = 0; i < s.layers; i++) {
    const p = `blk.${i}`;
    vector(`${p}.attn_norm.weight`, e, 1, 0.1);
    matrix(`${p}.attn_q.weight`, t.matrix, [e, q]);
    matrix(`${p}.attn_k.weight`, t.matrix, [e, kv]);
    matrix(`${p}.attn_v.weight`, t.attnV, [e, kv]);
    matrix(`${p}.attn_output.weight`, t.matrix, [q, e]);
    // Attention runs at scale 1 on normalised queries and keys: norms near 1 would make scores of
    // about √256 and a near-argmax softmax that any rounding flips; these give scores near 1.
    vector(`${p}.attn_q_norm.weight`, s.headDim, 0.25, 0.05);
    vector(`${p}.attn_k_norm.weight`, s.headDim, 0.25, 0.05);
    vector(`${p}.post_attention_norm.weight`, e, 1, 0.1);
    vector(`${p}.ffn_norm.weight`, e, 1, 0.1);
    matrix(`${p}.ffn_gate.weight`, t.ffn, [e, f]);
    matrix(`${p}.ffn_up.weight`, t.ffn, [e, f]);
    matrix(`${p}.ffn_down.weight`, t.ffnDown, [f, e]);
    // The FFN's output small beside the streams, as the sparse gate's cutoff amplifies rounding.
    vector(`${p}.post_ffw_norm.weight`, e, 0.1, 0.02);
    matrix(`${p}.inp_gate.weight`, t.matrix, [e, PER_LAYER]);
    matrix(`${p}.proj.weight`, t.matrix, [PER_LAYER, e]);
    vector(`${p}.post_norm.weight`, e, 1, 0.1);
    // The router and its coefficients stay F32 (rows of 4 values). Coefficients of 0.3 mix the
    // four streams (of magnitude ~20) so strongly that one flipped rounding of a quantized
    // activation moves the last layers' streams by percents; at 0.05 the model is tame enough for
    // two implementations to agree on greedy tokens.
    matrix(`${p}.altup_correct_coef.weight`, GgmlType.F32, [STREAMS, STREAMS], 0.05);
    vector(`${p}.altup_correct_scale.weight`, e, 1, 0.2);
    matrix(`${p}.altup_predict_coef.weight`, GgmlType.F32, [STREAMS, STREAMS * STREAMS], 0.05);
    matrix(`${p}.altup_router.weight`, GgmlType.F32, [e, STREAMS], 4);
    vector(`${p}.altup_router_norm.weight`, e, 1, 0.1);
    matrix(`${p}.laurel_l.weight`, t.matrix, [e, LAUREL_RANK]);
    matrix(`${p}.laurel_r.weight`, t.narrow, [LAUREL_RANK, e]);
    vector(`${p}.laurel_post_norm.weight`, e, 1, 0.1);
  }
  const arch = "gemma3n";
  const sparsity = Array.from({ length: s.layers }, (_, i) =>
    i < SPARSE_LAYERS ? SPARSITY_SCALE : -Infinity);
  const metadata: [string, GgufTypedValue][] = [
    ["general.architecture", gguf.str(arch)],
    ["general.name", gguf.str("random-gemma3n")],
    [`${arch}.context_length`, gguf.u32(32768)],
    [`${arch}.embedding_length`, gguf.u32(e)],
    [`${arch}.block_count`, gguf.u32(s.layers)],
    [`${arch}.feed_forward_length`,
      { type: "arr", element: "u32", value: Array(s.layers).fill(f) }],
    [`${arch}.attention.head_count`, gguf.u32(s.heads)],
    [`${arch}.attention.head_count_kv`, gguf.u32(s.kvHeads)],
    [`${arch}.attention.key_length`, gguf.u32(s.headDim)],
    [`${arch}.attention.value_length`, gguf.u32(s.headDim)],
    [`${arch}.attention.layer_norm_rms_epsilon`, gguf.f32(1e-6)],
    [`${arch}.rope.freq_base`, gguf.f32(1e6)],
    [`${arch}.rope.freq_base_swa`, gguf.f32(1e4)],
    [`${arch}.attention.sliding_window`, gguf.u32(s.window)],
    [`${arch}.final_logit_softcapping`, gguf.f32(30)],
    [`${arch}.altup.active_idx`, gguf.u32(0)],
    [`${arch}.altup.num_inputs`, gguf.u32(STREAMS)],
    [`${arch}.embedding_length_per_layer_input`, gguf.u32(PER_LAYER)],
    [`${arch}.attention.shared_kv_layers`, gguf.u32(s.layers - KV_LAYERS)],
    [`${arch}.activation_sparsity_scale`, gguf.f32s(sparsity)],
    // llama.cpp reads a period of 5 where it finds this array; the converter writes the layers'
    // kinds, here the same period.
    [`${arch}.attention.sliding_window_pattern`,
      { type: "arr", element: "bool",
        value: Array.from({ length: s.layers }, (_, i) => i % 5 < 4) }],
    ...toyTokenizerMetadata(),
  ];
  return writeGguf(metadata, tensors);
}

/** Q4_K_M's kind of mix: Q4_K matrices, Q6_K values, FFN down and head, Q8_0 where rows are 64. */
export const gemma3nKQuants: RandomGemma3nSpec = {
  layers: 30, embedding: 256, feedForward: 768, heads: 2, kvHeads: 1, headDim: 256, window: 8,
  types: { embed: GgmlType.Q6_K, perLayerEmbed: GgmlType.Q6_K, matrix: GgmlType.Q4_K,
    attnV: GgmlType.Q6_K, ffn: GgmlType.Q4_K, ffnDown: GgmlType.Q6_K, narrow: GgmlType.Q8_0,
    output: GgmlType.Q6_K },
  seed: 41,
};

/** Every matrix Q8_0 (the router and coefficients F32). */
export const gemma3nQ8_0: RandomGemma3nSpec = {
  layers: 25, embedding: 256, feedForward: 512, heads: 2, kvHeads: 1, headDim: 256, window: 8,
  types: { embed: GgmlType.Q8_0, perLayerEmbed: GgmlType.Q8_0, matrix: GgmlType.Q8_0,
    attnV: GgmlType.Q8_0, ffn: GgmlType.Q8_0, ffnDown: GgmlType.Q8_0, narrow: GgmlType.Q8_0,
    output: GgmlType.Q8_0 },
  seed: 43,
};
