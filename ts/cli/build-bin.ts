// `bun run build:bin`: one executable, dist/infer, with Bun's runtime, the TypeScript and every
// native library build in zig-out/lib (one per CPU level, and CUDA's kernels when built) embedded
// in it. At run time ts/native/lib.ts picks the build for the CPU from the embedded files (or
// from a library placed beside the executable, or INFER_LIB). Needs the library built first
// (npm install does it; or bun run build:lib).
//   bun ts/cli/build-bin.ts [--outfile PATH]   (default dist/infer)
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";

const root = join(import.meta.dir, "..", "..");

export function nativeAssets(): string[] {
  const dir = join(root, "zig-out", "lib");
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((f) => /^libinfer.*\.(so|dylib|dll)$/.test(f) || f.endsWith(".fatbin"))
    .sort()
    .map((f) => join(dir, f));
}

export function buildBinary(outfile: string): void {
  const assets = nativeAssets();
  if (!assets.some((a) => /libinfer/.test(a))) {
    throw new Error("build:bin: no native library in zig-out/lib; run 'bun run build:lib' first");
  }
  const cmd = [process.execPath, "build", "--compile", "--minify-syntax",
    "--asset-naming=[name].[ext]", join(root, "infer.ts"),
    join(root, "ts", "runtime", "worker.ts"), ...assets, "--outfile", outfile];
  const p = Bun.spawnSync(cmd, { cwd: root, stdout: "pipe", stderr: "pipe" });
  if (p.exitCode !== 0) {
    throw new Error(`build:bin: bun build failed:\n${p.stderr.toString()}${p.stdout.toString()}`);
  }
}

if (import.meta.main) {
  const options = { outfile: { type: "string" } } as const;
  const { values } = parseArgs({ args: process.argv.slice(2), options });
  const outfile = values.outfile ?? join(root, "dist", "infer");
  try {
    buildBinary(outfile);
    const names = nativeAssets().map((a) => a.split("/").pop()).join(", ");
    console.error(`build:bin: wrote ${outfile} (native: ${names})`);
  } catch (err) {
    console.error((err as Error).message);
    process.exit(1);
  }
}
