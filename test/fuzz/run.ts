// The GGUF fuzzer: mutations of small valid models of every architecture and weight type
// (seeds.ts, mutate.ts), each through the real loader and one generated token in child
// processes (worker.ts) under an address-space limit and a wall-clock limit per case. A case is
// fine when it generates its token or ends in an InferError whose message is one bounded line;
// any other exception (a stack trace), a message that is not one bounded line, a child killed
// by a signal or that exits on its own, or a case that hangs, is a failure, and its file is
// kept. A run is repeatable: case i of seed s is always the same file.
//   bun test/fuzz/run.ts --seed 1 --cases 3000 [--jobs 2] [--lib path/libinfer.so] [--out DIR]
//     [--timeout-s 30] [--memory-gib 4] [--chunk 500]
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { quote } from "../../ts/errors.ts";
import { fuzzCase } from "./mutate.ts";
import { isBoundedLine, type Outcome } from "./worker.ts";

export { isBoundedLine, MESSAGE_BYTES_MAX } from "./worker.ts";


export interface FuzzOptions {
  readonly seed: number;
  readonly cases: number;
  /** Child processes at once. */
  readonly jobs?: number;
  /** libinfer to load (INFER_LIB), e.g. a ReleaseSafe build. */
  readonly lib?: string;
  /** Where failing cases' files go (default: a new directory under the system's tmp). */
  readonly out?: string;
  readonly timeoutS?: number;
  readonly memoryGiB?: number;
  /** Cases per child process. */
  readonly chunk?: number;
  readonly onProgress?: (done: number, total: number) => void;
}

export type FailureKind = "stack" | "message" | "signal" | "exit" | "hang";

export interface Failure {
  readonly i: number;
  readonly kind: FailureKind;
  readonly detail: string;
  readonly file: string;
}

export interface FuzzReport {
  readonly cases: number;
  readonly ok: number;
  readonly errors: Record<string, number>;
  readonly failures: Failure[];
  readonly longest: string;
  readonly seconds: number;
  readonly out: string;
}

interface Chunk { from: number; to: number }

