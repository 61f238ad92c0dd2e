// Method: run the short golden prompts once per libinfer build this CPU can run (INFER_CPU forces
// each in a fresh process), demanding llama.cpp's logits bit for bit from every instruction-set
// path; and run the Zig kernel tests for aarch64 (NEON with the dot product) under qemu.
import { expect, test } from "bun:test";
import { existsSync, mkdirSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { supportedVariants } from "../ts/native/cpu.ts";

const root = join(import.meta.dir, "..");

for (const variant of supportedVariants()) {
  test(`${variant}: golden logits equal llama.cpp's`, () => {
    const p = Bun.spawnSync([process.execPath, "test/support/golden-logits.ts"], {
      cwd: root, env: { ...process.env, INFER_CPU: variant }, stdout: "pipe", stderr: "pipe",
    });
    if (p.exitCode !== 0) throw new Error(p.stderr.toString());
    const result = JSON.parse(p.stdout.toString().trim().split("\n").pop()!);
    expect(result.library).toEndWith(`libinfer-${variant}.so`);
    expect(result.mismatches).toEqual([]);
  }, 120_000);
}

// Zig runs foreign test binaries through `qemu-aarch64` on PATH; Debian's package names it
// qemu-aarch64-static, so a link in a private directory bridges the two.
const qemu = ["/usr/bin/qemu-aarch64", "/usr/bin/qemu-aarch64-static"].find(existsSync);

test("aarch64 kernels (NEON + dot product) pass their tests under qemu", () => {
  if (!qemu) {
    const msg = "qemu-aarch64 is missing: `npm test` installs qemu-user-static (bun ts/cli/setup.ts --test-tools)";
    if (process.env.CI) throw new Error(msg);
    console.warn(`skipped: ${msg}`);
    return;
  }
  const bin = join(tmpdir(), "infer-qemu-bin");
  mkdirSync(bin, { recursive: true });
  if (!existsSync(join(bin, "qemu-aarch64"))) symlinkSync(qemu, join(bin, "qemu-aarch64"));
  const p = Bun.spawnSync(["python3", "-m", "ziglang", "build", "test", "-Dtarget=aarch64-linux-musl",
    "-Dcpu=generic+dotprod", "-fqemu", "--summary", "all"], {
    cwd: root, env: { ...process.env, PATH: `${bin}:${process.env.PATH}` }, stdout: "pipe", stderr: "pipe",
  });
  const output = p.stdout.toString() + p.stderr.toString();
  if (p.exitCode !== 0) console.error(output);
  expect(p.exitCode).toBe(0);
  expect(output).toMatch(/run test \d+ passed/);
}, 600_000);
