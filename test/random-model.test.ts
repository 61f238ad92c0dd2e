// bench/random-model.ts's gpt-oss-20b shape, checked without writing its 12 GB: the header parses,
// infer's gpt-oss config reads its hyperparameters as the real model's, and its tensors are the
// ones llama.cpp's gpt-oss loader creates (src/models/openai-moe.cpp: names and dims) in the
// released GGUF's types (MXFP4 experts, other weights Q8_0, routers, biases, sinks and norms F32).
// That llama.cpp loads and runs the written file was checked by hand (llama-bench, dump-logits.c).
import { describe, expect, test } from "bun:test";
import { findShape, randomModelLayout, type RandomShape } from "../bench/random-model.ts";
import { parseGguf } from "../ts/gguf/reader.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import { gptossConfig } from "../ts/model/gptoss.ts";
import { Hparams } from "../ts/model/hparams.ts";

function header(shape: RandomShape, quant: "MXFP4_MOE" | "Q4_0") {
  const { tensors, layout } = randomModelLayout(shape, quant);
  const data = layout.dataBytes.reduce((n, b, i) => n + b + layout.paddingBytes[i], 0);
  return { tensors, bytes: layout.header.length + data,
    gguf: parseGguf(layout.header, "random", layout.header.length + data) };
}

describe("bench/random-model.ts: gpt-oss-20b's shape", () => {
  const shape = findShape("gpt-oss-20b")!;

  test("infer reads gpt-oss-20b's hyperparameters from the header", () => {
    const { gguf } = header(shape, "MXFP4_MOE");
    expect(gguf.metadata.get("general.file_type")).toBe(38); // LLAMA_FTYPE_MOSTLY_MXFP4_MOE
    const c = gptossConfig(new Hparams(gguf.metadata, "gpt-oss"), 201088);
    expect([c.layers, c.embedding, c.heads, c.kvHeads, c.headDim]).toEqual([24, 2880, 64, 8, 64]);
    expect([c.experts, c.expertsUsed, c.expertFeedForward, c.slidingWindow]).toEqual([32, 4, 2880, 128]);
    expect(c.yarn?.originalContext).toBe(4096);
    expect(c.ropeScale).toBeCloseTo(1 / 32, 6);
    expect(c.kvShapes.map((k) => k.window).slice(0, 4)).toEqual([128, 0, 128, 0]);
  });

  test("its tensors are llama.cpp's gpt-oss tensors in MXFP4_MOE's types", () => {
    const { gguf, bytes } = header(shape, "MXFP4_MOE");
    const e = 2880, v = 201088, n = 32, f = 2880, q = 64 * 64, kv = 8 * 64;
    const want = new Map<string, [number[], number]>([
      ["token_embd.weight", [[e, v], GgmlType.Q8_0]], ["output_norm.weight", [[e], GgmlType.F32]],
      ["output.weight", [[e, v], GgmlType.Q8_0]],
    ]);
    for (let i = 0; i < 24; i++) {
      const p = `blk.${i}.`;
      for (const [name, dims, type] of [
        ["attn_norm.weight", [e], GgmlType.F32], ["post_attention_norm.weight", [e], GgmlType.F32],
        ["attn_q.weight", [e, q], GgmlType.Q8_0], ["attn_k.weight", [e, kv], GgmlType.Q8_0],
        ["attn_v.weight", [e, kv], GgmlType.Q8_0], ["attn_output.weight", [q, e], GgmlType.Q8_0],
        ["attn_q.bias", [q], GgmlType.F32], ["attn_k.bias", [kv], GgmlType.F32],
        ["attn_v.bias", [kv], GgmlType.F32], ["attn_output.bias", [e], GgmlType.F32],
        ["attn_sinks.weight", [64], GgmlType.F32],
        ["ffn_gate_inp.weight", [e, n], GgmlType.F32], ["ffn_gate_inp.bias", [n], GgmlType.F32],
        ["ffn_gate_exps.weight", [e, f, n], GgmlType.MXFP4], ["ffn_up_exps.weight", [e, f, n], GgmlType.MXFP4],
        ["ffn_down_exps.weight", [f, e, n], GgmlType.MXFP4],
        ["ffn_gate_exps.bias", [f, n], GgmlType.F32], ["ffn_up_exps.bias", [f, n], GgmlType.F32],
        ["ffn_down_exps.bias", [e, n], GgmlType.F32],
      ] as const) want.set(p + name, [[...dims], type]);
    }
    const got = new Map([...gguf.tensors].map(([name, t]) => [name, [[...t.dims].map(Number), t.type.id]]));
    expect(got).toEqual(want);
    // the released gpt-oss-20b MXFP4 GGUF is 12.1 GB
    expect(bytes / 1e9).toBeGreaterThan(12.0);
    expect(bytes / 1e9).toBeLessThan(12.2);
  });

  test("--layers keeps the per-layer tensors; Q4_K is refused (2880 is not a multiple of 256)", () => {
    const two = header({ ...shape, layers: 2 }, "MXFP4_MOE").gguf;
    expect(two.tensors.size).toBe(3 + 2 * 19);
    expect(two.metadata.get("gpt-oss.block_count")).toBe(2);
    expect(() => randomModelLayout(shape, "Q4_K")).toThrow(/rows of 2880.*Q4_K/);
    // Q4_0 (blocks of 32) fits: every weight, experts included, in Q4_0
    const pure = header(shape, "Q4_0").gguf;
    expect(pure.tensors.get("blk.0.ffn_up_exps.weight")?.type.id).toBe(GgmlType.Q4_0);
    expect(pure.tensors.get("output.weight")?.type.id).toBe(GgmlType.Q4_0);
  });

  test("the other MoE shape has no LM head of its own, no biases and its F32 router", () => {
    const moe = header({ ...findShape("qwen3-30b-a3b")!, layers: 1 }, "MXFP4_MOE").gguf;
    expect(moe.tensors.has("output.weight")).toBe(false);
    expect(moe.tensors.has("blk.0.attn_q.bias")).toBe(false);
    expect(moe.tensors.get("blk.0.ffn_gate_inp.weight")?.type.id).toBe(GgmlType.F32);
    expect(moe.tensors.get("blk.0.ffn_down_exps.weight")?.type.id).toBe(GgmlType.MXFP4);
    expect(moe.tensors.get("token_embd.weight")?.type.id).toBe(GgmlType.Q8_0);
  });
});
