// The CUDA side of the paged KV cache (ts/engine/kv-pages.ts): reserved address ranges and
// granules of device memory created and mapped into them through the driver's virtual memory
// management (lib/cuda/vmm.zig). Where the driver or the device lacks it, cudaPages returns why,
// and caches are allocated whole as before.
import { setting } from "../config/env.ts";
import { check, type native } from "../native/lib.ts";
import { cudaDeviceInfo } from "../native/cuda.ts";
import type { PhysicalPages } from "./kv-pages.ts";

type Lib = ReturnType<typeof native>;

/**
 * Device memory the pool leaves to other buffers that grow after caches are admitted (attention
 * scratch, cuBLAS's f16 copies, graphs): 5% of the card, at least 512 MiB.
 */
export function pageHeadroom(totalBytes: number): number {
  return Math.max(512 * 2 ** 20, Math.floor(totalBytes * 0.05));
}

/** The driver's pages, or why there are none. */
export function cudaPages(lib: Lib): PhysicalPages | string {
  if (!setting("INFER_CUDA_KV_PAGED")) return "INFER_CUDA_KV_PAGED=0";
  const out = new BigUint64Array(1);
  if (lib.infer_cuda_vmm_granularity(out) !== 0) return String(lib.infer_last_error());
  const granule = Number(out[0]);
  const budget = setting("INFER_CUDA_KV_BUDGET") * 2 ** 20;
  let mapped = 0;
  const one = (f: (o: BigUint64Array) => number, what: string) => {
    check(f(out), what);
    return Number(out[0]);
  };
  return {
    granule,
    reserve: (bytes) => one((o) => lib.infer_cuda_vmm_reserve(bytes, o), "reserving KV cache addresses"),
    addressFree: (address, bytes) => lib.infer_cuda_vmm_address_free(address, bytes),
    create: () => {
      const handle = one((o) => lib.infer_cuda_vmm_create(granule, o), "KV cache memory");
      mapped++;
      return handle;
    },
    map: (address, handle) =>
      check(lib.infer_cuda_vmm_map(address, granule, handle), "mapping KV cache memory"),
    unmap: (address, bytes) =>
      check(lib.infer_cuda_vmm_unmap(address, bytes), "unmapping KV cache memory"),
    copy: (dst, src, bytes) =>
      check(lib.infer_cuda_copy(dst, src, bytes), "copying a shared KV granule"),
    release: (handle) => {
      lib.infer_cuda_vmm_release(handle);
      mapped--;
    },
    available: () => {
      const info = cudaDeviceInfo();
      const device = Math.max(0, info.freeBytes - pageHeadroom(info.totalBytes));
      return budget > 0 ? Math.min(device, Math.max(0, budget - mapped * granule)) : device;
    },
  };
}
