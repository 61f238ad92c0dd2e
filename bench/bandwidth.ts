// Memory read bandwidth of this machine: a read-only pass over a buffer far larger than the
// caches, split over libinfer's thread pool (bench/bandwidth.zig bench_read, built by build.zig
// into zig-out/lib beside libinfer). Decode at batch 1 reads every weight once per token, so
// bandwidth / bytes of weights is the most tokens/s any engine can reach.
//   bun bench/bandwidth.ts [--threads N] [--mib 1024] [--passes 10]   prints one JSON line
import { dlopen, FFIType } from "bun:ffi";
import { existsSync } from "node:fs";
import { join } from "node:path";

/** The probe's library: zig-out/lib beside bench/ (a bench snapshot copies both). */
function probe(): (buf: Uint8Array, bytes: number, threads: number) => number {
  const ext = process.platform === "darwin" ? "dylib" : "so";
  const path = join(import.meta.dir, "..", "zig-out", "lib", `libbench-bandwidth.${ext}`);
  if (!existsSync(path)) throw new Error(`${path} is missing: run 'bun run build:lib'`);
  const lib = dlopen(path, { bench_read: { args: [FFIType.ptr, FFIType.u64, FFIType.u32], returns: FFIType.f64 } });
  return lib.symbols.bench_read;
}

export interface Bandwidth {
  /** Best pass, GB/s (1e9 bytes/s): the limit the table divides by. */
  readonly bestGBs: number;
  readonly medianGBs: number;
  readonly bytes: number;
  readonly threads: number;
}

export function measureBandwidth(threads: number, mib = 1024, passes = 10): Bandwidth {
  const read = probe();
  const bytes = mib * 1024 * 1024;
  const buf = new Uint8Array(bytes);
  // Touch every page with non-zero data (an untouched page would map the shared zero page).
  for (let i = 0; i < bytes; i += 4096) buf[i] = (i >>> 12) & 0xff | 1;
  read(buf, bytes, threads); // warm-up: starts the pool, faults in the TLB
  const rates: number[] = [];
  for (let p = 0; p < passes; p++) {
    const t0 = performance.now();
    const sum = read(buf, bytes, threads);
    const ms = performance.now() - t0;
    if (sum < 0) throw new Error("bench_read rejected its arguments");
    rates.push(bytes / (ms / 1000) / 1e9);
  }
  rates.sort((a, b) => a - b);
  return { bestGBs: rates[rates.length - 1], medianGBs: rates[rates.length >> 1], bytes, threads };
}

if (import.meta.main) {
  const arg = (name: string, fallback: number) => {
    const i = process.argv.indexOf(name);
    return i >= 0 ? Number(process.argv[i + 1]) : fallback;
  };
  const { availableParallelism } = await import("node:os");
  console.log(JSON.stringify(measureBandwidth(arg("--threads", availableParallelism()), arg("--mib", 1024),
    arg("--passes", 10))));
}
