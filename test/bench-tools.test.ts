// Pieces of the bench scripts that CI can check without running them: the parser of an ncu log
// (bench/cuda-kernel-times.ts, which needs a GPU), the CPU bench's round-by-round ratios, and the
// Metal smoke script's run where there is no Metal.
import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { csvFields, lastStep } from "../bench/cuda-kernel-times.ts";
import { pairedRatios } from "../bench/index.ts";
import { deepPrompt } from "../bench/run-infer.ts";
import { defaultModelPath } from "../ts/models/cache.ts";

const HEAD = '"ID","Kernel Name","Grid Size","Metric Name","Metric Unit","Metric Value"';
const row = (id: number, kernel: string, grid: string, ns: string, metric = "gpu__time_duration.sum") =>
  `"${id}","${kernel}","${grid}","${metric}","ns","${ns}"`;

describe("ncu CSV of bench/cuda-kernel-times.ts", () => {
  test("fields keep quoted commas", () => {
    expect(csvFields('"1","a, b","3,791,680"')).toEqual(["1", "a, b", "3,791,680"]);
  });

  test("the last step from its embedding lookup on, summed by kernel and grid", () => {
    const csv = ["==PROF== Connected to process 1", HEAD,
      row(0, "repack_q4_k", "(16, 1, 1)", "3,791,680"),
      row(1, "get_rows_q4_kr", "(1, 1, 1)", "6,000"), row(2, "matvec", "(8, 1, 1)", "10,000"),
      row(3, "get_rows_q4_kr", "(1, 1, 1)", "6,500"), row(4, "matvec", "(8, 1, 1)", "12,000"),
      row(5, "matvec", "(8, 1, 1)", "14,000"), row(6, "matvec", "(4, 1, 1)", "1,500"),
      row(7, "matvec", "(4, 1, 1)", "99", "sm__cycles_elapsed.avg")].join("\n");
    expect(lastStep(csv)).toEqual([
      { kernel: "get_rows_q4_kr", grid: "(1, 1, 1)", launches: 1, totalUs: 6.5 },
      { kernel: "matvec", grid: "(8, 1, 1)", launches: 2, totalUs: 26 },
      { kernel: "matvec", grid: "(4, 1, 1)", launches: 1, totalUs: 1.5 },
    ]);
  });

  test("a log without rows or without a step says so", () => {
    expect(() => lastStep("==ERROR== The application returned an error code (1).")).toThrow("no ncu rows");
    expect(() => lastStep([HEAD, row(0, "matvec", "(8, 1, 1)", "1")].join("\n"))).toThrow("no embedding lookup");
  });
});

describe("bun run bench: infer ÷ llama.cpp by round", () => {
  test("each round's ratio and their median", () => {
    expect(pairedRatios([120, 90, 100], [80, 90, 50])).toBe("1.50, 1.00, 2.00 (1.50×)");
    expect(pairedRatios([30, 20], [10, 20])).toBe("3.00, 1.00 (2.00×)");
  });

  test("no pairing when a run is missing or there are none", () => {
    expect(pairedRatios([1, 2, 3], [1, 2])).toBe("—");
    expect(pairedRatios([], [])).toBe("—");
  });
});

describe("bench/run-infer.ts --depth and --cache-type-k", () => {
  test("the deep prompt: as given, or repeated to the depth", () => {
    expect(deepPrompt([5, 6, 7], 0)).toEqual([5, 6, 7]);
    expect(deepPrompt([5, 6, 7], 8)).toEqual([5, 6, 7, 5, 6, 7, 5, 6]);
    expect(deepPrompt([5, 6, 7], 2)).toEqual([5, 6]);
    expect(() => deepPrompt([5], -1)).toThrow("--depth");
    expect(() => deepPrompt([], 4)).toThrow("non-empty");
  });

  test("an unknown cache type is one JSON error line and exit code 1", () => {
    const dir = mkdtempSync(join(tmpdir(), "infer-run-infer-"));
    const tokens = join(dir, "tokens.json");
    writeFileSync(tokens, JSON.stringify({ prefill: [1], short: [1], deep: [1] }));
    const p = Bun.spawnSync([process.execPath, "bench/run-infer.ts", "--model", join(dir, "none.gguf"),
      "--mode", "decode-deep", "--tokens", tokens, "--cache-type-k", "q5_1"],
    { cwd: join(import.meta.dir, ".."), stdout: "pipe", stderr: "pipe" });
    expect(p.exitCode).toBe(1);
    const out = JSON.parse(p.stdout.toString().trim()) as { error: string };
    expect(out.error).toContain("--cache-type-k must be one of");
    rmSync(dir, { recursive: true, force: true });
  });
});

describe("bun run smoke:metal (for a first run on a Mac)", () => {
  test("runs where there is no Metal: says so, and checks the CPU half against llama.cpp", () => {
    if (!existsSync(defaultModelPath())) return; // the default model is not installed here
    const out = join(mkdtempSync(join(tmpdir(), "infer-smoke-")), "report.md");
    const p = Bun.spawnSync([process.execPath, "bench/metal-smoke.ts", "--cases", "2", "--out", out],
      { cwd: join(import.meta.dir, ".."), stdout: "pipe", stderr: "pipe" });
    expect(p.exitCode).toBe(0);
    const report = readFileSync(out, "utf8");
    expect(report).toContain("## Golden prompts");
    expect(report).toMatch(/\| prose \| - \| 32\/32 \| - \|/);
    if (process.platform !== "darwin") expect(report).toContain("Metal not available");
    rmSync(dirname(out), { recursive: true, force: true });
  }, 120_000);
});
