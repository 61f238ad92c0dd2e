// Method: check each cut of the sampler chain on hand-made logits with a fixed seed, so every
// draw is deterministic and the expected sets can be stated exactly.
import { expect, test } from "bun:test";
import { argmax, Sampler } from "../ts/sample/sampler.ts";

const logits = new Float32Array([1, 5, 3, 5, -2, 4.5, 0]);

test("temperature 0 is greedy and takes the first maximum", () => {
  expect(argmax(logits)).toBe(1);
  expect(new Sampler({ temperature: 0, topK: 40, topP: 1, minP: 0, seed: 1 }).sample(logits)).toBe(1);
});

test("top-k 1 is greedy at any temperature", () => {
  const s = new Sampler({ temperature: 5, topK: 1, topP: 1, minP: 0, seed: 3 });
  for (let i = 0; i < 50; i++) expect(s.sample(logits)).toBe(1);
});

test("the same seed draws the same tokens; draws stay inside top-k", () => {
  const draw = (seed: number) => {
    const s = new Sampler({ temperature: 1, topK: 3, topP: 1, minP: 0, seed });
    return Array.from({ length: 200 }, () => s.sample(logits));
  };
  const a = draw(42);
  expect(draw(42)).toEqual(a);
  expect(new Set(a)).toEqual(new Set([1, 3, 5]));
});

test("min-p drops tokens far below the best", () => {
  const s = new Sampler({ temperature: 1, topK: 0, topP: 1, minP: 0.5, seed: 7 });
  // p(4.5)/p(5) = e^-0.5 ≈ 0.61 survives; p(3)/p(5) = e^-2 ≈ 0.14 does not.
  const seen = new Set(Array.from({ length: 300 }, () => s.sample(logits)));
  expect(seen).toEqual(new Set([1, 3, 5]));
});

test("top-p keeps the smallest set reaching p", () => {
  const s = new Sampler({ temperature: 1, topK: 0, topP: 0.5, minP: 0, seed: 9 });
  // The two tied maxima hold ~0.33 each: together they pass 0.5, so only they remain.
  const seen = new Set(Array.from({ length: 300 }, () => s.sample(logits)));
  expect(seen).toEqual(new Set([1, 3]));
});

test("frequencies follow the softmax at temperature 1", () => {
  const two = new Float32Array([0, Math.log(3)]); // probabilities 1/4 and 3/4
  const s = new Sampler({ temperature: 1, topK: 0, topP: 1, minP: 0, seed: 11 });
  let ones = 0;
  for (let i = 0; i < 4000; i++) ones += s.sample(two);
  expect(ones / 4000).toBeGreaterThan(0.72);
  expect(ones / 4000).toBeLessThan(0.78);
});
