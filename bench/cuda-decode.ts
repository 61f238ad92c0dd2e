// The CUDA backend on random-weight GGUFs with real shapes (bench/random-model.ts): batch-1 decode
// after a 16-token prompt (tokens/s, median of runs) as Engine.generate runs greedy decoding (the
// argmax on the device, a step queued ahead of the host) and as a host loop (evaluate, then the
// argmax of the logits in JS: what decode cost before); the GPU time of one decode step (its
// graph replayed back to back); a 512-token prefill; optionally the decode step's fusions off
// (INFER_CUDA_FUSE=0) and CUDA graphs off (--variants 1), and a check against the CPU backend
// (greedy tokens and prompt logits); with --depth N, greedy decode after an N-token prompt; with
// --batches 8,32, the server's batched decode: B sequences (16-token prompts, a KV cache each)
// stepped together through Model.forwardBatch, one row each, the next tokens picked from the
// logits (aggregate tokens/s over `gen` steps, as llama-batched-bench's S_TG). Prints a table,
// then one JSON line per model.
//   bun bench/cuda-decode.ts [--models qwen3-0.6b,llama-3.2-1b] [--quants Q4_0,Q8_0,Q4_K]
//       (--models qwen3-4b,llama-3.1-8b: the large shapes of bench/random-model.ts)
//       [--runs 3] [--gen 128] [--prefill 512] [--prefill-batch N (default: the prefill or the largest batch)]
//       [--check 32] [--ctx 2048] [--variants 0]
//       [--depth 4096 (needs --ctx past depth + gen)] [--batches 8,32]
//       [--batch-mma 0,2: the batches under each INFER_CUDA_BATCH_MMA, interleaved; GPU µs of each step]
//       [--moe-grouped mma,matvec: the prefill and the batches under each grouped expert kernel
//        (ts/backend/cuda-moe.ts groupKernel), prefill runs interleaved; the last one is the row's]
//       [--sweep 24,144,1024,4096: GPU µs of a decode step at each context (needs --ctx past the last)]
//       [--file a.gguf,b.gguf: these files instead of the random-weight shapes]
//       [--gpus N: split each model over N GPUs (tensor parallelism; bench/tensor-parallel.sh)]
import { statSync } from "node:fs";
import { basename } from "node:path";
import { CudaBackend } from "../ts/backend/cuda.ts";
import { setting, withSettings } from "../ts/config/env.ts";
import { Engine } from "../ts/engine/engine.ts";
import { createKvCache } from "../ts/engine/kv-cache.ts";
import { argmax as argmaxNative } from "../ts/sample/sampler.ts";
import { cudaDeviceInfo, cudaInit } from "../ts/native/cuda.ts";
import { arg, argmax } from "./logits.ts";
import { replayUs } from "./cuda-replay.ts";
import { ensureRandomModel, findShape, randomQuants, randomShapes, type RandomQuant } from "./random-model.ts";

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

/** Greedy decode of `gen` tokens after `prompt`: tokens/s of the decode steps and the tokens. */
function decode(engine: Engine, prompt: number[], gen: number): { rate: number; tokens: number[]; first: Float32Array } {
  engine.reset();
  let logits = engine.evaluate(prompt);
  const first = logits.slice();
  const tokens: number[] = [];
  const t0 = performance.now();
  for (let i = 0; i < gen; i++) {
    const t = argmax(logits);
    tokens.push(t);
    logits = engine.evaluate([t]);
  }
  return { rate: gen / ((performance.now() - t0) / 1000), tokens, first };
}

/** The same greedy decode through Engine.generate (device argmax when the backend has one). */
function generate(engine: Engine, prompt: number[], gen: number): { rate: number; tokens: number[] } {
  const sampling = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 };
  const r = engine.generate(prompt, { maxTokens: gen, sampling, ignoreEos: true, reuseCache: false });
  return { rate: r.tokens.length / (r.generateMs / 1000), tokens: r.tokens };
}

/**
 * Aggregate tokens/s of `steps` decode steps over `b` sequences at once (after 16-token
 * prompts and two untimed steps): each step one forwardBatch of b rows, each row's next token
 * the argmax of its logits.
 */
