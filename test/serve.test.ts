// Method: the OpenAI-compatible server started in-process on 127.0.0.1 (a free port) with the
// tiny random Gemma written to a temp file, driven by the official `openai` client: chat and
// completions, streaming and not, stop strings, JSON schema, usage, errors, /health latency
// during a long generation, and cancellation freeing the worker. Random weights make the text
// meaningless, so checks compare the server with itself (greedy streaming = greedy non-streaming;
// a stop string cuts a known greedy text where it first occurs), and with an engine of the
// test's own on the same file (sampling parameters, log-probabilities from its logits).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { Engine } from "../ts/engine/engine.ts";
import { startServer, type InferServer } from "../ts/serve/server.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const KEY = "test-key";
const EOS = 1; // the toy vocabulary's <eos>: banned where a test needs a long answer
const noEos = { [EOS]: -100 };
const LONG = 2000;
let dir: string, server: InferServer, client: OpenAI, modelPath: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "infer-serve-"));
  modelPath = join(dir, "tiny.gguf");
  // wider than the default tiny shape, so that a long generation (LONG tokens) lasts seconds
  writeFileSync(modelPath, tinyGemma3Gguf({ shape: { layers: 4, embedding: 256, feedForward: 1024,
    heads: 4, kvHeads: 2, headDim: 64 } }));
  server = await startServer({ modelPath, host: "127.0.0.1", port: 0, apiKey: KEY, maxQueue: 1,
    contextLength: 2048, threads: 2, backend: "cpu" });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 20_000 });
});

