// Method: speculative decoding must not change a single token. On a tiny random Gemma 3 (sliding
// window 8, rings of 256 cells that wrap), sequences decoded with drafts (prompt lookup, or a
// draft model), several at once, give exactly the tokens each gives alone without them (the
// reference engine, one token a pass), greedy and seeded sampling with stop strings, penalties
// and a JSON grammar; drafts are rejected and the cache rolled back many times, across ring
// wraps. Chi-square tests check the speculative-sampling rule for a drafter that samples: on two
// fixed distributions (where a broken rule fails the same statistic), and on the tiny model with
// a sampling draft model over 3,000 seeds, against the target's distribution. A fixed pass cost makes the drafting deterministic (it would
// otherwise follow the timings). On the default model: the llama.cpp golden fixture's tokens with
// speculation on, and a long grounded prompt's answer equal to the one without, with drafts
// accepted. On CUDA (skipped without a GPU): greedy with drafts equals greedy without, the
// verification passes taking their argmaxes on the device (emulated on the CPU here too).
import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { speculationLoad } from "../ts/cli/options.ts";
import { withSettings } from "../ts/config/env.ts";
import { DraftModel } from "../ts/engine/draft-model.ts";
import { ensureSelfDraft, resolveDraftModel, selfDraftPath } from "../ts/engine/self-draft.ts";
import { openGguf } from "../ts/gguf/reader.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import { Engine } from "../ts/engine/engine.ts";
import type { GenerateOptions, GenerateResult } from "../ts/engine/generation.ts";
import { BatchScheduler, type SchedulerOptions } from "../ts/engine/scheduler.ts";
import type { Batch, LogitsSink } from "../ts/model/model.ts";
import {
  checkSpeculation, lookupDraft, PassCost, SELF_DRAFT, SequenceSpeculation,
} from "../ts/engine/speculation.ts";
import { defaultModelPath } from "../ts/models/cache.ts";
import { cudaStatus } from "../ts/native/cuda.ts";
import { JsonGrammar } from "../ts/sample/json-grammar.ts";
import { argmax, defaultSampling, Sampler, seededRandom } from "../ts/sample/sampler.ts";
import { compileSchema } from "../ts/sample/json-schema.ts";
import { referenceGenerate } from "./support/reference-generate.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";
import { tinySchedulerModel, toyPrompt } from "./support/tiny-scheduler.ts";

const EOS = 1;
const greedy = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0, logitBias: new Map([[EOS, -Infinity]]) };
const plainGreedy = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 };
const ngram = { mode: "ngram" as const };
const cheapRows = (rows: number) => 1 + 0.05 * (rows - 1);
const tiny = tinySchedulerModel();

