// Token sampling on logits, in llama.cpp's default order: top-k → top-p → min-p → temperature →
// draw. Temperature 0 is greedy (the first maximum, as llama.cpp's greedy sampler picks).
// A seeded generator makes every draw reproducible.

export interface SamplerOptions {
  readonly temperature: number;
  readonly topK: number;
  readonly topP: number;
  readonly minP: number;
  readonly seed: number;
}

/** llama.cpp's defaults (common/common.h). */
export const defaultSampling: SamplerOptions = { temperature: 0.8, topK: 40, topP: 0.95, minP: 0.05, seed: -1 };

/** mulberry32: small, fast, and good enough to draw tokens; seeded for reproducibility. */
export function seededRandom(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function argmax(logits: Float32Array): number {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
  return best;
}

export class Sampler {
  private readonly random: () => number;
  private ids: Int32Array;
  private probs: Float64Array;

  constructor(readonly options: SamplerOptions) {
    const seed = options.seed >= 0 ? options.seed : Math.floor(Math.random() * 2 ** 32);
    this.random = seededRandom(seed);
    const k = Math.max(1, options.topK);
    this.ids = new Int32Array(k);
    this.probs = new Float64Array(k);
  }

  sample(logits: Float32Array): number {
    const o = this.options;
    if (o.temperature <= 0) return argmax(logits);
    const k = this.topK(logits, o.topK > 0 ? Math.min(o.topK, logits.length) : logits.length);
    // Softmax over the kept candidates (sorted, best first) for the top-p and min-p cuts.
    const max = logits[this.ids[0]];
    let sum = 0;
    for (let i = 0; i < k; i++) sum += (this.probs[i] = Math.exp(logits[this.ids[i]] - max));
    let keep = k, cumulative = 0;
    for (let i = 0; i < k; i++) {
      cumulative += this.probs[i] / sum;
      if (cumulative >= o.topP) { keep = i + 1; break; }
    }
    const floor = o.minP * (this.probs[0] / sum);
    while (keep > 1 && this.probs[keep - 1] / sum < floor) keep--;
    // Temperature reshapes what survives, then one draw.
    let total = 0;
    for (let i = 0; i < keep; i++) total += (this.probs[i] = Math.exp((logits[this.ids[i]] - max) / o.temperature));
    let r = this.random() * total;
    for (let i = 0; i < keep; i++) {
      r -= this.probs[i];
      if (r <= 0) return this.ids[i];
    }
    return this.ids[keep - 1];
  }

  /** Fills ids[0..k) with the k largest logits, best first; returns k. */
  private topK(logits: Float32Array, k: number): number {
    const wide = k > 256; // a wide cut sorts everything rather than inserting
    const need = wide ? logits.length : k;
    if (need > this.ids.length) { // grown once, on the first call that needs more
      this.ids = new Int32Array(need);
      this.probs = new Float64Array(need);
    }
    const ids = this.ids;
    if (wide) {
      for (let i = 0; i < logits.length; i++) ids[i] = i;
      ids.subarray(0, logits.length).sort((x, y) => logits[y] - logits[x] || x - y);
      return k;
    }
    let n = 0;
    for (let i = 0; i < logits.length; i++) {
      const v = logits[i];
      if (n === k && v <= logits[ids[n - 1]]) continue;
      let j = n < k ? n++ : n - 1; // insertion into the sorted list, dropping the smallest
      while (j > 0 && logits[ids[j - 1]] < v) { ids[j] = ids[j - 1]; j--; }
      ids[j] = i;
    }
    return n;
  }
}
