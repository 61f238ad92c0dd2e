// Method: the emulated Metal execution model must be able to fail a kernel. Small test-only
// kernels with a missing barrier (read-after-write and write-after-read races on threadgroup
// memory) must give a wrong answer under some of 16 scheduling seeds, while the same kernels with
// their barriers give the right one under all 16; a barrier not reached by every thread and
// lanes meeting at different simdgroup operations must be reported as errors; simd_sum and
// shuffles must follow Metal's semantics.
import { beforeAll, describe, expect, test } from "bun:test";
import { packArgs, type KernelDispatch } from "../ts/backend/metal-plan.ts";
import type { MetalBuffer } from "../ts/backend/metal-device.ts";
import { EmulatedMetalDevice } from "./support/metal-emu.ts";

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
`;

let device: EmulatedMetalDevice;
beforeAll(() => {
  device = new EmulatedMetalDevice({ extraSource: testKernels });
});

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
