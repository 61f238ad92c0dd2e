// Method: every f32 op export against a slow, obvious f64 TypeScript reference on seeded random
// data with odd sizes, scored by max normalised error (max |got - want| / max |want|) under a
// named per-op tolerance.
import { describe, expect, test } from "bun:test";
import { ptr } from "bun:ffi";
import { InferError } from "../ts/errors.ts";
import { packStruct } from "../ts/native/abi.ts";
import { check, native } from "../ts/native/lib.ts";
import { normalisedError, randomF32, rng } from "./support/numeric.ts";

// f32 kernels against f64 references: a few f32 roundings per element.
const TOL_F32 = 1e-5;
// Attention accumulates over up to ~40 keys in f32 and uses an online softmax.
const TOL_ATTENTION = 2e-5;
// A probability on an f16 rounding boundary can round one ulp (2^-11) apart in another summation order.
const TOL_ATTENTION_F16 = 5e-4;
// GELU/SiLU go through expf in f32 (the kernel's fast identity vs tanh in f64).
const TOL_ACT = 1e-5;

const ODD_SIZES = [1, 7, 31, 33, 257, 640];

/** Runs a native call that must fail with invalid_argument and a message containing `fragment`. */
function expectInferError(call: () => number, fragment: string): void {
  try {
    check(call(), "op");
  } catch (err) {
    expect(err).toBeInstanceOf(InferError);
    expect((err as InferError).code).toBe("invalid_argument");
    expect((err as Error).message).toContain(fragment);
    return;
  }
  throw new Error(`expected an InferError containing '${fragment}'`);
}

// ---- references ------------------------------------------------------------------------------

function rmsNormRef(x: Float32Array, w: Float32Array | null, cols: number, eps: number): number[] {
  const out: number[] = [];
  for (let r = 0; r < x.length / cols; r++) {
    let ss = 0;
    for (let c = 0; c < cols; c++) ss += x[r * cols + c] ** 2;
    const scale = 1 / Math.sqrt(ss / cols + eps);
    for (let c = 0; c < cols; c++) out.push(x[r * cols + c] * scale * (w ? w[c] : 1));
  }
  return out;
}

/** Angles as ggml_rope_cache_init forms them (theta iterated in f32), so large positions agree. */
type Factors = Float32Array | null;

function ropeAnglesGgml(pos: number, nRot: number, base: number, scale: number, ff: Factors) {
  const f = Math.fround;
  const thetaScale = f(Math.pow(base, f(-2 / nRot)));
  const angles: number[] = [];
  let theta = f(pos);
  for (let i = 0; i < nRot / 2; i++) {
    angles.push(f(scale * f(theta / (ff ? ff[i] : 1))));
    theta = f(theta * thetaScale);
  }
  return angles;
}

/** The textbook formula in f64: theta_i = pos · scale · base^(-2i/n_rot) / ff_i. */
function ropeAnglesExact(pos: number, nRot: number, base: number, scale: number, ff: Factors) {
  const angles: number[] = [];
  for (let i = 0; i < nRot / 2; i++) {
    angles.push((pos * scale * base ** (-2 * i / nRot)) / (ff ? ff[i] : 1));
  }
  return angles;
}

function ropeRef(x: Float32Array, nTok: number, nHeads: number, headDim: number, nRot: number,
  positions: Int32Array, mode: number, angleOf: (pos: number) => number[]): number[] {
  const out = Array.from(x);
  for (let t = 0; t < nTok; t++) {
    const angles = angleOf(positions[t]);
    for (let h = 0; h < nHeads; h++) {
      const base = (t * nHeads + h) * headDim;
      for (let i = 0; i < nRot / 2; i++) {
        const [a, b] = mode === 0
          ? [base + 2 * i, base + 2 * i + 1]
          : [base + i, base + i + nRot / 2];
        const c = Math.cos(angles[i]), s = Math.sin(angles[i]);
        out[a] = x[a] * c - x[b] * s;
        out[b] = x[a] * s + x[b] * c;
      }
    }
  }
  return out;
}

