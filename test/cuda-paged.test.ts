// Method: the paged KV cache on the GPU (ts/backend/kv-pages.ts, cuda-pages.ts, lib/cuda/vmm.zig)
// against caches allocated whole (INFER_CUDA_KV_PAGED=0), on random-weight models whose
// full-attention rows are 2 KiB (a 2 MiB granule holds 1,024 positions): sequences of very
// different lengths run through the scheduler give exactly the greedy tokens they give with whole
// caches (same kernels, same addresses' contents); a cache maps granules as positions are written
// and no more; and a scheduler with more slots than fit at full context under a small pool
// (INFER_CUDA_KV_BUDGET) serves every request that can fit, exactly, and refuses the one that
// cannot as a context overflow; 8 sequences on one 2,100-token prompt through the prefix cache
// map its whole granules once (the rest of each sequence in its own), with the greedy tokens of
// the same run copying the prefix. Skipped without a GPU.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { CudaBackend } from "../ts/backend/cuda.ts";
import { Engine } from "../ts/engine/engine.ts";
import type { GenerateOptions, GenerateResult } from "../ts/engine/generation.ts";
import type { PrefixCacheOptions } from "../ts/engine/prefix-cache.ts";
import { BatchScheduler } from "../ts/engine/scheduler.ts";
import { InferError } from "../ts/errors.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import { cudaStatus } from "../ts/native/cuda.ts";
import { gemmaMixed, randomQuantGguf, type RandomQuantSpec } from "./support/random-quant-gguf.ts";

const noCuda = !cudaStatus().available;
const dir = mkdtempSync(join(tmpdir(), "infer-cuda-paged-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Llama, 2 layers of 8 KV heads of 128: 2 KiB of keys (and of values) a position and layer. */
const llamaWide: RandomQuantSpec = {
  arch: "llama", layers: 2, embedding: 1024, feedForward: 1024, heads: 8, kvHeads: 8, headDim: 128,
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q4_0, attnOut: GgmlType.Q4_0, ffn: GgmlType.Q4_0,
    ffnDown: GgmlType.Q4_0, output: GgmlType.Q8_0 },
  seed: 11,
};
const CONTEXT = 8192;
const greedy: GenerateOptions = { maxTokens: 16, ignoreEos: true,
  sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 } };

function modelFile(spec: RandomQuantSpec): string {
  const path = join(dir, `${spec.arch}-${spec.seed}.gguf`);
  writeFileSync(path, randomQuantGguf(spec));
  return path;
}