function batchedRate(engine: Engine, b: number, steps: number): { rate: number; gpuUs: number } {
  const model = engine.model, vocab = model.info.vocabSize, warm = 2;
  const caches = Array.from({ length: b }, () =>
    createKvCache(engine.backend, model.info, 16 + warm + steps + 1, "f16", model.maxBatch));
  let next = new Array<number>(b).fill(0);
  const pick = (first: number, rows: number, logits: Float32Array) => {
    for (let r = 0; r < rows; r++) next[first + r] = argmaxNative(logits.subarray(r * vocab, (r + 1) * vocab));
  };
  // The prompts one by one (their last rows' logits give the first tokens).
  caches.forEach((c, i) => {
    const prompt = prompt16.map((t, j) => (j === 0 ? 97 + (i % 26) : t));
    model.forwardBatch({ tokens: prompt, segments: [{ rows: 16, position: 0, cache: c.layers }], logitRows: 1 },
      (_first, rows, logits) => { next[i] = argmaxNative(logits.subarray((rows - 1) * vocab, rows * vocab)); });
  });
  let t0 = 0;
  for (let s = 0; s < warm + steps; s++) {
    if (s === warm) t0 = performance.now();
    const tokens = next;
    next = new Array<number>(b).fill(0);
    model.forwardBatch({ tokens, logitRows: b,
      segments: caches.map((c) => ({ rows: 1, position: 16 + s, cache: c.layers })) }, pick);
  }
  const rate = (b * steps) / ((performance.now() - t0) / 1000);
  // The step's graph replayed back to back: its GPU time without the host's part (the logits'
  // copy, the argmax of b rows, recording the step).
  const gpuUs = replayUs(engine, 50);
  return { rate, gpuUs };
}

const withGraphs = <T>(on: boolean, f: () => T): T => withSettings({ INFER_CUDA_GRAPHS: on ? "1" : "0" }, f);

const models = arg("--models", randomShapes.map((s) => s.key).join(",")).split(",");
const quants = arg("--quants", randomQuants.join(",")).split(",") as RandomQuant[];
const runs = Number(arg("--runs", "3")), gen = Number(arg("--gen", "128"));
const prefillLength = Number(arg("--prefill", "512")), check = Number(arg("--check", "0"));
const ctx = Number(arg("--ctx", "2048")), variants = arg("--variants", "0") === "1";
const depth = Number(arg("--depth", "0"));
// GPUs the model is split over (tensor parallelism, ts/engine/gpus.ts); absent: not asked.
const gpus = arg("--gpus", "") === "" ? undefined : Number(arg("--gpus", ""));
const sweep = arg("--sweep", "").split(",").filter((c) => c !== "").map(Number);
const batches = arg("--batches", "").split(",").filter((b) => b !== "").map(Number);
const batchMma = arg("--batch-mma", String(setting("INFER_CUDA_BATCH_MMA"))).split(",").map(Number);
const moeGrouped = arg("--moe-grouped", "mma").split(",") as ("mma" | "matvec")[];
for (const k of moeGrouped) if (k !== "mma" && k !== "matvec") throw new Error(`--moe-grouped: ${k} is not mma or matvec`);
// Rows a forward pass takes (Engine's batch): the whole prefill, or the largest --batches, by
// default; 512 matches llama-bench's default micro-batch.
const prefillBatch = Number(arg("--prefill-batch", String(Math.max(prefillLength, ...batches))));
if (depth > 0 && depth + gen + 16 > ctx) throw new Error(`--depth ${depth} needs --ctx of at least ${depth + gen + 16}`);

cudaInit();
const info = cudaDeviceInfo();
console.log(`# ${new Date().toISOString()} ${info.name} (sm_${info.computeCapability}, ${info.multiprocessors} SMs, ` +
  `driver ${info.driverVersion}); PDL ${setting("INFER_CUDA_PDL") ? "on" : "off"}; runs ${runs}, gen ${gen}, prompt 16, prefill ${prefillLength} ` +
  `(batches of ${prefillBatch}), ctx ${ctx}`);
