// Method: every Metal kernel (shaders/metal, compiled as C++ under the emulated execution model of
// test/support/metal-emu.ts), dispatched as the Metal backend's plan dispatches it, on seeded random
// inputs with odd sizes, against libinfer's CPU kernels through ts/native (quantized weights made
// by infer_quantize_row and read back by infer_dequantize), by max normalised error under a named
// per-op tolerance. Each dispatch runs under a different scheduling seed.
import { beforeAll, describe, expect, test } from "bun:test";
import { GgmlType, ggmlTypes } from "../ts/gguf/types.ts";
import { packStruct } from "../ts/native/abi.ts";
import { check, native } from "../ts/native/lib.ts";
import {
  planAdd, planAddRowBias, planAttention, planGatedAct, planGetRows, planKvStore, planMatmul,
  planNormRopeStore, planRmsNorm, planRmsNormAdd, planRope, planScale, MATVEC_TOKENS_MAX, type AttentionPlanOptions,
  type KernelDispatch,
} from "../ts/backend/metal-plan.ts";
import { planAttentionDecode } from "../ts/backend/metal-decode-plan.ts";
import { EmulatedMetalDevice, runDispatches } from "./support/metal-emu.ts";
import { normalisedError, randomF32, rng } from "./support/numeric.ts";

// Dequantization: the GPU and CPU use the same formula in f32; contraction into an FMA may
// move the last bit.
const TOL_DEQUANT = 1e-6;
// A dot over up to ~800 terms in f32 (lane sums, then simd_sum) against an f64 sum.
const TOL_MATMUL = 2e-5;
const TOL_F32 = 1e-5;
// The same angles as the CPU; sin/cos of up to ~5000 radians from another implementation.
const TOL_ROPE = 1e-5;
// The CPU reads GELU from an f16 table (llama.cpp's numerics); here it is computed in f32.
const TOL_GELU = 2e-3;
const TOL_ATTENTION = 2e-5;

let device: EmulatedMetalDevice;
const lib = native();

// The first run after a shader change compiles the emulator: minutes on a loaded machine.
beforeAll(() => {
  device = new EmulatedMetalDevice({ seed: 7 });
}, { timeout: 600_000 });

type Data = Float32Array | Int32Array | Uint8Array | Uint16Array;

const run = (dispatch: KernelDispatch | readonly KernelDispatch[], inputs: Record<string, Data>) =>
  runDispatches(device, dispatch, inputs);

const f32 = (bytes: Uint8Array) => new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);

const weightTypes = ["F32", "F16", "BF16", "Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"] as const;

/** n_in values per row for each type: odd numbers of blocks, and odd lengths for float types. */
function inputSizes(name: string): number[] {
  const block = [...ggmlTypes.values()].find((t) => t.name === name)!.blockValues;
  if (block === 1) return [1, 33, 100];
  // Past 16 blocks (32-value) or 4 superblocks (K) a lane of matvec_rows.metal takes a second pass.
  if (block === 32) return [32, 96, 160, 640];
  return [256, 768, 1280];
}

function quantized(typeName: string, nOut: number, nIn: number, rand: () => number) {
  const type = [...ggmlTypes.values()].find((t) => t.name === typeName)!;
  const values = randomF32(nOut * nIn, rand);
  const bytes = new Uint8Array((nIn / type.blockValues) * type.blockBytes * nOut);
  check(lib.infer_quantize_row(type.id, values, values.length, bytes), `quantize ${typeName}`);
  const dequant = new Float32Array(values.length);
  check(lib.infer_dequantize(type.id, bytes, values.length, dequant), `dequantize ${typeName}`);
  return { type, bytes, dequant };
}

