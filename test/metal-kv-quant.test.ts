// q8_0 and q4_0 KV caches on the Metal kernels (shaders/metal/kv.h), under the emulator, against
// libinfer's CPU with the same cache types. Method: keys and values stored from the same f32 rows
// (kv_store, and the fused norm_rope_store) must be the CPU's bytes, K and V types apart; every
// attention kernel reading those bytes (attention.metal, the split decode kernels, prompt flash
// attention) is scored by normalised error against the CPU's attention over the same bytes and,
// tighter, against the CPU's f32 attention over the dequantized cache, on seeded random data.
import { beforeAll, describe, expect, test } from "bun:test";
import type { KvTypes } from "../ts/backend/backend.ts";
import { kvBytes } from "../ts/backend/backend.ts";
import { planAttentionDecode } from "../ts/backend/metal-decode-plan.ts";
import {
  metalKvTypeIds, planAttention, planKvStore, planNormRopeStore, type AttentionPlanOptions, type KernelDispatch,
} from "../ts/backend/metal-plan.ts";
import { packStruct } from "../ts/native/abi.ts";
import { check, native } from "../ts/native/lib.ts";
import { EmulatedMetalDevice, runDispatches } from "./support/metal-emu.ts";
import { normalisedError, randomF32, rng } from "./support/numeric.ts";

// The CPU dots a Q8_0-quantized query with the key blocks in integers (llama.cpp's CPU flash
// attention); the GPU keeps the query in f32. The query's rounding (~2^-8 of its block's scale)
// moves scores and outputs by ~1e-3..1e-2 of their scale; a wrong block (scale, nibble order,
// row offset) is O(1). As test/cuda-kv-quant.test.ts.
const TOL_SAME_TYPES = 2e-2;
// Against f32 attention over the dequantized cache: the kernels that dequantize into registers
// see the same values (f32 sums in another order), prompt flash attention rounds them to f16 in
// threadgroup memory (2^-11 relative) as llama.cpp's does.
const TOL_DEQUANTIZED = 2e-5;
const TOL_DEQUANTIZED_STAGED = 3e-3;

const TYPES: KvTypes[] = [
  { k: "q8_0", v: "q8_0" }, { k: "q4_0", v: "q4_0" }, { k: "q8_0", v: "q4_0" }, { k: "f16", v: "q8_0" },
  { k: "q4_0", v: "f16" },
];
const name = (t: KvTypes) => `k ${t.k}, v ${t.v}`;

let device: EmulatedMetalDevice;
const lib = native();

beforeAll(() => {
  device = new EmulatedMetalDevice({ seed: 11 });
}, { timeout: 600_000 });

type Data = Float32Array | Int32Array | Uint8Array;

const run = (dispatches: readonly KernelDispatch[], inputs: Record<string, Data>) =>
  runDispatches(device, dispatches, inputs);

const f32 = (bytes: Uint8Array) => new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
const typeId = (t: keyof typeof metalKvTypeIds) => metalKvTypeIds[t]!;

/** The CPU's cache bytes for `values` (lib/cpu/kv_quant.zig's blocks, or f16). */
function cpuStore(values: Float32Array, type: KvTypes["k"], headDim: number): Uint8Array {
  const bytes = new Uint8Array(kvBytes(type, values.length, headDim));
  check(lib.infer_kv_store(values, bytes, typeId(type), values.length, headDim, null, 0), "kv_store");
  return bytes;
}

function cpuLoad(bytes: Uint8Array, type: KvTypes["k"], n: number, headDim: number): Float32Array {
  const out = new Float32Array(n);
  check(lib.infer_kv_load(bytes, typeId(type), n, headDim, null, 0, out), "kv_load");
  return out;
}

function firstDifference(a: Uint8Array, b: Uint8Array): number {
  for (let i = 0; i < Math.max(a.length, b.length); i++) if (a[i] !== b[i]) return i;
  return -1;
}