export async function runFuzz(o: FuzzOptions): Promise<FuzzReport> {
  const t0 = performance.now();
  const out = o.out ?? mkdtempSync(join(tmpdir(), `infer-fuzz-${o.seed}-`));
  mkdirSync(out, { recursive: true });
  const scratch = mkdtempSync(join(tmpdir(), "infer-fuzz-cases-"));
  const chunkSize = o.chunk ?? 500;
  const queue: Chunk[] = [];
  for (let from = 0; from < o.cases; from += chunkSize) {
    queue.push({ from, to: Math.min(o.cases, from + chunkSize) });
  }
  let ok = 0, done = 0, longest = "";
  const errors: Record<string, number> = {};
  const failures: Failure[] = [];

  const fail = (i: number, kind: FailureKind, detail: string) => {
    const file = join(out, `${kind}-seed${o.seed}-case${i}.gguf`);
    let about: string[];
    try {
      const c = fuzzCase(o.seed, i);
      writeFileSync(file, c.bytes);
      about = [`seed model: ${c.seed}`, ...c.mutations.map((m) => `mutation: ${m}`),
        `prompt: ${JSON.stringify(c.prompt)} greedy: ${c.greedy} context: ${c.contextLength}`];
    } catch (err) { // the fuzzer's own bug: the case cannot be made
      about = [`the case cannot be made: ${(err as Error).stack}`];
    }
    writeFileSync(`${file}.txt`, [...about, "", detail].join("\n"));
    failures.push({ i, kind, detail: detail.slice(0, 2000), file });
  };
  const record = (r: Outcome) => {
    done++;
    o.onProgress?.(done, o.cases);
    if (r.outcome === "ok") ok++;
    else if (r.outcome === "stack") fail(r.i, "stack", r.stack || r.message);
    else {
      if (!isBoundedLine(r.message)) fail(r.i, "message", r.message.slice(0, 2000));
      else errors[r.code] = (errors[r.code] ?? 0) + 1;
      if (Buffer.byteLength(r.message) > Buffer.byteLength(longest)) longest = r.message;
    }
  };

  const env = { ...process.env, ...(o.lib ? { INFER_LIB: o.lib } : {}) };
  const limit = Math.round((o.memoryGiB ?? 4) * 2 ** 30);
  const timeoutMs = (o.timeoutS ?? 30) * 1000;

  /** Runs a chunk in a child; a case that kills or hangs it is recorded, the rest re-queued. */
  const runChunk = async (chunk: Chunk): Promise<void> => {
    const child = Bun.spawn(["prlimit", `--as=${limit}`, process.execPath,
      join(import.meta.dir, "worker.ts"), "--seed", String(o.seed), "--from", String(chunk.from),
      "--to", String(chunk.to), "--dir", scratch], { env, stdout: "pipe", stderr: "pipe" });
    let current = -1, lastStart = performance.now(), hung = false;
    const watchdog = setInterval(() => {
      if (current >= 0 && performance.now() - lastStart > timeoutMs) {
        hung = true;
        child.kill("SIGKILL");
      }
    }, 250);
    const stderr = new Response(child.stderr).text();
    let buffered = "";
    const decoder = new TextDecoder();
    for await (const piece of child.stdout) {
      buffered += decoder.decode(piece, { stream: true });
      let nl: number;
      while ((nl = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        const msg = JSON.parse(line) as { start: number } | Outcome;
        if ("start" in msg) {
          current = msg.start;
          lastStart = performance.now();
        } else {
          record(msg);
          current = -1;
        }
      }
    }
    const code = await child.exited;
    clearInterval(watchdog);
    if (current < 0) {
      if (code !== 0) {
        fail(chunk.from, "exit", `the child exited ${code} between cases:\n${await stderr}`);
      }
      return;
    }
    // The case that was running killed the child or hung: record it, go on after it.
    const tail = (await stderr).slice(-4000);
    const kind: FailureKind = hung ? "hang" : child.signalCode ? "signal" : "exit";
    done++;
    o.onProgress?.(done, o.cases);
    fail(current, kind, `${hung ? `no outcome after ${timeoutMs / 1000} s` : `child ended: ` +
      `${child.signalCode ?? `exit ${code}`}`}\n${tail}`);
    if (current + 1 < chunk.to) queue.unshift({ from: current + 1, to: chunk.to });
  };

  const jobs = Math.max(1, o.jobs ?? 1);
  await Promise.all(Array.from({ length: jobs }, async () => {
    for (let chunk = queue.shift(); chunk; chunk = queue.shift()) await runChunk(chunk);
  }));
  rmSync(scratch, { recursive: true, force: true });
  if (failures.length === 0 && o.out === undefined) rmSync(out, { recursive: true, force: true });
  const seconds = (performance.now() - t0) / 1000;
  return { cases: o.cases, ok, errors, failures, longest, seconds, out };
}

export function formatReport(r: FuzzReport): string {
  const count = (k: FailureKind) => r.failures.filter((f) => f.kind === k).length;
  const clean = Object.values(r.errors).reduce((a, b) => a + b, 0);
  const byCode = Object.entries(r.errors).sort((a, b) => b[1] - a[1])
    .map(([code, n]) => `${code} ${n}`).join(", ");
  const rows: [string, string][] = [
    ["cases", String(r.cases)],
    ["generated a token", String(r.ok)],
    ["clean errors (InferError, one line)", `${clean} (${byCode})`],
    ["stack traces (other exceptions)", String(count("stack"))],
    ["messages not one bounded line", String(count("message"))],
    ["signals", String(count("signal"))],
    ["other exits", String(count("exit"))],
    ["hangs", String(count("hang"))],
    ["longest message", `${Buffer.byteLength(r.longest)} bytes`],
    ["time", `${r.seconds.toFixed(0)} s (${(r.cases / r.seconds).toFixed(1)} cases/s)`],
  ];
  const width = Math.max(...rows.map(([k]) => k.length));
  const lines = rows.map(([k, v]) => `| ${k.padEnd(width)} | ${v} |`);
  for (const f of r.failures.slice(0, 20)) {
    lines.push(`${f.kind} at case ${f.i}: ${quote(f.detail.split("\n")[0], 160)} (${f.file})`);
  }
  lines.push(`longest message: ${quote(r.longest, 400)}`);
  return lines.join("\n");
}

if (import.meta.main) {
  const { values } = parseArgs({ options: {
    seed: { type: "string", default: "1" }, cases: { type: "string", default: "1000" },
    jobs: { type: "string", default: "1" }, lib: { type: "string" }, out: { type: "string" },
    "timeout-s": { type: "string", default: "30" }, "memory-gib": { type: "string", default: "4" },
    chunk: { type: "string", default: "500" },
  } });
  const cases = Number(values.cases);
  // This process writes the files of failing cases, whose seeds the library quantizes.
  if (values.lib) process.env.INFER_LIB = values.lib;
  let last = 0;
  const report = await runFuzz({
    seed: Number(values.seed), cases, jobs: Number(values.jobs), lib: values.lib, out: values.out,
    timeoutS: Number(values["timeout-s"]), memoryGiB: Number(values["memory-gib"]),
    chunk: Number(values.chunk),
    onProgress: (done) => {
      if (done - last >= 1000 || done === cases) {
        last = done;
        process.stderr.write(`fuzz: ${done}/${cases}\n`);
      }
    },
  });
  console.log(formatReport(report));
  console.log(`failing cases kept in ${report.out}`);
  process.exit(report.failures.length === 0 ? 0 : 1);
}
