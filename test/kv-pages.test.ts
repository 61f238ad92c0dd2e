// Method: the paged KV cache's bookkeeping (ts/backend/kv-pages.ts) on a fake physical side
// (support/fake-pages.ts: a granule budget, and poison in what is mapped and unmapped): which
// granules a layer maps for a position (odd row sizes, rings excluded), giving them back, the
// admission decision (admit, empty free slots, wait, never), and the real scheduler on a CPU
// backend paged through the fake, with more slots than fit at full context: every sequence must
// give exactly the tokens it gets alone, the pool never past its budget. Shared prefix granules:
// sealing, adopting, copy-on-write, resets and odd row sizes on the pool, and the real scheduler
// and prefix cache sharing one long prompt among slots, where the fake keeps a copy of a granule
// per address it is mapped at and fails when they differ (a write that landed in shared memory).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { KvLayer } from "../ts/backend/backend.ts";
import {
  admitPages, KvPagePool, paddedRows, ROW_PAD, type Granule, type PagedLayer, type PagedRange, type SealedGranules,
} from "../ts/backend/kv-pages.ts";
import { Engine } from "../ts/engine/engine.ts";
import type { GenerateOptions, GenerateResult } from "../ts/engine/generation.ts";
import { memoryPlan } from "../ts/engine/memory.ts";
import type { PrefixCacheOptions, PrefixCacheStats } from "../ts/engine/prefix-cache.ts";
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

/** A slot's full layer on `phys` whose bytes the test can see: 4 KiB granules of `rows` rows. */
function backedLayer(pool: KvPagePool, phys: FakePhysical, cells: number, kRowBytes: number, vRowBytes: number) {
  const l = layer(pool, cells, kRowBytes, vRowBytes), p = pagesOf(l);
  const k = new Uint8Array(cells * kRowBytes), v = new Uint8Array(cells * vRowBytes);
  phys.back(p.k.address, k);
  phys.back(p.v.address, v);
  return { l, k, v };
}

/** A layer's row bytes as a kernel would write them: the row's position in every byte. */
function writeRows(pool: KvPagePool, s: { l: KvLayer; k: Uint8Array; v: Uint8Array }, from: number, to: number) {
  pool.writeRows(s.l, from, to);
  const { kRowBytes: kb, vRowBytes: vb } = s.l as unknown as PagedLayer;
  for (let p = from; p < to; p++) {
    s.k.fill(p & 0xff, p * kb, (p + 1) * kb);
    s.v.fill(p & 0xff, p * vb, (p + 1) * vb);
  }
}

function rowsAre(s: { l: KvLayer; k: Uint8Array; v: Uint8Array }, from: number, to: number): boolean {
  const { kRowBytes: kb, vRowBytes: vb } = s.l as unknown as PagedLayer;
  for (let p = from; p < to; p++) {
    if (s.k.subarray(p * kb, (p + 1) * kb).some((x) => x !== (p & 0xff))) return false;
    if (s.v.subarray(p * vb, (p + 1) * vb).some((x) => x !== (p & 0xff))) return false;
  }
  return true;
}

/** The granules `seal` named, as a share plan looks them up. */
function lookup(...sealed: (SealedGranules | null)[]) {
  const k = new Map<number, Granule>(), v = new Map<number, Granule>();
  for (const s of sealed) {
    s?.k.granules.forEach((g, n) => k.set(s.k.first + n, g));
    s?.v.granules.forEach((g, n) => v.set(s.v.first + n, g));
  }
  return { k: (i: number) => k.get(i), v: (i: number) => v.get(i) };
}

