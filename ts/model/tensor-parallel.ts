// Tensor parallelism's sharding plan (Megatron-LM, Shoeybi et al. 2019): for N ranks (GPUs), which
// part of each GGUF tensor every rank holds, and the bytes of the mapped file that are that part,
// so each rank's weights go from the file to its own card and no card ever holds the whole model.
//
// ggml stores a matrix as dims [n_in, n_out]: n_out rows of n_in values, each row whole quant
// blocks. Two splits follow from that layout:
// - "rows" (the output dimension: Q, K, V, FFN gate and up, the LM head by vocabulary): a rank's
//   part is a run of whole rows, one contiguous byte range of the file, any quant type.
// - "columns" (the input dimension: the attention output and the FFN down projection): a rank's
//   part is the same run of blocks in every row, a strided copy (n_out runs a row's bytes apart;
//   cuMemcpy2D's srcPitch). A quant block cannot be cut, so each rank's columns must be whole
//   blocks: heads/N × head_dim and feed_forward/N multiples of the type's block (32, or 256 for
//   K-quants).
// Each rank then computes a partial sum of the attention output and of the FFN output; one
// all-reduce after each adds the partials. Everything else (token embedding, norms, RoPE factors)
// is replicated: it is a few vectors, plus the embedding table, which a lookup needs whole.
import { InferError } from "../errors.ts";
import type { GgufTensorInfo } from "../gguf/reader.ts";
import { rowBytes } from "../gguf/types.ts";
import type { ModelShape } from "./model.ts";

/** What rank `rank` of `ranks` computes: its heads, its FFN columns, its vocabulary rows. */
export interface RankShape {
  readonly rank: number;
  readonly ranks: number;
  /** Query heads firstHead .. firstHead + heads - 1: those that read its KV heads (GQA groups). */
  readonly firstHead: number;
  readonly heads: number;
  readonly firstKvHead: number;
  readonly kvHeads: number;
  /** FFN hidden units firstFfn .. firstFfn + feedForward - 1. */
  readonly firstFfn: number;
  readonly feedForward: number;
  /** LM head rows (token ids) firstVocab .. firstVocab + vocab - 1; the logits are gathered. */
  readonly firstVocab: number;
  readonly vocab: number;
}

/**
 * How a tensor is shared out: whole on every rank; `rows` (of the GGUF matrix, or values of a
 * vector) first .. first + count - 1 on each rank; or `columns` (values within each row).
 */
export type TensorSplit =
  | { readonly kind: "replicated" }
  | { readonly kind: "rows" | "columns"; readonly part: (r: RankShape) => { first: number; count: number } };

/**
 * One rank's part of a tensor in the file: `rows` runs of `bytes` bytes, `pitch` bytes apart,
 * from `offset` bytes into the tensor's data (contiguous where rows is 1). A GPU uploads it with
 * one cuMemcpy2D from the mapped file; the host copy is copySlice.
 */
export interface SliceCopy {
  readonly offset: number;
  readonly bytes: number;
  readonly pitch: number;
  readonly rows: number;
}

/** A rank's part of one tensor: its shape on that rank (ggml order) and where its bytes are. */
export interface RankTensor {
  readonly name: string;
  /** The file's tensor the part is cut from (token_embd for a tied LM head). */
  readonly source: string;
  readonly dims: readonly number[];
  readonly copy: SliceCopy;
}

/** The rank shapes of a model split `ranks` ways; refuses a split the shapes do not allow. */
export function rankShapes(shape: ModelShape, ranks: number): readonly RankShape[] {
  if (!(Number.isInteger(ranks) && ranks >= 1)) {
    throw new InferError("invalid_argument", `--gpus must be a whole number of at least 1, got ${ranks}`);
  }
  const { heads, kvHeads, feedForward, vocab } = shape;
  if (kvHeads % ranks !== 0 || heads % kvHeads !== 0) {
    throw new InferError("unsupported", `${ranks} GPUs: the model's ${kvHeads} KV heads (and ` +
      `${heads} query heads) do not split evenly ${ranks} ways; each GPU must hold whole KV heads`);
  }
  if (feedForward % ranks !== 0) {
    throw new InferError("unsupported", `${ranks} GPUs: the FFN's ${feedForward} units do not ` +
      `split evenly ${ranks} ways`);
  }
  return Array.from({ length: ranks }, (_, rank) => {
    const kv = kvHeads / ranks, q = heads / ranks, ff = feedForward / ranks;
    // Vocabulary rows are whole rows of any type, so an uneven split is fine.
    const firstVocab = Math.floor((rank * vocab) / ranks);
    return Object.freeze({
      rank, ranks, firstHead: rank * q, heads: q, firstKvHead: rank * kv, kvHeads: kv,
      firstFfn: rank * ff, feedForward: ff, firstVocab,
      vocab: Math.floor(((rank + 1) * vocab) / ranks) - firstVocab,
    });
  });
}

type Part = (r: RankShape) => { first: number; count: number };

/**
 * The split of a tensor by its GGUF name. Mixture-of-experts tensors (3-D), fused projections
 * (Phi-3's attn_qkv) and any other matrix without a known split are refused by name: replicating
 * an unknown matrix would silently give wrong partial sums.
 */
