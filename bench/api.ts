// The library's cost over the engine itself: greedy decode on the default model (or --model),
// timed on the caller's side from the first piece of text to the last, through
//   engine   the batch scheduler stepped in this process, one slot, no thread, no messages
//            (what the CLI ran before it was rebuilt on the library);
//   library  loadModel + model.stream: the engine on its Worker, each piece posted back;
//   cli      `bun infer.ts PROMPT -n GEN --temp 0 --ignore-eos -t N` (the library in a process
//            of its own; its stats line gives the rate, measured in the engine's thread).
// The same model, threads, prompt and tokens for each; each path runs in a process of its own
// (two engines in one process would share its cores: one's idle workers steal from the
// other's), rounds interleave the paths and each cell is the median. Also the time to the
// first piece of a 16-token prompt (a new prompt each time, so no cache holds it) through the
// library and through the engine. Tests never time this.
//   bun bench/api.ts [--runs 5] [--gen 128] [--threads N] [--model PATH]
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { loadModel } from "../ts/api/index.ts";
import { Engine } from "../ts/engine/engine.ts";
import { BatchScheduler } from "../ts/engine/scheduler.ts";
import { defaultModelPath } from "../ts/models/cache.ts";

const argv = process.argv.slice(2);
const opt = (name: string, fallback: string) => {
  const i = argv.indexOf(name);
  return i >= 0 && i + 1 < argv.length ? argv[i + 1] : fallback;
};
const runs = Number(opt("--runs", "5"));
const gen = Number(opt("--gen", "128"));
const threads = Number(opt("--threads", String(availableParallelism())));
const modelPath = opt("--model", defaultModelPath());
if (!(runs >= 1 && gen >= 8 && threads >= 1)) throw new Error("--runs ≥ 1, --gen ≥ 8, --threads ≥ 1");

const prompt = "The history of the city of Paris begins";
const greedy = { temperature: 0, topK: 40, topP: 1, minP: 0, seed: 1 };
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** Decode tok/s from piece timestamps: tokens after the first over the time they took. */
const rateOf = (tokens: number, first: number, last: number) => ((tokens - 1) / (last - first)) * 1000;

/** One round of one path, in this process: the decode rate and the first piece's time. */
async function measure(path: "engine" | "library"): Promise<{ rate: number; ttft: number }> {
  // Sixteen-token prompts, a new one each round, so that no cache holds them.
  const round = Number(opt("--round", "0"));
  const promptOf16 = (vocab: number) =>
    [2, ...Array.from({ length: 15 }, (_, k) => 1000 + ((round * 97 + k * 31) % (vocab - 2000)))];
  if (path === "engine") {
    const engine = Engine.open({ modelPath, threads, contextLength: 1024 });
    const scheduler = new BatchScheduler(engine, { slots: 1, prefixCache: null });
    const run = (p: string | number[], maxTokens: number) => {
      const start = performance.now();
      let first = 0, last = 0, tokens = 0;
      const ids = typeof p === "string"
        ? engine.tokenizer.encode(p, { addSpecial: true, parseSpecial: true }) : p;
      scheduler.submit({
        prompt: ids,
        options: { maxTokens, sampling: greedy, ignoreEos: true, onText: () => {
          last = performance.now();
          if (first === 0) first = last;
        } },
        onDone: (r) => { tokens = r.tokens.length; },
        onError: (e) => { throw e; },
      });
      while (scheduler.busy) scheduler.step();
      return { rate: rateOf(tokens, first, last), ttft: first - start };
    };
    run(prompt, 8); // warm-up: page the weights in, JIT the loops
    const ttft = run(promptOf16(engine.tokenizer.vocabSize), 2).ttft;
    const rate = run(prompt, gen).rate;
    engine.close();
    return { rate, ttft };
  }
  const model = await loadModel(modelPath, { threads, contextLength: 1024, parallel: 1,
    prefixCacheBytes: 0 });
  const run = async (p: string | number[], maxTokens: number) => {
    const start = performance.now();
    let first = 0, last = 0;
    const stream = model.stream(p, { ...greedy, maxTokens, ignoreEos: true });
    for await (const _ of stream) {
      last = performance.now();
      if (first === 0) first = last;
    }
    return { rate: rateOf((await stream.result).tokens.length, first, last), ttft: first - start };
  };
  await run(prompt, 8);
  const ttft = (await run(promptOf16(model.info.vocabSize), 2)).ttft;
  const rate = (await run(prompt, gen)).rate;
  await model.close();
  return { rate, ttft };
}

function child(path: "engine" | "library", round: number): { rate: number; ttft: number } {
  const p = Bun.spawnSync([process.execPath, import.meta.path, "--one", path, "--round", String(round),
    "--gen", String(gen), "--threads", String(threads), "--model", modelPath]);
  if (p.exitCode !== 0) throw new Error(`${path} failed: ${p.stderr.toString().slice(-300)}`);
  return JSON.parse(p.stdout.toString());
}

function cliRun(): number {
  const p = Bun.spawnSync([process.execPath, join(import.meta.dir, "..", "infer.ts"), prompt,
    "-m", modelPath, "-n", String(gen), "--temp", "0", "--ignore-eos", "-t", String(threads), "-c", "1024"]);
  const m = /generated \d+ tokens, ([\d.]+) tok\/s/.exec(p.stderr.toString());
  if (p.exitCode !== 0 || !m) throw new Error(`infer failed: ${p.stderr.toString().slice(-300)}`);
  return Number(m[1]);
}

const one = opt("--one", "");
if (one === "engine" || one === "library") {
  console.log(JSON.stringify(await measure(one)));
  process.exit(0);
}

const rows = { engine: [] as number[], library: [] as number[], cli: [] as number[] };
const ttft = { engine: [] as number[], library: [] as number[] };
for (let r = 0; r < runs; r++) {
  for (const path of ["engine", "library"] as const) {
    const m = child(path, r);
    rows[path].push(m.rate);
    ttft[path].push(m.ttft);
  }
  rows.cli.push(cliRun());
}

const base = median(rows.engine);
console.log(`model ${modelPath}, ${threads} threads, ${gen} greedy tokens, median of ${runs}\n`);
console.log("| path | decode tok/s | ÷ engine | first piece, 16-token prompt |");
console.log("| --- | ---: | ---: | ---: |");
for (const k of ["engine", "library", "cli"] as const) {
  const t = k === "cli" ? "—" : `${median(ttft[k]).toFixed(1)} ms`;
  console.log(`| ${k} | ${median(rows[k]).toFixed(1)} | ${(median(rows[k]) / base).toFixed(3)} | ${t} |`);
}
