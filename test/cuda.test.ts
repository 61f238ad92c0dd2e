// The CUDA backend against the CPU backend. Without a usable GPU (CI) every CUDA test is skipped
// with the reason printed; what still runs checks that CUDA reports itself unavailable cleanly.
// Method: each op on seeded random data, run by both backends from the same inputs, scored by
// the normalised error max|cuda - cpu| / max|cpu| under a stated tolerance (outputs poisoned
// with NaN first, so an unwritten value fails). Then small random-weight GGUFs end to end: the
// prompt's logits and 64 greedy tokens, with CUDA graphs (and the fused decode step) on and off.
//
// What "equal" means end to end: every op agrees with the CPU to ~1e-7 but not bit for bit (the
// GPU sums in another order). Wherever a value is then rounded onto a grid — the Q8 quantization
// of activations before each quantized matmul, the f16 rounding of attention probabilities — a
// 1-ulp difference occasionally lands on the other side of a rounding boundary, and in a random
// network that difference grows layer by layer (measured on H200: prompt logits 1e-3..4e-2 of the
// largest logit for quantized models, 1e-7 for a float model). So the test asserts the logits
// within TOL_LOGITS_*, and greedy tokens identical except where the CPU's own top-2 gap is within
// NEAR_TIE × the measured logit difference at that step (a near-tie, decided by rounding). The
// graph/fused path must equal the eager path bit for bit.
// The measured errors are printed, so a GPU run records them.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Activation, Backend, KvLayer, Weight } from "../ts/backend/backend.ts";
import { CpuBackend } from "../ts/backend/cpu.ts";
import { CudaBackend } from "../ts/backend/cuda.ts";
import { createBackend } from "../ts/backend/select.ts";
import { Engine } from "../ts/engine/engine.ts";
import { InferError } from "../ts/errors.ts";
import { openGguf, type GgufFile } from "../ts/gguf/reader.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import { gguf, writeGguf, type GgufTensorToWrite } from "../ts/gguf/writer.ts";
import { cudaStatus } from "../ts/native/cuda.ts";
import { callNamed, type CallName, type NamedArgs } from "../ts/native/calls.ts";
import { check, native } from "../ts/native/lib.ts";
import { dequantize } from "../ts/convert/quantize.ts";
import { maxAbsDiff, top2Gap } from "../bench/logits.ts";
import {
  gemmaMixed, llamaFloat, llamaQ4_0, qwen3KQuants, randomQuantGguf, randomTensorData, type RandomQuantSpec,
} from "./support/random-quant-gguf.ts";
import { greedyRun, withCudaGraphs, type GreedyRun } from "./support/engine-logits.ts";
import { normalisedError, randomF32, rng } from "./support/numeric.ts";

const status = cudaStatus();
const noCuda = !status.available;
if (noCuda) console.log(`cuda.test.ts: CUDA tests skipped: ${status.reason}`);
else console.log(`cuda.test.ts: on ${status.info.name} (sm_${status.info.computeCapability}, ` +
  `${status.info.multiprocessors} SMs, ${(status.info.totalBytes / 2 ** 30).toFixed(0)} GiB)`);

// Tolerances (normalised error). Quantized matmuls quantize the activations exactly as the CPU
// does and sum exact integers per block, so only the f32 summation order differs.
const TOL_MATMUL = 1e-5;
// Dequantization and element-wise f32 arithmetic are the CPU's operation for operation.
const TOL_EXACTISH = 1e-6;
// f16, bf16 or f32 products summed in f32 by cuBLAS against the same products summed in f64.
const TOL_GEMM_F16 = 1e-4;
// RoPE: CUDA's sinf/cosf are within 2 ulp of glibc's.
const TOL_ROPE = 1e-5;
// GELU goes through an f16 table on both; a tanhf ulp can move an entry by one f16 ulp.
const TOL_GELU = 1e-3;
// Attention rounds q and the probabilities to f16 on both; another summation order can move a
// probability across an f16 rounding boundary (one ulp, 2^-11).
const TOL_ATTENTION = 1e-3;
// The decode attention's kernel choices each attention case runs under (lib/cuda/attention.zig
// DecodeAttention): auto (the plan), mma (attn_decode_mma_d* wherever it fits), warps (the plan
// without it: attn_decode_w and attn_decode_g*).
const DECODE_ATTENTION_MODES = [["auto", 0], ["mma", 3], ["warps", 1]] as const;
// Model logits after all layers (see the header): quantized models, float models.
const TOL_LOGITS_Q = 1e-1;
const TOL_LOGITS_F = 1e-2;
// A greedy choice may differ only where the CPU's top-2 gap is within this many times the
// largest logit difference at that step.
const NEAR_TIE = 4;

