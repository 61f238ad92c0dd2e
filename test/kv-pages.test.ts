// Method: the paged KV cache's bookkeeping (ts/backend/kv-pages.ts) on a fake physical side
// (support/fake-pages.ts: a granule budget, and poison in what is mapped and unmapped): which
// granules a layer maps for a position (odd row sizes, rings excluded), giving them back, the
// admission decision (admit, empty free slots, wait, never), and the real scheduler on a CPU
// backend paged through the fake, with more slots than fit at full context: every sequence must
// give exactly the tokens it gets alone, the pool never past its budget.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { KvLayer } from "../ts/backend/backend.ts";
import { admitPages, KvPagePool, paddedRows, ROW_PAD, type PagedRange } from "../ts/backend/kv-pages.ts";
import { Engine } from "../ts/engine/engine.ts";
import type { GenerateOptions, GenerateResult } from "../ts/engine/generation.ts";
import { memoryPlan } from "../ts/engine/memory.ts";
import { BatchScheduler } from "../ts/engine/scheduler.ts";
import type { GgufFile } from "../ts/gguf/reader.ts";
import type { ModelShape } from "../ts/model/model.ts";
import { InferError } from "../ts/errors.ts";
import { FakePhysical, withFakePages } from "./support/fake-pages.ts";
import { referenceGenerate } from "./support/reference-generate.ts";
import { toyPrompt } from "./support/tiny-scheduler.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const G = 4096;

function layer(pool: KvPagePool, cells: number, kRowBytes: number, vRowBytes: number, ring = false): KvLayer {
  const pages = ring ? null : { k: pool.reserve(cells * kRowBytes), v: pool.reserve(cells * vRowBytes) };
  return { cells, ring, kvHeads: 1, headDim: 1, kRowBytes, vRowBytes, pages } as KvLayer;
}

const pagesOf = (l: KvLayer) => (l as unknown as { pages: { k: PagedRange; v: PagedRange } }).pages;

describe("a layer maps granules as positions are written", () => {
  test("rows are padded to whole tiles, at most the layer's cells", () => {
    expect(paddedRows(0, 1000)).toBe(0);
    expect(paddedRows(1, 1000)).toBe(ROW_PAD);
    expect(paddedRows(ROW_PAD, 1000)).toBe(ROW_PAD);
    expect(paddedRows(ROW_PAD + 1, 1000)).toBe(2 * ROW_PAD);
    expect(paddedRows(999, 1000)).toBe(1000);
  });

  test("odd row sizes: the granules cover the padded rows' bytes, no more", () => {
    const phys = new FakePhysical(G, 1000), pool = new KvPagePool(phys);
    // 1,000 cells of 34-byte keys (a q8_0 block) and 50-byte values: ranges of 9 and 13 granules
    const l = layer(pool, 1000, 34, 50);
    expect(pagesOf(l).k.bytes).toBe(9 * G);
    expect(pagesOf(l).v.bytes).toBe(13 * G);
    expect(pool.need([l], 0)).toBe(0);
    pool.ensureRows(l, 1);
    const first = Math.ceil(ROW_PAD * 34 / G) + Math.ceil(ROW_PAD * 50 / G);
    expect(pool.held([l])).toBe(first);
    expect(pool.need([l], 1)).toBe(first);
    expect(pool.mapped).toBe(first);
    pool.ensureRows(l, ROW_PAD); // the same padded rows: nothing new
    expect(pool.held([l])).toBe(first);
    pool.ensureRows(l, 3 * ROW_PAD + 1);
    expect(pool.held([l])).toBe(Math.ceil(1000 * 34 / G) + Math.ceil(1000 * 50 / G));
    pool.ensureRows(l, 5000); // past the layer: capped at its range
    expect(pool.held([l])).toBe(9 + 13);
    expect(phys.live).toBe(22);
  });

  test("rings and other backends' layers take nothing", () => {
    const pool = new KvPagePool(new FakePhysical(G, 100));
    const ring = layer(pool, 768, 512, 512, true);
    const plain = { cells: 4096, ring: false, kvHeads: 1, headDim: 256 } as KvLayer;
    pool.ensureRows(ring, 700);
    pool.ensureRows(plain, 4000);
    expect(pool.need([ring, plain], 4096)).toBe(0);
    expect(pool.held([ring, plain])).toBe(0);
    expect(pool.mapped).toBe(0);
  });

  test("trimming gives back the granules past the rows kept, and all of them at 0", () => {
    const phys = new FakePhysical(G, 100), pool = new KvPagePool(phys);
    const l = layer(pool, 2048, 64, 64); // 16 rows a granule: 32 granules a range
    pool.ensureRows(l, 2048);
    expect(pool.held([l])).toBe(64);
    pool.trimRows(l, 300); // padded to 512 rows: 8 granules a range
    expect(pool.held([l])).toBe(16);
    expect(phys.live).toBe(16);
    pool.trimRows(l, 600); // more than held: nothing happens
    expect(pool.held([l])).toBe(16);
    pool.trimRows(l, 0);
    expect([pool.held([l]), pool.mapped, phys.live]).toEqual([0, 0, 0]);
    pool.ensureRows(l, 1); // maps again from the start
    expect(pool.held([l])).toBe(2 * ROW_PAD * 64 / G);
    pool.free(pagesOf(l).k);
    pool.free(pagesOf(l).v);
    expect(phys.live).toBe(0);
  });

  test("a failed create or map leaves the pool as it was", () => {
    const phys = new FakePhysical(G, 3), pool = new KvPagePool(phys);
    const l = layer(pool, 1024, G / 256, G / 256); // one granule a 256 rows
    pool.ensureRows(l, 256);
    expect(() => pool.ensureRows(l, 1024)).toThrow(/granules are in use/);
    expect(pool.held([l])).toBe(phys.live);
    expect(pool.mapped).toBe(3);
  });
});

