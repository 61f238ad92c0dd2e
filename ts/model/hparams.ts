// Parse at the boundary: raw GGUF metadata becomes validated numbers here, bounded before they
// size an allocation or index anything. Keys starting with "." are under the architecture's
// prefix ("gemma3.block_count"). Nothing downstream reads raw metadata keys.
import { InferError } from "../errors.ts";
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

  has(k: string): boolean {
    return this.metadata.has(this.key(k));
  }

  int(k: string, bounds: Bounds = {}): number {
    const v = this.metadata.get(this.key(k));
    if (v === undefined) {
      if (bounds.fallback !== undefined) return bounds.fallback;
      return this.bad(k, "is missing");
    }
    if (typeof v !== "number" || !Number.isInteger(v)) return this.bad(k, `is not an integer (${String(v)})`);
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
    if (typeof v !== "number" || !Number.isFinite(v)) return this.bad(k, `is not a finite number`);
    if ((bounds.min !== undefined && v < bounds.min) || (bounds.max !== undefined && v > bounds.max)) {
      return this.bad(k, `is ${v}, outside ${bounds.min ?? "-inf"}..${bounds.max ?? "inf"}`);
    }
    return v;
  }

  string(k: string, fallback?: string): string {
    const v = this.metadata.get(this.key(k));
    if (v === undefined && fallback !== undefined) return fallback;
    if (typeof v !== "string") return this.bad(k, v === undefined ? "is missing" : "is not a string");
    return v;
  }
}

/** Upper bounds that no real model exceeds; they keep a hostile file from sizing huge buffers. */
export const LIMITS = {
  layers: 1024, embedding: 1 << 16, heads: 1024, headDim: 2048, vocab: 1 << 22,
  context: 1 << 24, feedForward: 1 << 18,
} as const;
