// The CUDA tq3/tq4 store and read code (shaders/cuda/kv_turbo.cuh, kv_quant.cuh's kv_turbo_*)
// compiled for the host with g++ and run one thread a block, against the CPU backend's coder
// (lib/cpu/kv_turbo.zig through infer_kv_store / infer_kv_load). Method: the kernels' loops
// stride by blockDim, so one thread runs every step in an order the barriers allow, with the same
// f32 operations (no contraction: -ffp-contract=off, as nvcc's -fmad=false and the explicit
// __f*_rn); the bytes must equal the CPU's, and the rotated-domain levels dotted with the rotated
// query must equal the query dotted with the CPU's decoded vector. This checks the seeded signs,
// the Hadamard stage order, the level thresholds and the bit layout without a GPU (the GPU run in
// test/cuda-kv-quant.test.ts checks the same bytes on the device). Skipped without a C++ compiler (g++, or the pinned Zig's).
import { afterAll, describe, expect, test } from "bun:test";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { check, native } from "../ts/native/lib.ts";
import { randomF32 } from "./support/numeric.ts";

// g++ where there is one, else the pinned Zig's clang (always here: it builds the library)
const gxx: string[] | null = Bun.which("g++") ? ["g++"]
  : Bun.which("python3") ? ["python3", "-m", "ziglang", "c++"] : null;
if (!gxx) console.log("cuda-kv-turbo-host.test.ts: skipped: no C++ compiler");

const shaders = join(import.meta.dir, "..", "shaders", "cuda");

/** Stand-ins for the CUDA names the tq code uses: one thread, IEEE f32 operations, _Float16. */
const STUB = `#pragma once
#include <cstdint>
#include <cmath>
#include <cstddef>
using std::isfinite;
#define __device__
#define __forceinline__ inline
#define __host__
#define __global__
#define __shared__ static
#define __constant__
struct Dim { unsigned x; };
static Dim threadIdx{0}, blockDim{1}, blockIdx{0};
inline void __syncthreads() {}
inline void pdl_begin() {}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
struct __half { _Float16 v; };
inline __half __float2half_rn(float f) { return __half{(_Float16)f}; }
inline unsigned short __half_as_ushort(__half h) { unsigned short u; __builtin_memcpy(&u, &h, 2); return u; }
inline __half __ushort_as_half(unsigned short u) { __half h; __builtin_memcpy(&h, &u, 2); return h; }
inline float __half2float(__half h) { return (float)h.v; }
`;

/** kv_quant.cuh's type constants and its tq definitions, cut out by their first lines. */
function kvQuantPieces(): string {
  const lines = readFileSync(join(shaders, "kv_quant.cuh"), "utf8").split("\n");
  const starts = ["constexpr int KV_", "__host__ __device__ constexpr bool kv_turbo", "__host__ __device__ constexpr int kv_bytes",
    "__constant__ float kv_turbo_mags", "__device__ __forceinline__ float kv_turbo_scale", "__device__ __forceinline__ float kv_turbo_at"];
  const out: string[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (!starts.some((s) => lines[i].startsWith(s))) continue;
    let j = i;
    const oneLine = lines[i].endsWith(";") || (lines[i].includes("{") && lines[i].trimEnd().endsWith("}"));
    if (!oneLine) while (j < lines.length && lines[j] !== "}" && !lines[j].endsWith("};")) j++;
    out.push(...lines.slice(i, j + 1));
    i = j;
  }
  return out.join("\n");
}

const HARNESS = `#include "kv_turbo.cuh"
#include <cstdio>
#include <cstdlib>
#include <vector>
// args: type rows kv_heads head_dim anchored; stdin: rows·kv_dim f32 keys, then kv_dim f32 anchor
// (anchored); stdout: the cache's bytes, then every coordinate's kv_turbo_at, then tq_rotate of
// row 0 (forward), all f32.
int main(int argc, char** argv) {
  const int type = atoi(argv[1]), rows = atoi(argv[2]), kvh = atoi(argv[3]), hd = atoi(argv[4]), anchored = atoi(argv[5]);
  const int kvd = kvh * hd, row_bytes = kv_bytes(type, kvd, hd);
  std::vector<float> x(rows * kvd), a(kvd), q(kvd);
  if (fread(x.data(), 4, x.size(), stdin) != x.size()) return 1;
  if (anchored && fread(a.data(), 4, a.size(), stdin) != a.size()) return 1;
  std::vector<uint8_t> cache(rows * row_bytes);
  for (int b = 0; b < rows * kvh; b++) {
    blockIdx.x = b;
    kv_store_turbo(x.data(), kvh, hd, cache.data(), type, nullptr, 0, rows, 0, anchored ? a.data() : nullptr);
  }
  fwrite(cache.data(), 1, cache.size(), stdout);
  for (int r = 0; r < rows; r++)
    for (int h = 0; h < kvh; h++)
      for (int d = 0; d < hd; d++) {
        const float v = kv_turbo_at(cache.data() + r * row_bytes + kv_bytes(type, h * hd, hd), type, d, hd);
        fwrite(&v, 4, 1, stdout);
      }
  for (int b = 0; b < kvh; b++) {
    blockIdx.x = b;
    tq_rotate(x.data(), q.data(), hd, 0);
  }
  fwrite(q.data(), 4, kvd, stdout);
  return 0;
}
`;