afterAll(async () => {
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

const user = [{ role: "user" as const, content: "the cat sat" }];

describe("the OpenAI-compatible server", () => {
  test("lists its model", async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual(["tiny"]);
  });

  test("chat: streaming gives the same greedy text as not streaming, with usage", async () => {
    const plain = await client.chat.completions.create({ model: "tiny", messages: user,
      max_tokens: 12, temperature: 0, logit_bias: noEos });
    const choice = plain.choices[0];
    expect(choice.message.role).toBe("assistant");
    expect(typeof choice.message.content).toBe("string");
    expect(plain.object).toBe("chat.completion");
    const u = plain.usage!;
    expect(u.prompt_tokens).toBeGreaterThan(3);
    expect(u.completion_tokens).toBeGreaterThan(0);
    expect(u.completion_tokens).toBeLessThanOrEqual(12);
    expect(u.total_tokens).toBe(u.prompt_tokens + u.completion_tokens);
    if (u.completion_tokens === 12) expect(choice.finish_reason).toBe("length");

    const stream = await client.chat.completions.create({ model: "tiny", messages: user,
      max_tokens: 12, temperature: 0, logit_bias: noEos, stream: true,
      stream_options: { include_usage: true } });
    let text = "", finish: string | null = null, usage = null, roles = 0;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta.role) roles++;
        text += c.delta.content ?? "";
        finish = c.finish_reason ?? finish;
      }
    }
    expect(roles).toBe(1);
    expect(text).toBe(choice.message.content!);
    expect(finish).toBe(choice.finish_reason);
    expect(usage).toEqual(u);
  });

  test("completions: exactly max_tokens when end-of-generation is banned; streaming agrees", async () => {
    const plain = await client.completions.create({ model: "tiny", prompt: "the cat",
      max_tokens: 10, temperature: 0, logit_bias: noEos });
    expect(plain.object).toBe("text_completion");
    expect(plain.usage!.completion_tokens).toBe(10);
    expect(plain.choices[0].finish_reason).toBe("length");
    const stream = await client.completions.create({ model: "tiny", prompt: "the cat",
      max_tokens: 10, temperature: 0, logit_bias: noEos, stream: true });
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
    expect(text).toBe(plain.choices[0].text);
    // seeded sampling is reproducible
    const a = await client.completions.create({ model: "tiny", prompt: "a", max_tokens: 10, seed: 7,
      temperature: 1, top_p: 0.9, presence_penalty: 0.5, frequency_penalty: 0.5, logit_bias: noEos });
    const b = await client.completions.create({ model: "tiny", prompt: "a", max_tokens: 10, seed: 7,
      temperature: 1, top_p: 0.9, presence_penalty: 0.5, frequency_penalty: 0.5, logit_bias: noEos });
    expect(a.choices[0].text).toBe(b.choices[0].text);
  });

  test("spec per request: ngram gives the text off gives, greedy and seeded; bad values are a 400", async () => {
    const ask = (spec: string, extra: object) => post("/v1/completions", { model: "tiny",
      prompt: "the cat sat on the mat the cat sat on the mat the cat", max_tokens: 60,
      logit_bias: noEos, spec, draft_max: 8, ...extra })
      .then((r) => r.json() as Promise<{ choices: { text: string }[] }>);
    for (const extra of [{ temperature: 0 }, { temperature: 0.8, seed: 11 }]) {
      const [off, ngram] = [await ask("off", extra), await ask("ngram", extra)];
      expect(ngram.choices[0].text).toBe(off.choices[0].text);
    }
    for (const body of [{ spec: "draft" }, { spec: "lookahead" }, { spec: 1 }, { draft_max: 0 }, { draft_max: 1.5 }]) {
      const r = await post("/v1/completions", { model: "tiny", prompt: "a", max_tokens: 2, ...body });
      expect(r.status).toBe(400);
      expect(((await r.json()) as { error: { param: string } }).error.param).toBe(Object.keys(body)[0]);
    }
  });

  test("a stop string ends the text before it, streaming or not", async () => {
    const full = (await client.completions.create({ model: "tiny", prompt: "the cat sat",
      max_tokens: 40, temperature: 0, logit_bias: noEos })).choices[0].text;
    expect(full.length).toBeGreaterThan(8);
    const stop = full.slice(6, 9);
    const expected = full.slice(0, full.indexOf(stop));
    const cut = await client.completions.create({ model: "tiny", prompt: "the cat sat",
      max_tokens: 40, temperature: 0, logit_bias: noEos, stop: [stop, "\u0000never"] });
    expect(cut.choices[0].text).toBe(expected);
    expect(cut.choices[0].finish_reason).toBe("stop");
    const stream = await client.completions.create({ model: "tiny", prompt: "the cat sat",
      max_tokens: 40, temperature: 0, logit_bias: noEos, stop, stream: true });
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
    expect(text).toBe(expected);
  });

  test("response_format json_schema and json_object give JSON that parses", async () => {
    const schema = { type: "object", properties: { name: { type: "string" }, ok: { type: "boolean" },
      n: { type: "integer" } }, required: ["name", "ok", "n"], additionalProperties: false };
    for (const seed of [1, 2]) {
      const r = await client.chat.completions.create({ model: "tiny", messages: user, max_tokens: 60,
        temperature: 0.8, seed, response_format: { type: "json_schema",
          json_schema: { name: "thing", schema } } });
      const value = JSON.parse(r.choices[0].message.content!);
      expect(Object.keys(value)).toEqual(["name", "ok", "n"]);
      expect(typeof value.name).toBe("string");
      expect(typeof value.ok).toBe("boolean");
      expect(Number.isInteger(value.n)).toBe(true);
      expect(r.choices[0].finish_reason).toBe("stop");
    }
    const o = await client.chat.completions.create({ model: "tiny", messages: user, max_tokens: 40,
      temperature: 0.8, seed: 3, response_format: { type: "json_object" } });
    const parsed = JSON.parse(o.choices[0].message.content!);
    expect(typeof parsed).toBe("object");
  });

  test("n choices: choice i is the request alone with seed + i; streaming agrees; the prompt counts once", async () => {
    // (This random model's logits are so peaked that both seeds may well give one text.)
    const ask = { model: "tiny", messages: user, max_tokens: 8, temperature: 2, seed: 42, logit_bias: noEos };
    const both = await client.chat.completions.create({ ...ask, n: 2 });
    expect(both.choices.map((c) => c.index)).toEqual([0, 1]);
    const alone = [await client.chat.completions.create(ask),
      await client.chat.completions.create({ ...ask, seed: 43 })];
    const texts = alone.map((a) => a.choices[0].message.content);
    expect(both.choices.map((c) => c.message.content)).toEqual(texts);
    expect(both.usage!.prompt_tokens).toBe(alone[0].usage!.prompt_tokens);
    expect(both.usage!.completion_tokens).toBe(alone[0].usage!.completion_tokens +
      alone[1].usage!.completion_tokens);

    const stream = await client.chat.completions.create({ ...ask, n: 2, stream: true,
      stream_options: { include_usage: true } });
    const streamed = ["", ""], finishes: (string | null)[] = [null, null];
    let roles = 0, usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta.role) roles++;
        streamed[c.index] += c.delta.content ?? "";
        finishes[c.index] = c.finish_reason ?? finishes[c.index];
      }
    }
    expect(roles).toBe(2);
    expect(streamed).toEqual(texts as string[]);
    expect(finishes).toEqual(both.choices.map((c) => c.finish_reason));
    expect(usage).toEqual(both.usage!);

    const completions = await client.completions.create({ model: "tiny", prompt: "the cat",
      max_tokens: 6, temperature: 0, n: 2, logit_bias: noEos });
    expect(completions.choices).toHaveLength(2);
    expect(completions.choices[0].text).toBe(completions.choices[1].text); // greedy: alike
  });

  test("errors: 400 naming the field, 401, 404, 413", async () => {
    const fails = async (p: Promise<unknown>) => {
      try { await p; } catch (err) { return err as InstanceType<typeof OpenAI.APIError>; }
      throw new Error("expected an error");
    };
    let e = await fails(client.chat.completions.create({ model: "tiny", messages: user, temperature: 5 }));
    expect(e.status).toBe(400);
    expect(e.param).toBe("temperature");
    expect((e.error as { type: string }).type).toBe("invalid_request_error");
    e = await fails(client.chat.completions.create({ model: "tiny",
      messages: [{ role: "robot", content: "x" }] as never }));
    expect(e.status).toBe(400);
    expect(e.param).toBe("messages[0].role");
    e = await fails(client.completions.create({ model: "tiny", prompt: "x", logit_bias: { "99999": 1 } }));
    expect(e.param).toBe("logit_bias");
    // One slot and a queue of one: three choices could never be served together.
    e = await fails(client.completions.create({ model: "tiny", prompt: "x", n: 3 }));
    expect(e.status).toBe(400);
    expect(e.param).toBe("n");
    e = await fails(client.chat.completions.create({ model: "tiny", messages: user,
      response_format: { type: "json_schema", json_schema: { name: "x",
        schema: { type: "string", pattern: "a+" } } } }));
    expect(e.status).toBe(400);
    expect(e.param).toBe("response_format.json_schema.schema");
    e = await fails(client.chat.completions.create({ model: "gpt-4o", messages: user }));
    expect(e.status).toBe(404);
    expect(e.code).toBe("model_not_found");
    const wrong = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "nope", maxRetries: 0 });
    e = await fails(wrong.models.list());
    expect(e.status).toBe(401);
    // bodies past the limit, and bodies that are not JSON
    const big = await fetch(`${server.url}/v1/completions`, { method: "POST",
      headers: { authorization: `Bearer ${KEY}` }, body: "x".repeat(2 << 20) });
    expect(big.status).toBe(413);
    const junk = await fetch(`${server.url}/v1/completions`, { method: "POST",
      headers: { authorization: `Bearer ${KEY}` }, body: "{nope" });
    expect(junk.status).toBe(400);
    expect(((await junk.json()) as Err).error.code).toBe("invalid_json");
  });

  test("/health answers while a long generation runs, and cancelling frees the worker", async () => {
    const controller = new AbortController();
    const stream = await client.completions.create({ model: "tiny", prompt: "the", max_tokens: LONG,
      temperature: 0, logit_bias: noEos, stream: true }, { signal: controller.signal });
    const it = stream[Symbol.asyncIterator]();
    await it.next();
    const times: number[] = [];
    let running = 0;
    for (let i = 0; i < 20; i++) {
      const t0 = performance.now();
      const h = await health();
      times.push(performance.now() - t0);
      running = Math.max(running, h.running);
      await Bun.sleep(5);
    }
    expect(running).toBe(1); // the generation was still going while /health answered
    // Typically under 1 ms; the bound only catches a blocked loop (the generation takes seconds)
    // and leaves room for a loaded machine.
    expect(Math.max(...times)).toBeLessThan(500);

    // with one request running, one may wait; the next is refused with 429 and Retry-After
    const waiting = client.completions.create({ model: "tiny", prompt: "a", max_tokens: 2 });
    await until(async () => (await health()).queue_depth === 1);
    const full = await fetch(`${server.url}/v1/completions`, { method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", prompt: "b", max_tokens: 2 }) });
    expect(full.status).toBe(429);
    expect(full.headers.get("retry-after")).toBe("1");
    expect(((await full.json()) as Err).error.type).toBe("rate_limit_error");

    const before = await metric("infer_tokens_generated_total");
    controller.abort(); // the client goes away mid-stream
    const t0 = performance.now();
    const queued = await waiting;
    expect(queued.usage!.completion_tokens).toBeLessThanOrEqual(2);
    const next = await client.completions.create({ model: "tiny", prompt: "a", max_tokens: 3,
      logit_bias: noEos });
    expect(next.usage!.completion_tokens).toBe(3);
    expect(performance.now() - t0).toBeLessThan(5_000);
    expect(await metric("infer_requests_cancelled_total")).toBeGreaterThanOrEqual(1);
    // the cancelled generation stopped well short of its LONG tokens
    expect(await metric("infer_tokens_generated_total") - before).toBeLessThan(LONG / 2);
    const h = await health();
    expect(h).toMatchObject({ status: "ok", running: 0, queue_depth: 0 });
  }, 30_000);

  test("an aborted request that does not stream is cancelled too", async () => {
    const controller = new AbortController();
    const before = await metric("infer_tokens_generated_total");
    const long = client.completions.create({ model: "tiny", prompt: "the", max_tokens: LONG,
      temperature: 0, logit_bias: noEos }, { signal: controller.signal }).then(() => null, (e: unknown) => e);
    await until(async () => (await health()).running === 1);
    await Bun.sleep(20);
    controller.abort();
    expect(await long).toBeInstanceOf(OpenAI.APIUserAbortError);
    await until(async () => (await health()).running === 0);
    const next = await client.completions.create({ model: "tiny", prompt: "a", max_tokens: 3,
      logit_bias: noEos });
    expect(next.usage!.completion_tokens).toBe(3);
    expect(await metric("infer_tokens_generated_total") - before).toBeLessThan(LONG / 2);
  }, 30_000);

  test("a request cancelled while it waits leaves the queue", async () => {
    const running = new AbortController(), queued = new AbortController();
    const stream = await client.completions.create({ model: "tiny", prompt: "the", max_tokens: LONG,
      temperature: 0, logit_bias: noEos, stream: true }, { signal: running.signal });
    await stream[Symbol.asyncIterator]().next();
    const waiting = client.completions.create({ model: "tiny", prompt: "a", max_tokens: 2 },
      { signal: queued.signal }).then(() => null, (e: unknown) => e);
    await until(async () => (await health()).queue_depth === 1);
    queued.abort();
    expect(await waiting).toBeInstanceOf(OpenAI.APIUserAbortError);
    await until(async () => (await health()).queue_depth === 0);
    expect((await health()).running).toBe(1); // the running one goes on
    running.abort();
    await until(async () => (await health()).running === 0);
  }, 30_000);

  test("/metrics is Prometheus text", async () => {
    const text = await (await fetch(`${server.url}/metrics`)).text();
    expect(text).toMatch(/^# TYPE infer_requests_total counter$/m);
    expect(text).toMatch(/^infer_queue_depth 0$/m);
    expect(text).toMatch(/^infer_time_to_first_token_seconds_count [1-9]\d*$/m);
    expect(text).toMatch(/^infer_requests_total\{endpoint="\/v1\/chat\/completions",status="200"\} \d+$/m);
  });
});

type Err = { error: { message: string; type: string; param: string | null; code: string | null } };
type Health = { status: string; model: string; queue_depth: number; running: number };

async function health(): Promise<Health> {
  return (await (await fetch(`${server.url}/health`)).json()) as Health;
}

/** Polls `check` every 5 ms until it holds (at most 10 s). */
async function until(check: () => Promise<boolean>): Promise<void> {
  const end = performance.now() + 10_000;
  while (!(await check())) {
    if (performance.now() > end) throw new Error("timed out waiting for the server");
    await Bun.sleep(5);
  }
}

async function metric(name: string): Promise<number> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, "m").exec(text);
  return Number(m?.[1]);
}

