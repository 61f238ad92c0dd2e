// End-to-end generation through infer's CLI against node-llama-cpp (what a TypeScript user would
// pick), each a whole process from spawn to exit: start, load the model, tokenize the prompt text,
// 128 greedy tokens streamed to stdout as text. Where `bun run bench` times each engine's phases
// with a warm-up first, this is what a user waits for: one cold command, as typed.
//   bun bench/cli-e2e.ts [--models gemma,qwen3-0.6b,llama-3.2-1b] [--quants Q4_0] [--runs 3]
//                        [--threads N] [--gen 128] [--when-fast GB/s [--fast-wait 60]]
// infer: `bun infer.ts PROMPT -m M -n GEN --temp 0 --ignore-eos -t N -c 2048` (its stats line on
// stderr gives the decode rate); node-llama-cpp: bench/run-node-llama-cpp.mjs --mode text, the
// same prompt, context and threads. Rounds interleave the two (infer → node-llama-cpp); each cell
// the median. The memory bandwidth is probed (~0.5 s) before each run and printed; --when-fast
// starts every run once a probe reads that much (as `bun run bench --when-fast`). "same text":
// whether the two printed the same continuation (greedy on the same file; on Gemma 3 they may
// part, since llama.cpp runs a prompt through batched kernels that round differently from its
// single-token ones, which infer reproduces: docs/correctness.md, "Same answers as llama.cpp").
// Tests never time this.
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { defaultModelPath } from "../ts/models/cache.ts";
import { measureBandwidth } from "./bandwidth.ts";
import { findPeers } from "./peers.ts";
import { ensureRandomModel, randomQuants, randomShapes, type RandomQuant } from "./random-model.ts";

const argv = process.argv.slice(2);
function opt(name: string, fallback: string): string {
  const i = argv.indexOf(name);
  return i >= 0 && i + 1 < argv.length ? argv[i + 1] : fallback;
}
const models = opt("--models", "gemma,qwen3-0.6b,llama-3.2-1b").split(",");
const quants = opt("--quants", "Q4_0").split(",") as RandomQuant[];
const runs = Number(opt("--runs", "3"));
const threads = Number(opt("--threads", String(availableParallelism())));
const gen = Number(opt("--gen", "128"));
const whenFast = argv.includes("--when-fast") ? Number(opt("--when-fast", "45")) : null;
const fastWait = Number(opt("--fast-wait", "60"));
for (const q of quants) if (!randomQuants.includes(q)) throw new Error(`--quants: ${q} is not one of ${randomQuants.join(", ")}`);
if (!(runs >= 1) || !(threads >= 1) || !(gen >= 2)) throw new Error("--runs, --threads must be ≥ 1 and --gen ≥ 2");

const peers = findPeers();
if (!peers.nodeLlamaCpp) {
  throw new Error(`node-llama-cpp is not in ${peers.dir}; build the peers first: bash ../shared/tools/build-peer-llama.sh`);
}
const prompt = "The history of the printing press begins";
const root = join(import.meta.dir, "..");
const log = (s: string) => process.stderr.write(`[e2e ${new Date().toISOString().slice(11, 19)}] ${s}\n`);

interface Run { wallMs: number; decodeTps: number; text: string; gbs: number }

function probe(): number {
  const t0 = performance.now();
  let gbs = measureBandwidth(threads, 256, 4).bestGBs;
  while (whenFast !== null && gbs < whenFast && performance.now() - t0 < fastWait * 1000) {
    Bun.sleepSync(1500);
    gbs = measureBandwidth(threads, 256, 4).bestGBs;
  }
  return gbs;
}

function timed(cmd: string[]): { wallMs: number; stdout: string; stderr: string } {
  const t0 = performance.now();
  const p = Bun.spawnSync(cmd, { stdout: "pipe", stderr: "pipe", stdin: "ignore", timeout: 300_000 });
  const wallMs = performance.now() - t0;
  if (p.exitCode !== 0) throw new Error(`${cmd.slice(0, 3).join(" ")} failed (${p.exitCode}): ${p.stderr.toString().trim().split("\n").at(-1)}`);
  return { wallMs, stdout: p.stdout.toString(), stderr: p.stderr.toString() };
}

