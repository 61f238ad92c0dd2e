// Method: sequences run through the batch scheduler (several per forward pass, prompts chunked
// between decode steps, joining and leaving mid-way, prefixes copied from the prefix cache) must
// give exactly the tokens each gives alone (support/reference-generate.ts: evaluated by the
// engine, sampled on the host), on a tiny random Gemma 3 whose sliding-window rings wrap; and
// on the real default model, the llama.cpp golden fixture's 12 prompts decoded four at a time
// must give llama.cpp's 32 greedy tokens each.
import { describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { defaultModelPath } from "../ts/models/cache.ts";
import { Engine } from "../ts/engine/engine.ts";
import type { GenerateOptions, GenerateResult } from "../ts/engine/generation.ts";
import { createKvCache } from "../ts/engine/kv-cache.ts";
import { BatchScheduler, type SchedulerOptions } from "../ts/engine/scheduler.ts";
import { referenceGenerate } from "./support/reference-generate.ts";
import { tinySchedulerModel, toyPrompt } from "./support/tiny-scheduler.ts";

const EOS = 1; // the toy vocabulary's <eos>, banned so that lengths are known
const greedy = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0, logitBias: new Map([[EOS, -Infinity]]) };
const tiny = tinySchedulerModel();
const open = tiny.open;
const prompt = toyPrompt;

function alone(tokens: number[], options: Partial<GenerateOptions>): GenerateResult {
  return referenceGenerate(tiny.reference, tokens, { maxTokens: 8, sampling: greedy, ...options });
}

interface Job { prompt: number[]; options: Partial<GenerateOptions>; at: number }

/** Runs jobs through a scheduler, each submitted at its step `at`; returns results in job order. */
function batched(jobs: Job[], o: SchedulerOptions, engine = open()) {
  const scheduler = new BatchScheduler(engine, o);
  const results: (GenerateResult | null)[] = jobs.map(() => null);
  let step = 0, maxBusy = 0;
  const pending = jobs.map((j, i) => ({ ...j, i }));
  while (pending.length > 0 || scheduler.busy) {
    for (const j of pending.filter((p) => p.at <= step)) {
      pending.splice(pending.indexOf(j), 1);
      scheduler.submit({ prompt: j.prompt, options: { maxTokens: 8, sampling: greedy, ...j.options },
        onDone: (r) => (results[j.i] = r), onError: (e) => { throw e; } });
    }
    scheduler.step();
    maxBusy = Math.max(maxBusy, scheduler.stats().busySlots);
    step++;
  }
  const stats = scheduler.stats();
  engine.close();
  return { results: results as GenerateResult[], stats, maxBusy, steps: step };
}

