// Small helpers the CUDA benchmarks (cuda-decode.ts, cuda-vs-cpu.ts) and test/cuda.test.ts share:
// a command-line value, and comparisons of two backends' logits (also test/metal-model.test.ts).

/** The value after `name` on the command line, or `fallback`. */
export function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

/** Index of the largest value (the first of equals), as greedy decoding picks it. */
export function argmax(x: Float32Array): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

/** The largest value minus the second largest: how near a greedy choice is to a tie. */
export function top2Gap(x: Float32Array): number {
  let a = -Infinity, b = -Infinity;
  for (const v of x) {
    if (v > a) { b = a; a = v; } else if (v > b) b = v;
  }
  return a - b;
}

export function maxAbsDiff(x: Float32Array, y: Float32Array): number {
  let m = 0;
  for (let i = 0; i < x.length; i++) m = Math.max(m, Math.abs(x[i] - y[i]));
  return m;
}

/** Largest |got - want| over the largest |want|; Infinity where got is not finite. */
export function normalisedError(got: ArrayLike<number>, want: ArrayLike<number>): number {
  let maxDiff = 0, maxRef = 0;
  for (let i = 0; i < want.length; i++) {
    if (!Number.isFinite(got[i])) return Infinity;
    maxDiff = Math.max(maxDiff, Math.abs(got[i] - want[i]));
    maxRef = Math.max(maxRef, Math.abs(want[i]));
  }
  return maxDiff / Math.max(maxRef, 1e-30);
}

/** KL(p ‖ q) of the softmaxes of two logit vectors, in nats (computed in float64). */
export function klDivergence(pLogits: ArrayLike<number>, qLogits: ArrayLike<number>): number {
  const logSoftmax = (x: ArrayLike<number>) => {
    let max = -Infinity;
    for (let i = 0; i < x.length; i++) max = Math.max(max, x[i]);
    let sum = 0;
    for (let i = 0; i < x.length; i++) sum += Math.exp(x[i] - max);
    const lse = max + Math.log(sum);
    return Float64Array.from({ length: x.length }, (_, i) => x[i] - lse);
  };
  if (pLogits.length !== qLogits.length) {
    throw new Error(`lengths differ: ${pLogits.length} and ${qLogits.length}`);
  }
  const lp = logSoftmax(pLogits), lq = logSoftmax(qLogits);
  let kl = 0;
  for (let i = 0; i < lp.length; i++) kl += Math.exp(lp[i]) * (lp[i] - lq[i]);
  return Math.max(0, kl);
}
