// Whether a model fits before anything is allocated. A file's sizes are untrusted: a 4 MB file
// can ask for 1,024 heads of 1,024 values, and `-c 999999999` for a KV cache of terabytes;
// allocating first ended in "RangeError: Out of memory" (or the kernel's OOM killer). The plan
// adds what a context takes: the weights (mapped, or their repacked copies, which replace the
// mapped pages), the activations planned for a batch, the KV cache of every slot for the chosen
// context, the token history and the attention's per-thread scratch; it is compared with the
// memory this process can still get: MemAvailable (the machine's memory where there is no
// /proc/meminfo), a cgroup's limit, and an address-space limit (ulimit -v). llama.cpp allows a
// context beyond the trained one, and so does this: what does not fit is refused, not what is
// long.
import { readFileSync } from "node:fs";
import { totalmem } from "node:os";
import { kvBytes, type KvTypes } from "../backend/backend.ts";
import { InferError } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";
import type { ModelShape } from "../model/model.ts";
import { ringCells } from "./kv-cache.ts";

export interface MemoryPlanOptions {
  readonly contextLength: number;
  readonly maxBatch: number;
  /** Sequences with a KV cache of their own (the server's parallel slots). */
  readonly slots: number;
  readonly kvType: KvTypes;
  readonly threads: number;
  /**
   * Full-attention layers are mapped as positions are written (CUDA's paged cache,
   * ts/backend/kv-pages.ts): every slot's rings count, but the full layers of one slot's whole
   * context only, which any one request may fill; the scheduler admits more by what is mapped.
   */
  readonly pagedKv?: boolean;
}

/** Bytes by use; per-position figures are what each position of the context adds. */
export interface MemoryPlan {
  readonly weights: number;
  /** Activations planned for a batch, and a row of logits. */
  readonly activations: number;
  /** Every slot's KV cache for the chosen context. */
  readonly kvCache: number;
  readonly kvPerPosition: number;
  /** Token histories and the attention's per-thread scratch, host memory on every backend. */
  readonly other: number;
  readonly otherPerPosition: number;
}

export function memoryPlan(file: GgufFile, shape: ModelShape, o: MemoryPlanOptions): MemoryPlan {
  let weights = 0;
  for (const t of file.tensors.values()) weights += t.byteLength;
  const s = shape, q = s.heads * s.headDim, kv = s.kvHeads * s.headDim;
  // ts/model/layers.ts decoderBuffers (ids, positions, x, normed, branch, q, k, v, mixed, gate,
  // up) for maxBatch rows, and one row of logits.
  const rowFloats = 2 + 3 * s.embedding + 2 * q + 2 * kv + 2 * s.feedForward + (s.extraRowFloats ?? 0);
  const activations = 4 * (o.maxBatch * rowFloats + s.vocab);
  let kvCache = 0, kvPerPosition = 0;
  for (const k of s.kvShapes) {
    const rowBytes = kvBytes(o.kvType.k, k.kvHeads * k.headDim, k.headDim) + kvBytes(o.kvType.v, k.kvHeads * k.headDim, k.headDim);
    const ring = k.window > 0 ? ringCells(k.window, o.maxBatch) : 0;
    if (ring > 0 && ring < o.contextLength) kvCache += ring * rowBytes;
    else {
      kvCache += o.contextLength * rowBytes;
      kvPerPosition += rowBytes;
    }
  }
  // An Int32 of history per position per slot; each thread's attention scores (f32) and dense
  // f16 copies of a head's keys and values (lib/cpu/attention_f16.zig) per position.
  const otherPerPosition = 4 * o.slots + o.threads * (4 + 4 * s.headDim);
  const full = kvPerPosition * o.contextLength, rings = kvCache - full;
  const fullSlots = o.pagedKv ? 1 : o.slots;
  return {
    weights, activations, kvCache: rings * o.slots + full * fullSlots,
    kvPerPosition: kvPerPosition * fullSlots,
    other: otherPerPosition * o.contextLength, otherPerPosition,
  };
}

/** Memory this process can still get, and what limits it. */
export interface Available {
  readonly bytes: number;
  readonly what: string;
}

function readText(path: string): string | null {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return null;
  }
}

