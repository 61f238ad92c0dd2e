// The CUDA backend against the CPU backend on the same GGUF files (issue 7's first check): a prompt,
// then `--tokens` greedy tokens from each backend, each step's logits copied. Reports how many
// greedy tokens agree, where the first difference falls and whether it was a near-tie there (the
// CPU's top-2 gap against the largest logit difference of the two backends at that step), the
// prompt logits' normalised error (largest |difference| / largest |CPU logit|) and the worst such
// error over the steps while the tokens agree. Real models take a text prompt through their own
// tokenizer (and print both continuations); random-weight ones (bench/random-model.ts) a prompt
// of random token ids. One line of JSON a file after the table, then the verdict against the
// stated tolerance (RATIO_MAX below).
//
// The yardstick: how far a model's logits move when only rounding changes. The CPU runs again with
// an f32 KV cache instead of f16: its greedy tokens and logits against the f16 run's are the
// model's own sensitivity, and CUDA's error is reported beside it as a ratio (both the worst step
// while the tokens agree). Without CUDA the script prints the yardstick alone. Any
// two correct implementations that sum in different orders differ by about that much: a model
// whose logits move by 1.0 under that perturbation cannot have greedy tokens that two engines
// agree on, while the default model and the Q4_0 files agree for all 64.
//   bun bench/cuda-vs-cpu.ts [--file a.gguf,b.gguf] [--models qwen3-0.6b,llama-3.1-8b] [--quants Q4_0,Q4_K,Q8_0]
//       [--tokens 64] [--prompt "text"] [--prompt-tokens 16 (random-weight files)] [--threads N]
//       [--matmuls 1,16: also each 2-D weight of layer 0 and the output head, alone, on both backends
//        with the same random activations of 1 and 16 rows (normalised error of the products)]
import { basename } from "node:path";
import { CpuBackend } from "../ts/backend/cpu.ts";
import { CudaBackend } from "../ts/backend/cuda.ts";
import { Engine } from "../ts/engine/engine.ts";
import { openGguf } from "../ts/gguf/reader.ts";
import { cudaStatus } from "../ts/native/cuda.ts";
import { arg, argmax, maxAbsDiff, normalisedError, top2Gap } from "./logits.ts";
import { ensureRandomModel, findShape, type RandomQuant } from "./random-model.ts";

interface Run { tokens: number[]; logits: Float32Array[] } // logits[i]: what token i was chosen from

function greedy(engine: Engine, prompt: number[], steps: number): Run {
  engine.reset();
  let logits = engine.evaluate(prompt);
  const run: Run = { tokens: [], logits: [] };
  for (let i = 0; i < steps; i++) {
    run.logits.push(logits.slice());
    const t = argmax(logits);
    run.tokens.push(t);
    if (i + 1 < steps) logits = engine.evaluate([t]);
  }
  return run;
}

/** Greedy tokens equal until the first difference (described, with the reference's top-2 gap
 * there), and the worst normalised logits error over the steps before it. */
function agreement(want: Run, got: Run): { same: number; first: string; worst: number } {
  let same = 0, worst = 0, first = "none";
  for (let i = 0; i < want.tokens.length; i++) {
    worst = Math.max(worst, normalisedError(got.logits[i], want.logits[i]));
    if (got.tokens[i] !== want.tokens[i]) {
      const gap = top2Gap(want.logits[i]), diff = maxAbsDiff(got.logits[i], want.logits[i]);
      first = `token ${i}: CPU top-2 gap ${gap.toExponential(2)}, largest logit difference ${diff.toExponential(2)}`;
      break;
    }
    same++;
  }
  return { same, first, worst };
}

const steps = Number(arg("--tokens", "64"));
const threads = process.argv.includes("--threads") ? Number(arg("--threads", "0")) : undefined;
const text = arg("--prompt", "The three primary colours of light are red, green and blue. Mixing them");
const files: { path: string; random: boolean }[] = [];
for (const f of arg("--file", "").split(",").filter(Boolean)) files.push({ path: f, random: false });
const models = arg("--models", "").split(",").filter(Boolean);
for (const m of models) {
  const shape = findShape(m);
  if (!shape) throw new Error(`unknown shape ${m}`);
  for (const q of arg("--quants", "Q4_0,Q4_K,Q8_0").split(",")) {
    files.push({ path: ensureRandomModel(shape, q as RandomQuant), random: true });
  }
}
if (files.length === 0) throw new Error("nothing to compare: give --file or --models");
const status = cudaStatus();
if (!status.available) console.log(`CUDA unavailable (${status.reason}): the CPU's yardstick alone`);

