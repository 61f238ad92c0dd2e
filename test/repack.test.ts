// Repacked weights (ts/backend/cpu-repack.ts, lib/quant/q4_0_x8.zig, q8_0_x8.zig, q4_k_x8.zig): a
// Q4_0, Q8_0 or Q4_K matrix with its rows interleaved by eight must give exactly what the rows
// as stored give — single tokens and batches, odd sizes — and a whole model must give the same
// logits with and without repacking.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { GgmlType } from "../ts/gguf/types.ts";
import { native } from "../ts/native/lib.ts";
import { promptAndStepLogits } from "./support/engine-logits.ts";
import { llamaQ4_0, qwen3KQuants, randomQuantGguf, randomTensorData } from "./support/random-quant-gguf.ts";

const lib = native();
const dir = mkdtempSync(join(tmpdir(), "infer-repack-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function bits(x: Float32Array): Uint32Array {
  return new Uint32Array(x.buffer, x.byteOffset, x.length);
}

describe("Q4_0, Q8_0 and Q4_K repacked by eight rows", () => {
  // Q8_0's 33,792-wide rows are wider than its batched path's stack copy (512 blocks).
  const shapes: [string, number, [number, number][], number[]][] = [
    ["Q4_0", GgmlType.Q4_0, [[8, 32], [40, 96], [200, 4096], [1000, 352]], [1, 3, 4, 7]],
    ["Q8_0", GgmlType.Q8_0, [[8, 32], [40, 96], [200, 4096], [1000, 352], [8, 33792]], [1, 3, 8, 9]],
    ["Q4_K", GgmlType.Q4_K, [[8, 256], [40, 768], [200, 4096]], [1, 3, 4, 7]],
  ];
  for (const [name, type, sizes, tokenCounts] of shapes) {
    for (const [nOut, nIn] of sizes) {
      for (const tokens of tokenCounts) {
        test(`${name} ${nOut} x ${nIn}, ${tokens} token(s): equal to the stored rows, bit for bit`, () => {
          const w = randomTensorData(type, nOut * nIn, nOut * 31 + nIn, 1);
          const packedType = lib.infer_repacked_type(type, nOut);
          expect(packedType).not.toBe(0);
          const packed = new Uint8Array(w.length);
          expect(lib.infer_repack(type, w, nOut, nIn, packed)).toBe(0);
          const x = new Float32Array(tokens * nIn).map((_, i) => Math.sin(i * 0.7) * (1 + (i % 5)));
          const want = new Float32Array(tokens * nOut), got = new Float32Array(tokens * nOut);
          expect(lib.infer_matmul(w, type, nOut, nIn, x, tokens, want)).toBe(0);
          expect(lib.infer_matmul(packed, packedType, nOut, nIn, x, tokens, got)).toBe(0);
          expect(bits(got)).toEqual(bits(want));
        });
      }
    }
  }

  test("only Q4_0, Q8_0 and Q4_K with rows in eights are repacked; misuse is an error, not garbage", () => {
    expect(lib.infer_repacked_type(GgmlType.Q4_0, 12)).toBe(0);
    expect(lib.infer_repacked_type(GgmlType.Q8_0, 12)).toBe(0);
    expect(lib.infer_repacked_type(GgmlType.Q4_K, 20)).toBe(0);
    expect(lib.infer_repacked_type(GgmlType.Q5_0, 64)).toBe(0);
    const w = new Uint8Array(12 * 22);
    expect(lib.infer_repack(GgmlType.Q4_0, w, 12, 32, new Uint8Array(w.length))).not.toBe(0);
    expect(lib.infer_repack(GgmlType.Q5_0, w, 8, 32, new Uint8Array(w.length))).not.toBe(0);
    const packedType = lib.infer_repacked_type(GgmlType.Q4_0, 8);
    const y = new Float32Array(12);
    expect(lib.infer_matmul(w, packedType, 12, 32, new Float32Array(32), 1, y)).not.toBe(0);
    // A repacked layout is for matmul only: reading rows from it is refused.
    expect(lib.infer_dequantize(packedType, w, 32, new Float32Array(32))).not.toBe(0);
  });
});

for (const [name, spec] of [["Llama, Q4_0", llamaQ4_0], ["Qwen 3, Q4_K/Q5_K/Q6_K", qwen3KQuants]] as const) {
  test(`a ${name} model gives the same logits with and without repacking`, () => {
    const path = join(dir, `${spec.arch}-${spec.seed}.gguf`);
    writeFileSync(path, randomQuantGguf(spec));
    const prompt = Array.from({ length: 37 }, (_, i) => 6 + ((i * 97) % 260));
    const run = (repack: boolean) => {
      const saved = process.env.INFER_REPACK;
      process.env.INFER_REPACK = repack ? "1" : "0";
      try {
        return promptAndStepLogits(path, prompt);
      } finally {
        if (saved === undefined) delete process.env.INFER_REPACK;
        else process.env.INFER_REPACK = saved;
      }
    };
    const stored = run(false), repacked = run(true);
    for (let i = 0; i < stored.length; i++) expect(bits(repacked[i])).toEqual(bits(stored[i]));
  });
}
