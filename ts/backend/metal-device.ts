// What the Metal backend needs of a device, so that one backend (metal.ts) and one dispatch plan
// (metal-plan.ts) run both on Apple hardware (ts/native/metal.ts over lib/metal) and, on Linux,
// on the CPU emulation of the same kernels (test/support/metal-emu.ts). Buffers are shared
// memory: the CPU reads and writes their contents directly (unified memory on Apple silicon).
import { InferError } from "../errors.ts";
import type { KernelDispatch } from "./metal-plan.ts";

export interface MetalBuffer {
  readonly bytes: number;
  /** The CPU's view of the contents (valid while the buffer lives). */
  readonly view: Uint8Array;
}

/** A buffer and a byte offset into it, for one [[buffer(n)]] of a dispatch. */
export interface MetalBinding {
  readonly buffer: MetalBuffer;
  readonly offset: number;
}

export interface MetalDevice {
  readonly name: string;
  /** The largest buffer the device makes or wraps (bigger models are split: metal-views.ts). */
  readonly maxBufferLength: number;
  newBuffer(bytes: number, what: string): MetalBuffer;
  /** A buffer over `bytes` of native memory at `address` (page aligned), without copying. */
  wrap(address: number, bytes: number, what: string): MetalBuffer;
  /** Encodes one dispatch into the current command buffer (begun on first use). */
  encode(dispatch: KernelDispatch, bindings: Readonly<Record<string, MetalBinding>>): void;
  /**
   * The dispatches encoded so far finish (their writes visible) before any encoded after; those
   * between two barriers may run in any order or at once (metal-hazards.ts places them).
   */
  barrier(): void;
  /** Commits the command buffer, if any, and waits for it. */
  flush(): void;
  /** Dispatches encoded since the last flush. */
  readonly pending: number;
  release(buffer: MetalBuffer): void;
  dispose(): void;
}

/** The binding of each [[buffer(n)]] of `dispatch`, by index, checked against the plan's names. */
export function orderBindings(dispatch: KernelDispatch,
  bindings: Readonly<Record<string, MetalBinding>>): { index: number; binding: MetalBinding }[] {
  const out: { index: number; binding: MetalBinding }[] = [];
  for (const [name, index] of Object.entries(dispatch.buffers)) {
    const binding = bindings[name];
    if (!binding) throw new InferError("internal", `${dispatch.kernel}: no buffer bound to '${name}'`);
    if (binding.offset < 0 || binding.offset > binding.buffer.bytes) {
      throw new InferError("internal", `${dispatch.kernel}: offset ${binding.offset} outside '${name}'`);
    }
    out.push({ index, binding });
  }
  for (const name of Object.keys(bindings)) {
    if (!(name in dispatch.buffers)) throw new InferError("internal", `${dispatch.kernel} has no buffer '${name}'`);
  }
  return out;
}