describe("slots share a saved prefix's whole granules", () => {
  // 128-byte rows: 32 rows a 4 KiB granule; 1,024 cells
  const prefix = (pool: KvPagePool, phys: FakePhysical, rows: number) => {
    const a = backedLayer(pool, phys, 1024, 128, 128);
    writeRows(pool, a, 0, rows + 4);
    return { a, sealed: pool.seal(a.l, 0, rows) };
  };
  const adopt = (pool: KvPagePool, phys: FakePhysical, sealed: SealedGranules | null, positions: number) => {
    const b = backedLayer(pool, phys, 1024, 128, 128);
    const plan = pool.sharePlan(b.l, 0, positions, lookup(sealed));
    if (plan) pool.adopt(b.l, plan, positions);
    return { b, plan };
  };

  test("n slots on one prefix hold its whole granules once", () => {
    const phys = new FakePhysical(G, 1000), pool = new KvPagePool(phys);
    const { a, sealed } = prefix(pool, phys, 100); // 96 rows: granules 0, 1 and 2 are whole
    expect(sealed!.k.granules.length).toBe(3);
    expect(pool.mapped).toBe(16); // 256 rows mapped a range
    const holders = [1, 2, 3].map(() => adopt(pool, phys, sealed, 100));
    for (const { b, plan } of holders) {
      expect(plan!.rows).toEqual([0, 96]);
      expect(rowsAre(b, 0, 96)).toBe(true); // the same memory: its rows without a copy
      expect(pool.held([b.l])).toBe(16);
      expect(pool.owned([b.l])).toBe(10);
    }
    // 3 granules a range once, and each slot's own 5
    expect(pool.mapped).toBe(16 + 3 * 10);
    expect(phys.live).toBe(pool.mapped);
    expect(pool.shared([a.l, ...holders.map((h) => h.b.l)])).toBe(6);
    expect(phys.copies).toBe(0);
    phys.checkShared();
  });

  test("a write into a shared granule copies it first; the other holders keep their rows", () => {
    const phys = new FakePhysical(G, 1000), pool = new KvPagePool(phys);
    const { a, sealed } = prefix(pool, phys, 100);
    const { b } = adopt(pool, phys, sealed, 100), { b: c } = adopt(pool, phys, sealed, 100);
    writeRows(pool, b, 96, 130); // past the shared granules: nothing copied
    expect(phys.copies).toBe(0);
    const before = pool.mapped;
    expect(pool.writeCopies(b.l, 70, 71)).toBe(true);
    writeRows(pool, b, 70, 71); // into granule 2 of each range, which a and c map too
    expect(phys.copies).toBe(2);
    expect(pool.mapped).toBe(before + 2);
    phys.checkShared(); // the write landed in b's copy only
    expect(rowsAre(b, 0, 130)).toBe(true);
    expect(rowsAre(a, 0, 100) && rowsAre(c, 0, 96)).toBe(true);
    expect(pool.writeCopies(b.l, 70, 71)).toBe(false); // its own now
    // A write that skips the pool into memory another slot maps is what the fake catches.
    c.k[0] = 0xee;
    expect(() => phys.checkShared()).toThrow(/written while shared/);
  });

  test("a holder's reset gives back only what no other slot maps; a granule no slot maps is not handed out", () => {
    const phys = new FakePhysical(G, 1000), pool = new KvPagePool(phys);
    const { a, sealed } = prefix(pool, phys, 100);
    const { b } = adopt(pool, phys, sealed, 100);
    expect(pool.reclaimable([[a.l], [b.l]])).toEqual([10, 16]); // the shared 6 come with the second
    pool.trimRows(a.l, 0); // the saving slot starts over: b keeps the prefix
    expect(pool.mapped).toBe(16);
    expect(rowsAre(b, 0, 96)).toBe(true);
    const { b: c, plan } = adopt(pool, phys, sealed, 100); // still handable: b maps them
    expect(plan).not.toBeNull();
    expect(rowsAre(c, 0, 96)).toBe(true);
    pool.trimRows(b.l, 0);
    pool.trimRows(c.l, 0);
    expect([pool.mapped, phys.live]).toEqual([0, 0]);
    expect(adopt(pool, phys, sealed, 100).plan).toBeNull(); // released: the cache copies instead
  });

  test("a write into a sealed granule no other slot maps unseals it in place", () => {
    const phys = new FakePhysical(G, 1000), pool = new KvPagePool(phys);
    const { a, sealed } = prefix(pool, phys, 100);
    writeRows(pool, a, 40, 41); // a rewound and written again: granule 1 holds another prefix now
    expect(phys.copies).toBe(0);
    const { plan } = adopt(pool, phys, sealed, 100);
    expect(plan!.k.granules.length).toBe(1); // only granule 0 is still the prefix's
    expect(plan!.rows).toEqual([0, 32]);
  });

  test("a slot continuing a prefix part-way takes the whole granules past what it holds", () => {
    const phys = new FakePhysical(G, 1000), pool = new KvPagePool(phys);
    const { sealed } = prefix(pool, phys, 200); // granules 0 .. 5 whole
    const b = backedLayer(pool, phys, 1024, 128, 128);
    writeRows(pool, b, 0, 50); // it holds 50 positions of the same prefix
    const plan = pool.sharePlan(b.l, 50, 200, lookup(sealed))!;
    expect([plan.k.first, plan.k.granules.length, ...plan.rows]).toEqual([2, 4, 64, 192]);
  });

  test("odd row sizes: rows straddling a granule's edge are copied, a prefix within one granule is not shared", () => {
    const phys = new FakePhysical(G, 1000), pool = new KvPagePool(phys);
    // q8_0-like 34-byte keys and 50-byte values
    const a = backedLayer(pool, phys, 1000, 34, 50);
    writeRows(pool, a, 0, 300);
    expect(pool.seal(a.l, 0, 100)!.k.granules.length).toBe(0); // 3,400 bytes: no whole granule
    const sealed = pool.seal(a.l, 0, 300)!; // keys 10,200 bytes: 2 granules; values 15,000: 3
    expect([sealed.k.granules.length, sealed.v.granules.length]).toEqual([2, 3]);
    const b = backedLayer(pool, phys, 1000, 34, 50);
    const plan = pool.sharePlan(b.l, 0, 300, lookup(sealed))!;
    // rows wholly inside both: keys to byte 8,192 (row 240), values to 12,288 (row 245)
    expect(plan.rows).toEqual([0, 240]);
    // the rest is copied before the granules are adopted, as the prefix cache does it
    pool.writeRows(b.l, 240, 300);
    b.k.set(a.k.subarray(240 * 34, 300 * 34), 240 * 34);
    b.v.set(a.v.subarray(240 * 50, 300 * 50), 240 * 50);
    pool.adopt(b.l, plan, 300);
    expect(rowsAre(b, 0, 300)).toBe(true);
    phys.checkShared();
    // 80 rows: 2,720 bytes of keys, 4,000 of values: nothing whole, nothing shared
    expect(pool.sharePlan(b.l, 0, 80, lookup(pool.seal(a.l, 0, 80)))).toBeNull();
  });

  test("admission counts what a write into shared granules will copy, and what a reset gives back", () => {
    const phys = new FakePhysical(G, 1000), pool = new KvPagePool(phys);
    const { a, sealed } = prefix(pool, phys, 100);
    const { b } = adopt(pool, phys, sealed, 100);
    // b continuing at 100 keeps all 16; from 70 it copies granule 2 of each range
    expect(pool.kept([b.l], 100, 200)).toBe(16);
    expect(pool.kept([b.l], 70, 200)).toBe(14);
    // from 0: the shared granules are given back (unshareFrom), with what follows them
    expect(pool.kept([b.l], 0, 200)).toBe(0);
    expect(pool.freed([b.l], 0, 200)).toBe(10);
    pool.unshareFrom(b.l, 0);
    expect(pool.held([b.l])).toBe(0);
    expect(pool.mapped).toBe(16);
    expect(rowsAre(a, 0, 100)).toBe(true);
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

/** Runs jobs in turn (each waits for those before it) or together, checking shared granules each step. */
function runShared(jobs: Job[][], slots: number, prefixCache: PrefixCacheOptions | null) {
  const engine = open();
  const phys = new FakePhysical(G, 10_000);
  const pool = withFakePages(engine, phys);
  const scheduler = new BatchScheduler(engine, { slots, prefixCache, deviceGreedy: false });
  const rounds: GenerateResult[][] = [], mapped: number[] = [], stats: PrefixCacheStats[] = [];
  let sharedMost = 0;
  for (const round of jobs) {
    const got: GenerateResult[] = [];
    round.forEach((j, i) => scheduler.submit({ prompt: j.prompt, options: { ...defaults, ...j.options },
      onDone: (r) => (got[i] = r), onError: (e) => { throw e; } }));
    for (let step = 0; scheduler.busy && step < 10_000; step++) {
      scheduler.step();
      phys.checkShared();
      sharedMost = Math.max(sharedMost, scheduler.stats().prefix?.sharedGranules ?? 0);
    }
    rounds.push(got);
    mapped.push(pool.mapped);
    if (prefixCache) stats.push(scheduler.stats().prefix!);
    expect(phys.live).toBe(pool.mapped);
  }
  engine.close();
  return { rounds, mapped, phys, sharedMost, stats };
}

function expectReference(jobs: Job[], got: GenerateResult[]) {
  for (const [i, j] of jobs.entries()) {
    expect([i, got[i]?.tokens]).toEqual([i, referenceGenerate(reference, j.prompt, { ...defaults, ...j.options }).tokens]);
  }
}

describe("the scheduler shares a cached prompt's granules between slots", () => {
  // One 600-token prompt, then 5 tokens of each sequence's own; the cache's 32-token blocks make
  // 576 positions restorable: 18 whole granules a range, 36 a slot.
  const shared = toyPrompt(600, 21);
  const burst: Job[] = [1, 2, 3, 4, 5, 6].map((n) => ({ prompt: [...shared, ...toyPrompt(6, 30 + n).slice(1)],
    options: { maxTokens: 8 } }));

  test("6 sequences on one long prompt hold its whole granules once, and give what each gives alone", () => {
    const on = runShared([burst], 6, { blockTokens: 32 });
    expectReference(burst, on.rounds[0]);
    const off = runShared([burst], 6, { blockTokens: 32, share: false });
    expectReference(burst, off.rounds[0]);
    // each slot maps 768 rows (48 granules); 5 of them share the first's 36
    expect(off.mapped[0]).toBe(6 * 48);
    expect(on.mapped[0]).toBe(48 + 5 * 12);
    expect(on.sharedMost).toBe(36);
    expect(on.phys.copies).toBe(0);
  }, 120_000);

  test("a prompt parting inside a shared granule copies it; the other holders keep their rows", () => {
    const parting: Job[] = [
      // continues a holder in place from position 400 (its rings still hold the window before
      // it), inside granule 12: copied, the granules past it given back
      { prompt: [...shared.slice(0, 400), ...toyPrompt(40, 41).slice(1)], options: { maxTokens: 6 } },
      // a holder of the whole prompt continues in place: its shared granules are intact
      { prompt: [...shared, ...toyPrompt(9, 42).slice(1)], options: { maxTokens: 6 } },
      // another prompt in a slot that held the shared one: starts over, copying nothing
      { prompt: toyPrompt(500, 43), options: { maxTokens: 6 } },
    ];
    const r = runShared([burst, parting.slice(0, 1), parting.slice(1)], 6, { blockTokens: 32 });
    expectReference(burst, r.rounds[0]);
    expectReference(parting.slice(0, 1), r.rounds[1]);
    expectReference(parting.slice(1), r.rounds[2]);
    expect(r.phys.copies).toBe(2); // granule 12 of the keys and of the values, once
  }, 120_000);

  test("a context shift in slots holding shared granules copies them first; the tokens are those of copies", () => {
    // 2 sequences on the shared prompt run past the 1,024-position context and shift
    const long: Job[] = burst.slice(0, 2).map((j) => ({ prompt: j.prompt,
      options: { maxTokens: 480, contextShift: true } }));
    const on = runShared([long], 2, { blockTokens: 32 });
    const off = runShared([long], 2, { blockTokens: 32, share: false });
    for (const [i, r] of on.rounds[0].entries()) {
      expect(r.tokens.length).toBe(480);
      expect([i, r.tokens]).toEqual([i, off.rounds[0][i].tokens]);
    }
    expect(on.sharedMost).toBe(36);
    expect(on.phys.copies).toBeGreaterThan(0);
  }, 120_000);

  test("blocks evicted while slots hold their granules: the holders keep them, later prompts are right", () => {
    // a cache of 24 blocks: the second prompt's blocks evict the first's
    const bytesMax = 24 * 32 * (5 * 2 * 2 * 32 * 2 + 2 * 2 * 32 * 2);
    const other = toyPrompt(700, 51);
    const rounds: Job[][] = [
      burst.slice(0, 3),
      [{ prompt: [...other, 9], options: { maxTokens: 4 } }, { prompt: [...other, 10], options: { maxTokens: 4 } }],
      [{ prompt: [...shared, 11], options: { maxTokens: 4 } }, { prompt: [...other, 12], options: { maxTokens: 4 } }],
    ];
    const r = runShared(rounds, 4, { blockTokens: 32, bytesMax });
    for (const [i, round] of rounds.entries()) expectReference(round, r.rounds[i]);
    expect(r.stats[0].sharedGranules).toBe(36); // 3 slots hold the first prompt's 18 + 18
    // the other prompt's blocks took the storage; the first prompt's holders still share theirs
    expect(r.stats[1].blocks).toBe(24);
    expect(r.stats[1].sharedGranules).toBeGreaterThanOrEqual(36);
  }, 120_000);
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
