// Method: embeddings on a tiny random Gemma 3, checked against a reference computed here from
// one forward pass over the whole input (every row's final-normed hidden state, pooled in the
// test): through the batch scheduler (chunked over several steps, beside generating sequences,
// which must keep their tokens), the library (model.embed) and the server's /v1/embeddings
// driven by the real `openai` client (floats and base64, strings and token ids, the 400s).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { InferError, loadModel, type Model } from "../ts/api/index.ts";
import { Engine } from "../ts/engine/engine.ts";
import { BatchScheduler } from "../ts/engine/scheduler.ts";
import { gguf } from "../ts/gguf/writer.ts";
import { openGguf } from "../ts/gguf/reader.ts";
import { Hparams } from "../ts/model/hparams.ts";
import { declaredPooling, type Pooling } from "../ts/model/pooling.ts";
import { startServer, type InferServer } from "../ts/serve/server.ts";
import { referenceGenerate } from "./support/reference-generate.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";
import { toyPrompt } from "./support/tiny-scheduler.ts";

const infer = join(import.meta.dir, "..", "infer.ts");

const WIDTH = 64;
let dir: string, modelPath: string, reference: Engine;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "infer-embed-"));
  modelPath = join(dir, "tiny.gguf");
  writeFileSync(modelPath, tinyGemma3Gguf({ shape: { layers: 3, embedding: WIDTH,
    feedForward: 128, heads: 4, kvHeads: 2, headDim: 32 }, branchGain: 16 }));
  reference = Engine.open({ modelPath, contextLength: 512, batch: 512, threads: 2,
    backend: "cpu" });
});

