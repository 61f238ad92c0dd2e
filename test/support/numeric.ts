// Random data and how far two results are apart, for the tests of kernels and backends: one
// generator (the sampler's mulberry32, seeded, so a failure reproduces) and one error measure.
import { normalisedError as errorOf } from "../../bench/logits.ts";
import { seededRandom } from "../../ts/sample/sampler.ts";

/** A seeded generator of numbers in [0, 1). */
export const rng = seededRandom;

/** `n` values uniform in [-amp, amp), from a generator or a seed. */
export function randomF32(n: number, rand: (() => number) | number, amp = 1): Float32Array {
  const next = typeof rand === "number" ? rng(rand) : rand;
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = (next() * 2 - 1) * amp;
  return a;
}

/** max |got - want| over max |want| (Infinity where got is not finite); the lengths must match. */
export function normalisedError(got: ArrayLike<number>, want: ArrayLike<number>): number {
  if (got.length !== want.length) throw new Error(`lengths differ: ${got.length} and ${want.length}`);
  return errorOf(got, want);
}