describe("matmul kernels against the CPU's dequantized weights", () => {
  for (const typeName of weightTypes) {
    test(`${typeName}: matvec and tiled matmul, odd sizes`, () => {
      const rand = rng(typeName.length * 977 + typeName.charCodeAt(1));
      for (const nIn of inputSizes(typeName)) {
        for (const nOut of [1, 7, 67]) {
          const { type, bytes, dequant } = quantized(typeName, nOut, nIn, rand);
          for (const nTok of [1, 3, MATVEC_TOKENS_MAX + 1, 19, 37]) {
            const x = randomF32(nTok * nIn, rand);
            const want = new Float64Array(nTok * nOut);
            for (let t = 0; t < nTok; t++) {
              for (let o = 0; o < nOut; o++) {
                let s = 0;
                for (let i = 0; i < nIn; i++) s += dequant[o * nIn + i] * x[t * nIn + i];
                want[t * nOut + o] = s;
              }
            }
            const plan = planMatmul(type.id, nIn, nOut, nTok);
            expect(plan.kernel.startsWith(nTok <= MATVEC_TOKENS_MAX ? "matvec_" : "matmul_")).toBe(true);
            const got = f32(run(plan, { w: bytes, x, y: new Float32Array(nTok * nOut).fill(NaN) }).y);
            const err = normalisedError(got, want);
            if (err > TOL_MATMUL) console.error(typeName, { nIn, nOut, nTok, err, kernel: plan.kernel });
            expect(err).toBeLessThanOrEqual(TOL_MATMUL);
          }
        }
      }
    });

    test(`${typeName}: get_rows equals infer_dequantize`, () => {
      const rand = rng(31 + typeName.charCodeAt(0) * 13 + typeName.length);
      for (const nCols of inputSizes(typeName)) {
        const nRows = 9;
        const { type, bytes, dequant } = quantized(typeName, nRows, nCols, rand);
        const ids = new Int32Array([3, 0, 8, 3, 5]);
        const want = new Float32Array(ids.length * nCols);
        ids.forEach((id, i) => want.set(dequant.subarray(id * nCols, (id + 1) * nCols), i * nCols));
        const plan = planGetRows(type.id, nCols, nRows, ids.length);
        const got = f32(run(plan, { table: bytes, ids, dst: new Float32Array(want.length).fill(NaN) }).dst);
        expect(normalisedError(got, want)).toBeLessThanOrEqual(TOL_DEQUANT);
      }
    });
  }
});

describe("norm, rope, activations against the CPU kernels", () => {
  test("rms_norm (with and without weight) and rms_norm_add", () => {
    const rand = rng(5);
    for (const cols of [1, 7, 33, 257, 640]) {
      for (const rows of [1, 3]) {
        const x = randomF32(rows * cols, rand, 3);
        const w = randomF32(cols, rand);
        for (const hasWeight of [true, false]) {
          const want = new Float32Array(rows * cols);
          check(lib.infer_rms_norm(x, hasWeight ? w : null, rows, cols, 1e-6, want), "rms_norm");
          const got = f32(run(planRmsNorm(rows, cols, 1e-6, hasWeight), { x, weight: w, out: new Float32Array(rows * cols) }).out);
          expect(normalisedError(got, want)).toBeLessThanOrEqual(TOL_F32);
        }
        const residual = randomF32(rows * cols, rand);
        const want = residual.slice();
        check(lib.infer_rms_norm_add(x, w, rows, cols, 1e-6, want), "rms_norm_add");
        const got = f32(run(planRmsNormAdd(rows, cols, 1e-6), { x, weight: w, residual }).residual);
        expect(normalisedError(got, want)).toBeLessThanOrEqual(TOL_F32);
      }
    }
  });

  test("rope: normal and NeoX, partial rotation, frequency factors", () => {
    const rand = rng(11);
    for (const [headDim, nRot] of [[64, 64], [40, 24], [256, 256]]) {
      for (const neox of [false, true]) {
        for (const withFactors of [false, true]) {
          const nTok = 3, heads = 3;
          const x = randomF32(nTok * heads * headDim, rand);
          const positions = new Int32Array([0, 17, 4093]);
          const ff = new Float32Array(nRot / 2).map(() => 1 + rand() * 3);
          const want = x.slice();
          check(lib.infer_rope(want, positions, withFactors ? ff : null, packStruct("RopeShape", { n_tok: nTok,
            n_heads: heads, head_dim: headDim, n_rot: nRot, freq_base: 10000, freq_scale: 1, mode: neox ? 2 : 0, attn_factor: 1 })),
          "rope");
          const plan = planRope({ nTok, heads, headDim, rotaryDims: nRot, base: 10000, scale: 1, neox,
            freqFactors: withFactors });
          const got = f32(run(plan, { x, positions, freq_factors: ff }).x);
          expect(normalisedError(got, want)).toBeLessThanOrEqual(TOL_ROPE);
        }
      }
    }
  });

  test("gelu_mul, silu_mul, add, scale, add_row_bias", () => {
    const rand = rng(3);
    for (const n of [1, 31, 257, 1000]) {
      const gate = randomF32(n, rand, 6), up = randomF32(n, rand, 2);
      for (const kind of ["gelu", "silu"] as const) {
        const want = new Float32Array(n);
        check((kind === "gelu" ? lib.infer_gelu_mul : lib.infer_silu_mul)(gate, up, n, want), kind);
        const got = f32(run(planGatedAct(kind, n), { gate, up, out: new Float32Array(n) }).out);
        expect(normalisedError(got, want)).toBeLessThanOrEqual(kind === "gelu" ? TOL_GELU : TOL_F32);
      }
      const sum = new Float32Array(n);
      check(lib.infer_add(gate, up, n, sum), "add");
      expect(normalisedError(f32(run(planAdd(n), { a: gate, b: up, out: new Float32Array(n) }).out), sum)).toBe(0);
      const scaled = gate.slice();
      check(lib.infer_scale(scaled, n, 0.37), "scale");
      expect(normalisedError(f32(run(planScale(n, 0.37), { x: gate }).x), scaled)).toBe(0);
    }
    for (const [rows, cols] of [[1, 1], [3, 7], [5, 64]]) {
      const x = randomF32(rows * cols, rand), bias = randomF32(cols, rand);
      const want = x.slice();
      check(lib.infer_add_row_bias(want, bias, rows, cols), "add_row_bias");
      expect(normalisedError(f32(run(planAddRowBias(rows, cols), { x, bias }).x), want)).toBe(0);
    }
  });
});