describe("prompt lookup and the draft length", () => {
  test("the longest recent n-gram match drafts what followed it", () => {
    //            0  1  2  3  4  5  6  7  8  9 10 11
    const text = [5, 1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3];
    expect(lookupDraft(text, text.length, 3)).toEqual([7, 8, 1]); // the latest "1 2 3" (at 5)
    // past the text's end the continuation goes on with itself: "7 8 1 2 3" again
    expect(lookupDraft(text, text.length, 10)).toEqual([7, 8, 1, 2, 3, 7, 8, 1, 2, 3]);
    // a text looping on one token drafts the whole length, not one token a pass
    expect(lookupDraft([3, 4, 9, 9, 9, 9, 9], 7, 5)).toEqual([9, 9, 9, 9, 9]);
    expect(lookupDraft([6, 1, 2, 1, 2], 5, 5)).toEqual([1, 2, 1, 2, 1]); // a loop of two
    expect(lookupDraft([4, 5, 6, 7], 4, 5)).toEqual([]);
    expect(lookupDraft(text, text.length, 0)).toEqual([]);
    expect(lookupDraft([1, 2, 1, 2], 3, 4)).toEqual([]); // "2 1" occurs once (only the length counts)
  });

  test("K follows the acceptance rate and the cost of rows; a losing sequence stops drafting", () => {
    const spec = new SequenceSpeculation({ mode: "ngram", draftMax: 8 });
    const cheap = new PassCost(64, cheapRows);
    for (let i = 0; i < 20; i++) spec.verified(8, 8);
    expect(spec.plan(100, 0, cheap)).toBe(8);
    expect(spec.plan(3, 0, cheap)).toBe(3); // the room left
    const dear = new PassCost(64, (rows) => rows); // a row costs a whole pass: never worth it
    expect(spec.plan(8, 10, dear)).toBe(0);
    expect(spec.active(11)).toBe(false); // paused ...
    expect(spec.active(10 + 8)).toBe(true); // ... for a while, then tried again
    expect(spec.plan(8, 18, dear)).toBe(4); // a probe, whatever the estimates say
    expect(spec.plan(8, 19, dear)).toBe(0); // and paused again, for longer
    expect(spec.active(19 + 15)).toBe(false);
    const poor = new SequenceSpeculation({ mode: "ngram" });
    for (let i = 0; i < 20; i++) poor.verified(4, 0);
    expect(poor.plan(16, 0, new PassCost(64, (rows) => 1 + 0.3 * (rows - 1)))).toBe(0);
    expect(poor.stats()).toEqual({ passes: 20, drafted: 80, accepted: 0 });
    // Lookups that foresaw the device's token wrongly (no pass made) count as rejected drafts
    const misled = new SequenceSpeculation({ mode: "ngram" });
    for (let i = 0; i < 30; i++) misled.guessed(false);
    expect(misled.plan(16, 0, new PassCost(64, (rows) => 1 + 0.3 * (rows - 1)))).toBe(0);
    expect(misled.stats()).toEqual({ passes: 0, drafted: 0, accepted: 0 });
  });

  test("the timed cost: one-row passes and a line through the others", () => {
    const cost = new PassCost(16);
    for (let i = 0; i < 5; i++) { cost.record(1, 10); cost.record(3, 14); cost.record(5, 18); }
    expect(cost.relative(1)).toBe(1);
    expect(cost.relative(3)).toBeCloseTo(1.4, 5);
    expect(cost.relative(9)).toBeCloseTo(2.6, 5); // extrapolated: 8 + 2 per row
    // Without a one-row time (a backend whose plain steps are not timed yet), a pass time alone
    // is no ratio: the prior line, not milliseconds over one.
    const untimed = new PassCost(16);
    untimed.record(9, 40);
    untimed.record(9, 40);
    expect(untimed.relative(9)).toBeCloseTo(1 + 0.15 * 8, 5);
    expect(untimed.timings()).toEqual([{ rows: 9, ms: 40 }]);
  });

  test("bad options are refused by name", () => {
    expect(() => checkSpeculation({ mode: "lookahead" as never })).toThrow(/speculation: expected/);
    expect(() => checkSpeculation({ mode: "ngram", draftMax: 0 })).toThrow(/draft-max/);
    expect(() => checkSpeculation({ mode: "ngram", draftMax: 2.5 })).toThrow(/draft-max/);
  });
});

interface Job { prompt: number[]; options: Partial<GenerateOptions> }

function scheduled(jobs: Job[], o: SchedulerOptions): GenerateResult[] {
  const engine = tiny.open();
  const scheduler = new BatchScheduler(engine, { passCost: cheapRows, ...o });
  const results: GenerateResult[] = [];
  jobs.forEach((j, i) => scheduler.submit({ prompt: j.prompt,
    options: { maxTokens: 8, sampling: greedy, ...j.options },
    onDone: (r) => (results[i] = r), onError: (e) => { throw e; } }));
  while (scheduler.busy) scheduler.step();
  engine.close();
  return results;
}

function alone(job: Job): GenerateResult {
  const { speculation: _, ...options } = job.options;
  return referenceGenerate(tiny.reference, job.prompt,
    { maxTokens: 8, sampling: greedy, ...options });
}

function accepted(results: readonly GenerateResult[]): number {
  return results.reduce((n, r) => n + (r.speculation?.accepted ?? 0), 0);
}

interface VerificationCounts {
  /** A sequence's drafts verified with the rows' argmaxes taken on the device (ids back). */
  onDevice: number;
  /** ... with the rows' logits brought to the host. */
  onHost: number;
}

/**
 * Counts the engine's verification passes by the batches the scheduler hands the model: logit
 * rows are the batch's last rows, and a segment of several rows that all need logits is one
 * sequence's pending token and drafts (a prompt's segment asks logits of its last row only; a
 * plain decode step is one row). Several sequences decoding one row each, argmaxes on the
 * device or not, count nothing.
 */
function countVerification(engine: Engine): VerificationCounts {
  const counts: VerificationCounts = { onDevice: 0, onHost: 0 };
  const model = engine.model, forwardBatch = model.forwardBatch.bind(model);
  Object.assign(model, { forwardBatch: (batch: Batch, sink: LogitsSink) => {
    let tail = batch.logitRows;
    for (let i = batch.segments.length - 1; i >= 0 && batch.segments[i].rows <= tail; i--) {
      if (batch.segments[i].rows > 1) counts[batch.argmaxSink ? "onDevice" : "onHost"]++;
      tail -= batch.segments[i].rows;
    }
    return forwardBatch(batch, sink);
  } });
  return counts;
}

