// Chat templates: the model's own Jinja template from its GGUF (tokenizer.chat_template),
// rendered with @huggingface/jinja as transformers' apply_chat_template renders it (same globals:
// bos_token, eos_token, add_generation_prompt, raise_exception, strftime_now, tools), or the
// family's template when the GGUF has none (fallback.ts). Tools and tool calls reach the template
// in transformers' shapes: tools as [{"type": "function", "function": {name, description,
// parameters}}], an assistant's calls as tool_calls [{"type": "function", "id", "function":
// {name, arguments}}] with the arguments parsed into an object, a result as {"role": "tool",
// "content", "tool_call_id"}.
//
// Tokenizing the rendered prompt: the template's own text is tokenized with control tokens parsed
// (its `<start_of_turn>` is the control token), the messages' text without (a user who types
// `<start_of_turn>` gets those characters, not a turn marker). To know which characters came
// from a message, the template is rendered a second time with a placeholder for each message's
// content; the text between placeholders is the template's, and the real rendering is matched
// against it piece by piece. BOS is added only when the template did not write it itself.
import { Environment, Interpreter, Template } from "@huggingface/jinja";
import { InferError, quote } from "../errors.ts";
import type { Tokenizer } from "../tokenizer/index.ts";
import { ControlTextGuard } from "./control-text.ts";
import { CHATML_TEMPLATE, GEMMA_TEMPLATE, LLAMA3_TEMPLATE } from "./fallback.ts";
import { argumentsValue, type ToolCall, type ToolFunction } from "./tools.ts";

export type Role = "system" | "user" | "assistant" | "tool";

export interface ChatMessage {
  readonly role: Role;
  readonly content: string;
  /** An assistant's calls of tools. */
  readonly toolCalls?: readonly ToolCall[];
  /** A tool's message: the call it answers. */
  readonly toolCallId?: string;
}

export interface RenderOptions {
  /** End with the header of the assistant's next turn (default true). */
  readonly addGenerationPrompt?: boolean;
  /** The clock strftime_now reads (default: now). */
  readonly now?: Date;
  /** The functions the model may call, for templates that describe them. */
  readonly tools?: readonly ToolFunction[];
  /** Llama 3.1's built-in tools among them (its template's builtin_tools), if any. */
  readonly builtinTools?: readonly string[];
}

/** A message in the shape transformers hands templates. */
function templateMessage(m: ChatMessage, content: string): Record<string, unknown> {
  const out: Record<string, unknown> = { role: m.role, content };
  if (m.toolCalls !== undefined && m.toolCalls.length > 0) {
    out.tool_calls = m.toolCalls.map((c) => ({ type: "function", id: c.id,
      function: { name: c.name, arguments: argumentsValue(c.arguments) } }));
  }
  if (m.toolCallId !== undefined) out.tool_call_id = m.toolCallId;
  return out;
}

function templateTools(tools: readonly ToolFunction[] | undefined): unknown {
  if (tools === undefined || tools.length === 0) return null;
  return tools.map((t) => ({ type: "function", function: { name: t.name,
    ...(t.description === undefined ? {} : { description: t.description }),
    parameters: t.parameters } }));
}

/** Where a template came from: the model file, or infer's fallback for its family. */
export type TemplateOrigin = "gguf" | "gemma" | "llama3" | "chatml";

const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
  "September", "October", "November", "December"];
const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];

