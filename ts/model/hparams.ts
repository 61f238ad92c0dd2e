// Parse at the boundary: raw GGUF metadata becomes validated numbers here, bounded before they
// size an allocation or index anything, and every size derived from them checked to be an
// integer that divides as the architecture needs (require). Keys starting with "." are under
// the architecture's prefix ("gemma3.block_count"). Nothing downstream reads raw metadata keys.
import { InferError, quote } from "../errors.ts";
import type { GgufValue } from "../gguf/reader.ts";

export interface Bounds { min?: number; max?: number; fallback?: number }

export class Hparams {
  constructor(readonly metadata: ReadonlyMap<string, GgufValue>, readonly architecture: string) {}

  private key(k: string): string {
    return k.startsWith(".") ? this.architecture + k : k;
  }

  private bad(key: string, why: string): never {
    throw new InferError("bad_model", `model metadata '${this.key(key)}' ${why}`);
  }

  /** Refuses the file, naming `key`, unless `ok` (a derived size that must divide, say). */
  require(ok: boolean, key: string, why: string): void {
    if (!ok) this.bad(key, why);
  }

  has(k: string): boolean {
    return this.metadata.has(this.key(k));
  }

  int(k: string, bounds: Bounds = {}): number {
    const v = this.metadata.get(this.key(k));
    if (v === undefined) {
      if (bounds.fallback !== undefined) return bounds.fallback;
      return this.bad(k, "is missing");
    }
    if (typeof v !== "number" || !Number.isInteger(v)) {
      return this.bad(k, `is not an integer (${describe(v)})`);
    }
    const min = bounds.min ?? 0, max = bounds.max ?? 2 ** 31 - 1;
    if (v < min || v > max) return this.bad(k, `is ${v}, outside ${min}..${max}`);
    return v;
  }

  float(k: string, bounds: Bounds = {}): number {
    const v = this.metadata.get(this.key(k));
    if (v === undefined) {
      if (bounds.fallback !== undefined) return bounds.fallback;
      return this.bad(k, "is missing");
    }
    if (typeof v !== "number" || !Number.isFinite(v)) {
      return this.bad(k, `is not a finite number (${describe(v)})`);
    }
    if ((bounds.min !== undefined && v < bounds.min) || (bounds.max !== undefined && v > bounds.max)) {
      return this.bad(k, `is ${v}, outside ${bounds.min ?? "-inf"}..${bounds.max ?? "inf"}`);
    }
    return v;
  }

  /**
   * One integer per layer: a scalar for every layer, or an array of `count` (as llama.cpp's
   * get_key_or_arr reads feed_forward_length), each within the bounds.
   */
  perLayerInt(k: string, count: number, bounds: Bounds = {}): number[] {
    const v = this.metadata.get(this.key(k));
    if (v === undefined || typeof v !== "object") return Array(count).fill(this.int(k, bounds));
    const values = this.array(k, v, count);
    const min = bounds.min ?? 0, max = bounds.max ?? 2 ** 31 - 1;
    return values.map((x, i) => {
      if (typeof x !== "number" || !Number.isInteger(x) || x < min || x > max) {
        return this.bad(k, `[${i}] is not an integer in ${min}..${max}`);
      }
      return x;
    });
  }

  /** An array of `count` numbers (infinities allowed: a converter's "none"); null where absent. */
  floats(k: string, count: number): number[] | null {
    const v = this.metadata.get(this.key(k));
    if (v === undefined) return null;
    return this.array(k, v, count).map((x, i) => {
      if (typeof x !== "number" || Number.isNaN(x)) return this.bad(k, `[${i}] is not a number`);
      return x;
    });
  }

  /** An array of `count` booleans; null where absent or a scalar. */
  bools(k: string, count: number): boolean[] | null {
    const v = this.metadata.get(this.key(k));
    if (v === undefined || typeof v !== "object") return null;
    return this.array(k, v, count).map((x, i) => {
      if (typeof x !== "boolean") return this.bad(k, `[${i}] is not a boolean`);
      return x;
    });
  }

  private array(k: string, v: GgufValue, count: number): unknown[] {
    if (typeof v !== "object" || v instanceof BigInt64Array || v instanceof BigUint64Array) {
      return this.bad(k, `is not an array of ${count} (${describe(v)})`);
    }
    if (v.length !== count) return this.bad(k, `has ${v.length} values, not ${count}`);
    return Array.from(v as ArrayLike<unknown>);
  }

  string(k: string, fallback?: string): string {
    const v = this.metadata.get(this.key(k));
    if (v === undefined && fallback !== undefined) return fallback;
    if (typeof v !== "string") return this.bad(k, v === undefined ? "is missing" : "is not a string");
    return v;
  }
}

/** A metadata value for a message: numbers as they are, strings quoted, arrays by length. */
function describe(v: GgufValue): string {
  if (typeof v === "string") return quote(v);
  if (typeof v === "number" || typeof v === "bigint" || typeof v === "boolean") return String(v);
  return `an array of ${v.length}`;
}

/**
 * Upper bounds that no real model exceeds; they keep a hostile file from sizing huge buffers.
 * headDim and queryGroup are also the CPU kernels' limits (lib/cpu/attention.zig head_dim_max,
 * group_max; rope.zig rot_dims_max).
 */
export const LIMITS = {
  layers: 1024, embedding: 1 << 16, heads: 1024, headDim: 1024, queryGroup: 256, vocab: 1 << 22,
  context: 1 << 24, feedForward: 1 << 18, experts: 1 << 12,
} as const;

/** The attention's shape, as every architecture here reads it. */
export interface AttentionHparams {
  readonly embedding: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
}

/**
 * Embedding width, query and key/value heads and the head size, each derived size checked:
 * key/value heads divide the query heads (at most LIMITS.queryGroup to one), a head size taken
 * from embedding / heads (no key_length) is a whole number, and every head size is even (RoPE
 * rotates pairs) and the same for keys and values.
 */
export function attentionHparams(meta: Hparams): AttentionHparams {
  const embedding = meta.int(".embedding_length", { min: 1, max: LIMITS.embedding });
  const heads = meta.int(".attention.head_count", { min: 1, max: LIMITS.heads });
  const kvHeads = meta.int(".attention.head_count_kv", { min: 1, max: heads, fallback: heads });
  meta.require(heads % kvHeads === 0, ".attention.head_count_kv",
    `is ${kvHeads}, which does not divide head_count ${heads}`);
  meta.require(heads / kvHeads <= LIMITS.queryGroup, ".attention.head_count_kv",
    `is ${kvHeads}: more than ${LIMITS.queryGroup} query heads (${heads}) to a key head`);
  if (!meta.has(".attention.key_length")) {
    meta.require(embedding % heads === 0, ".attention.key_length", `is missing, and ` +
      `embedding_length ${embedding} / head_count ${heads} is not a whole head size`);
    meta.require(embedding / heads <= LIMITS.headDim, ".attention.key_length", `is missing, and ` +
      `embedding_length ${embedding} / head_count ${heads} is over ${LIMITS.headDim}`);
  }
  const headDim = meta.int(".attention.key_length", {
    min: 2, max: LIMITS.headDim, fallback: embedding / heads,
  });
  meta.require(headDim % 2 === 0, ".attention.key_length",
    `is ${headDim}: RoPE rotates pairs of values, so a head size is even`);
  meta.int(".attention.value_length", { min: headDim, max: headDim, fallback: headDim });
  return { embedding, heads, kvHeads, headDim };
}
