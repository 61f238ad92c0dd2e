// `bun ts/cli/prebuild.ts` (run by `npm pack` / `npm publish` through prepack): what the package
// carries that is built rather than written.
// - The native libraries, cross-compiled here by the pinned Zig, ReleaseFast and stripped, into
//   prebuilds/<platform>-<arch>/ (Node's process.platform and process.arch names), where
//   ts/native/lib.ts looks when neither INFER_LIB nor a source build is there. Zig's cache makes
//   a second run take seconds. Linux builds link glibc 2.17 (what Bun itself needs), so they load
//   on any glibc system of the last decade; macOS gets the dot-product build only (every Apple M
//   chip has it), with the Metal host code.
// - The library API's declarations, types/ (tsc, tsconfig.types.json): a consumer's tsc reads
//   these, not our sources, which its own stricter settings would reject.
//   bun ts/cli/prebuild.ts [--only linux-x64,...]   (--only: those libraries, no declarations)
import { cpSync, existsSync, mkdirSync, mkdtempSync, renameSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";

const root = join(import.meta.dir, "..", "..");

export interface Prebuild {
  /** The folder under prebuilds/: `${process.platform}-${process.arch}`. */
  readonly dir: string;
  /** Zig's target triple (glibc version pinned for Linux). */
  readonly zigTarget: string;
  /** The files of build.zig's output kept for this platform (one per instruction-set level). */
  readonly files: readonly string[];
}

export const PREBUILDS: readonly Prebuild[] = [
  {
    dir: "linux-x64", zigTarget: "x86_64-linux-gnu.2.17",
    files: ["libinfer-x86_64_v2.so", "libinfer-x86_64_v3.so", "libinfer-x86_64_v4_vnni.so"],
  },
  {
    dir: "linux-arm64", zigTarget: "aarch64-linux-gnu.2.17",
    files: ["libinfer-aarch64.so", "libinfer-aarch64_dotprod.so"],
  },
  { dir: "darwin-arm64", zigTarget: "aarch64-macos", files: ["libinfer-aarch64_dotprod.dylib"] },
];

function zigBuild(target: Prebuild, prefix: string): void {
  const cmd = ["python3", "-m", "ziglang", "build", `-Dtarget=${target.zigTarget}`,
    "-Doptimize=ReleaseFast", "-Dstrip=true", "--prefix", prefix];
  const p = Bun.spawnSync(cmd, { cwd: root, stdout: "pipe", stderr: "pipe" });
  if (p.exitCode !== 0) {
    const output = (p.stderr.toString() + p.stdout.toString()).trim().split("\n").slice(-20);
    throw new Error(`prebuild: ${target.dir} failed (${cmd.join(" ")}):\n${output.join("\n")}`);
  }
}

/** Builds `targets` and replaces prebuilds/ with them (a folder made whole, then renamed). */
export function prebuild(targets: readonly Prebuild[] = PREBUILDS, out = join(root, "prebuilds")): void {
  const work = mkdtempSync(join(tmpdir(), "infer-prebuild-"));
  const staged = `${out}.partial`; // beside out: a rename does not cross file systems
  rmSync(staged, { recursive: true, force: true });
  try {
    for (const target of targets) {
      const t0 = performance.now();
      const prefix = join(work, target.dir);
      zigBuild(target, prefix);
      mkdirSync(join(staged, target.dir), { recursive: true });
      for (const file of target.files) {
        const built = join(prefix, "lib", file);
        if (!existsSync(built)) throw new Error(`prebuild: ${target.dir}: zig build made no ${file}`);
        cpSync(built, join(staged, target.dir, file));
      }
      const s = ((performance.now() - t0) / 1000).toFixed(1);
      console.error(`prebuild: ${target.dir} (${target.zigTarget}): ${target.files.join(", ")} ${s}s`);
    }
    rmSync(out, { recursive: true, force: true });
    renameSync(staged, out);
  } finally {
    rmSync(work, { recursive: true, force: true });
    rmSync(staged, { recursive: true, force: true });
  }
}

/** types/: the declarations of ts/api/index.ts and what it reaches, made afresh. */
export function buildTypes(out = join(root, "types")): void {
  rmSync(out, { recursive: true, force: true });
  const tsc = join(root, "node_modules", "typescript", "bin", "tsc");
  const p = Bun.spawnSync([process.execPath, tsc, "-p", "tsconfig.types.json", "--outDir", out],
    { cwd: root, stdout: "pipe", stderr: "pipe" });
  if (p.exitCode !== 0) {
    throw new Error(`prebuild: tsc -p tsconfig.types.json failed:\n${p.stdout.toString()}${p.stderr.toString()}`);
  }
  console.error(`prebuild: declarations in ${out}`);
}

if (import.meta.main) {
  const { values } = parseArgs({ args: process.argv.slice(2), options: { only: { type: "string" } } });
  const only = values.only?.split(",");
  const unknown = only?.filter((d) => !PREBUILDS.some((p) => p.dir === d)) ?? [];
  if (unknown.length > 0) {
    console.error(`prebuild: no target ${unknown.join(", ")} (targets: ${PREBUILDS.map((p) => p.dir).join(", ")})`);
    process.exit(2);
  }
  try {
    prebuild(only ? PREBUILDS.filter((p) => only.includes(p.dir)) : PREBUILDS);
    if (!only) buildTypes();
  } catch (err) {
    console.error((err as Error).message);
    process.exit(1);
  }
}
