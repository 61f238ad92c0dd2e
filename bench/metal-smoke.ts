// `bun run smoke:metal`: the first run of the Metal backend on an Apple-silicon Mac, in one command
// whose report can be pasted into an issue. It builds the native library if it is missing, then in
// a child process with Apple's Metal validation on (MTL_DEBUG_LAYER, MTL_SHADER_VALIDATION: any
// misuse of the API or an out-of-bounds shader access is reported on stderr), it
//   1. opens the Metal device and prints its name and limits (or why there is none);
//   2. runs the golden prompts (test/fixtures/gemma3-golden.json, llama.cpp's greedy tokens) on the
//      default model with --backend metal and with --backend cpu, and compares both with llama.cpp;
//   3. times prefill and decode on Metal and on the CPU, and llama.cpp's llama-bench (its Metal
//      build) on the same GGUF when one is on PATH (`brew install llama.cpp`);
// and writes metal-smoke-report.md (or --out FILE) with all of it, the child's stderr included.
//   bun run smoke:metal [--cases N] [--out FILE] [--model PATH]
// On a machine without Metal it still runs (the report says why Metal is not there, and the CPU
// half is checked), which is how CI keeps it working.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { arch, cpus, platform, release, totalmem } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { childEnvironment } from "../ts/config/env.ts";

const root = join(import.meta.dir, "..");
const { values } = parseArgs({ options: {
  cases: { type: "string", default: "12" }, out: { type: "string", default: "metal-smoke-report.md" },
  model: { type: "string" }, inner: { type: "boolean", default: false },
} });

// The reference is llama.cpp's token_by_token variant (flash attention off, one token a step), as
// in test/golden-llama.test.ts: the arithmetic infer reproduces exactly.
interface GoldenCase { name: string; prompt_tokens: number[]; token_by_token: { generated_tokens: number[] } }
interface BackendRun { tokens: number[][]; prefillTps: number; decodeTps: number; error?: string }
interface InnerResult {
  device: { name: string; limits: Record<string, number | boolean> } | { error: string };
  cases: string[];
  golden: number[][];
  runs: Record<"metal" | "cpu", BackendRun>;
}

if (values.inner) {
  process.stdout.write(JSON.stringify(await inner()) + "\n");
  process.exit(0);
}

/** The child: everything that touches Metal, so that validation covers all of it. */
async function inner(): Promise<InnerResult> {
  const { loadModel } = await import("../ts/api/index.ts");
  const { ensureModel } = await import("../ts/models/fetch.ts");
  const { createBackend } = await import("../ts/backend/select.ts");
  const { metalDeviceLimits, metalDeviceName } = await import("../ts/native/metal.ts");
  let device: InnerResult["device"];
  try {
    const backend = createBackend("metal");
    device = { name: metalDeviceName(), limits: { ...metalDeviceLimits() } };
    backend.dispose?.();
  } catch (err) {
    device = { error: (err as Error).message };
  }
  const golden = JSON.parse(readFileSync(join(root, "test/fixtures/gemma3-golden.json"), "utf8"));
  const cases: GoldenCase[] = golden.cases.slice(0, Number(values.cases));
  const path = await ensureModel(values.model);
  const runs = {} as InnerResult["runs"];
  for (const backend of ["metal", "cpu"] as const) {
    const run: BackendRun = { tokens: [], prefillTps: 0, decodeTps: 0 };
    runs[backend] = run;
    if (backend === "metal" && "error" in device) {
      run.error = device.error;
      continue;
    }
    try {
      await using model = await loadModel(path, { backend, parallel: 1, prefixCacheBytes: 0 });
      for (const c of cases) {
        const r = await model.complete(c.prompt_tokens, { maxTokens: c.token_by_token.generated_tokens.length,
          temperature: 0, ignoreEos: true });
        run.tokens.push([...r.tokens]);
      }
      // prefill: a 512-token prompt; decode: 128 tokens after it
      const long = Array.from({ length: 512 }, (_, i) => cases[0].prompt_tokens[i % cases[0].prompt_tokens.length]);
      const timed = await model.complete(long, { maxTokens: 128, temperature: 0, ignoreEos: true });
      run.prefillTps = timed.timings.promptEvaluated / (timed.timings.promptMs / 1000);
      run.decodeTps = timed.timings.tokensPerSecond;
    } catch (err) {
      run.error = (err as Error).message;
    }
  }
  return { device, cases: cases.map((c) => c.name), golden: cases.map((c) => c.token_by_token.generated_tokens), runs };
}

