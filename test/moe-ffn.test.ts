// The CPU backend's one-call MoE FFN (infer_moe_ffn, lib/cpu/moe.zig) against the per-expert path
// it replaces (rows gathered per expert, three matmuls, SwiGLU, scaled scatter, rank-order sum):
// the same f32 bits for one token and for batches, Q4_0 experts (repacked) and K-quant ones (Q4_K
// gate/up, Q6_K down), on the random-weight GGUFs of the llama.cpp golden test.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Backend } from "../ts/backend/backend.ts";
import { CpuBackend } from "../ts/backend/cpu.ts";
import { InferError } from "../ts/errors.ts";
import { openGguf } from "../ts/gguf/reader.ts";
import { MoeBuffers, moeFfn, type MoeShape, type MoeWeights } from "../ts/model/moe.ts";
import { qwen3moeKQuants, qwen3moeQ4_0, randomQuantGguf, type RandomQuantSpec } from "./support/random-quant-gguf.ts";

const dir = mkdtempSync(join(tmpdir(), "infer-moe-one-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function setup(name: string, spec: RandomQuantSpec) {
  const path = join(dir, `${name}.gguf`);
  writeFileSync(path, randomQuantGguf(spec));
  const file = openGguf(path);
  const be = new CpuBackend();
  be.setThreads(2);
  const ops = be.experts;
  const tensor = (n: string) => file.tensors.get(`blk.1.${n}.weight`)!;
  const w: MoeWeights = {
    router: be.weight(file, tensor("ffn_gate_inp")),
    gate: ops.split(file, tensor("ffn_gate_exps")),
    up: ops.split(file, tensor("ffn_up_exps")),
    down: ops.split(file, tensor("ffn_down_exps")),
  };
  const s: MoeShape = { embedding: spec.embedding, experts: spec.moe!.experts, expertsUsed: spec.moe!.used,
    expertFeedForward: spec.moe!.feedForward, normalizeTopK: true };
  // The same backend without ffn: moeFfn takes the per-expert path.
  const perExpert: Backend = Object.create(be, { experts: { value: { ...ops, ffn: undefined } } });
  return { file, be, perExpert, w, s };
}

describe("infer_moe_ffn equals the per-expert path, bit for bit, for 1 to 16 rows", () => {
  for (const [name, spec] of Object.entries({ qwen3moeQ4_0, qwen3moeKQuants })) {
    test(name, () => {
      const { file, be, perExpert, w, s } = setup(name, spec);
      try {
        const maxRows = 16;
        const x = be.activation("x", maxRows, s.embedding);
        const one = be.activation("one", maxRows, s.embedding), each = be.activation("each", maxRows, s.embedding);
        const b = new MoeBuffers(be, maxRows, s);
        let seed = 7;
        for (const rows of [1, 1, 1, 2, 5, 16]) {
          const v = be.read(x, rows);
          for (let i = 0; i < v.length; i++) {
            seed = (seed * 1103515245 + 12345) >>> 0;
            v[i] = (seed / 2 ** 32 - 0.5) * 4;
          }
          moeFfn(be, x, rows, w, s, b, one);
          moeFfn(perExpert, x, rows, w, s, b, each);
          const got = new Uint32Array(be.read(one, rows).slice().buffer);
          const want = new Uint32Array(be.read(each, rows).slice().buffer);
          expect(got).toEqual(want);
          expect(be.read(one, rows).some((y) => y !== 0)).toBe(true);
        }
      } finally {
        be.dispose();
        file.close();
      }
    });
  }

  test("an expert id out of range is refused with invalid_argument", () => {
    const { file, be, w, s } = setup("bad-id", qwen3moeKQuants);
    try {
      const x = be.activation("x", 1, s.embedding), out = be.activation("out", 1, s.embedding);
      const chosen = new Int32Array(s.expertsUsed).fill(1);
      chosen[2] = s.experts;
      const weights = new Float32Array(s.expertsUsed).fill(0.25);
      let error: unknown;
      try {
        be.experts.ffn!(w.gate, w.up, w.down, x, 1, chosen, weights, s.expertsUsed, out);
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(InferError);
      expect((error as InferError).code).toBe("invalid_argument");
      expect((error as InferError).message).toContain(`expert ${s.experts} of ${s.experts}`);
    } finally {
      be.dispose();
      file.close();
    }
  });
});
