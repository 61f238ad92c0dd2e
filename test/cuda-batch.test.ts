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
import { argmax } from "../ts/sample/sampler.ts";
import { llamaQ4_0, qwen3KQuants, randomQuantGguf, type RandomQuantSpec } from "./support/random-quant-gguf.ts";
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

  // A decode step of 2 to 64 rows runs its quantized matmuls on the tensor cores (lib/cuda/ops.zig
  // batchMma: tiles of 8, 16 and 32 tokens; the K-quants past 32 rows the prompt's tile), where
  // one sequence alone runs matvecs: another
  // summation order, so the logits agree within the quantized tolerance and the greedy tokens
  // are the same. 64 sequences of 2 to 121 prompt tokens (their attention over different
  // lengths in one launch), 6 steps, every row's token against the sequence decoded alone.
  const TOL_LOGITS_Q = 1e-3;
  const quantSpecs: [string, RandomQuantSpec][] = [["Q4_0, Q6_K head", llamaQ4_0],
    ["Q4_K, Q5_K, Q6_K", qwen3KQuants]];
  for (const [label, spec] of quantSpecs) {
    test(`64 sequences of mixed lengths decode together as each alone: ${label}`, () => {
      const path = join(dir, `${spec.arch}-${spec.seed}.gguf`);
      writeFileSync(path, randomQuantGguf(spec));
      // batch 128: a prompt goes through model.forward in one pass (the decode steps have 64 rows)
      const gpu = Engine.open({ modelPath: path, contextLength: 160, batch: 128, backend: "cuda" });
      const vocab = gpu.model.info.vocabSize, n = 64, steps = 6;
      const prompts = Array.from({ length: n }, (_, s) =>
        Array.from({ length: 2 + ((s * 37) % 120) }, (_, i) => 6 + ((i * 31 + s * 17) % 240)));
      const cache = () => createKvCache(gpu.backend, gpu.model.info, 160, "f16", gpu.model.maxBatch);
      // Each sequence alone: its prompt, then one token a step.
      const alone = prompts.map((p) => {
        const c = cache();
        const tokens = [argmax(gpu.model.forward(p, p.length, 0, c.layers))];
        const firstStep = gpu.model.forward([tokens[0]], 1, p.length, c.layers).slice();
        tokens.push(argmax(firstStep));
        for (let step = 1; step < steps; step++) {
          tokens.push(argmax(gpu.model.forward([tokens.at(-1)!], 1, p.length + step, c.layers)));
        }
        return { tokens, firstStep };
      });
      // All together: the same prompts, then steps of one row per sequence.
      const caches = prompts.map(() => cache());
      const together = prompts.map((p, i) => [argmax(gpu.model.forward(p, p.length, 0, caches[i].layers))]);
      let firstError = 0;
      for (let step = 0; step < steps; step++) {
        gpu.model.forwardBatch({ tokens: together.map((t) => t.at(-1)!), logitRows: n,
          segments: prompts.map((p, i) => ({ rows: 1, position: p.length + step, cache: caches[i].layers })) },
        (first, rows, logits) => {
          for (let r = 0; r < rows; r++) {
            const row = logits.subarray(r * vocab, (r + 1) * vocab);
            if (step === 0) firstError = Math.max(firstError, maxError(row, alone[first + r].firstStep));
            together[first + r].push(argmax(row));
          }
        });
      }
      const same = together.filter((t, i) => t.join() === alone[i].tokens.join()).length;
      console.log(`cuda batch of ${n} (${label}): first step's logits error ${firstError.toExponential(2)}, ` +
        `${same}/${n} sequences' tokens equal alone`);
      expect(firstError).toBeLessThan(TOL_LOGITS_Q);
      expect(together).toEqual(alone.map((a) => a.tokens));
      gpu.close();
    }, 120_000);
  }

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
