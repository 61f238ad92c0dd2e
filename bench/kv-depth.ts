// Decode at depth through each KV cache type, infer against llama.cpp's llama-bench: for each model
// and depth, `--gen` single-token steps after `depth` tokens of context, each run its own process
// (bench/run-infer.ts --mode decode-deep --depth D --cache-type-k T --cache-type-v T; llama-bench
// -p 0 -n 32 -d D -fa 1 -ctk T -ctv T -r 1). Rounds interleave the engines and the types (round r:
// for each type, infer then llama.cpp), so a busy machine slows them alike; each cell is the median
// of the rounds, and infer ÷ llama.cpp is the median of each round's ratio (its two runs follow
// each other). tq4 and tq3 are infer's own types (llama.cpp has none). infer's CPU ms a token is
// the process's CPU time over the timed steps (all threads): on a shared machine the steadier
// figure. The machine is shared: before each run the script waits (up to --max-wait s) for other
// processes to use under --max-background of the CPUs over 2 s, and redoes (four times at most) a
// run during which they used more; a row's "background" is the median over its runs.
// llama.cpp's OpenMP threads spin at their barriers, so one core taken by another process slows
// its 2-thread decode some 10x (infer's threads sleep), which is what the waiting is for.
//   bun bench/kv-depth.ts [--plan gemma@4096,gemma@16384,qwen3-0.6b@4096] [--types f16,q8_0,q4_0,tq4,tq3]
//                         [--rounds 3] [--threads 2] [--gen 32] [--json FILE] [--max-wait 900]
//                         [--max-background 0.15] [--engines infer,llama.cpp] [--libs LABEL=PATH,...]
//                         [--llama-types f16,q8_0,q4_0]
// --llama-types: the types llama-bench runs (its prefill at depth through a q8_0/q4_0 cache takes
// its one-query-row flash-attention path, minutes at 16k tokens on 2 cores).
// --libs: infer once with each of these libinfer builds (INFER_LIB) in every round, for a kernel's
// before and after in the same rounds; a type's llama.cpp runs are shared by its rows.
// Models: gemma (the default model) and qwen3-0.6b (bench/random-model.ts's Q4_0 of that shape).
// Peers: $INFER_PEERS/llama.cpp/build/bin/llama-bench.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openGguf } from "../ts/gguf/reader.ts";
import { defaultModelPath } from "../ts/models/cache.ts";
import { tokenizerFromMetadata } from "../ts/tokenizer/index.ts";
import { median } from "./index.ts";
import { backgroundLoad, findPeers, runInfer, runLlamaBench, type RunResult, type Workload } from "./peers.ts";
import { ensureRandomModel, randomShapes } from "./random-model.ts";

const LLAMA_TYPES = new Set(["f16", "q8_0", "q4_0"]);
const TEXT = "The old lighthouse keeper climbed the spiral stairs every evening, counting each of the " +
  "two hundred steps, and when he reached the lamp room he wiped the salt from the glass. ";

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

function log(s: string): void {
  console.error(`[kv-depth ${new Date().toISOString().slice(11, 19)}] ${s}`);
}

function modelPath(key: string): { label: string; path: string } {
  if (key === "gemma") return { label: "Gemma 3 270M Q4_K_M", path: defaultModelPath() };
  const shape = randomShapes.find((s) => s.key === key);
  if (!shape) throw new Error(`unknown model ${key} (gemma, ${randomShapes.map((s) => s.key).join(", ")})`);
  return { label: `${shape.label} Q4_0 (random)`, path: ensureRandomModel(shape, "Q4_0") };
}

/** A 1,000-token prompt of the model's own tokens (run-infer repeats it to the depth). */
function tokensFile(dir: string, path: string): string {
  const file = openGguf(path);
  try {
    const tok = tokenizerFromMetadata(file.metadata);
    let text = TEXT, ids = tok.encode(text, { addSpecial: true, parseSpecial: false });
    while (ids.length < 1000) ids = tok.encode(text += TEXT, { addSpecial: true, parseSpecial: false });
    const out = join(dir, `${path.replace(/\W/g, "_")}.json`);
    writeFileSync(out, JSON.stringify({ prefill: [], short: [], deep: ids.slice(0, 1000) }));
    return out;
  } finally {
    file.close();
  }
}

interface Cell {
  readonly model: string;
  readonly depth: number;
  readonly type: string;
  /** --libs: the label of the library infer ran with ("" = the tree's own). */
  readonly lib: string;
  readonly infer: (RunResult | string)[];
  readonly llama: (RunResult | string)[];
}

const tps = (runs: (RunResult | string)[]) => runs.flatMap((r) => (typeof r === "string" ? [] : [r.tokensPerSec!]));

function row(c: Cell, gen: number): string {
  const f = (v: number | null, digits = 1) => (v === null ? "—" : v.toFixed(digits));
  const infer = tps(c.infer), llama = tps(c.llama);
  const cpu = c.infer.flatMap((r) => (typeof r === "string" ? [] : [Number(r.extra?.cpuMs) / gen]));
  const ratios = c.infer.flatMap((r, i) => {
    const l = c.llama[i];
    return typeof r === "string" || l === undefined || typeof l === "string" ? [] : [r.tokensPerSec! / l.tokensPerSec!];
  });
  const bg = [...c.infer, ...c.llama].flatMap((r) => (typeof r === "string" ? [] : [r.background ?? 0]));
  const err = [...c.infer, ...c.llama].find((r) => typeof r === "string") as string | undefined;
  const llamaCell = !LLAMA_TYPES.has(c.type) ? "(none)" : llama.length ? f(median(llama)) : "—";
  return `| ${[c.model, c.depth.toLocaleString("en-US"), c.lib ? `${c.type}, ${c.lib}` : c.type, `${f(median(infer))} (${infer.map((x) => f(x)).join(", ")})`,
    f(median(cpu)), llama.length ? `${llamaCell} (${llama.map((x) => f(x)).join(", ")})` : llamaCell,
    ratios.length ? `${f(median(ratios), 2)}×` : "—", `${f(100 * (median(bg) ?? 0), 0)}%`].join(" | ")} |` +
    (err ? ` ✗ ${err.slice(0, 80)}` : "");
}

