// Method: infer_dequantize must equal gguf-py's NumPy dequantizer bit for bit (golden fixture from
// test/fixtures/gen_quant_golden.py); infer_matmul must equal a plain f64 TypeScript dot of the
// dequantized weights within a per-row bound derived from the activation quantization error.
import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { InferError, type InferErrorCode } from "../ts/errors.ts";
import { check, native } from "../ts/native/lib.ts";
import { rng } from "./support/numeric.ts";

interface GoldenCase {
  type: string;
  type_id: number;
  n: number;
  bytes_b64: string;
  expected_f32_b64: string;
}

const golden: { cases: GoldenCase[] } =
  await Bun.file(join(import.meta.dir, "fixtures", "quant-golden.json")).json();

function fromB64(s: string): Uint8Array {
  return new Uint8Array(Buffer.from(s, "base64"));
}

describe("infer_dequantize equals gguf.quants.dequantize bit for bit", () => {
  for (const c of golden.cases) {
    test(c.type, () => {
      const src = fromB64(c.bytes_b64);
      const expected = new Uint32Array(fromB64(c.expected_f32_b64).buffer);
      const out = new Float32Array(c.n);
      check(native().infer_dequantize(c.type_id, src, c.n, out), `dequantize ${c.type}`);
      const got = new Uint32Array(out.buffer);
      let mismatches = 0;
      for (let i = 0; i < c.n; i++) if (got[i] !== expected[i]) mismatches++;
      expect(mismatches).toBe(0);
    });
  }
});

test("infer_get_rows dequantizes the requested rows", () => {
  const c = golden.cases.find((g) => g.type === "Q8_0")!;
  const table = fromB64(c.bytes_b64); // 8 blocks: a table of 4 rows x 64 columns
  const expected = new Float32Array(fromB64(c.expected_f32_b64).buffer);
  const ids = new Int32Array([3, 0, 3, 1]);
  const out = new Float32Array(ids.length * 64);
  check(native().infer_get_rows(8, table, 64, 4, ids, ids.length, out), "get_rows");
  ids.forEach((id, i) => {
    expect(Array.from(out.subarray(i * 64, i * 64 + 64)))
      .toEqual(Array.from(expected.subarray(id * 64, id * 64 + 64)));
  });
});

// Type id -> byte offsets of the f16 scale fields in a block, and the activation format.
// Weights are otherwise random bytes, so every quant bit pattern is exercised.
type Activation = "q8_0" | "q8_k" | "f16" | "bf16" | "f32";
const weightTypes: Record<string, { id: number; scaleOffsets: number[]; act: Activation }> = {
  F32: { id: 0, scaleOffsets: [], act: "f32" },
  F16: { id: 1, scaleOffsets: [], act: "f16" },
  BF16: { id: 30, scaleOffsets: [], act: "bf16" },
  Q4_0: { id: 2, scaleOffsets: [0], act: "q8_0" },
  Q5_0: { id: 6, scaleOffsets: [0], act: "q8_0" },
  Q8_0: { id: 8, scaleOffsets: [0], act: "q8_0" },
  Q4_K: { id: 12, scaleOffsets: [0, 2], act: "q8_k" },
  Q5_K: { id: 13, scaleOffsets: [0, 2], act: "q8_k" },
  Q6_K: { id: 14, scaleOffsets: [208], act: "q8_k" },
};

function blockInfo(typeId: number): { values: number; bytes: number } {
  const values = new Uint32Array(1), bytes = new Uint32Array(1);
  check(native().infer_quant_block_info(typeId, values, bytes), "block info");
  return { values: values[0], bytes: bytes[0] };
}

function randomWeights(name: string, nOut: number, nIn: number, rand: () => number): Uint8Array {
  const t = weightTypes[name];
  if (t.act === "f32" || t.act === "f16" || t.act === "bf16") {
    const f = new Float32Array(nOut * nIn).map(() => rand() * 2 - 1);
    const { bytes } = blockInfo(t.id);
    const out = new Uint8Array(f.length * bytes);
    check(native().infer_quantize_row(t.id, f, f.length, out), `quantize ${name}`);
    return out;
  }
  const { values, bytes } = blockInfo(t.id);
  const w = new Uint8Array((nOut * nIn) / values * bytes).map(() => Math.floor(rand() * 256));
  const view = new DataView(w.buffer);
  for (let block = 0; block < w.length; block += bytes) {
    for (const off of t.scaleOffsets) {
      // f16 with exponent 2^-8 .. 2^-5 and random mantissa and sign: finite and moderate.
      const bits = ((rand() < 0.5 ? 0x8000 : 0) | ((7 + Math.floor(rand() * 4)) << 10) |
        Math.floor(rand() * 1024));
      view.setUint16(block + off, bits, true);
    }
  }
  return w;
}

/**
 * Bound on |activation-quantized dot - exact dot| for one weight row, by the activation format:
 *  - q8_0: per 32-block, |x - q*d| <= amax/254 (half a step of amax/127) + amax/2048 (d is an f16,
 *    relative error <= 2^-11, times |q| <= 127 steps);
 *  - q8_k: per 256-block, half a step amax/254 (d is an f32);
 *  - f16 / bf16: relative rounding 2^-11 / 2^-8 of each activation; f32: none.
 * Plus 1e-5 of sum |w x| for f32 accumulation order, which differs from this f64 reference.
 */
