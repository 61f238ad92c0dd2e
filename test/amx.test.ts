// Prompt matmuls on AMX tiles (lib/cpu/matmul_amx.zig) give the bits of the rows as stored,
// single-token arithmetic included: repacked Q4_0 and Q4_K with full tiles of 16 tokens and a
// tail, rows in odd multiples of 8, with the AMX setting on and off. On a CPU without AMX both
// runs take AVX-512 VNNI (or narrower), so the comparison holds everywhere; on one with AMX
// (bench/amx-device.sh runs it there) it proves the tile instructions. The emulated tiles are
// checked against the scalar references by the Zig tests of matmul_amx.zig.
import { afterAll, describe, expect, test } from "bun:test";
import { GgmlType } from "../ts/gguf/types.ts";
import { packStruct } from "../ts/native/abi.ts";
import { native } from "../ts/native/lib.ts";
import { randomTensorData } from "./support/random-quant-gguf.ts";

const lib = native();

function configure(amx: boolean): void {
  expect(lib.infer_configure(packStruct("Settings", { cpu_amx: amx, cublas_path: new Uint8Array(0) }))).toBe(0);
}
afterAll(() => configure(true));

function bits(x: Float32Array): Uint32Array {
  return new Uint32Array(x.buffer, x.byteOffset, x.length);
}

describe(`prompt matmuls on AMX tiles (in use here: ${lib.infer_cpu_amx() === 1 ? "yes" : "no"})`, () => {
  const shapes: [string, number, [number, number][]][] = [
    ["Q4_0", GgmlType.Q4_0, [[24, 96], [40, 3072], [1000, 160]]],
    ["Q4_K", GgmlType.Q4_K, [[24, 768], [40, 3072], [1000, 256]]],
  ];
  for (const [name, type, sizes] of shapes) {
    for (const [nOut, nIn] of sizes) {
      for (const tokens of [32, 37, 64]) {
        test(`${name} ${nOut} x ${nIn}, ${tokens} tokens: equal to the stored rows, bit for bit`, () => {
          const w = randomTensorData(type, nOut * nIn, nOut * 17 + nIn, 1);
          const packedType = lib.infer_repacked_type(type, nOut);
          const packed = new Uint8Array(w.length);
          expect(lib.infer_repack(type, w, nOut, nIn, packed)).toBe(0);
          const x = new Float32Array(tokens * nIn).map((_, i) => Math.sin(i * 0.37) * (1 + (i % 7)));
          const want = new Float32Array(tokens * nOut);
          expect(lib.infer_matmul(w, type, nOut, nIn, x, tokens, want)).toBe(0);
          for (const amx of [true, false]) {
            configure(amx);
            const got = new Float32Array(tokens * nOut);
            expect(lib.infer_matmul(packed, packedType, nOut, nIn, x, tokens, got)).toBe(0);
            expect(bits(got)).toEqual(bits(want));
          }
          configure(true);
        });
      }
    }
  }

  test("INFER_AMX=0's setting turns the path off", () => {
    configure(false);
    expect(lib.infer_cpu_amx()).toBe(0);
    configure(true);
  });
});