/** Logit rows read back to the host (reads of vocabulary-wide activations). */
function countLogitReads(engine: Engine): () => number {
  const be = engine.backend, read = be.read.bind(be);
  let rows = 0;
  be.read = (x, n) => {
    if (x.cols === engine.model.info.vocabSize) rows += n;
    return read(x, n);
  };
  return () => rows;
}

describe("speculation on the tiny model: each sequence's tokens as without it", () => {
  test("greedy, 3 slots, long answers wrapping the rings, rollbacks across the window", () => {
    const jobs: Job[] = [5, 40, 250, 90, 17].map((n, i) => ({ prompt: toyPrompt(n, 300 + i),
      options: { maxTokens: i === 2 ? 300 : 120, speculation: { mode: "ngram", draftMax: 12 } } }));
    const results = scheduled(jobs, { slots: 3, prefillChunk: 8, prefixCache: null });
    for (let i = 0; i < jobs.length; i++) {
      const want = alone(jobs[i]);
      expect(results[i].tokens).toEqual(want.tokens);
      expect(results[i].text).toBe(want.text);
      expect(results[i].stopReason).toBe(want.stopReason);
    }
    const stats = results.map((r) => r.speculation!);
    expect(accepted(results)).toBeGreaterThan(50);
    // Drafts were also rejected (each rejection rolls the cache back).
    expect(stats.some((s) => s.accepted < s.drafted)).toBe(true);
  }, 120_000);

  test("with the prefix cache, slots reused in place", () => {
    const system = toyPrompt(60, 9).slice(1);
    const jobs: Job[] = [0, 1, 2, 3].map((i) => ({ prompt: toyPrompt(70 + 5 * i, 40 + i, system),
      options: { maxTokens: 60, speculation: ngram } }));
    const results = scheduled([...jobs, ...jobs], { slots: 2, prefillChunk: 16,
      prefixCache: { blockTokens: 8 } });
    for (let i = 0; i < results.length; i++) {
      expect(results[i].tokens).toEqual(alone(jobs[i % 4]).tokens);
    }
    expect(accepted(results)).toBeGreaterThan(0);
  }, 120_000);

  test("seeded sampling with penalties and stop strings: the same draws, so the same tokens", () => {
    const sampling = { temperature: 0.7, topK: 20, topP: 0.9, minP: 0.02, presencePenalty: 0.2,
      repeatPenalty: 1.05, logitBias: greedy.logitBias };
    const jobs: Job[] = [0, 1, 2, 3].map((i) => ({ prompt: toyPrompt(12 + 20 * i, 70 + i),
      options: { maxTokens: 150, sampling: { ...sampling, seed: 7 + i },
        stop: i === 1 ? ["the c"] : [], speculation: ngram } }));
    const results = scheduled(jobs, { slots: 4, prefillChunk: 16, prefixCache: null });
    for (let i = 0; i < jobs.length; i++) {
      const want = alone(jobs[i]);
      expect(results[i].tokens).toEqual(want.tokens);
      expect(results[i].text).toBe(want.text);
      expect(results[i].stopReason).toBe(want.stopReason);
    }
    expect(accepted(results)).toBeGreaterThan(0);
  }, 120_000);

  test("a JSON schema: drafted tokens the grammar masks are rejected", () => {
    const schema = { type: "object", properties: { a: { type: "array", items: { type: "string" } } },
      required: ["a"] };
    const tokenizer = tiny.reference.tokenizer;
    const job = (speculation?: typeof ngram): Job => ({ prompt: toyPrompt(30, 5),
      options: { maxTokens: 200, sampling: { ...greedy, temperature: 0.8, seed: 3 },
        constraint: new JsonGrammar(tokenizer, compileSchema(schema)), speculation } });
    const [got] = scheduled([job(ngram)], { slots: 1, prefixCache: null });
    const want = alone(job());
    expect(got.tokens).toEqual(want.tokens);
    expect(got.stopReason).toBe(want.stopReason);
    expect(() => JSON.parse(got.text)).not.toThrow();
  }, 120_000);
});

