// Method: on a tiny random Gemma 3 (sliding window 8; batch 16 makes its local layers rings of
// 256 cells), a slot's kept tokens are continued in place, and a lone greedy sequence decodes a
// step ahead on the "device" (support/device-greedy.ts: the argmax over the CPU logits, queued as
// the CUDA backend queues it); every sequence must give exactly the tokens it gets alone
// (support/reference-generate.ts), having evaluated only what neither its slot nor the prefix
// cache held.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Engine } from "../ts/engine/engine.ts";
import type { GenerateOptions, GenerateResult } from "../ts/engine/generation.ts";
import { BatchScheduler, type SchedulerOptions } from "../ts/engine/scheduler.ts";
import { withDeviceGreedy, type DeviceGreedyCounts } from "./support/device-greedy.ts";
import { referenceGenerate } from "./support/reference-generate.ts";
import { tinySchedulerModel, toyPrompt } from "./support/tiny-scheduler.ts";

const EOS = 1; // the toy vocabulary's <eos>
const banEos = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0, logitBias: new Map([[EOS, -Infinity]]) };
// Plain greedy (no bias): the sampling the device's argmax stands in for.
const greedy = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 };
const tiny = tinySchedulerModel();
const open = tiny.open;
const prompt = toyPrompt;

const defaults: GenerateOptions = { maxTokens: 8, sampling: banEos, ignoreEos: true };

function alone(tokens: readonly number[], options: Partial<GenerateOptions>): GenerateResult {
  return referenceGenerate(tiny.reference, tokens, { ...defaults, ...options });
}

interface Job { prompt: number[]; options: Partial<GenerateOptions>; at: number }

/** Runs jobs through a scheduler, each submitted at its step `at`; results in job order. */
function batched(jobs: Job[], o: SchedulerOptions, setup?: (engine: Engine) => void) {
  const engine = open();
  setup?.(engine);
  const scheduler = new BatchScheduler(engine, o);
  const results: (GenerateResult | Error | null)[] = jobs.map(() => null);
  const pending = jobs.map((j, i) => ({ ...j, i }));
  for (let step = 0; pending.length > 0 || scheduler.busy; step++) {
    for (const j of pending.filter((p) => p.at <= step)) {
      pending.splice(pending.indexOf(j), 1);
      scheduler.submit({ prompt: j.prompt, options: { ...defaults, ...j.options },
        onDone: (r) => (results[j.i] = r), onError: (e) => (results[j.i] = e) });
    }
    scheduler.step();
  }
  const stats = scheduler.stats();
  engine.close();
  return { results: results as GenerateResult[], stats };
}

function expectAlone(jobs: Job[], results: GenerateResult[]): void {
  for (let i = 0; i < jobs.length; i++) {
    const want = alone(jobs[i].prompt, jobs[i].options);
    expect([i, results[i].tokens, results[i].stopReason]).toEqual([i, want.tokens, want.stopReason]);
    expect(results[i].text).toBe(want.text);
  }
}

