// `bun run bench`: infer against llama.cpp's own llama-bench and node-llama-cpp on the same GGUF,
// same threads, same tokens (../shared/BENCHMARKS.md). For each model × quant, in one interleaved
// run (run r: for each measure, infer → llama.cpp → node-llama-cpp; one warm-up round first, then
// --runs measured rounds; each figure the median), it measures prefill tokens/s (512-token prompt),
// decode tokens/s after a 16-token prompt (128 generated), decode tokens/s at ~1,000 tokens of
// context (32 generated), time to first token (16-token prompt) and peak resident memory, and
// prints a Markdown table last, with the ratios infer / peer and the fraction of the memory-
// bandwidth limit (measured bandwidth ÷ bytes of weights read per token) that decode reaches.
//   bun run bench [--models gemma,qwen3-0.6b,llama-3.2-1b] [--quants Q4_0,Q8_0,Q4_K] [--runs 3]
//                 [--threads N] [--quick] [--engines infer,llama.cpp,node-llama-cpp] [--batch N]
//                 [--json FILE] [--max-wait 60] [--max-background 0.15] [--when-fast 45 [--fast-wait 300]]
// --quick: one measured round, no warm-up round, Gemma only unless --models says otherwise.
// --max-wait: before each run, wait up to this many seconds for other processes to use under a
// quarter of the CPUs (the machine is shared); a measured run during which they used more than
// --max-background of them is redone (twice at most); the table reports the background load.
// Before each decode run the memory read bandwidth is probed (~0.5 s) and printed beside the run
// in a second table: the machine's bandwidth switches between states (~32 and ~50 GB/s on the
// AMD EPYC VMs, bench/results/cpu.md) within seconds to minutes, and a memory-bound engine's
// decode follows it.
// --when-fast GB/s: every engine's measured decode run (not the warm-up's) starts only once a
// probe reads at least that much (probing every ~2 s, up to --fast-wait seconds; then it runs
// anyway, and the second table shows the probe), and a run after which a probe reads less is
// redone (twice at most), so that the engines are compared in one state of the memory rather than
// whichever state each run happened to land in. The same rule for every engine; the header says it was used.
// Every infer run uses a snapshot of the tree (ts/, bench/, zig-out/lib) taken at the start.
// Peers: $INFER_PEERS (default ~/.cache/infer-peers), built by ../shared/tools/build-peer-llama.sh.
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { defaultModelPath } from "../ts/models/cache.ts";
import { setting } from "../ts/config/env.ts";
import { openGguf } from "../ts/gguf/reader.ts";
import { libraryPath } from "../ts/native/lib.ts";
import { tokenizerFromMetadata } from "../ts/tokenizer/index.ts";
import {
  backgroundLoad, findPeers, modes, runInfer, runLlamaBench, runLlamaCompletion, runNodeLlamaCpp, setRunnerDir,
  type Mode, type Peers,
  type RunResult, type Workload,
} from "./peers.ts";
import { ensureRandomModel, randomQuants, randomShapes, type RandomQuant } from "./random-model.ts";

// ---- options ---------------------------------------------------------------------------------

const engineNames = ["infer", "llama.cpp", "node-llama-cpp"] as const;
type EngineName = (typeof engineNames)[number];

interface Options {
  models: string[];
  quants: RandomQuant[];
  runs: number;
  warmup: boolean;
  threads: number;
  engines: EngineName[];
  batch?: number;
  json?: string;
  /** Seconds to wait before a run for the machine to go quiet (other processes < 25% of it). */
  maxWait: number;
  /** A measured run during which other processes used more than this share of the CPUs is redone (twice at most). */
  maxBackground: number;
  /** Decode runs wait for a bandwidth probe of at least this many GB/s (null: they do not wait). */
  whenFast: number | null;
  /** Seconds a decode run waits for whenFast. */
  fastWait: number;
}

