// A llama-family decoder (llama, qwen2, qwen3) run tensor-parallel over N ranks, each a backend
// holding its part of the weights (tensor-parallel.ts): its query and KV heads and their cache,
// its columns of the FFN, its rows of the LM head. Per block, as Megatron-LM: each rank computes
// its heads' attention and a partial W_o product, one all-reduce sums the partials; each rank
// computes its FFN units and a partial W_down product, a second all-reduce sums those; the
// residual stream, the norms and the embedding are the same on every rank. The logits are
// gathered, each rank's vocabulary rows in turn. The collectives are an interface: NCCL on GPUs,
// host sums (HostCollective) for the CPU ranks that prove the arithmetic.
import type { Activation, Backend, KvLayer, KvType, KvTypes, Weight } from "../backend/backend.ts";
import { InferError } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";
import {
  decoderBuffers, ffnWeights, forwardOne, gatedFfn, selfAttention, setBatchInputs, WeightTable,
  type DecoderBuffers, type FfnWeights,
} from "./layers.ts";
import { loadAttentionHalf, type AttentionHalf, type DecoderConfig } from "./llama.ts";
import type { Batch, ForwardOptions, LogitsSink, Model, ModelInfo } from "./model.ts";
import type { RankShape } from "./tensor-parallel.ts";

/** The two collectives a tensor-parallel step needs, over one activation per rank. */
export interface Collective {
  /** Each rank's first `rows` rows become the sum over ranks (ncclAllReduce, ncclSum). */
  allReduceSum(parts: readonly Activation[], rows: number): void;
  /** Row i of the result is rank 0's row i, then rank 1's, … (ncclAllGather, then a read). */
  gatherRows(parts: readonly Activation[], rows: number, out: Float32Array): void;
}

/** A rank: its backend and its part of the weights, as a GGUF whose tensors are its slices. */
export interface Rank {
  readonly shape: RankShape;
  readonly be: Backend;
  readonly file: GgufFile;
}

/** One layer's cache across ranks: rank r's layer holds its KV heads. */
export class ShardedKvLayer implements KvLayer {
  readonly cells: number;
  readonly ring: boolean;
  readonly kvHeads: number;
  readonly headDim: number;
  constructor(readonly parts: readonly KvLayer[]) {
    this.cells = parts[0].cells;
    this.ring = parts[0].ring;
    this.kvHeads = parts.reduce((n, p) => n + p.kvHeads, 0);
    this.headDim = parts[0].headDim;
  }
}

interface RankLayer extends AttentionHalf {
  readonly ffnNorm: Weight;
  readonly ffn: FfnWeights;
}

interface RankState {
  readonly be: Backend;
  readonly shape: RankShape;
  readonly blocks: readonly RankLayer[];
  readonly embedding: Weight;
  readonly outputNorm: Weight;
  /** This rank's vocabulary rows of the LM head. */
  readonly head: Weight;
  readonly buf: DecoderBuffers;
  logits: Activation | null;
}

/** Rows of logits one gather holds: about 32 MiB of them across ranks, as LogitsHead. */
const LOGIT_CHUNK_VALUES = 8 << 20;

export class TensorParallelLlama implements Model {
  readonly info: ModelInfo;
  private readonly ranks: readonly RankState[];
  private gathered: Float32Array | null = null;

  constructor(readonly config: DecoderConfig, ranks: readonly Rank[], private readonly collective: Collective,
    readonly maxBatch: number) {
    const c = config;
    if (!["llama", "qwen2", "qwen3"].includes(c.architecture)) {
      throw new InferError("unsupported", `tensor parallelism runs llama, qwen2 and qwen3 models, ` +
        `not ${c.architecture}, yet`);
    }
    this.ranks = ranks.map(({ shape: s, be, file }) => {
      const t = new WeightTable(file, be);
      const rc: DecoderConfig = { ...c, heads: s.heads, kvHeads: s.kvHeads, feedForward: s.feedForward };
      const ropeFactors = t.optionalVector("rope_freqs.weight", [c.headDim / 2]);
      const blocks = Array.from({ length: c.layers }, (_, i): RankLayer => {
        const half = loadAttentionHalf(t, rc, i, ropeFactors);
        // The output bias is added once: by rank 0, before the partials are summed.
        const attention = s.rank === 0 ? half.attention : { ...half.attention, outputBias: null };
        return { ...half, attention, ffnNorm: t.norm(`blk.${i}.ffn_norm.weight`, [c.embedding]),
          ffn: ffnWeights(t, `blk.${i}`, c.embedding, s.feedForward) };
      });
      if (t.has("output.bias")) {
        throw new InferError("unsupported", "tensor parallelism with an LM head bias");
      }
      return { be, shape: s, blocks, embedding: t.get("token_embd.weight", [c.embedding, c.vocab]),
        outputNorm: t.norm("output_norm.weight", [c.embedding]),
        head: t.get("output.weight", [c.embedding, s.vocab]),
        buf: decoderBuffers(be, maxBatch, rc), logits: null };
    });
    this.info = {
      architecture: c.architecture, name: c.name, vocabSize: c.vocab, contextLength: c.contextLength,
      embedding: c.embedding, kvShapes: c.kvShapes, keyRope: this.ranks[0].blocks.map((l) => ({
        ...l.options.ropeK, heads: c.kvHeads })),
    };
  }