/** Waits (up to maxWait s) until other processes use under `share` of the machine over 2 s. */
async function waitQuiet(maxWait: number, share: number): Promise<void> {
  const t0 = performance.now();
  let load = await backgroundLoad(2000);
  while (load !== null && load > share && performance.now() - t0 < maxWait * 1000) load = await backgroundLoad(2000);
}

async function main(): Promise<void> {
  const plan = arg("--plan", "gemma@4096,gemma@16384,qwen3-0.6b@4096").split(",").map((p) => {
    const [model, depth] = p.split("@");
    if (!model || !/^\d+$/.test(depth ?? "")) throw new Error(`--plan entries are MODEL@DEPTH, got ${p}`);
    return { model, depth: Number(depth) };
  });
  const types = arg("--types", "f16,q8_0,q4_0,tq4,tq3").split(",");
  const rounds = Number(arg("--rounds", "3")), threads = Number(arg("--threads", "2"));
  const gen = Number(arg("--gen", "32")), json = arg("--json", "");
  const maxWait = Number(arg("--max-wait", "900")), maxBackground = Number(arg("--max-background", "0.15"));
  const libs = arg("--libs", "").split(",").filter(Boolean).map((l) => {
    const at = l.indexOf("=");
    if (at <= 0) throw new Error(`--libs entries are LABEL=PATH, got ${l}`);
    return { label: l.slice(0, at), path: l.slice(at + 1) };
  });
  const withLlama = arg("--engines", "infer,llama.cpp").split(",").includes("llama.cpp");
  const llamaTypes = new Set(arg("--llama-types", [...LLAMA_TYPES].join(",")).split(","));
  const peers = findPeers();
  if (withLlama && !peers.llamaBench) {
    throw new Error(`no llama-bench under ${peers.dir}/llama.cpp/build/bin ($INFER_PEERS)`);
  }
  const dir = mkdtempSync(join(tmpdir(), "infer-kv-depth-"));
  const cells: Cell[] = [];
  const head = ["model", "depth", "K and V", "infer t/s (rounds)", "infer CPU ms/token", "llama.cpp t/s (rounds)",
    "infer ÷ llama.cpp", "background"];
  const lines = [`| ${head.join(" | ")} |`, `|${head.map((_, i) => (i < 3 ? " --- " : " ---: ")).join("|")}|`];
  try {
    for (const { model, depth } of plan) {
      const m = modelPath(model);
      const w: Workload = { model: m.path, tokensFile: tokensFile(dir, m.path), shortText: "", threads,
        ctx: depth + 64, prefill: 0, short: 0, gen, deep: depth, deepGen: gen };
      // One cell a type and library; a type's cells share its llama.cpp runs.
      const group = types.flatMap((type): Cell[] => {
        const llama: (RunResult | string)[] = [];
        return (libs.length ? libs : [{ label: "", path: "" }])
          .map((lib) => ({ model: m.label, depth, type, lib: lib.label, infer: [], llama }));
      });
      for (let r = 0; r < rounds; r++) {
        for (const c of group) {
          const t = c.type, timeout = 20 * 60 * 1000;
          const lib = libs.find((l) => l.label === c.lib);
          const attempt = async (f: () => RunResult) => {
            let out: RunResult | string = "";
            for (let tries = 0; tries < 5; tries++) {
              await waitQuiet(maxWait, maxBackground);
              try {
                out = f();
              } catch (e) {
                return (e as Error).message.split("\n")[0];
              }
              if ((out.background ?? 0) <= maxBackground) break;
              log(`background ${(100 * out.background!).toFixed(0)}%: again`);
            }
            return out;
          };
          const a = await attempt(() => runInfer(w, "decode-deep", timeout, undefined,
            ["--depth", String(depth), "--cache-type-k", t, "--cache-type-v", t], lib ? { INFER_LIB: lib.path } : undefined));
          c.infer.push(a);
          log(`${model} @${depth} ${t}${lib ? ` ${lib.label}` : ""} round ${r + 1}: ` +
            `infer ${typeof a === "string" ? a : a.tokensPerSec!.toFixed(1)}`);
          const firstOfType = group.find((g) => g.type === t) === c;
          if (!withLlama || !LLAMA_TYPES.has(t) || !llamaTypes.has(t) || !firstOfType) continue;
          const b = await attempt(() => runLlamaBench(peers, w, "decode-deep", timeout, ["-fa", "1", "-ctk", t, "-ctv", t]));
          c.llama.push(b);
          log(`${model} @${depth} ${t} round ${r + 1}: llama.cpp ${typeof b === "string" ? b : b.tokensPerSec!.toFixed(1)}`);
        }
      }
      cells.push(...group);
      lines.push(...group.map((c) => row(c, gen)));
      console.error(lines.join("\n"));
      if (json) writeFileSync(json, JSON.stringify(cells, null, 1));
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  console.log(lines.join("\n"));
}

if (import.meta.main) await main();
