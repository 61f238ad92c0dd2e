// The Metal side of the native facade (lib/metal through lib/exports/metal.zig's infer_metal_*): init
// from the kernels' source text, shared buffers and views of their contents, encoding and
// flushing. Buffer handles and addresses are plain numbers. On anything but macOS every call
// fails with InferError("unsupported", "Metal not available: ...").
import { toArrayBuffer, type Pointer } from "bun:ffi";
import { InferError } from "../errors.ts";
import { check, native } from "./lib.ts";

let initError: InferError | null = null;
let pipelineCount = -1;

/** Compiles `source` once per process; pipeline i is names[i]. Throws "Metal not available: …". */
export function metalInit(source: string, names: readonly string[]): number {
  if (pipelineCount >= 0) return pipelineCount;
  if (initError) throw initError;
  let lib: ReturnType<typeof native>;
  try {
    lib = native();
  } catch (err) {
    throw (initError = new InferError("unsupported", `Metal not available: ${(err as Error).message}`));
  }
  const src = Buffer.from(source, "utf8"), list = Buffer.from(names.join("\n"), "utf8");
  const out = new Uint32Array(1);
  const rc = lib.infer_metal_init(src, src.length, list, list.length, out);
  if (rc !== 0) {
    const message = String(lib.infer_last_error());
    throw (initError = new InferError(rc === 4 ? "unsupported" : "internal", message));
  }
  pipelineCount = out[0];
  return pipelineCount;
}

export function metalDeviceName(): string {
  const name = new Uint8Array(256);
  check(native().infer_metal_device_name(name, name.length), "Metal device name");
  const end = name.indexOf(0);
  return Buffer.from(name.subarray(0, end < 0 ? name.length : end)).toString("utf8");
}

export interface MetalDeviceLimits {
  readonly maxBufferLength: number;
  readonly recommendedMaxWorkingSetSize: number;
  readonly maxThreadgroupMemoryLength: number;
  readonly unifiedMemory: boolean;
}

export function metalDeviceLimits(): MetalDeviceLimits {
  const out = new BigUint64Array(4);
  check(native().infer_metal_device_limits(out), "Metal device limits");
  return { maxBufferLength: Number(out[0]), recommendedMaxWorkingSetSize: Number(out[1]),
    maxThreadgroupMemoryLength: Number(out[2]), unifiedMemory: out[3] !== 0n };
}

/** A shared buffer and the CPU's view of its contents. */
export function metalBufferNew(bytes: number, what: string): { handle: number; view: Uint8Array } {
  const out = new BigUint64Array(2);
  check(native().infer_metal_buffer_new(bytes, out.subarray(0, 1), out.subarray(1, 2)), what);
  const contents = Number(out[1]);
  return { handle: Number(out[0]), view: new Uint8Array(toArrayBuffer(contents as Pointer, 0, Math.max(bytes, 1))) };
}

/** A buffer over page-aligned native memory, without a copy. */
export function metalBufferWrap(address: number, bytes: number, what: string): number {
  const out = new BigUint64Array(1);
  check(native().infer_metal_buffer_wrap(address, bytes, out), what);
  return Number(out[0]);
}

export function metalBufferFree(handle: number): void {
  native().infer_metal_buffer_free(handle);
}

/** dims: grid (3) then threadgroup (3); bindings: (handle, offset) per buffer index. */
export function metalEncode(pipeline: number, dims: Uint32Array, threadgroupBytes: number,
  bindings: BigUint64Array, args: Uint8Array, argsIndex: number, what: string): void {
  check(native().infer_metal_encode(pipeline, dims, threadgroupBytes, bindings, bindings.length / 2, args,
    args.length, argsIndex), what);
}

/** A buffer barrier between the dispatches encoded so far and the ones that follow. */
export function metalBarrier(): void {
  check(native().infer_metal_barrier(), "Metal barrier");
}

export function metalFlush(): void {
  check(native().infer_metal_flush(), "Metal command buffer");
}
