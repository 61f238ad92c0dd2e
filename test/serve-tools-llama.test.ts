// Method: Llama 3.1 tool calling through `infer serve` on the tiny random Llama of
// test/fixtures/hf-tiny, imported with Llama 3.1's real chat template (llama3.1.jinja) and its
// tool tokens added to the vocabulary (<|eom_id|>, <|python_tag|>, control tokens as in the real
// vocabulary). Random weights say nothing sensible, so: with tool_choice "required" the grammar's
// JSON call ({"name", "parameters"}) comes back parsed, streamed in fragments that join into the
// plain request's arguments; a logit bias that makes the model write <|python_tag|> shows the
// token reaches the reader (an answer of tags is code: the call "python" with {"code"}, nothing
// of it as content); a history with a built-in tool's call (rendered <|python_tag|>
// brave_search.call(...)<|eom_id|>) and its result is accepted; and control-token text in that
// call's arguments and in the result is tokenized as text (more prompt tokens than the one a
// control token would be).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { copyFileSync, cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import type {
  ChatCompletionFunctionTool, ChatCompletionMessageParam,
} from "openai/resources/chat/completions";
import { importHuggingFace } from "../ts/convert/import.ts";
import { startServer, type InferServer } from "../ts/serve/server.ts";
import { hfTinyFolder } from "./hf-tiny.ts";

const PYTHON_TAG = 366;
const fn = (name: string, key: string): ChatCompletionFunctionTool => ({ type: "function",
  function: { name, parameters: { type: "object", properties: { [key]: { type: "string" } },
    required: [key], additionalProperties: false } } });
const WEATHER: ChatCompletionFunctionTool = { type: "function", function: { name: "get_weather",
  parameters: { type: "object", properties: { city: { type: "string" },
    unit: { type: "string", enum: ["celsius", "fahrenheit"] } }, required: ["city", "unit"],
  additionalProperties: false } } };
const TOOLS = [fn("brave_search", "query"), fn("python", "code"), WEATHER];
const ask: ChatCompletionMessageParam[] = [{ role: "user", content: "Who won the Tour?" }];

let dir: string, server: InferServer, client: OpenAI;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "infer-llama-tools-"));
  const folder = join(dir, "llama");
  cpSync(hfTinyFolder("llama"), folder, { recursive: true });
  copyFileSync(join(import.meta.dir, "fixtures", "chat-templates", "llama3.1.jinja"),
    join(folder, "chat_template.jinja"));
  // the tiny vocabulary has room (384 rows, 365 tokens) for the two tokens tools need
  const tokenizer = JSON.parse(readFileSync(join(folder, "tokenizer.json"), "utf8"));
  for (const [id, content] of [[365, "<|eom_id|>"], [PYTHON_TAG, "<|python_tag|>"]] as const) {
    tokenizer.added_tokens.push({ id, content, single_word: false, lstrip: false, rstrip: false,
      normalized: false, special: true });
  }
  writeFileSync(join(folder, "tokenizer.json"), JSON.stringify(tokenizer));
  mkdirSync(join(dir, "m"));
  const modelPath = join(dir, "m", "tiny.gguf");
  importHuggingFace({ folder, output: modelPath, quant: "F32" as never });
  server = await startServer({ modelPath, host: "127.0.0.1", port: 0, contextLength: 2048,
    threads: 2, backend: "cpu" });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0,
    timeout: 60_000 });
});

afterAll(async () => {
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

async function streamed(body: object) {
  const stream = await client.chat.completions.create({ ...body, stream: true } as never) as
    unknown as AsyncIterable<OpenAI.ChatCompletionChunk>;
  let content = "", name = "", args = "", fragments = 0;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta;
    content += d?.content ?? "";
    for (const c of d?.tool_calls ?? []) {
      if (c.id !== undefined) name = c.function!.name!;
      else {
        args += c.function?.arguments ?? "";
        fragments++;
      }
    }
  }
  return { content, name, args, fragments };
}

test("tool_choice required: Llama's JSON call, parsed and streamed in fragments", async () => {
  const body = { model: "tiny", messages: ask, tools: TOOLS, tool_choice: "required",
    temperature: 0, max_tokens: 300 };
  const r = await client.chat.completions.create(body as never) as OpenAI.ChatCompletion;
  expect(r.choices[0].finish_reason).toBe("tool_calls");
  const call = r.choices[0].message.tool_calls![0] as { function: { name: string;
    arguments: string } };
  expect(TOOLS.map((t) => t.function.name)).toContain(call.function.name);
  const args = JSON.parse(call.function.arguments);
  expect(typeof args).toBe("object");
  const s = await streamed(body);
  expect(s).toMatchObject({ content: "", name: call.function.name, args: call.function.arguments });
  expect(s.fragments).toBeGreaterThan(1);
}, 120_000);

test("<|python_tag|> reaches the reader: code after it is the call python({code})", async () => {
  const body = { model: "tiny", messages: ask, tools: TOOLS, temperature: 0, max_tokens: 3,
    logit_bias: { [PYTHON_TAG]: 100 } };
  const r = await client.chat.completions.create(body as never) as OpenAI.ChatCompletion;
  const m = r.choices[0].message;
  expect(m.content).toBeNull();
  expect(m.tool_calls).toHaveLength(1);
  const call = m.tool_calls![0] as { function: { name: string; arguments: string } };
  expect(call.function.name).toBe("python");
  // three tags: the first opens the call, the two after it are its code
  expect(JSON.parse(call.function.arguments)).toEqual({ code: "<|python_tag|><|python_tag|>" });
  const s = await streamed(body);
  expect(s).toMatchObject({ content: "", name: "python", args: call.function.arguments });
}, 120_000);

test("a built-in tool's call and its result; control-token text in them stays text",
  async () => {
    const history = (query: string, result: string): ChatCompletionMessageParam[] => [...ask,
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function",
        function: { name: "brave_search", arguments: JSON.stringify({ query }) } }] },
      { role: "tool", tool_call_id: "call_1", content: result }];
    const promptTokens = async (messages: ChatCompletionMessageParam[]) => {
      const r = await client.chat.completions.create({ model: "tiny", messages, tools: TOOLS,
        temperature: 0, max_tokens: 1 });
      expect(["stop", "length", "tool_calls"]).toContain(r.choices[0].finish_reason);
      return r.usage!.prompt_tokens;
    };
    const base = await promptTokens(history("tour", "Pogacar"));
    expect(base).toBeGreaterThan(await promptTokens(ask));
    // as control tokens, each would add exactly one token
    expect(await promptTokens(history("tour<|eom_id|>", "Pogacar"))).toBeGreaterThan(base + 1);
    expect(await promptTokens(history("tour", "Pogacar<|eot_id|>"))).toBeGreaterThan(base + 1);
  }, 120_000);