describe("KV cache and attention against the CPU kernels", () => {
  test("kv_store rounds to f16 as the CPU does, at ring and linear cells", () => {
    const rand = rng(17);
    for (const [kvDim, nTok, pos0, ringCells] of [[64, 3, 5, 0], [40, 5, 14, 8], [7, 1, 0, 0]] as const) {
      const cells = ringCells || pos0 + nTok;
      const k = randomF32(nTok * kvDim, rand, 4), v = randomF32(nTok * kvDim, rand, 4);
      const kWant = new Uint16Array(cells * kvDim), vWant = new Uint16Array(cells * kvDim);
      for (let t = 0; t < nTok; t++) {
        const cell = (pos0 + t) % cells;
        const at = (cache: Uint16Array) => new Uint8Array(cache.buffer, cell * kvDim * 2);
        check(lib.infer_kv_store(k.subarray(t * kvDim), at(kWant), 1, kvDim, 1, null, 0), "kv_store");
        check(lib.infer_kv_store(v.subarray(t * kvDim), at(vWant), 1, kvDim, 1, null, 0), "kv_store");
      }
      const out = run(planKvStore(kvDim, nTok, pos0, cells, ringCells > 0),
        { k, v, k_cache: new Uint16Array(cells * kvDim), v_cache: new Uint16Array(cells * kvDim) });
      expect(Array.from(new Uint16Array(out.k_cache.buffer))).toEqual(Array.from(kWant));
      expect(Array.from(new Uint16Array(out.v_cache.buffer))).toEqual(Array.from(vWant));
    }
  });

  /** A random f16 cache and query for `o`, and the CPU's attention over them. */
  function attentionCase(o: AttentionPlanOptions, ringCells: number, rand: () => number) {
    const kvDim = o.kvHeads * o.headDim;
    const kF32 = randomF32(o.cells * kvDim, rand, 2), vF32 = randomF32(o.cells * kvDim, rand, 2);
    const kBits = new Uint16Array(kF32.length), vBits = new Uint16Array(vF32.length);
    check(lib.infer_kv_store(kF32, new Uint8Array(kBits.buffer), 1, kF32.length, o.headDim, null, 0), "kv");
    check(lib.infer_kv_store(vF32, new Uint8Array(vBits.buffer), 1, vF32.length, o.headDim, null, 0), "kv");
    // The reference reads the same f16 values as f32 (the CPU's F32 path: no f16 rounding of q).
    const kRef = new Float32Array(kF32.length), vRef = new Float32Array(vF32.length);
    check(lib.infer_dequantize(GgmlType.F16, new Uint8Array(kBits.buffer), kBits.length, kRef), "f16");
    check(lib.infer_dequantize(GgmlType.F16, new Uint8Array(vBits.buffer), vBits.length, vRef), "f16");
    const q = randomF32(o.nTok * o.heads * o.headDim, rand);
    const want = new Float32Array(q.length);
    check(lib.infer_attention(q, new Uint8Array(kRef.buffer), new Uint8Array(vRef.buffer), want,
      packStruct("AttentionShape", { k_type: 0, v_type: 0, n_tok: o.nTok, n_head: o.heads, n_kv_head: o.kvHeads,
        head_dim: o.headDim, pos0: o.pos0, kv_stride: kvDim, window: o.window, ring: ringCells, scale: o.scale,
        order: 0 })), "attention");
    return { q, kBits, vBits, want };
  }

  const attentionOptions = (nTok: number, heads: number, kvHeads: number, headDim: number, pos0: number,
    window: number, ringCells: number): AttentionPlanOptions => ({
    nTok, heads, kvHeads, headDim, pos0, window, cells: ringCells || pos0 + nTok, ring: ringCells > 0,
    scale: 1 / Math.sqrt(headDim),
  });

  test("attention (one query per threadgroup, and flash attention for prompts): GQA, sliding windows, rings, odd head sizes", () => {
    const rand = rng(23);
    const cases = [
      // nTok, heads, kvHeads, headDim, pos0, window, ring cells (0: linear)
      [1, 4, 1, 256, 40, 0, 0], [5, 4, 2, 64, 11, 0, 0], [3, 6, 3, 40, 30, 8, 0],
      [4, 2, 1, 32, 50, 16, 24], [1, 1, 1, 33, 0, 0, 0], [7, 8, 2, 96, 3, 4, 0],
      // Prompts: two query tiles, head sizes off the multiple of 8, windows across tiles, a ring
      // that wraps inside the batch.
      [37, 4, 2, 256, 5, 0, 0], [40, 2, 1, 40, 50, 16, 64], [33, 3, 3, 128, 0, 0, 0],
      [6, 2, 2, 33, 0, 0, 0], [70, 2, 1, 64, 0, 5, 0],
    ] as const;
    const kernelsRun = new Set<string>();
    for (const [nTok, heads, kvHeads, headDim, pos0, window, ringCells] of cases) {
      const o = attentionOptions(nTok, heads, kvHeads, headDim, pos0, window, ringCells);
      const { q, kBits, vBits, want } = attentionCase(o, ringCells, rand);
      const plan = planAttention(o);
      kernelsRun.add(plan.kernel);
      const got = f32(run(plan, { q, k_cache: kBits, v_cache: vBits, out: new Float32Array(q.length).fill(NaN) }).out);
      const err = normalisedError(got, want);
      if (err > TOL_ATTENTION) console.error({ nTok, heads, kvHeads, headDim, pos0, window, ringCells, err, kernel: plan.kernel });
      expect(err).toBeLessThanOrEqual(TOL_ATTENTION);
    }
    expect([...kernelsRun].sort()).toEqual(["attention", "attention_prompt_d128", "attention_prompt_d256"]);
  });

  test("decode attention with splits: every variant, GQA groups, windows, rings, more splits than keys", () => {
    const rand = rng(29);
    const cases = [
      // nTok, heads, kvHeads, headDim, pos0, window, ring cells (0: linear)
      [1, 4, 1, 256, 300, 0, 0], [1, 8, 1, 256, 77, 0, 0], [2, 8, 2, 64, 130, 0, 0], [1, 16, 2, 128, 61, 0, 0],
      [3, 6, 3, 40, 30, 8, 0], [4, 2, 1, 32, 50, 16, 24], [1, 1, 1, 33, 0, 0, 0], [1, 4, 2, 512, 45, 0, 0],
      [1, 12, 4, 80, 200, 64, 80], [2, 6, 1, 132, 9, 0, 0],
    ] as const;
    for (const [nTok, heads, kvHeads, headDim, pos0, window, ringCells] of cases) {
      const o = attentionOptions(nTok, heads, kvHeads, headDim, pos0, window, ringCells);
      const { q, kBits, vBits, want } = attentionCase(o, ringCells, rand);
      for (const splits of [1, 2, 7, 64]) {
        const step = planAttentionDecode(o, splits);
        const partials = new Float32Array(Math.max(1, step.scratchFloats)).fill(NaN);
        const got = f32(run(step.dispatches, { q, k_cache: kBits, v_cache: vBits, partials,
          out: new Float32Array(q.length).fill(NaN) }).out);
        const err = normalisedError(got, want);
        if (!(err <= TOL_ATTENTION)) console.error({ nTok, heads, kvHeads, headDim, pos0, window, ringCells, splits, err });
        expect(err).toBeLessThanOrEqual(TOL_ATTENTION);
      }
    }
  });

  test("norm_rope_store: the unfused chain's values bit for bit, and the CPU's", () => {
    const rand = rng(41);
    const cases = [
      // nTok, headsQ, headsK, headDim, rotary dims, neox, norms, q scale, pos0, ring cells (0: linear)
      [1, 4, 1, 256, 256, true, true, 0.0625, 7, 0], [3, 8, 2, 64, 64, false, false, 1, 2, 0],
      [2, 6, 3, 40, 24, true, true, 1, 11, 8], [5, 2, 2, 33 + 1, 10, false, true, 0.3, 0, 0],
    ] as const;
    for (const [nTok, headsQ, headsK, headDim, nRot, neox, norm, qScale, pos0, ringCells] of cases) {
      const cells = ringCells || pos0 + nTok;
      const q = randomF32(nTok * headsQ * headDim, rand, 3), k = randomF32(nTok * headsK * headDim, rand, 3);
      const v = randomF32(nTok * headsK * headDim, rand, 3);
      const qNorm = randomF32(headDim, rand), kNorm = randomF32(headDim, rand);
      const positions = new Int32Array(nTok).map((_, t) => pos0 + t);
      const ff = new Float32Array(nRot / 2).map(() => 1 + rand() * 3);
      const rope = { nTok, headDim, rotaryDims: nRot, base: 10000, scale: 1, neox, freqFactors: true };
      const kvDim = headsK * headDim;
      const cache = () => new Uint16Array(cells * kvDim);
      // Unfused on the emulator: head norms, RoPE of q and k, the q scale, the KV store.
      const unfused: KernelDispatch[] = [];
      const qIn = { x: "q", weight: "q_norm", out: "q" }, kIn = { x: "k", weight: "k_norm", out: "k" };
      const inputs = { q, k, v, q_norm: qNorm, k_norm: kNorm, positions, freq_factors: ff, k_cache: cache(),
        v_cache: cache() };
      const state = { ...inputs } as Record<string, Data>;
      const step = (d: KernelDispatch, names: Record<string, string>) => {
        const out = run(d, Object.fromEntries(Object.entries(names).map(([param, buf]) => [param, state[buf]])));
        for (const [param, buf] of Object.entries(names)) {
          if (d.writes.includes(param)) state[buf] = new (state[buf].constructor as Uint8ArrayConstructor)(out[param].buffer);
        }
        unfused.push(d);
      };
      if (norm) {
        step(planRmsNorm(nTok * headsQ, headDim, 1e-6, true), qIn);
        step(planRmsNorm(nTok * headsK, headDim, 1e-6, true), kIn);
      }
      step(planRope({ ...rope, heads: headsQ }), { x: "q", positions: "positions", freq_factors: "freq_factors" });
      step(planRope({ ...rope, heads: headsK }), { x: "k", positions: "positions", freq_factors: "freq_factors" });
      if (qScale !== 1) step(planScale(nTok * headsQ * headDim, qScale), { x: "q" });
      step(planKvStore(kvDim, nTok, pos0, cells, ringCells > 0), { k: "k", v: "v", k_cache: "k_cache", v_cache: "v_cache" });
      const fused = run(planNormRopeStore({ nTok, headsQ, headsK, headDim, norm, eps: 1e-6, rotaryDims: nRot, base: 10000,
        scale: 1, neox, freqFactors: true, qScale, pos0, cells, ring: ringCells > 0 }), inputs);
      for (const name of ["q", "k", "k_cache", "v_cache"]) {
        const a = state[name], b = fused[name];
        expect(Buffer.compare(Buffer.from(a.buffer, a.byteOffset, a.byteLength), Buffer.from(b))).toBe(0);
      }
      // The CPU: rms_norm per head, rope, scale, kv_store.
      const cpuQ = q.slice(), cpuK = k.slice();
      if (norm) {
        check(lib.infer_rms_norm(q, qNorm, nTok * headsQ, headDim, 1e-6, cpuQ), "rms_norm");
        check(lib.infer_rms_norm(k, kNorm, nTok * headsK, headDim, 1e-6, cpuK), "rms_norm");
      }
      for (const [x, heads] of [[cpuQ, headsQ], [cpuK, headsK]] as const) {
        check(lib.infer_rope(x, positions, ff, packStruct("RopeShape", { n_tok: nTok, n_heads: heads, head_dim: headDim,
          n_rot: nRot, freq_base: 10000, freq_scale: 1, mode: neox ? 2 : 0, attn_factor: 1 })), "rope");
      }
      check(lib.infer_scale(cpuQ, cpuQ.length, qScale), "scale");
      expect(normalisedError(f32(fused.q), cpuQ)).toBeLessThanOrEqual(TOL_ROPE);
      expect(normalisedError(f32(fused.k), cpuK)).toBeLessThanOrEqual(TOL_ROPE);
    }
  });
});
