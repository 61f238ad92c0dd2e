// Method: a fixed-seed slice of the GGUF fuzzer (test/fuzz/run.ts): thousands of mutated small
// models of every architecture and weight type, each through the real loader and one generated
// token in child processes under a memory limit; every case must generate its token or end in
// one bounded line of InferError. The long run and its figures are in bench/results/fuzz.md.
import { describe, expect, test } from "bun:test";
import { fuzzCase } from "./fuzz/mutate.ts";
import { formatReport, isBoundedLine, runFuzz } from "./fuzz/run.ts";

describe("the fuzzer", () => {
  test("a case is the same file wherever it is made", () => {
    for (const i of [0, 1, 777]) {
      expect(fuzzCase(20261207, i).bytes).toEqual(fuzzCase(20261207, i).bytes);
    }
    expect(fuzzCase(20261207, 1).bytes).not.toEqual(fuzzCase(20261207, 2).bytes);
  });

  test("a message is bounded: one line, no control bytes, at most 400 bytes", () => {
    expect(isBoundedLine("t.gguf: tensor \"a\\u001b\" has 9 dimensions (1..4)")).toBe(true);
    expect(isBoundedLine("two\nlines")).toBe(false);
    expect(isBoundedLine("an \u001b[2J escape")).toBe(false);
    expect(isBoundedLine("x".repeat(401))).toBe(false);
  });

  test("5,000 mutated GGUFs: no stack trace, signal, hang or unbounded message", async () => {
    const report = await runFuzz({ seed: 20261207, cases: 5000 });
    if (report.failures.length > 0) console.error(formatReport(report));
    expect(report.failures).toEqual([]);
    // Mutations that leave a model runnable reach the forward pass (NaN data among them).
    expect(report.ok).toBeGreaterThan(400);
    expect(report.errors.bad_gguf).toBeGreaterThan(1000);
    expect(report.errors.bad_model).toBeGreaterThan(500);
  }, 300_000);
});