function parseOptions(argv: string[]): Options {
  const get = (name: string): string | undefined => {
    const i = argv.indexOf(name);
    if (i < 0) return undefined;
    if (i + 1 >= argv.length) throw new Error(`${name} needs a value`);
    return argv[i + 1];
  };
  const known = new Set(["--models", "--quants", "--runs", "--threads", "--engines", "--batch", "--json", "--quick",
    "--max-wait", "--max-background", "--when-fast", "--fast-wait",
    "--help", "-h"]);
  for (let i = 0; i < argv.length; i++) {
    if (!known.has(argv[i])) throw new Error(`unknown option '${argv[i]}'`);
    if (argv[i] !== "--quick" && argv[i] !== "--help" && argv[i] !== "-h") i++;
  }
  const quick = argv.includes("--quick");
  const list = (s: string) => s.split(",").map((x) => x.trim()).filter(Boolean);
  const modelKeys = ["gemma", ...randomShapes.map((s) => s.key)];
  const models = list(get("--models") ?? (quick ? "gemma" : modelKeys.join(",")));
  for (const m of models) if (!modelKeys.includes(m)) throw new Error(`unknown model '${m}' (${modelKeys.join(", ")})`);
  const quants = list(get("--quants") ?? randomQuants.join(",")) as RandomQuant[];
  for (const q of quants) if (!randomQuants.includes(q)) throw new Error(`unknown quant '${q}' (${randomQuants.join(", ")})`);
  const engines = list(get("--engines") ?? engineNames.join(",")) as EngineName[];
  for (const e of engines) if (!engineNames.includes(e)) throw new Error(`unknown engine '${e}' (${engineNames.join(", ")})`);
  const int = (name: string, fallback: number, min: number) => {
    const v = Number(get(name) ?? fallback);
    if (!Number.isInteger(v) || v < min) throw new Error(`${name} must be an integer ≥ ${min}`);
    return v;
  };
  const batch = get("--batch");
  return {
    models, quants, engines,
    runs: int("--runs", quick ? 1 : 3, 1),
    warmup: !quick,
    threads: int("--threads", availableParallelism(), 1),
    batch: batch ? int("--batch", 0, 1) : undefined,
    json: get("--json"),
    maxWait: int("--max-wait", 60, 0),
    maxBackground: Number(get("--max-background") ?? 0.15),
    whenFast: get("--when-fast") === undefined ? null : int("--when-fast", 45, 1),
    fastWait: int("--fast-wait", 300, 0),
  };
}

// ---- models and workloads --------------------------------------------------------------------

interface BenchModel {
  readonly label: string;
  readonly quant: string;
  readonly path: string;
}

function benchModels(o: Options): BenchModel[] {
  const out: BenchModel[] = [];
  for (const key of o.models) {
    if (key === "gemma") {
      out.push({ label: "Gemma 3 270M", quant: "Q4_K_M", path: defaultModelPath() });
      continue;
    }
    const shape = randomShapes.find((s) => s.key === key)!;
    for (const quant of o.quants) {
      const t0 = performance.now();
      const path = ensureRandomModel(shape, quant);
      const s = (performance.now() - t0) / 1000;
      if (s > 1) log(`wrote ${path} in ${s.toFixed(1)} s`);
      out.push({ label: shape.label, quant, path });
    }
  }
  return out;
}

const TEXT = "The old lighthouse keeper climbed the spiral stairs every evening, counting each of the " +
  "two hundred steps, and when he reached the lamp room he wiped the salt from the glass, trimmed the " +
  "wick, and watched the ships that passed between the rocks and the open sea. ";

interface ModelFacts {
  readonly tokens: { prefill: number[]; short: number[]; deep: number[] };
  readonly shortText: string;
  /** Bytes of weights one decode step reads (every tensor; token_embd only when it is the LM head). */
  readonly weightBytes: number;
  /** KV-cache bytes (F16 K and V) one decode step reads per position of context. */
  readonly kvBytesPerPosition: number;
}

