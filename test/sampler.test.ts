// Method: check each cut of the sampler chain on hand-made logits with a fixed seed, so every
// draw is deterministic and the expected sets can be stated exactly; then compare the whole chain
// with a slow, obvious reference (llama.cpp's order, written out step by step) on random logits.
import { describe, expect, test } from "bun:test";
import { InferError } from "../ts/errors.ts";
import {
  argmax, defaultSampling, logprobs, NoTokenLeftError, Sampler, seededRandom, type SamplerOptions,
} from "../ts/sample/sampler.ts";

const logits = new Float32Array([1, 5, 3, 5, -2, 4.5, 0]);
const plain = { temperature: 1, topK: 0, topP: 1, minP: 0, seed: 1 };

test("temperature 0 is greedy and takes the first maximum", () => {
  expect(argmax(logits)).toBe(1);
  expect(new Sampler({ temperature: 0, topK: 40, topP: 1, minP: 0, seed: 1 }).sample(logits)).toBe(1);
});

test("top-k 1 is greedy at any temperature", () => {
  const s = new Sampler({ temperature: 5, topK: 1, topP: 1, minP: 0, seed: 3 });
  for (let i = 0; i < 50; i++) expect(s.sample(logits)).toBe(1);
  // and on random logits, against argmax
  const rand = seededRandom(5);
  for (let trial = 0; trial < 100; trial++) {
    const x = Float32Array.from({ length: 1000 }, () => Math.round(rand() * 40) / 4); // ties happen
    const t = 0.1 + rand() * 3;
    expect(new Sampler({ ...defaultSampling, temperature: t, topK: 1, seed: trial }).sample(x)).toBe(argmax(x));
  }
});

test("the same seed draws the same tokens; draws stay inside top-k", () => {
  const draw = (seed: number) => {
    const s = new Sampler({ temperature: 1, topK: 3, topP: 1, minP: 0, seed });
    return Array.from({ length: 200 }, () => s.sample(logits));
  };
  const a = draw(42);
  expect(draw(42)).toEqual(a);
  expect(draw(43)).not.toEqual(a);
  expect(new Set(a)).toEqual(new Set([1, 3, 5]));
});

test("a fixed seed reproduces with every sampler and penalty on", () => {
  const o: SamplerOptions = { temperature: 1.3, topK: 50, topP: 0.9, minP: 0.02, typicalP: 0.95, seed: 7,
    repeatPenalty: 1.2, frequencyPenalty: 0.1, presencePenalty: 0.2, repeatLastN: 16, logitBias: new Map([[3, 1]]) };
  const rand = seededRandom(1);
  const x = Float32Array.from({ length: 500 }, () => rand() * 8);
  const run = () => {
    const s = new Sampler(o);
    const out: number[] = [];
    for (let i = 0; i < 100; i++) { const t = s.sample(x); s.accept(t); out.push(t); }
    return out;
  };
  expect(run()).toEqual(run());
});

test("min-p drops tokens far below the best", () => {
  const s = new Sampler({ ...plain, minP: 0.5, seed: 7 });
  // p(4.5)/p(5) = e^-0.5 ≈ 0.61 survives; p(3)/p(5) = e^-2 ≈ 0.14 does not.
  expect(new Set(s.distribution(logits).ids)).toEqual(new Set([1, 3, 5]));
  const seen = new Set(Array.from({ length: 300 }, () => s.sample(logits)));
  expect(seen).toEqual(new Set([1, 3, 5]));
  // p = 0.1 keeps e^-2 ≈ 0.135 (logit 3) but not e^-4 (logit 1)
  expect(new Set(new Sampler({ ...plain, minP: 0.1 }).distribution(logits).ids)).toEqual(new Set([1, 2, 3, 5]));
});