/** Opens an engine with the settings given set while it opens (its pool reads them then). */
function openWith(path: string, env: Record<string, string>): Engine {
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, env);
  try {
    return Engine.open({ modelPath: path, contextLength: CONTEXT, batch: 512, backend: "cuda" });
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

function prompt(n: number, seed: number): number[] {
  return Array.from({ length: n }, (_, i) => i === 0 ? 2 : 6 + ((i * 31 + seed * 17) % 240));
}

/** Runs the prompts through a scheduler of `slots`; results (or errors) in prompt order. */
function serve(engine: Engine, prompts: number[][], slots: number, prefixCache: PrefixCacheOptions | null = null) {
  const scheduler = new BatchScheduler(engine, { slots, prefixCache });
  const results: (GenerateResult | Error | null)[] = prompts.map(() => null);
  prompts.forEach((p, i) => scheduler.submit({ prompt: p, options: greedy,
    onDone: (r) => (results[i] = r), onError: (e) => (results[i] = e) }));
  let peak = 0;
  const pool = engine.backend.kvPages?.() ?? null;
  for (let step = 0; scheduler.busy && step < 100_000; step++) {
    scheduler.step();
    peak = Math.max(peak, pool?.mappedBytes ?? 0);
  }
  return { results, peak, prefix: scheduler.stats().prefix };
}

const lengths = [3, 40, 900, 2600, 5000, 130];

describe.skipIf(noCuda)("the paged KV cache on the GPU", () => {
  for (const spec of [llamaWide, gemmaMixed]) {
    test(`sequences of very different lengths give the tokens of whole caches: ${spec.arch}`, () => {
      const path = modelFile(spec);
      const prompts = lengths.map((n, i) => prompt(n, i));
      const whole = openWith(path, { INFER_CUDA_KV_PAGED: "0" });
      expect(whole.backend.kvPages!()).toBeNull();
      const want = serve(whole, prompts, 4).results;
      whole.close();
      const paged = openWith(path, {});
      const be = paged.backend as CudaBackend;
      expect(be.kvPaging).toMatch(/^paged in \d+ MiB granules/);
      const got = serve(paged, prompts, 4);
      paged.close();
      for (let i = 0; i < prompts.length; i++) {
        const w = want[i], g = got.results[i];
        if (!(w && g) || w instanceof Error || g instanceof Error) throw (g instanceof Error ? g : w) ?? new Error("unfinished");
        expect([i, g.tokens]).toEqual([i, w.tokens]);
      }
      expect(got.peak).toBeGreaterThan(0);
    }, 300_000);
  }

  test("a cache maps granules as positions are written, and only those", () => {
    const engine = openWith(modelFile(llamaWide), {});
    const pool = engine.backend.kvPages!()!;
    expect(pool).not.toBeNull();
    const layers = engine.cache.layers;
    expect(pool.held(layers)).toBe(0);
    engine.evaluate(prompt(10, 1));
    const early = pool.mappedBytes;
    expect(pool.held(layers)).toBe(pool.need(layers, 10));
    expect(early).toBeGreaterThan(0);
    engine.evaluate(prompt(3000, 2).slice(1));
    const later = pool.mappedBytes;
    expect(pool.held(layers)).toBe(pool.need(layers, engine.length));
    expect(later).toBeGreaterThan(early);
    // 2 layers × keys and values × 8,192 positions × 2 KiB reserved; 3,010 positions mapped
    const whole = 2 * 2 * CONTEXT * 2048;
    expect(later).toBeLessThan(whole / 2);
    expect(later).toBeGreaterThanOrEqual(2 * 2 * 3010 * 2048);
    engine.close();
  }, 120_000);

  test("more slots than fit at full context share a small pool; what never fits is refused", () => {
    const path = modelFile(llamaWide);
    // A slot at full context is 64 MiB; 6 slots would be 384 MiB, the pool is 48 MiB. The
    // 7,000-token prompt needs 56 MiB: it can never fit.
    const prompts = [...lengths.map((n, i) => prompt(n, i + 10)), prompt(7000, 99), prompt(700, 98)];
    const whole = openWith(path, { INFER_CUDA_KV_PAGED: "0" });
    const want = serve(whole, prompts.filter((p) => p.length !== 7000), 2).results;
    whole.close();
    const engine = openWith(path, { INFER_CUDA_KV_BUDGET: "48" });
    const got = serve(engine, prompts, 6);
    engine.close();
    expect(got.peak).toBeLessThanOrEqual(48 * 2 ** 20);
    let j = 0;
    for (const [i, p] of prompts.entries()) {
      const g = got.results[i];
      if (p.length === 7000) {
        expect(g).toBeInstanceOf(InferError);
        expect((g as InferError).code).toBe("context_overflow");
        continue;
      }
      const w = want[j++];
      if (!(w && g) || w instanceof Error || g instanceof Error) throw (g instanceof Error ? g : w) ?? new Error("unfinished");
      expect([i, g.tokens]).toEqual([i, w.tokens]);
    }
  }, 300_000);

  test("8 sequences on one long prompt map its whole granules once", () => {
    const engine = openWith(modelFile(llamaWide), {});
    const shared = prompt(2100, 7);
    const prompts = Array.from({ length: 8 }, (_, i) => [...shared, ...prompt(9, 50 + i).slice(1)]);
    const copied = serve(engine, prompts, 8, { share: false });
    engine.close();
    const again = openWith(modelFile(llamaWide), {});
    const pool = again.backend.kvPages!()!;
    const got = serve(again, prompts, 8, {});
    const g = pool.granule;
    again.close();
    for (let i = 0; i < prompts.length; i++) {
      const w = copied.results[i], r = got.results[i];
      if (!(w && r) || w instanceof Error || r instanceof Error) throw (r instanceof Error ? r : w) ?? new Error("unfinished");
      expect([i, r.tokens]).toEqual([i, w.tokens]);
    }
    // A slot writes 2,108 + 16 + 1 positions: 2,304 rows mapped, 3 granules a range, 12 a slot
    // (2 layers, keys and values). The cache restores 2,080 positions: 2 whole granules a range.
    const slot = 12, sharedPerSlot = 8;
    expect(copied.peak).toBe(8 * slot * g);
    expect(got.prefix!.sharedGranules).toBe(sharedPerSlot);
    // one prompt, and each other sequence's tail
    expect(got.peak).toBeLessThanOrEqual((slot + 7 * (slot - sharedPerSlot)) * g);
  }, 300_000);
});
