// Method: the multi-sequence forward pass (rows of several sequences in one batch, each with its
// own KV cache) and KV-block copies on the CUDA backend, against the CPU backend running each
// sequence alone, on a tiny random float Gemma 3 whose output depends on its context: logits
// within the float-model tolerance of test/cuda.test.ts, a copied cache continuing exactly as its
// source does, and the batch scheduler serving requests to the end; 64 sequences decoded
// together against each decoded alone on the GPU (random-weight quantized and F16 models), and
// attendRows over 64 caches against each sequence's attention alone and the CPU's. Skipped
// without a GPU.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CpuBackend } from "../ts/backend/cpu.ts";
import { CudaBackend } from "../ts/backend/cuda.ts";
import { Engine } from "../ts/engine/engine.ts";
import { createKvCache, type KvCache } from "../ts/engine/kv-cache.ts";
import { BatchScheduler } from "../ts/engine/scheduler.ts";
import type { SequenceRows } from "../ts/model/model.ts";
import { cudaStatus } from "../ts/native/cuda.ts";
import { native } from "../ts/native/lib.ts";
import { argmax } from "../ts/sample/sampler.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import { maxAbsDiff, top2Gap } from "../bench/logits.ts";
import { llamaQ4_0, qwen3KQuants, randomQuantGguf, type RandomQuantSpec } from "./support/random-quant-gguf.ts";
import { normalisedError, randomF32 } from "./support/numeric.ts";
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

  // 64 sequences of 2 to 121 prompt tokens (their attention over different lengths in one
  // launch), 6 steps of one row each, every sequence against itself decoded alone on the same
  // GPU. The prompts run alike both ways (bit for bit); a step of 64 rows takes other kernels than
  // one row: its matmuls the tensor-core tiles (lib/cuda/ops.zig batchMma: one 64-token tile)
  // where one row takes matvecs, its norms 256
  // threads where one row's take 1,024, its RoPE and store rope2 + kv_store_rows where one row's
  // are the fused norm_rope_store. Another summation order, so not the same bits:
  // - Quantized models quantize every matmul's input to 8 bits, and a last-bit difference that
  //   moves a value across a rounding boundary moves it by a whole step, which the layers grow.
  //   Measured on the CPU by bench/batch-step-sensitivity.ts (the prompts alike, the steps by the
  //   model with every F32 vector moved one ulp): the first step's logits of most sequences within
  //   3e-7, of one in 4 to 9 up to 1.5e-2 (Llama Q4_0) and 3.5e-2 (Qwen 3 K-quants), 60 and 62
  //   of 64 sequences' tokens equal; the GPU gave 1.6e-2 and 3.3e-2, 63 of 64. So quantized
  //   models take test/cuda.test.ts's model tolerance, and a greedy token may differ only at a
  //   near-tie, as there.
  // - Float models round nothing to 8 bits: the same measure gives 1.6e-4 at most, every token
  //   equal, so their tolerance is 1e-3, under which a row attending to the wrong cache,
  //   position or keys fails.
  const TOL_LOGITS_Q = 1e-1; // test/cuda.test.ts's, for quantized models
  const TOL_LOGITS_SAME_F = 1e-3;
  const NEAR_TIE = 4; // as test/cuda.test.ts: a top-2 gap within this many times the logits' difference
  const F16 = (t = GgmlType.F16) => ({ embed: t, attn: t, attnOut: t, ffn: t, ffnDown: t, output: t });
  const batchSpecs: [string, RandomQuantSpec, number][] = [
    ["Q4_0, Q6_K head", llamaQ4_0, TOL_LOGITS_Q],
    ["Q4_K, Q5_K, Q6_K", qwen3KQuants, TOL_LOGITS_Q],
    // The same shapes in F16: head_dim 64 GQA 4:1, head_dim 128 GQA 2:1 with the QK-norm
    ["F16, head_dim 64, GQA 4:1", { ...llamaQ4_0, types: F16(), seed: 21 }, TOL_LOGITS_SAME_F],
    ["F16, head_dim 128, GQA 2:1, QK-norm", { ...qwen3KQuants, types: F16(), seed: 23 }, TOL_LOGITS_SAME_F],
  ];
  for (const [label, spec, tolerance] of batchSpecs) {
    test(`64 sequences of mixed lengths decode together as each alone: ${label}`, () => {
      const path = join(dir, `${spec.arch}-${spec.seed}.gguf`);
      writeFileSync(path, randomQuantGguf(spec));
      // batch 128: a prompt goes through model.forward in one pass (the decode steps have 64 rows)
      const gpu = Engine.open({ modelPath: path, contextLength: 160, batch: 128, backend: "cuda" });
      const vocab = gpu.model.info.vocabSize, n = 64, steps = 6;
      const prompts = Array.from({ length: n }, (_, s) =>
        Array.from({ length: 2 + ((s * 37) % 120) }, (_, i) => 6 + ((i * 31 + s * 17) % 240)));
      const cache = () => createKvCache(gpu.backend, gpu.model.info, 160, "f16", gpu.model.maxBatch);
      // Each sequence alone: its prompt, then one token a step; the logits before each token.
      const alone = prompts.map((p) => {
        const c = cache();
        const logits = [gpu.model.forward(p, p.length, 0, c.layers).slice()];
        const tokens = [argmax(logits[0])];
        for (let step = 0; step < steps; step++) {
          logits.push(gpu.model.forward([tokens.at(-1)!], 1, p.length + step, c.layers).slice());
          tokens.push(argmax(logits.at(-1)!));
        }
        return { tokens, logits };
      });
      // All together: the same prompts, then steps of one row per sequence.
      const caches = prompts.map(() => cache());
      const together = prompts.map((p, i) => {
        const logits = [gpu.model.forward(p, p.length, 0, caches[i].layers).slice()];
        return { tokens: [argmax(logits[0])], logits };
      });
      for (let step = 0; step < steps; step++) {
        gpu.model.forwardBatch({ tokens: together.map((t) => t.tokens.at(-1)!), logitRows: n,
          segments: prompts.map((p, i) => ({ rows: 1, position: p.length + step, cache: caches[i].layers })) },
        (first, rows, logits) => {
          for (let r = 0; r < rows; r++) {
            const row = logits.slice(r * vocab, (r + 1) * vocab);
            together[first + r].logits.push(row);
            together[first + r].tokens.push(argmax(row));
          }
        });
      }
      gpu.close();
      // Each sequence's steps while its tokens agree; the first differing token must be a near-tie.
      const promptsDiffer = prompts.filter((_, i) => normalisedError(together[i].logits[0], alone[i].logits[0]) !== 0);
      const firstStep: number[] = [], worstAt = { error: -1, seq: -1, step: -1 }, ties: string[] = [];
      let same = 0, wider = 0;
      for (let i = 0; i < n; i++) {
        const a = alone[i], t = together[i];
        for (let k = 0; k <= steps; k++) {
          if (k > 0) {
            const error = normalisedError(t.logits[k], a.logits[k]);
            if (k === 1) firstStep.push(error);
            if (error > worstAt.error) Object.assign(worstAt, { error, seq: i, step: k - 1 });
          }
          if (t.tokens[k] !== a.tokens[k]) {
            const gap = top2Gap(a.logits[k]), diff = maxAbsDiff(t.logits[k], a.logits[k]);
            ties.push(`seq ${i} (${prompts[i].length} tokens) at token ${k}: top-2 gap ${gap.toExponential(2)}, ` +
              `largest logit difference ${diff.toExponential(2)}`);
            if (gap > NEAR_TIE * diff) wider++;
            break;
          }
          if (k === steps) same++;
        }
      }
      const sorted = [...firstStep].sort((x, y) => x - y);
      console.log(`cuda batch of ${n} (${label}): worst logits error ${worstAt.error.toExponential(2)} at seq ` +
        `${worstAt.seq} (${prompts[worstAt.seq].length} prompt tokens), step ${worstAt.step} (tolerance ` +
        `${tolerance}); first step: median ${sorted[n >> 1].toExponential(2)}, ` +
        `${firstStep.filter((e) => e > 1e-3).length}/${n} over 1e-3; ${same}/${n} sequences' tokens equal alone` +
        (ties.length ? `; differing: ${ties.join("; ")}` : ""));
      expect(promptsDiffer.length).toBe(0); // the prompts ran alike
      expect(worstAt.error).toBeLessThan(tolerance);
      expect(wider).toBe(0);
      if (tolerance === TOL_LOGITS_SAME_F) expect(same).toBe(n);
    }, 120_000);
  }

  // attendRows by itself: 64 rows' keys and values stored into 64 f16 caches (kv_store_rows) and
  // their attention in one launch through the table of caches, against each sequence's storeKv +
  // attention alone on the same GPU and against the CPU. Caches of 2 to 121 keys (the model
  // tests' lengths: one split, attn_decode_w) and of 2 to 700 (eight splits, where attn_decode_mma
  // takes head_dims 64 and 128), under each choice of decode kernels. The stored caches must be
  // the same bytes; the outputs, where both ways take the same kernel and split, the same bits.
  const DECODE_ATTENTION_MODES = [["auto", 0], ["mma", 3], ["warps", 1]] as const;
  const TOL_ATTENTION = 1e-3; // test/cuda.test.ts's, against the CPU
  for (const [heads, kvHeads, headDim] of [[8, 2, 64], [4, 2, 128]] as const) {
    test(`attendRows: 64 f16 caches of 2 to 121 keys and of 2 to 700, head_dim ${headDim}, GQA ${heads / kvHeads}:1`, () => {
      const cpu = new CpuBackend(), gpu = CudaBackend.open({ graphs: false });
      const n = 64, cells = 768, qd = heads * headDim, kvd = kvHeads * headDim;
      const o = { heads, kvHeads, headDim, window: 0, scale: 1 / Math.sqrt(headDim) };
      const both = (rows: number, cols: number, values: Float32Array) => {
        const c = cpu.activation("t", rows, cols), g = gpu.activation("t", rows, cols);
        cpu.read(c, rows).set(values);
        gpu.write(g, values);
        return [c, g] as const;
      };
      for (const [what, lengthOf] of [["2 to 121", (s: number) => 2 + ((s * 37) % 120)],
        ["2 to 700", (s: number) => 2 + ((s * 97) % 699)]] as const) {
        const lengths = Array.from({ length: n }, (_, s) => lengthOf(s));
        // Each sequence's earlier keys, alike into its table cache, its lone cache and the CPU's.
        const table = lengths.map(() => gpu.kvLayer(cells, kvHeads, headDim, "f16", false));
        const lone = lengths.map(() => gpu.kvLayer(cells, kvHeads, headDim, "f16", false));
        const host = lengths.map(() => cpu.kvLayer(cells, kvHeads, headDim, "f16", false));
        lengths.forEach((len, s) => {
          const [kc, kg] = both(len, kvd, randomF32(len * kvd, 1000 + s, 2));
          const [vc, vg] = both(len, kvd, randomF32(len * kvd, 2000 + s, 2));
          const pc = cpu.activation("p", len, 1), pg = gpu.activation("p", len, 1);
          cpu.setPositions(pc, 0, len);
          gpu.setPositions(pg, 0, len);
          cpu.storeKv(host[s], kc, vc, len, 0);
          gpu.storeKv(table[s], kg, vg, len, 0);
          gpu.storeKv(lone[s], kg, vg, len, 0);
        });
        // The new row of each: its query, key and value, at position lengths[s].
        const q = randomF32(n * qd, 3000, 2), k = randomF32(n * kvd, 3001, 2), v = randomF32(n * kvd, 3002, 2);
        const [qc, qg] = both(n, qd, q), [kc, kg] = both(n, kvd, k), [vc, vg] = both(n, kvd, v);
        const pc = cpu.activation("p", n, 1), pg = gpu.activation("p", n, 1);
        lengths.forEach((len, s) => {
          cpu.setPositions(pc, len, 1, s);
          gpu.setPositions(pg, len, 1, s);
        });
        const oc = cpu.activation("o", n, qd);
        lengths.forEach((len, s) => {
          cpu.storeKv(host[s], kc, vc, 1, len, s);
          cpu.attention(qc, host[s], 1, len, o, oc, s);
          gpu.storeKv(lone[s], kg, vg, 1, len, s);
        });
        const want = cpu.read(oc, n).slice();
        for (const [mode, id] of DECODE_ATTENTION_MODES) {
          if (native().infer_cuda_set_decode_attention(id) !== 0) continue;
          try {
            const og = gpu.activation("o", n, qd), ol = gpu.activation("o", n, qd);
            gpu.poison(og);
            gpu.poison(ol);
            // (each mode's attendRows stores the same rows again)
            expect(gpu.attendRows(qg, kg, vg, table, lengths, o, og)).toBe(true);
            lengths.forEach((len, s) => gpu.attention(qg, lone[s], 1, len, o, ol, s));
            const got = gpu.read(og, n).slice(), alone = gpu.read(ol, n).slice();
            const row = (x: Float32Array, s: number) => x.subarray(s * qd, (s + 1) * qd);
            const vsAlone = lengths.map((_, s) => normalisedError(row(got, s), row(alone, s)));
            const vsCpu = lengths.map((_, s) => normalisedError(row(got, s), row(want, s)));
            const worst = (e: number[]) => e.reduce((b, x, s) => (x > e[b] ? s : b), 0);
            const wa = worst(vsAlone), wc = worst(vsCpu);
            console.log(`  attendRows ${what} keys, head_dim ${headDim} (decode kernels: ${mode}): against each alone ` +
              `${vsAlone[wa].toExponential(2)} (seq ${wa}, ${lengths[wa]} keys; ${vsAlone.filter((e) => e !== 0).length}/${n} ` +
              `not the same bits), against the CPU ${vsCpu[wc].toExponential(2)} (seq ${wc}, ${lengths[wc]} keys; ` +
              `tolerance ${TOL_ATTENTION})`);
            expect(vsCpu[wc]).toBeLessThanOrEqual(TOL_ATTENTION);
            expect(vsAlone[wa]).toBeLessThanOrEqual(TOL_ATTENTION);
            // One split both ways (every length under 128 keys): attn_decode_w both ways, the same
            // bits (the tensor-core kernel alone loads its first rows early: the bits are printed).
            if (what === "2 to 121" && mode !== "mma") expect(vsAlone[wa]).toBe(0);
          } finally {
            native().infer_cuda_set_decode_attention(0);
          }
        }
        // The table's caches equal the lone ones byte for byte (kv_store_rows as kv_store).
        const cacheDiffers = lengths.flatMap((len, s) => {
          const a = gpu.readKv(table[s]), b = gpu.readKv(lone[s]);
          return a.k.every((x, j) => x === b.k[j]) && a.v.every((x, j) => x === b.v[j]) ? [] : [`seq ${s} (${len} keys)`];
        });
        if (cacheDiffers.length) console.log(`  attendRows ${what} keys: caches unlike kv_store's: ${cacheDiffers.join(", ")}`);
        expect(cacheDiffers).toEqual([]);
      }
      gpu.dispose();
    }, 60_000);
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