interface AttnShape {
  nTok: number; nHead: number; nKvHead: number; headDim: number;
  pos0: number; kvStride: number; window: number; scale: number;
}

function shape(nTok: number, nHead: number, nKvHead: number, headDim: number,
  pos0: number, kvStride: number, window: number, scale: number): AttnShape {
  return { nTok, nHead, nKvHead, headDim, pos0, kvStride, window, scale };
}

type Values = ArrayLike<number>;

/** With `f16Rounding` (an F16 cache) the query and the probabilities are rounded to f16 first,
 * as llama.cpp's non-flash attention does and as infer mirrors. */
function attentionRef(q: Float32Array, k: Values, v: Values, s: AttnShape, f16Rounding = false,
  sinks: Float32Array | null = null): number[] {
  const r = f16Rounding ? Math.f16round : (x: number) => x;
  const out = new Array<number>(s.nTok * s.nHead * s.headDim).fill(0);
  const group = s.nHead / s.nKvHead;
  for (let t = 0; t < s.nTok; t++) {
    const p = s.pos0 + t;
    for (let h = 0; h < s.nHead; h++) {
      const kvh = Math.floor(h / group);
      const qOff = (t * s.nHead + h) * s.headDim;
      const keys: number[] = [], scores: number[] = [];
      for (let j = 0; j <= p; j++) {
        if (s.window > 0 && p - j >= s.window) continue; // hidden by the sliding window
        let dot = 0;
        const kOff = j * s.kvStride + kvh * s.headDim;
        for (let d = 0; d < s.headDim; d++) dot += r(q[qOff + d]) * k[kOff + d];
        keys.push(j);
        scores.push(s.scale * dot);
      }
      // A sink is one more logit in the softmax, with no value.
      const max = Math.max(...scores, sinks ? sinks[h] : -Infinity);
      const e = scores.map((x) => Math.exp(x - max));
      const sum = e.reduce((a, b) => a + b, sinks ? Math.exp(sinks[h] - max) : 0);
      keys.forEach((j, n) => {
        for (let d = 0; d < s.headDim; d++) {
          out[qOff + d] += r(e[n] / sum) * v[j * s.kvStride + kvh * s.headDim + d];
        }
      });
    }
  }
  return out;
}

// llama.cpp's CPU GELU: f16 input, f16 table of gelu_tanh, identity/zero beyond ±10.
const geluRef = (x: number) => {
  if (x <= -10) return 0;
  if (x >= 10) return x;
  const h = Math.f16round(x);
  return Math.f16round(0.5 * h * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (h + 0.044715 * h ** 3))));
};
const siluRef = (x: number) => x / (1 + Math.exp(-x));

// ---- tests -----------------------------------------------------------------------------------


/** infer_rope with its shape (lib/abi.zig RopeShape) from positional values; ff: freq factors. */
function rope(x: Float32Array, nTok: number, nHeads: number, headDim: number, nRot: number, positions: Int32Array,
  base: number, scale: number, mode: number, ff: Float32Array | null = null, attnFactor = 1): number {
  return native().infer_rope(x, positions, ff, packStruct("RopeShape", { n_tok: nTok, n_heads: nHeads,
    head_dim: headDim, n_rot: nRot, freq_base: base, freq_scale: scale, mode, attn_factor: attnFactor }));
}

/** infer_attention with its shape (lib/abi.zig AttentionShape) from positional values. */
function attention(q: Float32Array, k: Float32Array | Uint16Array, v: Float32Array | Uint16Array, kvType: number,
  out: Float32Array, nTok: number, nHead: number, nKvHead: number, headDim: number, pos0: number, kvStride: number,
  window: number, ring: number, scale: number, sinks: Float32Array | null = null): number {
  return native().infer_attention(q, k, v, out, packStruct("AttentionShape", { k_type: kvType, v_type: kvType, n_tok: nTok,
    n_head: nHead, n_kv_head: nKvHead, head_dim: headDim, pos0, kv_stride: kvStride, window, ring, scale, order: 0,
    sinks: sinks ? Number(ptr(sinks)) : 0 }));
}

