// One call for a layer's q/k/v and gate/up (infer_matmul_multi, CpuBackend.matmuls): the
// activations quantized once and every matrix's rows one parallel op must give exactly what a
// matmul per matrix gives — stored and repacked layouts, one token and a batch — and a whole
// model the same logits with and without it. Weights that quantize x differently are refused.
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CpuBackend } from "../ts/backend/cpu.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import { native } from "../ts/native/lib.ts";
import { promptAndStepLogits } from "./support/engine-logits.ts";
import { llamaQ4_0, qwen3KQuants, randomQuantGguf, randomTensorData } from "./support/random-quant-gguf.ts";

const lib = native();
const dir = mkdtempSync(join(tmpdir(), "infer-matmul-multi-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const bits = (x: Float32Array) => new Uint32Array(x.buffer, x.byteOffset, x.length);

interface Matrix { w: Uint8Array; type: number; rows: number }

function matrix(type: number, rows: number, nIn: number, seed: number, repack: boolean): Matrix {
  const w = randomTensorData(type, rows * nIn, seed, 1);
  const packedType = repack ? lib.infer_repacked_type(type, rows) : 0;
  if (packedType === 0) return { w, type, rows };
  const packed = new Uint8Array(w.length);
  expect(lib.infer_repack(type, w, rows, nIn, packed)).toBe(0);
  return { w: packed, type: packedType, rows };
}

for (const [name, type, nIn] of [["Q8_0", GgmlType.Q8_0, 96], ["Q4_0", GgmlType.Q4_0, 160],
  ["Q4_K", GgmlType.Q4_K, 512], ["Q6_K", GgmlType.Q6_K, 256]] as const) {
  for (const repack of [false, true]) {
    test(`${name}${repack ? " (repacked where it can be)" : ""}: q/k/v and gate/up in one call equal a call each`, () => {
      for (const tokens of [1, 5]) {
        const x = new Float32Array(tokens * nIn).map((_, i) => Math.cos(i * 0.37) * (1 + (i % 7)));
        for (const rows of [[64, 16, 16], [40, 40]]) {
          const ms = rows.map((r, i) => matrix(type, r, nIn, 11 * r + i, repack));
          const want = ms.map((m) => new Float32Array(tokens * m.rows));
          ms.forEach((m, i) => expect(lib.infer_matmul(m.w, m.type, m.rows, nIn, x, tokens, want[i])).toBe(0));
          const got = ms.map((m) => new Float32Array(tokens * m.rows));
          const arg = (i: number) => (i < ms.length ? [ms[i].w, ms[i].type, ms[i].rows, got[i]] : [null, 0, 0, null]);
          // @ts-expect-error: the spread matches the native signature (x, n_in, n_tok, then 3 × (w, type, n_out, y))
          expect(lib.infer_matmul_multi(x, nIn, tokens, ...arg(0), ...arg(1), ...arg(2))).toBe(0);
          for (let i = 0; i < ms.length; i++) expect(bits(got[i])).toEqual(bits(want[i]));
        }
      }
    });
  }
}

test("weights that quantize x differently are refused with a message, not mixed", () => {
  const nIn = 256, x = new Float32Array(nIn).fill(1);
  const a = matrix(GgmlType.Q8_0, 8, nIn, 1, false), b = matrix(GgmlType.Q4_K, 8, nIn, 2, false);
  expect(lib.infer_matmul_activation(GgmlType.Q8_0)).toBe(GgmlType.Q8_0);
  expect(lib.infer_matmul_activation(GgmlType.Q4_K)).toBe(GgmlType.Q8_K);
  expect(lib.infer_matmul_activation(GgmlType.Q8_K)).toBe(-1);
  const ya = new Float32Array(8), yb = new Float32Array(8);
  expect(lib.infer_matmul_multi(x, nIn, 1, a.w, a.type, 8, ya, b.w, b.type, 8, yb, null, 0, 0, null)).not.toBe(0);
  expect(String(lib.infer_last_error())).toContain("quantize x differently");
});

for (const [name, spec] of [["Llama, Q4_0", llamaQ4_0], ["Qwen 3, Q4_K/Q5_K/Q6_K", qwen3KQuants]] as const) {
  test(`a ${name} model gives the same logits with q/k/v and gate/up in one call each`, () => {
    const path = join(dir, `${spec.arch}-${spec.seed}.gguf`);
    writeFileSync(path, randomQuantGguf(spec));
    const prompt = Array.from({ length: 37 }, (_, i) => 6 + ((i * 97) % 260));
    const run = () => promptAndStepLogits(path, prompt);
    type Matmuls = CpuBackend["matmuls"];
    const proto = CpuBackend.prototype as { matmuls?: Matmuls };
    const saved = proto.matmuls!;
    let fusedCalls = 0;
    proto.matmuls = function (this: CpuBackend, ...args: Parameters<Matmuls>) {
      const done = saved.apply(this, args);
      if (done) fusedCalls++;
      return done;
    };
    let fused: Float32Array[];
    try {
      fused = run();
    } finally {
      proto.matmuls = saved;
    }
    expect(fusedCalls).toBeGreaterThan(0);
    proto.matmuls = undefined;
    let separate: Float32Array[];
    try {
      separate = run();
    } finally {
      proto.matmuls = saved;
    }
    for (let i = 0; i < fused.length; i++) expect(bits(fused[i])).toEqual(bits(separate[i]));
  });
}
