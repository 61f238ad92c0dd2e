// Method: build the single executable (ts/cli/build-bin.ts, as `bun run build:bin` does) into a
// temporary folder, then run it there as a user without Bun would: PATH=/usr/bin:/bin (checked
// to hold no bun), no repository around it, the native library coming from inside the binary.
// It must answer every command's --help, list the cached models, and run the default model to
// the same greedy text as the engine run from source.
import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildBinary } from "../ts/cli/build-bin.ts";
import { defaultModelPath } from "../ts/models/cache.ts";
import { Engine } from "../ts/engine/engine.ts";

const dir = mkdtempSync(join(tmpdir(), "infer-bin-"));
const binary = join(dir, "infer");
const env: Record<string, string> = { PATH: "/usr/bin:/bin", HOME: process.env.HOME ?? "/root" };
if (process.env.INFER_CACHE) env.INFER_CACHE = process.env.INFER_CACHE;

function run(args: string[], o: { stdin?: string; env?: Record<string, string> } = {}) {
  const p = Bun.spawnSync([binary, ...args], {
    cwd: dir, env: { ...env, ...o.env }, stdin: o.stdin === undefined ? "ignore" : Buffer.from(o.stdin),
    stdout: "pipe", stderr: "pipe",
  });
  return { code: p.exitCode, stdout: p.stdout.toString(), stderr: p.stderr.toString() };
}

describe("the single executable", () => {
  test("builds", () => {
    buildBinary(binary);
    expect(existsSync(binary)).toBe(true);
    // the environment it runs in has no Bun
    const which = Bun.spawnSync(["/bin/sh", "-c", "command -v bun"], { env, stdout: "pipe" });
    expect(which.exitCode).not.toBe(0);
  }, 120_000);

  test("--help and every command's --help are complete", () => {
    const top = run(["--help"]);
    expect(top.code).toBe(0);
    for (const c of ["chat", "models", "import", "quantize", "perplexity", "tokenize"]) expect(top.stdout).toContain(`infer ${c}`);
    for (const c of ["run", "chat", "models", "import", "quantize", "perplexity", "tokenize"]) {
      const r = run([c, "--help"]);
      expect(r.code).toBe(0);
      expect(r.stdout).toStartWith(`usage: infer ${c === "run" ? "[run]" : c}`);
      expect(run(["help", c]).stdout).toBe(r.stdout);
    }
    const chat = run(["chat", "--help"]).stdout;
    for (const word of ["/reset", "/save", "/load", "Ctrl-C", "--system", "--temp", "--top-k", "--top-p", "--min-p",
      "--typical", "--repeat-penalty", "--frequency-penalty", "--presence-penalty", "--logit-bias", "--seed", "--stop"]) {
      expect(chat).toContain(word);
    }
    expect(run(["run", "--help"]).stdout).toContain("--json-schema SCHEMA");
    expect(run(["run", "--help"]).stdout).toContain("-f, --file FILE");
    expect(run([]).code).toBe(2);
  });

  const modelPath = defaultModelPath();

  test("a missing library is reported with where it was looked for", () => {
    const r = run(["hi"], { env: { INFER_LIB: "/nonexistent/libinfer.so" } });
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("/nonexistent/libinfer.so");
  });

  // Off macOS the device is missing, and the one line must be the native library's, which comes
  // after the kernels were read and parsed: with no shaders directory around the binary, that
  // proves they are embedded (a missing kernel file would fail first, with another message).
  test.skipIf(process.platform === "darwin" || !existsSync(modelPath))("embeds the Metal kernels", () => {
    const r = run(["hi", "-n", "1", "--backend", "metal"]);
    expect(r.code).toBe(1);
    expect(r.stderr.trim()).toBe("infer: Metal not available: the Metal backend runs on macOS (Apple silicon) only");
  });

  describe.skipIf(!existsSync(modelPath))("on the default model", () => {
    test("greedy text equals the engine's from source; models lists it; chat and --json run", () => {
      const prompt = "The capital of France is";
      const r = run([prompt, "-n", "16", "--temp", "0"]);
      expect(r.code).toBe(0);
      const engine = Engine.open({ modelPath });
      try {
        const want = engine.generate(prompt, { maxTokens: 16, sampling: { temperature: 0, topK: 40, topP: 1, minP: 0, seed: 0 } });
        expect(r.stdout).toBe(want.text + "\n");
      } finally {
        engine.close();
      }
      expect(r.stderr).toMatch(/prefilled 6 of 6 prompt tokens.*generated 16 tokens/);

      const models = run(["models"]);
      expect(models.stdout).toMatch(/gemma-3-270m-q4_k_m\.gguf\s+253\.1 MB\s+gemma3\s+Q4_K_M\s+268M/);
      // --model takes a cached name
      expect(run([prompt, "-n", "16", "--temp", "0", "--model", "gemma-3-270m"]).stdout).toBe(r.stdout);

      const chat = run(["chat", "-n", "8", "--temp", "0"], { stdin: "Hello!\nAnd again?\n" });
      expect(chat.code).toBe(0);
      expect(chat.stderr.match(/prefilled \d+ of \d+ prompt tokens/g)).toHaveLength(2);

      const json = run(["Some JSON:", "--json", "-n", "40", "--seed", "1"]);
      expect(json.code).toBe(0);
      expect(typeof JSON.parse(json.stdout)).toBe("object");
    }, 120_000);
  });
});
