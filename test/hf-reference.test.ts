// Method: import tiny random Hugging Face models (test/fixtures/hf-tiny, made by
// gen-hf-reference.py; their weights are rebuilt outside the repo by hf-tiny.ts) with our
// converter, run our forward pass on the token ids transformers was run on, and compare logits
// by relative error max|ours - ref| / max|ref| per position (worst position reported); greedy
// tokens and tokenizer ids must be equal. Bad folders must fail with an error that names the
// key, tensor or file.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { cpSync, mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { importHuggingFace, requantizeGguf } from "../ts/convert/import.ts";
import { parseQuant, type QuantName } from "../ts/convert/quantize.ts";
import { perplexity } from "../ts/cli/perplexity.ts";
import { Engine } from "../ts/engine/engine.ts";
import { BatchScheduler } from "../ts/engine/scheduler.ts";
import type { Pooling } from "../ts/model/pooling.ts";
import { openGguf } from "../ts/gguf/reader.ts";
import type { Backend } from "../ts/backend/backend.ts";
import { planModel } from "../ts/model/registry.ts";
import { defaultSampling } from "../ts/sample/sampler.ts";
import { hfTinyFolder } from "./hf-tiny.ts";

interface ArchReference {
  vocab: number;
  all_positions: { tokens: number[]; logits: number[][] };
  last_position: { tokens: number[]; logits: number[] };
  greedy: { tokens: number[]; continuation: number[] };
  tokenizer: { text: string; ids: number[] }[];
  perplexity: { text: string; n_ctx: number; chunks: number; value: number };
  /** The base model's last_hidden_state of `tokens`, mean- and last-pooled, L2-normalised. */
  embedding: { tokens: number[]; mean: number[]; last: number[] };
}

const fixtures = join(import.meta.dir, "fixtures");
const reference = JSON.parse(readFileSync(join(fixtures, "hf-reference.json"),
  "utf8")) as Record<string, ArchReference>;
const archs = ["llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "phi3", "mistral", "gptoss",
  "ministral3", "gemma3n"] as const;
const dir = mkdtempSync(join(tmpdir(), "infer-hf-"));
const root = join(import.meta.dir, "..");

// Tolerances on max|ours - ref| / max|ref| at any position, and why. These random models pass
// a relative perturbation of their weights on to the logits about 5× amplified (measured: 1e-3
// of Gaussian noise on every weight moves the logits by 4.7e-3 to 6.3e-3; Gemma 3's seven
// layers: 2.7e-3 to 7.7e-3), as ~15 matmuls in a row do; every rounding below is seen through
// that factor.
//  F32:  the same float32 arithmetic as transformers up to summation order: 1.4e-6 to 2.6e-6 is
//        seen; 1e-4 is the bar (the issue asks for 1e-3). Gemma 3: its GELU reads ggml's f16
//        table, as llama.cpp's does (the golden test demands llama.cpp's bits), which rounds each
//        GELU input and output to f16 (2^-11): 2.8e-4 to 8.8e-4 is seen. With transformers' GELU
//        swapped for the same table the difference drops to 2.6e-6 .. 1.5e-4, the larger ones
//        where an activation sits on an f16 rounding boundary (transformers' own float32 and
//        float64 runs differ by up to 8.5e-5 there). The bar is the issue's 1e-3.
//  F16:  F16 weights dotted with f32 activations (lib/quant/f16.zig says why not ggml's f16
//        ones): exact for the BF16/F16 fixtures, so llama and qwen2 match as F32 does (2.5e-6);
//        qwen3's fixture is F32, rounded to f16 on import (up to 2^-12 relative per weight,
//        through the gain of ~5): 1.3e-3 is seen (8.8e-4 with earlier weights of the same
//        spread), so qwen3 gets 2e-3; the others keep the issue's 1e-3 (Gemma 3: as its F32).
//  Q8_0: 32-value blocks with an f16 scale round each weight and activation by up to 1/254 of
//        the block's largest (~0.5% RMS for Gaussian blocks); through the gain of ~5 that is the
//        1.5e-2 to 4.0e-2 seen (weights alone: 2.0e-2 to 2.8e-2). The bar is 6e-2 (Gemma 3's
//        larger gain: 2.0e-2 to 4.7e-2 seen, bar 1e-1).
//  Q4_K: these models' rows are 64 values, short of a 256-value K-quant block, so every matrix
//        falls back to Q5_0 and the tied or untied head to Q8_0, as llama-quantize does (its
//        full-size K-quant path is tested on 256-wide rows in quantize-k.test.ts). Q5_0 rounds
//        each weight by up to 1/32 of its block's range, 8× Q8_0's step: 5.9e-2 to 2.8e-1 is
//        seen, and the bar of 4e-1 still fails a wrong layout or scale (errors of order 1).
//  qwen3moe: F32 is held to the issue's 1e-5 for new families (2.4e-6 seen); F16 (exact for its
//        BF16 fixture) 2.4e-6 and Q8_0 4.2e-2, within the others' bars.
//  gemma3n: the runtime follows llama.cpp where it differs from transformers: its GELUs (FFN
//        and per-layer gate) read the same f16 table as Gemma 3's (2.6e-4 to 5.4e-4 at F32
//        with that alone) and the gaussian top-k's deviation divides by n − 1, not n, which on
//        these 128-wide gates moves the cutoff by 0.4% of a deviation, amplified by the sparsity
//        (below): 1.3e-2 at every position of one prompt, 7.1e-2 at the last of another, and one
//        of the 16 greedy tokens changes. So the logits and greedy checks run in gemma3n.test.ts,
//        with transformers' GELU and deviation swapped in, to the issue's 1e-5 at every position
//        and 16/16; here the runtime's perplexity (7.9e-4 seen) and embeddings (3.2e-4) are held
//        to GEMMA3N_F32. Quantized imports are not compared: the gaussian top-k keeps the 5% of
//        gate values above mean + 1.645 std and passes on their distance to that cutoff, a
//        difference of near-equal numbers that amplifies weight rounding (last prompt position,
//        with transformers' deviation: F16 4.6e-3, Q8_0 0.13, Q4_K 0.58 against F32's 3.4e-4).
//  gptoss: F32 1e-5 (4.6e-6 seen; transformers' own float32 run is 1.3e-5 from its float64 one
//        on this model, whose norms near 2.5 make the clamped SwiGLU clamp). Its F32 fixture
//        rounded to f16 or quantized moves router logits past the closest top-2 margin (0.004):
//        1.1e-2 (F16), 0.29 (Q8_0), 1.2 (Q4_K) are seen, discrete expert switches no bar on
//        transformers' logits can follow, so only F32 logits are compared.
const TOLERANCE: Record<QuantName, number> = { F32: 1e-4, F16: 1e-3, Q8_0: 6e-2, Q4_K: 4e-1 } as
  Record<QuantName, number>;
