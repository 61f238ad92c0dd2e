// Method: run the real CLI (`bun infer.ts`) as a user would and check its exit code and its one
// line of error for each kind of bad input; generation itself runs on a tiny random Gemma 3.
import { describe, expect, test } from "bun:test";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { GgmlType } from "../ts/gguf/types.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const root = join(import.meta.dir, "..");
const dir = mkdtempSync(join(tmpdir(), "infer-cli-"));

function cli(...args: string[]) {
  const p = Bun.spawnSync([process.execPath, "infer.ts", ...args], { cwd: root, stdout: "pipe", stderr: "pipe" });
  return { code: p.exitCode, stdout: p.stdout.toString(), stderr: p.stderr.toString() };
}

function file(name: string, bytes: Uint8Array | string): string {
  const path = join(dir, name);
  writeFileSync(path, bytes);
  return path;
}

describe("bad input gives one clear line and a non-zero exit", () => {
  const cases: [string, () => string[], RegExp][] = [
    ["a missing model file", () => ["hi", "--model", "/nonexistent/m.gguf"], /model file not found: \/nonexistent\/m\.gguf/],
    ["a file that is not GGUF", () => ["hi", "--model", file("notes.txt", "hello, not a model")], /not a GGUF file/],
    ["a truncated GGUF", () => ["hi", "--model", file("cut.gguf", tinyGemma3Gguf().subarray(0, 3000))], /truncated|past the end/],
    ["an unsupported architecture", () => ["hi", "--model", file("mamba.gguf", tinyGemma3Gguf({ architecture: "mamba" }))],
      /architecture .mamba. is not supported/],
    ["an unsupported quant type", () => ["hi", "--model", file("q41.gguf", tinyGemma3Gguf({ embeddingType: GgmlType.Q4_1 }))],
      /quant type Q4_1/],
    ["missing hyperparameters", () => ["hi", "--model", file("nohp.gguf", tinyGemma3Gguf({ dropMetadata: ["gemma3.block_count"] }))],
      /gemma3\.block_count' is missing/],
    ["a bad option value", () => ["hi", "-n", "many", "--model", file("ok.gguf", tinyGemma3Gguf())], /-n must be an integer/],
    ["a prompt longer than the context", () => ["the cat sat ".repeat(40), "--ctx-size", "16", "--model", file("ok2.gguf", tinyGemma3Gguf())],
      /do not fit the context of 16/],
  ];
  for (const [what, args, pattern] of cases) {
    test(what, () => {
      const r = cli(...args());
      expect(r.code).not.toBe(0);
      expect(r.stderr).toMatch(pattern);
      expect(r.stderr.trim().split("\n")).toHaveLength(1);
    });
  }

  test("no prompt prints usage and exits 2", () => {
    const r = cli();
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("usage:");
  });
});

describe("generation on a tiny random Gemma 3", () => {
  test("greedy output is reproducible and timings go to stderr", () => {
    const model = file("tiny.gguf", tinyGemma3Gguf());
    const a = cli("the cat", "--model", model, "-n", "12", "--temp", "0", "--ignore-eos");
    const b = cli("the cat", "--model", model, "-n", "12", "--temp", "0", "--ignore-eos");
    expect(a.code).toBe(0);
    expect(a.stdout).toBe(b.stdout);
    expect(a.stdout.length).toBeGreaterThan(1);
    expect(a.stderr).toMatch(/generated 12 tokens/);
  });
});
