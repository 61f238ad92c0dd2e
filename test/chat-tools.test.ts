// Method: the pieces of tool calling on their own — calls read out of Qwen's, Llama 3.1's (JSON,
// <|python_tag|> built-in calls and code) and the generic format's text (whole, and fed in pieces
// of 1, 2 and 7 characters, which must give the same calls and text, with nothing of a call shown
// as text, each call streamed as a first delta naming it and argument fragments that join into
// its arguments), Llama 3.1's built-in tools, the grammar with its <tool_call> wrapper (texts it
// accepts and refuses), the prompt of the generic format — then the library's
// chat.send with tools on a tiny random Gemma 3 (generic format; on the real default model too
// where it is present): the grammar's calls validate (ajv), and tool results sent back join the
// conversation.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Ajv from "ajv";
import { loadModel } from "../ts/api/index.ts";
import { builtinTools, callNode, planTools, shapeOf, ToolCallReader, type ToolCallDelta,
  type ToolCallFormat, type ToolFunction } from "../ts/chat/tools.ts";
import { defaultModelPath } from "../ts/models/cache.ts";
import { JsonGrammar } from "../ts/sample/json-grammar.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const WEATHER: ToolFunction = { name: "get_weather", description: "The weather in a city.",
  parameters: { type: "object", properties: { city: { type: "string" },
    unit: { type: "string", enum: ["celsius", "fahrenheit"] } }, required: ["city", "unit"] } };
const TIME: ToolFunction = { name: "get_time", parameters: { type: "object", properties: {} } };

function readWhole(format: ToolCallFormat, text: string) {
  const r = new ToolCallReader(format);
  r.feed(text);
  r.end();
  return { content: r.content, calls: r.calls.map(({ name, arguments: a }) => ({ name, a })) };
}

/** Fed in `size`-character pieces; the deltas must stream each call as a client joins them. */
function readInPieces(format: ToolCallFormat, text: string, size = 1) {
  const r = new ToolCallReader(format);
  let shown = "";
  const deltas: ToolCallDelta[] = [];
  const chars = [...text];
  for (let i = 0; i < chars.length; i += size) {
    const p = r.feed(chars.slice(i, i + size).join(""));
    shown += p.content;
    deltas.push(...p.deltas);
  }
  const last = r.end();
  shown += last.content;
  deltas.push(...last.deltas);
  expect(shown).toBe(r.content);
  r.calls.forEach((call, i) => {
    const mine = deltas.filter((d) => d.index === i);
    expect(mine[0]).toEqual({ index: i, id: call.id, name: call.name, arguments: "" });
    expect(mine.slice(1).every((d) => d.id === undefined && d.arguments !== "")).toBe(true);
    expect(mine.map((d) => d.arguments).join("")).toBe(call.arguments);
  });
  expect(deltas.filter((d) => d.id !== undefined)).toHaveLength(r.calls.length);
  return { content: r.content, calls: r.calls.map(({ name, arguments: a }) => ({ name, a })),
    fragments: deltas.length - r.calls.length };
}

