// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B), as llama.cpp stores it in GGUF: Qwen 3's attention
// (QK-norm, NeoX RoPE, GQA, head_dim set on its own), and in place of the dense FFN a mixture of
// experts in every layer: router logits → softmax → the top k (expert_used_count) → their
// probabilities renormalised to sum to 1 → the chosen experts' SwiGLU FFNs, weighted and summed
// (ts/model/moe.ts). No shared expert. Sources: the Qwen3 technical report; transformers'
// modeling_qwen3_moe.py; llama.cpp's src/models/qwen3moe.cpp and build_moe_ffn (which always
// renormalises for this family: the released models set norm_topk_prob).
import type { Backend, KvLayer, Weight } from "../backend/backend.ts";
import { InferError } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";
import { Hparams, LIMITS } from "./hparams.ts";
import {
  decoderBuffers, decoderOutput, forwardOne, LogitsHead, setBatchInputs, WeightTable,
  type DecoderBuffers,
} from "./layers.ts";
import {
  decoderConfig, loadAttentionHalf, preNormBlocks, type DecoderConfig, type PreNormLayer,
} from "./llama.ts";
import type { Batch, ForwardOptions, LogitsSink, Model, ModelInfo } from "./model.ts";
import { MoeBuffers, moeFfn, moeRowFloats, moeWeights, type MoeShape, type MoeWeights } from "./moe.ts";

// ---- hyperparameters ------------------------------------------------------------------------

export interface Qwen3MoeConfig extends DecoderConfig, MoeShape {}

export function qwen3moeConfig(meta: Hparams, vocab: number): Qwen3MoeConfig {
  const base = decoderConfig(meta, vocab, { ropeNeox: true, qkNorm: true });
  const experts = meta.int(".expert_count", { min: 1, max: LIMITS.experts });
  const expertsUsed = meta.int(".expert_used_count", { min: 1, max: experts });
  const expertFeedForward = meta.int(".expert_feed_forward_length",
    { min: 1, max: LIMITS.feedForward });
  const moe: MoeShape = {
    embedding: base.embedding, experts, expertsUsed, expertFeedForward, normalizeTopK: true,
  };
  // feedForward is the width the decoder's dense FFN buffers take: every layer here is MoE.
  return Object.freeze({ ...base, ...moe, feedForward: expertFeedForward,
    extraRowFloats: moeRowFloats(moe) });
}

// ---- one block ------------------------------------------------------------------------------

interface MoeLayer extends PreNormLayer {
  readonly moe: MoeWeights;
}

// ---- the model ------------------------------------------------------------------------------

/** x += attn(norm(x)); x += moe(norm(x)), then a final norm and the LM head. */
export class Qwen3Moe implements Model {
  readonly info: ModelInfo;
  private readonly tokenEmbedding: Weight;
  private readonly outputNorm: Weight;
  private readonly head: LogitsHead;
  private readonly blocks: MoeLayer[];
  private readonly buf: DecoderBuffers;
  private readonly moeBuf: MoeBuffers;

  constructor(readonly config: Qwen3MoeConfig, file: GgufFile, private readonly be: Backend,
    readonly maxBatch: number) {
    // Refused before any weight is read or uploaded.
    if (!be.experts) {
      throw new InferError("unsupported", `the ${be.name} backend does not run ` +
        `mixture-of-experts models (${config.architecture}) yet; use --backend cpu`);
    }
    const t = new WeightTable(file, be), c = config;
    this.tokenEmbedding = t.get("token_embd.weight", [c.embedding, c.vocab]);
    this.outputNorm = t.norm("output_norm.weight", [c.embedding]);
    const output = t.optional("output.weight", [c.embedding, c.vocab]) ?? this.tokenEmbedding;
    this.head = new LogitsHead(be, output, null, c.vocab, maxBatch);
    this.blocks = Array.from({ length: c.layers }, (_, i) => ({
      ...loadAttentionHalf(t, c, i, null),
      ffnNorm: t.norm(`blk.${i}.ffn_norm.weight`, [c.embedding]),
      moe: moeWeights(t, `blk.${i}`, c),
    }));
    this.info = {
      architecture: c.architecture, name: c.name, vocabSize: c.vocab,
      contextLength: c.contextLength, embedding: c.embedding, kvShapes: c.kvShapes,
      keyRope: this.blocks.map((l) => l.options.ropeK),
    };
    this.buf = decoderBuffers(be, maxBatch, c);
    this.moeBuf = new MoeBuffers(be, maxBatch, c);
  }

  forward(tokens: ArrayLike<number>, n: number, position: number, cache: readonly KvLayer[],
    options: ForwardOptions = {}): Float32Array {
    return forwardOne(this, tokens, n, position, cache, options);
  }

  forwardBatch(batch: Batch, sink: LogitsSink): void {
    const be = this.be, c = this.config, b = this.buf;
    const n = setBatchInputs(be, b, batch, this.maxBatch);
    be.embed(this.tokenEmbedding, b.ids, n, b.x);
    preNormBlocks(be, c, b, batch, n, this.blocks,
      (l) => moeFfn(be, b.normed, n, l.moe, c, this.moeBuf, b.branch));
    decoderOutput(be, b, batch, n, this.outputNorm, c.normEps, this.head, sink);
  }
}