test("top-p keeps the smallest set reaching p", () => {
  const s = new Sampler({ ...plain, topP: 0.5, seed: 9 });
  // The two tied maxima hold ~0.33 each: together they pass 0.5, so only they remain.
  const seen = new Set(Array.from({ length: 300 }, () => s.sample(logits)));
  expect(seen).toEqual(new Set([1, 3]));
});

test("typical-p keeps the tokens whose surprisal is nearest the entropy", () => {
  // p = [0.4, 0.2, 0.2, 0.2]: entropy 1.33 nats; the 0.2s (surprisal 1.61) sit nearer it than
  // the 0.4 (0.92), so they come first, and three of them pass 0.5 before the 0.4 is reached.
  const x = Float32Array.from([0.4, 0.2, 0.2, 0.2], Math.log);
  expect(new Sampler({ ...plain, typicalP: 0.5 }).distribution(x).ids).toEqual([1, 2, 3]);
  expect(new Sampler({ ...plain, typicalP: 0.7 }).distribution(x).ids).toEqual([0, 1, 2, 3]);
});

test("frequencies follow the softmax at temperature 1", () => {
  const two = new Float32Array([0, Math.log(3)]); // probabilities 1/4 and 3/4
  const s = new Sampler({ ...plain, seed: 11 });
  let ones = 0;
  for (let i = 0; i < 4000; i++) ones += s.sample(two);
  expect(ones / 4000).toBeGreaterThan(0.72);
  expect(ones / 4000).toBeLessThan(0.78);
});

describe("penalties and bias", () => {
  const seen = (s: Sampler, x: Float32Array) => {
    let out = new Float32Array(0);
    s.sample(x, (y) => { out = y.slice(); });
    return out;
  };

  test("penalties change only the tokens in the window, by llama.cpp's formula", () => {
    const s = new Sampler({ ...plain, repeatPenalty: 2, frequencyPenalty: 0.25, presencePenalty: 0.5, repeatLastN: 4 });
    const x = new Float32Array([1, -1, 2, 3, -2, 0.5]);
    const before = x.slice();
    for (const t of [0, 5, 1, 2, 1]) s.accept(t); // the window of 4 is 5, 1, 2, 1: token 0 has left it
    const y = seen(s, x);
    expect(x).toEqual(before); // the caller's logits are never written
    const expected = Array.from(x);
    expected[5] = 0.5 / 2 - 1 * 0.25 - 0.5;
    expected[1] = -1 * 2 - 2 * 0.25 - 0.5;
    expected[2] = 2 / 2 - 1 * 0.25 - 0.5;
    expect(Array.from(y)).toEqual(expected.map(Math.fround));
  });

  test("no penalty settings, no change; repeatLastN 0 turns them off", () => {
    const x = new Float32Array([1, 2, 3]);
    const a = new Sampler({ ...plain });
    const b = new Sampler({ ...plain, repeatPenalty: 3, repeatLastN: 0 });
    for (const s of [a, b]) { s.accept(1); s.accept(2); expect(Array.from(seen(s, x))).toEqual([1, 2, 3]); }
  });

  test("repeatLastN -1 looks back over the whole sequence", () => {
    const s = new Sampler({ ...plain, presencePenalty: 1, repeatLastN: -1 });
    s.accept(0);
    for (let i = 0; i < 500; i++) s.accept(2);
    expect(Array.from(seen(s, new Float32Array([1, 1, 1])))).toEqual([0, 1, 0]);
  });

  test("greedy decoding follows the penalised logits", () => {
    const s = new Sampler({ temperature: 0, topK: 40, topP: 1, minP: 0, seed: 1, repeatPenalty: 10, repeatLastN: 8 });
    const x = new Float32Array([0, 5, 4.9]);
    expect(s.sample(x)).toBe(1);
    s.accept(1);
    expect(s.sample(x)).toBe(2);
  });

  test("logit bias adds to one token; -Infinity bans it", () => {
    const x = new Float32Array([1, 5, 3]);
    expect(new Sampler({ ...plain, temperature: 0, logitBias: new Map([[0, 10]]) }).sample(x)).toBe(0);
    const banned = new Sampler({ ...plain, logitBias: new Map([[1, -Infinity]]) });
    for (let i = 0; i < 200; i++) expect(banned.sample(x)).not.toBe(1);
  });

  test("bias and penalties edit the caller's logits in place and put them back, even on error", () => {
    // Token 1 is both biased and penalised: undone last edit first.
    const o = { ...plain, temperature: 0, repeatPenalty: 3, presencePenalty: 0.5, repeatLastN: 8,
      logitBias: new Map([[1, 4], [3, -Infinity]]) };
    const x = new Float32Array([2, 1, 3, 9, -1]);
    const before = x.slice();
    const s = new Sampler(o);
    s.accept(1);
    s.accept(2);
    // 0: 2; 1: (1 + 4) / 3 - 0.5 = 1.17; 2: 3 / 3 - 0.5 = 0.5; 3: banned; 4: -1.
    expect(s.sample(x)).toBe(0);
    expect(x).toEqual(before);
    const drawn = new Sampler({ ...o, temperature: 1, seed: 3 });
    for (let i = 0; i < 50; i++) expect(drawn.sample(x)).not.toBe(3);
    expect(x).toEqual(before);
    const banAll = new Sampler({ ...plain, logitBias: new Map([0, 1, 2, 3, 4].map((t) => [t, -Infinity])) });
    expect(() => banAll.sample(x)).toThrow(/masked/);
    expect(x).toEqual(before);
  });

  test("a mask that leaves nothing is an error, not a silent token", () => {
    const all = (y: Float32Array) => { y.fill(-Infinity); };
    expect(() => new Sampler({ ...plain }).sample(logits, all)).toThrow(/masked/);
    expect(() => new Sampler({ ...plain, temperature: 0 }).sample(logits, all)).toThrow(/masked/);
    const chains = [plain, { ...plain, temperature: 0 }, { ...plain, topK: 2 },
      { ...plain, minP: 0.1 }];
    for (const o of chains) {
      let error: unknown = null;
      try { new Sampler(o).sample(logits, all); } catch (err) { error = err; }
      expect(error).toBeInstanceOf(NoTokenLeftError);
      expect(error).toBeInstanceOf(InferError); // a user's error (a bias, a grammar), not a bug
    }
  });
});

