// infer against llama-bench across thread counts (issue 52: the CPU at 8-16 cores). For each
// thread count the memory read bandwidth is probed first (bench/bandwidth.ts, the same pool), then
// every cell of the plan runs infer (bench/run-infer.ts, its own process) and llama-bench
// (CPU-only, -t N) one after the other on the same random-weight GGUF (bench/random-model.ts):
// prefill of `--prefill` tokens, decode of `--gen` tokens after `--short`, and, with --deep N,
// decode of `--deep-gen` tokens after N. One markdown table, infer ÷ llama.cpp per cell, and each
// engine's decode as a share of the bandwidth limit (bandwidth ÷ the weight bytes a token reads).
//   bun bench/cpu-threads.ts --plan "qwen3-0.6b/Q4_0/1,2,4,8,16;llama-3.2-1b/Q4_0,Q4_K/8,16"
//       [--prefill 512] [--short 16] [--gen 32] [--deep 0] [--deep-gen 16] [--runs 1] [--modes decode,...]
//       [--llama-bench PATH] [--baseline-lib PATH] [--baseline-models M] [--json FILE] [--md FILE]
// --baseline-lib runs infer a second time on another libinfer build (INFER_LIB), as "before"
// (--baseline-models a,b: on those models only); --baseline-env NAME=VALUE,... runs "before" with
// those settings (e.g. INFER_HUGE_PAGES=0), on this build unless --baseline-lib names another.
// --no-bandwidth skips the read-bandwidth probe (prefill-only runs; needs no libbench-bandwidth).
// Models are written when missing; the 8B shape is llama-3.1-8b.
import { writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type SettingName, withSettings } from "../ts/config/env.ts";
import { openGguf } from "../ts/gguf/reader.ts";
import { tokenizerFromMetadata } from "../ts/tokenizer/index.ts";
import { measureBandwidth } from "./bandwidth.ts";
import { findPeers, runInfer, runLlamaBench, type Mode, type RunResult, type Workload } from "./peers.ts";
import { ensureRandomModel, findShape, randomQuants, type RandomQuant } from "./random-model.ts";

interface Cell { readonly model: string; readonly quant: RandomQuant; readonly threads: number }
type Engine = "infer" | "before" | "llama.cpp";
interface Row extends Cell {
  readonly bandwidthGBs: number;
  readonly weightBytes: number;
  readonly results: Partial<Record<Engine, Partial<Record<Mode, number | string>>>>;
}

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

/** "model/quant,quant/threads,threads;..." → cells, in the order given. */
export function parsePlan(plan: string): Cell[] {
  const cells: Cell[] = [];
  for (const part of plan.split(";").map((p) => p.trim()).filter(Boolean)) {
    const [model, quants, threads] = part.split("/");
    if (!model || !quants || !threads || !findShape(model)) throw new Error(`bad plan entry '${part}'`);
    for (const q of quants.split(",")) {
      if (!randomQuants.includes(q as RandomQuant)) throw new Error(`unknown quant '${q}' in '${part}'`);
      for (const t of threads.split(",").map(Number)) {
        if (!Number.isInteger(t) || t < 1) throw new Error(`bad thread count in '${part}'`);
        cells.push({ model, quant: q as RandomQuant, threads: t });
      }
    }
  }
  return cells;
}

/** Bytes of weights one decode step reads, and token ids for the prompts. */
function modelFacts(path: string, n: number): { weightBytes: number; ids: number[] } {
  const file = openGguf(path);
  try {
    const tok = tokenizerFromMetadata(file.metadata);
    const text = "the quick brown fox jumps over the lazy dog and keeps running through the field ";
    let ids: number[] = [];
    for (let reps = 1; ids.length < n; reps *= 2) ids = tok.encode(text.repeat(reps), { addSpecial: true });
    let weightBytes = 0;
    for (const t of file.tensors.values()) weightBytes += t.byteLength;
    const embd = file.tensors.get("token_embd.weight");
    // A tied LM head reads all of token_embd; an untied one reads one row of it.
    if (embd && file.tensors.has("output.weight")) weightBytes -= embd.byteLength - embd.byteLength / embd.dims[1];
    return { weightBytes, ids: ids.slice(0, n) };
  } finally {
    file.close();
  }
}

function log(s: string): void {
  console.error(`[cpu-threads ${new Date().toISOString().slice(11, 19)}] ${s}`);
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1];
}