  /** A sequence's cache: per layer, each rank's layer of its KV heads. */
  cache(cells: number, type: KvType | KvTypes): ShardedKvLayer[] {
    return Array.from({ length: this.config.layers }, () => new ShardedKvLayer(
      this.ranks.map((r) => r.be.kvLayer(cells, r.shape.kvHeads, this.config.headDim, type, false))));
  }

  forward(tokens: ArrayLike<number>, n: number, position: number, cache: readonly KvLayer[],
    options: ForwardOptions = {}): Float32Array {
    return forwardOne(this, tokens, n, position, cache, options);
  }

  forwardBatch(batch: Batch, sink: LogitsSink): void {
    if (batch.greedy || batch.argmaxSink || batch.hidden) {
      throw new InferError("unsupported", "tensor parallelism gives logits only (no device greedy, " +
        "argmax rows or hidden states yet)");
    }
    const c = this.config, ranks = this.ranks;
    let n = 0;
    const segments = ranks.map((r) => batch.segments.map((s) => ({ ...s,
      cache: s.cache.map((l) => sharded(l).parts[r.shape.rank]) })));
    ranks.forEach((r, i) => {
      n = setBatchInputs(r.be, r.buf, { ...batch, segments: segments[i] }, this.maxBatch);
      r.be.embed(r.embedding, r.buf.ids, n, r.buf.x);
    });
    const branches = ranks.map((r) => r.buf.branch);
    for (let l = 0; l < c.layers; l++) {
      ranks.forEach((r, i) => {
        const b = r.buf, w = r.blocks[l];
        r.be.rmsNorm(b.x, w.attentionNorm, n, c.normEps, b.normed);
        selfAttention(r.be, b.normed, n, segments[i], l, b.positions, w.attention, w.options, b.attn, b.branch);
      });
      this.collective.allReduceSum(branches, n);
      ranks.forEach((r) => {
        const b = r.buf, w = r.blocks[l];
        r.be.add(b.x, b.branch, n, b.x);
        r.be.rmsNorm(b.x, w.ffnNorm, n, c.normEps, b.normed);
        gatedFfn(r.be, b.normed, n, w.ffn, "silu", b.ffn, b.branch);
      });
      this.collective.allReduceSum(branches, n);
      ranks.forEach((r) => r.be.add(r.buf.x, r.buf.branch, n, r.buf.x));
    }
    if (batch.logitRows === 0) return;
    const chunkRows = Math.max(1, Math.min(this.maxBatch, Math.floor(LOGIT_CHUNK_VALUES / c.vocab)));
    for (const r of ranks) {
      r.be.rmsNorm(r.buf.x, r.outputNorm, n, c.normEps, r.buf.normed);
      r.logits ??= r.be.activation("logits", chunkRows, r.shape.vocab);
    }
    this.gathered ??= new Float32Array(chunkRows * c.vocab);
    const first = n - batch.logitRows;
    for (let row = first; row < n; row += chunkRows) {
      const rows = Math.min(chunkRows, n - row);
      for (const r of ranks) r.be.matmul(r.head, r.buf.normed, rows, r.logits!, row);
      const out = this.gathered.subarray(0, rows * c.vocab);
      this.collective.gatherRows(ranks.map((r) => r.logits!), rows, out);
      sink(row, rows, out);
    }
  }
}

function sharded(layer: KvLayer): ShardedKvLayer {
  if (!(layer instanceof ShardedKvLayer)) {
    throw new InferError("internal", "a tensor-parallel model needs its own cache (cache())");
  }
  return layer;
}

/**
 * The collectives on ranks whose activations live in host memory (CPU backends, where read()
 * is a view of the activation itself): the sum in rank order, each add rounded to f32 as a
 * device's f32 add is.
 */
export class HostCollective implements Collective {
  private sum = new Float32Array(0);

  constructor(private readonly backends: readonly Backend[]) {
    if (backends.some((b) => b.name !== "cpu")) {
      throw new InferError("internal", "HostCollective needs host-memory (cpu) ranks");
    }
  }

  allReduceSum(parts: readonly Activation[], rows: number): void {
    const views = parts.map((p, r) => this.backends[r].read(p, rows));
    if (this.sum.length < views[0].length) this.sum = new Float32Array(views[0].length);
    const sum = this.sum.subarray(0, views[0].length);
    sum.set(views[0]);
    for (let r = 1; r < views.length; r++) {
      const v = views[r];
      for (let j = 0; j < sum.length; j++) sum[j] += v[j];
    }
    for (const v of views) v.set(sum);
  }

  gatherRows(parts: readonly Activation[], rows: number, out: Float32Array): void {
    const width = parts.reduce((n, p) => n + p.cols, 0);
    let col = 0;
    parts.forEach((p, r) => {
      const v = this.backends[r].read(p, rows);
      for (let i = 0; i < rows; i++) out.set(v.subarray(i * p.cols, (i + 1) * p.cols), i * width + col);
      col += p.cols;
    });
  }
}