function tolerance(act: string, w: Float32Array, x: Float32Array): number {
  let bound = 0, magnitude = 0;
  const block = act === "q8_0" ? 32 : act === "q8_k" ? 256 : 1;
  for (let b = 0; b < x.length; b += block) {
    let amax = 0, wsum = 0;
    for (let i = b; i < b + block; i++) {
      amax = Math.max(amax, Math.abs(x[i]));
      wsum += Math.abs(w[i]);
      magnitude += Math.abs(w[i] * x[i]);
    }
    if (act === "q8_0") bound += wsum * amax * (1 / 254 + 1 / 2048);
    else if (act === "q8_k") bound += wsum * amax / 254;
    else if (act === "f16") bound += wsum * amax * 2 ** -11;
    else if (act === "bf16") bound += wsum * amax * 2 ** -8;
  }
  return bound + 1e-5 * magnitude + 1e-6;
}

describe("infer_matmul equals the f64 dot of dequantized weights, within the bound", () => {
  for (const [name, t] of Object.entries(weightTypes)) {
    test(name, () => {
      const rand = rng(t.id + 1);
      for (const nIn of t.act === "q8_k" ? [256, 768] : [32, 96, 768]) {
        for (const nOut of [1, 7, 33]) {
          for (const nTok of [1, 3, 5]) {
            const w = randomWeights(name, nOut, nIn, rand);
            const x = new Float32Array(nTok * nIn).map(() => (rand() * 2 - 1) * 3);
            const y = new Float32Array(nTok * nOut);
            check(native().infer_matmul(w, t.id, nOut, nIn, x, nTok, y), `matmul ${name}`);
            const wf = new Float32Array(nOut * nIn);
            check(native().infer_dequantize(t.id, w, wf.length, wf), `dequantize ${name}`);
            for (let o = 0; o < nOut; o++) {
              const row = wf.subarray(o * nIn, (o + 1) * nIn);
              for (let tok = 0; tok < nTok; tok++) {
                const xr = x.subarray(tok * nIn, (tok + 1) * nIn);
                let want = 0;
                for (let i = 0; i < nIn; i++) want += row[i] * xr[i];
                const got = y[tok * nOut + o];
                const tol = tolerance(t.act, row, xr);
                if (!(Math.abs(got - want) <= tol)) {
                  throw new Error(`${name} nIn=${nIn} nOut=${nOut} nTok=${nTok} [${tok},${o}]: ` +
                    `got ${got}, want ${want}, tolerance ${tol}`);
                }
              }
            }
          }
        }
      }
    });
  }
});

test("the thread count is settable and matmul agrees across thread counts", () => {
  const lib = native();
  const before = lib.infer_threads_get();
  const rand = rng(99);
  const w = randomWeights("Q4_K", 64, 512, rand);
  const x = new Float32Array(3 * 512).map(() => rand() - 0.5);
  const results: Float32Array[] = [];
  for (const n of [1, 2, 3]) {
    check(lib.infer_threads_set(n), "threads_set");
    expect(lib.infer_threads_get()).toBe(n);
    const y = new Float32Array(3 * 64);
    check(lib.infer_matmul(w, 12, 64, 512, x, 3, y), "matmul");
    results.push(y);
  }
  expect(Array.from(results[1])).toEqual(Array.from(results[0]));
  expect(Array.from(results[2])).toEqual(Array.from(results[0]));
  check(lib.infer_threads_set(before), "threads_set");
});

function expectFailure(statusCode: number, code: InferErrorCode, fragment: string): void {
  try {
    check(statusCode, "call");
  } catch (err) {
    expect(err).toBeInstanceOf(InferError);
    expect((err as InferError).code).toBe(code);
    expect((err as Error).message).toContain(fragment);
    return;
  }
  throw new Error("expected a failure status");
}

describe("errors are statuses with messages", () => {
  const lib = native();
  const out = new Float32Array(256);
  const bytes = new Uint8Array(1024);

  test("an unsupported type names itself", () => {
    expectFailure(lib.infer_dequantize(10, bytes, 256, out), "unsupported",
      "Q2_K (10) is not supported");
    expectFailure(lib.infer_matmul(bytes, 999, 1, 256, out, 1, out), "unsupported", "(999)");
    expectFailure(lib.infer_matmul(bytes, 15, 1, 256, out, 1, out), "unsupported",
      "activation format");
  });

  test("n must fill whole blocks", () => {
    expectFailure(lib.infer_dequantize(12, bytes, 100, out), "invalid_argument",
      "block size 256");
    expectFailure(lib.infer_matmul(bytes, 8, 1, 48, out, 1, out), "invalid_argument",
      "block size 32");
  });

  test("get_rows rejects an id out of range before writing", () => {
    const ids = new Int32Array([0, 4]);
    out.fill(7);
    expectFailure(lib.infer_get_rows(8, bytes, 32, 4, ids, 2, out), "invalid_argument",
      "ids[1] = 4");
    expect(out[0]).toBe(7);
    expectFailure(lib.infer_get_rows(8, bytes, 32, 4, new Int32Array([-1]), 1, out),
      "invalid_argument", "ids[0] = -1");
  });

  test("null pointers are rejected", () => {
    expectFailure(lib.infer_dequantize(8, null, 32, out), "invalid_argument",
      "src is null");
  });

  test("block info reports ggml's geometry", () => {
    expect(blockInfo(12)).toEqual({ values: 256, bytes: 144 });
    expect(blockInfo(14)).toEqual({ values: 256, bytes: 210 });
    expect(blockInfo(6)).toEqual({ values: 32, bytes: 22 });
    expect(blockInfo(15)).toEqual({ values: 256, bytes: 292 });
  });
});
