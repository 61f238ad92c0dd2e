// One measured infer run in its own process, so that every run starts cold the same way and its
// peak memory is its own. Prints one JSON line (or {"error": ...} and exit code 1).
//   bun bench/run-infer.ts --model M --mode prefill|decode|decode-deep --tokens FILE
//       [--threads N] [--ctx 2048] [--batch N] [--gen 128] [--deep-gen 32] [--depth N]
//       [--cache-type-k f16|q8_0|q4_0|tq4|tq3] [--cache-type-v T]
// FILE is JSON { prefill: number[], short: number[], deep: number[] } (the same tokens every
// engine is given). Greedy sampling; end-of-generation tokens are ignored (--ignore-eos).
// As llama-bench does, each process first warms up (the same prompt for prefill, one token for
// decode) so that page faults on the mapped weights are not timed; the KV cache is then reset.
//   prefill      tokens/s of evaluating `prefill` (512 tokens) from position 0
//   decode       `short` (16 tokens) → first token (TTFT), then `gen` single-token steps: tokens/s
//   decode-deep  `deep` (1,000 tokens; --depth N: N tokens, `deep` repeated) untimed, then
//                `deep-gen` single-token steps: tokens/s
// cpuMs is the process's CPU time (every thread) over the timed part: on a shared machine, where
// wall time swings with other work, the steadier figure of the work done.
import { readFileSync } from "node:fs";
import { Engine } from "../ts/engine/engine.ts";
import { Sampler } from "../ts/sample/sampler.ts";
import { cacheTypeOption } from "../ts/cli/options.ts";

export interface InferResult {
  readonly mode: string;
  readonly tokensPerSec: number;
  readonly ttftMs: number | null;
  readonly peakRssKiB: number;
  readonly loadMs: number;
  readonly tokens: number;
  readonly ms: number;
  /** CPU time of the timed part, ms (user + system, all threads). */
  readonly cpuMs: number;
  readonly lastToken: number;
}

function arg(name: string, fallback?: string): string {
  const i = process.argv.indexOf(name);
  if (i >= 0 && i + 1 < process.argv.length) return process.argv[i + 1];
  if (fallback === undefined) throw new Error(`missing ${name}`);
  return fallback;
}

/** Peak resident set of this process (VmHWM), KiB; 0 where /proc is absent. */
export function peakRssKiB(): number {
  try {
    const m = /VmHWM:\s+(\d+)\s+kB/.exec(readFileSync("/proc/self/status", "utf8"));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

/** The decode-deep prompt: `deep` itself, or (depth > 0) `depth` tokens of it repeated. */
export function deepPrompt(deep: readonly number[], depth: number): number[] {
  if (!Number.isInteger(depth) || depth < 0) throw new Error(`--depth must be a whole number, got ${depth}`);
  if (depth === 0) return [...deep];
  if (deep.length === 0) throw new Error("--depth needs a non-empty deep prompt");
  return Array.from({ length: depth }, (_, i) => deep[i % deep.length]);
}

function main(): InferResult {
  const mode = arg("--mode");
  const tokens = JSON.parse(readFileSync(arg("--tokens"), "utf8")) as
    { prefill: number[]; short: number[]; deep: number[] };
  const threads = Number(arg("--threads", "0"));
  const batch = arg("--batch", "");
  const engine = Engine.open({
    modelPath: arg("--model"),
    threads: threads > 0 ? threads : undefined,
    contextLength: Number(arg("--ctx", "2048")),
    batch: batch ? Number(batch) : undefined,
    cacheTypeK: cacheTypeOption(arg("--cache-type-k", "") || undefined, "--cache-type-k"),
    cacheTypeV: cacheTypeOption(arg("--cache-type-v", "") || undefined, "--cache-type-v"),
  });
  const sampler = new Sampler({ temperature: 0, topK: 1, topP: 1, minP: 0, seed: 0 });
  const gen = Number(arg("--gen", "128")), deepGen = Number(arg("--deep-gen", "32"));
  const steps = (first: number, n: number): number => {
    let token = first;
    for (let i = 0; i < n; i++) token = sampler.sample(engine.evaluate([token]));
    return token;
  };
  let cpu0 = process.cpuUsage();
  const cpuMs = () => {
    const used = process.cpuUsage(cpu0);
    return (used.user + used.system) / 1000;
  };
  let result: Omit<InferResult, "peakRssKiB" | "loadMs" | "mode">;
  if (mode === "prefill") {
    engine.evaluate(tokens.prefill); // warm-up
    engine.reset();
    cpu0 = process.cpuUsage();
    const t0 = performance.now();
    const token = sampler.sample(engine.evaluate(tokens.prefill));
    const ms = performance.now() - t0;
    result = { tokensPerSec: tokens.prefill.length / (ms / 1000), ttftMs: ms, tokens: tokens.prefill.length, ms,
      cpuMs: cpuMs(), lastToken: token };
  } else if (mode === "decode") {
    steps(tokens.short[0], 1); // warm-up
    engine.reset();
    const t0 = performance.now();
    const first = sampler.sample(engine.evaluate(tokens.short));
    const t1 = performance.now();
    cpu0 = process.cpuUsage();
    const last = steps(first, gen);
    const ms = performance.now() - t1;
    result = { tokensPerSec: gen / (ms / 1000), ttftMs: t1 - t0, tokens: gen, ms, cpuMs: cpuMs(), lastToken: last };
  } else if (mode === "decode-deep") {
    steps(tokens.deep[0], 1); // warm-up
    engine.reset();
    const first = sampler.sample(engine.evaluate(deepPrompt(tokens.deep, Number(arg("--depth", "0")))));
    cpu0 = process.cpuUsage();
    const t0 = performance.now();
    const last = steps(first, deepGen);
    const ms = performance.now() - t0;
    result = { tokensPerSec: deepGen / (ms / 1000), ttftMs: null, tokens: deepGen, ms, cpuMs: cpuMs(),
      lastToken: last };
  } else {
    throw new Error(`unknown --mode ${mode} (prefill, decode, decode-deep)`);
  }
  const out = { mode, ...result, peakRssKiB: peakRssKiB(), loadMs: engine.loadMs };
  engine.close();
  return out;
}

if (import.meta.main) {
  try {
    console.log(JSON.stringify(main()));
  } catch (err) {
    console.log(JSON.stringify({ error: (err as Error).message.split("\n")[0] }));
    process.exit(1);
  }
}