/** Each weight of layer 0 and the head, alone: CUDA's product against the CPU's, same activations. */
function matmuls(path: string, counts: number[]): void {
  const file = openGguf(path);
  const cpu = new CpuBackend(), gpu = CudaBackend.open({});
  let seed = 7;
  const random = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32) * 2 - 1;
  for (const t of file.tensors.values()) {
    if (t.dims.length !== 2 || !(t.name.startsWith("blk.0.") || t.name === "output.weight")) continue;
    const [nIn, nOut] = t.dims;
    const wc = cpu.weight(file, t), wg = gpu.weight(file, t);
    const errs = counts.map((rows) => {
      const x = Float32Array.from({ length: rows * nIn }, random);
      const xc = cpu.activation("x", rows, nIn), xg = gpu.activation("x", rows, nIn);
      cpu.read(xc, rows).set(x);
      gpu.write(xg, x);
      const oc = cpu.activation("o", rows, nOut), og = gpu.activation("o", rows, nOut);
      cpu.matmul(wc, xc, rows, oc);
      gpu.matmul(wg, xg, rows, og);
      return `${rows} rows ${normalisedError(gpu.read(og, rows).slice(), cpu.read(oc, rows).slice()).toExponential(2)}`;
    });
    console.log(`matmul ${t.name} ${t.type.name} ${nIn} x ${nOut}: ${errs.join(", ")}`);
  }
  gpu.dispose();
  file.close();
}

const matmulRows = arg("--matmuls", "").split(",").filter(Boolean).map(Number);
if (matmulRows.length && status.available) for (const { path } of files) matmuls(path, matmulRows);

const rows: Record<string, unknown>[] = [];
for (const { path, random } of files) {
  const open = (backend: "cpu" | "cuda", kvType: "f16" | "f32" = "f16") => Engine.open({
    modelPath: path, backend, contextLength: 1024, batch: 64, kvType, threads: backend === "cpu" ? threads : undefined,
  });
  const cpu = open("cpu");
  const promptTokens = Number(arg("--prompt-tokens", "16"));
  let seed = 12345;
  const nextRandom = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32;
  const vocab = cpu.model.info.vocabSize;
  const prompt = random
    ? Array.from({ length: promptTokens }, () => 6 + Math.floor(nextRandom() * (vocab - 6)))
    : cpu.tokenizer.encode(text, { addSpecial: true, parseSpecial: true });
  let t0 = performance.now();
  const want = greedy(cpu, prompt, steps);
  const cpuMs = performance.now() - t0;
  const wantText = random ? "" : cpu.tokenizer.decode(want.tokens);
  cpu.close();
  const cpu32 = open("cpu", "f32");
  const yard = agreement(want, greedy(cpu32, prompt, steps));
  cpu32.close();
  let got: Run | null = null, cudaMs = NaN, gotText = "";
  if (status.available) {
    const gpu = open("cuda");
    t0 = performance.now();
    got = greedy(gpu, prompt, steps);
    cudaMs = performance.now() - t0;
    gotText = random ? "" : gpu.tokenizer.decode(got.tokens);
    gpu.close();
  }
  const cuda = got ? agreement(want, got) : { same: NaN, first: "-", worst: NaN };
  const row = {
    file: basename(path), prompt: prompt.length, equal: got ? `${cuda.same}/${steps}` : "-", first: cuda.first,
    promptError: got ? +normalisedError(got.logits[0], want.logits[0]).toExponential(2) : NaN,
    worstStepError: +cuda.worst.toExponential(2),
    cpuF32KvEqual: `${yard.same}/${steps}`, cpuF32KvError: +yard.worst.toExponential(2),
    ratio: +(cuda.worst / yard.worst).toFixed(2), cpuMs: Math.round(cpuMs), cudaMs: Math.round(cudaMs),
  };
  rows.push(row);
  if (!random) {
    console.log(`${row.file} CPU:  ${JSON.stringify(wantText)}`);
    if (got) console.log(`${row.file} CUDA: ${JSON.stringify(gotText)}`);
  }
}
console.log(`\n| file | prompt tokens | CUDA: greedy tokens equal | first difference | prompt logits error | worst step error | ` +
  `CPU f32 KV: greedy tokens equal | worst step error | ratio |`);
console.log(`| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |`);
for (const r of rows) {
  console.log(`| ${r.file} | ${r.prompt} | ${r.equal} | ${r.first} | ${r.promptError} | ${r.worstStepError} | ` +
    `${r.cpuF32KvEqual} | ${r.cpuF32KvError} | ${r.ratio} |`);
}
for (const r of rows) console.log(JSON.stringify(r));
// The stated tolerance (issue 7): CUDA's worst step error within RATIO_MAX times the CPU's own
// f16-vs-f32-KV difference on the same file.
const RATIO_MAX = 1.5;
if (status.available) {
  const over = rows.filter((r) => !((r.ratio as number) <= RATIO_MAX));
  console.log(over.length === 0
    ? `verdict: every file within ${RATIO_MAX}x the CPU's own rounding sensitivity`
    : `verdict: ${over.map((r) => r.file).join(", ")} beyond ${RATIO_MAX}x the CPU's own rounding sensitivity`);
}
