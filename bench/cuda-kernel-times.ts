// Nsight Compute's time of each kernel of one CUDA decode step: ncu (one metric,
// gpu__time_duration.sum; caches and clocks left alone) over a short greedy decode of a
// random-weight model (an 8-token prompt, then 4 steps as graphs), the last step's kernels — from
// its embedding lookup on — summed by kernel and grid. ncu runs each kernel by itself, so these
// are a kernel's own costs without the overlap of a real step (bench/cuda-step-parts.ts prices
// that): for comparing one build, type or shape with another. The same ncu flags over the same
// decode, run by hand, showed the 8B Q4_K's fused norms at 8.4 µs a launch against Q4_0's 6.9, a
// shared-memory bank conflict (this script's own ncu launch has not yet run on the GPU machine). Needs ncu (the GPU machine's
// /usr/local/cuda/bin/ncu; --ncu PATH).
//   bun bench/cuda-kernel-times.ts [--models llama-3.1-8b] [--quants Q4_0,Q4_K] [--ncu ncu] [--out DIR]
//   bun bench/cuda-kernel-times.ts --csv a.csv,b.csv      (the tables of CSVs ncu already wrote)
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Engine } from "../ts/engine/engine.ts";
import { argmax } from "./logits.ts";
import { ensureRandomModel, findShape, type RandomQuant } from "./random-model.ts";

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

/** The child ncu watches: greedy decode on CUDA, prompt 8 tokens, 4 steps. */
function decode(path: string): void {
  const engine = Engine.open({ modelPath: path, backend: "cuda", contextLength: 64, batch: 16 });
  let logits = engine.evaluate(Array.from({ length: 8 }, (_, i) => 97 + i));
  for (let step = 0; step < 4; step++) logits = engine.evaluate([argmax(logits)]);
}

/** The fields of one CSV line, quotes removed ("3,791,680" stays one field). */
export function csvFields(line: string): string[] {
  const fields: string[] = [];
  let field = "", quoted = false;
  for (const c of line) {
    if (c === '"') quoted = !quoted;
    else if (c === "," && !quoted) fields.push(field), (field = "");
    else field += c;
  }
  fields.push(field);
  return fields;
}

export interface KernelTime {
  kernel: string;
  grid: string;
  launches: number;
  totalUs: number;
}

/** The last decode step's kernels of an ncu --csv log, by kernel and grid, in first-launch order. */
export function lastStep(csv: string): KernelTime[] {
  const lines = csv.split("\n").filter((l) => l.startsWith('"'));
  if (lines.length < 2) throw new Error("no ncu rows (did the program run under ncu?)");
  const head = csvFields(lines[0]);
  const col = (name: string) => {
    const i = head.indexOf(name);
    if (i < 0) throw new Error(`ncu CSV without a "${name}" column`);
    return i;
  };
  const [name, grid, metric, value] = ["Kernel Name", "Grid Size", "Metric Name", "Metric Value"].map(col);
  const rows = lines.slice(1).map(csvFields).filter((f) => f[metric] === "gpu__time_duration.sum");
  let first = -1;
  rows.forEach((f, i) => { if (f[name].startsWith("get_rows")) first = i; });
  if (first < 0) throw new Error("no embedding lookup (get_rows_*) to start a step at");
  const byKey = new Map<string, KernelTime>();
  for (const f of rows.slice(first)) {
    const key = `${f[name]} ${f[grid]}`;
    const t = byKey.get(key) ?? { kernel: f[name], grid: f[grid], launches: 0, totalUs: 0 };
    t.launches++;
    t.totalUs += Number(f[value].replaceAll(",", "")) / 1000; // ns
    byKey.set(key, t);
  }
  return [...byKey.values()];
}

function table(label: string, times: KernelTime[]): string {
  const total = times.reduce((s, t) => s + t.totalUs, 0);
  const out = [`${label}: ${times.reduce((s, t) => s + t.launches, 0)} launches, ${total.toFixed(1)} µs in all`, "",
    "| kernel | grid | launches | µs in all | µs a launch |", "|---|---|---:|---:|---:|"];
  for (const t of times) {
    out.push(`| ${t.kernel} | ${t.grid} | ${t.launches} | ${t.totalUs.toFixed(1)} | ${(t.totalUs / t.launches).toFixed(2)} |`);
  }
  return out.join("\n");
}

if (import.meta.main) {
  if (process.argv.includes("--decode")) {
    decode(arg("--decode", ""));
  } else if (process.argv.includes("--csv")) {
    for (const file of arg("--csv", "").split(",")) console.log(table(file, lastStep(readFileSync(file, "utf8"))) + "\n");
  } else {
    const ncu = arg("--ncu", "ncu"), out = arg("--out", "/tmp/cuda-kernel-times");
    mkdirSync(out, { recursive: true });
    for (const name of arg("--models", "llama-3.1-8b").split(",")) {
      const shape = findShape(name);
      if (!shape) throw new Error(`unknown model ${name}`);
      for (const quant of arg("--quants", "Q4_0,Q4_K").split(",") as RandomQuant[]) {
        const model = ensureRandomModel(shape, quant);
        const csv = join(out, `${shape.key}-${quant.toLowerCase()}.csv`);
        const run = spawnSync(ncu, ["--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base",
          "--cache-control", "none", "--clock-control", "none", "--graph-profiling", "node", "--log-file", csv,
          process.execPath, import.meta.path, "--decode", model], { stdio: ["ignore", "ignore", "inherit"] });
        if (run.error || run.status !== 0) throw new Error(`${ncu} failed (${run.error?.message ?? `exit ${run.status}`})`);
        console.log(table(`${shape.label} ${quant} (${csv})`, lastStep(readFileSync(csv, "utf8"))) + "\n");
      }
    }
  }
}