function sh(cmd: string[]): string {
  const p = Bun.spawnSync(cmd, { stdout: "pipe", stderr: "pipe" });
  return p.exitCode === 0 ? p.stdout.toString().trim() : `(${cmd[0]} failed: exit ${p.exitCode})`;
}

const agreeing = (a: readonly number[], b: readonly number[]) => {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n++;
  return n;
};

const report: string[] = ["# infer Metal smoke report", ""];
report.push(`- machine: ${platform()} ${release()} ${arch()}, ${cpus()[0]?.model ?? "?"}, ` +
  `${cpus().length} cores, ${(totalmem() / 2 ** 30).toFixed(0)} GiB`);
if (platform() === "darwin") report.push(`- macOS: ${sh(["sw_vers", "-productVersion"])}`);
report.push(`- bun ${Bun.version}, infer ${JSON.parse(readFileSync(join(root, "package.json"), "utf8")).version}`);

if (!existsSync(join(root, "zig-out", "lib"))) {
  console.error("building the native library (bun run build:lib) ...");
  const b = Bun.spawnSync([process.execPath, "run", "build:lib"], { cwd: root, stdout: "inherit", stderr: "inherit" });
  if (b.exitCode !== 0) {
    console.error("the native library did not build; the output above says why");
    process.exit(1);
  }
}

console.error("running the golden prompts on Metal and on the CPU, with Metal validation on ...");
const child = Bun.spawnSync([process.execPath, import.meta.path, "--inner", "--cases", values.cases!,
  ...(values.model ? ["--model", values.model] : [])], {
  cwd: root, stdout: "pipe", stderr: "pipe",
  env: childEnvironment({ MTL_DEBUG_LAYER: "1", MTL_SHADER_VALIDATION: "1" }),
});
const stderr = child.stderr.toString();
const line = child.stdout.toString().trim().split("\n").pop() ?? "";
let result: InnerResult | null = null;
try {
  result = JSON.parse(line);
} catch {
  report.push("", `**The run did not finish** (exit ${child.exitCode}).`);
}
let failed = result === null;
if (result) {
  report.push("", "## Device", "");
  if ("error" in result.device) report.push(result.device.error);
  else {
    report.push(`${result.device.name}`, "");
    for (const [k, v] of Object.entries(result.device.limits)) report.push(`- ${k}: ${v}`);
  }
  report.push("", "## Golden prompts (greedy tokens that agree, of those llama.cpp gave)", "",
    "| case | metal vs llama.cpp | cpu vs llama.cpp | metal vs cpu |", "|---|---|---|---|");
  const { metal, cpu } = result.runs;
  result.cases.forEach((name, i) => {
    const want = result!.golden[i], m = metal.tokens[i], c = cpu.tokens[i];
    const cell = (a?: number[], b?: number[]) => (a && b ? `${agreeing(a, b)}/${b.length}` : "-");
    report.push(`| ${name} | ${cell(m, want)} | ${cell(c, want)} | ${cell(m, c)} |`);
    if (m && c && agreeing(m, c) !== c.length) failed = true;
  });
  for (const [name, run] of Object.entries(result.runs)) {
    if (run.error) report.push("", `${name}: ${run.error}`);
  }
  if (metal.error) failed = true;
  report.push("", "## Speed (default model; 512-token prompt, then 128 tokens)", "",
    "| backend | prefill tok/s | decode tok/s |", "|---|---|---|");
  for (const [name, run] of Object.entries(result.runs)) {
    if (!run.error) report.push(`| ${name} | ${run.prefillTps.toFixed(1)} | ${run.decodeTps.toFixed(1)} |`);
  }
}
const llamaBench = Bun.which("llama-bench");
if (llamaBench && result && !("error" in result.device)) {
  const { ensureModel } = await import("../ts/models/fetch.ts");
  const out = sh([llamaBench, "-m", await ensureModel(values.model), "-p", "512", "-n", "128", "-o", "md"]);
  report.push("", "## llama.cpp (llama-bench on PATH, same GGUF)", "", out);
}
report.push("", "## Metal validation and other stderr of the run", "", "```",
  stderr.trim().split("\n").slice(-60).join("\n") || "(none)", "```");
writeFileSync(values.out!, report.join("\n") + "\n");
const verdict = result === null ? "the run failed" : "error" in result.device
  ? "no Metal device here (the CPU half was checked)" : failed ? "problems found" : "Metal and the CPU agree";
console.error(`${verdict}; report: ${values.out}`);
// no Metal (another OS) is not a failure of the smoke run; a Metal that disagrees is
process.exit(result === null || (failed && !("error" in result.device)) ? 1 : 0);
