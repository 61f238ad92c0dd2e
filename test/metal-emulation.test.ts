// Method: the emulated Metal execution model must be able to fail a kernel. Small test-only
// kernels with a missing barrier (read-after-write and write-after-read races on threadgroup
// memory) must give a wrong answer under some of 16 scheduling seeds, while the same kernels with
// their barriers give the right one under all 16; a barrier not reached by every thread and
// lanes meeting at different simdgroup operations must be reported as errors; simd_sum,
// shuffles and simdgroup_matrix load / multiply-accumulate / store must follow Metal's semantics
// (matrix misuse an error, a matrix load racing another simdgroup's stores or overwrite a wrong
// answer under some seed, the latter only because simdgroups drift apart). The fiber switch and the OS threads must not change a
// result: the same bits on 1 and 4 threads, and the AArch64 switch (a Mac-like host's) right
// under qemu-user where it is installed.
import { beforeAll, describe, expect, test } from "bun:test";
import { packArgs, type KernelDispatch } from "../ts/backend/metal-plan.ts";
import type { MetalBuffer } from "../ts/backend/metal-device.ts";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { metalShaderDir } from "../ts/backend/metal-shaders.ts";
import { EmulatedMetalDevice, emulatorSource, FLAGS } from "./support/metal-emu.ts";