const dir = mkdtempSync(join(tmpdir(), "infer-kv-turbo-host-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe.skipIf(!gxx)("the CUDA tq3/tq4 code on the host: the CPU's bytes", () => {
  const exe = join(dir, "kv-turbo-host");
  let built = "";
  test("compiles with g++ from the shaders' own text", () => {
    writeFileSync(join(dir, "kv_quant.cuh"), STUB + kvQuantPieces() + "\n");
    writeFileSync(join(dir, "kv_turbo.cuh"), readFileSync(join(shaders, "kv_turbo.cuh")));
    writeFileSync(join(dir, "harness.cpp"), HARNESS);
    const r = spawnSync(gxx![0], [...gxx!.slice(1), "-O1", "-std=c++17", "-ffp-contract=off", "-o", exe, join(dir, "harness.cpp")], { encoding: "utf8" });
    built = r.status === 0 ? exe : "";
    expect(r.stderr).toBe("");
    expect(r.status).toBe(0);
  }, 60_000);

  for (const type of [103, 104]) {
    for (const headDim of [8, 64, 128, 256]) {
      for (const anchored of [false, true]) {
        test(`${type === 103 ? "tq3" : "tq4"}, head_dim ${headDim}${anchored ? ", less an anchor" : ""}`, () => {
          expect(built).not.toBe("");
          const rows = 7, kvHeads = 2, kvd = kvHeads * headDim, n = rows * kvd;
          const x = randomF32(n, type + headDim + Number(anchored), 2);
          x[3] *= 40; // an outlier channel
          x.fill(0, kvd, kvd + headDim); // a zero vector (scale 0)
          const anchor = randomF32(kvd, 5, 1);
          const vectorBytes = 2 + (headDim * (type === 103 ? 3 : 4)) / 8, bytes = rows * kvHeads * vectorBytes;
          const want = new Uint8Array(bytes);
          check(native().infer_kv_store(x, want, type, n, headDim, anchored ? anchor : null, anchored ? kvd : 0), "kv_store");
          const input = new Uint8Array(x.byteLength + (anchored ? anchor.byteLength : 0));
          input.set(new Uint8Array(x.buffer, x.byteOffset, x.byteLength));
          if (anchored) input.set(new Uint8Array(anchor.buffer, anchor.byteOffset, anchor.byteLength), x.byteLength);
          const r = spawnSync(built, [type, rows, kvHeads, headDim, anchored ? 1 : 0].map(String), { input });
          expect(r.status).toBe(0);
          const out = new Uint8Array(r.stdout);
          expect(out.length).toBe(bytes + 4 * (n + kvd));
          let first = -1;
          for (let i = 0; i < bytes && first < 0; i++) if (out[i] !== want[i]) first = i;
          expect(first).toBe(-1);
          // <T q, level · scale> = <q, decoded - anchor>: the rotated domain the attention reads.
          const levels = new Float32Array(out.slice(bytes, bytes + 4 * n).buffer);
          const rotated = new Float32Array(out.slice(bytes + 4 * n).buffer);
          const decoded = new Float32Array(n);
          check(native().infer_kv_load(want, type, n, headDim, anchored ? anchor : null, anchored ? kvd : 0, decoded), "kv_load");
          let worst = 0;
          for (let row = 0; row < rows; row++) {
            for (let h = 0; h < kvHeads; h++) {
              let got = 0, ref = 0, size = 0;
              for (let i = h * headDim; i < (h + 1) * headDim; i++) {
                const key = decoded[row * kvd + i] - (anchored ? anchor[i] : 0);
                got += rotated[i] * levels[row * kvd + i];
                ref += x[i] * key;
                size += Math.abs(x[i] * key);
              }
              worst = Math.max(worst, Math.abs(got - ref) / (size + 1e-30));
            }
          }
          expect(worst).toBeLessThan(1e-4); // f32 rounding of two orders of sums
        });
      }
    }
  }
});
