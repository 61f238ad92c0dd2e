// Tool calls: how a model's chat template asks for them, the grammar that makes a call well
// formed, and how calls are read back out of the generated text.
//
// Three formats, chosen from the template's text:
//   hermes   Qwen 2.5 / 3 (and other Hermes-style templates): <tool_call>\n{"name": ...,
//            "arguments": {...}}\n</tool_call>, several in a row, text around them allowed.
//   llama3   Llama 3.1+ templates: the whole answer is {"name": ..., "parameters": {...}}.
//   generic  a template without tools (Gemma, ChatML, Llama 3.0): the tools are described in
//            the system turn, and the answer is constrained to {"name": ..., "arguments": ...}
//            (or, when the model may choose, {"response": "..."}), as llama.cpp's generic
//            tool-call format does.
// With tool_choice "required" or a named function the output is constrained by a grammar built
// from the functions' parameter schemas, so its arguments always parse and validate; with
// "auto" (hermes and llama3) the model writes freely and calls are parsed out of its text.
import { InferError, quote } from "../errors.ts";
import { checkJsonDocument, compileSchema, type JsonNode } from "../sample/json-schema.ts";
import type { ChatMessage } from "./template.ts";

export { ToolCallReader, type ParsedAnswer, type ToolCallDelta } from "./tool-reader.ts";

export interface ToolFunction {
  readonly name: string;
  readonly description?: string;
  /** A JSON schema of the arguments object. */
  readonly parameters: object;
}

export type ToolChoice = "auto" | "none" | "required" | { readonly name: string };

export interface ToolCall {
  readonly id: string;
  readonly name: string;
  /** The arguments as a JSON text (as OpenAI sends them). */
  readonly arguments: string;
}

export type ToolCallFormat = "hermes" | "llama3" | "generic";

/** How a call looks in the text: the JSON object around the arguments, and its wrapper. */
export interface CallShape {
  readonly argumentsKey: "arguments" | "parameters";
  readonly prefix: string;
  readonly suffix: string;
}

const SHAPES: Record<ToolCallFormat, CallShape> = {
  hermes: { argumentsKey: "arguments", prefix: "<tool_call>\n", suffix: "\n</tool_call>" },
  llama3: { argumentsKey: "parameters", prefix: "", suffix: "" },
  generic: { argumentsKey: "arguments", prefix: "", suffix: "" },
};

/** The template's own tool-call format, or generic where it renders no tools. */
export function toolCallFormat(templateSource: string): ToolCallFormat {
  if (!/\btools\b/.test(templateSource)) return "generic";
  if (templateSource.includes("<tool_call>")) return "hermes";
  if (templateSource.includes("<|start_header_id|>") && templateSource.includes('"parameters"')) {
    return "llama3";
  }
  return "generic";
}

export const shapeOf = (format: ToolCallFormat): CallShape => SHAPES[format];

/** The functions a choice allows. */
export function chosenFunctions(tools: readonly ToolFunction[],
  choice: ToolChoice): readonly ToolFunction[] {
  if (typeof choice === "object") return tools.filter((t) => t.name === choice.name);
  return choice === "none" ? [] : tools;
}

/** Whether the output is held to the grammar (a call, or generic's call-or-response). */
export function constrained(format: ToolCallFormat, choice: ToolChoice): boolean {
  return choice === "required" || typeof choice === "object" ||
    (choice === "auto" && format === "generic");
}

const utf8 = new TextEncoder();
const key = (name: string) => utf8.encode(JSON.stringify(name));

/**
 * The grammar of one call to any of `functions`: {"name": one of them, "<arguments>": its
 * parameters}, each function an alternative. With `orResponse`, {"response": string} too.
 * A function's schema that the grammar cannot enforce is refused, naming the function.
 */
export function callNode(functions: readonly ToolFunction[], shape: CallShape,
  orResponse = false): JsonNode {
  const options: JsonNode[] = functions.map((f) => {
    let args: JsonNode;
    try {
      args = compileSchema(f.parameters);
    } catch (err) {
      if (err instanceof InferError) {
        throw new InferError(err.code, `tool ${quote(f.name)}: ${err.message}`);
      }
      throw err;
    }
    return {
      kind: "object", additional: null, props: [
        { name: "name", key: key("name"), required: true,
          node: { kind: "literal", values: [key(f.name)] } },
        { name: shape.argumentsKey, key: key(shape.argumentsKey), required: true, node: args },
      ],
    };
  });
  if (orResponse) {
    options.push({ kind: "object", additional: null, props: [
      { name: "response", key: key("response"), required: true, node: { kind: "string" } }] });
  }
  return options.length === 1 ? options[0] : { kind: "union", options };
}

/**
 * The system turn's text for a template without tools (generic format): the functions, and the
 * shape of an answer. `mayRespond`: the model may answer in words instead.
 */
