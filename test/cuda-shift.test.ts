// The context shift on the CUDA backend (shiftKv, compactKv) against the CPU backend's. Method:
// the same rows stored into a CPU and a CUDA cache (the same bytes: test/cuda-kv-quant.test.ts),
// shifted or compacted on both, then compared. Values move as bytes: equal. The first `keep`
// rows and the rows past the moved ones are untouched: equal. Moved keys are dequantized,
// rotated and stored again on both with the same arithmetic, save CUDA's cosf/sinf, which may
// differ from the C library's by an ulp or two: f16 keys within 2 f16 ulps of the CPU's; q8_0 /
// q4_0 keys within one quantization step of their block (the f32 rotation differing by an ulp can
// round a value to the next step, and the block's scale by an f16 ulp) — a wrong rotation
// (angle, pair, sign, move) or a wrong row is O(1) off. Then random-weight models driven past
// their context with the CPU's greedy tokens on both backends, shifting when full (streaming:
// shiftSlot; h2o: shiftSlotHeavy on the same accumulated attention): logits within
// test/cuda.test.ts's tolerance for quantized models, and generate() with contextShift on CUDA
// going past the context. Skipped without a GPU (CI).
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Activation, KvLayer, KvTypes, RopeOptions } from "../ts/backend/backend.ts";
import { kvTypesName } from "../ts/backend/backend.ts";
import { CpuBackend } from "../ts/backend/cpu.ts";
import { CudaBackend } from "../ts/backend/cuda.ts";
import { Engine } from "../ts/engine/engine.ts";
import { shiftSlot, shiftSlotHeavy } from "../ts/engine/kv-cache.ts";
import { cudaStatus } from "../ts/native/cuda.ts";
import { argmax, defaultSampling } from "../ts/sample/sampler.ts";
import { gemmaMixed, llamaQ4_0, qwen3KQuants, randomQuantGguf, type RandomQuantSpec } from "./support/random-quant-gguf.ts";
import { normalisedError, randomF32, rng } from "./support/numeric.ts";

const status = cudaStatus();
const noCuda = !status.available;
if (noCuda) console.log(`cuda-shift.test.ts: CUDA tests skipped: ${status.reason}`);

/** Model logits: test/cuda.test.ts's tolerance for quantized models. */
const TOL_LOGITS_Q = 1e-1;