test("logprobs: the log-softmax of the raw logits, and the most likely tokens best first", () => {
  const rand = seededRandom(11);
  for (const n of [7, 1000, 262_144]) {
    const x = Float32Array.from({ length: n }, () => (rand() - 0.5) * 30);
    x[n >> 1] = x[0]; // a tie: the lower id comes first
    // the obvious way, in doubles
    let max = -Infinity, z = 0;
    for (const v of x) max = Math.max(max, v);
    for (const v of x) z += Math.exp(v - max);
    const exact = (id: number) => x[id] - max - Math.log(z);
    const order = Array.from(x.keys()).sort((a, b) => x[b] - x[a] || a - b);
    for (const [token, top] of [[3, 5], [order[0], 0], [n - 1, 20]]) {
      const r = logprobs(x, token, top);
      expect(r.token).toBe(token);
      expect(r.logprob).toBeCloseTo(exact(token), 4);
      expect(r.top.map((t) => t.token)).toEqual(order.slice(0, Math.min(top, n)));
      for (const t of r.top) expect(t.logprob).toBeCloseTo(exact(t.token), 4);
    }
  }
  // probabilities sum to one
  const p = logprobs(logits, 0, logits.length);
  expect(p.top.reduce((a, t) => a + Math.exp(t.logprob), 0)).toBeCloseTo(1, 6);
});

