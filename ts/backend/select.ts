// Choosing a backend: `cpu`, `cuda`, `metal`, or `auto` (Metal on Apple silicon, else CUDA when
// it is available here, else the CPU).
// Engine.open takes the kind (default cpu); the library and the CLI pass --backend, or INFER_BACKEND, or auto.
import { setting } from "../config/env.ts";
import { InferError } from "../errors.ts";
import type { Backend } from "./backend.ts";
import { CpuBackend } from "./cpu.ts";
import { CudaBackend } from "./cuda.ts";
import { MetalBackend } from "./metal.ts";

export const backendKinds = ["cpu", "cuda", "metal", "auto"] as const;
export type BackendKind = (typeof backendKinds)[number];

export function parseBackendKind(value: string, what = "--backend"): BackendKind {
  if ((backendKinds as readonly string[]).includes(value)) return value as BackendKind;
  throw new InferError("invalid_argument", `${what} must be one of ${backendKinds.join(", ")}, got '${value}'`);
}

/** The kind asked for, else INFER_BACKEND, else `fallback`. */
export function defaultBackendKind(fallback: BackendKind = "cpu"): BackendKind {
  const env = setting("INFER_BACKEND");
  return env !== null ? parseBackendKind(env, "INFER_BACKEND") : fallback;
}

/** Apple silicon, where `auto` prefers Metal. */
export function isAppleSilicon(): boolean {
  return process.platform === "darwin" && process.arch === "arm64";
}

/**
 * A backend of `kind`. `cuda` throws InferError("CUDA not available: <reason>") where there is no
 * driver, GPU or kernel file, `metal` InferError("Metal not available: <reason>") off macOS or
 * without a Metal device; `auto` then falls back to the CPU.
 */
export function createBackend(kind: BackendKind): Backend {
  return chooseBackend(kind).backend;
}

/** How chooseBackend reaches the devices; tests replace them to inject a set-up failure. */
export interface BackendOpeners {
  readonly metal: () => Backend;
  readonly cuda: () => Backend;
  readonly appleSilicon: boolean;
  /** Where the one line about a failed GPU set-up goes (stderr). */
  readonly warn: (line: string) => void;
}

const systemOpeners: BackendOpeners = {
  metal: () => MetalBackend.open(),
  cuda: () => CudaBackend.open(),
  appleSilicon: isAppleSilicon(),
  warn: (line) => console.warn(line),
};

/**
 * As createBackend, with why this backend: asked for, or what `auto` found (-v says it). `auto`
 * takes the CPU when the GPU is absent ("unsupported", or no native library), and also when
 * Metal is there but its set-up fails (a kernel the compiler rejects, a pipeline it cannot make):
 * that is a fault the user should see without -v, so it is also one line on stderr.
 */
export function chooseBackend(kind: BackendKind, openers: BackendOpeners = systemOpeners): { backend: Backend; why: string } {
  const device = (be: Backend) => {
    const m = be.deviceMemory?.();
    return m ? `${m.name}, ${(m.freeBytes / 2 ** 30).toFixed(1)} GiB free` : be.name;
  };
  if (kind === "cpu") return { backend: new CpuBackend(), why: "asked for" };
  if (kind === "cuda" || kind === "metal") {
    const backend = kind === "cuda" ? openers.cuda() : openers.metal();
    return { backend, why: `asked for: ${device(backend)}` };
  }
  const metal = openers.appleSilicon;
  try {
    const backend = metal ? openers.metal() : openers.cuda();
    return { backend, why: `auto: ${device(backend)}` };
  } catch (err) {
    const code = err instanceof InferError ? err.code : null;
    if (code === "unsupported" || code === "native_unavailable") {
      return { backend: new CpuBackend(), why: `auto: ${(err as Error).message}` };
    }
    if (metal && err instanceof Error) {
      const first = err.message.split("\n")[0];
      const reason = first.length > 300 ? `${first.slice(0, 300)}…` : first;
      openers.warn(`infer: the Metal backend failed to start, using the CPU: ${reason}`);
      return { backend: new CpuBackend(), why: `auto: Metal failed to start (${reason}), using the CPU` };
    }
    throw err;
  }
}