describe("a draft model for every slot", () => {
  test("greedy: the same tokens as alone; sampled: its drawn drafts all kept (q = p); caches kept per slot", () => {
    const engine = tiny.open();
    const drafter = new DraftModel(tiny.open(), engine); // self-drafting: its drafts all hold
    const scheduler = new BatchScheduler(engine, { slots: 3, prefillChunk: 16, prefixCache: null,
      passCost: cheapRows, draftModel: drafter });
    const sampled = { ...greedy, temperature: 0.8, topK: 30, seed: 5 };
    const jobs: Job[] = [0, 1, 2, 3, 4].map((i) => ({ prompt: toyPrompt(20 + 40 * i, 90 + i),
      options: { maxTokens: 90, sampling: i % 2 ? sampled : greedy,
        speculation: { mode: "draft", draftMax: 6 } } }));
    const results: GenerateResult[] = [];
    jobs.forEach((j, i) => scheduler.submit({ prompt: j.prompt,
      options: { maxTokens: 8, sampling: greedy, ...j.options },
      onDone: (r) => (results[i] = r), onError: (e) => { throw e; } }));
    while (scheduler.busy) scheduler.step();
    for (let i = 0; i < jobs.length; i++) {
      const s = results[i].speculation!;
      // Self-drafting: the drafter's rows equal the target's bit for bit, so greedy drafts are
      // the argmax, and drawn drafts have q = p, which the rule keeps with probability 1.
      // The one exception: a sampled end-of-turn token ends the sequence in mid-draft.
      if (results[i].stopReason === "eos") expect(s.drafted - s.accepted).toBeLessThan(6);
      else expect(s.accepted).toBe(s.drafted);
      expect(s.drafted).toBeGreaterThan(0);
      // Sampled: drawn with the drafter's generator too, so other tokens than alone.
      if (i % 2 === 0) expect(results[i].tokens).toEqual(alone(jobs[i]).tokens);
    }
    expect(() => scheduler.submit({ prompt: [2, 7], options: { maxTokens: 2, sampling: greedy,
      speculation: { mode: "draft" } }, onDone: () => {}, onError: () => {} })).not.toThrow();
    while (scheduler.busy) scheduler.step();
    drafter.close();
    engine.close();
    const plain = tiny.open();
    expect(() => new BatchScheduler(plain, { slots: 1 }).submit({ prompt: [2, 7],
      options: { maxTokens: 2, sampling: greedy, speculation: { mode: "draft" } },
      onDone: () => {}, onError: () => {} })).toThrow(/needs a draft model/);
    plain.close();
  }, 120_000);
});