export function genericToolPrompt(functions: readonly ToolFunction[], mayRespond: boolean): string {
  const list = functions.map((f) => JSON.stringify({ name: f.name,
    ...(f.description === undefined ? {} : { description: f.description }),
    parameters: f.parameters }, null, 2)).join("\n");
  const call = '{"name": "<function name>", "arguments": {<its arguments>}}';
  return "You can call the following functions:\n" + list + "\n\n" + (mayRespond
    ? `To call one, answer with the JSON object ${call}; to answer the user directly, ` +
      'answer with {"response": "<your answer>"}.'
    : `Call one of them: answer with the JSON object ${call}.`);
}

/**
 * A call's arguments as templates expect them: the object, or the text if it does not parse or
 * nests past what the template's recursive tojson may walk.
 */
export function argumentsValue(text: string): unknown {
  try {
    const value: unknown = JSON.parse(text);
    checkJsonDocument(value);
    return value;
  } catch {
    return text;
  }
}

/** A call as the generic format writes it: {"name", "arguments"} on one line. */
function genericCall(c: ToolCall): string {
  return JSON.stringify({ name: c.name, arguments: argumentsValue(c.arguments) });
}

/**
 * The conversation as a template without tools renders it: the tools described in the system
 * turn, an assistant's calls as the JSON it answered with, and tool results (consecutive ones
 * together) as the user's turn, each {"tool_call_id", "content"} on a line.
 */
export function genericMessages(messages: readonly ChatMessage[], prompt: string | null,
): ChatMessage[] {
  const out: ChatMessage[] = [];
  const rest = messages[0]?.role === "system" ? messages.slice(1) : messages;
  const system = messages[0]?.role === "system" ? messages[0].content : null;
  if (prompt !== null || system !== null) {
    out.push({ role: "system",
      content: [system, prompt].filter((t): t is string => t !== null).join("\n\n") });
  }
  for (const m of rest) {
    if (m.role === "tool") {
      const line = JSON.stringify({ tool_call_id: m.toolCallId ?? null, content: m.content });
      const last = out[out.length - 1];
      if (last?.role === "user" && last.toolCallId === "") {
        out[out.length - 1] = { ...last, content: last.content + "\n" + line };
      } else out.push({ role: "user", content: line, toolCallId: "" }); // "": results merged here
      continue;
    }
    if (m.role === "assistant" && m.toolCalls !== undefined && m.toolCalls.length > 0) {
      const calls = m.toolCalls.map(genericCall).join("\n");
      out.push({ role: "assistant", content: m.content === "" ? calls : m.content + "\n" + calls });
      continue;
    }
    out.push({ role: m.role, content: m.content });
  }
  // The marker of merged results is not the template's business.
  return out.map((m) => (m.toolCallId === "" ? { role: m.role, content: m.content } : m));
}

/** What a chat job's tools mean for its prompt, its output and the reading of its answer. */
export interface ToolPlan {
  readonly format: ToolCallFormat;
  /** The conversation as the template renders it. */
  readonly messages: readonly ChatMessage[];
  /** The tools the template describes (its own format); none for the generic one. */
  readonly renderTools?: readonly ToolFunction[];
  /** Llama 3.1: the built-in tools among them, called as <|python_tag|>name.call(...). */
  readonly builtinTools?: readonly string[];
  /** The output's grammar, where it is constrained. */
  readonly grammar: { readonly node: JsonNode; readonly prefix: string;
    readonly suffix: string } | null;
  /** Read calls out of the answer. */
  readonly parse: boolean;
}

export function planTools(templateSource: string, messages: readonly ChatMessage[],
  tools: readonly ToolFunction[] | undefined, choice: ToolChoice = "auto"): ToolPlan {
  const format = toolCallFormat(templateSource);
  const history = (prompt: string | null) =>
    format === "generic" ? genericMessages(messages, prompt) : messages;
  if (tools === undefined || tools.length === 0 || choice === "none") {
    return { format, messages: history(null), grammar: null, parse: false };
  }
  const functions = chosenFunctions(tools, choice);
  if (functions.length === 0) {
    throw new InferError("invalid_argument", `tool choice: no tool is named ` +
      `${quote((choice as { name: string }).name)}`);
  }
  const shape = SHAPES[format];
  const grammar = constrained(format, choice) ? {
    node: callNode(functions, shape, format === "generic" && choice === "auto"),
    prefix: shape.prefix, suffix: shape.suffix,
  } : null;
  return format === "generic"
    ? { format, messages: history(genericToolPrompt(functions, choice === "auto")), grammar,
      parse: true }
    : { format, messages, renderTools: tools, grammar, parse: true,
      ...(format === "llama3" && templateSource.includes("builtin_tools")
        ? { builtinTools: builtinTools(tools) } : {}) };
}

/**
 * Llama 3.1's built-in tools among `tools`, as llama.cpp names them to the template: brave_search,
 * web_search and wolfram_alpha (called with a query), python or code_interpreter (code, which the
 * template calls code_interpreter and the model writes after <|python_tag|> as it is).
 */
export function builtinTools(tools: readonly ToolFunction[]): string[] {
  const out = new Set<string>();
  for (const t of tools) {
    if (["brave_search", "web_search", "wolfram_alpha"].includes(t.name)) out.add(t.name);
    else if (t.name === "python" || t.name === "code_interpreter") out.add("code_interpreter");
  }
  return [...out];
}