/** llama.cpp's chain written out plainly: sort, cut, cut, cut, then temperature. */
function reference(x: Float32Array, o: Required<Omit<SamplerOptions, "logitBias">>): Map<number, number> {
  let c = Array.from(x, (l, id) => ({ id, l })).filter((t) => t.l > -Infinity);
  c.sort((a, b) => b.l - a.l || a.id - b.id);
  if (o.topK > 0) c = c.slice(0, o.topK);
  const probs = (list: typeof c) => {
    const m = list[0].l, w = list.map((t) => Math.exp(t.l - m)), z = w.reduce((a, b) => a + b, 0);
    return w.map((v) => v / z);
  };
  if (o.typicalP < 1) {
    const p = probs(c), h = -p.reduce((a, q) => a + (q > 0 ? q * Math.log(q) : 0), 0);
    const order = c.map((t, i) => ({ t, p: p[i], s: Math.abs(-Math.log(p[i]) - h) }))
      .sort((a, b) => a.s - b.s || a.t.id - b.t.id);
    let cum = 0, keep = order.length;
    for (let i = 0; i < order.length; i++) { cum += order[i].p; if (cum > o.typicalP) { keep = i + 1; break; } }
    c = order.slice(0, keep).map((e) => e.t).sort((a, b) => b.l - a.l || a.id - b.id);
  }
  if (o.topP < 1) {
    const p = probs(c);
    let cum = 0, keep = c.length;
    for (let i = 0; i < c.length; i++) { cum += p[i]; if (cum >= o.topP) { keep = i + 1; break; } }
    c = c.slice(0, keep);
  }
  if (o.minP > 0) c = c.filter((t) => t.l >= c[0].l + Math.log(o.minP));
  const w = c.map((t) => Math.exp((t.l - c[0].l) / o.temperature)), z = w.reduce((a, b) => a + b, 0);
  return new Map(c.map((t, i) => [t.id, w[i] / z]));
}

test("the chain equals the step-by-step reference on random logits and settings", () => {
  const rand = seededRandom(2024);
  for (let trial = 0; trial < 300; trial++) {
    const vocab = 1 + Math.floor(rand() * 3000);
    // A third of the rows are whole numbers: ties at the top-k boundary go to the lower id.
    const whole = rand() < 0.3;
    const x = Float32Array.from({ length: vocab }, () => (rand() < 0.05 ? -Infinity
      : whole ? Math.round(rand() * 12 - 4) : rand() * 12 - 4));
    x[Math.floor(rand() * vocab)] = 9; // at least one finite logit
    const pick = <T>(...v: T[]) => v[Math.floor(rand() * v.length)];
    const o = {
      ...defaultSampling,
      temperature: pick(0.3, 0.8, 1, 2), topK: pick(0, 1, 5, 40, 300, 5000), topP: pick(1, 0.95, 0.5, 0.1),
      minP: pick(0, 0.05, 0.3), typicalP: pick(1, 1, 0.9, 0.5), seed: trial,
    };
    const got = new Sampler(o).distribution(x);
    const want = reference(x, o);
    expect(new Set(got.ids)).toEqual(new Set(want.keys()));
    got.ids.forEach((id, i) => expect(got.probs[i]).toBeCloseTo(want.get(id)!, 9));
  }
});

test("a Gemma-sized row: top-p alone and min-p alone equal the reference", () => {
  const rand = seededRandom(7);
  const x = Float32Array.from({ length: 262_144 }, () => rand() * 6 - 12);
  for (let i = 0; i < 200; i++) x[Math.floor(rand() * x.length)] = rand() * 10;
  for (const cut of [{ topP: 0.9, minP: 0 }, { topP: 0.5, minP: 0 }, { topP: 1, minP: 0.05 }]) {
    const o = { ...defaultSampling, temperature: 1, topK: 0, typicalP: 1, seed: 1, ...cut };
    const got = new Sampler(o).distribution(x);
    const want = reference(x, o);
    expect(got.ids).toEqual([...want.keys()]);
    got.ids.forEach((id, i) => expect(got.probs[i]).toBeCloseTo(want.get(id)!, 9));
  }
});