/** Python's datetime.strftime in the C locale, for the directives chat templates use. */
export function strftime(date: Date, format: string): string {
  const pad = (n: number, w = 2) => String(n).padStart(w, "0");
  return format.replace(/%[aAbBdHIjmMpSyY%]/g, (d) => {
    switch (d) {
      case "%a": return DAYS[date.getDay()].slice(0, 3);
      case "%A": return DAYS[date.getDay()];
      case "%b": return MONTHS[date.getMonth()].slice(0, 3);
      case "%B": return MONTHS[date.getMonth()];
      case "%d": return pad(date.getDate());
      case "%H": return pad(date.getHours());
      case "%I": return pad(((date.getHours() + 11) % 12) + 1);
      case "%j": {
        const start = new Date(date.getFullYear(), 0, 1);
        return pad(Math.floor((date.getTime() - start.getTime()) / 86_400_000) + 1, 3);
      }
      case "%m": return pad(date.getMonth() + 1);
      case "%M": return pad(date.getMinutes());
      case "%p": return date.getHours() < 12 ? "AM" : "PM";
      case "%S": return pad(date.getSeconds());
      case "%y": return pad(date.getFullYear() % 100);
      case "%Y": return String(date.getFullYear());
      default: return "%";
    }
  });
}

/**
 * Values all range() calls of one rendering may give: a template comes from the model file,
 * and range(10**9), or two nested range(30000), would hold the engine for minutes (a million
 * loop steps take the interpreter 1.6 s). Real templates loop over the messages.
 */
const RANGE_VALUES_MAX = 100_000;

/** Python's range(), as Jinja offers it, drawing on one rendering's `budget` of values. */
function range(budget: { left: number }, start: number, stop?: number, step = 1): number[] {
  if (stop === undefined) { stop = start; start = 0; }
  if (step === 0) throw new InferError("invalid_argument", "chat template: range() step is zero");
  const count = Math.max(0, Math.ceil((stop - start) / step));
  if (!(count <= budget.left)) {
    throw new InferError("invalid_argument", `chat template: its range() calls give more ` +
      `than ${RANGE_VALUES_MAX} values`);
  }
  budget.left -= count;
  const out: number[] = [];
  for (let i = start; step > 0 ? i < stop : i > stop; i += step) out.push(i);
  return out;
}

type Value = { value: unknown; __bool__(): { value: boolean } };
interface InterpreterInside {
  applyFilter(operand: Value, filter: FilterNode, env: Environment): Value;
  evaluate(node: unknown, env: Environment): Value;
}
type FilterNode = { type: string; callee?: { type: string; value: string }; args?: unknown[] };

/**
 * Jinja's select and reject filters (`list | reject('equalto', x)`, which Llama 3.1's template
 * applies to builtin_tools), which @huggingface/jinja lacks: the interpreter's filter step,
 * extended for them, the rest left to it. (The step is private to the library, so it is
 * replaced on the instance; chat-template.test.ts renders Llama 3.1's template through it.)
 */
function withSelectFilters(interpreter: Interpreter): Interpreter {
  const inside = interpreter as unknown as InterpreterInside;
  const base = inside.applyFilter.bind(inside);
  inside.applyFilter = (operand, filter, env) => {
    const name = filter.type === "CallExpression" ? filter.callee?.value : undefined;
    if ((name !== "select" && name !== "reject") || !Array.isArray(operand.value)) {
      return base(operand, filter, env);
    }
    const [test, ...args] = (filter.args ?? []).map((a) => inside.evaluate(a, env));
    const fn = env.tests.get(String(test?.value));
    if (test !== undefined && !fn) throw new Error(`Unknown test: ${String(test.value)}`);
    const keep = (operand.value as Value[]).filter((item) =>
      (fn ? (fn as (...v: Value[]) => boolean)(item, ...args) : item.__bool__().value) ===
        (name === "select"));
    const Ctor = operand.constructor as new (v: Value[]) => Value;
    return new Ctor(keep);
  };
  return interpreter;
}

// Private-use characters bracket each placeholder; no tokenizer sees them.
const OPEN = "\uE000", CLOSE = "\uE001";
const PLACEHOLDER = /\uE000(\d+)\uE001/g;

export class ChatTemplate {
  private readonly template: Template;

  constructor(readonly source: string, readonly origin: TemplateOrigin,
    private readonly specials: { readonly bos?: string; readonly eos?: string } = {}) {
    try {
      this.template = new Template(source);
    } catch (err) {
      const why = (err as Error).message;
      throw new InferError("bad_model", `the chat template does not parse: ${quote(why)}`);
    }
  }

