// One decode step of the CUDA backend under a profiler: a random-weight model with a real shape
// (bench/random-model.ts), a 16-token prompt, `--warm` decode steps (graphs captured), then
// `--steps` steps between cuProfilerStart and cuProfilerStop (or, with `--prefill N`, one N-token
// prompt from position 0 instead of the steps). Run it under Nsight Compute:
//   ncu --profile-from-start off --clock-control none --graph-profiling node \
//       --metrics gpu__time_duration.sum --csv bun bench/cuda-profile.ts [--model qwen3-0.6b] [--quant Q4_0]
//       [--context 16 (prompt before the steps)] [--ctx 2048 (cache)] [--batch 512]
//       [--sequences B (batched decode steps of B sequences)] [--steps 1] [--warm 4] [--prefill N]
import { Engine } from "../ts/engine/engine.ts";
import { createKvCache } from "../ts/engine/kv-cache.ts";
import { check, native } from "../ts/native/lib.ts";
import { ensureRandomModel, findShape, type RandomQuant } from "./random-model.ts";

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

const shape = findShape(arg("--model", "qwen3-0.6b")); // the large shapes too (llama-3.1-8b, ...)
if (!shape) throw new Error("unknown model");
const path = ensureRandomModel(shape, arg("--quant", "Q4_0") as RandomQuant);
const engine = Engine.open({ modelPath: path, backend: "cuda", contextLength: Number(arg("--ctx", "2048")),
  batch: Number(arg("--batch", "512")) });
const argmax = (x: Float32Array) => {
  let b = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[b]) b = i;
  return b;
};
// --context N: the decode steps after an N-token prompt (attention over N keys).
const context = Number(arg("--context", "16"));
let logits = engine.evaluate(Array.from({ length: context }, (_, i) => 97 + (i % 26)));
for (let i = 0; i < Number(arg("--warm", "4")); i++) logits = engine.evaluate([argmax(logits)]);
const steps = Number(arg("--steps", "1"));
const prefill = Number(arg("--prefill", "0"));
// --sequences B: the steps are the server's batched decode, B sequences one row each (their own
// caches, 16-token prompts) through Model.forwardBatch, the logits of every row read back.
const sequences = Number(arg("--sequences", "0"));
const model = engine.model;
const caches = Array.from({ length: sequences }, () => createKvCache(engine.backend, model.info, 64, "f16", model.maxBatch));
caches.forEach((c) => model.forwardBatch({ tokens: Array.from({ length: 16 }, (_, i) => 97 + i), logitRows: 1,
  segments: [{ rows: 16, position: 0, cache: c.layers }] }, () => {}));
const batchStep = (s: number) => model.forwardBatch({ tokens: caches.map((_, i) => 97 + i), logitRows: sequences,
  segments: caches.map((c) => ({ rows: 1, position: 16 + s, cache: c.layers })) }, () => {});
for (let s = 0; s < (sequences > 0 ? 2 : 0); s++) batchStep(s);
if (prefill > 0) engine.reset();
check(native().infer_cuda_profiler(true), "profiler start");
if (prefill > 0) engine.evaluate(Array.from({ length: prefill }, (_, i) => 97 + (i % 500)));
else if (sequences > 0) for (let i = 0; i < steps; i++) batchStep(2 + i);
else for (let i = 0; i < steps; i++) logits = engine.evaluate([argmax(logits)]);
check(native().infer_cuda_profiler(false), "profiler stop");
engine.close();
console.log(`profiled ${steps} decode step(s) of ${shape.label}`);
