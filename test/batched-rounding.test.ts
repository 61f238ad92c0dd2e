// llama.cpp's batched rounding for embeddings (docs/embeddings.md): llama-embedding computes a
// text's rows four at a time through llama.cpp's batched Q4_K kernel, which rounds otherwise
// than its single-token kernel (an FMA every 64 values instead of every 256). infer computes
// those rows of an embedding with a layout that rounds so (lib/quant/q4_k_x8.zig, checked there
// against a plain transcription of llama.cpp's kernel); here: which weights have it, that a row
// rounds the same whatever shares its call, that the CPU backend gives it to exactly the rows
// asked for, and which rows of an embedding the scheduler asks it for.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { Engine } from "../ts/engine/engine.ts";
import { llamaBatchRows } from "../ts/engine/scheduler.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import { defaultModelPath } from "../ts/models/cache.ts";
import { native } from "../ts/native/lib.ts";
import { randomTensorData } from "./support/random-quant-gguf.ts";

const lib = native();
const bits = (x: Float32Array) => new Uint32Array(x.buffer, x.byteOffset, x.length);

function maxRelative(a: Float32Array, b: Float32Array): number {
  let err = 0, scale = 0;
  for (let i = 0; i < a.length; i++) {
    err = Math.max(err, Math.abs(a[i] - b[i]));
    scale = Math.max(scale, Math.abs(b[i]));
  }
  return err / scale;
}

describe("the batched-rounding layout", () => {
  const q4kx8 = lib.infer_repacked_type(GgmlType.Q4_K, 8);

  test("exists for repacked Q4_K only", () => {
    expect(lib.infer_prompt_rounding_type(q4kx8)).not.toBe(0);
    for (const type of [GgmlType.F32, GgmlType.F16, GgmlType.Q4_0, GgmlType.Q5_0, GgmlType.Q8_0,
      GgmlType.Q4_K, GgmlType.Q6_K, lib.infer_repacked_type(GgmlType.Q4_0, 8),
      lib.infer_repacked_type(GgmlType.Q8_0, 8)]) {
      expect(lib.infer_prompt_rounding_type(type)).toBe(0);
    }
  });

  test("rounds each row alike however many share the call; near the single-token rounding, not equal", () => {
    const nOut = 64, nIn = 1024, tokens = 7;
    const w = randomTensorData(GgmlType.Q4_K, nOut * nIn, 45, 1);
    const packed = new Uint8Array(w.length);
    expect(lib.infer_repack(GgmlType.Q4_K, w, nOut, nIn, packed)).toBe(0);
    const batched = lib.infer_prompt_rounding_type(q4kx8);
    const x = new Float32Array(tokens * nIn).map((_, i) => Math.sin(i * 0.37) * (1 + (i % 7)));
    const together = new Float32Array(tokens * nOut), single = new Float32Array(tokens * nOut);
    expect(lib.infer_matmul(packed, batched, nOut, nIn, x, tokens, together)).toBe(0);
    for (let t = 0; t < tokens; t++) {
      expect(lib.infer_matmul(packed, batched, nOut, nIn, x.subarray(t * nIn), 1,
        single.subarray(t * nOut))).toBe(0);
    }
    expect(bits(together)).toEqual(bits(single));
    const usual = new Float32Array(tokens * nOut);
    expect(lib.infer_matmul(packed, q4kx8, nOut, nIn, x, tokens, usual)).toBe(0);
    expect(bits(together)).not.toEqual(bits(usual));
    expect(maxRelative(together, usual)).toBeLessThan(1e-5);
  });
});

describe.skipIf(!existsSync(defaultModelPath()))("the CPU backend's matmul with rows asked to round as llama.cpp's batches", () => {
  const engine = Engine.open({ modelPath: defaultModelPath(), contextLength: 64, threads: 2, backend: "cpu" });
  afterAll(() => engine.close());
  const be = engine.backend, file = engine.file;
  const weight = (name: string) => be.weight(file, file.tensors.get(name)!);

  function run(name: string, nIn: number, nOut: number, ranges: { first: number; rows: number }[]) {
    const x = be.activation("x", 9, nIn), out = be.activation("out", 9, nOut);
    be.read(x, 9).set(Float32Array.from({ length: 9 * nIn }, (_, i) => Math.cos(i * 0.11) * (i % 5)));
    be.setBatchedRounding!({ rows: ranges, fourRows: ranges });
    be.matmul(weight(name), x, 8, out, 1); // batch rows 1..8 into out's rows 0..7
    be.setBatchedRounding!(null);
    return be.read(out, 8).slice();
  }

  test("a Q4_K weight: the rows asked for take the variant, the others the usual rounding", () => {
    const usual = run("blk.0.attn_output.weight", 1024, 640, []);
    const asked = run("blk.0.attn_output.weight", 1024, 640, [{ first: 0, rows: 2 }, { first: 4, rows: 3 }]);
    const row = (v: Float32Array, r: number) => v.subarray((r - 1) * 640, r * 640);
    for (const r of [2, 3, 7, 8]) expect(bits(row(asked, r))).toEqual(bits(row(usual, r)));
    for (const r of [1, 4, 5, 6]) {
      expect(bits(row(asked, r))).not.toEqual(bits(row(usual, r)));
      expect(maxRelative(row(asked, r), row(usual, r))).toBeLessThan(1e-5);
    }
  });

  test("a weight whose llama.cpp batches round as its single tokens (Q5_0) is unchanged", () => {
    expect(bits(run("blk.0.attn_q.weight", 640, 1024, [{ first: 0, rows: 9 }])))
      .toEqual(bits(run("blk.0.attn_q.weight", 640, 1024, [])));
  });
});

test("an embedding's rows that llama-embedding computes in batches, and four rows at a time", () => {
  expect(llamaBatchRows(11, 0, 11)).toEqual({ batched: 11, fourRows: 8 }); // 0-7 by four, 8-10 one by one
  expect(llamaBatchRows(11, 0, 5)).toEqual({ batched: 5, fourRows: 5 }); // a first chunk of the text
  expect(llamaBatchRows(11, 5, 6)).toEqual({ batched: 6, fourRows: 3 });
  expect(llamaBatchRows(11, 8, 3)).toEqual({ batched: 3, fourRows: 0 });
  expect(llamaBatchRows(3, 0, 3)).toEqual({ batched: 3, fourRows: 0 });
  expect(llamaBatchRows(403, 256, 147)).toEqual({ batched: 147, fourRows: 144 });
  // A text of one token is one row: llama.cpp's single-token kernels.
  expect(llamaBatchRows(1, 0, 1)).toEqual({ batched: 0, fourRows: 0 });
  // 513 tokens: a batch of 512 rows, then one of a single row.
  expect(llamaBatchRows(513, 500, 13)).toEqual({ batched: 12, fourRows: 12 });
  expect(llamaBatchRows(1024, 512, 512)).toEqual({ batched: 512, fourRows: 512 });
});
