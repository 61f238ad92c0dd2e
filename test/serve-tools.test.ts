// Method: tool calling through the official `openai` client against `infer serve` in-process, on
// two random models: the tiny Qwen3 of test/fixtures/hf-tiny imported with Qwen3's real chat
// template (its own format: <tool_call> blocks), and the tiny Gemma, whose template has no tools
// (infer's generic format). Random weights say nothing sensible, so the checks are the ones the
// grammar guarantees: with tool_choice "required" or a named function, every call's arguments
// parse and validate (ajv) against the function's schema; the streamed deltas assemble into the
// call the non-streaming request gives (greedy), the arguments in several fragments (read with
// the client and as raw SSE: a naming delta first, no wrapper text anywhere); a tool result sent
// back gets an answer; bad shapes get OpenAI-style 400s.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { copyFileSync, cpSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Ajv from "ajv";
import OpenAI from "openai";
import type {
  ChatCompletionFunctionTool, ChatCompletionMessageParam,
} from "openai/resources/chat/completions";
import { importHuggingFace } from "../ts/convert/import.ts";
import { startServer, type InferServer } from "../ts/serve/server.ts";
import { hfTinyFolder } from "./hf-tiny.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const WEATHER = {
  type: "object",
  properties: {
    city: { type: "string" },
    unit: { type: "string", enum: ["celsius", "fahrenheit"] },
    days: { type: "integer" },
  },
  required: ["city", "unit"],
  additionalProperties: false,
};
const TOOLS: ChatCompletionFunctionTool[] = [
  { type: "function", function: { name: "get_weather", description: "The weather in a city.",
    parameters: WEATHER } },
  { type: "function", function: { name: "get_time", parameters: { type: "object",
    properties: { zone: { type: "string" } }, required: ["zone"] } } },
];
const ajv = new Ajv({ strict: false });
const validators = new Map(TOOLS.map((t) =>
  [t.function.name, ajv.compile(t.function.parameters as object)]));
const ask: ChatCompletionMessageParam[] = [{ role: "user", content: "Weather in Paris?" }];

let dir: string;
const servers: InferServer[] = [];
let qwen: OpenAI, gemma: OpenAI;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "infer-tools-"));
  // The fixture's own template is a toy; the model gets Qwen3's real one by the ordinary import
  // path (a chat_template.jinja beside the weights).
  const folder = join(dir, "qwen3");
  cpSync(hfTinyFolder("qwen3"), folder, { recursive: true });
  copyFileSync(join(import.meta.dir, "fixtures", "chat-templates", "qwen3.jinja"),
    join(folder, "chat_template.jinja"));
  // (each file is named tiny.gguf, the model id the requests give)
  mkdirSync(join(dir, "q"));
  mkdirSync(join(dir, "g"));
  const qwenPath = join(dir, "q", "tiny.gguf");
  importHuggingFace({ folder, output: qwenPath, quant: "F32" as never });
  const gemmaPath = join(dir, "g", "tiny.gguf");
  writeFileSync(gemmaPath, tinyGemma3Gguf({}));
  for (const modelPath of [qwenPath, gemmaPath]) {
    servers.push(await startServer({ modelPath, host: "127.0.0.1", port: 0, contextLength: 2048,
      threads: 2, backend: "cpu" }));
  }
  const client = (s: InferServer) =>
    new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "none", maxRetries: 0, timeout: 60_000 });
  [qwen, gemma] = servers.map(client);
});

afterAll(async () => {
  for (const s of servers) await s.stop();
  rmSync(dir, { recursive: true, force: true });
});

type Call = { id: string; type: "function"; function: { name: string; arguments: string } };

function checkCall(call: Call, names: string[]): void {
  expect(call.type).toBe("function");
  expect(call.id).toMatch(/^call_\w+$/);
  expect(names).toContain(call.function.name);
  const args = JSON.parse(call.function.arguments);
  const validate = validators.get(call.function.name)!;
  expect(validate(args) ? null : validate.errors).toBeNull();
}

