// Method: the prefix cache's blocks held by reference, copy-on-write (ts/backend/cpu-kv-share.ts).
// Memory is counted from /proc/self/pagemap: a cache range that holds a block by reference has no
// private (anonymous) pages; a write gives the writer one. On the CPU backend alone, a block shared
// into two layers reads the same, a write to one leaves the other and the block alone, and
// detaching before the block is rewritten keeps the holders' rows. On the default model, 8
// sequences with one 1,000-token prompt hold its full-attention rows once, and every sequence,
// including one that writes into a shared block and one that comes after it, gets the tokens it
// gets with the rows copied (the path the scheduler tests hold against sequences run alone).
import { describe, expect, test } from "bun:test";
import { closeSync, existsSync, openSync, readFileSync, readSync } from "node:fs";
import { join } from "node:path";
import { CpuBackend } from "../ts/backend/cpu.ts";
import type { CpuKvRows } from "../ts/backend/cpu-kv-share.ts";
import type { KvLayer } from "../ts/backend/backend.ts";
import { Engine } from "../ts/engine/engine.ts";
import type { GenerateResult } from "../ts/engine/generation.ts";
import type { Slot } from "../ts/engine/kv-cache.ts";
import { BatchScheduler, type SchedulerStats } from "../ts/engine/scheduler.ts";
import { defaultModelPath } from "../ts/models/cache.ts";
import { native } from "../ts/native/lib.ts";

// The figures below assume 4 KiB pages (x86-64 Linux; some arm64 kernels use 16 or 64 KiB).
const linux = process.platform === "linux" && Number(native().infer_kv_pages_size()) === 4096;

/**
 * Bytes of the pages within address .. address + length that are present and private to this
 * process (anonymous: written, or copied on a write), from /proc/self/pagemap's flags (bit 63
 * present, bit 61 a page of a file or shared memory).
 */
function anonymousBytes(address: number, length: number): number {
  const page = 4096, first = Math.floor(address / page), last = Math.ceil((address + length) / page);
  const entries = new BigUint64Array(last - first);
  const fd = openSync("/proc/self/pagemap", "r");
  try {
    readSync(fd, new Uint8Array(entries.buffer), 0, entries.byteLength, first * 8);
  } finally {
    closeSync(fd);
  }
  let pages = 0;
  for (const e of entries) if ((e >> 63n) & 1n && !((e >> 61n) & 1n)) pages++;
  return pages * page;
}

function layerAnonymous(layer: KvLayer, from: number, cells: number): number {
  const l = layer as CpuKvRows;
  return anonymousBytes((l.k as number) + from * l.kRowBytes, cells * l.kRowBytes) +
    anonymousBytes((l.v as number) + from * l.vRowBytes, cells * l.vRowBytes);
}

function rows(layer: KvLayer, from: number, cells: number): number[] {
  const l = layer as CpuKvRows;
  return [...l.kBytes.subarray(from * l.kRowBytes, (from + cells) * l.kRowBytes),
    ...l.vBytes.subarray(from * l.vRowBytes, (from + cells) * l.vRowBytes)];
}

describe.skipIf(!linux)("a block shared into layers of the CPU backend", () => {
  test("read by reference, a write copies one page for the writer, detach keeps the holders' rows", () => {
    const be = new CpuBackend(), shape = { kvHeads: 2, headDim: 128 }, cols = 256; // 512-byte f16 rows
    try {
      const store = be.kvBlockStore([shape], { k: "f16", v: "f16" }, 32, 2)!;
      const block = store.block(0)[0], other = store.block(1)[0];
      const a = be.kvLayer(256, 2, 128, "f16", false), b = be.kvLayer(256, 2, 128, "f16", false);
      const k = be.activation("k", 32, cols), v = be.activation("v", 32, cols);
      const fill = (seed: number) => {
        const kf = (k as unknown as { f32: Float32Array }).f32, vf = (v as unknown as { f32: Float32Array }).f32;
        for (let i = 0; i < kf.length; i++) {
          kf[i] = Math.sin(seed + i);
          vf[i] = Math.cos(seed * 3 + i);
        }
      };
      fill(1);
      be.storeKv(block, k, v, 32, 0);
      const original = rows(block, 0, 32);
      expect(store.share(block, 0, a, 64, 32)).toBe(true);
      expect(store.share(block, 0, b, 64, 32)).toBe(true);
      expect(store.sharedRows).toBe(64);
      expect(rows(a, 64, 32)).toEqual(original);
      expect(rows(b, 64, 32)).toEqual(original);
      expect(layerAnonymous(a, 64, 32) + layerAnonymous(b, 64, 32)).toBe(0);
      // Not on page boundaries: refused, nothing changed.
      expect(store.share(block, 0, a, 65, 31)).toBe(false);

      fill(2); // a writes one position into the shared rows: a page of keys and one of values
      be.storeKv(a, k, v, 1, 70);
      expect(layerAnonymous(a, 64, 32)).toBe(2 * 4096);
      expect(rows(b, 64, 32)).toEqual(original);
      expect(rows(block, 0, 32)).toEqual(original);
      expect(rows(a, 70, 1)).not.toEqual(rows(b, 70, 1));
      expect(rows(a, 71, 25)).toEqual(rows(b, 71, 25));

      store.detach([block]); // before the block's storage holds something else
      expect(store.sharedRows).toBe(0);
      be.copyKv(other, 0, block, 0, 32); // rewritten (zeros)
      expect(rows(b, 64, 32)).toEqual(original);
      expect(rows(block, 0, 32)).not.toEqual(original);
    } finally {
      be.dispose();
    }
  });
});