// Byte-level tokens: ids 97.. are the ASCII letters of the synthetic vocabulary.
const prompt16 = Array.from({ length: 16 }, (_, i) => 97 + (i % 26));
const promptLong = Array.from({ length: prefillLength }, (_, i) => 97 + ((i * 7) % 26));
const rows: string[] = [];
// --file: GGUF files of one's own (a real model) in place of the random-weight shapes.
const targets: { label: string; quant: string; path: string }[] = [];
const files = arg("--file", "").split(",").filter((f) => f !== "");
for (const f of files) targets.push({ label: basename(f).replace(/\.gguf$/, ""), quant: "file", path: f });
for (const key of files.length ? [] : models) {
  const shape = findShape(key);
  if (!shape) throw new Error(`unknown model ${key}`);
  for (const quant of quants) targets.push({ label: shape.label, quant, path: ensureRandomModel(shape, quant) });
}
for (const { label, quant, path } of targets) {
  const bytes = statSync(path).size;
  const open = () => Engine.open({ modelPath: path, backend: "cuda", contextLength: ctx, batch: prefillBatch,
    gpus });
  const t0 = performance.now();
  const engine = withGraphs(true, open);
  const loadMs = performance.now() - t0;
  decode(engine, prompt16, gen); // warm-up: kernels loaded, graphs captured (one per split)
  generate(engine, prompt16, gen);
  const rates: number[] = [], hostRates: number[] = [];
  let tokens: number[] = [], deviceTokens: number[] = [], first: Float32Array = new Float32Array(0);
  for (let r = 0; r < runs; r++) { // interleaved: device greedy, host loop
    const g = generate(engine, prompt16, gen);
    rates.push(g.rate);
    deviceTokens = g.tokens;
    const d = decode(engine, prompt16, gen);
    hostRates.push(d.rate);
    tokens = d.tokens;
    first = d.first;
  }
  generate(engine, prompt16, gen);
  const lateUs = replayUs(engine, 200); // at the position the runs end at
  generate(engine, prompt16, 8); // the device-greedy step's graph is the last one used
  const stepUs = replayUs(engine, 200);
  const stats = { ...(engine.backend as CudaBackend).stats };
  const experts = (engine.backend as CudaBackend).experts;
  const prefillBy = moeGrouped.map(() => [] as number[]);
  for (const k of moeGrouped) {
    experts.groupKernel = k;
    engine.reset();
    engine.evaluate(promptLong); // warm-up
  }
  for (let r = 0; r < runs; r++) { // interleaved over --moe-grouped
    for (const [i, k] of moeGrouped.entries()) {
      experts.groupKernel = k;
      engine.reset();
      const p0 = performance.now();
      engine.evaluate(promptLong);
      prefillBy[i].push(prefillLength / ((performance.now() - p0) / 1000));
    }
  }
  const prefill = prefillBy.at(-1)!;
  let depthRate = NaN;
  if (depth > 0) {
    const promptDepth = Array.from({ length: depth }, (_, i) => 97 + ((i * 11) % 26));
    generate(engine, promptDepth, 8); // warm-up at that depth
    depthRate = median(Array.from({ length: runs }, () => generate(engine, promptDepth, gen).rate));
  }
  // GPU µs of one decode step at each context length of --sweep (its graph replayed).
  const sweepUs = sweep.map((c) => {
    generate(engine, Array.from({ length: c - 8 }, (_, i) => 97 + ((i * 13) % 26)), 8);
    return +replayUs(engine, 100).toFixed(1);
  });
  // Each --batch-mma setting (lib/cuda/ops.zig batchMma: 0 matvecs and the prompt tiles) in turn,
  // interleaved over the batch sizes; the last setting stays.
  const batchRuns = batches.map(() => batchMma.map(() => ({ rate: 0, gpuUs: 0 })));
  for (const [bi, b] of batches.entries()) {
    for (const [mi, m] of batchMma.entries()) {
      (engine.backend as CudaBackend).setBatchMma(m);
      batchRuns[bi][mi] = batchedRate(engine, b, gen);
    }
  }
  // The batches under the other grouped expert kernels (at the last --batch-mma), then the last.
  const batchByMoe = batches.map((b) => moeGrouped.map((k, i) => {
    if (i === moeGrouped.length - 1) return batchRuns[batches.indexOf(b)].at(-1)!.rate;
    experts.groupKernel = k;
    const rate = batchedRate(engine, b, gen).rate;
    experts.groupKernel = moeGrouped.at(-1)!;
    return rate;
  }));
  const batchRates = batchRuns.map((r) => r.at(-1)!.rate);
  engine.close();
  let eagerRate = NaN, unfusedRate = NaN;
  if (variants) {
    const eager = withGraphs(false, open);
    generate(eager, prompt16, 8);
    eagerRate = generate(eager, prompt16, gen).rate;
    eager.close();
    const unfused = withSettings({ INFER_CUDA_FUSE: "0" }, () => withGraphs(true, open));
    generate(unfused, prompt16, 8);
    unfusedRate = generate(unfused, prompt16, gen).rate;
    unfused.close();
  }
  const sameDevice = deviceTokens.filter((t, i) => t === tokens[i]).length;
  let agree = "";
  if (check > 0) {
    const cpu = Engine.open({ modelPath: path, backend: "cpu", contextLength: ctx, batch: 64 });
    const want = decode(cpu, prompt16, check);
    cpu.close();
    let maxDiff = 0, maxRef = 0;
    for (let i = 0; i < first.length; i++) {
      maxDiff = Math.max(maxDiff, Math.abs(first[i] - want.first[i]));
      maxRef = Math.max(maxRef, Math.abs(want.first[i]));
    }
    const same = want.tokens.filter((t, i) => t === tokens[i]).length;
    agree = `${same}/${check} greedy tokens equal to the CPU's, prompt logits error ${(maxDiff / maxRef).toExponential(2)}`;
  }
  agree = `device argmax = host argmax ${sameDevice}/${gen}${agree ? "; " : ""}${agree}`;
  const rate = median(rates);
  const row = {
    model: label, quant, fileMiB: Math.round(bytes / 2 ** 20), decodeTokS: +rate.toFixed(1),
    decodeRuns: rates.map((r) => +r.toFixed(1)), hostLoopTokS: +median(hostRates).toFixed(1),
    hostLoopRuns: hostRates.map((r) => +r.toFixed(1)), stepGpuUs: +stepUs.toFixed(1),
    stepGpuUsLate: +lateUs.toFixed(1), decodeNoGraphsTokS: +eagerRate.toFixed(1), decodeUnfusedTokS: +unfusedRate.toFixed(1),
    prefillTokS: +median(prefill).toFixed(0),
    prefillByMoeGrouped: Object.fromEntries(moeGrouped.map((k, i) => [k, +median(prefillBy[i]).toFixed(0)])),
    effectiveGBs: +((bytes * rate) / 1e9).toFixed(0), loadMs: Math.round(loadMs),
    graphs: stats, check: agree, depth, depthTokS: +depthRate.toFixed(1),
    batched: Object.fromEntries(batches.map((b, i) => [b, +batchRates[i].toFixed(0)])),
    batchedByMma: Object.fromEntries(batches.map((b, i) => [b, Object.fromEntries(batchMma.map((m, j) =>
      [m, { tokS: +batchRuns[i][j].rate.toFixed(0), stepGpuUs: +batchRuns[i][j].gpuUs.toFixed(1) }]))])),
    stepUsByContext: Object.fromEntries(sweep.map((c, i) => [c, sweepUs[i]])),
    batchedByMoeGrouped: Object.fromEntries(batches.map((b, i) => [b, Object.fromEntries(moeGrouped.map((k, j) =>
      [k, +batchByMoe[i][j].toFixed(0)]))])),
  };
  rows.push(JSON.stringify(row));
  console.log(`${label.padEnd(20)} ${quant.padEnd(5)} ${String(row.fileMiB).padStart(5)} MiB | decode ` +
    `${rate.toFixed(0).padStart(5)} tok/s (runs ${row.decodeRuns.join(", ")}; host loop ${row.hostLoopTokS}; ` +
    `graph replay ${row.stepGpuUs} us/step at ${16 + 8} tokens, ${row.stepGpuUsLate} at ${16 + gen}; host per greedy step: queue ` +
    `${(stats.greedyQueueMs * 1000 / stats.greedySteps).toFixed(0)} us, wait ` +
    `${(stats.greedyWaitMs * 1000 / stats.greedySteps).toFixed(0)} us; unfused ${unfusedRate.toFixed(0)}, ` +
    `graphs off ${eagerRate.toFixed(0)}) | ${stats.stepOpsFused} launch calls a step | ` +
    `prefill ${prefillLength} ${row.prefillTokS} tok/s` + (moeGrouped.length > 1
      ? ` (${moeGrouped.map((k, i) => `experts ${k} ${median(prefillBy[i]).toFixed(0)}`).join(", ")})` : "") + ` | weights ${row.effectiveGBs} GB/s | ${agree}` +
    (depth > 0 ? ` | decode at depth ${depth} ${row.depthTokS} tok/s` : "") +
    batches.map((b, i) => ` | batch ${b} ` + batchMma.map((m, j) =>
      `${batchRuns[i][j].rate.toFixed(0)} tok/s (${batchRuns[i][j].gpuUs.toFixed(0)} us GPU, mma from ${m})`).join(", ") +
      (moeGrouped.length > 1 ? ` (${moeGrouped.map((k, j) => `experts ${k} ${batchByMoe[i][j].toFixed(0)}`).join(", ")})` : "")).join("") +
    (sweep.length ? ` | step us by context: ${sweep.map((c, i) => `${c}: ${sweepUs[i]}`).join(", ")}` : ""));
}
for (const r of rows) console.log(r);
