// The engines the bench runs, each as one subprocess per measured run: infer (bench/run-infer.ts),
// llama.cpp's own llama-bench (+ llama-completion under /usr/bin/time for TTFT and peak memory),
// and node-llama-cpp (bench/run-node-llama-cpp.mjs). Every runner returns a RunResult or throws
// with the subprocess's own error line.
import { existsSync, readFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { childEnvironment, setting } from "../ts/config/env.ts";

export type Mode = "prefill" | "decode" | "decode-deep";
export const modes: readonly Mode[] = ["prefill", "decode", "decode-deep"];

export interface Workload {
  readonly model: string;
  readonly tokensFile: string;
  /** The `short` prompt as text, for llama-completion (it takes no token ids). */
  readonly shortText: string;
  readonly threads: number;
  readonly ctx: number;
  readonly prefill: number;
  readonly short: number;
  readonly gen: number;
  readonly deep: number;
  readonly deepGen: number;
}

export interface RunResult {
  readonly tokensPerSec: number | null;
  readonly ttftMs: number | null;
  readonly peakRssKiB: number | null;
  /** Anything worth keeping (prompt token counts, load time). */
  readonly extra?: Record<string, number | string>;
  /** Other processes' CPU (and steal) while the run ran, as a share of all cores: 0 = quiet. */
  readonly background?: number;
}

export interface Peers {
  readonly dir: string;
  readonly llamaBench: string | null;
  readonly llamaCompletion: string | null;
  readonly nodeLlamaCpp: boolean;
  readonly time: string | null;
}

/** Where the runner scripts are: bench/ itself, or the snapshot of the tree the run measures. */
let here = import.meta.dir;
export function setRunnerDir(dir: string): void {
  here = dir;
}

export function findPeers(): Peers {
  const dir = setting("INFER_PEERS");
  const bin = join(dir, "llama.cpp", "build", "bin");
  const exe = (name: string) => (existsSync(join(bin, name)) ? join(bin, name) : null);
  const nodeOk = existsSync(join(dir, "node_modules", "node-llama-cpp", "dist", "index.js")) &&
    Bun.spawnSync(["node", "--version"], { stdout: "ignore", stderr: "ignore" }).exitCode === 0;
  return {
    dir, llamaBench: exe("llama-bench"), llamaCompletion: exe("llama-completion"), nodeLlamaCpp: nodeOk,
    time: existsSync("/usr/bin/time") ? "/usr/bin/time" : null,
  };
}

interface Spawned { code: number; stdout: string; stderr: string; background: number }

/** Busy and steal time of all CPUs so far, seconds (from /proc/stat; null where it is absent). */
function cpuBusySeconds(): number | null {
  try {
    const f = readFileSync("/proc/stat", "utf8").split("\n")[0].trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal
    return (f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] ?? 0)) / 100;
  } catch {
    return null;
  }
}

/** The machine's load from others: busy CPU share over `ms` while we do nothing. */
export async function backgroundLoad(ms = 1000): Promise<number | null> {
  const b0 = cpuBusySeconds(), t0 = performance.now();
  await Bun.sleep(ms);
  const b1 = cpuBusySeconds();
  if (b0 === null || b1 === null) return null;
  return (b1 - b0) / (((performance.now() - t0) / 1000) * availableParallelism());
}

function spawn(cmd: string[], timeoutMs: number, env?: Record<string, string>): Spawned {
  const b0 = cpuBusySeconds(), t0 = performance.now();
  const p = Bun.spawnSync(cmd, { stdout: "pipe", stderr: "pipe", stdin: "ignore", timeout: timeoutMs,
    env: env ? childEnvironment(env) : undefined });
  const wall = (performance.now() - t0) / 1000, b1 = cpuBusySeconds();
  const own = Number(p.resourceUsage?.cpuTime.total ?? 0) / 1e6;
  const background = b0 === null || b1 === null || wall <= 0 ? 0
    : Math.max(0, (b1 - b0 - own) / (wall * availableParallelism()));
  return { code: p.exitCode ?? -1, stdout: p.stdout.toString(), stderr: p.stderr.toString(), background };
}

function lastLine(s: string): string {
  return s.trim().split("\n").filter((l) => l.trim()).slice(-1)[0] ?? "";
}

