// Method: pack the package as npm does (test/support/pack.ts), check the tarball's shape, install
// it into fresh projects with `bun add` and `npm install` on a PATH with no Python, Zig or
// compiler (and, for npm, no Bun), demanding that nothing is built or fetched there, then run
// test/package/consumer.ts (every call of the library API on the default model, from the existing
// cache) and the `infer` command in the Bun project, and type-check the script with the package's
// declarations under `bun init`'s compiler settings (a planted type error must be caught).
import { afterAll, describe, expect, test } from "bun:test";
import {
  copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync,
  symlinkSync, writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { cacheDir } from "../ts/models/cache.ts";
import { supportedVariants } from "../ts/native/cpu.ts";
import { packPackage } from "./support/pack.ts";

const root = join(import.meta.dir, "..");
const HEAVY_MS = 600_000;

/** Folders made for these tests, removed at the end. */
const made: string[] = [];
afterAll(() => { for (const dir of made) rmSync(dir, { recursive: true, force: true }); });

function tempDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  made.push(dir);
  return dir;
}

function filesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? filesUnder(path) : [path];
  });
}

function run(cmd: string[], cwd: string, env: Record<string, string | undefined> = {}) {
  const p = Bun.spawnSync(cmd, { cwd, env: { ...process.env, ...env }, stdout: "pipe", stderr: "pipe" });
  return { code: p.exitCode, out: p.stdout.toString(), err: p.stderr.toString() };
}

function newProject(prefix: string): string {
  const dir = tempDir(prefix);
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "consumer", private: true, type: "module" }));
  return dir;
}

/** A PATH of just these programs: what an install could reach for is not there. */
function onlyOnPath(programs: string[]): string {
  const bin = tempDir("infer-path-");
  for (const program of programs) {
    const found = program === "bun" ? process.execPath : Bun.which(program);
    if (!found) throw new Error(`${program} is not on PATH`);
    symlinkSync(found, join(bin, program));
  }
  return bin;
}

interface Installed { readonly project: string; readonly cache: string; readonly log: string }

let bunProject: Installed | null = null;

/** The tarball added to a new project by `bun add`, once for the tests below. */
function installWithBun(): Installed {
  if (bunProject) return bunProject;
  const { tarball } = packPackage();
  const project = newProject("infer-consumer-bun-");
  const cache = tempDir("infer-cache-");
  const p = run([process.execPath, "add", tarball], project,
    { PATH: onlyOnPath(["bun"]), INFER_CACHE: cache });
  if (p.code !== 0) throw new Error(`bun add failed:\n${p.err}${p.out}`);
  bunProject = { project, cache, log: p.out + p.err };
  return bunProject;
}

/** Files the install left in node_modules/infer, against the tarball's. */
function installedFiles(project: string): string[] {
  const dir = join(project, "node_modules", "infer");
  // .bun-tag: Bun's note of what it installed there
  return filesUnder(dir).map((f) => relative(dir, f)).filter((f) => f !== ".bun-tag").sort();
}

