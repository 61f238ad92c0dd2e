// The CUDA side of the native facade: initialisation (libcuda is loaded by the library at run
// time, the kernels from a fatbin built by shaders/cuda/build.sh), device info, and the calls that
// need out-parameters or views of native memory. Device addresses are plain numbers.
// Settings (ts/config/env.ts): INFER_CUDA_KERNELS, INFER_CUDA_DEVICE, INFER_CUDA_SYNC.
import { toArrayBuffer, type Pointer } from "bun:ffi";
import { dirname, join } from "node:path";
import { setting } from "../config/env.ts";
import { InferError, type InferErrorCode } from "../errors.ts";
import { check, libraryPath, native } from "./lib.ts";

export interface CudaDeviceInfo {
  readonly name: string;
  readonly totalBytes: number;
  readonly freeBytes: number;
  readonly multiprocessors: number;
  /** major * 10 + minor (90 for H100/H200). */
  readonly computeCapability: number;
  readonly driverVersion: number;
  readonly l2Bytes: number;
}

export function cudaKernelsPath(): string {
  return setting("INFER_CUDA_KERNELS") ?? join(dirname(libraryPath()), "infer.fatbin");
}

const codes: InferErrorCode[] = ["internal", "invalid_argument", "io", "out_of_memory", "unsupported", "internal"];
let initError: InferError | null = null;
let initialized = false;

/** Initialises CUDA once; throws InferError ("CUDA not available: <reason>", code unsupported). */
export function cudaInit(): void {
  if (initialized) return;
  if (initError) throw initError;
  let lib: ReturnType<typeof native>;
  try {
    lib = native();
  } catch (err) {
    initError = new InferError("unsupported", `CUDA not available: ${(err as Error).message}`);
    throw initError;
  }
  const path = Buffer.from(cudaKernelsPath(), "utf8");
  const device = setting("INFER_CUDA_DEVICE");
  const rc = lib.infer_cuda_init(path, path.length, device);
  if (rc !== 0) {
    initError = new InferError(codes[rc] ?? "internal", String(lib.infer_last_error()));
    throw initError;
  }
  initialized = true;
  if (setting("INFER_CUDA_SYNC")) lib.infer_cuda_set_debug_sync(true);
}

/** Whether CUDA can be used here, and why not. Never throws. */
export function cudaStatus(): { available: true; info: CudaDeviceInfo } | { available: false; reason: string } {
  try {
    cudaInit();
    return { available: true, info: cudaDeviceInfo() };
  } catch (err) {
    return { available: false, reason: (err as Error).message };
  }
}

export function cudaDeviceInfo(): CudaDeviceInfo {
  const lib = native();
  const name = new Uint8Array(256);
  const out = new BigInt64Array(6);
  check(lib.infer_cuda_device_info(name, name.length, out), "CUDA device info");
  const end = name.indexOf(0);
  return {
    name: Buffer.from(name.subarray(0, end < 0 ? name.length : end)).toString("utf8"),
    totalBytes: Number(out[0]), freeBytes: Number(out[1]), multiprocessors: Number(out[2]),
    computeCapability: Number(out[3]), driverVersion: Number(out[4]), l2Bytes: Number(out[5]),
  };
}

/** Device memory; throws InferError out_of_memory with the device's free/total memory. */
export function cudaMalloc(bytes: number, what: string): number {
  const out = new BigUint64Array(1);
  check(native().infer_cuda_malloc(bytes, out), what);
  return Number(out[0]);
}

/** Page-locked host memory and a view of it (valid until cudaHostFree). */
export function cudaHostAlloc(bytes: number, what: string): { address: number; buffer: ArrayBuffer } {
  const out = new BigUint64Array(1);
  check(native().infer_cuda_host_alloc(bytes, out), what);
  const address = Number(out[0]);
  return { address, buffer: toArrayBuffer(address as Pointer, 0, bytes) };
}

/** Ends a capture: the executable graph's handle. */
export function cudaCaptureEnd(): number {
  const out = new BigUint64Array(1);
  check(native().infer_cuda_capture_end(out), "CUDA graph capture");
  return Number(out[0]);
}

/**
 * Loads NCCL (libnccl.so.2, at run time, for several GPUs: lib/cuda/nccl.zig) and returns its
 * version code (major*10000 + minor*100 + patch); throws InferError "NCCL not available: …"
 * (code unsupported) where it is missing.
 */
export function ncclVersion(): number {
  const lib = native();
  check(lib.infer_nccl_load(), "nccl");
  const out = new Int32Array(1);
  check(lib.infer_nccl_version(out), "nccl version");
  return out[0];
}
