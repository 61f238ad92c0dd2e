// Method: small random-weight GGUFs with one thing made wrong on purpose (a hyperparameter whose
// derived sizes do not divide, sizes that cannot fit in memory, NaN weights) go through the real
// loader and a generated token; each must end in one clear InferError, never a stack trace, an
// allocation failure or garbage text with exit code 0.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Engine } from "../ts/engine/engine.ts";
import type { GenerateResult } from "../ts/engine/generation.ts";
import { BatchScheduler } from "../ts/engine/scheduler.ts";
import { InferError } from "../ts/errors.ts";
import { parseGguf } from "../ts/gguf/reader.ts";
import { defaultSampling } from "../ts/sample/sampler.ts";
import { gguf, type GgufTypedValue } from "../ts/gguf/writer.ts";
import { llamaFloat, phi4MiniKQuants, randomQuantGguf, type RandomQuantSpec }
  from "./support/random-quant-gguf.ts";
import { tinyGemma3, tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const root = join(import.meta.dir, "..");
const dir = mkdtempSync(join(tmpdir(), "infer-model-files-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let files = 0;

function write(bytes: Uint8Array): string {
  const path = join(dir, `m${files++}.gguf`);
  writeFileSync(path, bytes);
  return path;
}

/** The InferError opening (and generating one token from) the model throws. */
function openError(path: string, o: { contextLength?: number } = {}): InferError {
  let engine: Engine | null = null;
  try {
    engine = Engine.open({ modelPath: path, threads: 1, backend: "cpu", ...o });
    engine.generate("the cat", { maxTokens: 1, sampling: { ...defaultSampling, temperature: 0 } });
  } catch (err) {
    if (!(err instanceof InferError)) throw err;
    return err;
  } finally {
    engine?.close();
  }
  throw new Error(`${path} opened and generated`);
}

function cli(...args: string[]) {
  const p = Bun.spawnSync([process.execPath, "infer.ts", ...args],
    { cwd: root, stdout: "pipe", stderr: "pipe" });
  return { code: p.exitCode, stdout: p.stdout.toString(), stderr: p.stderr.toString() };
}

const gemma = (setMetadata: [string, GgufTypedValue][], dropMetadata: string[] = [],
  shape = tinyGemma3) => write(tinyGemma3Gguf({ setMetadata, dropMetadata, shape }));

describe("derived sizes are whole numbers that divide as the architecture needs", () => {
  test("Gemma 3 without key_length: embedding / heads must be a whole head size", () => {
    const e = openError(gemma([["gemma3.attention.head_count", gguf.u32(5)],
      ["gemma3.attention.head_count_kv", gguf.u32(5)]],
    ["gemma3.attention.key_length", "gemma3.attention.value_length"]));
    expect(e.code).toBe("bad_model");
    expect(e.message).toContain("gemma3.attention.key_length' is missing, and " +
      "embedding_length 64 / head_count 5 is not a whole head size");
  });
  test("key/value heads divide the query heads", () => {
    const e = openError(gemma([["gemma3.attention.head_count_kv", gguf.u32(3)]]));
    expect(e.message).toContain("head_count_kv' is 3, which does not divide head_count 4");
  });
  test("an odd head size (RoPE rotates pairs), and one over the kernels' limit", () => {
    const odd = gemma([["gemma3.attention.key_length", gguf.u32(33)],
      ["gemma3.attention.value_length", gguf.u32(33)]]);
    expect(openError(odd).message).toContain("is 33: RoPE rotates pairs");
    expect(openError(gemma([["gemma3.attention.key_length", gguf.u32(2048)]])).message)
      .toContain("key_length' is 2048, outside 2..1024");
  });
  test("a value length unlike the key length, a rope dimension unlike the head size", () => {
    expect(openError(gemma([["gemma3.attention.value_length", gguf.u32(16)]])).message)
      .toContain("value_length' is 16, outside 32..32");
    expect(openError(gemma([["gemma3.rope.dimension_count", gguf.u32(16)]])).message)
      .toContain("rope.dimension_count' is 16, outside 32..32");
  });
  test("a hyperparameter of the wrong type is named with its value quoted", () => {
    const text = `two\u001b[2J${"x".repeat(500)}`;
    const e = openError(gemma([["gemma3.block_count", gguf.str(text)]]));
    expect(e.message)
      .toMatch(/block_count' is not an integer \("two\\u001b\[2Jx+…" \(507 characters\)\)$/);
  });
  test("a tokenizer with fewer tokens than token_embd has rows", () => {
    const bytes = tinyGemma3Gguf();
    const tokens = parseGguf(bytes).metadata.get("tokenizer.ggml.tokens") as string[];
    tokens.pop();
    const e = openError(gemma([["tokenizer.ggml.tokens", gguf.strs(tokens)]]));
    expect(e.message).toMatch(/the tokenizer has 274 tokens, token_embd.weight 275 rows/);
  });
});

describe("Phi-3's LongRoPE tables are checked whichever the context uses", () => {
  const phi = (edit: RandomQuantSpec["edit"]) =>
    write(randomQuantGguf({ ...phi4MiniKQuants, layers: 1, edit }));
  test("a long table of the wrong length, at a context the short table serves", () => {
    const path = phi((tensors) => {
      const t = tensors.find((x) => x.name === "rope_factors_long.weight")!;
      t.dims = [10];
      t.data = t.data.subarray(0, 40);
    });
    expect(openError(path, { contextLength: 256 })).toMatchObject({ code: "bad_model",
      message: "tensor 'rope_factors_long.weight' has shape [10], expected [48]" });
  });
  test("no long table: a context past the original is refused, one within it runs", () => {
    const path = phi((tensors) => {
      tensors.splice(tensors.findIndex((x) => x.name === "rope_factors_long.weight"), 1);
    });
    expect(openError(path, { contextLength: 8192 })).toMatchObject({ code: "bad_model",
      message: "a context of 8192 is past phi3's original 4096 and the model has no tensor " +
        "'rope_factors_long.weight'; use -c 4096 or less" });
    const engine = Engine.open({ modelPath: path, threads: 1, backend: "cpu", contextLength: 256 });
    try {
      expect(engine.generate("the cat", { maxTokens: 2,
        sampling: { ...defaultSampling, temperature: 0 } }).tokens).toHaveLength(2);
    } finally {
      engine.close();
    }
  });
});

describe("what does not fit memory is refused before it is allocated", () => {
  test("1,024 heads of 1,024 values in a 1 MB file: refused by size, nothing allocated", () => {
    const huge = gemma(["head_count", "head_count_kv", "key_length", "value_length"]
      .map((k): [string, GgufTypedValue] => [`gemma3.attention.${k}`, gguf.u32(1024)]));
    const e = openError(huge, { contextLength: 1 << 24 });
    expect(e.code).toBe("out_of_memory");
    expect(e.message).toMatch(/^a context of 16777216 needs [\d.]+ GiB /);
    expect(e.message).toMatch(/KV cache [\d.]+ GiB/);
  });
  test("-c 999999999 on the CLI: one line, the sizes and a --ctx-size that fits, exit 1", () => {
    const model = write(randomQuantGguf(llamaFloat));
    const r = cli("the cat", "-m", model, "-c", "999999999", "-n", "2");
    expect(r.code).toBe(1);
    expect(r.stdout).toBe("");
    const lines = r.stderr.trim().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(new RegExp("^infer: a context of 999999999 needs [\\d.]+ GiB " +
      "\\(weights [\\d.]+ MiB, KV cache [\\d.]+ GiB, buffers [\\d.]+ GiB\\), but the [a-z -]+ " +
      "is [\\d.]+ GiB: lower --ctx-size \\(a context of \\d+ fits\\)$"));
    const fits = Number(lines[0].match(/a context of (\d+) fits/)![1]);
    expect(fits).toBeGreaterThan(4096);
  }, 30_000);
});

/** llamaFloat with every value of `tensor` (F32) or of rows [first, first + rows) set to NaN. */
function withNaN(tensor: string, rows?: { first: number; count: number }): string {
  const bytes = randomQuantGguf(llamaFloat);
  const t = parseGguf(bytes).tensors.get(tensor)!;
  const view = new DataView(bytes.buffer, bytes.byteOffset + t.fileOffset, t.byteLength);
  const width = t.byteLength / t.elementCount, rowBytes = t.dims[0] * width;
  const from = rows ? rows.first * rowBytes : 0;
  const to = rows ? (rows.first + rows.count) * rowBytes : t.byteLength;
  for (let at = from; at < to; at += width) {
    if (width === 4) view.setUint32(at, 0x7fc00000, true);
    else view.setUint16(at, t.type.name === "BF16" ? 0x7fc0 : 0x7e00, true);
  }
  return write(bytes);
}

describe("NaN weights end generation with a clear error, not garbage", () => {
  // "the cat": BOS and six tokens of the toy vocabulary, so the first logits are position 6's.
  const nanAt6 = "the model produced NaN at position 6 (NaN in its weights, or an overflow)";
  test("all-NaN logits (a NaN norm): InferError at the position, before any token", () => {
    const path = withNaN("blk.1.ffn_norm.weight");
    const e = openError(path);
    expect(e.code).toBe("bad_model");
    expect(e.message).toBe(nanAt6);
  });
  test("partly-NaN logits (three rows of the LM head) are caught as well", () => {
    const path = withNaN("output.weight", { first: 100, count: 3 });
    expect(openError(path).message).toMatch(/^the model produced NaN at position 6/);
  });
  test("in a batch (the server), the sequence that meets NaN fails alone", () => {
    // NaN in the embedding of one token ("c", in the toy vocabulary's character pieces): only
    // the prompt holding it reaches NaN logits.
    const bytes = randomQuantGguf(llamaFloat);
    const tokens = parseGguf(bytes).metadata.get("tokenizer.ggml.tokens") as string[];
    const path = withNaN("token_embd.weight", { first: tokens.indexOf("c"), count: 1 });
    const engine = Engine.open({ modelPath: path, threads: 1, backend: "cpu" });
    try {
      const scheduler = new BatchScheduler(engine, { slots: 2, prefixCache: null });
      const results: (GenerateResult | Error)[] = [];
      for (const text of ["the cat sat", "the sat a"]) {
        scheduler.submit({ prompt: engine.tokenizer.encode(text),
          options: { maxTokens: 3, sampling: { ...defaultSampling, temperature: 0 } },
          onDone: (r) => results.push(r), onError: (e) => results.push(e) });
      }
      while (scheduler.busy) scheduler.step();
      const failed = results.filter((r) => r instanceof Error);
      expect(failed.map((e) => (e as Error).message)).toEqual([expect.stringMatching(
        /^the model produced NaN at position \d+/)]);
      const done = results.filter((r): r is GenerateResult => !(r instanceof Error));
      expect(done.map((r) => r.tokens.length)).toEqual([3]);
      expect(scheduler.stats().busySlots).toBe(0);
    } finally {
      engine.close();
    }
  });
  test("the CLI with --temp 0 prints nothing, one line, exit 1", () => {
    const r = cli("the cat", "-m", withNaN("blk.0.attn_norm.weight"), "--temp", "0", "-n", "4");
    expect(r.code).toBe(1);
    expect(r.stdout).toBe("");
    expect(r.stderr).toBe(`infer: ${nanAt6}\n`);
  }, 30_000);
  test("perplexity refuses NaN logits too, rather than scoring nan", () => {
    const text = join(dir, "text.txt");
    writeFileSync(text, "the cat sat on the mat and the dog ran after it. ".repeat(8));
    const r = cli("perplexity", withNaN("output.weight", { first: 100, count: 3 }), text,
      "-c", "16");
    expect(r.code).toBe(1);
    expect(r.stderr.trim().split("\n").at(-1)).toMatch(
      /^infer perplexity: the model produced NaN at position \d+ \(NaN in its weights/);
  }, 30_000);
});