/** Admission where nothing is shared: the slot keeps `held`, every granule is one slot's. */
function admitPlain(need: number, held: number, running: { held: number; claim: number }[],
  free: number[], available: number) {
  const total = held + running.reduce((n, s) => n + s.held, 0) + free.reduce((n, f) => n + f, 0);
  return admitPages({ need, grows: need - held, running, free, available, capacity: available + total });
}

describe("admission by the pool", () => {
  test("admits what fits beside the running sequences' outstanding claims", () => {
    // 10 granules to be had; one running sequence holds 2 of its claim of 6
    expect(admitPlain(6, 0, [{ held: 2, claim: 6 }], [], 10)).toEqual({ kind: "admit", reclaim: 0 });
    expect(admitPlain(7, 0, [{ held: 2, claim: 6 }], [], 10)).toEqual({ kind: "wait" });
    // the slot's own granules count toward its need
    expect(admitPlain(9, 3, [{ held: 2, claim: 6 }], [], 10)).toEqual({ kind: "admit", reclaim: 0 });
  });

  test("empties free slots, the one free the longest first, only as far as needed", () => {
    expect(admitPlain(8, 0, [], [3, 4, 5], 4)).toEqual({ kind: "admit", reclaim: 2 });
    expect(admitPlain(4, 0, [], [3, 4, 5], 4)).toEqual({ kind: "admit", reclaim: 0 });
    expect(admitPlain(16, 0, [], [3, 4, 5], 4)).toEqual({ kind: "admit", reclaim: 3 });
  });

  test("waits while running sequences hold what it needs; never when even an empty pool is too small", () => {
    expect(admitPlain(8, 0, [{ held: 5, claim: 5 }], [1], 4)).toEqual({ kind: "wait" });
    expect(admitPlain(11, 0, [{ held: 5, claim: 5 }], [1], 4)).toEqual({ kind: "never", need: 11, capacity: 10 });
    // nothing running: what does not fit now never will
    expect(admitPlain(6, 1, [], [], 4)).toEqual({ kind: "never", need: 6, capacity: 5 });
  });
});