function main(): void {
  const cells = parsePlan(arg("--plan", "qwen3-0.6b/Q4_0,Q4_K/1,2,4,8,16"));
  const sizes = { prefill: Number(arg("--prefill", "512")), short: Number(arg("--short", "16")),
    gen: Number(arg("--gen", "32")), deep: Number(arg("--deep", "0")), deepGen: Number(arg("--deep-gen", "16")) };
  const runs = Number(arg("--runs", "1"));
  const llamaBench = arg("--llama-bench", "") || findPeers().llamaBench;
  const baselineLib = arg("--baseline-lib", "");
  const baselineModels = arg("--baseline-models", "").split(",").filter(Boolean);
  const baselineEnv = Object.fromEntries(arg("--baseline-env", "").split(",").filter(Boolean)
    .map((kv) => kv.split("=") as [SettingName, string]));
  const baseline = baselineLib !== "" || Object.keys(baselineEnv).length > 0;
  const probeBandwidth = !process.argv.includes("--no-bandwidth");
  const modes = (arg("--modes", sizes.deep > 0 ? "prefill,decode,decode-deep" : "prefill,decode").split(",") as Mode[])
    .filter((m) => ["prefill", "decode", "decode-deep"].includes(m));
  const dir = join(tmpdir(), `infer-cpu-threads-${process.pid}`);
  const bandwidth = new Map<number, number>();
  const rows: Row[] = [];
  const byThreads = [...new Set(cells.map((c) => c.threads))];
  for (const threads of byThreads) {
    const bw = probeBandwidth ? measureBandwidth(threads, 1024, 5) : { bestGBs: 0, medianGBs: 0 };
    bandwidth.set(threads, bw.bestGBs);
    log(`${threads} threads: read bandwidth ${bw.bestGBs.toFixed(1)} GB/s (median ${bw.medianGBs.toFixed(1)})`);
    for (const cell of cells.filter((c) => c.threads === threads)) {
      const path = ensureRandomModel(findShape(cell.model)!, cell.quant);
      const facts = modelFacts(path, Math.max(sizes.prefill, sizes.deep, sizes.short));
      const tokensFile = `${dir}-${cell.model}-${cell.quant}.json`;
      writeFileSync(tokensFile, JSON.stringify({ prefill: facts.ids.slice(0, sizes.prefill),
        short: facts.ids.slice(0, sizes.short), deep: facts.ids.slice(0, sizes.deep) }));
      const w: Workload = { model: path, tokensFile, shortText: "", threads, prefill: sizes.prefill,
        ctx: Math.max(2048, sizes.deep + sizes.deepGen + 16), short: sizes.short, gen: sizes.gen,
        deep: sizes.deep, deepGen: sizes.deepGen };
      const results: Row["results"] = {};
      const engines: [Engine, (m: Mode) => RunResult][] = [["infer", (m) => runInfer(w, m, 300_000)]];
      if (baseline && (baselineModels.length === 0 || baselineModels.includes(cell.model))) {
        const env = { ...(baselineLib ? { INFER_LIB: baselineLib } : {}), ...baselineEnv };
        engines.push(["before", (m) => withSettings(env, () => runInfer(w, m, 300_000))]);
      }
      if (llamaBench) engines.push(["llama.cpp", (m) => runLlamaBench({ dir: "", llamaBench, llamaCompletion: null,
        nodeLlamaCpp: false, time: null }, w, m, 300_000)]);
      for (const mode of modes) {
        for (const [engine, run] of engines) {
          const got: number[] = [];
          let error = "";
          for (let r = 0; r < runs && !error; r++) {
            try {
              const v = run(mode).tokensPerSec;
              if (v !== null) got.push(v);
            } catch (err) {
              error = (err as Error).message.slice(0, 80);
            }
          }
          (results[engine] ??= {})[mode] = got.length ? median(got) : error || "no result";
          log(`${cell.model} ${cell.quant} t=${threads} ${mode} ${engine}: ${results[engine]![mode]}`);
        }
      }
      rows.push({ ...cell, bandwidthGBs: bw.bestGBs, weightBytes: facts.weightBytes, results });
      save(rows, modes, sizes, baseline); // after every row: a run cut short keeps its rows
    }
  }
  console.log(table(rows, modes, baseline));
}

function save(rows: Row[], modes: Mode[], sizes: object, withBefore: boolean): void {
  const mdFile = arg("--md", ""), jsonFile = arg("--json", "");
  if (mdFile) writeFileSync(mdFile, table(rows, modes, withBefore) + "\n");
  if (jsonFile) writeFileSync(jsonFile, JSON.stringify({ sizes, rows }, null, 1));
}

function num(v: number | string | undefined): number | null {
  return typeof v === "number" ? v : null;
}

function fmt(v: number | null): string {
  return v === null ? "—" : v >= 100 ? v.toFixed(0) : v.toFixed(1);
}

function ratio(a: number | null, b: number | null): string {
  return a === null || b === null || b === 0 ? "—" : `${(a / b).toFixed(2)}×`;
}

export function table(rows: Row[], modes: Mode[], withBefore: boolean): string {
  const label: Record<Mode, string> = { prefill: "prefill", decode: "decode", "decode-deep": "decode deep" };
  const head = ["model", "quant", "threads", "read GB/s"];
  for (const m of modes) {
    head.push(`${label[m]} infer / llama.cpp t/s`, `${label[m]} ÷`);
    if (withBefore) head.push(`${label[m]} before`);
  }
  head.push("decode limit t/s", "infer % of limit", "llama.cpp % of limit");
  const lines = [`| ${head.join(" | ")} |`, `| ${head.map((_, i) => (i < 3 ? "---" : "---:")).join(" | ")} |`];
  for (const r of rows) {
    const cells = [findShape(r.model)!.label, r.quant, String(r.threads), r.bandwidthGBs.toFixed(1)];
    for (const m of modes) {
      const a = num(r.results.infer?.[m]), b = num(r.results["llama.cpp"]?.[m]);
      const err = typeof r.results.infer?.[m] === "string" ? ` (${r.results.infer?.[m]})` : "";
      cells.push(`${fmt(a)} / ${fmt(b)}${err}`, ratio(a, b));
      if (withBefore) cells.push(fmt(num(r.results.before?.[m])));
    }
    const limit = (r.bandwidthGBs * 1e9) / r.weightBytes;
    const pct = (v: number | null) => (v === null ? "—" : `${((v / limit) * 100).toFixed(0)}%`);
    cells.push(fmt(limit), pct(num(r.results.infer?.decode)), pct(num(r.results["llama.cpp"]?.decode)));
    lines.push(`| ${cells.join(" | ")} |`);
  }
  return lines.join("\n");
}

if (import.meta.main) main();