/** POSTs a raw body (text, or a value to send as JSON) with the key. */
async function post(path: string, body: unknown): Promise<Response> {
  return fetch(`${server.url}${path}`, { method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body) });
}

/** The server answers /health and a short request as usual. */
async function stillServing(): Promise<void> {
  expect((await health()).status).toBe("ok");
  const r = await client.completions.create({ model: "tiny", prompt: "a", max_tokens: 2,
    logit_bias: noEos });
  expect(r.usage!.completion_tokens).toBe(2);
}

const schemaBody = (schema: string, extra = "") =>
  `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":20${extra},` +
  `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":${schema}}}}`;

describe("structured output a client cannot break", () => {
  test("schemas that would hang or overflow the engine are a 400; the server goes on", async () => {
    const deep = `{"type":"object","properties":{"a":`.repeat(20_000) + `{"type":"string"}` +
      "}}".repeat(20_000);
    const cases: [string, RegExp][] = [
      [`{"$ref":"#"}`, /the reference "#" leads back to itself/],
      [`{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`,
        /#\/\$defs\/a → #\/\$defs\/b → #\/\$defs\/a/],
      [`{"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},"$ref":"#/$defs/a"}`,
        /leads back to itself/],
      [deep, /nests deeper than 128 levels/],
      [`{"const":${"[".repeat(100_000)}${"]".repeat(100_000)}}`, /nests deeper than 128 levels/],
      [`{"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]}`,
        /no JSON text of finite/],
    ];
    for (const [schema, message] of cases) {
      for (const stream of ["", `,"stream":true`]) {
        const res = await post("/v1/chat/completions", schemaBody(schema, stream));
        expect(res.status).toBe(400);
        const e = ((await res.json()) as Err).error;
        expect(e.param).toBe("response_format.json_schema.schema");
        expect(e.code).toBe("unsupported_schema");
        expect(e.message).toMatch(message);
        expect(e.message.length).toBeLessThan(400);
      }
      await stillServing();
    }
    // 100,000 nested arrays elsewhere in a body: refused where read, ignored where not
    const nested = "[".repeat(100_000) + "]".repeat(100_000);
    const bodies: [string, number][] = [[nested, 400],
      [`{"model":"tiny","prompt":"a","max_tokens":2,"stop":${nested}}`, 400],
      [`{"model":"tiny","messages":${nested},"max_tokens":2}`, 400],
      [`{"model":"tiny","prompt":"a","max_tokens":2,"metadata":${nested}}`, 200]];
    for (const [body, status] of bodies) {
      const path = body.includes("messages") ? "/v1/chat/completions" : "/v1/completions";
      expect((await post(path, body)).status).toBe(status);
      await stillServing();
    }
    // a tree recurses through a property: fine
    const tree = `{"$defs":{"n":{"type":"object","properties":{"name":{"type":"string"},` +
      `"kids":{"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":2}},"required":["name"]}},` +
      `"$ref":"#/$defs/n"}`;
    const ok = await post("/v1/chat/completions", schemaBody(tree, `,"temperature":1,"seed":3`));
    expect(ok.status).toBe(200);
    const answer = (await ok.json()) as { choices: { message: { content: string } }[] };
    expect(typeof JSON.parse(answer.choices[0].message.content).name).toBe("string");
  }, 30_000);

  test("output that cannot fit max_tokens is a 400 up front; at its shortest it fits", async () => {
    const schema = { type: "object", required: ["name", "n"], additionalProperties: false,
      properties: { name: { type: "string" }, n: { type: "integer" } } };
    const shortest = `{"name":"","n":0}`.length;
    const ask = (max: number, stream = false) => post("/v1/chat/completions", { model: "tiny",
      messages: user, max_tokens: max, temperature: 1, seed: 1, stream, response_format:
        { type: "json_schema", json_schema: { name: "x", schema } } });
    for (const stream of [false, true]) {
      const res = await ask(3, stream);
      expect(res.status).toBe(400);
      const e = ((await res.json()) as Err).error;
      expect(e.param).toBe("max_tokens");
      expect(e.message).toMatch(
        new RegExp(`shortest output is ${shortest} bytes.*at least ${shortest}`));
    }
    const tight = await client.chat.completions.create({ model: "tiny", messages: user,
      max_tokens: shortest, temperature: 1, seed: 1, response_format: { type: "json_schema",
        json_schema: { name: "x", schema } } });
    expect(Object.keys(JSON.parse(tight.choices[0].message.content!))).toEqual(["name", "n"]);
    expect(tight.choices[0].finish_reason).toBe("stop");
    const raw = await (await ask(shortest, true)).text();
    expect(raw.trimEnd().endsWith("data: [DONE]")).toBe(true);
    const json = await post("/v1/completions", { model: "tiny", prompt: "a", max_tokens: 1,
      response_format: { type: "json_object" } });
    expect(json.status).toBe(400);
    // a prompt that leaves less room in the context than the shortest output
    const engine = Engine.open({ modelPath, contextLength: 64, backend: "cpu" });
    const prompt = "the cat sat ".repeat(100);
    const room = server.info.contextLength - engine.tokenizer.encode(prompt).length;
    engine.close();
    const res = await post("/v1/completions", { model: "tiny", prompt, max_tokens: 2048,
      response_format: { type: "json_schema", json_schema: { name: "x",
        schema: { const: "x".repeat(room + 8) } } } });
    expect(res.status).toBe(400);
    const e = ((await res.json()) as Err).error;
    expect(e).toMatchObject({ param: "prompt", code: "context_length_exceeded" });
    await stillServing();
  }, 30_000);
});

describe("request parameters", () => {
  test("fields infer does not implement are refused by name; harmless ones pass", async () => {
    const completion = { model: "tiny", prompt: "a", max_tokens: 2 };
    const chat = { model: "tiny", messages: user, max_tokens: 2 };
    const refused: [string, object, string, string][] = [
      ["/v1/completions", { echo: true }, "echo", "unsupported_parameter"],
      ["/v1/completions", { best_of: 2 }, "best_of", "unsupported_parameter"],
      ["/v1/completions", { suffix: "x" }, "suffix", "unsupported_parameter"],
      ["/v1/completions", { no_such_field: 1 }, "no_such_field", "unsupported_parameter"],
      ["/v1/completions", { tools: [{ type: "function", function: { name: "f" } }] }, "tools",
        "unsupported_parameter"],
      ["/v1/chat/completions", { tool_choice: "auto" }, "tool_choice", "invalid_value"],
      ["/v1/chat/completions", { functions: [{ name: "f" }] }, "functions",
        "unsupported_parameter"],
      ["/v1/chat/completions", { prompt: "x" }, "prompt", "unsupported_parameter"],
      ["/v1/completions", { max_tokens: 0 }, "max_tokens", "invalid_value"],
      ["/v1/chat/completions", { max_completion_tokens: 0 }, "max_completion_tokens",
        "invalid_value"],
      ["/v1/chat/completions", { top_logprobs: 2 }, "top_logprobs", "invalid_value"],
      ["/v1/chat/completions", { logprobs: true, top_logprobs: 21 }, "top_logprobs",
        "invalid_value"],
      ["/v1/completions", { logprobs: 6 }, "logprobs", "invalid_value"],
      ["/v1/completions", { top_k: -1 }, "top_k", "invalid_value"],
      ["/v1/completions", { min_p: 1.5 }, "min_p", "invalid_value"],
      ["/v1/completions", { typical_p: 2 }, "typical_p", "invalid_value"],
      ["/v1/completions", { repeat_penalty: 0 }, "repeat_penalty", "invalid_value"],
      ["/v1/completions", { repeat_last_n: -2 }, "repeat_last_n", "invalid_value"],
      ["/v1/completions", { logit_bias: Object.fromEntries(
        Array.from({ length: server.info.vocabSize }, (_, i) => [i, -100])) }, "logit_bias",
      "invalid_value"],
    ];
    for (const [path, extra, param, code] of refused) {
      const res = await post(path,
        { ...(path === "/v1/completions" ? completion : chat), ...extra });
      expect(res.status).toBe(400);
      expect(((await res.json()) as Err).error).toMatchObject({ param, code,
        type: "invalid_request_error" });
    }
    const ignored = { user: "u", metadata: { a: "b" }, store: false, service_tier: "auto",
      parallel_tool_calls: true, echo: false, best_of: 1, suffix: null, tools: null };
    expect((await post("/v1/completions", { ...completion, ...ignored })).status).toBe(200);
    expect((await post("/v1/chat/completions", { ...chat, user: "u", tools: [], tool_choice: "none",
      top_logprobs: null })).status).toBe(200);
  });

  test("top_k, min_p, repeat_penalty and repeat_last_n reach the sampler", async () => {
    const base = { model: "tiny", prompt: "the cat", max_tokens: 12, logit_bias: noEos };
    const text = async (extra: object) =>
      (await client.completions.create({ ...base, ...extra } as never) as OpenAI.Completion)
        .choices[0].text;
    const greedy = await text({ temperature: 0 });
    // top_k 1 and min_p 1 leave only the likeliest token, at any temperature
    expect(await text({ temperature: 2, seed: 5, top_k: 1 })).toBe(greedy);
    expect(await text({ temperature: 2, seed: 5, min_p: 1 })).toBe(greedy);
    // the repeat penalty gives what an engine with the same sampler options gives
    const penalised = await text({ temperature: 0, repeat_penalty: 10, repeat_last_n: 8 });
    expect(penalised).not.toBe(greedy); // this model's greedy text repeats itself
    const engine = Engine.open({ modelPath, contextLength: 64, backend: "cpu" });
    try {
      const r = engine.generate("the cat", { maxTokens: 12, sampling: { temperature: 0, topK: 0,
        topP: 1, minP: 0, seed: 0, repeatPenalty: 10, repeatLastN: 8,
        logitBias: new Map([[EOS, -Infinity]]) } });
      expect(penalised).toBe(r.text);
    } finally {
      engine.close();
    }
  });

  test("logprobs are the log-softmax at each token, as an engine's own logits give", async () => {
    const r = await client.completions.create({ model: "tiny", prompt: "the cat", max_tokens: 6,
      temperature: 0, logit_bias: noEos, logprobs: 3 });
    const lp = r.choices[0].logprobs!;
    expect(lp.tokens!.join("")).toBe(r.choices[0].text);
    const engine = Engine.open({ modelPath, contextLength: 64, backend: "cpu" });
    try {
      const t = engine.tokenizer;
      let logits = engine.evaluate(t.encode("the cat", { addSpecial: true, parseSpecial: true }));
      let offset = 0;
      for (let i = 0; i < 6; i++) {
        const x = Float64Array.from(logits);
        let max = -Infinity, z = 0;
        for (const v of x) max = Math.max(max, v);
        for (const v of x) z += Math.exp(v - max);
        const logprob = (id: number) => x[id] - max - Math.log(z);
        const order = Array.from(x.keys()).sort((a, b) => x[b] - x[a] || a - b);
        const token = order.find((id) => id !== EOS)!; // greedy, with <eos> banned
        const name = (id: number) => {
          const b = t.tokenBytes(id);
          try { return new TextDecoder("utf-8", { fatal: true }).decode(b); } catch {
            const hex = Array.from(b, (v) => `\\x${v.toString(16).padStart(2, "0")}`);
            return "bytes:" + hex.join("");
          }
        };
        expect(lp.tokens![i]).toBe(name(token));
        expect(lp.token_logprobs![i]).toBeCloseTo(logprob(token), 3);
        const top = new Map<string, number>();
        for (const id of [...order.slice(0, 3), token]) {
          if (!top.has(name(id))) top.set(name(id), logprob(id));
        }
        expect(Object.keys(lp.top_logprobs![i])).toEqual([...top.keys()]);
        for (const [k, v] of top) expect(lp.top_logprobs![i][k]).toBeCloseTo(v, 3);
        expect(lp.text_offset![i]).toBe(offset);
        offset += lp.tokens![i].length;
        logits = engine.evaluate([token]);
      }
    } finally {
      engine.close();
    }
    // streaming carries the same, chunk by chunk
    const stream = await client.completions.create({ model: "tiny", prompt: "the cat",
      max_tokens: 6, temperature: 0, logit_bias: noEos, logprobs: 3, stream: true });
    const tokens: string[] = [], offsets: number[] = [];
    for await (const chunk of stream) {
      const l = chunk.choices[0]?.logprobs;
      if (l) { tokens.push(...l.tokens!); offsets.push(...l.text_offset!); }
    }
    expect(tokens).toEqual(lp.tokens!);
    expect(offsets).toEqual(lp.text_offset!);
  }, 30_000);

  test("chat logprobs: content entries with bytes and top_logprobs, streaming alike", async () => {
    const ask = { model: "tiny", messages: user, max_tokens: 5, temperature: 0, logit_bias: noEos,
      logprobs: true, top_logprobs: 2 } as const;
    const r = await client.chat.completions.create(ask);
    const content = r.choices[0].logprobs!.content!;
    expect(content).toHaveLength(r.usage!.completion_tokens);
    expect(content.map((c) => c.token).join("")).toBe(r.choices[0].message.content!);
    for (const c of content) {
      expect(new TextDecoder().decode(Uint8Array.from(c.bytes!))).toBe(c.token);
      expect(c.top_logprobs).toHaveLength(2);
      expect(c.top_logprobs[0].logprob).toBeGreaterThanOrEqual(c.top_logprobs[1].logprob);
      expect(c.logprob).toBeLessThanOrEqual(c.top_logprobs[0].logprob + 1e-6);
    }
    const plain = await client.chat.completions.create({ ...ask, logprobs: false,
      top_logprobs: undefined });
    expect(plain.choices[0].logprobs).toBeNull();
    const stream = await client.chat.completions.create({ ...ask, stream: true });
    const streamed: typeof content = [];
    for await (const chunk of stream) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
    expect(streamed).toEqual(content);
  });
});