// A tiny random Gemma 3 of six layers: five sliding-window rings (window 8, 256 cells at batch
// 16), then one full-attention layer of 1,024 cells of 128-byte keys and values, whose two
// ranges take 32 granules of 4 KiB each at full context.
let dir = "", modelPath = "", reference: Engine;
const open = () => Engine.open({ modelPath, contextLength: 1024, batch: 16, threads: 2, backend: "cpu" });
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "infer-kv-pages-"));
  modelPath = join(dir, "tiny.gguf");
  writeFileSync(modelPath, tinyGemma3Gguf({ shape: { layers: 6, embedding: 64, feedForward: 128,
    heads: 4, kvHeads: 2, headDim: 32 }, branchGain: 16 }));
  reference = open();
});
afterAll(() => {
  reference?.close();
  rmSync(dir, { recursive: true, force: true });
});
const banEos = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0, logitBias: new Map([[1, -Infinity]]) };
const defaults: GenerateOptions = { maxTokens: 8, sampling: banEos, ignoreEos: true };

interface Job { prompt: number[]; options: Partial<GenerateOptions> }

function run(jobs: Job[], slots: number, capacity: number) {
  const engine = open();
  const phys = new FakePhysical(G, capacity);
  const pool = withFakePages(engine, phys);
  const scheduler = new BatchScheduler(engine, { slots, prefixCache: null, deviceGreedy: false });
  const results: (GenerateResult | Error | null)[] = jobs.map(() => null);
  let waitedWithFreeSlot = 0;
  jobs.forEach((j, i) => scheduler.submit({ prompt: j.prompt, options: { ...defaults, ...j.options },
    onDone: (r) => (results[i] = r), onError: (e) => (results[i] = e) }));
  for (let step = 0; scheduler.busy && step < 10_000; step++) {
    scheduler.step();
    const st = scheduler.stats();
    if (st.waiting > 0 && st.busySlots < st.slots) waitedWithFreeSlot++;
    expect(pool.mapped).toBeLessThanOrEqual(capacity);
  }
  engine.close();
  return { results, phys, waitedWithFreeSlot };
}