function runInferCli(model: string): Run {
  const gbs = probe();
  const p = timed([process.execPath, join(root, "infer.ts"), prompt, "-m", model, "-n", String(gen), "--temp", "0",
    "--ignore-eos", "-t", String(threads), "-c", "2048"]);
  const m = /generated (\d+) tokens, ([\d.]+) tok\/s/.exec(p.stderr);
  if (!m || Number(m[1]) !== gen) throw new Error(`infer's stats line is missing or short: ${p.stderr.trim()}`);
  return { wallMs: p.wallMs, decodeTps: Number(m[2]), text: p.stdout.trim(), gbs };
}

function runNode(model: string): Run {
  const gbs = probe();
  const p = timed(["node", join(import.meta.dir, "run-node-llama-cpp.mjs"), "--peers", peers.dir, "--model", model,
    "--mode", "text", "--text", prompt, "--gen", String(gen), "--threads", String(threads), "--ctx", "2048"]);
  const lines = p.stdout.trimEnd().split("\n");
  const r = JSON.parse(lines.at(-1)!) as { tokensPerSec?: number; error?: string };
  if (r.error || r.tokensPerSec === undefined) throw new Error(`node-llama-cpp: ${r.error ?? "no result"}`);
  return { wallMs: p.wallMs, decodeTps: r.tokensPerSec, text: lines.slice(0, -1).join("\n").trim(), gbs };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const targets: { label: string; quant: string; path: string }[] = [];
for (const key of models) {
  if (key === "gemma") targets.push({ label: "Gemma 3 270M", quant: "Q4_K_M", path: defaultModelPath() });
  else {
    const shape = randomShapes.find((s) => s.key === key);
    if (!shape) throw new Error(`--models: unknown ${key} (gemma, ${randomShapes.map((s) => s.key).join(", ")})`);
    for (const q of quants) targets.push({ label: shape.label, quant: q, path: ensureRandomModel(shape, q) });
  }
}

const rows: string[] = [];
const detail: string[] = [];
for (const t of targets) {
  const inf: Run[] = [], node: Run[] = [];
  runInferCli(t.path); // one unrecorded round: the file in the page cache for both
  runNode(t.path);
  for (let r = 0; r < runs; r++) {
    inf.push(runInferCli(t.path));
    node.push(runNode(t.path));
    log(`${t.label} ${t.quant} round ${r + 1}: infer ${inf[r].wallMs.toFixed(0)} ms (${inf[r].decodeTps} t/s @ ${inf[r].gbs.toFixed(0)} GB/s), ` +
      `node-llama-cpp ${node[r].wallMs.toFixed(0)} ms (${node[r].decodeTps.toFixed(1)} t/s @ ${node[r].gbs.toFixed(0)} GB/s)`);
  }
  const iw = median(inf.map((x) => x.wallMs)), nw = median(node.map((x) => x.wallMs));
  const id = median(inf.map((x) => x.decodeTps)), nd = median(node.map((x) => x.decodeTps));
  const same = inf[0].text === node[0].text ? "yes" : "no";
  rows.push(`| ${t.label} | ${t.quant} | ${(iw / 1000).toFixed(2)} | ${(nw / 1000).toFixed(2)} | ${(nw / iw).toFixed(2)}× | ` +
    `${id.toFixed(1)} | ${nd.toFixed(1)} | ${(id / nd).toFixed(2)}× | ${same} |`);
  detail.push(`| ${t.label} | ${t.quant} | ${inf.map((x) => `${(x.wallMs / 1000).toFixed(2)} s @ ${x.gbs.toFixed(0)}`).join(", ")} | ` +
    `${node.map((x) => `${(x.wallMs / 1000).toFixed(2)} s @ ${x.gbs.toFixed(0)}`).join(", ")} |`);
}

console.log(`Date: ${new Date().toISOString().slice(0, 16).replace("T", " ")} UTC · threads: ${threads} · ` +
  `command: bun bench/cli-e2e.ts ${argv.join(" ")}`);
console.log(`Each run a whole process: "${prompt}" → ${gen} greedy tokens as text; ${runs} interleaved rounds after one unrecorded; medians.\n`);
console.log("| model | quant | infer CLI wall s | node-llama-cpp wall s | speed, infer ÷ node-llama-cpp | infer decode t/s | node-llama-cpp decode t/s | decode ratio | same text |");
console.log("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
for (const r of rows) console.log(r);
console.log("\nEach run's wall time and the memory bandwidth (GB/s) probed just before it:\n");
console.log("| model | quant | infer CLI | node-llama-cpp |");
console.log("| --- | --- | --- | --- |");
for (const r of detail) console.log(r);
