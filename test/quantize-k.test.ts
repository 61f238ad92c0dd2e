// Method: infer_quantize_row must write the bytes llama.cpp's own quantizer writes (ggml's
// quantize_row_*_ref, as llama-quantize runs it without an importance matrix), byte for byte, on
// 24 superblocks chosen to hit every branch of the K-quant scale search (golden fixture from
// test/fixtures/quant-k-golden.py, made with the peer build's libggml-base).
// Then K-quants end to end on a random model with 256-wide rows (see below).
import { afterAll, describe, expect, test } from "bun:test";
import { cpSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { importHuggingFace, requantizeGguf } from "../ts/convert/import.ts";
import { storageType, type QuantName } from "../ts/convert/quantize.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import { Engine } from "../ts/engine/engine.ts";
import { openGguf } from "../ts/gguf/reader.ts";
import { check, native } from "../ts/native/lib.ts";
import { writeSafetensors } from "./hf-tiny.ts";

interface GoldenCase { type: string; type_id: number; bytes_b64: string }

const golden: { n: number; n_per_row: number; input_f32_b64: string; cases: GoldenCase[] } =
  await Bun.file(join(import.meta.dir, "fixtures", "quant-k-golden.json")).json();

function fromB64(s: string): Uint8Array {
  return new Uint8Array(Buffer.from(s, "base64"));
}

const input = new Float32Array(fromB64(golden.input_f32_b64).buffer);

describe("infer_quantize_row equals ggml's reference quantizer byte for byte", () => {
  test("the fixture holds the values it claims", () => {
    expect(input.length).toBe(golden.n);
    expect(golden.n % golden.n_per_row).toBe(0);
  });
  for (const c of golden.cases) {
    test(c.type, () => {
      const expected = fromB64(c.bytes_b64);
      const out = new Uint8Array(expected.length);
      // One call per row, as the converter quantizes a tensor (blocks never span rows).
      const rowBytes = expected.length / (golden.n / golden.n_per_row);
      for (let r = 0; r < golden.n / golden.n_per_row; r++) {
        const row = input.subarray(r * golden.n_per_row, (r + 1) * golden.n_per_row);
        check(native().infer_quantize_row(c.type_id, row, row.length, out.subarray(r * rowBytes,
          (r + 1) * rowBytes)), `quantize ${c.type}`);
      }
      const blockBytes = expected.length / (golden.n / (c.type.endsWith("_K") ? 256 : 32));
      const differing: number[] = [];
      for (let b = 0; b * blockBytes < expected.length; b++) {
        const at = b * blockBytes;
        const block = (a: Uint8Array) => a.subarray(at, at + blockBytes);
        if (Buffer.compare(block(out), block(expected)) !== 0) differing.push(b);
      }
      expect(differing).toEqual([]);
    });
  }
});

// ---- K-quants end to end, on a model whose rows fill 256-value blocks --------------------------
// A random Qwen 3 (hidden 256, 8 layers) is written as a Hugging Face folder, imported at F32 and
// at each K-quant choice, and run; logits are compared by max|a - b| / max|b| at every position
// (a) with the same model's weights dequantized back to F32 (`quantize --quant F32`), which
// isolates the K-quant matmul path: the only rounding left is the 8-bit Q8_K activations, seen
// as 2.1e-2 .. 5.1e-2 for every K type (Q8_0 shows 1.7e-2 .. 2.8e-2 the same way), bar 8e-2, far
// below the ~1 a wrong block layout, scale or min gives; and (b) with the F32 import, the whole
// quantization loss. This random 8-layer model amplifies weight noise about 10× (Q8_0's ~0.3%
// RMS weight error shows as 2.0e-2 .. 4.2e-2), so the losses are large: seen Q6_K 7.6e-2 ..
// 1.2e-1, Q5_K 1.2e-1 .. 2.1e-1, Q4_K 2.6e-1 .. 5.0e-1, Q4_K_M 2.7e-1 .. 3.8e-1; the bars (about
// 1.6× those) only order the formats and catch a gross quantizer error (the quantizers' bytes
// are pinned to llama.cpp's above).
const work = mkdtempSync(join(tmpdir(), "infer-qk-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const WIDE = { hidden: 256, ffn: 256, layers: 8, heads: 4, kvHeads: 2, headDim: 64, vocab: 352 };

/** Seeded standard normals (xorshift64* and Box-Muller in f64; only reproducibility matters). */
function normals(n: number, seed: bigint): Float32Array {
  let s = seed * 0x9E3779B97F4A7C15n & 0xFFFFFFFFFFFFFFFFn | 1n;
  const next = () => {
    s ^= s >> 12n; s ^= (s << 25n) & 0xFFFFFFFFFFFFFFFFn; s ^= s >> 27n;
    return Number(((s * 0x2545F4914F6CDD1Dn) & 0xFFFFFFFFFFFFFFFFn) >> 11n) / 2 ** 53;
  };
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    out[i] = Math.sqrt(-2 * Math.log(1 - next())) * Math.cos(2 * Math.PI * next());
  }
  return out;
}

function wideQwen3(): string {
  const folder = join(work, "qwen3-wide");
  mkdirSync(folder);
  const w = WIDE, q = w.heads * w.headDim, kv = w.kvHeads * w.headDim;
  const tensors: [string, number[], Float32Array][] = [];
  let seed = 1n;
  const matrix = (name: string, rows: number, cols: number) => {
    const d = normals(rows * cols, seed++).map((v) => v / Math.sqrt(cols));
    tensors.push([name, [rows, cols], d]);
  };
  const norm = (name: string, n: number) => {
    tensors.push([name, [n], normals(n, seed++).map((v) => 1 + 0.2 * v)]);
  };
  matrix("model.embed_tokens.weight", w.vocab, w.hidden);
  matrix("lm_head.weight", w.vocab, w.hidden);
  norm("model.norm.weight", w.hidden);
  for (let i = 0; i < w.layers; i++) {
    const h = `model.layers.${i}`;
    norm(`${h}.input_layernorm.weight`, w.hidden);
    norm(`${h}.post_attention_layernorm.weight`, w.hidden);
    matrix(`${h}.self_attn.q_proj.weight`, q, w.hidden);
    matrix(`${h}.self_attn.k_proj.weight`, kv, w.hidden);
    matrix(`${h}.self_attn.v_proj.weight`, kv, w.hidden);
    matrix(`${h}.self_attn.o_proj.weight`, w.hidden, q);
    norm(`${h}.self_attn.q_norm.weight`, w.headDim);
    norm(`${h}.self_attn.k_norm.weight`, w.headDim);
    matrix(`${h}.mlp.gate_proj.weight`, w.ffn, w.hidden);
    matrix(`${h}.mlp.up_proj.weight`, w.ffn, w.hidden);
    matrix(`${h}.mlp.down_proj.weight`, w.hidden, w.ffn);
  }
  writeSafetensors(join(folder, "model.safetensors"), tensors.map(([name, shape, data]) =>
    ({ name, dtype: "F32", shape, bytes: new Uint8Array(data.buffer, data.byteOffset, data.byteLength) })));
  writeFileSync(join(folder, "config.json"), JSON.stringify({
    architectures: ["Qwen3ForCausalLM"], vocab_size: w.vocab, hidden_size: w.hidden,
    intermediate_size: w.ffn, num_hidden_layers: w.layers, num_attention_heads: w.heads,
    num_key_value_heads: w.kvHeads, head_dim: w.headDim, max_position_embeddings: 256,
    rms_norm_eps: 1e-6, rope_theta: 1e6, tie_word_embeddings: false,
  }));
  for (const f of ["tokenizer.json", "tokenizer_config.json"]) {
    cpSync(join(import.meta.dir, "fixtures", "hf-tiny", "qwen3", f), join(folder, f));
  }
  return folder;
}

function logits(path: string, tokens: number[]): Float32Array[] {
  const e = Engine.open({ modelPath: path, contextLength: 64, batch: 32, kvType: "f32",
    threads: 2 });
  try {
    const vocab = e.model.info.vocabSize, rows: Float32Array[] = [];
    e.model.forward(tokens, tokens.length, 0, e.cache.layers, {
      onLogits: (_first, n, l) => {
        for (let r = 0; r < n; r++) rows.push(l.slice(r * vocab, (r + 1) * vocab));
      },
    });
    return rows;
  } finally {
    e.close();
  }
}

describe("K-quants end to end on 256-wide rows", () => {
  const folder = wideQwen3();
  const tokens = [5, 17, 300, 42, 99, 256, 7, 128, 64, 3, 211, 150];
  const path = (quant: string) => join(work, `wide-${quant}.gguf`);
  importHuggingFace({ folder, output: path("F32"), quant: "F32" });
  const reference = logits(path("F32"), tokens);
  const bars: [QuantName, number][] = [["Q6_K", 2e-1], ["Q5_K", 3.5e-1], ["Q4_K", 8e-1],
    ["Q4_K_M", 6e-1]];
  const relative = (rows: Float32Array[], ref: Float32Array[]) => Math.max(...rows.map((row, i) => {
    let diff = 0, scale = 0;
    row.forEach((v, j) => {
      diff = Math.max(diff, Math.abs(v - ref[i][j]));
      scale = Math.max(scale, Math.abs(ref[i][j]));
    });
    return diff / scale;
  }));
  for (const [quant, bar] of bars) {
    test(`${quant}: equal to its dequantized weights within 8e-2, to F32 within ${bar}`, () => {
      importHuggingFace({ folder, output: path(quant), quant });
      requantizeGguf({ input: path(quant), output: path(`${quant}-as-f32`), quant: "F32" });
      const rows = logits(path(quant), tokens);
      expect(relative(rows, logits(path(`${quant}-as-f32`), tokens))).toBeLessThan(8e-2);
      expect(relative(rows, reference)).toBeLessThan(bar);
    });
  }

  test("Q4_K_M: llama-quantize's types per tensor; quantize from F32 gives the same bytes", () => {
    const out = join(work, "wide-requant.gguf");
    requantizeGguf({ input: path("F32"), output: out, quant: "Q4_K_M" });
    const a = openGguf(path("Q4_K_M")), b = openGguf(out);
    try {
      expect(a.metadata.get("general.file_type")).toBe(15);
      expect(a.tensors.get("output.weight")?.type.name).toBe("Q6_K");
      expect(a.tensors.get("token_embd.weight")?.type.name).toBe("Q4_K");
      // use_more_bits(i, 8): the first and last eighth, and every third layer between.
      for (let i = 0; i < WIDE.layers; i++) {
        const more = [0, 3, 6, 7].includes(i) ? "Q6_K" : "Q4_K";
        expect(a.tensors.get(`blk.${i}.attn_v.weight`)?.type.name).toBe(more);
        expect(a.tensors.get(`blk.${i}.ffn_down.weight`)?.type.name).toBe(more);
        expect(a.tensors.get(`blk.${i}.attn_q.weight`)?.type.name).toBe("Q4_K");
      }
      for (const t of a.tensors.values()) {
        expect(Buffer.compare(a.tensorBytes(t), b.tensorBytes(b.tensors.get(t.name)!))).toBe(0);
      }
    } finally {
      a.close();
      b.close();
    }
  });
});

test("Q4_K_M stores a fused attn_qkv (Phi-3) in Q5_K in every layer, as llama-quantize", () => {
  const model = { layers: 32, is70b: false };
  for (const layer of [0, 5, 31]) {
    expect(storageType(`blk.${layer}.attn_qkv.weight`, [3072, 9216], "Q4_K_M", { model }))
      .toBe(GgmlType.Q5_K);
    expect(storageType(`blk.${layer}.attn_qkv.weight`, [3072, 9216], "Q4_K_S", { model }))
      .toBe(GgmlType.Q4_K);
  }
});
