// Method: the environment is read in one place. Scan the sources for process.env and for
// INFER_* names, and check them against the registry (ts/config/env.ts); check how values read.
import { expect, test } from "bun:test";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { setting, settings, settingsHelp, withSettings } from "../ts/config/env.ts";

const root = join(import.meta.dir, "..");

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sources(path);
    return /\.(ts|zig)$/.test(name) ? [path] : [];
  });
}

const files = [...sources(join(root, "ts")), ...sources(join(root, "bench")), ...sources(join(root, "lib")),
  join(root, "infer.ts")];

test("only ts/config/env.ts reads process.env; the library reads no environment", () => {
  const readers = files.filter((f) => /process\.env|Bun\.env|getenv\(/.test(readFileSync(f, "utf8")))
    .map((f) => relative(root, f));
  expect(readers).toEqual(["ts/config/env.ts"]);
});

test("every INFER_* variable the code names is in the registry", () => {
  const known = new Set(Object.keys(settings));
  const named = new Set<string>();
  for (const f of files) {
    // (INFER_TRACE, INFER_MARK and INFER_BLOCK_MARK are the CUDA kernels' preprocessor macros.)
    for (const m of readFileSync(f, "utf8").matchAll(/\bINFER_[A-Z0-9_]+\b/g)) named.add(m[0]);
  }
  for (const macro of ["INFER_TRACE", "INFER_MARK", "INFER_BLOCK_MARK", "INFER_BENCH_MAXRSS_KIB"]) named.delete(macro);
  expect([...named].filter((n) => !known.has(n)).sort()).toEqual([]);
});

test("flags, integers and texts read as the table says; empty is unset", () => {
  withSettings({ INFER_CUDA_GRAPHS: null, INFER_TRACE_FFI: null }, () => {
    expect(setting("INFER_CUDA_GRAPHS")).toBe(true);
    expect(setting("INFER_TRACE_FFI")).toBe(false);
  });
  withSettings({ INFER_CUDA_GRAPHS: "0", INFER_TRACE_FFI: "1" }, () => {
    expect(setting("INFER_CUDA_GRAPHS")).toBe(false);
    expect(setting("INFER_TRACE_FFI")).toBe(true);
  });
  withSettings({ INFER_CUDA_GRAPHS: "yes", INFER_TRACE_FFI: "yes" }, () => {
    expect(setting("INFER_CUDA_GRAPHS")).toBe(true);
    expect(setting("INFER_TRACE_FFI")).toBe(false);
  });
  withSettings({ INFER_CUDA_DEVICE: "3", INFER_API_KEY: "" }, () => {
    expect(setting("INFER_CUDA_DEVICE")).toBe(3);
    expect(setting("INFER_API_KEY")).toBeNull();
  });
  withSettings({ INFER_CUDA_DEVICE: "-1" }, () => {
    expect(() => setting("INFER_CUDA_DEVICE")).toThrow("INFER_CUDA_DEVICE must be a whole number of at least 0");
  });
});

test("infer help env lists every variable, users' first, within 100 columns", () => {
  const text = settingsHelp();
  for (const name of Object.keys(settings)) expect(text).toContain(`  ${name} `);
  expect(text.indexOf("INFER_CACHE")).toBeLessThan(text.indexOf("INFER_TRACE_FFI"));
  for (const line of text.split("\n")) expect(line.length).toBeLessThanOrEqual(100);
});