describe("speculative sampling keeps the model's distribution", () => {
  // df = 5 (six candidates): the chi-square statistic's 0.999 quantile
  const CHI2_DF5_999 = 20.52;
  const options = { ...defaultSampling, temperature: 0.9, topK: 6, topP: 1, minP: 0 };
  const targetLogits = Float32Array.from([2.1, 1.7, 1.6, 0.4, 1.1, -0.3, 0.9, 0.2, -1, 0.5, 1.5, -2]);
  const draftLogits = Float32Array.from([1.2, 2.2, 0.3, 1.4, 1.0, 0.8, -0.5, 0.1, 0.7, -1, 1.3, 0]);

  function chiSquare(counts: Map<number, number>, want: { ids: number[]; probs: number[] }): number {
    const n = total(counts);
    let chi2 = 0;
    want.ids.forEach((id, i) => {
      const expected = n * want.probs[i];
      chi2 += (((counts.get(id) ?? 0) - expected) ** 2) / expected;
    });
    // a token outside the target's candidates: expected 0, so no statistic holds it
    for (const id of counts.keys()) if (!want.ids.includes(id)) chi2 = Infinity;
    return chi2;
  }

  test("the rule on two distributions: 20,000 draws follow p; a broken rule fails the same test", () => {
    const target = new Sampler({ ...options, seed: 1 }), drafter = new Sampler({ ...options, seed: 2 });
    const p = target.distribution(targetLogits);
    const pOf = (id: number) => p.probs[p.ids.indexOf(id)] ?? 0;
    const right = new Map<number, number>(), acceptAll = new Map<number, number>();
    const residualIgnored = new Map<number, number>();
    const inc = (m: Map<number, number>, id: number) => m.set(id, (m.get(id) ?? 0) + 1);
    let kept = 0;
    const rand = seededRandom(3);
    for (let i = 0; i < 20_000; i++) {
      const { token: d, q } = drafter.sampleWithDistribution(draftLogits);
      const t = target.speculate(targetLogits, undefined, d, q);
      if (t === d) kept++;
      inc(right, t);
      inc(acceptAll, d); // broken: every draft kept
      // broken: kept with min(1, p/q) as it should be, but a rejection draws from p itself
      const qd = q.probs[Array.from(q.ids).indexOf(d)];
      inc(residualIgnored, rand() * qd < pOf(d) ? d : target.sample(targetLogits));
    }
    expect(p.ids.length).toBe(6);
    expect(chiSquare(right, p)).toBeLessThan(CHI2_DF5_999);
    expect(chiSquare(acceptAll, p)).toBeGreaterThan(10 * CHI2_DF5_999);
    expect(chiSquare(residualIgnored, p)).toBeGreaterThan(CHI2_DF5_999);
    // the two distributions overlap: both branches of the rule are taken often
    expect(kept).toBeGreaterThan(5_000);
    expect(kept).toBeLessThan(15_000);
  });

  test("one-hot q (a deterministic drafter): the rule keeps the token with probability p", () => {
    const target = new Sampler({ ...options, seed: 4 });
    const p = target.distribution(targetLogits);
    const q = { ids: Int32Array.of(p.ids[1]), probs: Float64Array.of(1) };
    const counts = new Map<number, number>();
    for (let i = 0; i < 20_000; i++) {
      const t = target.speculate(targetLogits, undefined, p.ids[1], q);
      counts.set(t, (counts.get(t) ?? 0) + 1);
    }
    expect(chiSquare(counts, p)).toBeLessThan(CHI2_DF5_999);
  });

  test("chi-square on the tiny model: a sampling draft model, 3000 seeds, the second token follows the target's probabilities", () => {
    // The draft: the same random weights with another branch gain, so q is near p but not p,
    // and drafts are both kept and rejected. Its tokens are drawn (not greedy), and judged by
    // the speculative-sampling rule.
    const engine = tiny.open();
    const dir = mkdtempSync(join(tmpdir(), "infer-spec-draft-"));
    const draftPath = join(dir, "draft.gguf");
    writeFileSync(draftPath, tinyGemma3Gguf({ shape: { layers: 3, embedding: 64, feedForward: 128,
      heads: 4, kvHeads: 2, headDim: 32 }, branchGain: 10 }));
    const drafter = new DraftModel(Engine.open({ modelPath: draftPath, contextLength: 1024,
      batch: 16, threads: 2, backend: "cpu" }), engine);
    const scheduler = new BatchScheduler(engine, { slots: 4, prefixCache: null, passCost: cheapRows,
      draftModel: drafter });
    const sampling = { temperature: 1, topK: 6, topP: 1, minP: 0, typicalP: 1, repeatPenalty: 1,
      logitBias: greedy.logitBias };
    const prompt = toyPrompt(24, 17);
    const seen = new Map<number, Map<number, number>>();
    let drafted = 0, kept = 0;
    try {
      for (let seed = 0; seed < 3000; seed++) {
        scheduler.submit({ prompt, options: { maxTokens: 3, sampling: { ...sampling, seed },
          speculation: { mode: "draft", draftMax: 1 } }, onError: (e) => { throw e; },
        onDone: (r) => {
          const [t1, t2] = r.tokens;
          const m = seen.get(t1) ?? new Map<number, number>();
          m.set(t2, (m.get(t2) ?? 0) + 1);
          seen.set(t1, m);
          drafted += r.speculation!.drafted;
          kept += r.speculation!.accepted;
        } });
        while (scheduler.busy) scheduler.step();
      }
    } finally {
      drafter.close();
      engine.close();
      rmSync(dir, { recursive: true, force: true });
    }
    expect(drafted).toBe(3000); // one draft verified per run: the second token's
    expect(kept).toBeGreaterThan(300);
    expect(kept).toBeLessThan(2700);
    // The second token after the most frequent first one, against the target's own distribution.
    const [t1, counts] = [...seen.entries()].sort((a, b) => total(b[1]) - total(a[1]))[0];
    expect(total(counts)).toBeGreaterThan(500);
    tiny.reference.reset();
    const logits = tiny.reference.evaluate([...prompt, t1]);
    const target = new Sampler({ ...defaultSampling, ...sampling, seed: 0 }).distribution(logits);
    expect(target.ids.length).toBe(6);
    expect(chiSquare(counts, target)).toBeLessThan(CHI2_DF5_999);
  }, 120_000);
});