describe("the packed package", () => {
  test("has the public shape: exports with types, bin, files, no install scripts", () => {
    const { dir, files } = packPackage();
    const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
    expect(pkg.private).toBeUndefined();
    expect(pkg.version).toMatch(/^\d+\.\d+\.\d+$/);
    expect(pkg.exports["."]).toEqual({ types: "./types/api/index.d.ts", default: "./ts/api/index.ts" });
    expect(pkg.bin).toEqual({ infer: "./infer.ts" });
    expect(readFileSync(join(dir, "infer.ts"), "utf8")).toStartWith("#!/usr/bin/env bun\n");
    expect(Object.keys(pkg.dependencies)).toEqual(["@huggingface/jinja"]);
    for (const script of ["preinstall", "install", "postinstall"]) expect(pkg.scripts[script]).toBeUndefined();

    for (const needed of ["ts/api/index.ts", "types/api/index.d.ts", "types/api/model.d.ts",
      "ts/native/symbols.gen.ts", "README.md"]) {
      expect(files).toContain(needed);
    }
    // the Metal sources the backend compiles at run time, and the headers they include
    const metal = readdirSync(join(root, "shaders", "metal")).filter((f) => /\.(metal|h)$/.test(f));
    expect(metal.length).toBeGreaterThan(5);
    for (const f of metal) expect(files).toContain(`shaders/metal/${f}`);
    const unwanted = files.filter((f) =>
      /^(test|bench|lib|zig-out|\.zig-cache|examples|docs|shaders\/cuda|shaders\/metal\/compat)\//.test(f) ||
      f === "binding.gyp" || f === "build.zig");
    expect(unwanted).toEqual([]);
  }, HEAVY_MS);

  test("bun add builds nothing and fetches no model", () => {
    const { project, cache, log } = installWithBun();
    expect(installedFiles(project)).toEqual(packPackage().files);
    expect(readdirSync(cache)).toEqual([]);
    expect(log).not.toMatch(/setup|zig build|prebuild/i);
  }, HEAVY_MS);

  test("npm install builds nothing and fetches no model, with no Bun on PATH", () => {
    const project = newProject("infer-consumer-npm-");
    const cache = tempDir("infer-cache-");
    const p = run([Bun.which("npm")!, "install", "--foreground-scripts", "--no-audit", "--no-fund",
      packPackage().tarball], project, { PATH: onlyOnPath(["node", "npm"]), INFER_CACHE: cache });
    if (p.code !== 0) throw new Error(`npm install failed:\n${p.err}${p.out}`);
    expect(installedFiles(project)).toEqual(packPackage().files);
    expect(existsSync(join(project, "node_modules", "@huggingface", "jinja"))).toBe(true);
    expect(readdirSync(cache)).toEqual([]);
  }, HEAVY_MS);

  test("loads its prebuilt library for this CPU", () => {
    const { project } = installWithBun();
    const lib = join(project, "node_modules", "infer", "ts", "native", "lib.ts");
    const p = run([process.execPath, "-e",
      `import { libraryPath, native } from ${JSON.stringify(lib)}; native(); console.log(libraryPath())`],
    project, { INFER_LIB: undefined, INFER_CPU: undefined });
    expect(p.err).toBe("");
    const ext = process.platform === "darwin" ? "dylib" : "so";
    expect(p.out.trim()).toBe(join(project, "node_modules", "infer", "prebuilds",
      `${process.platform}-${process.arch}`, `libinfer-${supportedVariants()[0]}.${ext}`));
  }, HEAVY_MS);

  test("runs every call of the library API on the default model", () => {
    const { project } = installWithBun();
    copyFileSync(join(import.meta.dir, "package", "consumer.ts"), join(project, "consumer.ts"));
    const p = run([process.execPath, "consumer.ts"], project,
      { INFER_CACHE: cacheDir(), INFER_LIB: undefined, INFER_BACKEND: undefined });
    if (p.code !== 0) throw new Error(`consumer.ts failed (${p.code}):\n${p.err}`);
    const seen = JSON.parse(p.out.trim().split("\n").pop()!);
    expect(seen.info.architecture).toBe("gemma3");
    expect(seen.text.length).toBeGreaterThan(0);
    expect(seen.code).toBe("io");
  }, HEAVY_MS);

  test("the infer command runs from the project's node_modules/.bin", () => {
    const { project } = installWithBun();
    const p = run([join(project, "node_modules", ".bin", "infer"), "The capital of France is",
      "-n", "4", "--temp", "0", "-q"], project,
    { PATH: `${onlyOnPath(["bun"])}:/usr/bin:/bin`, INFER_CACHE: cacheDir(), INFER_LIB: undefined });
    if (p.code !== 0) throw new Error(`infer failed:\n${p.err}`);
    expect(p.out.trim().length).toBeGreaterThan(0);
  }, HEAVY_MS);

  test("the script type-checks against the package's declarations; a wrong use does not", () => {
    const { project } = installWithBun();
    copyFileSync(join(import.meta.dir, "package", "consumer.ts"), join(project, "consumer.ts"));
    // `bun init`'s compiler options; @types/bun from this repository
    writeFileSync(join(project, "tsconfig.json"), JSON.stringify({
      compilerOptions: {
        lib: ["ESNext"], target: "ESNext", module: "Preserve", moduleDetection: "force",
        allowJs: true, types: ["bun"], typeRoots: [join(root, "node_modules", "@types")],
        moduleResolution: "bundler", allowImportingTsExtensions: true, verbatimModuleSyntax: true,
        noEmit: true, strict: true, skipLibCheck: true, noFallthroughCasesInSwitch: true,
        noUncheckedIndexedAccess: true, noImplicitOverride: true,
      },
      include: ["*.ts"],
    }));
    const tsc = [process.execPath, join(root, "node_modules", "typescript", "bin", "tsc"), "--noEmit", "-p", "."];
    const good = run(tsc, project);
    expect(good.out + good.err).toBe("");
    expect(good.code).toBe(0);

    mkdirSync(join(project, "wrong"));
    writeFileSync(join(project, "wrong", "tsconfig.json"), JSON.stringify({
      extends: "../tsconfig.json", compilerOptions: { typeRoots: [join(root, "node_modules", "@types")] },
      include: ["*.ts"],
    }));
    writeFileSync(join(project, "wrong", "wrong.ts"), [
      'import { loadModel } from "infer";',
      'const model = await loadModel("gemma-3-270m-q4_k_m");',
      "const n: number = (await model.complete(\"x\", { maxTokens: 1 })).text;",
      "console.log(n);", ""].join("\n"));
    const bad = run([...tsc.slice(0, -1), "wrong"], project);
    expect(bad.code).not.toBe(0);
    expect(bad.out).toContain("wrong.ts(3,7): error TS2322: Type 'string' is not assignable to type 'number'.");
  }, HEAVY_MS);
});