/** The calls of a streamed answer, assembled from the deltas as an OpenAI client does. */
async function streamed(client: OpenAI, body: object) {
  const stream = await client.chat.completions.create({ ...body, stream: true } as never) as
    unknown as AsyncIterable<OpenAI.ChatCompletionChunk>;
  const calls: Call[] = [];
  let content = "", finish: string | null = null, fragments = 0;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta.content ?? "";
    for (const d of c.delta.tool_calls ?? []) {
      if (d.id !== undefined) {
        expect(d.function?.arguments).toBe("");
        calls[d.index] = { id: d.id, type: d.type as "function",
          function: { name: d.function!.name!, arguments: "" } };
      } else {
        calls[d.index].function.arguments += d.function?.arguments ?? "";
        fragments++;
      }
    }
    finish = c.finish_reason ?? finish;
  }
  return { calls, content, finish, fragments };
}

/** A streamed request's SSE events as the server sent them, read without a client library. */
async function sseEvents(url: string, body: object): Promise<Record<string, unknown>[]> {
  const res = await fetch(`${url}/v1/chat/completions`, { method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ ...body, stream: true }) });
  expect(res.headers.get("content-type")).toBe("text/event-stream");
  const events = (await res.text()).split("\n\n").filter((e) => e !== "");
  expect(events.at(-1)).toBe("data: [DONE]");
  return events.slice(0, -1).map((e) => {
    expect(e.startsWith("data: ")).toBe(true);
    return JSON.parse(e.slice(6));
  });
}

for (const [family, which] of [["Qwen3's template", () => qwen], ["no tools in the template " +
  "(generic format)", () => gemma]] as const) {
  describe(`tool calls: ${family}`, () => {
    test("tool_choice required: a call whose arguments validate, finish_reason tool_calls",
      async () => {
        for (const seed of [1, 2, 3]) {
          const r = await which().chat.completions.create({ model: "tiny", messages: ask,
            tools: TOOLS, tool_choice: "required", temperature: 1, seed, max_tokens: 300 });
          const m = r.choices[0].message;
          expect(r.choices[0].finish_reason).toBe("tool_calls");
          expect(m.tool_calls).toHaveLength(1);
          checkCall(m.tool_calls![0] as Call, ["get_weather", "get_time"]);
        }
      }, 120_000);

    test("a named function is the one called; its result sent back gets an answer", async () => {
      const r = await which().chat.completions.create({ model: "tiny", messages: ask,
        tools: TOOLS, tool_choice: { type: "function", function: { name: "get_time" } },
        temperature: 0, max_tokens: 300 });
      const call = r.choices[0].message.tool_calls![0] as Call;
      checkCall(call, ["get_time"]);
      const next = await which().chat.completions.create({ model: "tiny", tools: TOOLS,
        messages: [...ask, { role: "assistant", content: null, tool_calls: [call] },
          { role: "tool", tool_call_id: call.id, content: '{"time": "12:00"}' }],
        temperature: 0, max_tokens: 40 });
      // (random weights may answer or call again; either way in a well-formed message)
      const m = next.choices[0].message;
      const names = ["get_weather", "get_time"];
      if (m.tool_calls) for (const c of m.tool_calls) checkCall(c as Call, names);
      else expect(typeof m.content).toBe("string");
      expect(next.usage!.prompt_tokens).toBeGreaterThan(r.usage!.prompt_tokens);
    }, 120_000);

    test("streaming: the deltas assemble into the call the plain request gives", async () => {
      const body = { model: "tiny", messages: ask, tools: TOOLS, tool_choice: "required",
        temperature: 0, max_tokens: 300 };
      const plain = await which().chat.completions.create(body as never) as OpenAI.ChatCompletion;
      const s = await streamed(which(), body);
      expect(s.finish).toBe("tool_calls");
      expect(s.calls).toHaveLength(1);
      checkCall(s.calls[0], ["get_weather", "get_time"]);
      const call = plain.choices[0].message.tool_calls![0] as Call;
      expect(s.calls[0].function).toEqual(call.function);
      // the arguments come in fragments as they are generated, not in one piece at the end
      expect(s.fragments).toBeGreaterThan(3);
      expect(s.content).toBe("");
    }, 120_000);

    test("streaming, raw SSE: a naming delta, then argument fragments; no wrapper text",
      async () => {
      const server = servers[which() === qwen ? 0 : 1];
      const body = { model: "tiny", messages: ask, tools: TOOLS, temperature: 0, max_tokens: 300,
        tool_choice: { type: "function", function: { name: "get_weather" } } };
      const plain = await (await fetch(`${server.url}/v1/chat/completions`, { method: "POST",
        headers: { "content-type": "application/json" }, body: JSON.stringify(body) })).json() as
        { choices: { message: { tool_calls: Call[] } }[] };
      const want = plain.choices[0].message.tool_calls[0];
      type Delta = { content?: string; tool_calls?: { index: number; id?: string; type?: string;
        function: { name?: string; arguments: string } }[] };
      const events = await sseEvents(server.url, body);
      const deltas = events.map((e) => (e.choices as { delta: Delta }[])[0]?.delta ?? {});
      const content = deltas.map((d) => d.content ?? "").join("");
      expect(content).toBe("");
      const parts = deltas.flatMap((d) => d.tool_calls ?? []);
      const { id, ...head } = parts[0];
      expect(head).toEqual({ index: 0, type: "function",
        function: { name: "get_weather", arguments: "" } });
      expect(id).toMatch(/^call_\w+$/);
      const rest = parts.slice(1);
      expect(rest.length).toBeGreaterThan(3);
      for (const p of rest) {
        expect(Object.keys(p).sort()).toEqual(["function", "index"]);
        expect(p.index).toBe(0);
        expect(Object.keys(p.function)).toEqual(["arguments"]);
      }
      const joined = rest.map((p) => p.function.arguments).join("");
      expect(joined).toBe(want.function.arguments);
      for (const wrapper of ["<tool_call>", "</tool_call>", '"name"', '"arguments"']) {
        expect(joined).not.toContain(wrapper);
      }
      checkCall({ ...want, function: { name: "get_weather", arguments: joined } }, ["get_weather"]);
      const finish = events.map((e) => (e.choices as { finish_reason: string | null }[])[0]
        ?.finish_reason).filter((f) => f !== null && f !== undefined);
      expect(finish).toEqual(["tool_calls"]);
    }, 120_000);
  });
}