describe("greedy verification with the argmax on the device (emulated on the CPU)", () => {
  // The CPU backend given the DeviceGreedy calls CUDA has, each done on the host: the scheduler
  // and the LM head take the path CUDA takes (a lone greedy sequence a step ahead; verification
  // passes handing back ids, never logits), so its plumbing is checked without a GPU.
  function emulateDevice(engine: Engine): { rowCalls: number[]; logitReads: () => number; keeps: () => number } {
    const be = engine.backend, queued: number[] = [], rowCalls: number[] = [];
    let kept = 0, reads = 0, keeps = 0;
    const read = be.read.bind(be);
    be.read = (x, rows) => {
      if (x.cols === engine.model.info.vocabSize) reads += rows;
      return read(x, rows);
    };
    const argmaxOf = (x: Parameters<typeof be.read>[0], rows: number) => {
      const v = read(x, rows), n = x.cols;
      return Int32Array.from({ length: rows }, (_, r) => argmax(v.subarray(r * n, (r + 1) * n)));
    };
    Object.defineProperty(be, "deviceGreedy", { value: {
      argmaxToken: (logits: Parameters<typeof be.read>[0]) => {
        kept = argmaxOf(logits, 1)[0];
        queued.push(kept);
      },
      keepTokens: (dst: Parameters<typeof be.read>[0], count: number) => {
        keeps++;
        be.setTokens(dst, [kept], count);
      },
      takeToken: () => queued.shift()!,
      dropTokens: () => { queued.length = 0; },
      argmaxRows: (logits: Parameters<typeof be.read>[0], rows: number) => {
        rowCalls.push(rows);
        return argmaxOf(logits, rows);
      },
    } });
    return { rowCalls, logitReads: () => reads, keeps: () => keeps };
  }

  test("one sequence and three at once: the tokens plain decoding gives; verification reads ids only", () => {
    for (const slots of [1, 3]) {
      const engine = tiny.open();
      const device = emulateDevice(engine), verified = countVerification(engine);
      const scheduler = new BatchScheduler(engine, { slots, prefillChunk: 16, prefixCache: null,
        passCost: cheapRows });
      // Plain greedy (no bias: a biased sequence is sampled on the host), EOS ignored instead;
      // a fourth, sampled, sequence makes the steps it shares take the host's logits path.
      const jobs: Job[] = [0, 1, 2, 3].map((i) => ({ prompt: toyPrompt(30 + 50 * i, 400 + i),
        options: { maxTokens: i === 3 ? 40 : 120, ignoreEos: true,
          sampling: i === 3 ? { ...plainGreedy, temperature: 0.8, seed: 9 } : plainGreedy,
          speculation: { mode: "ngram", draftMax: 8 } } }));
      const results: GenerateResult[] = [];
      jobs.forEach((j, i) => scheduler.submit({ prompt: j.prompt,
        options: { maxTokens: 8, sampling: greedy, ...j.options },
        onDone: (r) => (results[i] = r), onError: (e) => { throw e; } }));
      let readsBefore = 0, verifyReads = 0;
      while (scheduler.busy) {
        readsBefore = device.logitReads();
        const calls = device.rowCalls.length;
        scheduler.step();
        // a step that took argmaxes of rows read no logits
        if (device.rowCalls.length > calls) verifyReads += device.logitReads() - readsBefore;
      }
      engine.close();
      for (let i = 0; i < jobs.length; i++) {
        expect([slots, i, results[i].tokens]).toEqual([slots, i, alone(jobs[i]).tokens]);
      }
      expect(accepted(results)).toBeGreaterThan(20);
      // verification passes took ids (argmaxRows), and a step that did read no logits
      expect(verified.onDevice).toBeGreaterThan(0);
      expect(verifyReads).toBe(0);
      // Alone, a greedy sequence with nothing to draft decodes a step ahead on the device
      // (its token left there for the next step) between its verification passes.
      if (slots === 1) expect(device.keeps()).toBeGreaterThan(10);
    }
  }, 120_000);

  test("greedy with banned tokens takes the device's argmaxes; a row whose argmax is banned reads its logits", () => {
    // Each sequence bans EOS and the token plain greedy picks fifth for it, so that row's argmax
    // is banned and the row falls back to its logits; every other row is an id from the device.
    const jobs: Job[] = [0, 1, 2].map((i) => {
      const prompt = toyPrompt(20 + 30 * i, 500 + i);
      const plain = alone({ prompt, options: { maxTokens: 12, sampling: plainGreedy, ignoreEos: true } });
      const bans = new Map([[EOS, -Infinity], [plain.tokens[4], -Infinity], [plain.tokens[4] + 1, -3]]);
      return { prompt, options: { maxTokens: 12, sampling: { ...plainGreedy, logitBias: bans },
        speculation: { mode: i === 2 ? "ngram" : "off", draftMax: 4 } } };
    });
    for (const slots of [1, 3]) {
      const engine = tiny.open();
      const device = emulateDevice(engine);
      const scheduler = new BatchScheduler(engine, { slots, prefillChunk: 16, prefixCache: null,
        passCost: cheapRows });
      const results: GenerateResult[] = [];
      jobs.forEach((j, i) => scheduler.submit({ prompt: j.prompt, options: { maxTokens: 12, sampling: greedy, ...j.options },
        onDone: (r) => (results[i] = r), onError: (e) => { throw e; } }));
      while (scheduler.busy) scheduler.step();
      engine.close();
      for (let i = 0; i < jobs.length; i++) {
        expect([slots, i, results[i].tokens]).toEqual([slots, i, alone(jobs[i]).tokens]);
      }
      const rows = device.rowCalls.reduce((n, r) => n + r, 0);
      expect(rows).toBeGreaterThanOrEqual(30); // ids for (nearly) every row
      expect(device.logitReads()).toBeGreaterThan(0); // the banned argmaxes' rows
      expect(device.logitReads()).toBeLessThan(rows / 2);
    }
  }, 120_000);
});

