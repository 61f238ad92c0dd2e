// MXFP4 against ggml itself: test/fixtures/mxfp4-golden.json holds what libggml computes
// (gen-mxfp4-golden.c: its reference quantizer and dequantizer, its CPU Q8_0 activation
// quantizer, the AVX2 gemv llama.cpp runs for MXFP4 matmuls, and the plain vec_dot). infer's
// quantizer, dequantizer and matmul must equal them bit for bit; the plain vec_dot sums in
// another order, so it is met within float rounding.
import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { check, native } from "../ts/native/lib.ts";
import { GgmlType, ggmlTypes } from "../ts/gguf/types.ts";

interface MatvecCase {
  n_in: number; n_out: number; n_tok: number;
  w: string; x: string; x_q8_0: string; gemv: string; vec_dot: string;
}
const golden: { quant: { n: number; x: string; mxfp4: string; dequantized: string }; matvec: MatvecCase[] } =
  await Bun.file(join(import.meta.dir, "fixtures", "mxfp4-golden.json")).json();

const bytes = (hex: string) => new Uint8Array(Buffer.from(hex, "hex"));
const f32 = (hex: string) => new Float32Array(bytes(hex).buffer);
const bits = (a: Float32Array) => Array.from(new Uint32Array(a.buffer, a.byteOffset, a.length));

test("the GGUF type table knows MXFP4: 32 values in 17 bytes, id 39", () => {
  expect(GgmlType.MXFP4).toBe(39);
  expect(ggmlTypes.get(39)).toMatchObject({ name: "MXFP4", blockValues: 32, blockBytes: 17 });
  const values = new Uint32Array(1), size = new Uint32Array(1);
  check(native().infer_quant_block_info(39, values, size), "block info");
  expect([values[0], size[0]]).toEqual([32, 17]);
});

test("quantize_row equals ggml's quantize_row_mxfp4_ref byte for byte", () => {
  const { n, x, mxfp4 } = golden.quant;
  const out = new Uint8Array((n / 32) * 17);
  check(native().infer_quantize_row(39, f32(x), n, out), "quantize MXFP4");
  expect(Buffer.from(out).toString("hex")).toBe(mxfp4);
});

test("dequantize equals ggml's dequantize_row_mxfp4 bit for bit", () => {
  const { n, mxfp4, dequantized } = golden.quant;
  const out = new Float32Array(n);
  check(native().infer_dequantize(39, bytes(mxfp4), n, out), "dequantize MXFP4");
  expect(bits(out)).toEqual(bits(f32(dequantized)));
});

test("the Q8_0 activations are ggml's CPU quantizer's, byte for byte", () => {
  for (const c of golden.matvec) {
    const out = new Uint8Array((c.n_tok * c.n_in / 32) * 34);
    check(native().infer_quantize_row(GgmlType.Q8_0, f32(c.x), c.n_tok * c.n_in, out), "quantize Q8_0");
    // infer_quantize_row writes ggml's reference rounding; the matmul's activation quantizer is
    // the SIMD one, which this fixture pins through the matmul results below. Both agree here.
    expect(Buffer.from(out).toString("hex")).toBe(c.x_q8_0);
  }
});

describe("matmul equals ggml_gemv_mxfp4_8x8_q8_0 bit for bit", () => {
  for (const c of golden.matvec) {
    test(`${c.n_out} x ${c.n_in}, tokens one at a time and as a batch`, () => {
      const w = bytes(c.w), x = f32(c.x), want = f32(c.gemv);
      for (let t = 0; t < c.n_tok; t++) {
        const y = new Float32Array(c.n_out);
        check(native().infer_matmul(w, 39, c.n_out, c.n_in, x.subarray(t * c.n_in), 1, y), "matmul");
        expect(bits(y)).toEqual(bits(want.subarray(t * c.n_out, (t + 1) * c.n_out)));
      }
      const batch = new Float32Array(c.n_tok * c.n_out);
      check(native().infer_matmul(w, 39, c.n_out, c.n_in, x, c.n_tok, batch), "matmul batch");
      expect(bits(batch)).toEqual(bits(want));
      // Odd row counts (not llama.cpp's repacked path, same arithmetic here): rows 0..6.
      const odd = new Float32Array(7);
      check(native().infer_matmul(w, 39, 7, c.n_in, x, 1, odd), "matmul 7 rows");
      expect(bits(odd)).toEqual(bits(want.subarray(0, 7)));
      // ggml's un-repacked vec_dot sums the same exact block integers in another order.
      // Bound: f32 rounding of sums of |w x| (each block's integer is exact either way).
      const vecDot = f32(c.vec_dot);
      const wf = new Float32Array(c.n_out * c.n_in);
      check(native().infer_dequantize(39, w, wf.length, wf), "dequantize");
      for (let t = 0; t < c.n_tok; t++) {
        for (let o = 0; o < c.n_out; o++) {
          let magnitude = 0;
          for (let i = 0; i < c.n_in; i++) magnitude += Math.abs(wf[o * c.n_in + i] * x[t * c.n_in + i]);
          const i = t * c.n_out + o;
          expect(Math.abs(want[i] - vecDot[i])).toBeLessThanOrEqual(1e-6 * magnitude);
        }
      }
    });
  }
});

test("a weight row must fill whole MXFP4 blocks", () => {
  const out = new Float32Array(48);
  expect(native().infer_dequantize(39, new Uint8Array(34), 48, out)).not.toBe(0);
});