describe("rms_norm", () => {
  const lib = native();
  for (const cols of ODD_SIZES) {
    test(`rows of ${cols}, with and without weight, in place`, () => {
      const rand = rng(cols);
      const rows = 3, eps = 1e-6;
      const x = randomF32(rows * cols, rand, 3), w = randomF32(cols, rand);
      const out = new Float32Array(x.length);
      check(lib.infer_rms_norm(x, w, rows, cols, eps, out), "rms_norm");
      expect(normalisedError(out, rmsNormRef(x, w, cols, eps))).toBeLessThan(TOL_F32);
      const inPlace = x.slice();
      check(lib.infer_rms_norm(inPlace, null, rows, cols, eps, inPlace), "rms_norm");
      expect(normalisedError(inPlace, rmsNormRef(x, null, cols, eps))).toBeLessThan(TOL_F32);
    });
  }
  test("rms_norm_add adds the weighted norm to the residual", () => {
    const rand = rng(99);
    const rows = 2, cols = 257, eps = 1e-6;
    const x = randomF32(rows * cols, rand, 3), w = randomF32(cols, rand);
    const res = randomF32(rows * cols, rand);
    const want = rmsNormRef(x, w, cols, eps).map((y, i) => y + res[i]);
    check(lib.infer_rms_norm_add(x, w, rows, cols, eps, res), "rms_norm_add");
    expect(normalisedError(res, want)).toBeLessThan(TOL_F32);
  });
  test("n_cols = 0 is an InferError", () => {
    const x = new Float32Array(4);
    expectInferError(() => lib.infer_rms_norm(x, null, 1, 0, 1e-6, x), "n_cols");
  });
});