describe("reading calls out of an answer", () => {
  const cases: [ToolCallFormat, string, string, { name: string; a: string }[]][] = [
    ["hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": ' +
      '"Paris", "unit": "celsius"}}\n</tool_call>', "Let me check.",
    [{ name: "get_weather", a: '{"city":"Paris","unit":"celsius"}' }]],
    ["hermes", '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n' +
      '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>',
    "", [{ name: "get_time", a: "{}" },
      { name: "get_weather", a: '{"city":"Oslo","unit":"celsius"}' }]],
    ["hermes", "a < b, and <tool_ is not a call", "a < b, and <tool_ is not a call", []],
    ["hermes", "<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []],
    ["llama3", '{"name": "get_time", "parameters": {}}', "", [{ name: "get_time", a: "{}" }]],
    ["llama3", "It is sunny.", "It is sunny.", []],
    ["generic", '{"name": "get_time", "arguments": {"zone": "UTC"}}', "",
      [{ name: "get_time", a: '{"zone":"UTC"}' }]],
    ["generic", '{"response": "Hello there"}', "Hello there", []],
    // keys in another order, "type", a string of JSON as the arguments, text after a call
    ["hermes", '<tool_call>\n{"arguments": {"a": [1, 2]}, "type": "function", "name": "f"}\n' +
      "</tool_call>\nDone.", "Done.", [{ name: "f", a: '{"a":[1,2]}' }]],
    ["hermes", '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>', "",
      [{ name: "f", a: '{"x": 1}' }]],
    // control-token and wrapper text inside the arguments' strings is the arguments' text
    ["hermes", '<tool_call>\n{"name": "f", "arguments": {"s": "</tool_call> <|im_end|> \\" }' +
      '<tool_call>"}}\n</tool_call>', "", [{ name: "f", a: '{"s":"</tool_call> <|im_end|> ' +
      '\\" }<tool_call>"}' }]],
    ["llama3", '{"name": "f", "parameters": {"s": "<|eot_id|><|python_tag|>{"}}', "",
      [{ name: "f", a: '{"s":"<|eot_id|><|python_tag|>{"}' }]],
    ["generic", '{"response": "a \\"quoted\\" <|im_end|>\\n\\u00e9"}', 'a "quoted" <|im_end|>\né',
      []],
    // Llama 3.1: <|python_tag|> opens a JSON call, a built-in tool's call, or code
    ["llama3", '<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}', "",
      [{ name: "get_time", a: '{"zone":"UTC"}' }]],
    ["llama3", '<|python_tag|>brave_search.call(query="Tour de France \\"2024\\" winner")', "",
      [{ name: "brave_search", a: '{"query":"Tour de France \\"2024\\" winner"}' }]],
    ["llama3", "<|python_tag|>wolfram_alpha.call(query='2+2', digits=3, exact=True)", "",
      [{ name: "wolfram_alpha", a: '{"query":"2+2","digits":3,"exact":true}' }]],
    ["llama3", "Let me run it.<|python_tag|>import math\nprint(math.pi)\n\n", "Let me run it.",
      [{ name: "python", a: '{"code":"import math\\nprint(math.pi)"}' }]],
    ["llama3", "<|python_tag|>x", "", [{ name: "python", a: '{"code":"x"}' }]],
    // cut short: a call once begun stays one, its arguments as far as they came
    ["hermes", '<tool_call>\n{"name": "f", "arguments": {"city": "Par', "",
      [{ name: "f", a: '{"city":"Par' }]],
    ["llama3", '{"name": "f", "param', '{"name": "f", "param', []],
    ["llama3", '{"city": "Paris"}', '{"city": "Paris"}', []],
    ["llama3", '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"a": 1}}', "",
      [{ name: "f", a: "{}" }, { name: "g", a: '{"a":1}' }]],
  ];
  for (const [format, text, content, calls] of cases) {
    test(`${format}: ${JSON.stringify(text).slice(0, 60)}`, () => {
      expect(readWhole(format, text)).toEqual({ content, calls });
      for (const size of [1, 2, 7]) {
        const { fragments: _, ...read } = readInPieces(format, text, size);
        expect(read).toEqual({ content, calls });
      }
    });
  }

  test("arguments stream in fragments as they are written, not once the call is complete", () => {
    const text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", ' +
      '"unit": "celsius"}}\n</tool_call>';
    const r = new ToolCallReader("hermes");
    let at = 0;
    for (const ch of text) {
      const p = r.feed(ch);
      at += p.deltas.map((d) => d.arguments).join("").length;
      if (text.indexOf('"unit"') > 0 && r.calls.length === 0 && ch === "P") {
        expect(at).toBeGreaterThan(0); // "Paris" has begun while the call is not complete
      }
    }
    r.end();
    expect(readInPieces("hermes", text).fragments).toBeGreaterThan(20);
  });
});

test("Llama 3.1: its built-in tools among the functions are named to its template", () => {
  const source = (name: string) =>
    readFileSync(join(import.meta.dir, "fixtures", "chat-templates", `${name}.jinja`), "utf8");
  const fn = (name: string, key: string): ToolFunction => ({ name, parameters: { type: "object",
    properties: { [key]: { type: "string" } }, required: [key] } });
  const tools = [fn("brave_search", "query"), fn("python", "code"), WEATHER];
  expect(builtinTools(tools)).toEqual(["brave_search", "code_interpreter"]);
  const ask = [{ role: "user" as const, content: "Search it." }];
  const plan = planTools(source("llama3.1"), ask, tools);
  expect(plan.format).toBe("llama3");
  expect(plan.builtinTools).toEqual(["brave_search", "code_interpreter"]);
  // Llama 3.2's template has no built-in tools
  expect(planTools(source("llama3.2"), ask, tools).builtinTools).toBeUndefined();
});

describe("the grammar of a call", () => {
  // The grammar on a byte-level vocabulary: feed bytes and ask whether each text is accepted.
  const accepts = (format: ToolCallFormat, tools: ToolFunction[], text: string) => {
    const shape = shapeOf(format);
    const g = new JsonGrammar({ vocabSize: 0, tokenBytes: () => new Uint8Array(),
      isEndOfGeneration: () => false } as never, callNode(tools, shape), shape);
    return g.advance(new TextEncoder().encode(text)) && g.done;
  };
  test("hermes: the wrapper, one of the named functions, arguments that validate", () => {
    const ok = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": ' +
      '"celsius"}}\n</tool_call>';
    expect(accepts("hermes", [WEATHER, TIME], ok)).toBe(true);
    expect(accepts("hermes", [WEATHER, TIME],
      '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')).toBe(true);
    expect(accepts("hermes", [WEATHER], ok.replace("<tool_call>\n", ""))).toBe(false);
    expect(accepts("hermes", [WEATHER], ok.replace("celsius", "kelvin"))).toBe(false);
    expect(accepts("hermes", [WEATHER], ok.replace('"city": "Rome", ', ""))).toBe(false);
    expect(accepts("hermes", [TIME], ok)).toBe(false);
  });
  test("llama3: {name, parameters}; generic: {name, arguments}", () => {
    expect(accepts("llama3", [TIME], '{"name": "get_time", "parameters": {}}')).toBe(true);
    expect(accepts("llama3", [TIME], '{"name": "get_time", "arguments": {}}')).toBe(false);
    expect(accepts("generic", [TIME], '{"name": "get_time", "arguments": {}}')).toBe(true);
  });
  test("a template's format decides the plan; a schema the grammar cannot enforce is named", () => {
    const msgs = [{ role: "user" as const, content: "hi" }];
    expect(planTools("{{ messages }}", msgs, [TIME], "auto").grammar).not.toBeNull();
    expect(planTools("{% if tools %}<tool_call>{% endif %}", msgs, [TIME], "auto").grammar)
      .toBeNull();
    const generic = planTools("{{ messages }}", msgs, [TIME], "required");
    expect(generic.messages[0].role).toBe("system");
    expect(generic.messages[0].content).toContain('"get_time"');
    const bad = { name: "f", parameters: { type: "string", pattern: "a" } };
    expect(() => planTools("x", msgs, [bad], "required")).toThrow(/tool "f".*pattern/);
  });
});

const dir = mkdtempSync(join(tmpdir(), "infer-chat-tools-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const tiny = join(dir, "tiny.gguf");
writeFileSync(tiny, tinyGemma3Gguf());
const ajv = new Ajv({ strict: false });
const validWeather = ajv.compile(WEATHER.parameters);

for (const [name, path] of [["a tiny random Gemma 3", tiny], ["the default model",
  defaultModelPath()]] as const) {
  test.skipIf(!existsSync(path))(`chat.send with tools on ${name}`, async () => {
    const model = await loadModel(path, { threads: 2, contextLength: 2048 });
    try {
      const chat = model.chat({ system: "You help with the weather." });
      const reply = await chat.send("What is the weather in Paris?", { tools: [WEATHER, TIME],
        toolChoice: { name: "get_weather" }, temperature: 0, maxTokens: 200 });
      expect(reply.finishReason).toBe("toolCalls");
      expect(reply.toolCalls).toHaveLength(1);
      const call = reply.toolCalls[0];
      expect(call.name).toBe("get_weather");
      expect(validWeather(JSON.parse(call.arguments))).toBe(true);
      expect(reply.messages.at(-1)).toEqual({ role: "assistant", content: reply.text,
        toolCalls: reply.toolCalls });
      const answer = await chat.send({ toolResults: [{ id: call.id, content: "18 C, cloudy" }] },
        { tools: [WEATHER, TIME], toolChoice: "none", temperature: 0, maxTokens: 12 });
      expect(answer.toolCalls).toEqual([]);
      expect(answer.messages.at(-2)).toEqual({ role: "tool", content: "18 C, cloudy",
        toolCallId: call.id });
      expect(answer.messages.map((m) => m.role)).toEqual(["system", "user", "assistant", "tool",
        "assistant"]);
    } finally {
      await model.close();
    }
  }, 120_000);
}