describe("the scheduler admits by the pool", () => {
  test("sequences of very different lengths share a pool smaller than their slots' contexts", () => {
    const jobs: Job[] = [
      { prompt: toyPrompt(600, 1), options: { maxTokens: 40 } },
      { prompt: toyPrompt(20, 2), options: { maxTokens: 6 } },
      { prompt: toyPrompt(300, 3), options: { maxTokens: 12 } },
      { prompt: toyPrompt(9, 4), options: { maxTokens: 3 } },
      { prompt: toyPrompt(450, 5), options: { maxTokens: 20 } },
      { prompt: toyPrompt(30, 6), options: { maxTokens: 5 } },
    ];
    // 4 slots at full context would take 256 granules; the pool has 80 (600 + 40 positions: 48)
    const { results, phys, waitedWithFreeSlot } = run(jobs, 4, 80);
    for (const [i, j] of jobs.entries()) {
      const got = results[i];
      if (!got || got instanceof Error) throw got ?? new Error(`job ${i} never ended`);
      const want = referenceGenerate(reference, j.prompt, { ...defaults, ...j.options });
      expect([i, got.tokens]).toEqual([i, want.tokens]);
    }
    expect(phys.peak).toBeLessThanOrEqual(80);
    expect(phys.peak).toBeGreaterThanOrEqual(48);
    expect(waitedWithFreeSlot).toBeGreaterThan(0); // the pool, not the slots, held some back
    expect(phys.unmaps).toBeGreaterThan(0); // free slots were emptied for others
  }, 120_000);

  test("a slot emptied for another forgets what it held: a later prompt like it evaluates it again", () => {
    const first = toyPrompt(100, 9);
    const jobs: Job[] = [
      { prompt: first, options: { maxTokens: 4 } }, // 16 granules
      { prompt: [3, ...toyPrompt(400, 10).slice(1)], options: { maxTokens: 4 } }, // 32: empties the first's slot
      { prompt: first, options: { maxTokens: 4 } }, // the first's slot again, which holds nothing now
    ];
    const { results } = run(jobs, 2, 40);
    for (const [i, j] of jobs.entries()) {
      const got = results[i];
      if (!got || got instanceof Error) throw got ?? new Error(`job ${i} never ended`);
      expect(got.tokens).toEqual(referenceGenerate(reference, j.prompt, { ...defaults, ...j.options }).tokens);
    }
    expect((results[2] as GenerateResult).prefilled).toBe(100);
  }, 60_000);

  test("a shorter next turn continues in place after its slot gives back what lies past it", () => {
    const first = toyPrompt(200, 11);
    const jobs: Job[] = [
      { prompt: first, options: { maxTokens: 100 } }, // 300 positions: 512 rows mapped
      // the first 150 tokens again and 10 others: continues from position 150 in the same slot,
      // which keeps 256 rows (what 165 positions need) and gives back the rest
      { prompt: [...first.slice(0, 150), ...toyPrompt(11, 12).slice(1)], options: { maxTokens: 4 } },
    ];
    const engine = open();
    const pool = withFakePages(engine, new FakePhysical(G, 64));
    const scheduler = new BatchScheduler(engine, { slots: 1, prefixCache: null, deviceGreedy: false });
    const got: GenerateResult[] = [];
    for (const j of jobs) {
      scheduler.submit({ prompt: j.prompt, options: { ...defaults, ...j.options }, onDone: (r) => got.push(r),
        onError: (e) => { throw e; } });
      while (scheduler.busy) scheduler.step();
      if (got.length === 1) expect(pool.held(engine.cache.layers)).toBe(32);
    }
    expect(pool.held(engine.cache.layers)).toBe(16);
    expect(got[1].prefilled).toBe(10);
    for (const [i, j] of jobs.entries()) {
      expect(got[i].tokens).toEqual(referenceGenerate(reference, j.prompt, { ...defaults, ...j.options }).tokens);
    }
    engine.close();
  }, 60_000);

  test("a request that can never fit is refused as a context overflow; the others run", () => {
    const jobs: Job[] = [
      { prompt: toyPrompt(900, 7), options: { maxTokens: 100 } }, // 1,001 positions: 64 granules
      { prompt: toyPrompt(40, 8), options: { maxTokens: 4 } },
    ];
    const { results } = run(jobs, 2, 50);
    expect(results[0]).toBeInstanceOf(InferError);
    expect((results[0] as InferError).code).toBe("context_overflow");
    expect((results[0] as InferError).message).toMatch(/KV cache needs .* MiB of GPU memory/);
    const want = referenceGenerate(reference, jobs[1].prompt, { ...defaults, ...jobs[1].options });
    expect((results[1] as GenerateResult).tokens).toEqual(want.tokens);
  }, 60_000);
});

describe("planning with a paged cache", () => {
  test("memory counts every slot's rings but one slot's full layers", () => {
    const shape = { heads: 4, headDim: 64, kvHeads: 2, embedding: 256, feedForward: 512, vocab: 1000,
      kvShapes: [{ kvHeads: 2, headDim: 64, window: 0 }, { kvHeads: 2, headDim: 64, window: 128 }] } as unknown as ModelShape;
    const file = { tensors: new Map() } as unknown as GgufFile;
    const o = { contextLength: 4096, maxBatch: 512, slots: 8, kvType: { k: "f16", v: "f16" } as const, threads: 1 };
    const row = 2 * 2 * 64 * 2, ring = 768 * row, full = 4096 * row;
    expect(memoryPlan(file, shape, o).kvCache).toBe(8 * (ring + full));
    const paged = memoryPlan(file, shape, { ...o, pagedKv: true });
    expect(paged.kvCache).toBe(8 * ring + full);
    expect(paged.kvPerPosition).toBe(row);
  });

  test("the default parallel: 4 with whole caches; with pages, what the pool holds at the average length", () => {
    const engine = open();
    expect(engine.defaultParallel()).toBe(4);
    engine.close();
    const paged = open();
    withFakePages(paged, new FakePhysical(G, 1000));
    // a slot: its full layer at 1,024 positions (64 granules, 256 KiB) and five rings of 256
    // cells of 256 bytes (320 KiB); 1,000 granules hold 6
    expect(paged.defaultParallel()).toBe(6);
    paged.close();
  });
});
