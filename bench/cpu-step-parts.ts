// Where a CPU decode step's time goes: every backend call of `--steps` greedy decode steps timed
// on the host (the CPU backend's calls return when the op is done), summed by kind of op — the
// matmuls by weight (blk.N.attn_q → attn_q), with the GB/s their weight bytes were read at —
// beside the step's wall time, whose rest is the model graph in TypeScript and sampling.
// With --prompt N, the same for `--steps` evaluations of an N-token prompt (from an empty cache).
//   bun bench/cpu-step-parts.ts [--model qwen3-0.6b] [--quant Q4_0] [--path FILE.gguf] [--threads 2]
//       [--context 16] [--steps 64] [--prompt 512]
import { CpuBackend } from "../ts/backend/cpu.ts";
import type { Weight } from "../ts/backend/backend.ts";
import { Engine } from "../ts/engine/engine.ts";
import { ggmlTypes, rowBytes } from "../ts/gguf/types.ts";
import { ensureRandomModel, findShape, type RandomQuant } from "./random-model.ts";

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

function modelPath(): string {
  const path = arg("--path", "");
  if (path) return path;
  const shape = findShape(arg("--model", "qwen3-0.6b"));
  if (!shape) throw new Error("unknown model");
  return ensureRandomModel(shape, arg("--quant", "Q4_0") as RandomQuant);
}

/** Bytes of a weight as stored (its GGUF type; a repacked layout keeps the bytes per row). */
function weightBytes(w: Weight): number {
  const type = [...ggmlTypes.values()].find((t) => t.name === w.typeName);
  return type ? rowBytes(type, w.dims[0]) * (w.dims[1] ?? 1) : 0;
}

interface Part { calls: number; ms: number; bytes: number }

const threads = Number(arg("--threads", "0"));
const engine = Engine.open({ modelPath: modelPath(), backend: "cpu", threads: threads > 0 ? threads : undefined,
  contextLength: 2048 });
const backend = engine.backend as CpuBackend;
const parts = new Map<string, Part>();
let timing = false;
// Each of the backend's calls, wrapped: the time between its entry and return, by kind.
const target = backend as unknown as Record<string, (...args: unknown[]) => unknown>;
const proto = Object.getPrototypeOf(backend) as object;
for (const name of Object.getOwnPropertyNames(proto)) {
  const fn = Object.getOwnPropertyDescriptor(proto, name)?.value; // methods, not getters
  if (name === "constructor" || typeof fn !== "function" || name === "read" || name === "activation") continue;
  const original = fn as (...args: unknown[]) => unknown;
  target[name] = function (this: unknown, ...args: unknown[]) {
    if (!timing) return original.apply(backend, args);
    const t0 = performance.now();
    const result = original.apply(backend, args);
    const ms = performance.now() - t0;
    let key = name, bytes = 0;
    if (name === "matmul" || name === "embed") {
      const w = args[0] as Weight;
      key = `${name} ${w.name.replace(/^blk\.\d+\./, "")}`;
      if (name === "matmul") bytes = weightBytes(w);
    }
    const p = parts.get(key) ?? { calls: 0, ms: 0, bytes: 0 };
    p.calls++;
    p.ms += ms;
    p.bytes += bytes;
    parts.set(key, p);
    return result;
  };
}

const argmax = (x: Float32Array) => {
  let b = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[b]) b = i;
  return b;
};
const context = Number(arg("--context", "16")), steps = Number(arg("--steps", "64"));
const prompt = Number(arg("--prompt", "0"));
const promptTokens = Array.from({ length: prompt }, (_, i) => 97 + ((i * 7) % 1000));
const step = (): void => {
  if (prompt > 0) {
    engine.reset();
    logits = engine.evaluate(promptTokens);
  } else {
    logits = engine.evaluate([argmax(logits)]);
  }
};
let logits = engine.evaluate(Array.from({ length: context }, (_, i) => 97 + (i % 26)));
for (let i = 0; i < (prompt > 0 ? 1 : 4); i++) step(); // warm: page faults, caches
timing = true;
const t0 = performance.now();
for (let i = 0; i < steps; i++) step();
const wallMs = (performance.now() - t0) / steps;
timing = false;
engine.close();

const rows = [...parts].sort((a, b) => b[1].ms - a[1].ms);
const opsMs = rows.reduce((s, [, p]) => s + p.ms, 0) / steps;
const bytes = rows.reduce((s, [, p]) => s + p.bytes, 0) / steps;
console.log(`${arg("--path", "") || `${arg("--model", "qwen3-0.6b")} ${arg("--quant", "Q4_0")}`}, ${steps} ` +
  (prompt > 0 ? `prompts of ${prompt} tokens` : `decode steps after ${context} tokens`) +
  `, threads ${threads || "default"}: ${wallMs.toFixed(2)} ms a step ` +
  `(${((1000 * Math.max(prompt, 1)) / wallMs).toFixed(1)} tok/s); backend calls ${opsMs.toFixed(2)} ms, the rest ` +
  `${(wallMs - opsMs).toFixed(2)} ms; matmul weights ${(bytes / 1e6).toFixed(0)} MB a step`);
console.log("| op | calls a step | ms a step | share | µs a call | weight GB/s |\n|---|---:|---:|---:|---:|---:|");
for (const [key, p] of rows) {
  const ms = p.ms / steps;
  const gbs = p.bytes > 0 ? (p.bytes / (p.ms / 1000) / 1e9).toFixed(1) : "";
  console.log(`| ${key} | ${(p.calls / steps).toFixed(0)} | ${ms.toFixed(3)} | ${(100 * ms / wallMs).toFixed(1)}% | ` +
    `${((p.ms * 1000) / p.calls).toFixed(1)} | ${gbs} |`);
}