describe("rope", () => {
  const lib = native();
  const cases = [
    { headDim: 2, nRot: 2 }, { headDim: 34, nRot: 34 },
    { headDim: 66, nRot: 32 }, { headDim: 256, nRot: 256 },
  ];
  for (const mode of [0, 2]) {
    for (const { headDim, nRot } of cases) {
      test(`${mode === 0 ? "normal" : "neox"} head_dim ${headDim} n_rot ${nRot}`, () => {
        const rand = rng(headDim * 7 + mode);
        const nTok = 3, nHeads = 5, base = 10000, scale = 1;
        const positions = new Int32Array([0, 31, 4097]);
        const x = randomF32(nTok * nHeads * headDim, rand);
        const want = ropeRef(x, nTok, nHeads, headDim, nRot, positions, mode,
          (p) => ropeAnglesGgml(p, nRot, base, scale, null));
        const got = x.slice();
        check(rope(got, nTok, nHeads, headDim, nRot, positions, base, scale, mode),
          "rope");
        expect(normalisedError(got, want)).toBeLessThan(TOL_F32);
      });
    }
  }
  test("small positions agree with the exact f64 formula, freq factors and scale included", () => {
    const rand = rng(5);
    const nTok = 4, nHeads = 2, headDim = 128, nRot = 128, base = 500000, scale = 0.25;
    const positions = new Int32Array([0, 1, 7, 40]);
    const ff = new Float32Array(nRot / 2).map(() => 1 + rand() * 7);
    const x = randomF32(nTok * nHeads * headDim, rand);
    const want = ropeRef(x, nTok, nHeads, headDim, nRot, positions, 2,
      (p) => ropeAnglesExact(p, nRot, base, scale, ff));
    const got = x.slice();
    check(rope(got, nTok, nHeads, headDim, nRot, positions, base, scale, 2, ff),
      "rope_ext");
    // The f32 iteration of theta (as in ggml) drifts ~1e-6 relative per step from the exact angle.
    expect(normalisedError(got, want)).toBeLessThan(1e-4);
  });
  test("attn_factor scales the rotated values only (LongRoPE; ggml's mscale)", () => {
    const rand = rng(11);
    const nTok = 3, nHeads = 2, headDim = 64, nRot = 48, factor = 1.19;
    const positions = new Int32Array([0, 9, 300]);
    const ff = new Float32Array(nRot / 2).map(() => 1 + rand() * 3);
    const x = randomF32(nTok * nHeads * headDim, rand);
    const plain = x.slice(), scaled = x.slice();
    check(rope(plain, nTok, nHeads, headDim, nRot, positions, 10000, 1, 2, ff), "rope");
    check(rope(scaled, nTok, nHeads, headDim, nRot, positions, 10000, 1, 2, ff, factor), "rope");
    for (let i = 0; i < x.length; i++) {
      const want = i % headDim < nRot ? plain[i] * factor : x[i];
      expect(Math.abs(scaled[i] - want)).toBeLessThanOrEqual(4e-7 * Math.max(1, Math.abs(want)));
    }
    expectInferError(() => rope(x.slice(), nTok, nHeads, headDim, nRot, positions, 10000, 1, 2, ff, 0),
      "attn_factor");
  });
  test("bad mode and odd n_rot are InferErrors", () => {
    const x = new Float32Array(8), pos = new Int32Array([1]);
    expectInferError(() => rope(x, 1, 1, 8, 8, pos, 10000, 1, 1), "mode 1");
    expectInferError(() => rope(x, 1, 1, 8, 7, pos, 10000, 1, 0), "n_rot 7");
    expectInferError(() => rope(x, 1, 1, 8, 10, pos, 10000, 1, 0), "n_rot 10");
  });
});