describe("self-speculation: the model's own Q4_0 copy drafts", () => {
  test("made once with every matrix Q4_0 (the LM head too), cached by the file, and it drafts", async () => {
    const dir = mkdtempSync(join(tmpdir(), "infer-spec-self-"));
    try {
      const model = join(dir, "tiny.gguf");
      writeFileSync(model, tinyGemma3Gguf({ shape: { layers: 3, embedding: 64, feedForward: 128,
        heads: 4, kvHeads: 2, headDim: 32 }, branchGain: 16 }));
      const path = await withSettings({ INFER_CACHE: join(dir, "cache") },
        () => resolveDraftModel(SELF_DRAFT, model, true));
      expect(path.startsWith(join(dir, "cache", "drafts"))).toBe(true);
      const mtime = statSync(path).mtimeMs;
      expect(withSettings({ INFER_CACHE: join(dir, "cache") }, () => ensureSelfDraft(model))).toBe(path);
      expect(statSync(path).mtimeMs).toBe(mtime); // not made again
      const file = openGguf(path);
      const matrices = [...file.tensors.values()].filter((t) => t.dims.length === 2);
      expect(matrices.length).toBeGreaterThan(0);
      expect(matrices.every((t) => t.type.id === GgmlType.Q4_0)).toBe(true); // token_embd (the head) too
      file.close();
      // A changed model file is another copy.
      writeFileSync(model, tinyGemma3Gguf({ shape: { layers: 3, embedding: 64, feedForward: 128,
        heads: 4, kvHeads: 2, headDim: 32 }, branchGain: 12 }));
      expect(withSettings({ INFER_CACHE: join(dir, "cache") }, () => selfDraftPath(model))).not.toBe(path);
      // It drafts for the F32 model, greedy: the tokens are the model's own.
      const engine = Engine.open({ modelPath: model, contextLength: 512, batch: 16, threads: 2, backend: "cpu" });
      const drafter = new DraftModel(Engine.open({ modelPath: ensureSelfDraftIn(dir, model),
        contextLength: 512, batch: 16, threads: 2, backend: "cpu" }), engine);
      const scheduler = new BatchScheduler(engine, { slots: 1, prefixCache: null, passCost: cheapRows,
        draftModel: drafter });
      const prompt = toyPrompt(40, 3);
      let got: GenerateResult | null = null;
      scheduler.submit({ prompt, options: { maxTokens: 60, sampling: greedy,
        speculation: { mode: "draft", draftMax: 4 } }, onDone: (r) => (got = r), onError: (e) => { throw e; } });
      while (scheduler.busy) scheduler.step();
      const want = engine.generate(prompt, { maxTokens: 60, sampling: greedy, reuseCache: false });
      drafter.close();
      engine.close();
      expect(got!.tokens).toEqual(want.tokens);
      expect(got!.speculation!.accepted).toBeGreaterThan(got!.speculation!.drafted / 4);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);

  test("--spec self is --spec draft --draft-model self; with another draft model it is refused", () => {
    expect(speculationLoad({ spec: "self" })).toEqual({ speculation: "draft", draftModel: SELF_DRAFT });
    expect(speculationLoad({ spec: "self", "draft-max": "4" }))
      .toEqual({ speculation: "draft", draftMax: 4, draftModel: SELF_DRAFT });
    expect(() => speculationLoad({ spec: "self", "draft-model": "x.gguf" })).toThrow(/drop --draft-model/);
  });
});

function ensureSelfDraftIn(dir: string, model: string): string {
  return withSettings({ INFER_CACHE: join(dir, "cache") }, () => ensureSelfDraft(model));
}

function total(m: Map<number, number>): number {
  let n = 0;
  for (const v of m.values()) n += v;
  return n;
}

const model = defaultModelPath();
describe.skipIf(!existsSync(model))("speculation on the default model", () => {
  test("the golden prompts give llama.cpp's greedy tokens with drafts on", async () => {
    const fixture = await Bun.file(join(import.meta.dir, "fixtures", "gemma3-golden.json")).json();
    const cases = fixture.cases as { name: string; prompt_tokens: number[];
      token_by_token: { generated_tokens: number[] } }[];
    const engine = Engine.open({ modelPath: model, contextLength: fixture.settings.context_size });
    const scheduler = new BatchScheduler(engine, { slots: 4, prefillChunk: 48, passCost: cheapRows });
    const got = new Map<string, GenerateResult>();
    for (const c of cases) {
      scheduler.submit({ prompt: c.prompt_tokens,
        options: { maxTokens: c.token_by_token.generated_tokens.length, ignoreEos: true,
          sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 }, speculation: ngram },
        onDone: (r) => got.set(c.name, r), onError: (e) => { throw e; } });
    }
    while (scheduler.busy) scheduler.step();
    engine.close();
    for (const c of cases) {
      expect([c.name, got.get(c.name)!.tokens]).toEqual([c.name, c.token_by_token.generated_tokens]);
    }
    expect(accepted([...got.values()])).toBeGreaterThan(0);
  }, 240_000);

  test("a long grounded prompt: the same answer, most of it from drafts", async () => {
    const text = await Bun.file(join(import.meta.dir, "fixtures", "alice-chapter1.txt")).text();
    const passage = text.slice(0, 2400);
    const prompt = `${passage}\n\nThe passage above, copied out word for word:\n\n${passage.slice(0, 300)}`;
    const engine = Engine.open({ modelPath: model, contextLength: 2048 });
    const options = (speculation?: typeof ngram): GenerateOptions => ({ maxTokens: 160,
      sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 }, reuseCache: false,
      speculation });
    const plain = engine.generate(prompt, options());
    const scheduler = new BatchScheduler(engine, { slots: 1, prefixCache: null, passCost: cheapRows });
    let spec: GenerateResult | null = null;
    scheduler.submit({ prompt: engine.tokenizer.encode(prompt, { addSpecial: true, parseSpecial: true }),
      options: options(ngram), onDone: (r) => (spec = r), onError: (e) => { throw e; } });
    while (scheduler.busy) scheduler.step();
    engine.close();
    expect(spec!.tokens).toEqual(plain.tokens);
    expect(spec!.text).toBe(plain.text);
    expect(spec!.speculation!.accepted).toBeGreaterThan(plain.tokens.length / 2);
  }, 240_000);
});