const dir = mkdtempSync(join(tmpdir(), "infer-cuda-shift-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function f16ToF32(bits: number): number {
  const s = bits & 0x8000 ? -1 : 1, e = (bits >> 10) & 31, m = bits & 1023;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

/** The cache's `n` values (rows of whole heads) as f32 and each value's step (f16: its ulp; quantized: its block's scale). */
function decode(bytes: Uint8Array, type: string, n: number): { values: Float64Array; step: Float64Array } {
  const values = new Float64Array(n), step = new Float64Array(n);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  for (let i = 0; i < n; i++) {
    if (type === "f16") {
      const x = f16ToF32(view.getUint16(2 * i, true));
      values[i] = x;
      step[i] = Math.max(2 ** -24, 2 ** (Math.floor(Math.log2(Math.max(Math.abs(x), 2 ** -14))) - 10));
      continue;
    }
    const blockBytes = type === "q8_0" ? 34 : 18, b = Math.floor(i / 32), j = i % 32, at = b * blockBytes;
    const d = f16ToF32(view.getUint16(at, true));
    const q = type === "q8_0" ? view.getInt8(at + 2 + j)
      : (j < 16 ? bytes[at + 2 + j] & 15 : bytes[at + 2 + j - 16] >> 4) - 8;
    values[i] = q * d;
    step[i] = Math.abs(d);
  }
  return { values, step };
}

/** Keys of rows [first, end): worst |cuda - cpu| in units of the step allowed, and the rows' bytes equal. */
function keyError(cpu: Uint8Array, gpu: Uint8Array, type: string, rowBytes: number, kvDim: number, first: number,
  end: number): { worst: number; sameBytes: number } {
  const n = (end - first) * kvDim;
  const a = decode(cpu.subarray(first * rowBytes, end * rowBytes), type, n);
  const b = decode(gpu.subarray(first * rowBytes, end * rowBytes), type, n);
  let worst = 0, same = 0;
  // f16: two ulps; q8_0 / q4_0: one step of the larger scale, and 1e-6 of a scale for the f32 products.
  const allowed = type === "f16" ? 2 : 1.001;
  for (let i = 0; i < n; i++) {
    const step = Math.max(a.step[i], b.step[i]);
    worst = Math.max(worst, Math.abs(a.values[i] - b.values[i]) / (allowed * step));
  }
  for (let i = first * rowBytes; i < end * rowBytes; i++) if (cpu[i] === gpu[i]) same++;
  return { worst, sameBytes: same / ((end - first) * rowBytes) };
}

interface Pair { cpu: CpuBackend; gpu: CudaBackend }

function cpuBytes(layer: KvLayer): { k: Uint8Array; v: Uint8Array } {
  const l = layer as unknown as { kBytes: Uint8Array; vBytes: Uint8Array };
  return { k: l.kBytes, v: l.vBytes };
}

function acts(p: Pair, rows: number, cols: number, values: Float32Array): [Activation, Activation] {
  const c = p.cpu.activation("t", rows, cols), g = p.gpu.activation("t", rows, cols);
  p.cpu.read(c, rows).set(values);
  p.gpu.write(g, values);
  return [c, g];
}

/** A CPU and a CUDA layer holding the same `length` positions (rings: the last `cells` of them). */
function filled(p: Pair, cells: number, ring: boolean, kvHeads: number, headDim: number, types: KvTypes,
  length: number, seed: number): [KvLayer, KvLayer] {
  const c = p.cpu.kvLayer(cells, kvHeads, headDim, types, ring), g = p.gpu.kvLayer(cells, kvHeads, headDim, types, ring);
  const kvd = kvHeads * headDim;
  for (let position = 0; position < length; position += 8) {
    const rows = Math.min(8, length - position);
    const [kc, kg] = acts(p, rows, kvd, randomF32(rows * kvd, seed + position, 2));
    const [vc, vg] = acts(p, rows, kvd, randomF32(rows * kvd, seed + 1000 + position, 2));
    const [pc, pg] = acts(p, rows, 1, new Float32Array(rows));
    p.cpu.setPositions(pc, position, rows);
    p.gpu.setPositions(pg, position, rows);
    p.cpu.storeKv(c, kc, vc, rows, position);
    p.gpu.storeKv(g, kg, vg, rows, position);
  }
  return [c, g];
}

const kvHeads = 2;
const ROPES: [string, RopeOptions][] = [
  ["normal RoPE, base 10000", { heads: kvHeads, headDim: 64, rotaryDims: 64, base: 10_000, scale: 1, neox: false }],
  ["NeoX RoPE, base 1e6, scale 1/8, 32 of 64 dims rotated",
    { heads: kvHeads, headDim: 64, rotaryDims: 32, base: 1_000_000, scale: 0.125, neox: true }],
  ["NeoX RoPE with YaRN (scale 1/32, original context 4096)", { heads: kvHeads, headDim: 64, rotaryDims: 64,
    base: 150_000, scale: 1 / 32, neox: true, yarn: { extFactor: 1, betaFast: 32, betaSlow: 1, originalContext: 4096 } }],
];
const TYPES: KvTypes[] = [{ k: "f16", v: "f16" }, { k: "q8_0", v: "q8_0" }, { k: "q4_0", v: "q4_0" }, { k: "q8_0", v: "f16" }];

describe.skipIf(noCuda)("shiftKv and compactKv on CUDA equal the CPU's", () => {
  const p: Pair = noCuda ? null! : { cpu: new CpuBackend(), gpu: CudaBackend.open({ graphs: false }) };
  afterAll(() => p?.gpu.dispose());

  /**
   * Compares the caches' first `held` cells (the rest were never written: device memory is not
   * zeroed): values and untouched keys bytewise, moved keys [from, to) by keyError.
   */
  function compare(what: string, c: KvLayer, g: KvLayer, types: KvTypes, movedFrom: number, movedTo: number,
    held: number): void {
    const want = cpuBytes(c), got = p.gpu.readKv(g);
    const kvd = c.kvHeads * c.headDim, kb = got.k.length / c.cells, vb = got.v.length / c.cells;
    expect(got.v.subarray(0, held * vb)).toEqual(want.v.subarray(0, held * vb));
    expect(got.k.subarray(0, movedFrom * kb)).toEqual(want.k.subarray(0, movedFrom * kb));
    expect(got.k.subarray(movedTo * kb, held * kb)).toEqual(want.k.subarray(movedTo * kb, held * kb));
    const e = keyError(want.k, got.k, types.k, kb, kvd, movedFrom, movedTo);
    console.log(`  ${what}: moved keys' worst difference ${e.worst.toFixed(3)} of the allowed, ` +
      `${(100 * e.sameBytes).toFixed(2)}% of their bytes equal`);
    expect(e.worst).toBeLessThanOrEqual(1);
  }

  for (const types of TYPES) {
    for (const [ropeName, rope] of ROPES) {
      const name = `${kvTypesName(types)}, ${ropeName}`;
      test(`shiftKv of a full layer (keep 4, drop 22 of 48): ${name}`, () => {
        const [c, g] = filled(p, 56, false, kvHeads, 64, types, 48, 11);
        p.cpu.shiftKv(c, rope, 4, 22, 48);
        p.gpu.shiftKv!(g, rope, 4, 22, 48);
        compare(`shift ${name}`, c, g, types, 4, 26, 48);
      });
      test(`shiftKv of a wrapped ring (32 cells, 45 positions, drop 9): ${name}`, () => {
        const [c, g] = filled(p, 32, true, kvHeads, 64, types, 45, 23);
        p.cpu.shiftKv(c, rope, 2, 9, 45);
        p.gpu.shiftKv!(g, rope, 2, 9, 45);
        compare(`ring ${name}`, c, g, types, 0, 32, 32);
      });
      test(`compactKv of scattered rows to 4: ${name}`, () => {
        const [c, g] = filled(p, 64, false, kvHeads, 64, types, 60, 37);
        const r = rng(5), from: number[] = [];
        for (let q = 4; q < 60; q++) if (q >= 44 || r() < 0.4) from.push(q);
        const list = Int32Array.from(from);
        p.cpu.compactKv(c, rope, list, 4);
        p.gpu.compactKv!(g, rope, list, 4);
        compare(`compact ${name}`, c, g, types, 4, 4 + list.length, 60);
      });
    }
  }

  test("head_dim 128 in one KV head, rope over all of it; a shift of nothing leaves the cache alone", () => {
    const rope: RopeOptions = { heads: 1, headDim: 128, rotaryDims: 128, base: 500_000, scale: 1, neox: false };
    for (const types of TYPES) {
      const [c, g] = filled(p, 40, false, 1, 128, types, 40, 3);
      const before = p.gpu.readKv(g);
      p.gpu.shiftKv!(g, rope, 4, 0, 40);
      expect(p.gpu.readKv(g)).toEqual(before);
      p.cpu.shiftKv(c, rope, 1, 38, 40);
      p.gpu.shiftKv!(g, rope, 1, 38, 40);
      compare(`shift by 38 ${kvTypesName(types)} d128`, c, g, types, 1, 2, 40);
    }
  });

  test("bad moves are refused in one line", () => {
    const rope = ROPES[0][1];
    const g = p.gpu.kvLayer(16, kvHeads, 64, "f16", false), ring = p.gpu.kvLayer(16, kvHeads, 64, "f16", true);
    expect(() => p.gpu.shiftKv!(g, rope, 4, 10, 20)).toThrow("shiftKv");
    expect(() => p.gpu.compactKv!(g, rope, Int32Array.from([6, 5]), 4)).toThrow("compactKv");
    expect(() => p.gpu.compactKv!(g, rope, Int32Array.from([3]), 4)).toThrow("compactKv");
    expect(() => p.gpu.compactKv!(ring, rope, Int32Array.from([5]), 4)).toThrow("ring");
  });
});

const MODELS: [string, RandomQuantSpec, KvTypes][] = [
  ["Llama (normal RoPE, rope factors), f16 cache", llamaQ4_0, { k: "f16", v: "f16" }],
  ["Llama (normal RoPE, rope factors), q8_0 cache", llamaQ4_0, { k: "q8_0", v: "q8_0" }],
  ["Qwen 3 (NeoX, head_dim 128), q4_0 cache", qwen3KQuants, { k: "q4_0", v: "q4_0" }],
  ["Gemma 3 (NeoX, sliding-window rings of 16), f16 cache", gemmaMixed, { k: "f16", v: "f16" }],
];

describe.skipIf(noCuda)("random-weight models past their context: CUDA's shift as the CPU's", () => {
  const context = 48, total = 120;
  for (const [name, spec, types] of MODELS) {
    for (const policy of ["streaming", "h2o"] as const) {
      test(`${name}, ${policy}`, () => {
        const path = join(dir, `${spec.arch}-${spec.seed}.gguf`);
        writeFileSync(path, randomQuantGguf(spec));
        const open = (backend: "cpu" | "cuda") => Engine.open({ modelPath: path, backend, contextLength: context,
          batch: 16, cacheTypeK: types.k, cacheTypeV: types.v });
        const cpu = open("cpu"), gpu = open("cuda");
        try {
          const r = rng(spec.seed ?? 1);
          const prompt = Array.from({ length: 21 }, () => 6 + Math.floor(r() * 269));
          // The same accumulated attention on both (h2o): what the CPU's tracking would give is
          // not the point here, the same compaction is.
          const mass = (e: Engine) => e.slot.cache.layers.map((l) => l.ring ? null : Float32Array.from(
            { length: l.cells }, (_, q) => ((q * 2654435761) % 1000) / 1000));
          const shift = (e: Engine) => {
            if (policy === "h2o") {
              e.slot.mass = mass(e);
              e.slot.massFrom = 0;
              return shiftSlotHeavy(e.backend, e.slot, e.model.info);
            }
            return shiftSlot(e.backend, e.slot, e.model.info);
          };
          let want = cpu.evaluate(prompt).slice(), got = gpu.evaluate(prompt).slice();
          let worst = normalisedError(got, want), shifts = 0;
          for (let n = prompt.length; n < total; n++) {
            const token = argmax(want);
            if (cpu.slot.length === context) {
              const dropped = shift(cpu);
              expect(dropped).toBeGreaterThan(0);
              expect(shift(gpu)).toBe(dropped);
              expect(Array.from(gpu.slot.history.subarray(0, gpu.slot.length)))
                .toEqual(Array.from(cpu.slot.history.subarray(0, cpu.slot.length)));
              shifts++;
            }
            want = cpu.evaluate([token]).slice();
            got = gpu.evaluate([token]).slice();
            worst = Math.max(worst, normalisedError(got, want));
          }
          console.log(`  ${name}, ${policy}: ${shifts} shifts over ${total} positions, worst logits error ` +
            `${worst.toExponential(2)} (tolerance ${TOL_LOGITS_Q})`);
          expect(shifts).toBeGreaterThan(1);
          expect(worst).toBeLessThanOrEqual(TOL_LOGITS_Q);
        } finally {
          cpu.close();
          gpu.close();
        }
      }, 120_000);
    }
  }

  test("generate() with contextShift on CUDA goes past the context; without, it stops there", () => {
    const path = join(dir, "llama-generate.gguf");
    writeFileSync(path, randomQuantGguf(llamaQ4_0));
    const engine = Engine.open({ modelPath: path, backend: "cuda", contextLength: 32, batch: 16 });
    try {
      const greedy = { maxTokens: 80, sampling: { ...defaultSampling, temperature: 0 }, ignoreEos: true };
      expect(engine.generate([1, 5, 9, 13], greedy).stopReason).toBe("context");
      const r = engine.generate([1, 5, 9, 13], { ...greedy, contextShift: true });
      expect(r.stopReason).toBe("length");
      expect(r.tokens.length).toBe(80);
    } finally {
      engine.close();
    }
  }, 120_000);
});