describe.skipIf(!linux || !existsSync(defaultModelPath()))("8 sequences with one 1,000-token prompt", () => {
  const text = readFileSync(join(import.meta.dir, "fixtures", "alice-chapter1.txt"), "utf8");
  const greedy = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 };

  function run(share: boolean) {
    const engine = Engine.open({ modelPath: defaultModelPath(), contextLength: 1280, batch: 64, threads: 2 });
    try {
      const prompt = engine.tokenizer.encode(text, { addSpecial: true, parseSpecial: false }).slice(0, 1000);
      const scheduler = new BatchScheduler(engine, { slots: 8, prefixCache: { share } });
      const slots = (scheduler as unknown as { slots: Slot[] }).slots;
      const results: GenerateResult[] = [];
      const drain = (prompts: number[][]) => {
        for (const p of prompts) {
          scheduler.submit({ prompt: p, options: { maxTokens: 6, sampling: greedy, ignoreEos: true },
            onDone: (r) => results.push(r), onError: (e) => { throw e; } });
        }
        while (scheduler.busy) scheduler.step();
      };
      drain(Array.from({ length: 8 }, () => prompt));
      const full = slots[0].cache.layers.filter((l) => !l.ring).length;
      // Anonymous bytes of the full layers' first 992 rows (31 blocks of 32) in all slots.
      const prefixAnonymous = slots.reduce((sum, s) => sum + s.cache.layers.reduce((n, l) =>
        n + (l.ring ? 0 : layerAnonymous(l, 0, 992)), 0), 0);
      const stats: SchedulerStats = scheduler.stats();
      // Every slot then takes a prompt that leaves this one half-way into a shared block (and
      // writes there), and the whole prompt comes again: no slot holds it, so it is handed the
      // blocks (past what a slot continues in place), which those writes must have left alone.
      drain(Array.from({ length: 8 }, (_, i) => [...prompt.slice(0, 500), ...prompt.slice(600 + 9 * i, 700)]));
      const restored = scheduler.stats().prefix!.restoredTokens;
      drain([prompt]);
      expect(scheduler.stats().prefix!.restoredTokens - restored).toBeGreaterThan(400);
      return { results, full, prefixAnonymous, stats };
    } finally {
      engine.close();
    }
  }

  test("hold the prompt's full-attention rows once, and get the tokens they get with copies", () => {
    const copied = run(false), shared = run(true);
    expect(shared.results.map((r) => r.tokens)).toEqual(copied.results.map((r) => r.tokens));
    expect(shared.results.map((r) => r.text)).toEqual(copied.results.map((r) => r.text));
    expect(new Set(shared.results.slice(0, 8).map((r) => r.text)).size).toBe(1);
    expect(shared.full).toBeGreaterThan(0);
    expect(copied.stats.prefix!.sharedRows).toBe(0);
    // Every slot holds the 31 whole blocks of the prompt by reference in every full layer.
    expect(shared.stats.prefix!.sharedRows).toBe(8 * shared.full * 992);
    expect(shared.prefixAnonymous).toBe(0);
    // With copies, each slot has its own (f16 rows of 1 head of 256: 512 bytes of K and of V).
    expect(copied.prefixAnonymous).toBe(8 * shared.full * 992 * 1024);
  }, 300_000);
});