  /** The prompt text, as transformers' apply_chat_template(tokenize=False) gives it. */
  render(messages: readonly ChatMessage[], options: RenderOptions = {}): string {
    const env = new Environment();
    const now = options.now ?? new Date();
    const globals: Record<string, unknown> = {
      false: false, true: true, none: null, False: false, True: true, None: null,
      range: range.bind(null, { left: RANGE_VALUES_MAX }),
      raise_exception: (message: unknown) => {
        throw new InferError("invalid_argument", `chat template: ${quote(String(message))}`);
      },
      strftime_now: (format: string) => strftime(now, format),
      messages: messages.map((m) => templateMessage(m, m.content)),
      add_generation_prompt: options.addGenerationPrompt ?? true,
      tools: templateTools(options.tools), documents: null,
    };
    // (templates test whether builtin_tools is defined)
    if (options.builtinTools?.length) globals.builtin_tools = [...options.builtinTools];
    if (this.specials.bos !== undefined) globals.bos_token = this.specials.bos;
    if (this.specials.eos !== undefined) globals.eos_token = this.specials.eos;
    for (const [k, v] of Object.entries(globals)) env.set(k, v);
    try {
      return withSelectFilters(new Interpreter(env)).run(this.template.parsed).value as string;
    } catch (err) {
      if (err instanceof InferError) throw err;
      throw new InferError("invalid_argument", `chat template: ${quote((err as Error).message)}`);
    }
  }

  /**
   * The prompt's tokens: control tokens parsed in the template's text only, BOS added when the
   * tokenizer asks for it and the template did not write it.
   */
  encode(tokenizer: Tokenizer, messages: readonly ChatMessage[],
    options: RenderOptions = {}): number[] {
    // Everything the conversation brings is guarded (control-text.ts); the contents are also
    // found in the rendering, so that a template's own text alone makes control tokens.
    const guard = new ControlTextGuard(tokenizer);
    const safe = messages.map((m) => ({ ...m, content: guard.hide(m.content),
      ...(m.toolCallId === undefined ? {} : { toolCallId: guard.hide(m.toolCallId) }),
      ...(m.toolCalls === undefined ? {} : { toolCalls: m.toolCalls.map((c) => ({
        id: guard.hide(c.id), name: guard.hide(c.name), arguments: guard.hide(c.arguments) })) }),
    }));
    const safeOptions = options.tools === undefined ? options
      : { ...options, tools: guard.hideAll(options.tools) };
    const hidden = this.render(safe, safeOptions);
    const spans = this.contentSpans(hidden, safe, safeOptions);
    const { text, marks } = guard.reveal(hidden);
    const fromTemplate = (start: number, end: number) =>
      spans.every(([s, e]) => end <= s || start >= e) &&
      !marks.some((at) => at >= start && at < end);
    const tokens = tokenizer.encode(text, { addSpecial: false, parseSpecial: fromTemplate });
    const bos = tokenizer.bos;
    if (tokenizer.addBos && bos !== null && tokens[0] !== bos) tokens.unshift(bos);
    return tokens;
  }

  /** Spans [start, end) of `text` that hold the messages' contents. */
  contentSpans(text: string, messages: readonly ChatMessage[],
    options: RenderOptions = {}): [number, number][] {
    // (an empty content stays empty: templates test it, as Qwen's does before a tool call)
    const placeholders = messages.map((m, i) =>
      ({ ...m, content: m.content === "" ? "" : `${OPEN}${i}${CLOSE}` }));
    const marked = this.render(placeholders, options);
    const pieces: string[] = [];
    const order: number[] = [];
    let last = 0;
    for (const m of marked.matchAll(PLACEHOLDER)) {
      pieces.push(marked.slice(last, m.index));
      order.push(Number(m[1]));
      last = m.index! + m[0].length;
    }
    pieces.push(marked.slice(last));
    const contents = order.map((i) => messages[i].content);
    return matchPieces(text, pieces, contents) ?? searchContents(text, messages);
  }
}

