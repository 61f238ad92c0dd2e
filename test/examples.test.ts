// Method: each script in examples/ runs as a user runs it (`bun examples/<name>.ts`, importing
// "infer" by the package's own name) on the default model, and does what its comment says. They
// are type-checked with the rest by `tsc` (tsconfig.json maps "infer" to ts/api/index.ts).
import { describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { defaultModelPath } from "../ts/models/cache.ts";

const root = join(import.meta.dir, "..");
const run = (name: string, args: string[] = [], stdin?: string) => {
  const p = Bun.spawnSync([process.execPath, join(root, "examples", `${name}.ts`), ...args],
    { cwd: root, stdin: stdin === undefined ? "ignore" : new TextEncoder().encode(stdin) });
  return { code: p.exitCode, stdout: p.stdout.toString(), stderr: p.stderr.toString() };
};

describe.skipIf(!existsSync(defaultModelPath()))("examples/ on the default model", () => {
  test("stream.ts streams a greedy continuation and reports its rate", () => {
    const r = run("stream", ["The capital of France is"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toStartWith(" the capital of the country of France.");
    expect(r.stderr).toMatch(/\n64 tokens, [\d.]+ tok\/s\n$/);
  }, 60_000);

  test("json.ts prints an object of the schema's shape", () => {
    const r = run("json");
    expect(r.code).toBe(0);
    const facts = JSON.parse(r.stdout);
    expect(Object.keys(facts)).toEqual(["city", "country", "population", "capital"]);
    expect(Number.isInteger(facts.population)).toBe(true);
    expect(typeof facts.capital).toBe("boolean");
  }, 60_000);

  test("tools.ts makes a call that follows the schema, and answers after its result", () => {
    const r = run("tools");
    expect(r.code).toBe(0);
    const call = /^call: get_weather\((.*)\)$/m.exec(r.stdout);
    expect(typeof JSON.parse(call![1]).city).toBe("string");
    expect(r.stdout).toMatch(/\nanswer: /);
  }, 60_000);

  test("chat.ts answers each line and leaves at the end of input", () => {
    const r = run("chat", [], "Hello!\nWhat is 2 + 2?\n");
    expect(r.code).toBe(0);
    expect(r.stdout.split("> ").length).toBe(4); // a prompt per line, and one more at the end
  }, 60_000);
});
