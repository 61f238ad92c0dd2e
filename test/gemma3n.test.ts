// Method: Gemma 3n's text graph against transformers on the tiny random Gemma3nForCausalLM of
// test/fixtures/hf-tiny/gemma3n (gen-hf-reference.py), imported as F32. hf-reference.test.ts
// holds the runtime as it is (its GELU reads ggml's f16 table, as llama.cpp's does) to Gemma 3's
// bars; here the same graph runs with transformers' GELU swapped in, so that what is left is
// summation order, and the logits are held to the 1e-5 relative at every position. Also:
// prefill equals token-by-token decoding (the shared keys and values of the last layers come from
// the cache), the import's metadata, and one-line refusals.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Activation, Backend } from "../ts/backend/backend.ts";
import { CpuBackend } from "../ts/backend/cpu.ts";
import { importHuggingFace } from "../ts/convert/import.ts";
import { normalQuantile } from "../ts/convert/gemma3n.ts";
import { createKvCache } from "../ts/engine/kv-cache.ts";
import { openGguf, type GgufFile } from "../ts/gguf/reader.ts";
import type { Model } from "../ts/model/model.ts";
import { planModel } from "../ts/model/registry.ts";
import { hfTinyFolder } from "./hf-tiny.ts";

const reference = JSON.parse(readFileSync(join(import.meta.dir, "fixtures", "hf-reference.json"),
  "utf8")).gemma3n as {
    all_positions: { tokens: number[]; logits: number[][] };
    last_position: { tokens: number[]; logits: number[] };
  };
const dir = mkdtempSync(join(tmpdir(), "infer-gemma3n-"));
const path = join(dir, "gemma3n-f32.gguf");
let file: GgufFile;

beforeAll(() => {
  importHuggingFace({ folder: hfTinyFolder("gemma3n"), output: path, quant: "F32" });
  file = openGguf(path);
});

afterAll(() => {
  file.close();
  rmSync(dir, { recursive: true, force: true });
});

/** transformers' gelu_pytorch_tanh, for the graph check (the CPU kernel reads ggml's f16 table). */
function withExactGelu(be: CpuBackend): Backend {
  const geluMul = (gate: Activation, up: Activation, rows: number, out: Activation) => {
    const g = be.read(gate, rows), u = be.read(up, rows), o = be.read(out, rows);
    for (let i = 0; i < g.length; i++) {
      const x = g[i];
      o[i] = 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x * x * x))) * u[i];
    }
  };
  return new Proxy(be, {
    get(target, key) {
      if (key === "geluMul") return geluMul;
      const value = Reflect.get(target, key);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

function relativeError(ours: ArrayLike<number>, ref: number[]): number {
  let diff = 0, scale = 0;
  for (let i = 0; i < ref.length; i++) {
    diff = Math.max(diff, Math.abs(ours[i] - ref[i]));
    scale = Math.max(scale, Math.abs(ref[i]));
  }
  return diff / scale;
}

function withModel<T>(be: Backend, fn: (m: Model, run: (tokens: number[], position: number,
  all: boolean) => Float32Array[]) => T): T {
  const model = planModel(file).build(be, 32, 64);
  const cache = createKvCache(be, model.info, 64, "f32", 32);
  const vocab = model.info.vocabSize;
  return fn(model, (tokens, position, all) => {
    const rows: Float32Array[] = [];
    const last = model.forward(tokens, tokens.length, position, cache.layers, all ? {
      onLogits: (_first, n, logits) => {
        for (let r = 0; r < n; r++) rows.push(logits.slice(r * vocab, (r + 1) * vocab));
      },
    } : {});
    return all ? rows : [last.slice()];
  });
}

describe("gemma3n: the graph equals transformers'", () => {
  test("F32 with transformers' GELU: logits within 1e-5 relative at every position", () => {
    const be = new CpuBackend();
    be.setThreads(2);
    withModel(withExactGelu(be), (_m, run) => {
      const rows = run(reference.all_positions.tokens, 0, true);
      expect(rows).toHaveLength(reference.all_positions.tokens.length);
      const errors = rows.map((row, i) => relativeError(row, reference.all_positions.logits[i]));
      expect(Math.max(...errors)).toBeLessThan(1e-5);
    });
    withModel(withExactGelu(be), (_m, run) => {
      const [last] = run(reference.last_position.tokens, 0, false);
      expect(relativeError(last, reference.last_position.logits)).toBeLessThan(1e-5);
    });
    be.dispose();
  });

  test("prefill equals decoding one token at a time (shared keys and values read from the cache)", () => {
    const be = new CpuBackend();
    be.setThreads(2);
    const tokens = reference.last_position.tokens;
    const prefill = withModel(be, (_m, run) => run(tokens, 0, true));
    const stepped = withModel(be, (_m, run) => tokens.map((t, p) => run([t], p, false)[0]));
    stepped.forEach((row, p) => expect(relativeError(row, [...prefill[p]])).toBeLessThan(1e-6));
    be.dispose();
  });
});

describe("gemma3n: import and refusals", () => {
  test("metadata and tensors as llama.cpp's converter writes them", () => {
    const m = (k: string) => file.metadata.get(k);
    expect(m("general.architecture")).toBe("gemma3n");
    expect(m("gemma3n.altup.num_inputs")).toBe(4);
    expect(m("gemma3n.altup.active_idx")).toBe(0);
    expect(m("gemma3n.embedding_length_per_layer_input")).toBe(16);
    expect(m("gemma3n.attention.shared_kv_layers")).toBe(2);
    expect(m("gemma3n.final_logit_softcapping")).toBe(30);
    expect(m("gemma3n.attention.sliding_window_pattern")).toEqual(
      [true, true, true, true, false, true, false]);
    const scales = [...(m("gemma3n.activation_sparsity_scale") as Float32Array)];
    expect(scales).toEqual([...Array(3).fill(1.6448533535003662), ...Array(4).fill(-Infinity)]);
    expect(file.tensors.get("altup_proj.weight")?.dims).toEqual([64, 64, 3]);
    expect(file.tensors.get("per_layer_token_embd.weight")?.dims).toEqual([7 * 16, 456]);
    expect(file.tensors.get("blk.0.laurel_l.weight")?.dims).toEqual([64, 8]);
    expect(file.tensors.get("blk.0.altup_predict_coef.weight")?.dims).toEqual([4, 16]);
    // transformers 5 saves no keys or values for the sharing layers; nothing reads them.
    expect(file.tensors.has("blk.4.attn_k.weight")).toBe(true);
    expect(file.tensors.has("blk.5.attn_k.weight")).toBe(false);
    const model = planModel(file);
    expect(model.shape.kvShapes.map((s) => s.window)).toEqual([4, 4, 4, 4, 0]);
  });

  test("the normal quantile matches transformers' f32 icdf", () => {
    expect(normalQuantile(0.95)).toBe(1.6448533535003662);
    expect(normalQuantile(0)).toBe(-Infinity);
    expect(Math.abs(normalQuantile(0.5))).toBeLessThan(1e-9);
    expect(normalQuantile(0.99)).toBeCloseTo(2.3263478740408408, 6);
    expect(normalQuantile(0.01)).toBeCloseTo(-2.3263478740408408, 6);
  });

  test("a backend without AltUp refuses the model in one line", () => {
    const gpuLike = { name: "cuda" } as Backend; // refused before any of its methods is called
    expect(() => planModel(file).build(gpuLike, 1, 64)).toThrow(
      /^the cuda backend does not run gemma3n \(AltUp, per-layer embeddings\) yet; use --backend cpu$/);
  });
});