describe("the batch scheduler gives each sequence the tokens it gets alone", () => {
  const lengths = [5, 40, 3, 90, 17, 300, 1, 64, 33, 250];
  const jobs: Job[] = lengths.map((n, i) => ({
    prompt: prompt(Math.max(n, 1), 100 + i),
    options: { maxTokens: i === 5 ? 300 : 6 + ((i * 7) % 20) },
    at: i < 4 ? 0 : i * 3,
  }));

  test("4 slots, prompts chunked by 8 between decode steps, rings wrapping", () => {
    const { results, stats, maxBusy } = batched(jobs, { slots: 4, prefillChunk: 8, prefixCache: null });
    expect(maxBusy).toBe(4);
    expect(stats.busySlots).toBe(0);
    for (let i = 0; i < jobs.length; i++) {
      const want = alone(jobs[i].prompt, jobs[i].options);
      expect(results[i].tokens).toEqual(want.tokens);
      expect(results[i].text).toBe(want.text);
      expect(results[i].stopReason).toBe(want.stopReason);
    }
  }, 60_000);

  test("seeded sampling, stop strings and penalties per sequence", () => {
    const sampling = { temperature: 0.9, topK: 20, topP: 0.9, minP: 0.02, presencePenalty: 0.3,
      logitBias: greedy.logitBias };
    const some: Job[] = [0, 1, 2, 3, 4].map((i) => ({ prompt: prompt(10 + 13 * i, i),
      options: { maxTokens: 24, sampling: { ...sampling, seed: 40 + i }, stop: i === 2 ? ["e"] : [] },
      at: i }));
    const { results } = batched(some, { slots: 3, prefillChunk: 16, prefixCache: null });
    for (let i = 0; i < some.length; i++) {
      const want = alone(some[i].prompt, some[i].options);
      expect(results[i].text).toBe(want.text);
      expect(results[i].tokens).toEqual(want.tokens);
    }
  }, 60_000);

  test("the prefix cache restores shared beginnings exactly, rings included", () => {
    // Each answer runs its slot's rings far past the shared beginning, so that no slot can drop
    // back to it (slot reuse is scheduler-slots.test.ts's): the prefix cache restores it.
    const system = prompt(280, 7).slice(1); // longer than a ring, so the ring copy wraps
    const shared: Job[] = [0, 1, 2, 3, 4, 5].map((i) => ({
      prompt: prompt(281 + 5 + 9 * i, 900 + i, system), options: { maxTokens: 270, ignoreEos: true }, at: i * 40,
    }));
    const first = batched(shared, { slots: 3, prefillChunk: 8, prefixCache: { blockTokens: 8 } });
    expect(first.stats.prefix!.restoredTokens).toBeGreaterThanOrEqual(5 * 280);
    expect(first.stats.reusedTokens).toBe(0);
    for (let i = 0; i < shared.length; i++) {
      expect(first.results[i].tokens).toEqual(alone(shared[i].prompt, shared[i].options).tokens);
      if (i > 0) expect(first.results[i].prefilled).toBeLessThan(shared[i].prompt.length - 270);
    }
    // A generated answer is cached too: the conversation's next turn reuses it, though another
    // sequence took the one slot in between.
    const turn = [...shared[0].prompt, ...first.results[0].tokens, ...prompt(12, 3).slice(1)];
    const again = batched([shared[0], { prompt: prompt(20, 4), options: {}, at: 290 },
      { prompt: turn, options: {}, at: 320 }], { slots: 1, prefixCache: { blockTokens: 8 } });
    expect(again.results[2].tokens).toEqual(alone(turn, {}).tokens);
    expect(again.results[2].prefilled).toBeLessThanOrEqual(8 + 12);
    expect(again.stats.reusedTokens).toBeLessThanOrEqual(2); // the filler's BOS, at most
  }, 60_000);

  test("a burst of prompts with one beginning evaluates it once", () => {
    const system = prompt(280, 8).slice(1);
    const burst: Job[] = [0, 1, 2, 3].map((i) => ({ prompt: prompt(281 + 3 + 7 * i, 500 + i, system),
      options: { maxTokens: 6 }, at: 0 }));
    const { results } = batched(burst, { slots: 4, prefillChunk: 16,
      prefixCache: { blockTokens: 8 } });
    const evaluated = results.reduce((sum, r) => sum + r.prefilled, 0);
    expect(evaluated).toBeLessThan(burst[0].prompt.length + 3 * (8 + 3 + 7 * 3));
    for (let i = 0; i < burst.length; i++) {
      expect(results[i].tokens).toEqual(alone(burst[i].prompt, burst[i].options).tokens);
    }
  }, 60_000);

  test("a tight prefix cache evicts least recently used leaves and stays exact", () => {
    const engine = open();
    const some: Job[] = [0, 1, 2, 3, 4, 5, 6, 7].map((i) => ({
      prompt: prompt(50 + 20 * (i % 3), i % 3), options: { maxTokens: 5 }, at: i * 10,
    }));
    // room for 12 blocks of 8 positions: far less than the prompts need
    const bytesPerBlock = 3 * 2 * 2 * 32 * 2 * 8;
    const { results, stats } = batched(some, { slots: 2, prefillChunk: 8,
      prefixCache: { blockTokens: 8, bytesMax: 12 * bytesPerBlock } }, engine);
    expect(stats.prefix!.blocks).toBeLessThanOrEqual(12);
    expect(stats.prefix!.bytes).toBeLessThanOrEqual(stats.prefix!.bytesMax);
    for (let i = 0; i < some.length; i++) {
      expect(results[i].tokens).toEqual(alone(some[i].prompt, some[i].options).tokens);
    }
  }, 60_000);

  test("an interrupted sequence ends at the next step and frees its slot", () => {
    let stop = false;
    const some: Job[] = [
      { prompt: prompt(30, 1), options: { maxTokens: 200, shouldStop: () => stop }, at: 0 },
      { prompt: prompt(20, 2), options: { maxTokens: 12 }, at: 0 },
      { prompt: prompt(25, 3), options: { maxTokens: 12 }, at: 20 },
    ];
    const engine = open();
    const scheduler = new BatchScheduler(engine, { slots: 2, prefixCache: null });
    const results: GenerateResult[] = [];
    for (let step = 0; scheduler.busy || step <= 20; step++) {
      for (const j of some.filter((x) => x.at === step)) {
        scheduler.submit({ prompt: j.prompt, options: { maxTokens: 8, sampling: greedy, ...j.options },
          onDone: (r) => results.push(r), onError: (e) => { throw e; } });
      }
      if (step === 10) stop = true;
      scheduler.step();
    }
    engine.close();
    const cut = results.find((r) => r.promptTokens.length === 30)!;
    expect(cut.stopReason).toBe("interrupted");
    expect(cut.tokens.length).toBeLessThan(12);
    // the third waited for a slot, which the interrupted one freed
    const third = results.find((r) => r.promptTokens.length === 25)!;
    expect(third.tokens).toEqual(alone(some[2].prompt, some[2].options).tokens);
    expect(scheduler.stats()).toMatchObject({ busySlots: 0, waiting: 0 });
  }, 60_000);

  test("nothing to generate, and a failing callback, leave every slot free", () => {
    const engine = open();
    const scheduler = new BatchScheduler(engine, { slots: 2, prefixCache: null });
    const outcomes: string[] = [];
    const submit = (options: Partial<GenerateOptions>) => scheduler.submit({ prompt: prompt(9, 5),
      options: { maxTokens: 4, sampling: greedy, ...options },
      onDone: (r) => outcomes.push(`${r.stopReason} ${r.tokens.length}`),
      onError: (e) => outcomes.push(`error ${e.message}`) });
    submit({});
    submit({ onText: () => { throw new Error("the client's socket broke"); } });
    submit({ maxTokens: 0 });
    while (scheduler.busy) scheduler.step();
    engine.close();
    // the failing one fails alone, though it shared its batch with the first
    expect(outcomes.sort()).toEqual(["error the client's socket broke", "length 0", "length 4"]);
    expect(scheduler.stats()).toMatchObject({ busySlots: 0, waiting: 0 });
  }, 60_000);

  test("a batch of more rows than the model was planned for is refused by name", () => {
    const engine = open(), model = engine.model;
    const caches = [0, 1].map(() => createKvCache(engine.backend, model.info, 64, "f16", model.maxBatch));
    const segments = caches.map((c) => ({ rows: 9, position: 0, cache: c.layers }));
    expect(() => model.forwardBatch({ tokens: prompt(18, 3), segments, logitRows: 2 }, () => {}))
      .toThrow("18 rows exceed the batch of 16");
    engine.close();
  });
});

const goldenModel = defaultModelPath();
describe.skipIf(!existsSync(goldenModel))("the default model in batches, as llama.cpp alone", () => {
  test("12 golden prompts, 4 slots, prompts chunked between decodes: llama.cpp's tokens", async () => {
    const fixture = await Bun.file(join(import.meta.dir, "fixtures", "gemma3-golden.json")).json();
    const cases = fixture.cases as { name: string; prompt_tokens: number[];
      token_by_token: { generated_tokens: number[] } }[];
    const engine = Engine.open({ modelPath: goldenModel, contextLength: fixture.settings.context_size });
    const scheduler = new BatchScheduler(engine, { slots: 4, prefillChunk: 48 });
    const got = new Map<string, number[]>();
    for (const c of cases) {
      scheduler.submit({ prompt: c.prompt_tokens,
        options: { maxTokens: c.token_by_token.generated_tokens.length, ignoreEos: true,
          sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 } },
        onDone: (r) => got.set(c.name, r.tokens), onError: (e) => { throw e; } });
    }
    while (scheduler.busy) scheduler.step();
    engine.close();
    for (const c of cases) {
      expect([c.name, got.get(c.name)]).toEqual([c.name, c.token_by_token.generated_tokens]);
    }
  }, 240_000);
});
