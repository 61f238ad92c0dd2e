// Method: the library's calls against a tiny random Gemma 3 (fast, and every path) and, where
// it is installed, the default model. Each generation is compared with the same generation
// alone: several calls in flight share forward passes, and must not change one token. The
// event loop must stay free while a model loads and generates: a timer keeps ticking.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { InferError, loadModel, type Model } from "../ts/api/index.ts";
import { defaultModelPath } from "../ts/models/cache.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const dir = mkdtempSync(join(tmpdir(), "infer-api-"));
const tiny = join(dir, "tiny.gguf");
writeFileSync(tiny, tinyGemma3Gguf());
const greedy = { temperature: 0, ignoreEos: true } as const;
/** What a promise rejects with (null if it resolves). Not expect().rejects: Bun's waits without
 * running the event loop, so a Worker's answer never arrives. */
const rejection = (p: Promise<unknown>) => p.then(() => null, (e) => e);

/** A JSON schema `depth` objects deep. */
function nested(depth: number): Record<string, unknown> {
  let schema: Record<string, unknown> = { type: "string" };
  for (let i = 0; i < depth; i++) schema = { type: "object", properties: { a: schema } };
  return schema;
}

describe("the library on a tiny random Gemma 3", () => {
  const opened: Model[] = [];
  const open = async (options = {}) => {
    const m = await loadModel(tiny, { threads: 2, contextLength: 256, ...options });
    opened.push(m);
    return m;
  };
  afterAll(async () => { for (const m of opened) await m.close(); });

  test("complete, stream and their result agree; info describes the model", async () => {
    const model = await open();
    expect(model.info).toMatchObject({ architecture: "gemma3", layers: 2, backend: "cpu",
      contextLength: 256, parallel: 4, path: tiny });
    expect(model.info.parameters).toBeGreaterThan(0);
    const r = await model.complete("the cat", { ...greedy, maxTokens: 12 });
    expect(r.tokens).toHaveLength(12);
    expect(r.finishReason).toBe("length");
    expect(r.usage).toEqual({ promptTokens: model.tokenize("the cat", { addSpecial: true }).length,
      completionTokens: 12, totalTokens: r.usage.promptTokens + 12 });
    const stream = model.stream("the cat", { ...greedy, maxTokens: 12 });
    let text = "";
    for await (const piece of stream) text += piece.text;
    expect(text).toBe(r.text);
    expect((await stream.result).tokens).toEqual(r.tokens);
    expect(model.detokenize(r.tokens)).toBe(r.text);
  });

  test("calls in flight together each get exactly the tokens they get alone", async () => {
    const model = await open();
    const prompts = ["the cat", "a cat sat", "the the the", "sat"];
    const alone = [];
    for (const p of prompts) alone.push(await model.complete(p, { ...greedy, maxTokens: 10 }));
    const sampled = await model.complete("the cat", { temperature: 0.9, seed: 7, maxTokens: 10, ignoreEos: true });
    const together = await Promise.all([
      ...prompts.map((p) => model.complete(p, { ...greedy, maxTokens: 10 })),
      model.complete("the cat", { temperature: 0.9, seed: 7, maxTokens: 10, ignoreEos: true }),
    ]);
    expect(together.map((r) => r.tokens)).toEqual([...alone, sampled].map((r) => r.tokens));
  });

  test("the event loop stays free while a model loads and generates", async () => {
    let ticks = 0;
    const timer = setInterval(() => ticks++, 1);
    const model = await open({ parallel: 1 });
    const loadTicks = ticks;
    await model.complete("the cat", { ...greedy, maxTokens: 64 });
    clearInterval(timer);
    expect(loadTicks).toBeGreaterThan(0);
    expect(ticks).toBeGreaterThan(loadTicks);
  });

  test("an AbortSignal ends a generation within a step: rejects, or keeps the text when asked", async () => {
    const model = await open();
    const abort = new AbortController();
    let pieces = 0;
    const stream = model.stream("the cat", { ...greedy, maxTokens: 200, signal: abort.signal });
    expect(await rejection((async () => {
      for await (const _ of stream) if (++pieces === 3) abort.abort();
    })())).toMatchObject({ name: "AbortError" });
    expect(await rejection(stream.result)).toMatchObject({ name: "AbortError" });
    const kept = new AbortController();
    const p = model.stream("the cat", { ...greedy, maxTokens: 200, signal: kept.signal, stopOnAbortSignal: true });
    let n = 0;
    for await (const _ of p) if (++n === 3) kept.abort();
    const r = await p.result;
    expect(r.finishReason).toBe("abort");
    expect(r.tokens.length).toBeLessThan(200);
    const already = AbortSignal.abort();
    expect(await rejection(model.complete("the cat", { signal: already }))).toMatchObject({ name: "AbortError" });
  });

  test("leaving a stream's loop early stops the generation and keeps its text", async () => {
    const model = await open();
    const stream = model.stream("the cat", { ...greedy, maxTokens: 200 });
    for await (const _ of stream) break;
    const r = await stream.result;
    expect(r.finishReason).toBe("abort");
    expect(r.tokens.length).toBeLessThan(200);
  });

  test("structured output parses and follows the schema", async () => {
    const model = await open();
    const schema = { type: "object", properties: { a: { type: "boolean" }, b: { enum: ["x", "y"] } },
      required: ["a", "b"] };
    const r = await model.complete("the cat", { temperature: 0.8, seed: 3, maxTokens: 64, jsonSchema: schema });
    const value = JSON.parse(r.text);
    expect(typeof value.a).toBe("boolean");
    expect(["x", "y"]).toContain(value.b);
    expect(await rejection(model.complete("the cat", { maxTokens: 3, jsonSchema: schema }))).toMatchObject({ code: "invalid_argument", message: expect.stringMatching(/shortest output/) });
  });

  test("speculation gives the tokens plain decoding gives, and says what it kept", async () => {
    const model = await open({ speculation: "off" });
    const prompt = "the cat sat on the mat the cat sat on the mat the cat";
    const off = await model.complete(prompt, { ...greedy, maxTokens: 40 });
    expect(off.speculation).toBeUndefined();
    const on = await model.complete(prompt, { ...greedy, maxTokens: 40, speculation: "ngram", draftMax: 4 });
    expect(on.tokens).toEqual(off.tokens);
    expect(on.speculation!.drafted).toBeGreaterThanOrEqual(on.speculation!.accepted);
    const byDefault = await open(); // prompt lookup on the CPU
    expect((await byDefault.complete(prompt, { ...greedy, maxTokens: 40 })).speculation).toBeDefined();
  });

  test("bad options and inputs are InferErrors naming what is wrong, and the model goes on", async () => {
    const model = await open();
    const cases: [() => Promise<unknown>, string, RegExp][] = [
      [() => model.complete("x", { topK: -1 }), "invalid_argument", /topK/],
      [() => model.complete("x", { temperature: Number.NaN }), "invalid_argument", /temperature/],
      [() => model.complete("x", { maxTokens: 0 }), "invalid_argument", /maxTokens/],
      [() => model.complete("x", { logitBias: { 999999: 1 } }), "invalid_argument", /logitBias/],
      [() => model.complete("x", { jsonSchema: { type: "string", pattern: "a+" } }), "unsupported", /pattern/],
      [() => model.complete("the cat ".repeat(300)), "context_overflow", /context of 256/],
      [() => model.complete([1, 2, 1e9]), "invalid_argument", /not in the vocabulary/],
      [() => model.complete("x", { speculation: "lookahead" as never }), "invalid_argument", /^speculation: expected one of ngram, draft, off/],
      [() => model.complete("x", { speculation: "draft" }), "invalid_argument", /needs a draft model/],
      [() => model.complete("x", { draftMax: 100 }), "invalid_argument", /^draftMax: expected an integer in \[1, 64\]/],
      // nested past what structured cloning to the worker and a template's tojson may walk
      [() => model.chat().send("x", { tools: [{ name: "f", parameters: nested(20_000) }] }),
        "invalid_argument", /^tools: tool 0's parameters: JSON schema: the document nests deeper/],
    ];
    for (const [call, code, message] of cases) {
      const err = await call().then(() => null, (e) => e);
      expect(err).toBeInstanceOf(InferError);
      expect(err).toMatchObject({ code });
      expect(err.message).toMatch(message);
    }
    expect((await model.complete("the cat", { ...greedy, maxTokens: 2 })).tokens).toHaveLength(2);
  });

  test("a chat keeps its conversation; turns wait for the one before", async () => {
    const model = await open();
    const chat = model.chat({ system: "be brief" });
    const first = chat.stream("hi", { ...greedy, maxTokens: 4 });
    const second = chat.send("and then?", { ...greedy, maxTokens: 4 });
    let text = "";
    for await (const p of first) text += p.text;
    expect((await first.result).text).toBe(text);
    const reply = await second;
    expect(reply.messages.map((m) => m.role)).toEqual(["system", "user", "assistant", "user", "assistant"]);
    expect(chat.messages[2].content).toBe(text);
    chat.reset();
    expect(chat.messages).toEqual([{ role: "system", content: "be brief" }]);
  });

  test("loading errors are InferErrors with the loader's code; a closed model refuses calls", async () => {
    expect(await rejection(loadModel(join(dir, "missing.gguf")))).toMatchObject({ code: "io" });
    const notGguf = join(dir, "notes.txt");
    writeFileSync(notGguf, "hello");
    expect(await rejection(loadModel(notGguf))).toMatchObject({ code: "bad_gguf" });
    expect(await rejection(loadModel(tiny, { backend: "tpu" as never }))).toMatchObject({ code: "invalid_argument" });
    expect(await rejection(loadModel(tiny, { draftModel: 5 as never }))).toMatchObject({
      code: "invalid_argument",
      message: expect.stringMatching(/^loadModel: draftModel must be /) });
    for (const gpus of [0, 2.5, "2", 65]) {
      expect(await rejection(loadModel(tiny, { gpus: gpus as never }))).toMatchObject({
        code: "invalid_argument",
        message: expect.stringMatching(/^loadModel: gpus must be an integer from 1 to 64, got /) });
    }
    const model = await loadModel(tiny, { contextLength: 64 });
    const running = model.complete("the cat", { ...greedy, maxTokens: 60 });
    await model.close();
    const r = await running.then((c) => c.finishReason, (e) => e.code);
    expect(["abort", "length", "internal"]).toContain(r);
    expect(await rejection(model.complete("x"))).toMatchObject({ code: "invalid_argument" });
    expect(() => model.tokenize("x")).toThrow(/closed/);
  });

  test("await using closes the model", async () => {
    let closedModel: Model;
    {
      await using model = await loadModel(tiny, { contextLength: 64 });
      closedModel = model;
      expect((await model.complete("the", { ...greedy, maxTokens: 1 })).tokens).toHaveLength(1);
    }
    expect((await rejection(closedModel!.complete("x"))).message).toMatch(/closed/);
  });
});

describe.skipIf(!existsSync(defaultModelPath()))("the library on the default model", () => {
  test("greedy text is the CLI's, and the cached name loads it", async () => {
    await using model = await loadModel("gemma-3-270m-q4_k_m", { contextLength: 512 });
    expect(model.info).toMatchObject({ quantization: "Q4_K_M", architecture: "gemma3" });
    const r = await model.complete("The capital of France is", { temperature: 0, maxTokens: 8 });
    const cli = Bun.spawnSync([process.execPath, join(import.meta.dir, "..", "infer.ts"),
      "The capital of France is", "--temp", "0", "-n", "8", "-q", "-c", "512"]);
    expect(cli.stdout.toString()).toBe(r.text + "\n");
    const ids = model.tokenize("Hello world");
    expect(model.detokenize(ids)).toBe("Hello world");
  }, 60_000);
});