afterAll(() => {
  reference?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** The obvious embedding: one forward pass over all of `tokens`, every row's hidden state. */
function expected(tokens: readonly number[], pooling: Pooling, normalize = true): Float32Array {
  const rows: Float32Array[] = [];
  reference.reset();
  reference.model.forwardBatch({
    tokens, segments: [{ rows: tokens.length, position: 0, cache: reference.cache.layers }],
    logitRows: 0,
    hidden: { ranges: [{ first: 0, rows: tokens.length }], sink: (_first, n, values) => {
      for (let r = 0; r < n; r++) rows.push(values.slice(r * WIDTH, (r + 1) * WIDTH));
    } },
  }, () => {});
  const out = new Float32Array(WIDTH);
  if (pooling === "cls") out.set(rows[0]);
  else if (pooling === "last") out.set(rows.at(-1)!);
  else for (const row of rows) for (let i = 0; i < WIDTH; i++) out[i] += row[i] / rows.length;
  if (!normalize) return out;
  const norm = Math.hypot(...out);
  return out.map((v) => v / norm);
}

const cosineDistance = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let ab = 0, aa = 0, bb = 0;
  for (let i = 0; i < a.length; i++) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return 1 - ab / Math.sqrt(aa * bb);
};

const closeTo = (got: ArrayLike<number>, want: ArrayLike<number>) => {
  expect(got.length).toBe(want.length);
  for (let i = 0; i < want.length; i++) expect(Math.abs(got[i] - want[i])).toBeLessThan(1e-5);
};

describe("pooling from the GGUF", () => {
  const poolingOf = (value?: number) => {
    const path = join(dir, `pooling-${value}.gguf`);
    writeFileSync(path, tinyGemma3Gguf(value === undefined ? {}
      : { setMetadata: [["gemma3.pooling_type", gguf.u32(value)]] }));
    const file = openGguf(path);
    try {
      return declaredPooling(new Hparams(file.metadata, "gemma3"));
    } finally {
      file.close();
    }
  };

  test("absent or none is mean; mean, cls and last as declared; rank none; others refused", () => {
    expect(poolingOf()).toBe("mean");
    expect([0, 1, 2, 3, 4].map(poolingOf)).toEqual(["mean", "mean", "cls", "last", null]);
    expect(() => poolingOf(9)).toThrow(/pooling_type' is 9/);
  });

  test("a reranker loads, and embeds only with a pooling asked for", async () => {
    const path = join(dir, "rank.gguf");
    writeFileSync(path, tinyGemma3Gguf({ setMetadata: [["gemma3.pooling_type", gguf.u32(4)]] }));
    const m = await loadModel(path, { threads: 2, contextLength: 64 });
    try {
      expect(m.info.pooling).toBeNull();
      const err = await m.embed("the cat").then(() => null, (e) => e);
      expect(err).toMatchObject({ code: "unsupported" });
      expect(err.message).toMatch(/reranker/);
      expect(await m.embed("the cat", { pooling: "cls" })).toHaveLength(64);
      expect((await m.complete("the cat", { maxTokens: 2 })).tokens).toHaveLength(2);
    } finally {
      await m.close();
    }
  });
});

describe("embeddings through the batch scheduler", () => {
  test("long inputs in chunks beside generations equal one pass alone; generations unchanged",
    () => {
      const engine = Engine.open({ modelPath, contextLength: 512, batch: 16, threads: 2,
        backend: "cpu" });
      try {
        const scheduler = new BatchScheduler(engine, { slots: 3, prefillChunk: 8 });
        const gen = { maxTokens: 24, ignoreEos: true,
          sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 } };
        const genPrompt = toyPrompt(20, 7);
        const generated: number[][] = [];
        const vectors = new Map<string, Float32Array>();
        const inputs: [string, number[], Pooling][] = [
          ["long mean", toyPrompt(70, 1), "mean"], ["short cls", toyPrompt(5, 2), "cls"],
          ["last", toyPrompt(40, 3), "last"], ["one token", [2], "mean"],
        ];
        scheduler.submit({ prompt: genPrompt, options: gen, onDone: (r) => generated.push(r.tokens),
          onError: (e) => { throw e; } });
        for (const [name, prompt, pooling] of inputs) {
          scheduler.submitEmbedding({ prompt, pooling, normalize: true,
            onDone: (v) => vectors.set(name, v), onError: (e) => { throw e; } });
        }
        while (scheduler.busy) scheduler.step();
        for (const [name, prompt, pooling] of inputs) {
          closeTo(vectors.get(name)!, expected(prompt, pooling));
        }
        expect(generated).toEqual([referenceGenerate(reference, genPrompt, gen).tokens]);
        expect(scheduler.stats().busySlots).toBe(0);
      } finally {
        engine.close();
      }
    });

  test("an input past the context is refused; an empty one too", () => {
    const engine = Engine.open({ modelPath, contextLength: 32, threads: 2, backend: "cpu" });
    try {
      const scheduler = new BatchScheduler(engine, { slots: 1 });
      const request = (prompt: number[]) => ({ prompt, pooling: "mean" as const, normalize: true,
        onDone: () => {}, onError: () => {} });
      expect(() => scheduler.submitEmbedding(request(toyPrompt(33, 1))))
        .toThrow(/33 tokens to embed do not fit the context of 32/);
      expect(() => scheduler.submitEmbedding(request([]))).toThrow(/nothing to embed/);
      scheduler.submitEmbedding(request(toyPrompt(32, 1))); // the whole context is fine
    } finally {
      engine.close();
    }
  });
});

describe("model.embed", () => {
  let model: Model;
  beforeAll(async () => {
    model = await loadModel(modelPath, { threads: 2, contextLength: 64 });
  });
  afterAll(() => model?.close());
  const tokens = (text: string) => model.tokenize(text, { addSpecial: true });

  test("a text, texts, the pooling and normalize options", async () => {
    expect(model.info.embeddingLength).toBe(WIDTH);
    expect(model.info.pooling).toBe("mean");
    const one = await model.embed("the cat sat");
    closeTo(one, expected(tokens("the cat sat"), "mean"));
    const [a, b] = await model.embed(["the cat sat", "a dog ran"]);
    closeTo(a, one);
    closeTo(b, expected(tokens("a dog ran"), "mean"));
    expect(cosineDistance(a, b)).toBeGreaterThan(1e-3);
    closeTo(await model.embed("a dog ran", { pooling: "last" }),
      expected(tokens("a dog ran"), "last"));
    closeTo(await model.embed("a dog", { normalize: false }),
      expected(tokens("a dog"), "mean", false));
    expect(await model.embed([])).toEqual([]);
  });

  test("bad calls reject with an InferError", async () => {
    const err = (p: Promise<unknown>) => p.then(() => null, (e) => e);
    const badPooling = await err(model.embed("x", { pooling: "max" as Pooling }));
    expect(badPooling).toBeInstanceOf(InferError);
    expect(badPooling.message).toMatch(/pooling: expected one of mean, cls, last/);
    const long = await err(model.embed("the cat ".repeat(100)));
    expect(long).toMatchObject({ code: "context_overflow" });
    expect((await err(model.embed([3 as unknown as string]))).code).toBe("invalid_argument");
    const signal = AbortSignal.abort(new Error("stop"));
    expect((await err(model.embed("x", { signal }))).message).toBe("stop");
  });
});

describe("POST /v1/embeddings", () => {
  let server: InferServer, client: OpenAI;
  beforeAll(async () => {
    server = await startServer({ modelPath, host: "127.0.0.1", port: 0, contextLength: 64,
      threads: 2, backend: "cpu", parallel: 2 });
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "x", maxRetries: 0,
      timeout: 20_000 });
  });
  afterAll(() => server?.stop());
  const encode = (text: string) => reference.tokenizer.encode(text,
    { addSpecial: true, parseSpecial: true });

  test("strings and token ids, as floats and as base64 (the client's default)", async () => {
    const r = await client.embeddings.create({ model: "tiny", input: ["the cat", "a dog ran"],
      encoding_format: "float" });
    expect(r.object).toBe("list");
    expect(r.model).toBe("tiny");
    expect(r.data.map((d) => [d.object, d.index])).toEqual([["embedding", 0], ["embedding", 1]]);
    closeTo(r.data[0].embedding, expected(encode("the cat"), "mean"));
    closeTo(r.data[1].embedding, expected(encode("a dog ran"), "mean"));
    const n = encode("the cat").length + encode("a dog ran").length;
    expect(r.usage).toEqual({ prompt_tokens: n, total_tokens: n });
    // The client asks for base64 and decodes it back into numbers.
    const b64 = await client.embeddings.create({ model: "tiny", input: "the cat" });
    expect(b64.data[0].embedding).toEqual(r.data[0].embedding);
    const ids = await client.embeddings.create({ model: "tiny", input: encode("the cat"),
      encoding_format: "float" });
    expect(ids.data[0].embedding).toEqual(r.data[0].embedding);
    const many = await client.embeddings.create({ model: "tiny",
      input: [encode("a dog ran"), encode("the cat")], encoding_format: "float",
      dimensions: WIDTH });
    expect(many.data.map((d) => d.embedding)).toEqual([r.data[1].embedding, r.data[0].embedding]);
  });

  test("bad requests are OpenAI-style 400s (404 for another model)", async () => {
    const post = async (body: unknown) => {
      const res = await fetch(`${server.url}/v1/embeddings`, { method: "POST",
        headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
      const json = await res.json() as { error: { message: string; param: string; code: string } };
      return { status: res.status, ...json.error };
    };
    const m = { model: "tiny" };
    expect(await post({ ...m, input: "" })).toMatchObject({ status: 400, param: "input",
      message: "'input' is empty" });
    expect(await post({ ...m, input: [] })).toMatchObject({ status: 400, param: "input" });
    expect(await post({ ...m, input: ["a", ""] })).toMatchObject({ status: 400,
      message: "'input[1]' is empty" });
    expect(await post({ ...m })).toMatchObject({ status: 400, code: "missing_required_parameter" });
    expect(await post({ ...m, input: [1, "a"] })).toMatchObject({ status: 400, param: "input" });
    expect(await post({ ...m, input: Array(2049).fill("a") })).toMatchObject({ status: 400,
      message: "'input' has 2049 items; at most 2048 per request" });
    expect(await post({ ...m, input: "the cat ".repeat(100) })).toMatchObject({ status: 400,
      param: "input", code: "context_length_exceeded" });
    expect(await post({ ...m, input: [[1, 2], [999999]] })).toMatchObject({ status: 400,
      param: "input", message: expect.stringMatching(/^input 1: token 999999 is not in/) });
    expect(await post({ ...m, input: "a", dimensions: 8 })).toMatchObject({ status: 400,
      param: "dimensions", code: "unsupported_value" });
    expect(await post({ ...m, input: "a", encoding_format: "int8" })).toMatchObject({
      status: 400, param: "encoding_format" });
    expect(await post({ ...m, input: "a", pooling: "cls" })).toMatchObject({ status: 400,
      param: "pooling", code: "unsupported_parameter" });
    expect(await post({ model: "other", input: "a" })).toMatchObject({ status: 404,
      code: "model_not_found" });
    // and the server still answers
    const ok = await client.embeddings.create({ model: "tiny", input: "ok" });
    expect(ok.data[0].embedding).toHaveLength(WIDTH);
  });

  test("a client that goes away frees the engine for the next request", async () => {
    const abort = new AbortController();
    const gone = fetch(`${server.url}/v1/embeddings`, { method: "POST", signal: abort.signal,
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny",
        input: Array(400).fill("the cat sat on the mat ".repeat(6)) }) })
      .then(() => "answered", () => "aborted");
    await Bun.sleep(20);
    abort.abort();
    expect(["answered", "aborted"]).toContain(await gone);
    const r = await client.embeddings.create({ model: "tiny", input: "the cat" });
    expect(r.data[0].embedding).toHaveLength(WIDTH);
    for (;;) { // the cancelled sequences leave their slots at the engine's next steps
      const health = await (await fetch(`${server.url}/health`)).json() as { slots_busy: number };
      if (health.slots_busy === 0) break;
      await Bun.sleep(10);
    }
  });

  test("embeddings and a completion in flight together", async () => {
    const gen = client.completions.create({ model: "tiny", prompt: "the cat", max_tokens: 16,
      temperature: 0 });
    const inputs = Array.from({ length: 6 }, (_, i) => `the cat ${"sat ".repeat(i)}`);
    const r = await client.embeddings.create({ model: "tiny", input: inputs,
      encoding_format: "float" });
    for (const [i, d] of r.data.entries()) {
      closeTo(d.embedding, expected(encode(inputs[i]), "mean"));
    }
    expect((await gen).choices[0].text.length).toBeGreaterThan(0);
  });
});

