// qwen3moe on the CPU beside llama.cpp's llama-bench: a random-weight GGUF with Qwen3-30B-A3B's
// layer shape (embedding 2048, 32 query / 4 key heads of 128, 128 experts of width 768, 8 chosen;
// Q4_0 everywhere, the router F32 as in the real files) but fewer layers (--layers, default 2) and
// the toy vocabulary of test/support/random-quant-gguf.ts, so that it builds in a minute and fits
// the page cache. Prints prefill and decode tokens/s (medians of --runs), the ratio, and the bytes
// a token reads (from the shapes) against the layer's parameters.
//   bun bench/moe.ts [--layers 2] [--threads 2] [--prompt 128] [--gen 32] [--runs 3] [--no-llama]
// The file lands in $INFER_CACHE/bench-models (built once, reused). llama-bench is looked for in
// $INFER_PEERS/llama.cpp/build/bin, then ~/.cache/infer-peers-embed/llama.cpp/build/bin; it runs
// with -mmp 0 (weights read into memory, as infer's repacked copy is): with mmap its decode
// swings from 3 to 200 t/s on this shared machine as other processes evict its pages.
import { existsSync, mkdirSync, renameSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { setting } from "../ts/config/env.ts";
import { Engine } from "../ts/engine/engine.ts";
import { GgmlType, ggmlTypes } from "../ts/gguf/types.ts";
import { cacheDir } from "../ts/models/cache.ts";
import { Sampler } from "../ts/sample/sampler.ts";
import { randomQuantGguf, type RandomQuantSpec } from "../test/support/random-quant-gguf.ts";
import { toyVocabulary } from "../test/support/tiny-gguf.ts";

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

const layers = Number(arg("--layers", "2"));
const threads = Number(arg("--threads", "2"));
const prompt = Number(arg("--prompt", "128"));
const gen = Number(arg("--gen", "32"));
const runs = Number(arg("--runs", "3"));

const spec: RandomQuantSpec = {
  arch: "qwen3moe", layers, embedding: 2048, feedForward: 6144, heads: 32, kvHeads: 4, headDim: 128,
  moe: { experts: 128, used: 8, feedForward: 768 },
  types: { embed: GgmlType.Q4_0, attn: GgmlType.Q4_0, attnOut: GgmlType.Q4_0, ffn: GgmlType.Q4_0,
    ffnDown: GgmlType.Q4_0, output: GgmlType.Q4_0 },
  seed: 17,
};

function modelFile(): string {
  const dir = join(cacheDir(), "bench-models");
  const path = join(dir, `qwen3moe-30b-a3b-shape-${layers}l-q4_0.gguf`);
  if (existsSync(path)) return path;
  mkdirSync(dir, { recursive: true });
  console.error(`writing ${path} ...`);
  writeFileSync(`${path}.tmp`, randomQuantGguf(spec));
  renameSync(`${path}.tmp`, path);
  return path;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

interface Speeds { prefill: number[]; decode: number[] }

/** Tokens/s of infer: prefill of `prompt` tokens from position 0, and `gen` greedy single steps. */
function measureInfer(path: string): Speeds {
  const engine = Engine.open({ modelPath: path, threads, contextLength: 1024 });
  const vocab = toyVocabulary().tokens.length;
  const tokens = Array.from({ length: prompt }, (_, i) => 6 + ((i * 37) % (vocab - 6)));
  const sampler = new Sampler({ temperature: 0, topK: 1, topP: 1, minP: 0, seed: 0 });
  const speeds: Speeds = { prefill: [], decode: [] };
  engine.evaluate(tokens); // warm-up: pages, repacked copies, caches
  for (let r = 0; r < runs; r++) {
    engine.reset();
    const t0 = performance.now();
    let token = sampler.sample(engine.evaluate(tokens));
    speeds.prefill.push(prompt / ((performance.now() - t0) / 1000));
    const t1 = performance.now();
    for (let j = 0; j < gen; j++) token = sampler.sample(engine.evaluate([token]));
    speeds.decode.push(gen / ((performance.now() - t1) / 1000));
  }
  engine.close();
  return speeds;
}

function llamaBench(): string | null {
  for (const dir of [setting("INFER_PEERS"), join(homedir(), ".cache", "infer-peers-embed")]) {
    const exe = join(dir, "llama.cpp", "build", "bin", "llama-bench");
    if (existsSync(exe)) return exe;
  }
  return null;
}

/** llama-bench's per-repetition tokens/s (samples_ts) for one test. */
function measureLlama(exe: string, path: string, test: string[]): number[] {
  const p = Bun.spawnSync([exe, "-m", path, "-t", String(threads), "-mmp", "0", "-r", String(runs), "-o", "json",
    ...test], { stdout: "pipe", stderr: "pipe" });
  if (p.exitCode !== 0) throw new Error(`llama-bench: ${p.stderr.toString().trim().split("\n").pop()}`);
  const rows = JSON.parse(p.stdout.toString()) as { samples_ts: number[] }[];
  return rows[0].samples_ts;
}

const path = modelFile();
const exe = process.argv.includes("--no-llama") ? null : llamaBench();
const infer = measureInfer(path);
const llama = exe
  ? { prefill: measureLlama(exe, path, ["-p", String(prompt), "-n", "0"]),
    decode: measureLlama(exe, path, ["-p", "0", "-n", String(gen)]) }
  : null;

// Bytes a token reads, from the shapes: each layer's attention and router, the chosen experts.
const e = spec.embedding, qd = spec.heads * spec.headDim, kvd = spec.kvHeads * spec.headDim;
const moe = spec.moe!;
const q4 = ggmlTypes.get(GgmlType.Q4_0)!, bitsQ4 = (q4.blockBytes * 8) / q4.blockValues;
const attention = 2 * e * qd + 2 * e * kvd, router = e * moe.experts;
const expert = 3 * e * moe.feedForward;
const activeLayer = attention + router + moe.used * expert, totalLayer = attention + router + moe.experts * expert;
const head = e * toyVocabulary().tokens.length;
const bytesLayer = (attention + moe.used * expert) * bitsQ4 / 8 + router * 4;
const bytesToken = layers * bytesLayer + head * bitsQ4 / 8;

const fmt = (xs: number[]) => `${median(xs).toFixed(1)} (${xs.map((x) => x.toFixed(0)).join(", ")})`;
console.log(`qwen3moe, Qwen3-30B-A3B layer shape, ${layers} layers, Q4_0, ${threads} threads, ` +
  `prompt ${prompt}, decode ${gen}, ${runs} runs (median (each))`);
console.log(`| | prefill ${prompt} (t/s) | decode ${gen} (t/s) |`);
console.log("| --- | --- | --- |");
console.log(`| infer | ${fmt(infer.prefill)} | ${fmt(infer.decode)} |`);
if (llama) {
  console.log(`| llama-bench -mmp 0 | ${fmt(llama.prefill)} | ${fmt(llama.decode)} |`);
  console.log(`| infer / llama.cpp | ${(median(infer.prefill) / median(llama.prefill)).toFixed(2)} | ` +
    `${(median(infer.decode) / median(llama.decode)).toFixed(2)} |`);
} else {
  console.log("(no llama-bench found: infer only)");
}
const m = (x: number) => `${(x / 1e6).toFixed(1)} M`;
console.log(`per layer: ${m(activeLayer)} of ${m(totalLayer)} weights active (attention ${m(attention)}, ` +
  `router ${m(router)}, ${moe.used} experts ${m(moe.used * expert)}); a token reads ` +
  `${(bytesToken / 1e6).toFixed(1)} MB (${layers} layers + LM head), i.e. ` +
  `${(bytesToken * median(infer.decode) / 1e9).toFixed(2)} GB/s at infer's decode median`);
