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

/** As createBackend, with why this backend: asked for, or what `auto` found (-v says it). */
export function chooseBackend(kind: BackendKind): { backend: Backend; why: string } {
  const device = (be: Backend) => {
    const m = be.deviceMemory?.();
    return m ? `${m.name}, ${(m.freeBytes / 2 ** 30).toFixed(1)} GiB free` : be.name;
  };
  if (kind === "cpu") return { backend: new CpuBackend(), why: "asked for" };
  if (kind === "cuda" || kind === "metal") {
    const backend = kind === "cuda" ? CudaBackend.open() : MetalBackend.open();
    return { backend, why: `asked for: ${device(backend)}` };
  }
  try {
    const backend = isAppleSilicon() ? MetalBackend.open() : CudaBackend.open();
    return { backend, why: `auto: ${device(backend)}` };
  } catch (err) {
    if (err instanceof InferError && (err.code === "unsupported" || err.code === "native_unavailable")) {
      return { backend: new CpuBackend(), why: `auto: ${err.message}` };
    }
    throw err;
  }
}