describe("infer embed", () => {
  const run = (args: string[], stdin?: string) => {
    const p = Bun.spawnSync(["bun", infer, "embed", "-m", modelPath, "-t", "2", "-c", "64",
      ...args], { stdin: stdin === undefined ? "ignore" : Buffer.from(stdin) });
    return { code: p.exitCode, out: p.stdout.toString(), err: p.stderr.toString() };
  };
  const encode = (text: string) => reference.tokenizer.encode(text,
    { addSpecial: true, parseSpecial: true });

  test("a JSON array of vectors: one text, or one per line", () => {
    const one = run(["the cat", "--pooling", "cls"]);
    expect(one.code).toBe(0);
    const [v] = JSON.parse(one.out) as number[][];
    closeTo(v, expected(encode("the cat"), "cls"));
    const lines = run(["--lines", "-f", "-"], "the cat\n\na dog ran\n");
    expect(lines.code).toBe(0);
    const vs = JSON.parse(lines.out) as number[][];
    expect(vs).toHaveLength(2);
    closeTo(vs[1], expected(encode("a dog ran"), "mean"));
    const raw = JSON.parse(run(["a dog", "--no-normalize"]).out) as number[][];
    closeTo(raw[0], expected(encode("a dog"), "mean", false));
  });

  test("bad input is one line and a non-zero exit", () => {
    const cases: [string[], number, RegExp][] = [
      [[""], 1, /^infer embed: nothing to embed: the text is empty\n$/],
      [["x", "--pooling", "max"], 2, /^infer embed: --pooling: expected one of mean, cls, last/],
      [["the cat ".repeat(100)], 1,
        /does not fit the context of 64 tokens \(raise --ctx-size\)\n$/],
      [["-f", join(dir, "missing.txt")], 1, /^infer embed: -f ".*missing.txt": /],
    ];
    for (const [args, code, message] of cases) {
      const r = run(args);
      expect([r.code, r.out]).toEqual([code, ""]);
      expect(r.err).toMatch(message);
      expect(r.err.trim().split("\n")).toHaveLength(1);
    }
  });
});
