// Method: run the CLI from source (bun infer.ts) on tiny random models in a private cache
// (INFER_CACHE) and check what a user sees: --quiet and --verbose, `models` and --model by
// name, option errors as one line, chat from piped input, and the help texts.
import { describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { GgmlType } from "../ts/gguf/types.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const root = join(import.meta.dir, "..");
const cache = mkdtempSync(join(tmpdir(), "infer-cache-"));
mkdirSync(join(cache, "models"));
writeFileSync(join(cache, "models", "tiny-a.gguf"), tinyGemma3Gguf());
writeFileSync(join(cache, "models", "tiny-b-f16.gguf"), tinyGemma3Gguf({ embeddingType: GgmlType.F16, seed: 2 }));
writeFileSync(join(cache, "models", "broken.gguf"), "not a model");

function cli(args: string[], stdin?: string) {
  const p = Bun.spawnSync([process.execPath, "infer.ts", ...args], {
    cwd: root, env: { ...process.env, INFER_CACHE: cache }, stdout: "pipe", stderr: "pipe",
    stdin: stdin === undefined ? "ignore" : Buffer.from(stdin),
  });
  return { code: p.exitCode, stdout: p.stdout.toString(), stderr: p.stderr.toString() };
}

describe("models and --model by name", () => {
  test("infer models lists the cache with size, architecture and quant", () => {
    const r = cli(["models"]);
    expect(r.code).toBe(0);
    const lines = r.stdout.trim().split("\n");
    expect(lines[0]).toMatch(/^NAME\s+SIZE\s+ARCH\s+QUANT\s+PARAMS\s+SOURCE$/);
    expect(lines[1]).toMatch(/^broken\.gguf\s+11 B\s+\?\s+\?\s+\?\s+local; unreadable: .*not a GGUF/);
    expect(lines[2]).toMatch(/^tiny-a\.gguf\s+[\d.]+ KB\s+gemma3\s+F32\s+\d+/); // no file_type: the weights' type
    expect(lines[3]).toMatch(/^tiny-b-f16\.gguf\s+[\d.]+ KB\s+gemma3\s+F32/);
    const json = cli(["models", "--json"]).stdout.trim().split("\n").map((l) => JSON.parse(l));
    expect(json.map((m) => m.name)).toEqual(["broken.gguf", "tiny-a.gguf", "tiny-b-f16.gguf"]);
  });

  test("--model takes a cached file name, a name without .gguf or a unique part", () => {
    const byPath = cli(["the cat", "-n", "5", "--temp", "0", "--model", join(cache, "models", "tiny-a.gguf")]);
    for (const name of ["tiny-a.gguf", "tiny-a", "y-a"]) {
      expect(cli(["the cat", "-n", "5", "--temp", "0", "--model", name]).stdout).toBe(byPath.stdout);
    }
    const ambiguous = cli(["the cat", "--model", "tiny"]);
    expect(ambiguous.code).toBe(1);
    expect(ambiguous.stderr).toMatch(/'tiny' matches several cached models: tiny-a\.gguf, tiny-b-f16\.gguf/);
    expect(cli(["the cat", "--model", "nothing-like-it"]).stderr).toMatch(/no model file 'nothing-like-it'/);
  });
});

describe("feedback", () => {
  const model = ["--model", "tiny-a"];
  test("statistics on stderr; --quiet drops them; --verbose describes the run", () => {
    const normal = cli(["the cat", "-n", "4", "--temp", "0", ...model]);
    expect(normal.stderr).toMatch(/^load \d+ ms \| prefilled (\d+) of \1 prompt tokens, [\d.]+ tok\/s \| generated 4 tokens, [\d.]+ tok\/s \| (drafts: kept \d+ of \d+ in \d+ passes \| )?stop: length\n$/);
    const quiet = cli(["the cat", "-n", "4", "--temp", "0", "-q", ...model]);
    expect(quiet.stderr).toBe("");
    expect(quiet.stdout).toBe(normal.stdout);
    const verbose = cli(["the cat", "-n", "4", "--temp", "0", "--verbose", ...model]);
    expect(verbose.stderr).toContain("tiny-gemma3 (gemma3), F32, 2 layers, vocabulary 275");
    // which backend, and why: the one asked for, or what auto found (a device, or why none)
    expect(verbose.stderr).toMatch(/\n {2}backend (cpu|cuda|metal): (asked for|auto: .+)\n/);
    expect(verbose.stderr).toContain(`"temperature":0`);
  });

  test("bad option values are one line each", () => {
    for (const [args, pattern] of [
      [["x", "--top-k", "-3"], /--top-k must be an integer >= 0/],
      [["x", "--temp", "hot"], /--temp must be a number >= 0/],
      [["x", "--logit-bias", "12*3"], /--logit-bias must be TOKEN_ID\+BIAS/],
      [["x", "--stop", ""], /--stop needs a non-empty text/],
      [["x", "--json-schema", "/nonexistent.json"], /--json-schema "\/nonexistent\.json": .*ENOENT/],
    ] as [string[], RegExp][]) {
      const r = cli([...args, ...model]);
      expect(r.code).not.toBe(0);
      expect(r.stderr).toMatch(pattern);
      expect(r.stderr.trim().split("\n")).toHaveLength(1);
    }
    // -n -1 (no limit: the context shifts when full, test/context-shift.test.ts) reads as
    // llama.cpp users type it: here the prompt alone outgrows the context
    expect(cli(["x ".repeat(40), "-n", "-1", "-c", "16", ...model]).stderr)
      .toMatch(/does not fit the context of 16 tokens/);
  });

  test("--logit-bias bans a token", () => {
    const free = cli(["the cat", "-n", "20", "--temp", "0", "--ignore-eos", ...model]).stdout;
    expect(free).toStartWith("atat"); // the token "at" (id 267 in the toy vocabulary), again and again
    const banned = cli(["the cat", "-n", "20", "--temp", "0", "--ignore-eos", "--logit-bias", "267-inf", ...model]).stdout;
    expect(banned).not.toStartWith("at");
    const favoured = cli(["the cat", "-n", "3", "--temp", "0", "--ignore-eos", "--logit-bias", "264+100", ...model]).stdout;
    expect(favoured).toBe(" cat cat cat\n"); // "▁cat" (264) pushed to the top
  });
});

test("chat from piped input: each line a turn, the cache reused from the second", () => {
  const r = cli(["chat", "-n", "6", "--temp", "0", "--system", "Be brief.", "--model", "tiny-a"], "hi\nthe cat\n/help\n");
  expect(r.code).toBe(0);
  const stats = [...r.stderr.matchAll(/prefilled (\d+) of (\d+) prompt tokens/g)].map((m) => [Number(m[1]), Number(m[2])]);
  expect(stats).toHaveLength(2);
  expect(stats[0][0]).toBe(stats[0][1]);
  expect(stats[1][0]).toBeLessThan(stats[1][1]);
  expect(r.stdout).toContain("/save FILE");
  // the tiny model has no chat template of its own: said once, at the start
  expect(r.stderr.match(/has no chat template of its own; using the gemma family's/g)).toHaveLength(1);
});
