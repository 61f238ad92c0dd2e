// The rebuilt tiny models are checked tensor by tensor against weights.json's hashes as they are
// written (hf-tiny.ts throws on a mismatch); here, the half-precision rounding on its own, over
// the ranges where it is easy to get wrong (subnormals, ties, overflow), against the engine's
// Float16Array.
import { expect, test } from "bun:test";
import { f16 } from "./hf-tiny.ts";

test("f16() rounds float32 to half as Float16Array does, subnormals and ties included", () => {
  const f32 = new Float32Array(1), bits = new Uint32Array(f32.buffer);
  const half = new Float16Array(1), halfBits = new Uint16Array(half.buffer);
  let s = 12345;
  const next = () => (s = (Math.imul(s, 1103515245) + 12345) >>> 0);
  const cases: number[] = [0, 2 ** -24, 2 ** -25, 3 * 2 ** -26, 2 ** -14, 65504, 65520, 1e6,
    1 + 2 ** -11, 1 + 3 * 2 ** -11, Infinity];
  for (let i = 0; i < 20000; i++) cases.push((next() / 2 ** 32 - 0.5) * 2 ** ((next() % 48) - 30));
  for (const v of cases) {
    for (const x of [v, -v]) {
      f32[0] = x;
      half[0] = f32[0]!;
      expect([x, f16(bits[0]!)]).toEqual([x, halfBits[0]!]);
    }
  }
});