function nestedSchema(depth: number): object {
  let schema: object = { type: "string" };
  for (let i = 0; i < depth; i++) schema = { type: "object", properties: { a: schema } };
  return schema;
}

describe("tool requests the server refuses", () => {
  const post = (body: object) => fetch(`${servers[0].url}/v1/chat/completions`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", messages: ask, ...body }) });
  const cases: [string, object, string][] = [
    ["tools not an array", { tools: { type: "function" } }, "tools"],
    ["a tool that is not a function", { tools: [{ type: "code" }] }, "tools[0]"],
    ["parameters not an object", { tools: [{ type: "function", function: { name: "f",
      parameters: [] } }] }, "tools[0].function.parameters"],
    ["a bad function name", { tools: [{ type: "function", function: { name: "a b" } }] },
      "tools[0].function.name"],
    ["tool_choice naming an unknown function", { tools: TOOLS,
      tool_choice: { type: "function", function: { name: "nope" } } }, "tool_choice"],
    ["tool_choice required without tools", { tool_choice: "required" }, "tool_choice"],
    ["a tool message without tool_call_id", { messages: [...ask,
      { role: "tool", content: "x" }] }, "messages[1].tool_call_id"],
    ["tool_calls of the wrong shape", { messages: [...ask,
      { role: "assistant", content: null, tool_calls: [{ id: "c" }] }] },
    "messages[1].tool_calls[0]"],
    ["tools with a response format", { tools: TOOLS, response_format: { type: "json_object" } },
      "response_format"],
    // Qwen3's template renders the tools with a recursive tojson: checked before it runs
    ["parameters nested 5,000 deep, tool_choice auto", { tools: [{ type: "function",
      function: { name: "f", parameters: nestedSchema(5_000) } }] },
    "tools[0].function.parameters"],
    ["a call's arguments nested 100,000 deep: rendered as text, too long for the context",
      { messages: [...ask, { role: "assistant", content: null, tool_calls: [{ id: "c",
        type: "function", function: { name: "get_time",
          arguments: "[".repeat(100_000) + "]".repeat(100_000) } }] },
      { role: "tool", tool_call_id: "c", content: "noon" }], tools: TOOLS }, "messages"],
    ["a schema the grammar cannot enforce, with required", { tool_choice: "required",
      tools: [{ type: "function", function: { name: "f", parameters: { type: "object",
        properties: { s: { type: "string", pattern: "^a" } } } } }] }, "tools"],
  ];
  for (const [what, body, param] of cases) {
    test(what, async () => {
      const res = await post(body);
      expect(res.status).toBe(400);
      const e = (await res.json() as { error: { param: string; message: string } }).error;
      expect(e.param).toBe(param);
      expect(e.message).not.toContain("\n");
    });
  }
});