describe("quantized KV caches on the Metal kernels equal the CPU's", () => {
  test("kv_store writes the CPU's bytes: q8_0 and q4_0, K and V types apart, ring and linear cells", () => {
    const rand = rng(53);
    const cases = [[96, 3, 5, 0], [160, 5, 14, 8], [32, 1, 0, 0], [512, 2, 3, 0]] as const;
    cases.forEach(([kvDim, nTok, pos0, ringCells], i) => {
      const types = TYPES[i % TYPES.length];
      const cells = ringCells || pos0 + nTok;
      const k = randomF32(nTok * kvDim, rand, 4), v = randomF32(nTok * kvDim, rand, 4);
      k.fill(0, 0, 32); // an all-zero block: scale 0, codes of zero
      // a block whose scaled values are ties (amax 127: x · 127/amax = x): Q8_0 rounds them to
      // even, as ggml's SIMD quantizer, not away from zero
      if (kvDim >= 64) v.set([127, 0.5, 1.5, 2.5, -0.5, -3.5, 4.5, -126.5, 5.5], 32);
      const kWant = new Uint8Array(kvBytes(types.k, cells * kvDim, 32));
      const vWant = new Uint8Array(kvBytes(types.v, cells * kvDim, 32));
      for (let t = 0; t < nTok; t++) {
        const cell = (pos0 + t) % cells;
        kWant.set(cpuStore(k.subarray(t * kvDim, (t + 1) * kvDim), types.k, 32), kvBytes(types.k, cell * kvDim, 32));
        vWant.set(cpuStore(v.subarray(t * kvDim, (t + 1) * kvDim), types.v, 32), kvBytes(types.v, cell * kvDim, 32));
      }
      const out = run([planKvStore(kvDim, nTok, pos0, cells, ringCells > 0, types)],
        { k, v, k_cache: new Uint8Array(kWant.length), v_cache: new Uint8Array(vWant.length) });
      expect({ types: name(types), k: firstDifference(out.k_cache, kWant), v: firstDifference(out.v_cache, vWant) })
        .toEqual({ types: name(types), k: -1, v: -1 });
    });
  });

  test("norm_rope_store quantizes the turned keys and the values as kv_store does", () => {
    const rand = rng(59);
    const cases = [[1, 4, 1, 256, 7, 0], [3, 8, 2, 64, 2, 0], [2, 6, 3, 96, 11, 8]] as const;
    cases.forEach(([nTok, headsQ, headsK, headDim, pos0, ringCells], i) => {
      const types = TYPES[i % TYPES.length];
      const cells = ringCells || pos0 + nTok;
      const kvDim = headsK * headDim;
      const q = randomF32(nTok * headsQ * headDim, rand, 3), k = randomF32(nTok * kvDim, rand, 3);
      const v = randomF32(nTok * kvDim, rand, 3);
      const positions = new Int32Array(nTok).map((_, t) => pos0 + t);
      const fused = run([planNormRopeStore({ nTok, headsQ, headsK, headDim, norm: true, eps: 1e-6,
        rotaryDims: headDim, base: 10000, scale: 1, neox: true, freqFactors: false, qScale: 0.125, pos0, cells,
        ring: ringCells > 0, types })], { q, k, v, q_norm: randomF32(headDim, rand), k_norm: randomF32(headDim, rand),
        positions, freq_factors: new Float32Array(1),
        k_cache: new Uint8Array(kvBytes(types.k, cells * kvDim, headDim)),
        v_cache: new Uint8Array(kvBytes(types.v, cells * kvDim, headDim)) });
      // kv_store of the fused kernel's own turned keys (its k output) must give the same bytes.
      const stored = run([planKvStore(kvDim, nTok, pos0, cells, ringCells > 0, types)], {
        k: f32(fused.k), v, k_cache: new Uint8Array(fused.k_cache.length), v_cache: new Uint8Array(fused.v_cache.length),
      });
      expect(firstDifference(fused.k_cache, stored.k_cache)).toBe(-1);
      expect(firstDifference(fused.v_cache, stored.v_cache)).toBe(-1);
      const kCpu = new Uint8Array(fused.k_cache.length);
      for (let t = 0; t < nTok; t++) {
        const cell = (pos0 + t) % cells;
        kCpu.set(cpuStore(f32(fused.k).subarray(t * kvDim, (t + 1) * kvDim), types.k, headDim),
          kvBytes(types.k, cell * kvDim, headDim));
      }
      expect({ types: name(types), k: firstDifference(fused.k_cache, kCpu) }).toEqual({ types: name(types), k: -1 });
    });
  });

  /** A random cache of `types` (the CPU's bytes), a query, and the CPU's attention two ways. */
  function attentionCase(o: AttentionPlanOptions, types: KvTypes, ringCells: number, rand: () => number) {
    const kvDim = o.kvHeads * o.headDim;
    const kF32 = randomF32(o.cells * kvDim, rand, 2), vF32 = randomF32(o.cells * kvDim, rand, 2);
    const kBytes = cpuStore(kF32, types.k, o.headDim), vBytes = cpuStore(vF32, types.v, o.headDim);
    const q = randomF32(o.nTok * o.heads * o.headDim, rand);
    const attend = (kc: Uint8Array, vc: Uint8Array, kType: number, vType: number) => {
      const out = new Float32Array(q.length);
      check(lib.infer_attention(q, kc, vc, out, packStruct("AttentionShape", { k_type: kType, v_type: vType,
        n_tok: o.nTok, n_head: o.heads, n_kv_head: o.kvHeads, head_dim: o.headDim, pos0: o.pos0, kv_stride: kvDim,
        window: o.window, ring: ringCells, scale: o.scale, order: 0 })), "attention");
      return out;
    };
    const sameTypes = attend(kBytes, vBytes, typeId(types.k), typeId(types.v));
    const kDeq = cpuLoad(kBytes, types.k, kF32.length, o.headDim), vDeq = cpuLoad(vBytes, types.v, vF32.length, o.headDim);
    const dequantized = attend(new Uint8Array(kDeq.buffer), new Uint8Array(vDeq.buffer), 0, 0);
    return { q, kBytes, vBytes, sameTypes, dequantized };
  }

  const options = (nTok: number, heads: number, kvHeads: number, headDim: number, pos0: number, window: number,
    ringCells: number, types: KvTypes): AttentionPlanOptions => ({
    nTok, heads, kvHeads, headDim, pos0, window, cells: ringCells || pos0 + nTok, ring: ringCells > 0,
    scale: 1 / Math.sqrt(headDim), types,
  });

  function score(got: Float32Array, c: { sameTypes: Float32Array; dequantized: Float32Array }, staged: boolean,
    what: object): void {
    const errSame = normalisedError(got, c.sameTypes), errDeq = normalisedError(got, c.dequantized);
    const tolDeq = staged ? TOL_DEQUANTIZED_STAGED : TOL_DEQUANTIZED;
    if (!(errSame <= TOL_SAME_TYPES && errDeq <= tolDeq)) console.error({ ...what, errSame, errDeq });
    expect(errSame).toBeLessThanOrEqual(TOL_SAME_TYPES);
    expect(errDeq).toBeLessThanOrEqual(tolDeq);
  }

  test("attention.metal and prompt flash attention read the blocks: GQA, windows, rings", () => {
    const rand = rng(61);
    const cases = [
      // nTok, heads, kvHeads, headDim, pos0, window, ring cells (0: linear)
      [1, 4, 1, 256, 40, 0, 0], [3, 6, 3, 64, 30, 8, 0], [4, 2, 1, 32, 50, 16, 24],
      [37, 4, 2, 256, 5, 0, 0], [40, 2, 1, 32, 50, 16, 64], [33, 3, 3, 96, 0, 0, 0], [6, 2, 2, 128, 0, 0, 0],
    ] as const;
    const kernels = new Set<string>();
    cases.forEach(([nTok, heads, kvHeads, headDim, pos0, window, ringCells], i) => {
      const types = TYPES[i % TYPES.length];
      const o = options(nTok, heads, kvHeads, headDim, pos0, window, ringCells, types);
      const c = attentionCase(o, types, ringCells, rand);
      const plan = planAttention(o);
      kernels.add(plan.kernel);
      const got = f32(run([plan], { q: c.q, k_cache: c.kBytes, v_cache: c.vBytes,
        out: new Float32Array(c.q.length).fill(NaN) }).out);
      score(got, c, plan.kernel !== "attention", { kernel: plan.kernel, types: name(types), nTok, headDim });
    });
    expect([...kernels].sort()).toEqual(["attention", "attention_prompt_d128", "attention_prompt_d256"]);
  });

  test("decode attention with splits reads the blocks: every head_dim variant, 1 and 7 splits", () => {
    const rand = rng(67);
    const cases = [
      [1, 4, 1, 256, 300, 0, 0], [2, 8, 2, 64, 130, 0, 0], [1, 16, 2, 128, 61, 0, 0], [1, 4, 2, 512, 45, 0, 0],
      [1, 12, 4, 96, 200, 64, 80],
    ] as const;
    cases.forEach(([nTok, heads, kvHeads, headDim, pos0, window, ringCells], i) => {
      const types = TYPES[i % TYPES.length];
      const o = options(nTok, heads, kvHeads, headDim, pos0, window, ringCells, types);
      const c = attentionCase(o, types, ringCells, rand);
      for (const splits of [1, 7]) {
        const step = planAttentionDecode(o, splits);
        const got = f32(run(step.dispatches, { q: c.q, k_cache: c.kBytes, v_cache: c.vBytes,
          partials: new Float32Array(Math.max(1, step.scratchFloats)).fill(NaN),
          out: new Float32Array(c.q.length).fill(NaN) }).out);
        score(got, c, false, { kernel: step.dispatches[0].kernel, types: name(types), splits, headDim });
      }
    });
  });

  test("the plans refuse tq3/tq4 and head dims that are not whole blocks, in one line", () => {
    const o = options(1, 2, 1, 40, 3, 0, 0, { k: "q8_0", v: "f16" });
    expect(() => planAttention(o)).toThrow("head_dim a multiple of 32, not 40");
    expect(() => planKvStore(64, 1, 0, 4, false, { k: "tq4", v: "f16" })).toThrow("f16, q8_0 or q4_0, not k tq4, v f16");
  });
});