describe("attention", () => {
  const lib = native();
  const shapes: [string, AttnShape][] = [
    // name: nTok, nHead, nKvHead, headDim, pos0, kvStride, window, scale
    ["GQA 4:1 prefill (causal)", shape(6, 4, 1, 33, 0, 33, 0, 0.125)],
    ["GQA 8:2 decode after prefill", shape(1, 8, 2, 64, 17, 128, 0, 0.125)],
    ["GQA 8:2 prefill continuing at pos0 > 0, padded rows", shape(5, 8, 2, 7, 9, 17, 0, 0.4)],
    ["sliding window 4 < sequence", shape(12, 4, 1, 31, 0, 31, 4, 0.2)],
    ["sliding window on a decode step", shape(1, 4, 1, 256, 40, 256, 8, 0.0625)],
    ["MHA head_dim 1", shape(3, 3, 3, 1, 2, 3, 0, 1)],
  ];
  for (const [name, s] of shapes) for (const withSinks of [false, true]) {
    for (const kvType of [0, 1]) {
      test(`${name}, ${kvType === 0 ? "F32" : "F16"} cache${withSinks ? ", attention sinks" : ""}`, () => {
        const rand = rng(s.headDim * 31 + s.nTok + kvType);
        const q = randomF32(s.nTok * s.nHead * s.headDim, rand);
        const cacheLen = (s.pos0 + s.nTok) * s.kvStride;
        const kF32 = randomF32(cacheLen, rand, 2), vF32 = randomF32(cacheLen, rand);
        let kCache: Float32Array | Uint16Array = kF32, vCache: Float32Array | Uint16Array = vF32;
        let kRef: ArrayLike<number> = kF32, vRef: ArrayLike<number> = vF32;
        if (kvType === 1) {
          kCache = new Uint16Array(cacheLen);
          vCache = new Uint16Array(cacheLen);
          check(lib.infer_kv_store(kF32, kCache, 1, cacheLen, s.headDim, null, 0), "kv_store");
          check(lib.infer_kv_store(vF32, vCache, 1, cacheLen, s.headDim, null, 0), "kv_store");
          kRef = new Float16Array(kCache.buffer); // the reference sees the f16-rounded cache
          vRef = new Float16Array(vCache.buffer);
        }
        // Sinks (gpt-oss): per head, some above every score (most weight to the sink), some below.
        const sinks = withSinks ? new Float32Array(s.nHead).map((_, h) => (h % 2 ? 3 : -1) + rand()) : null;
        const out = new Float32Array(q.length);
        check(attention(q, kCache, vCache, kvType, out, s.nTok, s.nHead, s.nKvHead,
          s.headDim, s.pos0, s.kvStride, s.window, 0, s.scale, sinks), "attention");
        expect(normalisedError(out, attentionRef(q, kRef, vRef, s, kvType === 1, sinks))).toBeLessThan(
          kvType === 1 ? TOL_ATTENTION_F16 : TOL_ATTENTION);
      });
    }
  }
  test("an F16 decode step over 3,000 keys gives the same bits on 1, 2 and 3 threads", () => {
    // Gemma 3 270M's global layers (4 query heads, 1 KV head, head_dim 256): one thread a KV head,
    // or split by scores, softmaxes and output dimensions (lib/cpu/attention_f16_split.zig).
    const rand = rng(3000), d = 256, keys = 3000, before = lib.infer_threads_get();
    const q = randomF32(4 * d, rand);
    const k = new Uint16Array(keys * d), v = new Uint16Array(keys * d);
    check(lib.infer_kv_store(randomF32(keys * d, rand, 2), k, 1, keys * d, d, null, 0), "kv_store");
    check(lib.infer_kv_store(randomF32(keys * d, rand), v, 1, keys * d, d, null, 0), "kv_store");
    const outs = [1, 2, 3].map((n) => {
      check(lib.infer_threads_set(n), "threads_set");
      const out = new Float32Array(4 * d);
      check(attention(q, k, v, 1, out, 1, 4, 1, d, keys - 1, d, 0, 0, 1 / 16), "attention");
      return new Uint32Array(out.buffer);
    });
    check(lib.infer_threads_set(before), "threads_set");
    expect(Array.from(outs[1])).toEqual(Array.from(outs[0]));
    expect(Array.from(outs[2])).toEqual(Array.from(outs[0]));
  });
  test("kv_store F16 rounds to nearest even, F32 copies", () => {
    const src = new Float32Array([1, 1 + 1 / 2048, -0.1, 65504, 3.14159, 1e-7, -7]);
    const f16 = new Uint16Array(src.length);
    check(lib.infer_kv_store(src, f16, 1, src.length, 1, null, 0), "kv_store");
    const rounded = Array.from(src, (x) => Math.f16round(x));
    expect(Array.from(new Float16Array(f16.buffer))).toEqual(rounded);
    const f32 = new Float32Array(src.length);
    check(lib.infer_kv_store(src, f32, 0, src.length, 1, null, 0), "kv_store");
    expect(f32).toEqual(src);
  });
  test("invalid shapes are InferErrors with clear messages", () => {
    const q = new Float32Array(64), kv = new Float32Array(64), out = new Float32Array(64);
    expectInferError(() => attention(q, kv, kv, 0, out, 1, 6, 4, 8, 0, 32, 0, 0, 1),
      "n_head 6 is not a multiple of n_kv_head 4");
    expectInferError(() => attention(q, kv, kv, 3, out, 1, 4, 1, 8, 0, 8, 0, 0, 1),
      "k_type 3");
    expectInferError(() => attention(q, kv, kv, 8, out, 1, 4, 1, 8, 0, 8, 0, 0, 1),
      "a quantized cache needs head_dim 8 and kv_stride 8 to be multiples of 32");
    expectInferError(() => attention(q, kv, kv, 0, out, 1, 4, 2, 8, 0, 8, 0, 0, 1),
      "kv_stride 8");
    expectInferError(() => attention(q, kv, kv, 0, out, 1, 4, 1, 0, 0, 8, 0, 0, 1),
      "head_dim 0");
    expectInferError(() => attention(q, kv, kv, 0, out, 4, 4, 1, 8, 10, 8, 8, 9, 1),
      "ring of 9 cells");
    const bytes = new Uint8Array(64);
    expectInferError(() => lib.infer_attention(q, kv, kv, out, packStruct("AttentionShape", { k_type: 0, v_type: 0,
      n_tok: 1, n_head: 4, n_kv_head: 1, head_dim: 8, pos0: 0, kv_stride: 8, window: 0, ring: 0, scale: 1,
      sinks: Number(ptr(bytes)) + 2 })), "sinks must be 4-byte aligned");
    expectInferError(() => lib.infer_kv_store(q, kv, 7, 4, 4, null, 0), "dst_type 7");
    expectInferError(() => lib.infer_kv_store(q, kv, 8, 40, 40, null, 0), "40 values are not whole blocks of 32");
    expectInferError(() => lib.infer_kv_store(q, kv, 104, 48, 24, null, 0), "head_dim 24 a power of two in 8..1024");
    expectInferError(() => lib.infer_kv_store(q, kv, 103, 48, 32, null, 0), "48 values a multiple of it");
    expectInferError(() => lib.infer_kv_load(kv, 103, 48, 12, null, 0, out), "head_dim 12 a power of two");
    expectInferError(() => attention(q, kv, kv, 104, out, 1, 4, 1, 24, 0, 24, 0, 0, 1),
      "a tq3/tq4 cache needs head_dim 24 a power of two in 8..1024 and kv_stride 24 a multiple of it");
    expectInferError(() => attention(q, kv, kv, 103, out, 1, 4, 1, 16, 0, 40, 0, 0, 1), "kv_stride 40 a multiple of it");
  });
  test("kv_load gives back what kv_store wrote: exactly for f32, within the code's error for tq3/tq4", () => {
    const rand = rng(5);
    const headDim = 64, src = randomF32(3 * headDim, rand, 2), back = new Float32Array(src.length);
    const raw = new Uint8Array(src.length * 4);
    check(lib.infer_kv_store(src, raw, 0, src.length, headDim, null, 0), "kv_store");
    check(lib.infer_kv_load(raw, 0, src.length, headDim, null, 0, back), "kv_load");
    expect(Array.from(back)).toEqual(Array.from(src));
    // 3 head vectors of 64: an f16 scale and 24 (tq3) or 32 (tq4) bytes of codes each. The
    // relative RMS error is about the square root of Lloyd-Max's distortion (0.0345, 0.0095).
    for (const [id, bytes, err] of [[103, 3 * 26, 0.22], [104, 3 * 34, 0.12]] as const) {
      const codes = new Uint8Array(bytes);
      check(lib.infer_kv_store(src, codes, id, src.length, headDim, null, 0), "kv_store");
      check(lib.infer_kv_load(codes, id, src.length, headDim, null, 0, back), "kv_load");
      let e = 0, n = 0;
      for (let i = 0; i < src.length; i++) {
        e += (back[i] - src[i]) ** 2;
        n += src[i] ** 2;
      }
      expect(Math.sqrt(e / n)).toBeLessThan(err);
      expect(Math.sqrt(e / n)).toBeGreaterThan(err / 3);
    }
  });
  test("tq4 keys coded less an anchor: loaded back with it, far closer when the keys share a large vector", () => {
    const rand = rng(9);
    const headDim = 64, rows = 8, kvDim = 2 * headDim;
    const common = randomF32(kvDim, rand, 20), src = randomF32(rows * kvDim, rand, 1);
    for (let i = 0; i < src.length; i++) src[i] += common[i % kvDim];
    const codes = new Uint8Array(rows * 2 * 34), back = new Float32Array(src.length);
    const rms = (anchor: Float32Array | null) => {
      check(lib.infer_kv_store(src, codes, 104, src.length, headDim, anchor, anchor?.length ?? 0), "kv_store");
      check(lib.infer_kv_load(codes, 104, src.length, headDim, anchor, anchor?.length ?? 0, back), "kv_load");
      let e = 0;
      for (let i = 0; i < src.length; i++) e += (back[i] - src[i]) ** 2;
      return Math.sqrt(e / src.length);
    };
    const plain = rms(null), anchored = rms(common);
    expect(anchored).toBeLessThan(0.12); // the spread left is 1/sqrt(3): tq4's error of that
    expect(anchored * 5).toBeLessThan(plain);
    expectInferError(() => lib.infer_kv_store(src, codes, 104, src.length, headDim, common, 48),
      "an anchor is for tq3/tq4 and needs 48 values a multiple of head_dim 64");
    expectInferError(() => lib.infer_kv_store(src, codes, 1, src.length, headDim, common, kvDim), "an anchor is for tq3/tq4");
  });
});

