// Method: the multi-sequence forward pass (rows of several sequences in one batch, each with its
// own KV cache) and KV-block copies on the CUDA backend, against the CPU backend running each
// sequence alone, on a tiny random float Gemma 3 whose output depends on its context: logits
// within the float-model tolerance of test/cuda.test.ts, a copied cache continuing exactly as its
// source does, and the batch scheduler serving requests to the end. Skipped without a GPU.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Engine } from "../ts/engine/engine.ts";
import { createKvCache, type KvCache } from "../ts/engine/kv-cache.ts";
import { BatchScheduler } from "../ts/engine/scheduler.ts";
import type { SequenceRows } from "../ts/model/model.ts";
import { cudaStatus } from "../ts/native/cuda.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const status = cudaStatus();
const noCuda = !status.available;
const TOL_LOGITS_F = 1e-2; // as test/cuda.test.ts for float models
const dir = mkdtempSync(join(tmpdir(), "infer-cuda-batch-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function maxError(got: Float32Array, want: Float32Array): number {
  let err = 0, scale = 0;
  for (let i = 0; i < want.length; i++) {
    err = Math.max(err, Math.abs(got[i] - want[i]));
    scale = Math.max(scale, Math.abs(want[i]));
  }
  return err / scale;
}

describe.skipIf(noCuda)("several sequences in one CUDA batch", () => {
  const modelPath = join(dir, "tiny.gguf");
  writeFileSync(modelPath, tinyGemma3Gguf({ branchGain: 16, shape: { layers: 3, embedding: 128,
    feedForward: 256, heads: 4, kvHeads: 2, headDim: 32 } }));
  const open = (backend: "cpu" | "cuda") =>
    Engine.open({ modelPath, contextLength: 512, batch: 16, backend });
  const prompts = [[2, 10, 40], [2, 77, 12, 9, 130], [2, 8, 8, 50, 61, 200, 14]];

  test("batched prompts and a batched decode step give each sequence its logits alone", () => {
    const cpu = open("cpu"), gpu = open("cuda");
    const vocab = cpu.model.info.vocabSize;
    const caches = (e: Engine) => prompts.map(() =>
      createKvCache(e.backend, e.model.info, 512, "f16", e.model.maxBatch));
    const gpuCaches: KvCache[] = caches(gpu);
    // one batch holding the three prompts; logits of the last one's rows
    const segments: SequenceRows[] = prompts.map((p, i) => ({ rows: p.length, position: 0,
      cache: gpuCaches[i].layers }));
    const last = prompts.at(-1)!;
    let gpuPrompt = new Float32Array(0);
    gpu.model.forwardBatch({ tokens: prompts.flat(), segments, logitRows: last.length },
      (_first, _rows, logits) => { gpuPrompt = logits.slice(); });
    const cpuPrompt = new Float32Array(last.length * vocab);
    const alone = caches(cpu);
    for (const [i, p] of prompts.entries()) {
      cpu.model.forward(p, p.length, 0, alone[i].layers, i === prompts.length - 1
        ? { onLogits: (first, rows, logits) => cpuPrompt.set(logits.subarray(0, rows * vocab), first * vocab) }
        : {});
    }
    const promptError = maxError(gpuPrompt, cpuPrompt);
    // a decode step: one row per sequence
    const next = [33, 44, 55];
    const decode: SequenceRows[] = prompts.map((p, i) => ({ rows: 1, position: p.length,
      cache: gpuCaches[i].layers }));
    let gpuStep = new Float32Array(0);
    gpu.model.forwardBatch({ tokens: next, segments: decode, logitRows: 3 },
      (_first, _rows, logits) => { gpuStep = logits.slice(); });
    let stepError = 0;
    for (const [i, p] of prompts.entries()) {
      const want = cpu.model.forward([next[i]], 1, p.length, alone[i].layers);
      stepError = Math.max(stepError, maxError(gpuStep.subarray(i * vocab, (i + 1) * vocab), want));
    }
    console.log(`cuda batch: prompt logits error ${promptError.toExponential(2)}, ` +
      `decode step ${stepError.toExponential(2)}`);
    expect(promptError).toBeLessThan(TOL_LOGITS_F);
    expect(stepError).toBeLessThan(TOL_LOGITS_F);

    // a cache copied cell for cell continues exactly as its source
    const copy = createKvCache(gpu.backend, gpu.model.info, 512, "f16", gpu.model.maxBatch);
    const length = prompts[1].length + 1;
    for (const [l, layer] of gpuCaches[1].layers.entries()) {
      gpu.backend.copyKv!(layer, 0, copy.layers[l], 0, length);
    }
    const fromCopy = gpu.model.forward([7], 1, length, copy.layers).slice();
    const fromSource = gpu.model.forward([7], 1, length, gpuCaches[1].layers).slice();
    expect(Array.from(fromCopy)).toEqual(Array.from(fromSource));
    cpu.close();
    gpu.close();
  }, 60_000);

  test("batched decode steps deep in the context (one launch for all sequences, keys split)", () => {
    // Six layers: the sixth is global, so its attention sees every key (split 4 to 8 ways).
    const deepPath = join(dir, "tiny-6.gguf");
    writeFileSync(deepPath, tinyGemma3Gguf({ branchGain: 16, shape: { layers: 6, embedding: 128,
      feedForward: 256, heads: 8, kvHeads: 2, headDim: 32 } }));
    const openDeep = (backend: "cpu" | "cuda") => Engine.open({ modelPath: deepPath, contextLength: 512, batch: 320, backend });
    const cpu = openDeep("cpu"), gpu = openDeep("cuda");
    const vocab = cpu.model.info.vocabSize;
    const long = [150, 290, 213].map((n, s) => Array.from({ length: n }, (_, i) => 6 + ((i * 31 + s * 7) % 250)));
    const gpuCaches = long.map(() => createKvCache(gpu.backend, gpu.model.info, 512, "f16", gpu.model.maxBatch));
    const cpuCaches = long.map(() => createKvCache(cpu.backend, cpu.model.info, 512, "f16", cpu.model.maxBatch));
    for (const [i, p] of long.entries()) {
      gpu.model.forward(p, p.length, 0, gpuCaches[i].layers);
      cpu.model.forward(p, p.length, 0, cpuCaches[i].layers);
    }
    let worst = 0;
    for (let step = 0; step < 3; step++) {
      const next = long.map((_, i) => 20 + 3 * step + i);
      let got = new Float32Array(0);
      gpu.model.forwardBatch({ tokens: next, logitRows: next.length,
        segments: long.map((p, i) => ({ rows: 1, position: p.length + step, cache: gpuCaches[i].layers })) },
      (_first, _rows, logits) => { got = logits.slice(); });
      for (const [i, p] of long.entries()) {
        const want = cpu.model.forward([next[i]], 1, p.length + step, cpuCaches[i].layers);
        worst = Math.max(worst, maxError(got.subarray(i * vocab, (i + 1) * vocab), want));
      }
    }
    console.log(`cuda batch: decode at 150-290 tokens, worst logits error ${worst.toExponential(2)}`);
    expect(worst).toBeLessThan(TOL_LOGITS_F);
    cpu.close();
    gpu.close();
  }, 60_000);

  test("the batch scheduler serves requests to the end on CUDA, with the prefix cache", () => {
    const gpu = open("cuda");
    const scheduler = new BatchScheduler(gpu, { slots: 3, prefillChunk: 8,
      prefixCache: { blockTokens: 8 } });
    const shared = Array.from({ length: 40 }, (_, i) => 6 + ((i * 37) % 250));
    const done: number[] = [];
    for (let i = 0; i < 5; i++) {
      scheduler.submit({ prompt: [2, ...shared, 10 + i, 20 + i],
        options: { maxTokens: 12, sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0,
          logitBias: new Map([[1, -Infinity]]) } },
        onDone: (r) => done.push(r.tokens.length), onError: (e) => { throw e; } });
    }
    while (scheduler.busy) scheduler.step();
    expect(done).toEqual([12, 12, 12, 12, 12]);
    expect(scheduler.stats().prefix!.restoredTokens).toBeGreaterThan(0);
    expect(scheduler.stats().busySlots).toBe(0);
    gpu.close();
  }, 60_000);
});

test("without CUDA, the batch tests say why they skip", () => {
  if (!status.available) console.log(`cuda-batch.test.ts: skipped: ${status.reason}`);
  expect(true).toBe(true);
});