describe("a slot's kept tokens are continued in place", () => {
  test("a request goes to the slot holding its beginning and evaluates only the rest", () => {
    const a = prompt(100, 1), b = prompt(50, 2);
    const answerB = alone(b, {}).tokens;
    const jobs: Job[] = [
      { prompt: a, options: {}, at: 0 },
      { prompt: b, options: {}, at: 0 },
      // a's first 80 tokens, then others: a's slot, though b's was free longer
      { prompt: prompt(100, 3, a.slice(1, 80)), options: {}, at: 40 },
      // b's conversation, next turn: its prompt and answer (the last token never evaluated)
      { prompt: [...b, ...answerB, ...prompt(11, 4).slice(1)], options: {}, at: 80 },
      // the same prompt again: only its last token is evaluated
      { prompt: b, options: { maxTokens: 3 }, at: 120 },
    ];
    const { results, stats } = batched(jobs, { slots: 2, prefixCache: null });
    expect(results.map((r) => r.prefilled)).toEqual([100, 50, 20, 1 + 10, 1]);
    expect(stats.reusedTokens).toBe(80 + (50 + 7) + 49);
    expectAlone(jobs, results);
  }, 60_000);

  test("a ring that cannot drop back starts over; the prefix cache fills in", () => {
    const a = prompt(200, 5);
    const b = prompt(180, 6, a.slice(1, 150)); // shares 150 positions with a
    // a's answer of 250 tokens writes its rings past a[0..149]'s window (250 + 50 > 256 - 8)
    const far = (o: Partial<SchedulerOptions>) => batched([{ prompt: a, options: { maxTokens: 250 }, at: 0 },
      { prompt: b, options: {}, at: 300 }], { slots: 1, ...o });
    const cold = far({ prefixCache: null });
    expect(cold.results[1].prefilled).toBe(180);
    expect(cold.stats.reusedTokens).toBe(0);
    const cached = far({ prefixCache: { blockTokens: 8 } });
    expect(cached.results[1].prefilled).toBe(180 - 144); // 18 whole blocks of the 150
    // a short answer leaves the window in place: the slot holds more than the blocks (150 > 144)
    const near = batched([{ prompt: a, options: { maxTokens: 40 }, at: 0 },
      { prompt: b, options: {}, at: 100 }], { slots: 1, prefixCache: { blockTokens: 8 } });
    expect(near.results[1].prefilled).toBe(180 - 150);
    expect(near.stats.reusedTokens).toBe(150);
    for (const run of [cold, cached, near]) expect(run.results[1].tokens).toEqual(alone(b, {}).tokens);
    expect(cold.results[0].tokens).toEqual(alone(a, { maxTokens: 250 }).tokens);
  }, 60_000);

  test("a slot continued in place saves no block that its earlier writes overwrote", () => {
    // One block of cache. a's answer wraps the rings (positions 256.. take the cells of 0..);
    // x, in the other slot, evicts a's first block; b continues a's slot from position 100 and
    // must not save positions 0..7 from cells that now hold 256..263; c, starting afresh in the
    // other slot while b runs, would restore them.
    const a = prompt(100, 21);
    const jobs: Job[] = [
      { prompt: a, options: { maxTokens: 200 }, at: 0 },
      { prompt: prompt(30, 22).slice(1), options: { maxTokens: 4 }, at: 250 }, // no BOS: no match
      { prompt: [...a, ...prompt(20, 23).slice(1)], options: { maxTokens: 100 }, at: 300 },
      { prompt: [...a.slice(0, 12), ...prompt(4, 24).slice(1)], options: {}, at: 320 },
    ];
    const bytesPerBlock = 3 * 2 * 2 * 32 * 2 * 8;
    const { results, stats } = batched(jobs, { slots: 2,
      prefixCache: { blockTokens: 8, bytesMax: bytesPerBlock } });
    expect(results.map((r) => r.prefilled)).toEqual([100, 29, 19, 15]);
    expect(stats.reusedTokens).toBe(100);
    expectAlone(jobs, results);
  }, 60_000);

  test("reuseCache: false starts over", () => {
    const a = prompt(60, 7);
    const { results } = batched([{ prompt: a, options: {}, at: 0 },
      { prompt: a, options: { reuseCache: false }, at: 30 }], { slots: 1, prefixCache: null });
    expect(results[1].prefilled).toBe(60);
  });

  test("Engine.generate: a chat's next turn evaluates only its new tokens", () => {
    const engine = open();
    const first = prompt(70, 8);
    const r1 = engine.generate(first, defaults);
    const next = [...first, ...r1.tokens, ...prompt(15, 9).slice(1)];
    const r2 = engine.generate(next, defaults);
    expect([r1.prefilled, r2.prefilled]).toEqual([70, 15]);
    expect(engine.tokens()).toEqual([...next, ...r2.tokens.slice(0, -1)]);
    expect(r2.tokens).toEqual(alone(next, {}).tokens);
    engine.close();
  });
});