describe("activations, softmax, add, scale", () => {
  const lib = native();
  for (const n of ODD_SIZES) {
    test(`n = ${n}`, () => {
      const rand = rng(n + 1000);
      const gate = randomF32(n, rand, 8), up = randomF32(n, rand);
      for (const [name, fn, ref] of [
        ["gelu_mul", lib.infer_gelu_mul, geluRef], ["silu_mul", lib.infer_silu_mul, siluRef],
      ] as const) {
        const out = gate.slice(); // out aliases gate
        check(fn(out, up, n, out), name);
        const want = Array.from(gate, (g, i) => ref(g) * up[i]);
        expect(normalisedError(out, want)).toBeLessThan(TOL_ACT);
      }

      const rows = 2, x = randomF32(rows * n, rand, 10), sm = x.slice();
      check(lib.infer_softmax(sm, rows, n), "softmax");
      const want: number[] = [];
      for (let r = 0; r < rows; r++) {
        const row = Array.from(x.subarray(r * n, (r + 1) * n));
        const max = Math.max(...row), e = row.map((v) => Math.exp(v - max));
        const sum = e.reduce((a, b) => a + b, 0);
        want.push(...e.map((v) => v / sum));
      }
      expect(normalisedError(sm, want)).toBeLessThan(TOL_F32);

      const sum = new Float32Array(n);
      check(lib.infer_add(gate, up, n, sum), "add");
      expect(normalisedError(sum, Array.from(gate, (g, i) => g + up[i]))).toBeLessThan(TOL_F32);
      check(lib.infer_scale(sum, n, -0.5), "scale");
      const scaled = Array.from(gate, (g, i) => (g + up[i]) * -0.5);
      expect(normalisedError(sum, scaled)).toBeLessThan(TOL_F32);
    });
  }
  test("softmax with n_cols = 0 is an InferError", () => {
    expectInferError(() => lib.infer_softmax(new Float32Array(1), 1, 0), "n_cols");
  });
});