/**
 * Reads `text` as pieces[0] content[0] pieces[1] … pieces[n], where each content is the message
 * as written or trimmed (templates often `| trim` it); null if the text does not read so.
 */
function matchPieces(text: string, pieces: readonly string[],
  contents: readonly string[]): [number, number][] | null {
  if (!text.startsWith(pieces[0])) return null;
  let at = pieces[0].length;
  const spans: [number, number][] = [];
  for (let i = 0; i < contents.length; i++) {
    const c = contents[i], next = pieces[i + 1], isLast = i + 1 === contents.length;
    const found = [c, c.trim(), c.trimStart(), c.trimEnd()].find((v) =>
      text.startsWith(v, at) && text.startsWith(next, at + v.length) &&
      (!isLast || at + v.length + next.length === text.length));
    if (found === undefined) return null;
    spans.push([at, at + found.length]);
    at += found.length + next.length;
  }
  return at === text.length ? spans : null;
}

/** A template that rewrites contents (splits, replaces): find each, in order, as best we can. */
function searchContents(text: string, messages: readonly ChatMessage[]): [number, number][] {
  const spans: [number, number][] = [];
  let from = 0;
  for (const m of messages) {
    for (const v of [m.content, m.content.trim()]) {
      if (v.length === 0) continue;
      const at = text.indexOf(v, from);
      if (at < 0) continue;
      spans.push([at, at + v.length]);
      from = at + v.length;
      break;
    }
  }
  return spans;
}

/** A single control token spelled `text` in this vocabulary, or null. */
export function controlToken(tokenizer: Tokenizer, text: string): number | null {
  const ids = tokenizer.encode(text, { addSpecial: false, parseSpecial: true });
  if (ids.length !== 1 || tokenizer.decode(ids) !== "") return null;
  return ids[0];
}

/** The model's chat template, or its family's when the GGUF carries none. */
export function chatTemplateFor(metadata: ReadonlyMap<string, unknown>,
  tokenizer: Tokenizer): ChatTemplate {
  const specials = {
    bos: tokenizer.bos === null ? undefined : tokenizer.tokenText(tokenizer.bos),
    eos: tokenizer.eos === null ? undefined : tokenizer.tokenText(tokenizer.eos),
  };
  const own = metadata.get("tokenizer.chat_template");
  if (typeof own === "string" && own.trim() !== "") return new ChatTemplate(own, "gguf", specials);
  const arch = String(metadata.get("general.architecture") ?? "");
  const has = (t: string) => controlToken(tokenizer, t) !== null;
  if (/^gemma/.test(arch) && has("<start_of_turn>")) {
    return new ChatTemplate(GEMMA_TEMPLATE, "gemma", specials);
  }
  if (has("<|start_header_id|>") && has("<|eot_id|>")) {
    return new ChatTemplate(LLAMA3_TEMPLATE, "llama3", specials);
  }
  if (has("<|im_start|>")) return new ChatTemplate(CHATML_TEMPLATE, "chatml", specials);
  throw new InferError("unsupported", `the model has no chat template (tokenizer.chat_template) ` +
    `and infer has none for its family (${quote(arch)}); use the plain prompt command instead`);
}

/**
 * Control tokens that open or close a turn in this template: generation stops at them, so a
 * model that does not emit end-of-generation still ends its answer where the next turn begins.
 */
export function turnTokens(template: ChatTemplate, tokenizer: Tokenizer): number[] {
  const markers = ["<start_of_turn>", "<end_of_turn>", "<|im_start|>", "<|im_end|>",
    "<|start_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|user|>", "<|assistant|>"];
  const out: number[] = [];
  for (const m of markers) {
    if (!template.source.includes(m)) continue;
    const id = controlToken(tokenizer, m);
    if (id !== null) out.push(id);
  }
  return out;
}