describe("a lone greedy sequence decodes on the device, a step ahead", () => {
  let engine: Engine, counts: DeviceGreedyCounts;
  beforeAll(() => {
    engine = open();
    counts = withDeviceGreedy(engine.backend); // before generate() makes its scheduler
  });
  afterAll(() => engine.close());
  const run = (p: number[], options: Partial<GenerateOptions>) => {
    const before = { ...counts };
    const r = engine.generate(p, { ...defaults, sampling: greedy, reuseCache: false, ...options });
    const delta = Object.fromEntries(Object.entries(counts)
      .map(([k, v]) => [k, v - before[k as keyof DeviceGreedyCounts]]));
    return { r, delta };
  };

  test("the host's tokens, and its ends: length, a stop token, the context", () => {
    const p = prompt(30, 10);
    const want = alone(p, { sampling: greedy, maxTokens: 40 });
    const { r, delta } = run(p, { maxTokens: 40 });
    expect(r.tokens).toEqual(want.tokens);
    expect(r.text).toBe(want.text);
    // the first device step evaluates the host's token; one step past the end is dropped
    expect(delta).toEqual({ argmax: 40, kept: 39, taken: 39, dropped: 1 });
    const stop = want.tokens[12], firstStop = want.tokens.indexOf(stop);
    const stopped = run(p, { maxTokens: 40, stopTokens: [stop] }).r;
    expect([stopped.tokens, stopped.stopReason]).toEqual([want.tokens.slice(0, firstStop), "eos"]);
    const long = prompt(1000, 11);
    const full = run(long, { maxTokens: -1 });
    const fullWant = alone(long, { sampling: greedy, maxTokens: -1 });
    expect([full.r.tokens, full.r.stopReason]).toEqual([fullWant.tokens, "context"]);
    expect(full.delta.dropped).toBe(0); // no step was queued past the context
  });

  test("sampled sequences, and deviceGreedy: false, stay on the host", () => {
    const p = prompt(20, 12);
    expect(run(p, { sampling: banEos }).delta.argmax).toBe(0);
    expect(run(p, { sampling: { ...greedy, temperature: 0.8, seed: 3 } }).delta.argmax).toBe(0);
    let c: DeviceGreedyCounts | null = null;
    const r = batched([{ prompt: p, options: { sampling: greedy }, at: 0 }], { slots: 1, deviceGreedy: false },
      (e) => (c = withDeviceGreedy(e.backend)));
    expect(c!.argmax).toBe(0);
    expect(r.results[0].tokens).toEqual(alone(p, { sampling: greedy }).tokens);
  });

  test("a sequence joining settles the token in flight; all get their tokens alone", () => {
    let c: DeviceGreedyCounts | null = null;
    const jobs: Job[] = [
      { prompt: prompt(25, 13), options: { sampling: greedy, maxTokens: 60 }, at: 0 },
      { prompt: prompt(40, 14), options: { sampling: greedy, maxTokens: 10 }, at: 12 },
      { prompt: prompt(33, 15), options: { sampling: { ...greedy, temperature: 0.7, seed: 5 } }, at: 30 },
    ];
    const { results } = batched(jobs, { slots: 2, prefixCache: { blockTokens: 8 } },
      (e) => (c = withDeviceGreedy(e.backend)));
    expectAlone(jobs, results);
    // on the device before the second arrives, between the joiners, and after the last left:
    // each time, the first device step evaluates a token the host sampled
    expect(c!.argmax - c!.kept).toBeGreaterThanOrEqual(3);
    expect(c!.kept).toBeGreaterThan(20);
  });

  test("one slot: a waiting sequence cannot join, so the running one stays on the device", () => {
    let c: DeviceGreedyCounts | null = null;
    const jobs: Job[] = [
      { prompt: prompt(25, 16), options: { sampling: greedy, maxTokens: 30 }, at: 0 },
      { prompt: prompt(25, 17), options: { sampling: greedy, maxTokens: 30 }, at: 5 },
    ];
    const { results } = batched(jobs, { slots: 1, prefixCache: null },
      (e) => (c = withDeviceGreedy(e.backend)));
    expectAlone(jobs, results);
    expect(c!).toEqual({ argmax: 60, kept: 58, taken: 58, dropped: 2 });
  });

  test("interrupted, or failing in its callback, on the device: the slot is free again", () => {
    let stop = false, shown = 0;
    const p = prompt(20, 18);
    const want = alone(p, { sampling: greedy, maxTokens: 50 }).tokens;
    const jobs: Job[] = [
      { prompt: p, options: { sampling: greedy, maxTokens: 50, shouldStop: () => stop,
        onText: () => { if (++shown === 10) stop = true; } }, at: 0 },
      { prompt: p, options: { sampling: greedy, maxTokens: 50,
        onText: () => { if (++shown === 25) throw new Error("the client went away"); } }, at: 1 },
      { prompt: p, options: { sampling: greedy, maxTokens: 50 }, at: 2 },
    ];
    let c: DeviceGreedyCounts | null = null;
    const { results, stats } = batched(jobs, { slots: 1, prefixCache: null },
      (e) => (c = withDeviceGreedy(e.backend)));
    expect(results[0].stopReason).toBe("interrupted");
    expect(results[0].tokens).toEqual(want.slice(0, results[0].tokens.length));
    expect((results[1] as unknown as Error).message).toBe("the client went away");
    expect(results[2].tokens).toEqual(want);
    expect(stats).toMatchObject({ busySlots: 0, waiting: 0 });
    expect(c!.taken).toBeGreaterThan(50);
  });
});