function modelFacts(m: BenchModel, w: { prefill: number; short: number; deep: number }): ModelFacts {
  const file = openGguf(m.path);
  try {
    const tok = tokenizerFromMetadata(file.metadata);
    let text = TEXT;
    let ids = tok.encode(text, { addSpecial: true, parseSpecial: false });
    while (ids.length < Math.max(w.prefill, w.deep)) {
      text += TEXT;
      ids = tok.encode(text, { addSpecial: true, parseSpecial: false });
    }
    const short = ids.slice(0, w.short);
    // llama-completion adds BOS itself; decode skips control tokens.
    const shortText = tok.decode(short);
    let weightBytes = 0;
    for (const t of file.tensors.values()) weightBytes += t.byteLength;
    const embd = file.tensors.get("token_embd.weight");
    if (embd && file.tensors.has("output.weight")) weightBytes -= embd.byteLength - embd.byteLength / embd.dims[1];
    const arch = String(file.metadata.get("general.architecture"));
    const n = (k: string) => Number(file.metadata.get(`${arch}.${k}`) ?? 0);
    const headDim = n("attention.key_length") || n("embedding_length") / n("attention.head_count");
    const kvBytesPerPosition = n("block_count") * 2 * (n("attention.head_count_kv") || n("attention.head_count")) *
      headDim * 2;
    return {
      tokens: { prefill: ids.slice(0, w.prefill), short, deep: ids.slice(0, w.deep) },
      shortText, weightBytes, kvBytesPerPosition,
    };
  } finally {
    file.close();
  }
}

// ---- measuring -------------------------------------------------------------------------------

type Measure = "prefill" | "decode" | "decodeDeep" | "ttft" | "rss";
const measures: readonly { key: Measure; label: string; lowerIsBetter: boolean }[] = [
  { key: "prefill", label: "prefill t/s (512)", lowerIsBetter: false },
  { key: "decode", label: "decode t/s (16+128)", lowerIsBetter: false },
  { key: "decodeDeep", label: "decode t/s @1000 ctx", lowerIsBetter: false },
  { key: "ttft", label: "TTFT ms (16-tok prompt)", lowerIsBetter: true },
  { key: "rss", label: "peak RSS MiB (decode run)", lowerIsBetter: true },
];

type Samples = Record<EngineName, Record<Measure, number[]>>;
type Errors = Partial<Record<EngineName, string>>;

interface ModelResult {
  readonly model: BenchModel;
  readonly facts: ModelFacts;
  readonly samples: Samples;
  readonly errors: Errors;
  /** Other processes' share of the CPUs during each measured run. */
  readonly background: number[];
  /** Measured runs redone because of background load. */
  readonly retried: number;
  /** The memory read bandwidth (GB/s) probed just before each measured decode run, per engine
   * and measure: the machine's bandwidth changes state within seconds to minutes (~32 against
   * ~50 GB/s on the AMD EPYC VMs), and a memory-bound engine's decode follows it. */
  readonly memory: Record<EngineName, { decode: number[]; decodeDeep: number[] }>;
}

function log(s: string): void {
  console.error(`[bench ${new Date().toISOString().slice(11, 19)}] ${s}`);
}

const RUN_TIMEOUT_MS = 15 * 60 * 1000;
/** Where bandwidth.ts runs from: the run's snapshot of bench/ (main). */
let benchDir = import.meta.dir;

/** Waits (up to o.maxWait s) until other processes use under a quarter of the machine. */
async function waitQuiet(o: Options): Promise<void> {
  const t0 = performance.now();
  let load = await backgroundLoad(300);
  while (load !== null && load > 0.25 && performance.now() - t0 < o.maxWait * 1000) load = await backgroundLoad(1000);
}

