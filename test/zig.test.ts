// Method: run every inline Zig test (each SIMD fast path against its scalar reference) through
// `zig build test`, so `bun test` alone covers both sides of the library.
import { expect, test } from "bun:test";
import { join } from "node:path";

test("zig build test passes", () => {
  const proc = Bun.spawnSync(["python3", "-m", "ziglang", "build", "test", "--summary", "failures"], {
    cwd: join(import.meta.dir, ".."), stdout: "pipe", stderr: "pipe",
  });
  const output = proc.stdout.toString() + proc.stderr.toString();
  if (proc.exitCode !== 0) console.error(output);
  expect(proc.exitCode).toBe(0);
}, 600_000);

test("typescript typechecks (tsc --noEmit)", () => {
  const proc = Bun.spawnSync([join(import.meta.dir, "..", "node_modules", ".bin", "tsc"), "-p", "."], {
    cwd: join(import.meta.dir, ".."), stdout: "pipe", stderr: "pipe",
  });
  if (proc.exitCode !== 0) console.error(proc.stdout.toString());
  expect(proc.exitCode).toBe(0);
}, 300_000);