const GEMMA3_TOLERANCE: Partial<Record<QuantName, number>> = { F32: 1e-3, F16: 1e-3, Q8_0: 1e-1 };
const QUANTS = ["F32", "F16", "Q8_0", "Q4_K"] as const;
/** gemma3n's F32 perplexity and embedding distance: llama.cpp's deviation (see above). */
const GEMMA3N_F32 = { perplexity: 3e-3, embeddingDistance: 2e-3 };

function tolerance(arch: string, quant: QuantName): number {
  // The issue's bar for new families.
  if ((arch === "qwen3moe" || arch === "phi3" || arch === "mistral" || arch === "gptoss" ||
    arch === "ministral3") &&
    quant === "F32") return 1e-5;
  if (arch === "qwen3" && quant === "F16") return 2e-3; // an F32 checkpoint rounded to f16
  return (arch === "gemma3" || arch === "gemma3n" ? GEMMA3_TOLERANCE[quant] : undefined) ??
    TOLERANCE[quant];
}

function modelPath(arch: string, quant: QuantName): string {
  return join(dir, `${arch}-${quant}.gguf`);
}

beforeAll(() => {
  for (const arch of archs) {
    for (const quant of QUANTS) {
      importHuggingFace({ folder: hfTinyFolder(arch), output: modelPath(arch, quant), quant });
    }
  }
});

afterAll(() => rmSync(dir, { recursive: true, force: true }));

function withEngine<T>(path: string, fn: (e: Engine) => T): T {
  const engine = Engine.open({ modelPath: path, contextLength: 64, batch: 32, kvType: "f32",
    threads: 2 });
  try {
    return fn(engine);
  } finally {
    engine.close();
  }
}

/** Logits of every position of `tokens`, starting at position 0. */
function allLogits(e: Engine, tokens: number[]): Float32Array[] {
  const rows: Float32Array[] = [];
  const vocab = e.model.info.vocabSize;
  e.model.forward(tokens, tokens.length, 0, e.cache.layers, {
    onLogits: (_first, n, logits) => {
      for (let r = 0; r < n; r++) rows.push(logits.slice(r * vocab, (r + 1) * vocab));
    },
  });
  return rows;
}

function relativeError(ours: Float32Array, ref: number[]): number {
  let diff = 0, scale = 0;
  for (let i = 0; i < ref.length; i++) {
    diff = Math.max(diff, Math.abs(ours[i] - ref[i]));
    scale = Math.max(scale, Math.abs(ref[i]));
  }
  return diff / scale;
}

const EMBEDDING_DISTANCE_MAX = 1e-6;

function cosineDistance(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let ab = 0, aa = 0, bb = 0;
  for (let i = 0; i < a.length; i++) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return 1 - ab / Math.sqrt(aa * bb);
}