const testKernels = `
#include <metal_stdlib>
using namespace metal;

// Sum of 64 values by thread 0 after every thread stored its own: needs the barrier.
kernel void test_sum(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                     constant EltwiseArgs& args [[buffer(2)]],
                     threadgroup float* partial [[threadgroup(0)]],
                     uint tid [[thread_index_in_threadgroup]]) {
    partial[tid] = x[tid];
    if (args.n_cols != 0) threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
        float s = 0.0f;
        for (uint i = 0; i < args.n; i++) s += partial[i];
        out[0] = s;
    }
}

// Rotate-by-one through threadgroup memory: reading a neighbour's slot and overwriting one's own
// needs a barrier between the read and the write.
kernel void test_rotate(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                        constant EltwiseArgs& args [[buffer(2)]],
                        threadgroup float* slots [[threadgroup(0)]],
                        uint tid [[thread_index_in_threadgroup]]) {
    slots[tid] = x[tid];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const float next = slots[(tid + 1) % args.n];
    if (args.n_cols != 0) threadgroup_barrier(mem_flags::mem_threadgroup);
    slots[tid] = next * 2.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[tid] = slots[tid];
}

// Thread 5 returns early; the others wait at a barrier: undefined in Metal.
kernel void test_early_return(device float* out [[buffer(0)]], constant EltwiseArgs& args [[buffer(1)]],
                              uint tid [[thread_index_in_threadgroup]]) {
    if (tid == 5) return;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[tid] = 1.0f;
}

// Odd lanes call simd_sum, even lanes simd_max: divergent collectives.
kernel void test_divergent(device float* out [[buffer(0)]], constant EltwiseArgs& args [[buffer(1)]],
                           uint lane [[thread_index_in_simdgroup]]) {
    out[lane] = lane % 2 ? simd_sum(1.0f) : simd_max(1.0f);
}

kernel void test_simd(device float* out [[buffer(0)]], constant EltwiseArgs& args [[buffer(1)]],
                      uint lane [[thread_index_in_simdgroup]],
                      uint sg [[simdgroup_index_in_threadgroup]]) {
    const float v = float(lane + 100 * sg);
    const uint i = (sg * 32 + lane) * 4;
    out[i] = simd_sum(v);
    out[i + 1] = simd_max(v);
    out[i + 2] = simd_shuffle_down(v, 1);
    out[i + 3] = simd_shuffle_xor(v, 3);
}

// simdgroup_matrix: x holds A (8x8, rows of 8), B (8x8, loaded transposed) and C (rows of 11,
// loaded from origin (x 2, y 1)); out gets A·B^T + C in f32, stored plainly then transposed,
// and the same product with A and B rounded through f16 threadgroup memory.
kernel void test_matrix(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                        constant EltwiseArgs& args [[buffer(2)]],
                        threadgroup half* h [[threadgroup(0)]],
                        uint lane [[thread_index_in_simdgroup]]) {
    simdgroup_float8x8 a, b, c, d;
    simdgroup_load(a, x, 8);
    simdgroup_load(b, x + 64, 8, 0, true);
    simdgroup_load(c, x + 128, 11, ulong2(2, 1));
    simdgroup_multiply_accumulate(d, a, b, c);
    simdgroup_store(d, out, 8);
    simdgroup_store(d, out + 64, 8, 0, true);
    for (uint i = lane; i < 128; i += 32) h[i] = half(x[i]);
    simdgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_half8x8 ah, bh;
    simdgroup_load(ah, h, 8);
    simdgroup_load(bh, h + 64, 8, 0, true);
    simdgroup_float8x8 e = make_filled_simdgroup_matrix<float, 8>(0.5f);
    simdgroup_multiply_accumulate(e, ah, bh, e);
    simdgroup_store(e, out + 128, 8);
}

// Simdgroup 0 writes an 8x8 tile to threadgroup memory lane by lane, simdgroup 1 loads it as a
// matrix and stores it to out: the load needs a barrier after the writes (args.n_cols != 0).
kernel void test_matrix_race(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                             constant EltwiseArgs& args [[buffer(2)]],
                             threadgroup float* tile [[threadgroup(0)]],
                             uint sg [[simdgroup_index_in_threadgroup]],
                             uint lane [[thread_index_in_simdgroup]]) {
    if (sg == 0) {
        tile[lane] = x[lane];
        simd_sum(0.0f);  // a scheduling point between a lane's two stores
        tile[lane + 32] = x[lane + 32];
    }
    if (args.n_cols != 0) threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg == 1) {
        simdgroup_float8x8 m;
        simdgroup_load(m, tile, 8);
        simdgroup_store(m, out, 8);
    }
}

// Simdgroup 0 loads the tile as a matrix; simdgroup 1, one collective later, overwrites it: in
// lockstep the load always comes first, so only simdgroups drifting apart (as on a GPU) show the
// missing barrier (args.n_cols != 0 puts it in).
kernel void test_matrix_drift(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                              constant EltwiseArgs& args [[buffer(2)]],
                              threadgroup float* tile [[threadgroup(0)]],
                              uint sg [[simdgroup_index_in_threadgroup]],
                              uint lane [[thread_index_in_simdgroup]]) {
    tile[lane + 32 * sg] = x[lane + 32 * sg];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg == 0) {
        simdgroup_float8x8 m;
        simdgroup_load(m, tile, 8);
        simdgroup_store(m, out, 8);
    } else {
        simd_sum(0.0f);
    }
    if (args.n_cols != 0) threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg == 1) tile[lane] = tile[lane + 32] = -1.0f;
}

// mode (args.n): 0 lanes 0..15 alone load; 1 each lane passes its own address; 2 a matrix never
// loaded is stored.
kernel void test_matrix_misuse(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                               constant EltwiseArgs& args [[buffer(2)]],
                               uint lane [[thread_index_in_simdgroup]]) {
    simdgroup_float8x8 m;
    if (args.n == 0 && lane < 16) simdgroup_load(m, x, 8);
    if (args.n == 1) simdgroup_load(m, x + lane, 8);
    if (args.n == 2) simdgroup_store(m, out, 8);
}
`;

let device: EmulatedMetalDevice;
// The first run after a shader change compiles the emulator: minutes on a loaded machine.
beforeAll(() => {
  device = new EmulatedMetalDevice({ extraSource: testKernels });
}, { timeout: 600_000 });

function dispatch(kernel: string, threads: number, buffers: Record<string, number>, argsIndex: number,
  values: { n: number; n_cols: number }, threadgroupBytes = 0): KernelDispatch {
  return {
    kernel, grid: [1, 1, 1], threads: [threads, 1, 1], threadgroupBytes, buffers, writes: ["out"],
    args: { struct: "EltwiseArgs", index: argsIndex, bytes: packArgs("EltwiseArgs", { ...values, scale: 1 }) },
  };
}