export function splitOf(t: Pick<GgufTensorInfo, "name" | "dims">, shape: ModelShape): TensorSplit {
  const hd = shape.headDim, local = t.name.replace(/^blk\.\d+\./, "");
  const rows = (part: Part): TensorSplit => ({ kind: "rows", part });
  const columns = (part: Part): TensorSplit => ({ kind: "columns", part });
  switch (local) {
    case "attn_q.weight": case "attn_q.bias":
      return rows((r) => ({ first: r.firstHead * hd, count: r.heads * hd }));
    case "attn_k.weight": case "attn_k.bias": case "attn_v.weight": case "attn_v.bias":
      return rows((r) => ({ first: r.firstKvHead * hd, count: r.kvHeads * hd }));
    case "attn_output.weight":
      return columns((r) => ({ first: r.firstHead * hd, count: r.heads * hd }));
    case "ffn_gate.weight": case "ffn_up.weight":
      return rows((r) => ({ first: r.firstFfn, count: r.feedForward }));
    case "ffn_down.weight":
      return columns((r) => ({ first: r.firstFfn, count: r.feedForward }));
    case "output.weight": case "output.bias":
      return rows((r) => ({ first: r.firstVocab, count: r.vocab }));
    // The embedding is looked up whole; where the head is tied to it, the head is its vocab rows.
    case "token_embd.weight": return { kind: "replicated" };
  }
  // Norms, RoPE factors, the attention output bias (added once, after the all-reduce).
  if (t.dims.length === 1) return { kind: "replicated" };
  throw new InferError("unsupported", `tensor parallelism does not split '${t.name}' ` +
    `([${t.dims}]) yet: fused projections and mixture-of-experts layers run on one GPU`);
}

/** The LM head's split where it is tied to token_embd (no output.weight): vocabulary rows. */
export const tiedHeadSplit: TensorSplit = {
  kind: "rows", part: (r) => ({ first: r.firstVocab, count: r.vocab }),
};

/**
 * Rank r's part of tensor t under `split`: its dims and its bytes in the file. Refuses a column
 * split that would cut a quant block.
 */
export function rankTensor(t: GgufTensorInfo, split: TensorSplit, r: RankShape, name = t.name): RankTensor {
  const total = t.byteLength;
  if (split.kind === "replicated") {
    return { name, source: t.name, dims: t.dims, copy: { offset: 0, bytes: total, pitch: total, rows: 1 } };
  }
  const { first, count } = split.part(r);
  if (t.dims.length === 1) { // a vector (a bias): its values first .. first + count - 1
    if (split.kind !== "rows" || first + count > t.dims[0]) {
      throw new InferError("bad_model", `tensor '${t.name}' [${t.dims}] cannot give ${first}+${count}`);
    }
    return { name, source: t.name, dims: [count], copy: { offset: rowBytes(t.type, first), bytes: rowBytes(t.type, count),
      pitch: rowBytes(t.type, count), rows: 1 } };
  }
  if (t.dims.length !== 2) throw new InferError("bad_model", `tensor '${t.name}' is not a matrix`);
  const [cols, rowsAll] = t.dims as [number, number];
  const pitch = rowBytes(t.type, cols);
  if (split.kind === "rows") {
    if (first + count > rowsAll) {
      throw new InferError("bad_model", `tensor '${t.name}' has ${rowsAll} rows, not ${first + count}`);
    }
    return { name, source: t.name, dims: [cols, count], copy: { offset: first * pitch, bytes: count * pitch,
      pitch: count * pitch, rows: 1 } };
  }
  const block = t.type.blockValues;
  if (first % block !== 0 || count % block !== 0 || first + count > cols) {
    throw new InferError("unsupported", `${r.ranks} GPUs: '${t.name}' (${t.type.name}, ${block}-value ` +
      `blocks) would be cut at column ${first} of ${cols}; each GPU's ${count} columns must be ` +
      `whole blocks`);
  }
  return { name, source: t.name, dims: [count, rowsAll], copy: { offset: rowBytes(t.type, first), bytes: rowBytes(t.type, count),
    pitch, rows: rowsAll } };
}

/**
 * Every tensor of a model as rank r holds it: the replicated ones whole, the split ones cut. A
 * tied LM head (no output.weight) appears as an "output.weight" of token_embd's vocab rows.
 */
export function rankTensors(tensors: ReadonlyMap<string, GgufTensorInfo>, shape: ModelShape,
  r: RankShape): RankTensor[] {
  const tied = !tensors.has("output.weight");
  const out: RankTensor[] = [];
  for (const t of tensors.values()) out.push(rankTensor(t, splitOf(t, shape), r));
  const embd = tensors.get("token_embd.weight");
  if (tied && embd) out.push(rankTensor(embd, tiedHeadSplit, r, "output.weight"));
  return out;
}

/** The bytes of a slice, packed (a host copy of what cuMemcpy2D moves): for tests and checks. */
export function copySlice(tensorBytes: Uint8Array, c: SliceCopy): Uint8Array {
  const out = new Uint8Array(c.bytes * c.rows);
  for (let i = 0; i < c.rows; i++) {
    const at = c.offset + i * c.pitch;
    out.set(tensorBytes.subarray(at, at + c.bytes), i * c.bytes);
  }
  return out;
}

/** Bytes rank r holds of a model: what must fit on its card (weights only). */
export function rankWeightBytes(parts: readonly RankTensor[]): number {
  return parts.reduce((sum, p) => sum + p.copy.bytes * p.copy.rows, 0);
}