async function measureModel(o: Options, peers: Peers, m: BenchModel): Promise<ModelResult> {
  const sizes = { prefill: 512, short: 16, deep: 1000 };
  const facts = modelFacts(m, sizes);
  const dir = mkdtempSync(join(tmpdir(), "infer-bench-"));
  const tokensFile = join(dir, "tokens.json");
  writeFileSync(tokensFile, JSON.stringify(facts.tokens));
  const w: Workload = {
    model: m.path, tokensFile, shortText: facts.shortText, threads: o.threads, ctx: 2048,
    prefill: sizes.prefill, short: sizes.short, gen: 128, deep: sizes.deep, deepGen: 32,
  };
  const empty = (): Record<Measure, number[]> => ({ prefill: [], decode: [], decodeDeep: [], ttft: [], rss: [] });
  const samples: Samples = { infer: empty(), "llama.cpp": empty(), "node-llama-cpp": empty() };
  const errors: Errors = {};
  const background: number[] = [];
  const memory = Object.fromEntries((["infer", "llama.cpp", "node-llama-cpp"] as EngineName[])
    .map((e) => [e, { decode: [] as number[], decodeDeep: [] as number[] }])) as ModelResult["memory"];
  let retried = 0;
  const available: Record<EngineName, boolean> = {
    infer: true, "llama.cpp": peers.llamaBench !== null, "node-llama-cpp": peers.nodeLlamaCpp,
  };
  const engines = o.engines.filter((e) => available[e]);
  for (const e of o.engines) if (!available[e]) errors[e] = `not found under ${peers.dir}`;
  const rounds = o.runs + (o.warmup ? 1 : 0);
  try {
    for (let round = 0; round < rounds; round++) {
      const warm = o.warmup && round === 0;
      for (const mode of modes) {
        for (const engine of engines) {
          if (errors[engine]) continue;
          try {
            await waitQuiet(o);
            // Decode runs: the memory's state just before (a short probe, ~0.5 s). A warm-up run
            // is not recorded, so it does not wait for the fast state.
            const probe = () => (mode === "prefill" ? null : probeMemory(o, !warm));
            let gbs = probe();
            let r = runOne(o, peers, w, engine, mode);
            // With --when-fast, a decode run after which the memory had left the fast state is
            // redone as a busy one is: its state changed somewhere inside it.
            const slowAfter = () => mode !== "prefill" && o.whenFast !== null &&
              (measureBandwidth(benchDir, o.threads, 256, 4) ?? Infinity) < o.whenFast;
            const redo = () => (r.background ?? 0) > o.maxBackground ? "busy machine" : slowAfter() ? "memory slow after it" : null;
            for (let retry = 0, why = warm ? null : redo(); why !== null && retry < 2; retry++, why = redo()) {
              log(`${m.label} ${m.quant} ${mode} ${engine}: ${describe(r)}; ${why}, again`);
              retried++;
              await waitQuiet(o);
              gbs = probe();
              r = runOne(o, peers, w, engine, mode);
            }
            if (!warm) {
              record(samples[engine], mode, r);
              if (r.background !== undefined) background.push(r.background);
              // One entry per recorded decode sample (NaN where the probe failed), so that the
              // i-th probe is the i-th sample's.
              if (mode !== "prefill" && r.tokensPerSec !== null) memory[engine][mode === "decode" ? "decode" : "decodeDeep"].push(gbs ?? NaN);
            }
            log(`${m.label} ${m.quant} ${warm ? "warm-up" : `run ${round + (o.warmup ? 0 : 1)}/${o.runs}`} ` +
              `${mode} ${engine}: ${describe(r)}${gbs === null ? "" : `, memory ${gbs.toFixed(1)} GB/s before`}`);
          } catch (err) {
            errors[engine] = (err as Error).message.split("\n")[0];
            log(`${m.label} ${m.quant} ${engine} ${mode}: ${errors[engine]}`);
          }
        }
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return { model: m, facts, samples, errors, background, retried, memory };
}

function runOne(o: Options, peers: Peers, w: Workload, engine: EngineName, mode: Mode): RunResult {
  if (engine === "infer") return runInfer(w, mode, RUN_TIMEOUT_MS, o.batch);
  if (engine === "node-llama-cpp") return runNodeLlamaCpp(peers, w, mode, RUN_TIMEOUT_MS);
  const bench = runLlamaBench(peers, w, mode, RUN_TIMEOUT_MS);
  if (mode !== "decode" || !peers.llamaCompletion) return bench;
  // TTFT and peak memory come from llama-completion on the same short prompt.
  const completion = runLlamaCompletion(peers, w, RUN_TIMEOUT_MS);
  return { ...bench, ttftMs: completion.ttftMs, peakRssKiB: completion.peakRssKiB, extra: completion.extra,
    background: Math.max(bench.background ?? 0, completion.background ?? 0) };
}

function record(s: Record<Measure, number[]>, mode: Mode, r: RunResult): void {
  if (r.tokensPerSec !== null) s[mode === "prefill" ? "prefill" : mode === "decode" ? "decode" : "decodeDeep"].push(r.tokensPerSec);
  if (mode === "decode") {
    if (r.ttftMs !== null) s.ttft.push(r.ttftMs);
    if (r.peakRssKiB !== null && r.peakRssKiB > 0) s.rss.push(r.peakRssKiB / 1024);
  }
}

function describe(r: RunResult): string {
  const parts: string[] = [];
  if (r.tokensPerSec !== null) parts.push(`${r.tokensPerSec.toFixed(1)} t/s`);
  if (r.ttftMs !== null) parts.push(`ttft ${r.ttftMs.toFixed(1)} ms`);
  if (r.peakRssKiB) parts.push(`rss ${(r.peakRssKiB / 1024).toFixed(0)} MiB`);
  for (const [k, v] of Object.entries(r.extra ?? {})) parts.push(`${k} ${typeof v === "number" ? v.toFixed(1) : v}`);
  if (r.background !== undefined) parts.push(`background ${(100 * r.background).toFixed(0)}%`);
  return parts.join(", ");
}

// ---- bandwidth, machine ----------------------------------------------------------------------

/** A short bandwidth probe (~0.5 s); with --when-fast and `wait`, repeated until it reads
 * o.whenFast GB/s or o.fastWait seconds pass. The last probe's GB/s. */
function probeMemory(o: Options, wait: boolean): number | null {
  const t0 = performance.now();
  let gbs = measureBandwidth(benchDir, o.threads, 256, 4);
  while (wait && o.whenFast !== null && gbs !== null && gbs < o.whenFast && performance.now() - t0 < o.fastWait * 1000) {
    Bun.sleepSync(1500);
    gbs = measureBandwidth(benchDir, o.threads, 256, 4);
  }
  return gbs;
}

function measureBandwidth(dir: string, threads: number, mib = 1024, passes = 10): number | null {
  const p = Bun.spawnSync([process.execPath, join(dir, "bandwidth.ts"), "--threads", String(threads), "--mib",
    String(mib), "--passes", String(passes)], { stdout: "pipe", stderr: "pipe" });
  try {
    return (JSON.parse(p.stdout.toString().trim()) as { bestGBs: number }).bestGBs;
  } catch {
    log(`bandwidth measurement failed: ${p.stderr.toString().trim().split("\n").slice(-1)[0]}`);
    return null;
  }
}

function sh(cmd: string[]): string {
  const p = Bun.spawnSync(cmd, { stdout: "pipe", stderr: "ignore" });
  return p.exitCode === 0 ? p.stdout.toString().trim() : "";
}

function cpuModel(): string {
  const m = /^Model name:\s*(.+)$/m.exec(sh(["lscpu"]));
  return m ? m[1].trim() : "unknown CPU";
}

// ---- the table -------------------------------------------------------------------------------

export function median(xs: readonly number[]): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

function fmt(v: number | null, key: Measure): string {
  if (v === null) return "—";
  if (key === "rss") return v.toFixed(0);
  return v >= 100 ? v.toFixed(0) : v.toFixed(1);
}

function short(err: string): string {
  const e = err.replace(/\|/g, "/").replace(/\s+/g, " ");
  return `✗ ${e.length > 60 ? `${e.slice(0, 57)}…` : e}`;
}

/** Bytes a decode step reads: the weights and the KV cache at the measure's mean position. */
function bytesPerToken(r: ModelResult, key: "decode" | "decodeDeep"): number {
  const context = key === "decode" ? 16 + 64 : 1000 + 16; // mean positions attended
  return r.facts.weightBytes + context * r.facts.kvBytesPerPosition;
}

function table(results: ModelResult[], bandwidthGBs: number | null): string {
  const head = ["model", "quant", "measure", "infer", "llama.cpp", "node-llama-cpp", "infer ÷ llama.cpp",
    "infer ÷ node-llama-cpp", "BW limit t/s", "infer % of limit", "llama.cpp % of limit"];
  const lines = [`| ${head.join(" | ")} |`, `|${head.map((_, i) => (i < 3 ? " --- " : " ---: ")).join("|")}|`];
  for (const r of results) {
    for (const meas of measures) {
      const med = (e: EngineName) => median(r.samples[e][meas.key]);
      const cell = (e: EngineName) => (r.errors[e] && r.samples[e][meas.key].length === 0
        ? short(r.errors[e]!) : fmt(med(e), meas.key));
      const ratio = (peer: EngineName) => {
        const a = med("infer"), b = med(peer);
        return a !== null && b !== null && b > 0 ? `${(a / b).toFixed(2)}×` : "—";
      };
      let limit: number | null = null;
      if (bandwidthGBs !== null && (meas.key === "decode" || meas.key === "decodeDeep")) {
        limit = (bandwidthGBs * 1e9) / bytesPerToken(r, meas.key);
      }
      const pct = (e: EngineName) => {
        const v = med(e);
        return limit !== null && v !== null ? `${((100 * v) / limit).toFixed(0)}%` : "—";
      };
      lines.push(`| ${[r.model.label, r.model.quant, meas.label, cell("infer"), cell("llama.cpp"),
        cell("node-llama-cpp"), ratio("llama.cpp"), ratio("node-llama-cpp"), limit === null ? "—" : limit.toFixed(0),
        pct("infer"), pct("llama.cpp")].join(" | ")} |`);
    }
  }
  return lines.join("\n");
}

/** Each decode run beside the memory bandwidth probed just before it: whether a row's ratio was
 * measured with both engines in the same state of the machine's memory. And infer ÷ llama.cpp
 * round by round: a round's two runs follow each other within seconds, so they meet the same
 * state more often than the medians of all rounds do (the headline ratio stays the medians'). */
function memoryTable(results: ModelResult[]): string {
  const engines: EngineName[] = ["infer", "llama.cpp", "node-llama-cpp"];
  const head = ["model", "quant", "measure", ...engines.map((e) => `${e} runs: t/s @ GB/s (% of that limit)`),
    "infer ÷ llama.cpp by round (median)"];
  const lines = [`| ${head.join(" | ")} |`, `|${head.map(() => " --- ").join("|")}|`];
  for (const r of results) {
    for (const key of ["decode", "decodeDeep"] as const) {
      const bytes = bytesPerToken(r, key);
      const runs = (e: EngineName) => r.samples[e][key].map((t, i) => {
        const gbs = r.memory[e][key][i];
        return gbs === undefined || Number.isNaN(gbs) ? `${fmt(t, key)} @ ?`
          : `${fmt(t, key)} @ ${gbs.toFixed(0)} (${((100 * t * bytes) / (gbs * 1e9)).toFixed(0)}%)`;
      }).join(", ") || "—";
      const label = measures.find((m) => m.key === key)!.label;
      lines.push(`| ${[r.model.label, r.model.quant, label, ...engines.map(runs), pairedRatios(r.samples.infer[key],
        r.samples["llama.cpp"][key])].join(" | ")} |`);
    }
  }
  return lines.join("\n");
}

/** a[i] / b[i] for each round and their median; "—" unless both engines kept every round (a
 * failed run would pair later rounds wrongly). */
export function pairedRatios(a: number[], b: number[]): string {
  if (a.length === 0 || a.length !== b.length) return "—";
  const ratios = a.map((x, i) => x / b[i]);
  return `${ratios.map((q) => q.toFixed(2)).join(", ")} (${median(ratios)!.toFixed(2)}×)`;
}

// ---- main ------------------------------------------------------------------------------------

function pct(v: number | null): string {
  return v === null ? "?" : `${(100 * v).toFixed(0)}%`;
}

function usage(): string {
  return "usage: bun run bench [--models gemma,qwen3-0.6b,llama-3.2-1b] [--quants Q4_0,Q8_0,Q4_K] [--runs N]\n" +
    "                     [--threads N] [--quick] [--engines infer,llama.cpp,node-llama-cpp] [--batch N] [--json FILE]\n" +
    "                     [--max-wait SECONDS (wait for a quiet machine before each run; default 60)]\n" +
    "                     [--max-background 0.15 (redo a run during which others used more of the CPUs)]\n" +
    "                     [--when-fast GB/s [--fast-wait SECONDS] (decode runs wait for that memory bandwidth)]";
}

async function main(): Promise<void> {
  const argv = process.argv.slice(2);
  if (argv.includes("--help") || argv.includes("-h")) {
    console.log(usage());
    return;
  }
  const o = parseOptions(argv);
  const peers = findPeers();
  if (!peers.llamaBench || !peers.nodeLlamaCpp) {
    const missing = [!peers.llamaBench && "llama-bench", !peers.nodeLlamaCpp && "node-llama-cpp (or node)"]
      .filter(Boolean).join(" and ");
    console.error(`bench: ${missing} not found under ${peers.dir} ($INFER_PEERS). Build the peers with\n` +
      "  bash ../shared/tools/build-peer-llama.sh\n" +
      "(about 12 minutes on 2 cores, nothing committed); measuring what is available.");
  }
  if (peers.llamaBench && !peers.llamaCompletion) log("llama-completion not found: no TTFT / peak memory for llama.cpp");
  if (peers.llamaBench && !peers.time) log("/usr/bin/time not found: no peak memory for llama.cpp");
  // One version of infer for the whole run (it takes an hour, and the tree is being worked on):
  // ts/, bench/ and the built libraries are copied aside, node_modules linked.
  const root = join(import.meta.dir, "..");
  const snapshot = mkdtempSync(join(tmpdir(), "infer-bench-snapshot-"));
  process.on("exit", () => rmSync(snapshot, { recursive: true, force: true }));
  for (const part of ["ts", "bench", "zig-out/lib", "package.json", "tsconfig.json"]) {
    if (existsSync(join(root, part))) cpSync(join(root, part), join(snapshot, part), { recursive: true });
  }
  if (existsSync(join(root, "node_modules"))) symlinkSync(join(root, "node_modules"), join(snapshot, "node_modules"));
  setRunnerDir(join(snapshot, "bench"));
  benchDir = join(snapshot, "bench");
  const lib = setting("INFER_LIB") ?? join(snapshot, "zig-out", "lib", libraryPath().split("/").pop()!);
  const libHash = existsSync(lib)
    ? new Bun.CryptoHasher("sha256").update(readFileSync(lib)).digest("hex").slice(0, 12) : "missing";
  const started = new Date();
  const commit = sh(["git", "-C", join(import.meta.dir, ".."), "rev-parse", "HEAD"]) || "unknown";
  const dirty = sh(["git", "-C", join(import.meta.dir, ".."), "status", "--porcelain"]) ? " (+ uncommitted changes)" : "";
  const bwStart = measureBandwidth(join(snapshot, "bench"), o.threads);
  log(`memory read bandwidth, ${o.threads} threads: ${bwStart === null ? "unknown" : `${bwStart.toFixed(1)} GB/s`}`);
  const results: ModelResult[] = [];
  for (const m of benchModels(o)) {
    results.push(await measureModel(o, peers, m));
    // The table so far (stderr), so that an interrupted run of an hour still leaves its figures.
    console.error(`\n${table(results, bwStart)}\n`);
  }
  const bwEnd = measureBandwidth(join(snapshot, "bench"), o.threads);
  const bw = bwStart === null ? bwEnd : bwEnd === null ? bwStart : Math.max(bwStart, bwEnd);
  if (o.json) writeFileSync(o.json, JSON.stringify({ started, commit, threads: o.threads, bandwidth: { bwStart, bwEnd },
    results: results.map((r) => ({ ...r, facts: { ...r.facts, tokens: undefined } })) }, null, 1));

  const out = [
    `Date: ${started.toISOString().slice(0, 16).replace("T", " ")} UTC · CPU: ${cpuModel()}, ${availableParallelism()} cores · ` +
      `threads: ${o.threads} · commit: ${commit}${dirty} · ${lib.split("/").pop()} sha256 ${libHash}`,
    `Command: bun run bench ${argv.join(" ")}`.trim(),
    `Memory read bandwidth (best pass, ${o.threads} threads): ${bwStart?.toFixed(1) ?? "?"} GB/s at the start, ` +
      `${bwEnd?.toFixed(1) ?? "?"} GB/s at the end; the limit uses ${bw?.toFixed(1) ?? "?"} GB/s.`,
    `Runs: ${o.runs} measured${o.warmup ? " after a warm-up round" : ""}, interleaved per measure ` +
      `(${o.engines.join(" → ")}); each cell the median. llama.cpp: llama-bench -r 1 (prefill -p 512 -n 0; ` +
      "decode -p 0 -n 128 -d 16; deep -p 0 -n 32 -d 1000); its TTFT (prompt eval time) and peak RSS from " +
      "llama-completion -c 2048 under /usr/bin/time. infer and node-llama-cpp: context 2048, greedy, same token ids." +
      (o.whenFast === null ? "" : ` Every engine's measured decode runs started once a probe read ≥ ${o.whenFast} GB/s ` +
        `(waiting up to ${o.fastWait} s; the second table has each run's probe), and a run after which a ` +
        "probe read less was redone, twice at most."),
    "",
    table(results, bw),
    "",
    "Decode runs and the memory read bandwidth probed just before each (256 MiB, 4 passes, best; the " +
      "machine's bandwidth changes state within seconds to minutes, and a memory-bound decode follows it), " +
      "and infer ÷ llama.cpp round by round (a round's two runs are seconds apart):",
    "",
    memoryTable(results),
    "",
    "Background load (other processes' CPU and steal during the measured runs, share of all cores; 0% = quiet): " +
      results.map((r) => `${r.model.label} ${r.model.quant} median ${pct(median(r.background))}, ` +
        `max ${pct(r.background.length ? Math.max(...r.background) : null)}` +
        (r.retried ? ` (${r.retried} run${r.retried === 1 ? "" : "s"} redone)` : "")).join(" · ") +
      `. A run above ${pct(o.maxBackground)} is redone, twice at most.`,
  ];
  console.log(out.join("\n"));
}

if (import.meta.main) {
  main().catch((err) => {
    console.error(`bench: ${(err as Error).message}`);
    console.error(usage());
    process.exit(1);
  });
}