describe("Gemma 3n: AltUp prediction and correction, gaussian top-k, magnitude matching", () => {
  const lib = native();
  // The streams live in one large array (its address is stable), reached through a table of
  // their addresses as the model passes them.
  const K = 4, ROWS = 3;
  for (const n of ODD_SIZES.filter((s) => s > 1)) {
    test(`n = ${n}`, () => {
      const rand = rng(n + 2000), size = ROWS * n;
      // Large enough that its storage never moves (a small array's may: DESIGN.md, bun:ffi).
      const pool = new Float32Array(1 << 16), base = BigInt(ptr(pool));
      pool.set(randomF32(3 * K * size, rand, 20));
      const stream = (i: number) => pool.subarray(i * size, (i + 1) * size);
      const table = (first: number) => BigUint64Array.from({ length: K }, (_, i) =>
        base + BigInt((first + i) * size * 4));
      const x = Array.from({ length: K }, (_, i) => stream(i).slice());
      const coefs = randomF32(ROWS * K * K, rand, 0.3);
      const shape = (active = 0) => packStruct("AltUpShape",
        { n_streams: K, n_rows: ROWS, n_cols: n, active });
      check(lib.infer_altup_predict(table(0), coefs, table(K), shape()), "altup_predict");
      const predicted = Array.from({ length: K }, (_, i) => Array.from({ length: size }, (_, o) => {
        const r = Math.floor(o / n);
        let sum = 0;
        for (let s = 0; s < K; s++) sum += coefs[r * K * K + i * K + s] * x[s][o];
        return x[i][o] + sum;
      }));
      for (let i = 0; i < K; i++) {
        expect(normalisedError(stream(K + i), predicted[i])).toBeLessThan(TOL_F32);
      }

      const activated = stream(2 * K).slice(), c = randomF32(ROWS * K, rand, 0.5), active = 1;
      const p = Array.from({ length: K }, (_, i) => stream(K + i).slice());
      check(lib.infer_altup_correct(table(K), activated, c, table(K), shape(active)),
        "altup_correct");
      for (let i = 0; i < K; i++) {
        const want = Array.from({ length: size }, (_, o) =>
          p[i][o] + (c[Math.floor(o / n) * K + i] + 1) * (activated[o] - p[active][o]));
        expect(normalisedError(stream(K + i), want)).toBeLessThan(TOL_F32);
      }

      const gate = randomF32(size, rand, 3), sparse = gate.slice();
      check(lib.infer_gaussian_top_k(sparse, ROWS, n, 1.6448533535003662), "gaussian_top_k");
      const want: number[] = [];
      for (let r = 0; r < ROWS; r++) {
        const row = Array.from(gate.subarray(r * n, (r + 1) * n));
        const mean = row.reduce((a, b) => a + b, 0) / n;
        const std = Math.sqrt(row.reduce((a, v) => a + (v - mean) ** 2, 0) / (n - 1));
        want.push(...row.map((v) => Math.max(0, v - (mean + 1.6448533535003662 * std))));
      }
      expect(normalisedError(sparse, want)).toBeLessThan(TOL_F32);

      const target = randomF32(size, rand, 7), scaled = gate.slice();
      check(lib.infer_match_magnitude(scaled, target, ROWS, n, 1e-5), "match_magnitude");
      const matched: number[] = [];
      for (let r = 0; r < ROWS; r++) {
        const ms = (a: Float32Array) =>
          a.subarray(r * n, (r + 1) * n).reduce((s, v) => s + v * v, 0) / n;
        const k = Math.sqrt(ms(target)) / Math.sqrt(Math.max(ms(gate), 1e-5));
        matched.push(...Array.from(gate.subarray(r * n, (r + 1) * n), (v) => v * k));
      }
      expect(normalisedError(scaled, matched)).toBeLessThan(TOL_F32);
    });
  }
  test("bad shapes are InferErrors", () => {
    const one = new Float32Array(1 << 16), t = BigUint64Array.from([BigInt(ptr(one)), 0n]);
    expectInferError(() => lib.infer_altup_predict(t, one, t, packStruct("AltUpShape",
      { n_streams: 2, n_rows: 1, n_cols: 4 })), "stream 1 is null");
    expectInferError(() => lib.infer_altup_correct(t, one, one, t, packStruct("AltUpShape",
      { n_streams: 2, n_rows: 1, n_cols: 4, active: 2 })), "active stream 2 of 2");
    expectInferError(() => lib.infer_gaussian_top_k(one, 1, 1, 1), "n_cols must be > 1");
    expectInferError(() => lib.infer_copy_columns(one, 4, 3, 1, one, 2), "columns 3..5 of 4");
  });
});