/** A `Name:  123 kB` field of /proc/meminfo or /proc/self/status, in bytes. */
function procField(text: string | null, name: string): number | null {
  const m = text?.match(new RegExp(`^${name}:\\s+(\\d+) kB`, "m"));
  return m ? Number(m[1]) * 1024 : null;
}

/** The host memory this process can still allocate: the tightest of the limits that apply. */
export function availableHostMemory(): Available {
  const found: Available[] = [];
  const memAvailable = procField(readText("/proc/meminfo"), "MemAvailable");
  // Elsewhere (macOS) the free figure leaves out the reclaimable cache and is often a small part
  // of what can be had: only what exceeds the machine's memory is refused there.
  found.push(memAvailable !== null ? { bytes: memAvailable, what: "the available memory" }
    : { bytes: totalmem(), what: "the machine's memory" });
  const max = readText("/sys/fs/cgroup/memory.max")?.trim();
  const current = Number(readText("/sys/fs/cgroup/memory.current")?.trim());
  if (max && /^\d+$/.test(max) && Number.isFinite(current)) {
    found.push({ bytes: Math.max(0, Number(max) - current), what: "the cgroup's memory limit" });
  }
  const limit = readText("/proc/self/limits")?.match(/^Max address space\s+(\d+)/m);
  const size = procField(readText("/proc/self/status"), "VmSize");
  if (limit && size !== null) {
    // The mapped file is counted here already, and again in the plan: a conservative figure
    // (repacked copies add address space even as their mapped pages are released).
    found.push({ bytes: Math.max(0, Number(limit[1]) - size), what: "the address-space limit" });
  }
  return found.reduce((a, b) => (b.bytes < a.bytes ? b : a));
}

export function formatBytes(n: number): string {
  if (n >= 2 ** 30) return `${(n / 2 ** 30).toFixed(1)} GiB`;
  if (n >= 2 ** 20) return `${(n / 2 ** 20).toFixed(1)} MiB`;
  return `${Math.ceil(n / 2 ** 10)} KiB`;
}

/** What one memory (the host's, or a GPU's) must hold: named parts, and per position. */
export interface MemoryNeed {
  readonly parts: readonly (readonly [string, number])[];
  readonly perPosition: number;
}

/** Everything in one memory (the CPU backend, or Metal's unified memory). */
export function hostNeed(p: MemoryPlan): MemoryNeed {
  return {
    parts: [["weights", p.weights], ["KV cache", p.kvCache], ["buffers", p.activations + p.other]],
    perPosition: p.kvPerPosition + p.otherPerPosition,
  };
}

/** A GPU's part (weights, activations, KV cache), the rest staying on the host. */
export function deviceNeeds(p: MemoryPlan): { device: MemoryNeed; host: MemoryNeed } {
  return {
    device: { parts: [["weights", p.weights], ["KV cache", p.kvCache], ["buffers", p.activations]],
      perPosition: p.kvPerPosition },
    host: { parts: [["buffers", p.other]], perPosition: p.otherPerPosition },
  };
}

/**
 * Throws InferError("out_of_memory") naming the sizes where `need` does not fit `available`,
 * with the context that would fit (or none, where the model is too large at any context).
 */
export function checkFits(need: MemoryNeed, o: { available: Available; contextLength: number }):
  void {
  const a = o.available;
  const total = need.parts.reduce((sum, [, bytes]) => sum + bytes, 0);
  if (total <= a.bytes) return;
  // Shorter contexts need at most this per position less (a ring layer's cache stops growing).
  const fixed = total - need.perPosition * o.contextLength;
  const fitting = need.perPosition > 0 ? Math.floor((a.bytes - fixed) / need.perPosition) : 0;
  const advice = fitting >= 1
    ? `: lower --ctx-size (a context of ${Math.min(fitting, o.contextLength - 1)} fits)`
    : ": the model does not fit at any --ctx-size";
  const parts = need.parts.filter(([, bytes]) => bytes > 0)
    .map(([name, bytes]) => `${name} ${formatBytes(bytes)}`).join(", ");
  throw new InferError("out_of_memory", `a context of ${o.contextLength} needs ` +
    `${formatBytes(total)} (${parts}), but ${a.what} is ${formatBytes(a.bytes)}${advice}`);
}