function runOnce(d: KernelDispatch, inputs: Record<string, Float32Array>): Record<string, Float32Array> {
  const bufs: Record<string, MetalBuffer> = {};
  for (const [name, data] of Object.entries(inputs)) {
    bufs[name] = device.newBuffer(data.byteLength, name);
    bufs[name].view.set(new Uint8Array(data.buffer));
  }
  try {
    device.encode(d, Object.fromEntries(Object.entries(bufs).map(([k, b]) => [k, { buffer: b, offset: 0 }])));
    device.flush();
    return Object.fromEntries(Object.entries(bufs).map(([k, b]) => [k, new Float32Array(b.view.slice().buffer)]));
  } finally {
    for (const b of Object.values(bufs)) device.release(b);
  }
}

const SEEDS = 16;

describe("the emulation catches what Metal leaves undefined", () => {
  test("a missing barrier before reading other threads' stores fails under some seed", () => {
    const x = new Float32Array(64).map((_, i) => i + 1);
    const outcomes = (barrier: boolean) => Array.from({ length: SEEDS }, () =>
      runOnce(dispatch("test_sum", 64, { x: 0, out: 1 }, 2, { n: 64, n_cols: barrier ? 1 : 0 }, 256),
        { x, out: new Float32Array(1) }).out[0]);
    expect(outcomes(true).every((s) => s === 2080)).toBe(true);
    expect(outcomes(false).some((s) => s !== 2080)).toBe(true);
  });

  test("a missing barrier between a read and an overwrite fails under some seed", () => {
    const x = new Float32Array(96).map((_, i) => i);
    const want = Array.from(x, (_, i) => 2 * x[(i + 1) % 96]);
    const outcomes = (barrier: boolean) => Array.from({ length: SEEDS }, () =>
      Array.from(runOnce(dispatch("test_rotate", 96, { x: 0, out: 1 }, 2, { n: 96, n_cols: barrier ? 1 : 0 }, 384),
        { x, out: new Float32Array(96) }).out));
    expect(outcomes(true).every((o) => Bun.deepEquals(o, want))).toBe(true);
    expect(outcomes(false).some((o) => !Bun.deepEquals(o, want))).toBe(true);
  });

  test("a barrier that some threads never reach is an error", () => {
    expect(() => runOnce(dispatch("test_early_return", 64, { out: 0 }, 1, { n: 64, n_cols: 0 }),
      { out: new Float32Array(64) })).toThrow(/barrier/);
  });

  test("lanes meeting at different simdgroup operations is an error", () => {
    expect(() => runOnce(dispatch("test_divergent", 32, { out: 0 }, 1, { n: 32, n_cols: 0 }),
      { out: new Float32Array(32) })).toThrow(/different simdgroup operations/);
  });

  test("simd_sum, simd_max and shuffles per simdgroup, as Metal defines them", () => {
    const out = runOnce(dispatch("test_simd", 64, { out: 0 }, 1, { n: 64, n_cols: 0 }),
      { out: new Float32Array(64 * 4) }).out;
    for (let sg = 0; sg < 2; sg++) {
      for (let lane = 0; lane < 32; lane++) {
        const i = (sg * 32 + lane) * 4, base = 100 * sg;
        expect(out[i]).toBe(496 + 3200 * sg);
        expect(out[i + 1]).toBe(31 + base);
        // Shuffling down past the last lane reads no lane: undefined, NaN here.
        if (lane < 31) expect(out[i + 2]).toBe(lane + 1 + base);
        else expect(out[i + 2]).toBeNaN();
        expect(out[i + 3]).toBe((lane ^ 3) + base);
      }
    }
  });
});