const dir = mkdtempSync(join(tmpdir(), "infer-cuda-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** v rounded to bf16 (to nearest, ties to even), as __float2bfloat16_rn does. */
function bf16round(v: number): number {
  const bits = new Uint32Array(new Float32Array([v]).buffer)[0];
  const rounded = (bits + 0x7fff + ((bits >>> 16) & 1)) & 0xffff0000;
  return new Float32Array(new Uint32Array([rounded >>> 0]).buffer)[0];
}

function report(what: string, err: number, tol: number): void {
  console.log(`  ${what}: normalised error ${err.toExponential(2)} (tolerance ${tol.toExponential(0)})`);
  expect(err).toBeLessThanOrEqual(tol);
}

test("without CUDA, the cuda backend fails with a clear message and auto falls back to the CPU", () => {
  if (!noCuda) {
    expect(createBackend("auto").name).toBe("cuda");
    return;
  }
  expect(status.available).toBe(false);
  if (!status.available) expect(status.reason).toStartWith("CUDA not available: ");
  try {
    CudaBackend.open();
    throw new Error("expected CUDA to be unavailable");
  } catch (err) {
    expect(err).toBeInstanceOf(InferError);
    expect((err as InferError).code).toBe("unsupported");
    expect((err as Error).message).toStartWith("CUDA not available: ");
  }
  expect(createBackend("auto").name).toBe("cpu");
});

// ---- ops -------------------------------------------------------------------------------------

const WEIGHT_TYPES: [string, number][] = [
  ["F32", GgmlType.F32], ["F16", GgmlType.F16], ["BF16", GgmlType.BF16], ["Q4_0", GgmlType.Q4_0],
  ["Q5_0", GgmlType.Q5_0], ["Q8_0", GgmlType.Q8_0], ["Q4_K", GgmlType.Q4_K], ["Q5_K", GgmlType.Q5_K],
  ["Q6_K", GgmlType.Q6_K], ["MXFP4", GgmlType.MXFP4],
];
const N_IN = 768, N_OUT = 37, COLS = 96;
const LONG_ROWS = [6144, 12288];
// A row of 11 steps of 256 values: K-splits of the batched tensor-core matmul that do not divide
// it (the last split empty).
const ODD_ROW = 2816;
// One token over rows the pipelined matvec takes (under 6,144 values), Q4_K's by half superblocks
// (lib/cuda/ops.zig pipe_halves_min): 22 halves (lanes idle) and 42 (lanes 0..9 take two).
const PIPE_ROWS = [ODD_ROW, 5376];
// 33,001 rows: a matrix of 32,768 rows or more (an LM head) takes four rows a warp in the
// pipelined matvec (lib/cuda/ops.zig pipe_rows_tall), its last row block partial.
const TALL: [number, number][] = [[256, 17_000], [512, 33_001], [6144, 8_500]];
const LONG_ROW_TYPES = WEIGHT_TYPES.filter(([name]) => ["Q4_0", "Q8_0", "Q4_K", "Q6_K"].includes(name));

/** One GGUF of test tensors: a weight of each type, norm weights, RoPE factors, a bias. */
function opsFile(): GgufFile {
  const tensors: GgufTensorToWrite[] = WEIGHT_TYPES.map(([name, type], i) => ({
    name: `w.${name}`, type, dims: [N_IN, N_OUT], data: randomTensorData(type, N_IN * N_OUT, 100 + i, 0.05),
  }));
  const f32 = (name: string, values: Float32Array) =>
    tensors.push({ name, type: GgmlType.F32, dims: [values.length], data: new Uint8Array(values.buffer) });
  // Long rows: one-token matvecs share a row among warps from 6,144 values (the pipelined matvec
  // of the GPU layouts its block's 4, a row block 2 rows; the register-fed kernels 2, and 4 from
  // 12,288).
  for (const [name, type] of LONG_ROW_TYPES) {
    for (const n of [...LONG_ROWS, ...PIPE_ROWS]) {
      tensors.push({ name: `w.${name}.${n}`, type, dims: [n, N_OUT], data: randomTensorData(type, n * N_OUT, n + type, 0.05) });
    }
  }
  // Tall Q4_0 matrices: more row blocks than one wave of blocks (16 a multiprocessor at most), so
  // each block of a one-token matvec loops over several (split rows too).
  for (const [n, rows] of TALL) {
    tensors.push({ name: `w.tall.${n}`, type: GgmlType.Q4_0, dims: [n, rows], data: randomTensorData(GgmlType.Q4_0, n * rows, rows, 0.05) });
  }
  f32("norm", randomF32(COLS, 1, 0.5).map((v) => v + 1));
  f32("norm.head", randomF32(32, 2, 0.5).map((v) => v + 1));
  f32("factors", randomF32(16, 3, 1).map((v) => v + 2));
  f32("bias", randomF32(COLS, 4, 1));
  // Attention sinks of 8 query heads (gpt-oss's): one far above the scores, one far below.
  f32("sinks", new Float32Array([2.5, -1, 0, 7, -30, 1.25, 4, -0.5]));
  const path = join(dir, "ops.gguf");
  writeFileSync(path, writeGguf([["general.architecture", gguf.str("test")]], tensors));
  return openGguf(path);
}

interface Pair {
  cpu: CpuBackend;
  gpu: CudaBackend;
}

/** The same weight on both backends. */
function weights(p: Pair, file: GgufFile, name: string): [Weight, Weight] {
  const t = file.tensors.get(name)!;
  return [p.cpu.weight(file, t), p.gpu.weight(file, t)];
}

/** Activations of the same shape on both, holding `values` (or poisoned on the GPU). */
function acts(p: Pair, rows: number, cols: number, values?: Float32Array | Int32Array): [Activation, Activation] {
  const c = p.cpu.activation("t", rows, cols), g = p.gpu.activation("t", rows, cols);
  if (values) {
    const view = p.cpu.read(c, rows);
    if (values instanceof Int32Array) new Int32Array(view.buffer, view.byteOffset, values.length).set(values);
    else view.set(values);
    p.gpu.write(g, values);
  } else {
    p.gpu.poison(g);
  }
  return [c, g];
}

function compare(p: Pair, c: Activation, g: Activation, rows: number): number {
  return normalisedError(p.gpu.read(g, rows), p.cpu.read(c, rows).slice());
}

describe.skipIf(noCuda)("CUDA ops equal the CPU backend's", () => {
  const file = noCuda ? null! : opsFile();
  const p: Pair = noCuda ? null! : { cpu: new CpuBackend(), gpu: CudaBackend.open({ graphs: false }) };
  // The same weights kept in the GGUF's layouts (Q4_0, Q8_0 and Q4_K of 768-wide rows take the
  // GPU layouts of shaders/cuda/packed.cuh in p.gpu).
  const gguf: Pair = noCuda ? null! : { cpu: p.cpu, gpu: CudaBackend.open({ graphs: false, gpuLayouts: false }) };
  const PACKED = new Set(["Q4_0", "Q8_0", "Q4_K"]);
  // These tests hold the kernels to the CPU's arithmetic (8-bit activations), so prompts stay off
  // cuBLAS's f16 GEMM (its own test below); the setting is the process's, restored after.
  const cublasDefault = noCuda ? 0 : p.gpu.cublasMinTokens;
  beforeAll(() => p?.gpu.setCublas(0));
  afterAll(() => {
    try {
      p?.gpu.setCublas(cublasDefault);
    } catch {} // no cuBLAS here: it stays off
    p?.gpu.dispose();
    gguf?.gpu.dispose();
    file?.close();
  });

  for (const [name] of WEIGHT_TYPES) {
    const layouts: [string, Pair][] = PACKED.has(name) ? [["", p], [" (GGUF layout)", gguf]] : [["", p]];
    for (const [layout, q] of layouts) {
      // 2 to 64 rows take the decode batches' tensor-core kernel (lib/cuda/ops.zig batchMma: 2
      // and 8 rows one 8-token tile, 13 a 16-token tile, 24 a 32-token tile, 33 a 64-token tile
      // (8 warps, the second group of 4 holding one token); 64 a whole 64-token tile, a decode
      // step of 64 sequences; 37 weight rows
      // a partial 64-row tile); 70 rows the prompt's (two 64-token
      // tiles, the second partial; a partial 32-row tile); 300 rows its large tile (3 tiles of 128
      // tokens, the last partial; a partial 64-row tile).
      test(`matmul ${name}${layout}: 1, 2, 8, 13, 24, 33, 64, 70 and 300 rows, an offset row`, () => {
        const [wc, wg] = weights(q, file, `w.${name}`);
        expect((wg as unknown as { gpuLayout: boolean }).gpuLayout).toBe(PACKED.has(name) && q === p);
        const x = randomF32(300 * N_IN, 10, 2);
        for (const rows of [1, 2, 8, 13, 24, 33, 64, 70, 300]) {
          const [xc, xg] = acts(q, 300, N_IN, x);
          const [oc, og] = acts(q, 300, N_OUT);
          q.cpu.matmul(wc, xc, rows, oc);
          q.gpu.matmul(wg, xg, rows, og);
          report(`${name}${layout} x ${rows}`, compare(q, oc, og, rows), TOL_MATMUL);
          const [oc1, og1] = acts(q, 1, N_OUT);
          q.cpu.matmul(wc, xc, 1, oc1, 5);
          q.gpu.matmul(wg, xg, 1, og1, 5);
          report(`${name}${layout} row 5`, compare(q, oc1, og1, 1), TOL_MATMUL);
        }
      });

      test(`embed ${name}${layout}`, () => {
        const [wc, wg] = weights(q, file, `w.${name}`);
        const ids = [0, 36, 5, 5, 17];
        const [ic, ig] = acts(q, ids.length, 1);
        q.cpu.setTokens(ic, ids, ids.length);
        q.gpu.setTokens(ig, ids, ids.length);
        const [oc, og] = acts(q, ids.length, N_IN);
        q.cpu.embed(wc, ic, ids.length, oc);
        q.gpu.embed(wg, ig, ids.length, og);
        report(`embed ${name}${layout}`, compare(q, oc, og, ids.length), TOL_EXACTISH);
      });
    }
  }

  for (const [name] of LONG_ROW_TYPES) {
    test(`matmul ${name}, one row of ${LONG_ROWS.join(" and ")} values (rows shared among warps)`, () => {
      for (const n of LONG_ROWS) {
        const [wc, wg] = weights(p, file, `w.${name}.${n}`);
        const [xc, xg] = acts(p, 1, n, randomF32(n, n, 2));
        const [oc, og] = acts(p, 1, N_OUT);
        p.cpu.matmul(wc, xc, 1, oc);
        p.gpu.matmul(wg, xg, 1, og);
        report(`${name} ${n} wide`, compare(p, oc, og, 1), TOL_MATMUL);
      }
    });
  }

  for (const [name] of LONG_ROW_TYPES) {
    test(`matmul ${name}, one row of ${PIPE_ROWS.join(" and ")} values (pipelined; Q4_K by half superblocks)`, () => {
      for (const n of PIPE_ROWS) {
        const [wc, wg] = weights(p, file, `w.${name}.${n}`);
        const [xc, xg] = acts(p, 1, n, randomF32(n, n + 5, 2));
        const [oc, og] = acts(p, 1, N_OUT);
        p.cpu.matmul(wc, xc, 1, oc);
        p.gpu.matmul(wg, xg, 1, og);
        report(`${name} ${n} wide`, compare(p, oc, og, 1), TOL_MATMUL);
      }
    });
  }

  // Batches of long rows take the tensor-core kernels split over the row (grid z, lib/cuda/ops.zig
  // mmqSplits: a 37-row weight gives a grid of one or a few tiles, so every split count up to
  // the cap), the splits' partial sums added in order.
  for (const [name] of LONG_ROW_TYPES) {
    test(`matmul ${name}, 40 and 200 rows of ${[...LONG_ROWS, ODD_ROW].join(", ")} values (split over the row)`, () => {
      for (const n of [...LONG_ROWS, ODD_ROW]) {
        const [wc, wg] = weights(p, file, `w.${name}.${n}`);
        const x = randomF32(200 * n, n + 1, 2);
        for (const rows of [40, 200]) {
          const [xc, xg] = acts(p, rows, n, x.subarray(0, rows * n));
          const [oc, og] = acts(p, rows, N_OUT);
          p.cpu.matmul(wc, xc, rows, oc);
          p.gpu.matmul(wg, xg, rows, og);
          report(`${name} ${rows} x ${n}`, compare(p, oc, og, rows), TOL_MATMUL);
        }
      }
    });
  }

  // The fused norms of a decode step (cuda-fuse.ts) hold a row and its weights in shared memory:
  // up to the widest they take (lib/cuda/ops.zig fused_cols_max) they must leave every buffer as
  // add, rms_norm and quantize do, bit for bit; wider, a clear error (the step runs them apart).
  test("add + rms_norm + quantize in one kernel, up to its widest row, bit for bit", () => {
    const L = native();
    const addr = (x: Activation) => (x as unknown as { address: number }).address;
    const bits = (x: Activation) => new Uint32Array(p.gpu.read(x, x.rows).slice().buffer);
    // Three rows: a batched decode step's (up to 8 rows take the 1,024-thread blocks).
    for (const [n, mode, rows] of [[256, 1, 1], [768, 0, 1], [5888, 0, 1], [5888, 1, 1], [4096, 0, 3], [1024, 1, 3]]) {
      for (const add of [true, false]) {
        const [, a] = acts(p, rows, n, randomF32(rows * n, n + 1, 3)), [, b] = acts(p, rows, n, randomF32(rows * n, n + 2, 2));
        const [, w] = acts(p, 1, n, randomF32(n, n + 3, 0.5).map((v) => v + 1));
        const run = (fused: boolean) => {
          const [, x] = acts(p, rows, n, p.gpu.read(a, rows).slice()), [, normed] = acts(p, rows, n);
          const [, q] = acts(p, rows, n / 4), [, d] = acts(p, rows, n / 32);
          if (fused) {
            expect(add ? callNamed("infer_cuda_add_rms_norm_quant", { a: addr(x), b: addr(b), sum: addr(x), weight: addr(w),
              n_rows: rows, n_cols: n, eps: 1e-6, out: addr(normed), mode, q: addr(q), d: addr(d) })
              : callNamed("infer_cuda_rms_norm_quant", { x: addr(x), weight: addr(w), n_rows: rows, n_cols: n, eps: 1e-6,
                out: addr(normed), mode, q: addr(q), d: addr(d) })).toBe(0);
          } else {
            if (add) expect(L.infer_cuda_add(addr(x), addr(b), rows * n, addr(x))).toBe(0);
            expect(L.infer_cuda_rms_norm(addr(x), addr(w), rows, n, 1e-6, addr(normed))).toBe(0);
            expect(L.infer_cuda_quantize(addr(normed), rows, n, mode, addr(q), addr(d))).toBe(0);
          }
          return [x, normed, q, d].map(bits);
        };
        const want = run(false), got = run(true);
        ["sum", "normed", "quants", "scales"].forEach((part, i) => {
          if (!want[i].every((v, j) => v === got[i][j])) throw new Error(`${rows} x ${n} wide, mode ${mode}${add ? ", add" : ""}: ${part} differs`);
        });
      }
    }
    const [, x] = acts(p, 1, 6144, randomF32(6144, 5, 1));
    expect(() => check(callNamed("infer_cuda_rms_norm_quant", { x: addr(x), weight: 0, n_rows: 1, n_cols: 6144, eps: 1e-6,
      out: addr(x), mode: 0, q: addr(x), d: addr(x) }), "norm"))
      .toThrow("rms_norm_quant: n_cols 6144 not in 1..5888");
  });

  // The GPU's Q8_K quantizer (quant_super_q8_k: the first value of largest magnitude found as the
  // maximum of a 64-bit key) gives the bytes of the CPU's q8_k.quantize (ggml's reference), which
  // the K-quant matmuls on both sides read: quants, and d repeated for each 32-value unit.
  test("quantize mode 1 (Q8_K) equals the CPU's q8_k.quantize byte for byte: ties, zeros, halves", () => {
    const L = native();
    const addr = (x: Activation) => (x as unknown as { address: number }).address;
    const n = 2048, rows = 3, blocks = (rows * n) / 256;
    const x = randomF32(rows * n, 77, 3);
    const block = (b: number) => x.subarray(256 * b, 256 * b + 256);
    block(1).fill(0); // all zeros: d = 0, quants 0
    block(2).set([-2, 2, 2, -2], 10); // equal magnitudes of both signs: the first (-2) is the maximum
    block(3).fill(0.25).set([-127], 200); // iscale 1: every 0.25 rounds to 0 ...
    block(4).set(Array.from({ length: 256 }, (_, i) => (i % 2 ? 0.5 : 1.5) * (i % 3 ? 1 : -1))); // ... halves to even
    block(4)[255] = -127;
    block(5).fill(1e-30).set([3e-30], 0); // tiny values (the scale's reciprocal near the float range)
    block(6).set([-3, 3], 128); // the tie across the block's two halves
    block(7).set([5], 0); // the maximum in the first lane
    block(8).set([5], 255); // ... and the last
    const [, xg] = acts(p, rows, n, x), [, q] = acts(p, rows, n / 4), [, d] = acts(p, rows, n / 32);
    expect(L.infer_cuda_quantize(addr(xg), rows, n, 1, addr(q), addr(d))).toBe(0);
    const gotQ = new Int8Array(p.gpu.read(q, rows).slice().buffer);
    const gotD = new Uint32Array(p.gpu.read(d, rows).slice().buffer);
    const want = new Uint8Array(blocks * 292);
    expect(L.infer_quantize_row(GgmlType.Q8_K, x, rows * n, want)).toBe(0);
    const view = new DataView(want.buffer);
    for (let b = 0; b < blocks; b++) {
      const wantD = view.getUint32(292 * b, true), wantQ = new Int8Array(want.buffer, 292 * b + 4, 256);
      for (let u = 0; u < 8; u++) {
        if (gotD[8 * b + u] !== wantD) throw new Error(`block ${b} unit ${u}: d ${gotD[8 * b + u].toString(16)}, CPU ${wantD.toString(16)}`);
      }
      for (let i = 0; i < 256; i++) {
        if (gotQ[256 * b + i] !== wantQ[i]) throw new Error(`block ${b} value ${i}: quant ${gotQ[256 * b + i]}, CPU ${wantQ[i]}`);
      }
    }
  });

  test("matmul Q4_0, one row through 17,000 rows of 256, 33,001 of 512 and 8,500 of 6,144 (blocks loop over row blocks)", () => {
    for (const [n, rows] of TALL) {
      const [wc, wg] = weights(p, file, `w.tall.${n}`);
      const [xc, xg] = acts(p, 1, n, randomF32(n, rows, 2));
      const [oc, og] = acts(p, 1, rows);
      p.cpu.matmul(wc, xc, 1, oc);
      p.gpu.matmul(wg, xg, 1, og);
      report(`Q4_0 ${rows} x ${n}`, compare(p, oc, og, 1), TOL_MATMUL);
    }
  });

  // Prompts as cuBLAS GEMMs (lib/cuda/ops.zig gemmF16, gemmFloat): a quantized weight dequantized
  // and rounded to f16 with the activations rounded to f16; F16 and BF16 weights as they are with
  // the activations rounded to their type; F32 as it is. Products summed in f32 — against those
  // products summed in f64 here (not against the CPU, whose activations are 8-bit or f32).
  test("matmul of 300 rows as a cuBLAS GEMM: every weight type, both layouts", () => {
    try {
      p.gpu.setCublas(16);
    } catch (err) {
      console.log(`  cuBLAS GEMM test skipped: ${(err as Error).message}`);
      return;
    }
    try {
      const rows = 300, x = randomF32(rows * N_IN, 11, 2);
      const roundX = (type: number) =>
        type === GgmlType.F32 ? x : type === GgmlType.BF16 ? x.map(bf16round) : x.map((v) => Math.f16round(v));
      for (const [name, type] of WEIGHT_TYPES) {
        const t = file.tensors.get(`w.${name}`)!;
        const values = dequantize(file.tensorBytes(t), type, N_IN * N_OUT, t.name);
        const float = type === GgmlType.F32 || type === GgmlType.F16 || type === GgmlType.BF16;
        const wr = float ? values : values.map((v) => Math.f16round(v));
        const xr = float ? roundX(type) : roundX(GgmlType.F16);
        const want = new Float32Array(rows * N_OUT);
        for (let r = 0; r < rows; r++) {
          for (let o = 0; o < N_OUT; o++) {
            let sum = 0;
            for (let i = 0; i < N_IN; i++) sum += wr[o * N_IN + i] * xr[r * N_IN + i];
            want[r * N_OUT + o] = sum;
          }
        }
        for (const [layout, q] of PACKED.has(name) ? [["", p], [" (GGUF layout)", gguf]] as const : [["", p]] as const) {
          const [, wg] = weights(q, file, `w.${name}`);
          const [, xg] = acts(q, rows, N_IN, x);
          const [, og] = acts(q, rows, N_OUT);
          q.gpu.matmul(wg, xg, rows, og);
          report(`cuBLAS ${name}${layout} x ${rows}`, normalisedError(q.gpu.read(og, rows), want), TOL_GEMM_F16);
        }
      }
    } finally {
      p.gpu.setCublas(0);
    }
  });

  test("embed rejects an id outside the table", () => {
    const [, wg] = weights(p, file, "w.Q8_0");
    const [, ig] = acts(p, 1, 1);
    p.gpu.setTokens(ig, [N_OUT], 1);
    const [, og] = acts(p, 1, N_IN);
    expect(() => p.gpu.embed(wg, ig, 1, og)).toThrow("out of range");
  });

  test("rmsNorm, rmsNormAdd, rmsNormHeads", () => {
    const [nc, ng] = weights(p, file, "norm");
    const [hc, hg] = weights(p, file, "norm.head");
    const x = randomF32(5 * COLS, 20, 3);
    const [xc, xg] = acts(p, 5, COLS, x);
    const [oc, og] = acts(p, 5, COLS);
    p.cpu.rmsNorm(xc, nc, 5, 1e-6, oc);
    p.gpu.rmsNorm(xg, ng, 5, 1e-6, og);
    report("rmsNorm", compare(p, oc, og, 5), TOL_EXACTISH);
    const [uc, ug] = acts(p, 5, COLS);
    p.cpu.rmsNorm(xc, null, 5, 1e-5, uc);
    p.gpu.rmsNorm(xg, null, 5, 1e-5, ug);
    report("rmsNorm (no weight)", compare(p, uc, ug, 5), TOL_EXACTISH);
    const [rc, rg] = acts(p, 5, COLS, randomF32(5 * COLS, 21));
    p.cpu.rmsNormAdd(xc, nc, 5, 1e-6, rc);
    p.gpu.rmsNormAdd(xg, ng, 5, 1e-6, rg);
    report("rmsNormAdd", compare(p, rc, rg, 5), TOL_EXACTISH);
    p.cpu.rmsNormHeads(xc, hc, 5, COLS / 32, 1e-6);
    p.gpu.rmsNormHeads(xg, hg, 5, COLS / 32, 1e-6);
    report("rmsNormHeads", compare(p, xc, xg, 5), TOL_EXACTISH);
  });

  for (const [label, neox, factors] of [["normal", false, false], ["neox", true, false], ["normal + factors", false, true]] as const) {
    test(`rope ${label}`, () => {
      const [fc, fg] = weights(p, file, "factors");
      const rows = 6, heads = 3, headDim = 32;
      const [xc, xg] = acts(p, rows, heads * headDim, randomF32(rows * heads * headDim, 30, 2));
      const [pc, pg] = acts(p, rows, 1);
      p.cpu.setPositions(pc, 997, rows);
      p.gpu.setPositions(pg, 997, rows);
      const o = { heads, headDim, rotaryDims: 32, base: 10000, scale: 0.5, neox, freqFactors: factors ? fc : null };
      p.cpu.rope(xc, pc, rows, o);
      p.gpu.rope(xg, pg, rows, { ...o, freqFactors: factors ? fg : null });
      report(`rope ${label}`, compare(p, xc, xg, rows), TOL_ROPE);
    });
  }

  // gpt-oss's YaRN: 32× over an original context of 64, so that the ramp between the correction
  // dims runs over the middle pairs; mscale 1 + 0.1 ln 32 times an attention factor.
  test("rope neox + YaRN", () => {
    const rows = 6, heads = 3, headDim = 32;
    const [xc, xg] = acts(p, rows, heads * headDim, randomF32(rows * heads * headDim, 31, 2));
    const [pc, pg] = acts(p, rows, 1);
    p.cpu.setPositions(pc, 997, rows);
    p.gpu.setPositions(pg, 997, rows);
    const o = { heads, headDim, rotaryDims: 32, base: 10000, scale: 1 / 32, neox: true, freqFactors: null,
      attnFactor: 0.875, yarn: { extFactor: 1, betaFast: 32, betaSlow: 1, originalContext: 64 } };
    p.cpu.rope(xc, pc, rows, o);
    p.gpu.rope(xg, pg, rows, o);
    report("rope neox + YaRN", compare(p, xc, xg, rows), TOL_ROPE);
  });

  test("gated activations, add, scale, bias", () => {
    const n = 4 * COLS;
    const g = randomF32(n, 40, 6), u = randomF32(n, 41, 2);
    for (const kind of ["gelu", "silu"] as const) {
      const [gc, gg] = acts(p, 4, COLS, g);
      const [uc, ug] = acts(p, 4, COLS, u);
      const [oc, og] = acts(p, 4, COLS);
      if (kind === "gelu") { p.cpu.geluMul(gc, uc, 4, oc); p.gpu.geluMul(gg, ug, 4, og); }
      else { p.cpu.siluMul(gc, uc, 4, oc); p.gpu.siluMul(gg, ug, 4, og); }
      report(`${kind}Mul`, compare(p, oc, og, 4), kind === "gelu" ? TOL_GELU : TOL_EXACTISH);
    }
    const [ac, ag] = acts(p, 4, COLS, g);
    const [bc, bg] = acts(p, 4, COLS, u);
    const [oc, og] = acts(p, 4, COLS);
    p.cpu.add(ac, bc, 4, oc);
    p.gpu.add(ag, bg, 4, og);
    report("add", compare(p, oc, og, 4), 0);
    p.cpu.scale(ac, 4, 0.37);
    p.gpu.scale(ag, 4, 0.37);
    report("scale", compare(p, ac, ag, 4), 0);
    const [bias, biasG] = weights(p, file, "bias");
    p.cpu.addBias(bc, bias, 3);
    p.gpu.addBias(bg, biasG, 3);
    report("addBias", compare(p, bc, bg, 4), 0);
  });

  // Attention over the cache: a full layer and a sliding-window ring, prefill then decode, GQA.
  // Batches of 16+ rows take the tiled prompt kernels (16 queries a block; partial tiles too).
  const shortSteps = [[0, 13], [13, 1], [14, 7], [21, 1], [22, 9], [31, 1], [32, 1], [33, 1]];
  for (const [label, cells, ring, window, heads, kvHeads, headDim, steps] of [
    ["full, GQA 4:1, head_dim 64", 96, false, 0, 8, 2, 64, shortSteps],
    ["ring of 32, window 8, head_dim 256", 32, true, 8, 4, 1, 256, shortSteps],
    ["full, 1024 cells (split over the keys), head_dim 128", 1024, false, 0, 4, 2, 128,
      [[0, 13], [13, 1], [14, 600], [614, 1], [615, 1]]],
    ["prompts of 40 and 37 rows, GQA 4:1, head_dim 64", 128, false, 0, 8, 2, 64, [[0, 40], [40, 1], [41, 37], [78, 1]]],
    ["ring of 64, window 24, prompts of 20 to 30 rows, head_dim 256", 64, true, 24, 4, 1, 256,
      [[0, 20], [20, 1], [21, 17], [38, 1], [39, 30], [69, 1]]],
    // Batches under 16 rows and decode take attn_decode_w (a block per query head and split) for
    // head dims 32–256 that are powers of two while group × splits < 128, else attn_decode_*
    // (a block per KV head and split; here head_dim 96 and the 16- and 32-split cases): several
    // 128-key steps in one split, many splits, each group size, the wrap of a ring.
    ["full, 512 cells, batches of 3 to 9 rows past 300 keys, GQA 2:1, head_dim 128", 512, false, 0, 4, 2, 128,
      [[0, 300], [300, 5], [305, 9], [314, 1]]],
    ["full, 512 cells, batches of 3 to 9 rows past 300 keys, GQA 4:1, head_dim 64", 512, false, 0, 8, 2, 64,
      [[0, 300], [300, 3], [303, 9], [312, 1]]],
    ["full, 1600 cells, decode past 1,500 keys in 16 splits, GQA 8:1, head_dim 128", 1600, false, 0, 8, 1, 128,
      [[0, 1500], [1500, 1], [1501, 2], [1503, 1]]],
    ["full, 4200 cells, decode past 4,000 keys in 32 splits, GQA 4:1, head_dim 64", 4200, false, 0, 8, 2, 64,
      [[0, 4000], [4000, 1], [4001, 2], [4003, 1]]],
    ["full, 4200 cells, decode past 4,000 keys in 32 splits, GQA 4:1, head_dim 128", 4200, false, 0, 8, 2, 128,
      [[0, 4000], [4000, 1], [4001, 2], [4003, 1]]],
    // Splits take whole 128-key tiles, those past the keys empty: 33 of 64 splits past 4,100
    // keys, 9 of 16 past 1,100 (attn_decode_w), two tiles a split past 8,200 (33 of 64).
    ["full, 4300 cells, decode past 4,100 keys (33 of 64 splits), GQA 4:1, head_dim 128", 4300, false, 0, 8, 2, 128,
      [[0, 4100], [4100, 1], [4101, 2], [4103, 1]]],
    ["full, 1200 cells, decode past 1,100 keys (9 of 16 splits), GQA 4:1, head_dim 128", 1200, false, 0, 8, 2, 128,
      [[0, 1100], [1100, 1], [1101, 2], [1103, 1]]],
    ["full, 8300 cells, decode past 8,200 keys (two tiles a split), GQA 2:1, head_dim 96", 8300, false, 0, 4, 2, 96,
      [[0, 8200], [8200, 1], [8201, 3], [8204, 1]]],
    ["ring of 640, window 512, decode after the wrap in 8 splits, GQA 4:1, head_dim 64", 640, true, 512, 8, 2, 64,
      [[0, 128], [128, 128], [256, 128], [384, 128], [512, 128], [640, 1], [641, 2], [643, 1]]],
    ["full, no GQA, head_dim 96", 256, false, 0, 2, 2, 96, shortSteps],
    ["full, GQA 3:1, head_dim 32", 256, false, 0, 6, 2, 32, shortSteps],
    ["full, GQA 16:1, head_dim 64 (attn_decode_w: any group)", 256, false, 0, 16, 1, 64, shortSteps],
    // Groups over 8 heads (and head_dim not a multiple of 8) take the per-head attn_scores/values.
    ["full, GQA 12:1, head_dim 40 (per-head kernels)", 128, false, 0, 12, 1, 40, shortSteps],
    ["full, head_dim 36 (per-head kernels)", 128, false, 0, 2, 1, 36, shortSteps],
  ] as const) attentionCase(label, cells, ring, window, heads, kvHeads, headDim, steps);
  // gpt-oss's sinks (a logit per query head in the denominator, large ones included): prompts by
  // flash attention, decode by the tensor-core kernel (one split and several, a ring), other
  // head dims by the per-head kernels.
  for (const [label, cells, ring, window, heads, kvHeads, headDim, steps] of [
    ["sinks, prompts and decode, GQA 4:1, head_dim 64", 128, false, 0, 8, 2, 64, [[0, 40], [40, 1], [41, 2], [43, 1]]],
    ["sinks, ring of 32, window 8, head_dim 64", 32, true, 8, 8, 2, 64, shortSteps],
    ["sinks, decode past 1,100 keys in splits, GQA 8:1, head_dim 128", 1200, false, 0, 8, 1, 128,
      [[0, 1100], [1100, 1], [1101, 2], [1103, 1]]],
    ["sinks, no GQA, head_dim 96 (per-head kernels)", 256, false, 0, 8, 8, 96, shortSteps],
  ] as const) attentionCase(label, cells, ring, window, heads, kvHeads, headDim, steps, "sinks");

  function attentionCase(label: string, cells: number, ring: boolean, window: number, heads: number,
    kvHeads: number, headDim: number, steps: readonly (readonly number[])[], sinksName?: string): void {
    test(`storeKv + attention: ${label}`, () => {
      const kv: [KvLayer, KvLayer] = [
        p.cpu.kvLayer(cells, kvHeads, headDim, "f16", ring), p.gpu.kvLayer(cells, kvHeads, headDim, "f16", ring),
      ];
      const worst = new Map<string, number>();
      for (const [position, rows] of steps) {
        const seed = 50 + position;
        const qd = heads * headDim, kvd = kvHeads * headDim;
        const [qc, qg] = acts(p, rows, qd, randomF32(rows * qd, seed, 2));
        const [kc, kg] = acts(p, rows, kvd, randomF32(rows * kvd, seed + 1, 2));
        const [vc, vg] = acts(p, rows, kvd, randomF32(rows * kvd, seed + 2, 2));
        const [pc, pg] = acts(p, rows, 1);
        p.cpu.setPositions(pc, position, rows);
        p.gpu.setPositions(pg, position, rows);
        const [oc, og] = acts(p, rows, qd);
        const [sc, sg] = sinksName ? weights(p, file, sinksName) : [undefined, undefined];
        const o = { heads, kvHeads, headDim, window, scale: 1 / Math.sqrt(headDim), ...(sc ? { sinks: sc } : {}) };
        const og0 = { ...o, ...(sg ? { sinks: sg } : {}) };
        p.cpu.storeKv(kv[0], kc, vc, rows, position);
        p.gpu.storeKv(kv[1], kg, vg, rows, position);
        p.cpu.attention(qc, kv[0], rows, position, o, oc);
        // The same cache under each choice of decode kernels (lib/cuda/attention.zig
        // DecodeAttention): the plan's, the tensor-core kernel wherever it fits, the plan before it.
        for (const [mode, id] of DECODE_ATTENTION_MODES) {
          if (!setDecodeAttention(id)) continue;
          const [, og] = acts(p, rows, qd);
          const launched = captureOps(p.gpu, "infer_cuda_attention", () => p.gpu.attention(qg, kv[1], rows, position, og0, og));
          worst.set(mode, Math.max(worst.get(mode) ?? 0, compare(p, oc, og, rows)));
          if (rows <= 2) fusedQuantMatches(launched, og, rows, qd, `${label}, ${rows} row(s) at ${position}, ${mode}`);
        }
        setDecodeAttention(0);
      }
      for (const [mode, err] of worst) report(`attention ${label} (decode kernels: ${mode})`, err, TOL_ATTENTION);
    }, 60_000); // the CPU reference over 8,300 cells takes seconds
  }

  /** Sets the decode attention's kernels; false (and a note) where the device lacks that choice. */
  function setDecodeAttention(mode: number): boolean {
    const rc = native().infer_cuda_set_decode_attention(mode) as number;
    if (rc === 0) return true;
    const skipped = `decode attention mode ${mode} skipped: ${String(native().infer_last_error())}`;
    if (!skippedModes.has(skipped)) console.log(`  ${skipped}`);
    skippedModes.add(skipped);
    return false;
  }
  const skippedModes = new Set<string>();

  /** The arguments of every call to `name` that `f` records or launches on `gpu`. */
  function captureOps<F extends CallName>(gpu: CudaBackend, name: F, f: () => void): NamedArgs<F>[] {
    const g = gpu as unknown as { op: (fn: CallName, args: NamedArgs<F>, what: string) => void };
    const op = g.op, seen: NamedArgs<F>[] = [];
    g.op = function (fn, args, what) {
      if (fn === name) seen.push({ ...args });
      op.call(this, fn, args, what);
    };
    try {
      f();
    } finally {
      delete (g as { op?: unknown }).op; // the prototype's again
    }
    return seen;
  }

  /**
   * A decode step's attention followed by the quantization of its output (the o-projection's
   * input) in one launch (cuda-fuse.ts): for each format the row's width allows, the launch
   * recorded above again, quantizing its output (quant_mode), into fresh buffers must give the
   * same output and the bytes infer_cuda_quantize gives, bit for bit (the decode kernels quantize
   * in their epilogue where a group of heads is whole blocks; elsewhere the two launches run).
   */
  function fusedQuantMatches(launched: NamedArgs<"infer_cuda_attention">[], og: Activation, rows: number, width: number,
    what: string) {
    const L = native();
    const addr = (x: Activation) => (x as unknown as { address: number }).address;
    const bits = (x: Activation) => new Uint32Array(p.gpu.read(x, x.rows).slice().buffer);
    expect(launched.length).toBe(1);
    for (const mode of [0, 1].filter((m) => width % (m === 0 ? 32 : 256) === 0)) {
      const [, q1] = acts(p, rows, width / 4), [, d1] = acts(p, rows, width / 32);
      const [, q2] = acts(p, rows, width / 4), [, d2] = acts(p, rows, width / 32), [, o2] = acts(p, rows, width);
      check(L.infer_cuda_quantize(addr(og), rows, width, mode, addr(q1), addr(d1)), "quantize");
      const args = { ...launched[0], out: addr(o2), quant_mode: mode, quant_q: addr(q2), quant_d: addr(d2) };
      check(callNamed("infer_cuda_attention", args), "attention + quantize");
      for (const [part, want, got] of [["output", og, o2], ["quants", q1, q2], ["scales", d1, d2]] as const) {
        const w = bits(want).subarray(0, part === "output" ? rows * width : undefined), g = bits(got);
        if (!w.every((v, j) => v === g[j])) throw new Error(`attention + quantize ${what}, mode ${mode}: ${part} differs`);
      }
    }
  }

  test("an f32 KV cache is refused (f16, q8_0 or q4_0)", () => {
    expect(() => p.gpu.kvLayer(8, 1, 32, "f32", false)).toThrow("f16");
  });
});

// ---- models end to end -------------------------------------------------------------------------

const llamaQ4_0Q8_0: RandomQuantSpec = { ...llamaQ4_0, types: { ...llamaQ4_0.types, ffn: GgmlType.Q8_0 } };
const MODELS: [string, RandomQuantSpec, number, number, number][] = [
  // name, spec, prompt length, batch (prompts longer than the batch run in chunks), logits tolerance
  ["Gemma 3 (Q8_0/Q5_0/Q4_K/Q6_K, head_dim 256, ring wraps)", gemmaMixed, 300, 64, TOL_LOGITS_Q],
  // Q4_0 q/k/v/o and Q8_0 gate/up of 512-wide rows: the GPU layouts (packed.cuh), fused matvecs.
  ["Llama (Q4_0, Q8_0 gate/up, Q6_K head, rope factors)", llamaQ4_0Q8_0, 40, 256, TOL_LOGITS_Q],
  ["Qwen 3 (Q4_K/Q5_K/Q6_K, QK-norm, NeoX)", qwen3KQuants, 24, 16, TOL_LOGITS_Q],
  ["Llama (F16/BF16/F32)", llamaFloat, 12, 256, TOL_LOGITS_F],
];

describe.skipIf(noCuda)("random-weight models: CUDA equals the CPU", () => {
  for (const [name, spec, promptLength, batch, tolerance] of MODELS) {
    test(name, () => {
      const path = join(dir, `${spec.arch}-${spec.seed}.gguf`);
      writeFileSync(path, randomQuantGguf(spec));
      const vocab = 275, r = rng(spec.seed ?? 1);
      const prompt = Array.from({ length: promptLength }, () => 6 + Math.floor(r() * (vocab - 6)));
      const open = (backend: "cpu" | "cuda") => Engine.open({ modelPath: path, backend, contextLength: 512, batch });
      const cpu = open("cpu");
      const want = greedyRun(cpu, prompt, 64);
      cpu.close();
      const gpu = withCudaGraphs(true, () => open("cuda"));
      const got = greedyRun(gpu, prompt, 64);
      const stats = { ...(gpu.backend as CudaBackend).stats };
      // Greedy decoding with the argmax on the device, a step ahead of the host: the tokens of
      // the host's argmax, and the same ends (length, a stop token met mid-way, speculative step
      // dropped), the engine usable after each.
      const sampling = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 };
      const generate = (maxTokens: number, stopTokens: number[] = []) => gpu.generate(prompt,
        { maxTokens, sampling, ignoreEos: true, stopTokens, reuseCache: false });
      expect(generate(64).tokens).toEqual(got.tokens);
      const stop = got.tokens[5], firstStop = got.tokens.indexOf(stop);
      const stopped = generate(64, [stop]);
      expect([stopped.tokens, stopped.stopReason]).toEqual([got.tokens.slice(0, firstStop), "eos"]);
      const short = generate(7);
      expect([short.tokens, short.stopReason]).toEqual([got.tokens.slice(0, 7), "length"]);
      gpu.close();
      const eager = withCudaGraphs(false, () => open("cuda"));
      const plain = greedyRun(eager, prompt, 64);
      eager.close();
      const promptErr = normalisedError(got.promptLogits, want.promptLogits);
      // Steps while the sequences agree; the first differing token must be a near-tie.
      let stepErr = 0, same = 0, verdict = "all 64 equal";
      for (let i = 0; i < 64; i++) {
        const before = (s: GreedyRun) => (i === 0 ? s.promptLogits : s.stepLogits[i - 1]);
        if (i > 0) stepErr = Math.max(stepErr, normalisedError(before(got), before(want)));
        if (got.tokens[i] !== want.tokens[i]) {
          const gap = top2Gap(before(want)), diff = maxAbsDiff(before(got), before(want));
          verdict = `first difference at token ${i}: CPU top-2 gap ${gap.toExponential(2)}, largest logit difference ` +
            `${diff.toExponential(2)}`;
          expect(gap).toBeLessThanOrEqual(NEAR_TIE * diff);
          break;
        }
        same++;
      }
      console.log(`  ${name}: prompt logits error ${promptErr.toExponential(2)}, worst step ${stepErr.toExponential(2)} ` +
        `(tolerance ${tolerance}); greedy tokens equal ${same}/64 (${verdict}); graphs: ${stats.captures} captured, ` +
        `${stats.graphLaunches} replays; ${stats.stepOps} launch calls a step, ${stats.stepOpsFused} fused`);
      expect(promptErr).toBeLessThanOrEqual(tolerance);
      expect(stepErr).toBeLessThanOrEqual(tolerance);
      // A replayed, fused graph computes what the eager, unfused ops compute: bit for bit.
      expect(plain.tokens).toEqual(got.tokens);
      expect(normalisedError(plain.promptLogits, got.promptLogits)).toBe(0);
      for (let i = 0; i < 64; i++) expect(normalisedError(plain.stepLogits[i], got.stepLogits[i])).toBe(0);
      expect(stats.graphLaunches).toBeGreaterThan(50);
      expect(stats.stepOpsFused).toBeLessThan(stats.stepOps);

      // The prompt through cuBLAS's f16 GEMMs (every chunk of ≥ 16 rows; the float model keeps
      // its own kernels): its logits, and the steps after it while the tokens agree, within the
      // same tolerance of the CPU.
      const viaCublas = open("cuda");
      const cuda = viaCublas.backend as CudaBackend, saved = cuda.cublasMinTokens;
      try {
        cuda.setCublas(16);
      } catch (err) {
        console.log(`  ${name}: prompt through cuBLAS skipped: ${(err as Error).message}`);
        viaCublas.close();
        return;
      }
      try {
        const f16 = greedyRun(viaCublas, prompt, 8);
        let worst = normalisedError(f16.promptLogits, want.promptLogits);
        for (let i = 0; i < 7 && f16.tokens[i] === want.tokens[i]; i++)
          worst = Math.max(worst, normalisedError(f16.stepLogits[i], want.stepLogits[i]));
        console.log(`  ${name}: prompt through cuBLAS: logits error ${worst.toExponential(2)} (tolerance ${tolerance})`);
        expect(worst).toBeLessThanOrEqual(tolerance);
      } finally {
        cuda.setCublas(saved);
        viaCublas.close();
      }
    }, 120_000);
  }
});
