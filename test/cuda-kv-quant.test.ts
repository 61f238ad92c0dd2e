// q8_0, q4_0 and infer's rotated tq3/tq4 KV caches on the CUDA backend against the CPU backend
// with the same cache types.
// Method: keys and values stored from the same f32 rows must be the same bytes (both quantize as
// ggml does); attention over those caches, on seeded random data of odd lengths through every
// kernel that reads them (prompt flash attention, the tensor-core decode kernel with splits, a
// batch of sequences through a table of caches, the per-head kernels of other head dims), is
// scored by the normalised error under a stated tolerance; then small random-weight models end to
// end: prompt logits close, greedy tokens equal (but at near-ties), the fused graph step equal to
// the eager ops bit for bit. tq3/tq4: the same bytes too (keys less the anchor the host sets from
// the first 16 keys, as on the CPU), attention over the same codes in f32 on both sides. Skipped
// without a GPU (CI).
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Activation, KvLayer, KvTypes } from "../ts/backend/backend.ts";
import { kvTypesName } from "../ts/backend/backend.ts";
import { CpuBackend } from "../ts/backend/cpu.ts";
import { CudaBackend } from "../ts/backend/cuda.ts";
import { Engine } from "../ts/engine/engine.ts";
import { cudaStatus } from "../ts/native/cuda.ts";
import { maxAbsDiff, top2Gap } from "../bench/logits.ts";
import { llamaQ4_0, qwen3KQuants, randomQuantGguf, type RandomQuantSpec } from "./support/random-quant-gguf.ts";
import { greedyRun, withCudaGraphs, type GreedyRun } from "./support/engine-logits.ts";
import { normalisedError, randomF32, rng } from "./support/numeric.ts";

const status = cudaStatus();
const noCuda = !status.available;
if (noCuda) console.log(`cuda-kv-quant.test.ts: CUDA tests skipped: ${status.reason}`);

// The CPU dots Q8_0 queries with the key blocks in integers; CUDA dequantizes a tile's blocks to
// f16 and multiplies f16 queries on the tensor cores. Either rounds the query to ~2^-8 (Q8_0)
// or 2^-11 (f16) of its block's scale, so scores, and the outputs, differ by ~1e-3..1e-2 of their
// scale; a wrong block (scale, nibble order, row offset) is O(1).
const TOL_ATTENTION_Q = 2e-2;
// Model logits (test/cuda.test.ts's tolerance for quantized models: the activations' Q8 rounding
// boundaries, crossed differently, grow through the layers).
const TOL_LOGITS_Q = 1e-1;
const NEAR_TIE = 4;
// tq3/tq4 keys and values: both backends read the same codes' levels in f32 (the query rotated,
// not rounded; the output rotated back), so only the order of f32 sums differs (~1e-6 of the
// scale); a wrong level, sign, scale or rotation is O(0.1..1). With an f16, q8_0 or q4_0 half
// beside it, that half's TOL_ATTENTION_Q.
const TOL_ATTENTION_TQ = 1e-3;

// Keys and values in the rotated codes, alone and beside the other types (keys are the
// sensitive half: k tq4 with v q8_0 is the likely pairing).
const TQ_TYPES: KvTypes[] = [
  { k: "tq4", v: "tq4" }, { k: "tq3", v: "tq3" }, { k: "tq4", v: "q8_0" }, { k: "q8_0", v: "tq3" }, { k: "f16", v: "tq4" },
];
const tolFor = (t: KvTypes) => (t.k.startsWith("tq") && t.v.startsWith("tq") ? TOL_ATTENTION_TQ : TOL_ATTENTION_Q);

const TYPES: KvTypes[] = [
  { k: "q8_0", v: "q8_0" }, { k: "q4_0", v: "q4_0" }, { k: "q8_0", v: "q4_0" }, { k: "f16", v: "q8_0" },
  { k: "q4_0", v: "f16" },
];