describe("simdgroup_matrix: Metal's semantics, and what it leaves undefined", () => {
  const rand = (() => { let s = 12345; return () => ((s = (s * 1103515245 + 12345) >>> 0) / 2 ** 32) * 2 - 1; })();
  const x = new Float32Array(128 + 9 * 11 + 8).map(() => Math.round(rand() * 64) / 16);
  const f16 = (v: number) => { const h = new Float16Array(1); h[0] = v; return h[0]; };

  test("load (plain, transposed, with stride and origin), multiply-accumulate, store", () => {
    for (const threads of [32, 64]) {
      const out = runOnce(dispatch("test_matrix", threads, { x: 0, out: 1 }, 2, { n: 0, n_cols: 0 }, 256),
        { x, out: new Float32Array(192).fill(NaN) }).out;
      for (let r = 0; r < 8; r++) {
        for (let c = 0; c < 8; c++) {
          let sum = 0, sumHalf = 0;
          for (let k = 0; k < 8; k++) {
            sum += x[r * 8 + k] * x[64 + c * 8 + k];
            sumHalf += f16(x[r * 8 + k]) * f16(x[64 + c * 8 + k]);
          }
          const want = sum + x[128 + (1 + r) * 11 + 2 + c];
          expect(out[r * 8 + c]).toBeCloseTo(want, 5);
          expect(out[64 + c * 8 + r]).toBe(out[r * 8 + c]);
          expect(out[128 + r * 8 + c]).toBeCloseTo(sumHalf + 0.5, 5);
        }
      }
    }
  });

  test("a load of another simdgroup's stores without a barrier fails under some seed", () => {
    const want = Array.from(x.subarray(0, 64));
    const outcomes = (barrier: boolean) => Array.from({ length: SEEDS }, () =>
      Array.from(runOnce(dispatch("test_matrix_race", 64, { x: 0, out: 1 }, 2, { n: 0, n_cols: barrier ? 1 : 0 }, 256),
        { x, out: new Float32Array(64) }).out));
    expect(outcomes(true).every((o) => Bun.deepEquals(o, want))).toBe(true);
    expect(outcomes(false).some((o) => !Bun.deepEquals(o, want))).toBe(true);
  });

  test("simdgroups drift apart: an overwrite one collective after another simdgroup's load needs a barrier", () => {
    const want = Array.from(x.subarray(0, 64));
    const outcomes = (barrier: boolean) => Array.from({ length: SEEDS }, () =>
      Array.from(runOnce(dispatch("test_matrix_drift", 64, { x: 0, out: 1 }, 2, { n: 0, n_cols: barrier ? 1 : 0 }, 256),
        { x, out: new Float32Array(64) }).out));
    expect(outcomes(true).every((o) => Bun.deepEquals(o, want))).toBe(true);
    expect(outcomes(false).some((o) => !Bun.deepEquals(o, want))).toBe(true);
  });

  test("an operation not reached by all 32 lanes, or with lanes' arguments apart, is an error", () => {
    const misuse = (mode: number, threads = 32) => () => runOnce(
      dispatch("test_matrix_misuse", threads, { x: 0, out: 1 }, 2, { n: mode, n_cols: 0 }),
      { x, out: new Float32Array(64) });
    expect(misuse(0)).toThrow(/not reached by every lane/);
    expect(misuse(1)).toThrow(/different memory or layout/);
    expect(misuse(1, 16)).toThrow(/fewer than 32 threads/);
    const never = runOnce(dispatch("test_matrix_misuse", 32, { x: 0, out: 1 }, 2, { n: 2, n_cols: 0 }),
      { x, out: new Float32Array(64) }).out;
    expect(never.every(Number.isNaN)).toBe(true);
  });
});