// On CUDA a decode step and a verification pass of several rows run different kernels, so this
// holds the GPU to its own plain decoding (the device's greedy argmax for a lone sequence, the
// batched step for several) rather than to the CPU: a tiny random Gemma 3 that repeats itself.
describe.skipIf(!cudaStatus().available)("speculation on CUDA", () => {
  test("greedy, one sequence and three at once: the tokens plain decoding gives", () => {
    const dir = mkdtempSync(join(tmpdir(), "infer-spec-cuda-"));
    try {
      const path = join(dir, "tiny.gguf");
      writeFileSync(path, tinyGemma3Gguf({ branchGain: 16, shape: { layers: 3, embedding: 128,
        feedForward: 256, heads: 4, kvHeads: 2, headDim: 32 } }));
      const run = (mode: "off" | "ngram", slots: number) => {
        const engine = Engine.open({ modelPath: path, contextLength: 1024, batch: 16, backend: "cuda" });
        const verified = countVerification(engine), logitRowsRead = countLogitReads(engine);
        // Plain greedy (a biased sequence is sampled on the host), so verification passes take
        // their argmaxes on the device; EOS ignored instead of banned.
        const jobs: Job[] = [0, 1, 2].map((i) => ({ prompt: toyPrompt(30 + 50 * i, 400 + i),
          options: { maxTokens: 200, sampling: plainGreedy, ignoreEos: true,
            speculation: { mode, draftMax: 8 } } }));
        const results: GenerateResult[] = [];
        const scheduler = new BatchScheduler(engine, { slots, prefixCache: null, passCost: cheapRows });
        jobs.forEach((j, i) => scheduler.submit({ prompt: j.prompt,
          options: { maxTokens: 8, sampling: greedy, ...j.options },
          onDone: (r) => (results[i] = r), onError: (e) => { throw e; } }));
        while (scheduler.busy) scheduler.step();
        engine.close();
        return { results, verified, logitRowsRead: logitRowsRead() };
      };
      for (const slots of [1, 3]) {
        // Every step's argmaxes on the device: a lone sequence's (argmaxToken), several
        // sequences' (argmaxRows), each verification pass's (argmaxRows): no logits read.
        const off = run("off", slots);
        expect([slots, off.verified, off.logitRowsRead]).toEqual([slots, { onDevice: 0, onHost: 0 }, 0]);
        const on = run("ngram", slots);
        for (let i = 0; i < off.results.length; i++) {
          expect([slots, i, on.results[i].tokens]).toEqual([slots, i, off.results[i].tokens]);
        }
        expect(accepted(on.results)).toBeGreaterThan(0);
        // the verification passes' argmaxes were taken on the device (ids back, not logits)
        expect(on.verified.onDevice).toBeGreaterThan(0);
        expect([slots, on.verified.onHost, on.logitRowsRead]).toEqual([slots, 0, 0]);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 240_000);
});
