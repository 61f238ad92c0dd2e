// Sentence embeddings from a decoder's last hidden state (after the final norm, before the LM
// head): the rows of one input pooled into one vector, then L2-normalised, as llama.cpp's
// llama-embedding does with `--pooling mean|cls|last --embd-normalize 2`.
//
// Which pooling a model wants is its GGUF's `<arch>.pooling_type` (llama.cpp's enum: 0 none,
// 1 mean, 2 cls, 3 last, 4 rank). A model without the key (a plain decoder such as Gemma 3 or
// Llama), or with "none" (per-token vectors, which infer does not return), is pooled by mean:
// the choice llama.cpp users make for such models with `--pooling mean`. "rank" (a reranker)
// scores with a classifier head infer does not run: such a model has no pooling of its own
// (null), and embeds only with one asked for; it still loads and generates.
import { InferError } from "../errors.ts";
import type { Hparams } from "./hparams.ts";

export type Pooling = "mean" | "cls" | "last";

export const POOLINGS: readonly Pooling[] = ["mean", "cls", "last"];

/** llama.cpp's enum llama_pooling_type, as GGUF stores it. */
const GGUF_POOLING: Readonly<Record<number, Pooling | "none" | "rank">> = {
  0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank",
};

/** The pooling a model's metadata asks for (mean where it asks for none; null for rank). */
export function declaredPooling(meta: Hparams): Pooling | null {
  if (!meta.has(".pooling_type")) return "mean";
  const declared = GGUF_POOLING[meta.int(".pooling_type", { min: 0, max: 4 })];
  if (declared === "none") return "mean";
  return declared === "rank" ? null : declared;
}

/** Reads a pooling's name (an option, a flag, a request field). */
export function parsePooling(value: unknown, what: string): Pooling {
  if (typeof value === "string" && (POOLINGS as readonly string[]).includes(value)) {
    return value as Pooling;
  }
  throw new InferError("invalid_argument",
    `${what}: expected one of ${POOLINGS.join(", ")}, got ${JSON.stringify(value) ?? "nothing"}`);
}

/**
 * Pools one input's hidden rows as they come, a batch's share at a time (a long input is
 * evaluated over several forward passes): mean sums them (in f64), cls keeps the first, last
 * the last.
 */
export class Pooler {
  private readonly acc: Float64Array;
  private seen = 0;

  constructor(readonly pooling: Pooling, readonly width: number, readonly rowsTotal: number) {
    if (!(rowsTotal >= 1)) throw new InferError("invalid_argument", "nothing to embed");
    this.acc = new Float64Array(width);
  }

  /** Takes the next `rows` hidden rows of the input (rows × width values, row after row). */
  add(rows: number, values: Float32Array): void {
    const w = this.width;
    if (values.length !== rows * w || this.seen + rows > this.rowsTotal) {
      throw new InferError("internal", `pooling ${rows} rows of ${values.length / rows} ` +
        `values at row ${this.seen} of ${this.rowsTotal}x${w}`);
    }
    if (this.pooling === "mean") {
      for (let r = 0; r < rows; r++) {
        for (let i = 0; i < w; i++) this.acc[i] += values[r * w + i];
      }
    } else if (this.pooling === "cls" && this.seen === 0) {
      for (let i = 0; i < w; i++) this.acc[i] = values[i];
    } else if (this.pooling === "last" && this.seen + rows === this.rowsTotal) {
      for (let i = 0; i < w; i++) this.acc[i] = values[(rows - 1) * w + i];
    }
    this.seen += rows;
  }

  get complete(): boolean {
    return this.seen === this.rowsTotal;
  }

  /** The pooled vector, L2-normalised unless `normalize` is false (a zero vector stays zero). */
  result(normalize = true): Float32Array {
    if (!this.complete) {
      throw new InferError("internal", `pooled ${this.seen} of ${this.rowsTotal} rows`);
    }
    const scale = this.pooling === "mean" ? 1 / this.rowsTotal : 1;
    const out = new Float32Array(this.width);
    for (let i = 0; i < this.width; i++) out[i] = this.acc[i] * scale;
    return normalize ? l2Normalize(out) : out;
  }
}

/** x / ‖x‖₂ in place (a zero vector stays zero, as llama.cpp's common_embd_normalize). */
export function l2Normalize(x: Float32Array): Float32Array {
  let sum = 0;
  for (const v of x) sum += v * v;
  const norm = Math.sqrt(sum);
  if (norm > 0) for (let i = 0; i < x.length; i++) x[i] /= norm;
  return x;
}