describe("the fiber switch and the OS threads", () => {
  // rms_norm over 40 rows: 40 threadgroups of 256 fibers meeting at simd_sums and barriers.
  const rows = 40, cols = 640;
  const x = new Float32Array(rows * cols).map((_, i) => Math.sin(i * 0.37));
  const weight = new Float32Array(cols).map((_, i) => 1 + 0.001 * i);
  const norm = (): KernelDispatch => ({
    kernel: "rms_norm", grid: [rows, 1, 1], threads: [256, 1, 1], threadgroupBytes: 32,
    buffers: { x: 0, weight: 1, out: 2 }, writes: ["out"],
    args: { struct: "RmsNormArgs", index: 3,
      bytes: packArgs("RmsNormArgs", { n_cols: cols, eps: 1e-6, has_weight: 1 }) },
  });

  test("a dispatch gives the same bits on 1 and 4 OS threads", () => {
    const outputs = [1, 4].map((workers) => {
      const d = new EmulatedMetalDevice({ seed: 3, workers });
      const b = { x: d.newBuffer(x.byteLength, "x"), weight: d.newBuffer(weight.byteLength, "w"),
        out: d.newBuffer(x.byteLength, "out") };
      try {
        b.x.view.set(new Uint8Array(x.buffer));
        b.weight.view.set(new Uint8Array(weight.buffer));
        d.encode(norm(), { x: { buffer: b.x, offset: 0 }, weight: { buffer: b.weight, offset: 0 },
          out: { buffer: b.out, offset: 0 } });
        d.flush();
        return new Float32Array(b.out.view.slice().buffer);
      } finally {
        for (const buffer of Object.values(b)) d.release(buffer);
        d.dispose();
      }
    });
    expect(Bun.deepEquals(outputs[0], outputs[1])).toBe(true);
    expect(outputs[0].every(Number.isFinite)).toBe(true);
  }, 600_000); // its emulator (no test kernels) may be a cold build

  // The AArch64 switch (a Mac-like host's) cannot run natively here: built static for
  // aarch64-linux and run under qemu-user where it is installed.
  const qemu = ["/usr/bin/qemu-aarch64-static", "/usr/bin/qemu-aarch64"].find((p) => existsSync(p));
  if (!qemu) {
    console.log("  skipped: the AArch64 fiber switch needs qemu-user (apt-get install qemu-user-static)");
  }
  test.skipIf(!qemu)("the AArch64 fiber switch runs rms_norm right under qemu, on 1, 2 and 4 threads", () => {
    const dir = mkdtempSync(join(tmpdir(), "infer-metal-emu-a64-"));
    try {
      const main = `
#include <stdio.h>
#include <math.h>
int main() {
    static float x[${rows * cols}], w[${cols}], out[${rows * cols}];
    for (unsigned i = 0; i < ${rows * cols}; i++) x[i] = sinf(i * 0.37f);
    for (unsigned i = 0; i < ${cols}; i++) w[i] = 1.0f + 0.001f * i;
    struct { unsigned n_cols; float eps; unsigned has_weight; } args = {${cols}, 1e-6f, 1};
    void* bufs[4] = {x, w, out, &args};
    unsigned dims[6] = {${rows}, 1, 1, 256, 1, 1};
    int bad = 0;
    for (unsigned workers = 1; workers <= 4; workers *= 2) {
        infer_emu_set_workers(workers);
        if (infer_emu_dispatch(infer_emu_kernel_index("rms_norm"), dims, bufs, 32, 7)) {
            printf("%s\\n", infer_emu_error());
            return 2;
        }
        for (unsigned r = 0; r < ${rows}; r++) {
            double ss = 0;
            for (unsigned c = 0; c < ${cols}; c++) {
                ss += double(x[r * ${cols} + c]) * x[r * ${cols} + c];
            }
            const double scale = 1.0 / sqrt(ss / ${cols} + 1e-6);
            for (unsigned c = 0; c < ${cols}; c++) {
                if (fabs(out[r * ${cols} + c] - x[r * ${cols} + c] * scale * w[c]) > 1e-4) bad++;
            }
        }
    }
    printf("%d wrong\\n", bad);
    return bad != 0;
}
`;
      const cpp = join(dir, "emu.cpp"), exe = join(dir, "emu");
      writeFileSync(cpp, emulatorSource() + main);
      const flags = FLAGS.filter((f) => f !== "-shared" && f !== "-fPIC");
      const cc = Bun.spawnSync(["python3", "-m", "ziglang", "cc", "-target", "aarch64-linux-musl", "-static",
        ...flags, "-I", join(metalShaderDir(), "compat"), "-I", metalShaderDir(), cpp, "-o", exe],
      { stdout: "pipe", stderr: "pipe" });
      expect(cc.stderr.toString()).toBe("");
      expect(cc.exitCode).toBe(0);
      const run = Bun.spawnSync([qemu!, exe], { stdout: "pipe", stderr: "pipe" });
      expect(run.stdout.toString().trim()).toBe("0 wrong");
      expect(run.exitCode).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);
});