function argmax(x: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

for (const arch of archs) {
  const ref = reference[arch];
  describe(`${arch}: imported from Hugging Face, equal to transformers`, () => {
    // qwen3moe at Q4_K (Q5_0 here): rounding that moves the hidden state by a few percent
    // changes which experts some token's router picks (its 2nd and 3rd logits are 0.022 apart
    // at the closest), a discrete jump no bar on transformers' logits can follow (0.77 seen
    // against 0.04 at Q8_0); the quantized MoE graph is held to llama.cpp instead
    // (moe-llama-golden.test.ts).
    for (const quant of QUANTS.filter((q) => (arch !== "qwen3moe" || q !== "Q4_K") &&
      (arch !== "gptoss" || q === "F32") && arch !== "gemma3n")) {
      test(`${quant} logits at every position and at the last of a prompt`, () => {
        withEngine(modelPath(arch, quant), (e) => {
          expect(e.model.info.vocabSize).toBe(ref.vocab);
          const rows = allLogits(e, ref.all_positions.tokens);
          expect(rows).toHaveLength(ref.all_positions.tokens.length);
          const worst = Math.max(...rows.map((row, i) => relativeError(row,
            ref.all_positions.logits[i])));
          const last = e.evaluate(ref.last_position.tokens);
          e.reset();
          const lastError = relativeError(last, ref.last_position.logits);
          expect(worst).toBeLessThan(tolerance(arch, quant));
          expect(lastError).toBeLessThan(tolerance(arch, quant));
          if (quant === "F32") {
            // Equal arithmetic means equal choices wherever transformers' top two differ.
            rows.forEach((row, i) => expect(argmax(row)).toBe(argmax(ref.all_positions.logits[i])));
          }
        });
      });
    }

    // gemma3n: run with transformers' maths in gemma3n.test.ts (see GEMMA3N_F32).
    if (arch !== "gemma3n") test("F32 greedy continuation equals transformers'", () => {
      withEngine(modelPath(arch, "F32"), (e) => {
        const r = e.generate(ref.greedy.tokens, {
          maxTokens: ref.greedy.continuation.length, ignoreEos: true,
          sampling: { ...defaultSampling, temperature: 0, seed: 1 },
        });
        expect(r.tokens).toEqual(ref.greedy.continuation);
      });
    });

    test("F32 perplexity, computed as llama-perplexity does, equals transformers'", () => {
      const p = ref.perplexity;
      const text = readFileSync(join(fixtures, p.text), "utf8");
      withEngine(modelPath(arch, "F32"), (e) => {
        const r = perplexity(e, text, { contextLength: p.n_ctx, chunks: p.chunks });
        expect(r.chunks).toBe(p.chunks);
        expect(r.scoredTokens).toBe(p.chunks * (p.n_ctx / 2 - 1));
        expect(Math.abs(r.perplexity - p.value) / p.value).toBeLessThan(
          arch === "gemma3n" ? GEMMA3N_F32.perplexity : 1e-4);
      });
    });

    // The F32 hidden state is the logits' input, so it carries the same float32 summation-order
    // differences, seen as cosine distances of ~1e-12, and for Gemma 3 its f16 GELU table's
    // rounding (see TOLERANCE): up to 1.9e-7. The bar, 1e-6, is well above both and far below
    // what a wrong norm, pooling or row would give (bench/results/correctness.md).
    test("F32 embeddings (mean and last pooling) equal transformers' last_hidden_state", () => {
      const want = ref.embedding;
      withEngine(modelPath(arch, "F32"), (e) => {
        const scheduler = new BatchScheduler(e, { slots: 2, prefixCache: null });
        const got = new Map<Pooling, Float32Array>();
        for (const pooling of ["mean", "last"] as const) {
          scheduler.submitEmbedding({ prompt: want.tokens, pooling, normalize: true,
            onDone: (v) => got.set(pooling, v), onError: (err) => { throw err; } });
        }
        while (scheduler.busy) scheduler.step();
        const bar = arch === "gemma3n" ? GEMMA3N_F32.embeddingDistance : EMBEDDING_DISTANCE_MAX;
        expect(cosineDistance(got.get("mean")!, want.mean)).toBeLessThan(bar);
        expect(cosineDistance(got.get("last")!, want.last)).toBeLessThan(bar);
      });
    });

    test("the imported tokenizer gives transformers' ids", () => {
      withEngine(modelPath(arch, "Q8_0"), (e) => {
        for (const c of ref.tokenizer) {
          expect(e.tokenizer.encode(c.text, { addSpecial: true, parseSpecial: true })).toEqual(c.ids);
        }
      });
    });
  });
}

describe("import details", () => {
  test("metadata: architecture, tokenizer, chat template, tied and untied heads, RoPE factors", () => {
    const llama = openGguf(modelPath("llama", "Q8_0"));
    const qwen2 = openGguf(modelPath("qwen2", "F32"));
    try {
      expect(llama.metadata.get("general.architecture")).toBe("llama");
      expect(llama.metadata.get("tokenizer.ggml.pre")).toBe("llama-bpe");
      expect(llama.metadata.get("tokenizer.ggml.add_bos_token")).toBe(true);
      expect(String(llama.metadata.get("tokenizer.chat_template"))).toContain(
        "<|start_header_id|>");
      expect(llama.tensors.has("output.weight")).toBe(true);
      expect(llama.tensors.get("rope_freqs.weight")?.type.name).toBe("F32");
      expect(llama.tensors.get("blk.0.attn_q.weight")?.type.name).toBe("Q8_0");
      expect(llama.tensors.get("blk.0.attn_norm.weight")?.type.name).toBe("F32");
      expect(qwen2.metadata.get("tokenizer.ggml.pre")).toBe("qwen2");
      expect(qwen2.tensors.has("output.weight")).toBe(false);
      expect(qwen2.tensors.has("blk.1.attn_k.bias")).toBe(true);
      // The embedding is padded past the tokenizer: the extra ids are unused [PAD] tokens.
      const tokens = qwen2.metadata.get("tokenizer.ggml.tokens") as string[];
      expect(tokens).toHaveLength(reference.qwen2.vocab);
      expect(tokens[tokens.length - 1]).toBe(`[PAD${tokens.length - 1}]`);
    } finally {
      llama.close();
      qwen2.close();
    }
  });

  test("Phi-3: fused tensors, partial RoPE and LongRoPE as llama.cpp's converter writes them", () => {
    const f = openGguf(modelPath("phi3", "F32")), q = openGguf(modelPath("phi3", "Q8_0"));
    try {
      const m = (k: string) => f.metadata.get(k);
      expect(m("general.architecture")).toBe("phi3");
      expect(m("phi3.rope.dimension_count")).toBe(12);
      expect(m("phi3.rope.scaling.original_context_length")).toBe(64);
      expect(m("phi3.rope.scaling.attn_factor")).toBeCloseTo(Math.sqrt(1 + Math.log(4) / Math.log(64)), 6);
      expect(m("phi3.attention.sliding_window")).toBe(0);
      expect(f.tensors.get("blk.0.attn_qkv.weight")?.dims).toEqual([64, 128]);
      expect(f.tensors.get("blk.0.ffn_up.weight")?.dims).toEqual([64, 192]);
      expect(f.tensors.has("blk.0.ffn_gate.weight")).toBe(false);
      expect(f.tensors.get("rope_factors_long.weight")?.dims).toEqual([6]);
      expect([...new Float32Array(f.tensorBytes(f.tensors.get("rope_factors_short.weight")!).slice().buffer)]
        .map((x) => Number(x.toFixed(4)))).toEqual([1, 1.02, 1.1, 1.3, 1.7, 2.5]);
      expect(q.tensors.get("rope_factors_long.weight")?.type.name).toBe("F32");
      expect(q.tensors.get("blk.1.attn_qkv.weight")?.type.name).toBe("Q8_0");
    } finally {
      f.close();
      q.close();
    }
  });

  test("Phi-3: a backend without RoPE's attention factor refuses LongRoPE in one line", () => {
    const f = openGguf(modelPath("phi3", "F32"));
    try {
      const plan = planModel(f);
      const gpuLike = { name: "cuda" } as Backend; // refused before any of its methods is called
      expect(() => plan.build(gpuLike, 1, 64)).toThrow(
        /^the cuda backend does not scale RoPE by LongRoPE's attention factor \(1\.15\d*, phi3\); use --backend cpu$/);
    } finally {
      f.close();
    }
  });

  test("Ministral 3: a backend that routes experts on the device refuses the query temperature at load", () => {
    const f = openGguf(modelPath("ministral3", "F32"));
    try {
      expect(f.metadata.get("mistral3.attention.temperature_scale")).toBeGreaterThan(0);
      // CUDA's shape: expert ops that route on the device, none of them called before the refusal.
      const deviceRouted = { name: "cuda", experts: { routedFfn: () => {} } } as unknown as Backend;
      expect(() => planModel(f).build(deviceRouted, 1, 64)).toThrow(
        /^the cuda backend does not run mistral3 \(YaRN RoPE, Llama 4's query temperature\) yet; use --backend cpu$/);
    } finally {
      f.close();
    }
  });

  test("gpt-oss: experts split from the fused gate_up_proj, biases f32, YaRN and o200k keys", () => {
    const f = openGguf(modelPath("gptoss", "F32")), q = openGguf(modelPath("gptoss", "Q8_0"));
    try {
      const m = (k: string) => f.metadata.get(k);
      expect(m("general.architecture")).toBe("gpt-oss");
      expect(m("gpt-oss.attention.sliding_window")).toBe(4);
      expect(m("gpt-oss.expert_count")).toBe(8);
      expect(m("gpt-oss.expert_used_count")).toBe(2);
      expect(m("gpt-oss.expert_feed_forward_length")).toBe(32);
      expect(m("gpt-oss.rope.scaling.type")).toBe("yarn");
      expect(m("gpt-oss.rope.scaling.factor")).toBe(32);
      expect(m("gpt-oss.rope.scaling.original_context_length")).toBe(64);
      expect(m("tokenizer.ggml.pre")).toBe("gpt-4o");
      expect(f.tensors.get("blk.0.ffn_gate_exps.weight")?.dims).toEqual([64, 32, 8]);
      expect(f.tensors.get("blk.0.ffn_down_exps.weight")?.dims).toEqual([32, 64, 8]);
      expect(f.tensors.get("blk.0.ffn_up_exps.bias")?.dims).toEqual([32, 8]);
      expect(f.tensors.get("blk.3.attn_sinks.weight")?.dims).toEqual([4]);
      for (const name of ["blk.1.ffn_gate_exps.bias", "blk.1.ffn_down_exps.bias", "blk.1.ffn_gate_inp.bias",
        "blk.1.ffn_gate_inp.weight", "blk.1.attn_sinks.weight", "blk.1.attn_q.bias"]) {
        expect(q.tensors.get(name)?.type.name).toBe("F32");
      }
      expect(q.tensors.get("blk.1.ffn_up_exps.weight")?.type.name).toBe("Q8_0");
      // A backend without expert ops (Metal's) is refused before any of its methods is called.
      const gpuLike = { name: "metal" } as Backend;
      expect(() => planModel(f).build(gpuLike, 1, 64)).toThrow(
        /^the metal backend does not run gpt-oss \(attention sinks, YaRN, the clamped SwiGLU\) yet; use --backend cpu$/);
    } finally {
      f.close();
      q.close();
    }
  });

  test("re-quantizing the F32 import to Q8_0 gives the Q8_0 import's tensors, byte for byte", () => {
    const out = join(dir, "llama-requant.gguf");
    requantizeGguf({ input: modelPath("llama", "F32"), output: out, quant: "Q8_0" });
    const a = openGguf(out), b = openGguf(modelPath("llama", "Q8_0"));
    try {
      expect(a.metadata.get("general.file_type")).toBe(b.metadata.get("general.file_type"));
      expect([...a.tensors.keys()].sort()).toEqual([...b.tensors.keys()].sort());
      for (const t of b.tensors.values()) {
        const u = a.tensors.get(t.name)!;
        expect(u.type.name).toBe(t.type.name);
        expect(Buffer.compare(a.tensorBytes(u), b.tensorBytes(t))).toBe(0);
      }
    } finally {
      a.close();
      b.close();
    }
  });

  test("Q4_K on 64-wide rows: matrices fall back to Q5_0, the tied head to Q8_0", () => {
    const f = openGguf(modelPath("qwen3", "Q4_K"));
    try {
      expect(f.metadata.get("general.file_type")).toBe(14);
      expect(f.tensors.get("token_embd.weight")?.type.name).toBe("Q8_0");
      expect(f.tensors.get("blk.1.ffn_down.weight")?.type.name).toBe("Q5_0");
      expect(f.tensors.get("blk.1.attn_norm.weight")?.type.name).toBe("F32");
    } finally {
      f.close();
    }
  });

  test("Gemma 3: SentencePiece vocabulary, hyperparameters, 1 + w norms, tied head", () => {
    const f = openGguf(modelPath("gemma3", "F32"));
    try {
      const m = (k: string) => f.metadata.get(k);
      expect(m("general.architecture")).toBe("gemma3");
      expect(m("gemma3.block_count")).toBe(7);
      expect(m("gemma3.attention.sliding_window")).toBe(4);
      expect(m("gemma3.attention.key_length")).toBe(32);
      expect(m("gemma3.rope.freq_base")).toBe(1e6);
      expect(m("gemma3.rope.scaling.type")).toBe("linear");
      expect(m("gemma3.rope.scaling.factor")).toBe(8);
      expect(m("tokenizer.ggml.model")).toBe("llama");
      expect(m("tokenizer.ggml.pre")).toBe("default");
      expect(m("tokenizer.ggml.add_space_prefix")).toBe(false);
      expect(m("tokenizer.ggml.add_bos_token")).toBe(true);
      expect(m("tokenizer.ggml.add_eos_token")).toBe(false);
      expect([m("tokenizer.ggml.bos_token_id"), m("tokenizer.ggml.eos_token_id"),
        m("tokenizer.ggml.unknown_token_id"), m("tokenizer.ggml.padding_token_id")]).toEqual(
        [2, 1, 3, 0]);
      expect(String(m("tokenizer.chat_template"))).toContain("<start_of_turn>");
      const tokens = m("tokenizer.ggml.tokens") as string[];
      const types = m("tokenizer.ggml.token_type") as unknown as number[];
      const scores = m("tokenizer.ggml.scores") as unknown as number[];
      expect(tokens).toHaveLength(reference.gemma3.vocab);
      // Control tokens from added_tokens_decoder; byte pieces; a merged piece with its SP score;
      // the rows past the tokenizer padded as llama.cpp's converter pads them.
      expect([tokens[2], types[2], scores[2]]).toEqual(["<bos>", 3, -1000]);
      expect([tokens[5], types[5]]).toEqual(["<start_of_turn>", 4]);
      expect([tokens[7], types[7], scores[7]]).toEqual(["<0x00>", 6, 0]);
      expect(types[300]).toBe(1);
      expect(scores[300]).toBeLessThan(0);
      expect([tokens[455], types[455], scores[455]]).toEqual(["[PAD455]", 5, -10000]);
      expect(f.tensors.has("output.weight")).toBe(false);
      // Gemma3RMSNorm scales by 1 + w; the GGUF stores 1 + w.
      const norm = new Float32Array(new Uint8Array(f.tensorBytes(
        f.tensors.get("output_norm.weight")!)).buffer);
      const hf = safetensorsTensor(join(hfTinyFolder("gemma3"), "model.safetensors"),
        "model.norm.weight");
      expect(Array.from(norm)).toEqual(Array.from(hf, (w) => Math.fround(w + 1)));
    } finally {
      f.close();
    }
  });
});

/** One BF16 tensor of a one-file safetensors checkpoint as f32, read by hand (u64 length, JSON,
 * data). */
function safetensorsTensor(path: string, name: string): Float32Array {
  const bytes = readFileSync(path);
  const headerLength = Number(bytes.readBigUInt64LE(0));
  const info = JSON.parse(bytes.subarray(8, 8 + headerLength).toString("utf8"))[name];
  expect(info.dtype).toBe("BF16");
  const [begin, end] = info.data_offsets as [number, number];
  const bf16 = new Uint16Array(new Uint8Array(bytes.subarray(8 + headerLength + begin,
    8 + headerLength + end)).buffer);
  return new Float32Array(Uint32Array.from(bf16, (b) => b << 16).buffer);
}

function editConfig(folder: string, edit: (c: Record<string, unknown>) => void): void {
  const path = join(folder, "config.json");
  const c = JSON.parse(readFileSync(path, "utf8"));
  edit(c);
  writeFileSync(path, JSON.stringify(c));
}

describe("Qwen 2 configs with use_sliding_window where no layer slides", () => {
  // transformers slides Qwen 2 layer i only when use_sliding_window and i >= max_window_layers,
  // and a window as long as the context never cuts anything: these configs compute what the
  // reference (no window) computed, so they import, and give its logits.
  const noLayerSlides: [string, Record<string, unknown>][] = [
    ["every layer under max_window_layers",
      { use_sliding_window: true, sliding_window: 4, max_window_layers: 2,
        layer_types: undefined }],
    ["a window as long as the context",
      { use_sliding_window: true, sliding_window: 256, max_window_layers: 0,
        layer_types: undefined }],
  ];
  for (const [what, settings] of noLayerSlides) {
    test(`${what}: imports, equal to transformers`, () => {
      const folder = join(dir, `qwen2-window-${what.replaceAll(" ", "-")}`);
      cpSync(hfTinyFolder("qwen2"), folder, { recursive: true });
      editConfig(folder, (c) => Object.assign(c, settings));
      const out = `${folder}.gguf`;
      importHuggingFace({ folder, output: out, quant: "F32" });
      withEngine(out, (e) => {
        const rows = allLogits(e, reference.qwen2.all_positions.tokens);
        const worst = Math.max(...rows.map((row, i) => relativeError(row,
          reference.qwen2.all_positions.logits[i])));
        expect(worst).toBeLessThan(tolerance("qwen2", "F32"));
      });
    });
  }
});

describe("bad Hugging Face folders fail with an error naming the problem", () => {
  function broken(name: string, edit: (folder: string) => void): string {
    const folder = join(dir, `bad-${name}`);
    const source = name.startsWith("sharded") ? "qwen3"
      : archs.find((a) => name.startsWith(`${a}-`)) ?? "llama";
    cpSync(hfTinyFolder(source), folder, { recursive: true });
    edit(folder);
    return folder;
  }
  const cases: [string, (folder: string) => void, RegExp][] = [
    ["missing-key", (f) => editConfig(f, (c) => { delete c.num_attention_heads; }),
      /'num_attention_heads' is missing/],
    ["unknown-arch", (f) => editConfig(f, (c) => { c.architectures = ["MambaForCausalLM"]; }),
      /architecture 'MambaForCausalLM' is not supported/],
    ["shape", (f) => editConfig(f, (c) => { c.intermediate_size = 100; }),
      /'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[128,64\], config\.json implies \[100,64\]/],
    ["truncated", (f) => truncateSync(join(f, "model.safetensors"), 200_000),
      /tensor '.*' ends at byte \d+ .*truncated/],
    ["sharded-missing", (f) => rmSync(join(f, "model-00002-of-00004.safetensors")),
      /shard 'model-00002-of-00004\.safetensors' \(for '.*'\) is missing/],
    ["no-tokenizer", (f) => rmSync(join(f, "tokenizer.json")), /no tokenizer\.json/],
    ["gemma3-truncated-spm", (f) => truncateSync(join(f, "tokenizer.model"), 3000),
      /tokenizer\.model: not a SentencePiece model \(field of \d+ bytes past the end at byte/],
    ["gemma3-layer-types", (f) => editConfig(f, (c) => {
      (c.layer_types as string[])[5] = "sliding_attention";
    }), /'layer_types' \[5\] is "sliding_attention"; Gemma 3 runtimes make layer i global/],
    ["gemma3-local-rope", (f) => editConfig(f, (c) => {
      const rope = c.rope_parameters as Record<string, Record<string, number>>;
      rope.sliding_attention.rope_theta = 5e4;
    }), /'rope_local_base_freq' is 50000/],
    ["gemma3-softcap", (f) => editConfig(f, (c) => { c.final_logit_softcapping = 30; }),
      /'final_logit_softcapping' is set/],
    // Settings the GGUF runtimes would not reproduce are refused by name, not imported wrongly.
    ["qwen2-sliding", (f) => editConfig(f, (c) => {
      Object.assign(c, { use_sliding_window: true, sliding_window: 4, max_window_layers: 1,
        layer_types: ["full_attention", "sliding_attention"] });
    }), new RegExp(String.raw`'use_sliding_window' is true with 'sliding_window' 4 \(under the ` +
      String.raw`context of 256\) and 'max_window_layers' 1: layer 1 would attend to the last 4`)],
    ["qwen2-sliding-no-layer-types", (f) => editConfig(f, (c) => {
      Object.assign(c, { use_sliding_window: true, sliding_window: 8, max_window_layers: 0 });
      delete c.layer_types;
    }), /'use_sliding_window' is true .* layers 0-1 would attend/],
    ["qwen3-sliding", (f) => editConfig(f, (c) => {
      Object.assign(c, { use_sliding_window: true, sliding_window: 4, max_window_layers: 1 });
      delete c.layer_types;
    }), /'use_sliding_window' is true .*'max_window_layers' 1: layer 1/],
    ["mistral-window", (f) => editConfig(f, (c) => {
      Object.assign(c, { architectures: ["MistralForCausalLM"], sliding_window: 16 });
    }), /'sliding_window' is 16, under the context of 256: every layer attends/],
    ["yarn", (f) => editConfig(f, (c) => {
      c.rope_parameters = { rope_type: "yarn", factor: 4, rope_theta: 1e4 };
    }), /RoPE scaling "yarn" \(rope_type\) is not supported for llama/],
    ["gemma3-llama3-rope", (f) => editConfig(f, (c) => {
      const rope = c.rope_parameters as Record<string, Record<string, unknown>>;
      rope.full_attention = { rope_type: "llama3", factor: 8, rope_theta: 1e6 };
    }), /RoPE scaling "llama3" \(rope_type\) is not supported for gemma3/],
    ["partial-rotary", (f) => editConfig(f, (c) => { c.partial_rotary_factor = 0.5; }),
      /'partial_rotary_factor' is "0\.5"; llama runtimes rotate the whole head/],
    ["activation", (f) => editConfig(f, (c) => { c.hidden_act = "gelu"; }),
      /'hidden_act' is "gelu"; llama runtimes compute silu/],
    ["attention-bias", (f) => editConfig(f, (c) => { c.attention_bias = true; }),
      /'attention_bias' is true/],
    ["qwen3-mlp-bias", (f) => editConfig(f, (c) => { c.mlp_bias = true; }),
      /'mlp_bias' is true; qwen3 runtimes have no feed-forward biases/],
    ["qwen3moe-no-renormalise", (f) => editConfig(f, (c) => { c.norm_topk_prob = false; }),
      /'norm_topk_prob' is false; qwen3moe runtimes renormalise/],
    ["qwen3moe-dense-layers", (f) => editConfig(f, (c) => { c.mlp_only_layers = [1]; }),
      /'mlp_only_layers' lists dense layers/],
    ["phi3-long-factor", (f) => editConfig(f, (c) => {
      (c.rope_parameters as Record<string, unknown>).long_factor = [1, 2, 3];
    }), /rope parameter 'long_factor' is not a list of 6 positive numbers/],
    ["phi3-rope-type", (f) => editConfig(f, (c) => {
      (c.rope_parameters as Record<string, unknown>).rope_type = "dynamic";
    }), /'rope_parameters\.rope_type' is "dynamic"; phi3 runtimes compute default RoPE and LongRoPE/],
    ["phi3-partial-rotary", (f) => editConfig(f, (c) => {
      (c.rope_parameters as Record<string, unknown>).partial_rotary_factor = 0.1;
    }), /'partial_rotary_factor' rotates 1 of a head's 16 values; RoPE rotates pairs/],
    ["gptoss-swiglu-limit", (f) => editConfig(f, (c) => { c.swiglu_limit = 10; }),
      /'swiglu_limit' is 10; gpt-oss runtimes fix it at 7/],
    ["gptoss-layer-types", (f) => editConfig(f, (c) => {
      (c.layer_types as string[])[1] = "sliding_attention";
    }), /'layer_types' \[1\] is "sliding_attention"; gpt-oss runtimes slide exactly the even layers/],
    ["gptoss-yarn-attention-factor", (f) => editConfig(f, (c) => {
      (c.rope_parameters as Record<string, unknown>).attention_factor = 2;
    }), /'rope_parameters\.attention_factor' is set; gpt-oss runtimes compute YaRN's attention factor/],
    ["gptoss-experts-shape", (f) => editConfig(f, (c) => { c.intermediate_size = 16; }),
      /'model\.layers\.0\.mlp\.experts\.gate_up_proj' has shape \[8,64,64\], config\.json implies \[8,64,32\]/],
    ["ministral3-mscale", (f) => editConfig(f, (c) => {
      (c.rope_parameters as Record<string, unknown>).mscale = 0.5;
    }), /'rope_parameters\.mscale' is 0\.5 beside mscale_all_dim; mistral3 runtimes compute YaRN's attention factor with mscale 1/],
    ["ministral3-truncate", (f) => editConfig(f, (c) => {
      (c.rope_parameters as Record<string, unknown>).truncate = false;
    }), /'rope_parameters\.truncate' is false; mistral3 runtimes round YaRN's correction range as ggml does/],
    ["ministral3-temperature-without-yarn", (f) => editConfig(f, (c) => {
      c.rope_parameters = { rope_type: "default", rope_theta: 1e6, llama_4_scaling_beta: 0.1 };
    }), /'rope_parameters\.llama_4_scaling_beta' without YaRN/],
    ["quantized", (f) => editConfig(f, (c) => {
      c.quantization_config = { quant_method: "gptq", bits: 4 };
    }), /'quantization_config' is set \("gptq"\): the checkpoint was quantized by another tool/],
  ];
  for (const [name, edit, pattern] of cases) {
    test(name, () => {
      const folder = broken(name, edit);
      expect(() => importHuggingFace({ folder, output: join(dir, `${name}.gguf`),
        quant: "F32" })).toThrow(pattern);
    });
  }

  test("the CLI prints one line and exits non-zero; no partial file is left", () => {
    const folder = broken("cli", (f) => editConfig(f, (c) => { c.intermediate_size = 100; }));
    const out = join(dir, "cli.gguf");
    const p = Bun.spawnSync([process.execPath, "infer.ts", "import", folder, "-o", out, "--quant", "Q8_0"],
      { cwd: root, stdout: "pipe", stderr: "pipe" });
    expect(p.exitCode).toBe(1);
    expect(p.stderr.toString().trim().split("\n")).toHaveLength(1);
    expect(p.stderr.toString()).toMatch(/config\.json implies/);
    expect(() => readFileSync(out)).toThrow();
    expect(() => readFileSync(`${out}.part`)).toThrow();
  });
});

describe("the import and quantize commands", () => {
  test("import then quantize then generate", () => {
    const f16 = join(dir, "cli-qwen2.gguf"), q4 = join(dir, "cli-qwen2-q4_0.gguf");
    const run = (...args: string[]) => Bun.spawnSync([process.execPath, "infer.ts", ...args],
      { cwd: root, stdout: "pipe", stderr: "pipe" });
    const a = run("import", hfTinyFolder("qwen2"), "-o", f16);
    expect(a.exitCode).toBe(0);
    expect(a.stderr.toString()).toMatch(/wrote .*qwen2, 26 tensors/);
    const b = run("quantize", f16, q4, "--quant", "Q4_0");
    expect(b.exitCode).toBe(0);
    // The tied LM head (token_embd) stays at 8 bits, as llama-quantize keeps it (its Q6_K needs
    // rows of 256; these are 64).
    expect(b.stderr.toString()).toMatch(/\(1 Q8_0, 11 F32, 14 Q4_0\)/);
    const c = run("Alice was", "-m", q4, "-n", "4", "--temp", "0", "--ignore-eos");
    expect(c.exitCode).toBe(0);
    expect(c.stderr.toString()).toMatch(/generated 4 tokens/);
    const d = run("perplexity", q4, join(fixtures, "alice-chapter1.txt"), "-c", "64", "--chunks", "2");
    expect(d.exitCode).toBe(0);
    expect(d.stdout.toString()).toMatch(/^Final estimate: PPL = \d+\.\d{4} \+\/- \d+\.\d{5}\n$/);
    const e = run("perplexity", q4, join(fixtures, "alice-chapter1.txt"), "-c", "4096");
    expect(e.exitCode).toBe(1);
    expect(e.stderr.toString()).toMatch(/needs at least 8192/);
  });
});
