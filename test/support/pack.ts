// The package as `npm pack` makes it (prepack: ts/cli/prebuild.ts), packed once per content of
// what goes into it and kept under $TMPDIR/infer-pack/<hash>, with the tarball unpacked beside it,
// so that the package tests share one pack and a second run costs nothing.
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join, relative } from "node:path";

const root = join(import.meta.dir, "..", "..");

/** What the tarball is made from: the sources of the code, the libraries and the declarations. */
const INPUTS = ["package.json", "infer.ts", "README.md", "build.zig", "tsconfig.json",
  "tsconfig.types.json", "ts", "lib", "shaders"];

function filesUnder(path: string): string[] {
  if (!existsSync(path)) return [];
  if (!statSync(path).isDirectory()) return [path];
  return readdirSync(path).sort().flatMap((name) => filesUnder(join(path, name)));
}

function inputsHash(): string {
  const hasher = new Bun.CryptoHasher("sha256");
  for (const file of INPUTS.flatMap((input) => filesUnder(join(root, input)))) {
    hasher.update(relative(root, file)).update("\0").update(readFileSync(file)).update("\0");
  }
  return hasher.digest("hex").slice(0, 16);
}

export interface Packed {
  /** The .tgz npm pack wrote. */
  readonly tarball: string;
  /** The tarball unpacked: its package/ folder. */
  readonly dir: string;
  /** Every file in the tarball, relative to package/, sorted. */
  readonly files: string[];
}

let packed: Packed | null = null;

export function packPackage(): Packed {
  if (packed) return packed;
  const cache = join(tmpdir(), "infer-pack", inputsHash());
  const tarball = join(cache, "infer.tgz"), dir = join(cache, "package");
  if (!existsSync(dir)) {
    const work = `${cache}.${process.pid}.partial`;
    rmSync(work, { recursive: true, force: true });
    mkdirSync(work, { recursive: true });
    const npm = Bun.which("npm");
    if (!npm) throw new Error("npm is not on PATH: the package tests pack with npm pack");
    const p = Bun.spawnSync([npm, "pack", "--json", "--pack-destination", work],
      { cwd: root, stdout: "pipe", stderr: "pipe" });
    if (p.exitCode !== 0) throw new Error(`npm pack failed:\n${p.stderr.toString()}`);
    const [{ filename }] = JSON.parse(p.stdout.toString()) as { filename: string }[];
    renameSync(join(work, filename), join(work, "infer.tgz"));
    const tar = Bun.spawnSync(["tar", "xzf", "infer.tgz"], { cwd: work, stderr: "pipe" });
    if (tar.exitCode !== 0) throw new Error(`tar xzf failed: ${tar.stderr.toString()}`);
    rmSync(cache, { recursive: true, force: true });
    renameSync(work, cache);
    for (const old of readdirSync(dirname(cache))) { // packs of earlier sources
      if (old !== basename(cache) && !old.endsWith(".partial")) {
        rmSync(join(dirname(cache), old), { recursive: true, force: true });
      }
    }
  }
  const files = filesUnder(dir).map((f) => relative(dir, f)).sort();
  packed = { tarball, dir, files };
  return packed;
}