const dir = mkdtempSync(join(tmpdir(), "infer-cuda-kvq-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Pair { cpu: CpuBackend; gpu: CudaBackend }

function acts(p: Pair, rows: number, cols: number, values?: Float32Array): [Activation, Activation] {
  const c = p.cpu.activation("t", rows, cols), g = p.gpu.activation("t", rows, cols);
  if (values) {
    p.cpu.read(c, rows).set(values);
    p.gpu.write(g, values);
  } else {
    p.gpu.poison(g);
  }
  return [c, g];
}

function report(what: string, err: number, tol: number): void {
  console.log(`  ${what}: normalised error ${err.toExponential(2)} (tolerance ${tol.toExponential(0)})`);
  expect(err).toBeLessThanOrEqual(tol);
}

/** The CPU layer's bytes (lib/cpu/kv_quant.zig's blocks). */
function cpuBytes(layer: KvLayer): { k: Uint8Array; v: Uint8Array } {
  const l = layer as unknown as { kBytes: Uint8Array; vBytes: Uint8Array };
  return { k: l.kBytes, v: l.vBytes };
}

function firstDifference(a: Uint8Array, b: Uint8Array, n: number): number {
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return -1;
}

/**
 * Rows of keys (values random by position) stored at `position` into the CPU's and the GPU's
 * layers, positions set first as the engine sets them.
 */
function storeBoth(p: Pair, c: KvLayer, g: KvLayer, keys: Float32Array, position: number, rows: number): void {
  const kvd = keys.length / rows;
  const [kc, kg] = acts(p, rows, kvd, keys), [vc, vg] = acts(p, rows, kvd, randomF32(rows * kvd, 800 + position, 3));
  const [pc, pg] = acts(p, rows, 1);
  p.cpu.setPositions(pc, position, rows);
  p.gpu.setPositions(pg, position, rows);
  p.cpu.storeKv(c, kc, vc, rows, position);
  p.gpu.storeKv(g, kg, vg, rows, position);
}

describe.skipIf(noCuda)("quantized KV caches: CUDA equals the CPU", () => {
  const p: Pair = noCuda ? null! : { cpu: new CpuBackend(), gpu: CudaBackend.open({ graphs: false }) };
  afterAll(() => p?.gpu.dispose());

  test("kvLayer refuses f32 and head dims the codes cannot take, in one line", () => {
    expect(() => p.gpu.kvLayer(8, 1, 64, "f32", false)).toThrow("f16, q8_0, q4_0, tq3 or tq4, not f32");
    expect(() => p.gpu.kvLayer(8, 1, 40, { k: "q8_0", v: "f16" }, false)).toThrow("multiple of 32");
    expect(() => p.gpu.kvLayer(8, 1, 96, { k: "tq4", v: "f16" }, false)).toThrow("power of two");
  });

  for (const types of TQ_TYPES) {
    const name = kvTypesName(types);
    test(`storeKv (${name}) writes the CPU's bytes, the anchor set as on the CPU; copyKv as the CPU's`, () => {
      const cells = 48, kvHeads = 2, headDim = 64, kvd = kvHeads * headDim;
      const c = p.cpu.kvLayer(cells, kvHeads, headDim, types, false), g = p.gpu.kvLayer(cells, kvHeads, headDim, types, false);
      // 13 keys coded as they are, the 16th sets the anchor (all 16 coded again), then anchored.
      const steps = [[0, 13], [13, 1], [14, 1], [15, 1], [16, 17], [33, 1]];
      for (const [position, rows] of steps) {
        const data = randomF32(rows * kvd, 700 + position, 3);
        for (let i = 0; i < headDim; i++) data[i] = 0; // a zero head vector (scale 0)
        for (let r = 0; r < rows; r++) data[r * kvd + 5] += 12; // a shared outlier channel
        storeBoth(p, c, g, data, position, rows);
        const want = cpuBytes(c), got = p.gpu.readKv(g), used = (position + rows) * (got.k.length / cells);
        expect(firstDifference(got.k, want.k, used)).toBe(-1);
        expect(firstDifference(got.v, want.v, (position + rows) * (got.v.length / cells))).toBe(-1);
      }
      // Copies (the prefix cache's), as the CPU makes them: into a fresh layer (it takes the
      // source's anchor), and from a layer still without one (the keys pending in the target too).
      const fresh = () => [p.cpu.kvLayer(cells, kvHeads, headDim, types, false), p.gpu.kvLayer(cells, kvHeads, headDim, types, false)];
      const [c2, g2] = fresh(), [c3, g3] = fresh(), [c4, g4] = fresh();
      p.cpu.copyKv(c, 5, c2, 2, 20);
      p.gpu.copyKv(g, 5, g2, 2, 20);
      const data = randomF32(5 * kvd, 77, 3), [kc, kg] = acts(p, 5, kvd, data), [vc, vg] = acts(p, 5, kvd, data);
      const [pc, pg] = acts(p, 5, 1);
      p.cpu.setPositions(pc, 0, 5);
      p.gpu.setPositions(pg, 0, 5);
      p.cpu.storeKv(c3, kc, vc, 5, 0);
      p.gpu.storeKv(g3, kg, vg, 5, 0);
      p.cpu.copyKv(c3, 0, c4, 3, 5);
      p.gpu.copyKv(g3, 0, g4, 3, 5);
      for (const [cl, gl, from, to] of [[c2, g2, 2, 22], [c4, g4, 3, 8]] as const) {
        const want = cpuBytes(cl), got = p.gpu.readKv(gl), kb = got.k.length / cells, vb = got.v.length / cells;
        expect(firstDifference(got.k.subarray(from * kb, to * kb), want.k.subarray(from * kb, to * kb), (to - from) * kb)).toBe(-1);
        expect(firstDifference(got.v.subarray(from * vb, to * vb), want.v.subarray(from * vb, to * vb), (to - from) * vb)).toBe(-1);
      }
      const other = p.gpu.kvLayer(cells, kvHeads, headDim, "f16", false);
      expect(() => p.gpu.copyKv(g, 0, other, 0, 1)).toThrow("differ");
    });
  }

  test("tq keys coded less another anchor are not copied on CUDA: one line", () => {
    const types: KvTypes = { k: "tq4", v: "q8_0" }, kvd = 64;
    const layers = [0, 1].map((s) => {
      const l = p.gpu.kvLayer(32, 1, 64, types, false);
      const [, k] = acts(p, 16, kvd, randomF32(16 * kvd, 30 + s, 2)), [, v] = acts(p, 16, kvd, randomF32(16 * kvd, 40 + s, 2));
      const [, pos] = acts(p, 16, 1);
      p.gpu.setPositions(pos, 0, 16);
      p.gpu.storeKv(l, k, v, 16, 0);
      return l;
    });
    expect(() => p.gpu.copyKv(layers[0], 0, layers[1], 16, 4)).toThrow("different anchors");
  });

  for (const types of TYPES) {
    const name = kvTypesName(types);
    test(`storeKv (${name}) writes the CPU's bytes; copyKv moves whole rows of blocks`, () => {
      const cells = 40, kvHeads = 2, headDim = 64, kvd = kvHeads * headDim;
      const c = p.cpu.kvLayer(cells, kvHeads, headDim, types, false), g = p.gpu.kvLayer(cells, kvHeads, headDim, types, false);
      for (const [position, rows] of [[0, 13], [13, 1], [14, 19]]) {
        const data = randomF32(rows * kvd, 700 + position, 3);
        for (let i = 0; i < 32; i++) data[i] = 0; // a block of zeros (scale 0)
        storeBoth(p, c, g, data, position, rows);
      }
      const want = cpuBytes(c), got = p.gpu.readKv(g);
      const used = (rowBytes: number) => 33 * rowBytes;
      expect(firstDifference(got.k, want.k, used(got.k.length / cells))).toBe(-1);
      expect(firstDifference(got.v, want.v, used(got.v.length / cells))).toBe(-1);
      const copy = p.gpu.kvLayer(cells, kvHeads, headDim, types, false);
      p.gpu.copyKv(g, 5, copy, 2, 20);
      const moved = p.gpu.readKv(copy), kb = got.k.length / cells, vb = got.v.length / cells;
      expect(moved.k.subarray(2 * kb, 22 * kb)).toEqual(got.k.subarray(5 * kb, 25 * kb));
      expect(moved.v.subarray(2 * vb, 22 * vb)).toEqual(got.v.subarray(5 * vb, 25 * vb));
      const other = p.gpu.kvLayer(cells, kvHeads, headDim, "f16", false);
      expect(() => p.gpu.copyKv(g, 0, other, 0, 1)).toThrow("differ");
    });
  }

  // label, cells, ring, window, heads, kvHeads, headDim, steps [position, rows]
  const CASES = [
    // 13 rows and single rows: the tensor-core decode kernel (attn_decode_mma_q_d64).
    ["full, GQA 4:1, head_dim 64, 13 then 1, 7, 1, 9 rows", 96, false, 0, 8, 2, 64,
      [[0, 13], [13, 1], [14, 7], [21, 1], [22, 9], [31, 1]]],
    // Prompts of 16+ rows: flash attention over dequantized tiles (attn_prompt_q_d64).
    ["prompts of 40 and 37 rows, GQA 4:1, head_dim 64", 128, false, 0, 8, 2, 64, [[0, 40], [40, 1], [41, 37], [78, 1]]],
    // Past 1,100 keys: decode in 9 splits of whole tiles, the last a part tile (d128).
    ["full, 1200 cells, decode past 1,101 keys in splits, GQA 4:1, head_dim 128", 1200, false, 0, 8, 2, 128,
      [[0, 600], [600, 501], [1101, 1], [1102, 2], [1104, 1]]],
    ["ring of 640, window 512, decode after the wrap, GQA 4:1, head_dim 64", 640, true, 512, 8, 2, 64,
      [[0, 128], [128, 128], [256, 128], [384, 128], [512, 128], [640, 1], [641, 3], [644, 1]]],
    // Other head dims: the per-head kernels, value by value.
    ["ring of 64, window 24, prompts of 20 to 30 rows, head_dim 256", 64, true, 24, 4, 1, 256,
      [[0, 20], [20, 1], [21, 17], [38, 1], [39, 30], [69, 1]]],
    ["full, GQA 2:1, head_dim 96", 128, false, 0, 4, 2, 96, [[0, 19], [19, 1], [20, 3], [23, 1]]],
  ] as const;
  for (const types of [...TYPES, ...TQ_TYPES]) {
    for (const [label, cells, ring, window, heads, kvHeads, headDim, steps] of CASES) {
      const tq = TQ_TYPES.includes(types);
      if (tq && (headDim & (headDim - 1)) !== 0) continue; // the Hadamard rotation: powers of two
      test(`storeKv + attention (${kvTypesName(types)}): ${label}`, () => {
        const c = p.cpu.kvLayer(cells, kvHeads, headDim, types, ring), g = p.gpu.kvLayer(cells, kvHeads, headDim, types, ring);
        let worst = 0;
        for (const [position, rows] of steps) {
          const seed = 90 + position, qd = heads * headDim, kvd = kvHeads * headDim;
          const [qc, qg] = acts(p, rows, qd, randomF32(rows * qd, seed, 2));
          const [kc, kg] = acts(p, rows, kvd, randomF32(rows * kvd, seed + 1, 2));
          const [vc, vg] = acts(p, rows, kvd, randomF32(rows * kvd, seed + 2, 2));
          const [pc, pg] = acts(p, rows, 1);
          p.cpu.setPositions(pc, position, rows);
          p.gpu.setPositions(pg, position, rows);
          const [oc, og] = acts(p, rows, qd);
          const o = { heads, kvHeads, headDim, window, scale: 1 / Math.sqrt(headDim) };
          p.cpu.storeKv(c, kc, vc, rows, position);
          p.gpu.storeKv(g, kg, vg, rows, position);
          p.cpu.attention(qc, c, rows, position, o, oc);
          p.gpu.attention(qg, g, rows, position, o, og);
          worst = Math.max(worst, normalisedError(p.gpu.read(og, rows), p.cpu.read(oc, rows).slice()));
        }
        report(`attention ${kvTypesName(types)} ${label}`, worst, tolFor(types));
      }, 60_000);
    }
  }

  for (const types of TYPES) {
    test(`a batch of sequences through a table of ${kvTypesName(types)} caches (attendRows)`, () => {
      const heads = 8, kvHeads = 2, headDim = 128, cells = 700, qd = heads * headDim, kvd = kvHeads * headDim;
      const o = { heads, kvHeads, headDim, window: 0, scale: 1 / Math.sqrt(headDim) };
      const lengths = [5, 130, 611]; // one tile; two splits; five, the last a part tile
      const cl = lengths.map(() => p.cpu.kvLayer(cells, kvHeads, headDim, types, false));
      const gl = lengths.map(() => p.gpu.kvLayer(cells, kvHeads, headDim, types, false));
      lengths.forEach((n, s) => {
        const [kc, kg] = acts(p, n, kvd, randomF32(n * kvd, 40 + s, 2)), [vc, vg] = acts(p, n, kvd, randomF32(n * kvd, 50 + s, 2));
        const [pc, pg] = acts(p, n, 1);
        p.cpu.setPositions(pc, 0, n);
        p.gpu.setPositions(pg, 0, n);
        p.cpu.storeKv(cl[s], kc, vc, n, 0);
        p.gpu.storeKv(gl[s], kg, vg, n, 0);
      });
      const rows = lengths.length;
      const q = randomF32(rows * qd, 61, 2), k = randomF32(rows * kvd, 62, 2), v = randomF32(rows * kvd, 63, 2);
      const [, qg] = acts(p, rows, qd, q), [, kg] = acts(p, rows, kvd, k), [, vg] = acts(p, rows, kvd, v);
      const [, og] = acts(p, rows, qd), [, pg] = acts(p, rows, 1);
      // As setBatchInputs does for a batch of one-row segments: row s at its sequence's position.
      lengths.forEach((n, s) => p.gpu.setPositions(pg, n, 1, s));
      expect(p.gpu.attendRows(qg, kg, vg, gl, lengths, o, og)).toBe(true);
      const got = p.gpu.read(og, rows).slice();
      let worst = 0;
      lengths.forEach((n, s) => {
        const [qc] = acts(p, 1, qd, q.subarray(s * qd, (s + 1) * qd));
        const [kc] = acts(p, 1, kvd, k.subarray(s * kvd, (s + 1) * kvd)), [vc] = acts(p, 1, kvd, v.subarray(s * kvd, (s + 1) * kvd));
        const [pc] = acts(p, 1, 1), [oc] = acts(p, 1, qd);
        p.cpu.setPositions(pc, n, 1);
        p.cpu.storeKv(cl[s], kc, vc, 1, n);
        p.cpu.attention(qc, cl[s], 1, n, o, oc);
        worst = Math.max(worst, normalisedError(got.subarray(s * qd, (s + 1) * qd), p.cpu.read(oc, 1).slice()));
      });
      report(`attendRows ${kvTypesName(types)} after ${lengths.join(", ")} keys`, worst, TOL_ATTENTION_Q);
      // Head dims the tensor-core kernel does not take go one sequence at a time.
      const odd = [0, 1].map(() => p.gpu.kvLayer(64, 1, 256, types, false));
      const [, q2] = acts(p, 2, 4 * 256), [, k2] = acts(p, 2, 256), [, v2] = acts(p, 2, 256), [, o2] = acts(p, 2, 4 * 256);
      const [, p2] = acts(p, 2, 1);
      p.gpu.setPositions(p2, 3, 1, 0);
      p.gpu.setPositions(p2, 4, 1, 1);
      const fits = p.gpu.attendRows(q2, k2, v2, odd, [3, 4], { ...o, heads: 4, kvHeads: 1, headDim: 256 }, o2);
      expect(fits).toBe(false);
    }, 60_000);
  }

  for (const types of TQ_TYPES) {
    test(`a table of ${kvTypesName(types)} caches goes one sequence at a time (attendRows declines)`, () => {
      const heads = 8, kvHeads = 2, headDim = 128, qd = heads * headDim, kvd = kvHeads * headDim;
      const gl = [0, 1].map(() => p.gpu.kvLayer(64, kvHeads, headDim, types, false));
      const [, q] = acts(p, 2, qd, randomF32(2 * qd, 1, 2)), [, k] = acts(p, 2, kvd, randomF32(2 * kvd, 2, 2));
      const [, v] = acts(p, 2, kvd, randomF32(2 * kvd, 3, 2)), [, o] = acts(p, 2, qd), [, pos] = acts(p, 2, 1);
      p.gpu.setPositions(pos, 3, 1, 0);
      p.gpu.setPositions(pos, 4, 1, 1);
      expect(p.gpu.attendRows(q, k, v, gl, [3, 4], { heads, kvHeads, headDim, window: 0, scale: 0.1 }, o)).toBe(false);
    });
  }
});

const MODELS: [string, RandomQuantSpec][] = [
  ["Llama (Q4_0, head_dim 64, GQA 4:1)", llamaQ4_0],
  ["Qwen 3 (K-quants, QK-norm: the fused norm + RoPE + store, head_dim 128)", qwen3KQuants],
];

describe.skipIf(noCuda)("random-weight models with quantized KV caches: CUDA equals the CPU", () => {
  for (const [name, spec] of MODELS) {
    for (const types of [TYPES[0], TYPES[1], TYPES[2], TQ_TYPES[0], TQ_TYPES[1], TQ_TYPES[2]]) {
      test(`${name}, ${kvTypesName(types)}`, () => {
        const path = join(dir, `${spec.arch}-${spec.seed}.gguf`);
        writeFileSync(path, randomQuantGguf(spec));
        const r = rng(spec.seed ?? 1), steps = 32;
        // 37 tokens in chunks of 16: two prompt-kernel chunks, then 5 rows by the decode kernel.
        const prompt = Array.from({ length: 37 }, () => 6 + Math.floor(r() * 269));
        const open = (backend: "cpu" | "cuda") => Engine.open({ modelPath: path, backend, contextLength: 512, batch: 16,
          cacheTypeK: types.k, cacheTypeV: types.v });
        const cpu = open("cpu");
        const want = greedyRun(cpu, prompt, steps);
        cpu.close();
        // tq caches: the CPU's own error from them (its tq prompt logits against its f16 ones),
        // printed beside CUDA's difference from the CPU's tq logits, which must be within the
        // quantized-model tolerance and is expected far below that own error (the same codes).
        let own = "";
        if (TQ_TYPES.includes(types)) {
          const f16 = Engine.open({ modelPath: path, backend: "cpu", contextLength: 512, batch: 16 });
          own = `, the CPU's own ${kvTypesName(types)} error against f16 ` +
            normalisedError(want.promptLogits, greedyRun(f16, prompt, 1).promptLogits).toExponential(2);
          f16.close();
        }
        const gpu = withCudaGraphs(true, () => open("cuda"));
        const got = greedyRun(gpu, prompt, steps);
        gpu.close();
        const eager = withCudaGraphs(false, () => open("cuda"));
        const plain = greedyRun(eager, prompt, steps);
        eager.close();
        const promptErr = normalisedError(got.promptLogits, want.promptLogits);
        let stepErr = 0, same = 0, verdict = `all ${steps} equal`;
        for (let i = 0; i < steps; i++) {
          const before = (s: GreedyRun) => (i === 0 ? s.promptLogits : s.stepLogits[i - 1]);
          if (i > 0) stepErr = Math.max(stepErr, normalisedError(before(got), before(want)));
          if (got.tokens[i] !== want.tokens[i]) {
            const gap = top2Gap(before(want)), diff = maxAbsDiff(before(got), before(want));
            verdict = `first difference at token ${i}: CPU top-2 gap ${gap.toExponential(2)}, largest logit ` +
              `difference ${diff.toExponential(2)}`;
            expect(gap).toBeLessThanOrEqual(NEAR_TIE * diff);
            break;
          }
          same++;
        }
        console.log(`  ${name}, ${kvTypesName(types)}: prompt logits error ${promptErr.toExponential(2)}, worst step ` +
          `${stepErr.toExponential(2)} (tolerance ${TOL_LOGITS_Q})${own}; greedy tokens equal ${same}/${steps} (${verdict})`);
        expect(promptErr).toBeLessThanOrEqual(TOL_LOGITS_Q);
        expect(stepErr).toBeLessThanOrEqual(TOL_LOGITS_Q);
        // The graph's fused norm + RoPE + store quantizes as the eager kv_store does: bit for bit.
        expect(plain.tokens).toEqual(got.tokens);
        expect(normalisedError(plain.promptLogits, got.promptLogits)).toBe(0);
        for (let i = 0; i < steps; i++) expect(normalisedError(plain.stepLogits[i], got.stepLogits[i])).toBe(0);
      }, 120_000);
    }
  }
});