/** Runs a JSON-line runner (ours); its last stdout line is the result or {"error"}. */
function jsonRunner(cmd: string[], timeoutMs: number, env?: Record<string, string>): RunResult {
  const p = spawn(cmd, timeoutMs, env);
  let parsed: Record<string, unknown> | null = null;
  try {
    parsed = JSON.parse(lastLine(p.stdout)) as Record<string, unknown>;
  } catch {
    // fall through
  }
  if (!parsed) {
    const why = lastLine(p.stderr) || lastLine(p.stdout) || `exit code ${p.code}`;
    throw new Error(p.code === -1 || p.code === null ? `timed out or killed: ${why}` : why);
  }
  if (typeof parsed.error === "string") throw new Error(parsed.error);
  const num = (k: string) => (typeof parsed![k] === "number" ? (parsed![k] as number) : null);
  return {
    tokensPerSec: num("tokensPerSec"), ttftMs: num("ttftMs"), peakRssKiB: num("peakRssKiB"),
    extra: { loadMs: num("loadMs") ?? 0, ...(num("cpuMs") !== null ? { cpuMs: num("cpuMs")! } : {}) },
    background: p.background,
  };
}

function common(w: Workload): string[] {
  return ["--model", w.model, "--tokens", w.tokensFile, "--threads", String(w.threads), "--ctx", String(w.ctx),
    "--gen", String(w.gen), "--deep-gen", String(w.deepGen)];
}

/** `args`: more of run-infer.ts's options (--cache-type-k, --depth); `env`: more environment (INFER_LIB). */
export function runInfer(w: Workload, mode: Mode, timeoutMs: number, batch?: number, args: readonly string[] = [],
  env?: Record<string, string>): RunResult {
  const cmd = [process.execPath, join(here, "run-infer.ts"), "--mode", mode, ...common(w), ...args];
  if (batch) cmd.push("--batch", String(batch));
  return jsonRunner(cmd, timeoutMs, env);
}

export function runNodeLlamaCpp(peers: Peers, w: Workload, mode: Mode, timeoutMs: number): RunResult {
  return jsonRunner(["node", join(here, "run-node-llama-cpp.mjs"), "--peers", peers.dir, "--mode", mode,
    ...common(w)], timeoutMs);
}

/**
 * llama-bench, one repetition (it warms up itself): -p 512 -n 0; -p 0 -n 128 -d 16; -p 0 -n 32 -d 1000.
 * `args`: more of its options (-fa 1 -ctk q4_0 -ctv q4_0).
 */
export function runLlamaBench(peers: Peers, w: Workload, mode: Mode, timeoutMs: number,
  args: readonly string[] = []): RunResult {
  const test = mode === "prefill" ? ["-p", String(w.prefill), "-n", "0"]
    : mode === "decode" ? ["-p", "0", "-n", String(w.gen), "-d", String(w.short)]
    : ["-p", "0", "-n", String(w.deepGen), "-d", String(w.deep)];
  const p = spawn([peers.llamaBench!, "-m", w.model, "-t", String(w.threads), "-r", "1", "-o", "json", ...test,
    ...args],
    timeoutMs);
  if (p.code !== 0) throw new Error(lastLine(p.stderr) || `llama-bench exit code ${p.code}`);
  const rows = JSON.parse(p.stdout) as { avg_ts: number }[];
  if (rows.length !== 1) throw new Error(`llama-bench printed ${rows.length} results`);
  return { tokensPerSec: rows[0].avg_ts, ttftMs: null, peakRssKiB: null, background: p.background };
}

/**
 * llama-completion on the short prompt (its own warm-up on), greedy, --ignore-eos, `gen` tokens,
 * under /usr/bin/time: TTFT = its "prompt eval time", peak memory = time's maximum RSS.
 */
export function runLlamaCompletion(peers: Peers, w: Workload, timeoutMs: number): RunResult {
  const cmd = [peers.llamaCompletion!, "-m", w.model, "-t", String(w.threads), "-c", String(w.ctx),
    "-p", w.shortText, "-n", String(w.gen), "--ignore-eos", "--temp", "0", "-no-cnv", "--no-display-prompt"];
  const p = spawn(peers.time ? [peers.time, "-f", "INFER_BENCH_MAXRSS_KIB %M", ...cmd] : cmd, timeoutMs);
  if (p.code !== 0) throw new Error(lastLine(p.stderr) || `llama-completion exit code ${p.code}`);
  const prompt = /prompt eval time =\s*([\d.]+) ms \/\s*(\d+) tokens/.exec(p.stderr);
  const evalRate = /\beval time =\s*[\d.]+ ms \/\s*\d+ runs\s*\(\s*[\d.]+ ms per token,\s*([\d.]+) tokens per second/
    .exec(p.stderr);
  const rss = /INFER_BENCH_MAXRSS_KIB (\d+)/.exec(p.stderr);
  return {
    tokensPerSec: null,
    ttftMs: prompt ? Number(prompt[1]) : null,
    peakRssKiB: rss ? Number(rss[1]) : null,
    extra: { promptTokens: prompt ? Number(prompt[2]) : 0, decodeTokensPerSec: evalRate ? Number(evalRate[1]) : 0 },
    background: p.background,
  };
}
