// The OpenAI-compatible request bodies, validated into the plain jobs the worker runs, and the
// log-probabilities of the answers in OpenAI's shapes. Every refusal is an ApiError naming the
// field, sent as OpenAI's error object:
//   {"error": {"message", "type", "param", "code"}}
// A field infer does not implement is refused by name, never silently ignored (see FIELDS).
import type { ChatMessage } from "../chat/template.ts";
import type { ToolCall, ToolChoice, ToolFunction } from "../chat/tools.ts";
import { InferError, quote } from "../errors.ts";
import { anyObject, checkJsonDocument, compileSchema, minLength } from "../sample/json-schema.ts";
import type { SamplerOptions } from "../sample/sampler.ts";
import { speculationModes, type SpeculationMode, type SpeculationOptions } from "../engine/speculation.ts";
import type { Job, LogprobEntry, ResponseFormat } from "../runtime/job.ts";
import type { ShiftPolicy } from "../engine/kv-cache.ts";

export type { Job, LogprobEntry, ResponseFormat };

export class ApiError extends Error {
  constructor(readonly status: number, message: string, readonly param: string | null = null,
    readonly code: string | null = null, readonly type = defaultType(status)) {
    super(message);
  }

  body(): { error: { message: string; type: string; param: string | null; code: string | null } } {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

function defaultType(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

export interface ParsedRequest {
  readonly model: string;
  readonly stream: boolean;
  readonly includeUsage: boolean;
  /** Choices asked for: each is a sequence of its own (seed + i when a seed is given). */
  readonly n: number;
  readonly job: Job;
}

type Body = Record<string, unknown>;

const bad = (param: string, message: string, code: string | null = "invalid_value") =>
  new ApiError(400, message, param, code);

function isObject(v: unknown): v is Body {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function number(body: Body, key: string, fallback: number, min: number, max: number): number {
  const v = body[key];
  if (v === undefined || v === null) return fallback;
  if (typeof v !== "number" || !Number.isFinite(v) || v < min || v > max) {
    throw bad(key, `'${key}' must be a number between ${min} and ${max}`);
  }
  return v;
}

function integer(body: Body, key: string, fallback: number, min: number, max: number): number {
  const v = number(body, key, fallback, min, max);
  if (!Number.isInteger(v)) throw bad(key, `'${key}' must be an integer`);
  return v;
}

/** A number in (0, max]. */
function positive(body: Body, key: string, fallback: number, max: number): number {
  const v = number(body, key, fallback, 0, max);
  if (v <= 0) throw bad(key, `'${key}' must be a number above 0 and at most ${max}`);
  return v;
}

function boolean(body: Body, key: string): boolean {
  const v = body[key];
  if (v === undefined || v === null) return false;
  if (typeof v !== "boolean") throw bad(key, `'${key}' must be a boolean`);
  return v;
}

/** Parses a request body's text: a JSON object, or 400. */
export function parseJson(text: string): Body {
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (err) {
    // (the parser's message may quote the body: escaped and cut like any client's text)
    throw new ApiError(400, `the body is not valid JSON: ${quote((err as Error).message, 160)}`,
      null, "invalid_json");
  }
  if (!isObject(data)) throw new ApiError(400, "the body must be a JSON object", null, "invalid_json");
  return data;
}

function stops(body: Body): string[] {
  const v = body.stop;
  if (v === undefined || v === null) return [];
  const list = typeof v === "string" ? [v] : v;
  if (!Array.isArray(list) || list.length > 4 ||
    !list.every((s) => typeof s === "string" && s.length > 0)) {
    throw bad("stop", "'stop' must be a non-empty string or an array of at most 4 of them");
  }
  return list as string[];
}

function logitBias(body: Body, vocabSize: number): Map<number, number> {
  const v = body.logit_bias;
  const out = new Map<number, number>();
  if (v === undefined || v === null) return out;
  if (!isObject(v)) throw bad("logit_bias", "'logit_bias' must be an object of token id → bias");
  for (const [k, b] of Object.entries(v)) {
    const id = Number(k);
    if (!/^\d+$/.test(k) || id >= vocabSize) {
      throw bad("logit_bias",
        `'logit_bias' key ${quote(k)} is not a token id (0..${vocabSize - 1})`);
    }
    if (typeof b !== "number" || !Number.isFinite(b) || b < -100 || b > 100) {
      throw bad("logit_bias", `'logit_bias' value for token ${k} must be a number in [-100, 100]`);
    }
    // As OpenAI documents: -100 bans the token, 100 all but forces it.
    out.set(id, b <= -100 ? -Infinity : b);
  }
  let banned = 0;
  for (const b of out.values()) if (b === -Infinity) banned++;
  if (banned === vocabSize) throw bad("logit_bias", "'logit_bias' bans every token");
  return out;
}

/** The response format, and the bytes in its shortest output (0: free text). */
function responseFormat(body: Body): { format: ResponseFormat; shortest: number } {
  const v = body.response_format;
  if (v === undefined || v === null) return { format: { type: "text" }, shortest: 0 };
  if (!isObject(v)) throw bad("response_format", "'response_format' must be an object");
  if (v.type === "text") return { format: { type: v.type }, shortest: 0 };
  if (v.type === "json_object") return { format: { type: v.type }, shortest: minLength(anyObject) };
  if (v.type !== "json_schema") {
    throw bad("response_format.type", "'response_format.type' must be text, json_object or json_schema");
  }
  const js = v.json_schema;
  if (!isObject(js) || !isObject(js.schema)) {
    throw bad("response_format.json_schema.schema",
      "'response_format.json_schema' must be an object with a 'schema' object");
  }
  let shortest: number;
  try {
    shortest = minLength(compileSchema(js.schema));
  } catch (err) {
    if (err instanceof InferError) {
      throw bad("response_format.json_schema.schema", err.message, "unsupported_schema");
    }
    throw err;
  }
  return { format: { type: "json_schema", schema: js.schema }, shortest };
}

/**
 * Structured output must fit its budget: the grammar allows a token only while the shortest
 * completion after it, at one token per byte, fits the tokens left (so output cut off by
 * max_tokens still parses), and so it needs at least as many tokens as its shortest output has
 * bytes. Anything less is refused here rather than cut short (the worker checks the context).
 */
function checkRoom(shortest: number, maxKey: string, maxTokens: number, limits: Limits): void {
  if (shortest > maxTokens && maxTokens >= 0) {
    throw bad(maxKey, `'${maxKey}' (${maxTokens}) is too small for the response format: its ` +
      `shortest output is ${shortest} bytes, and structured output needs a token per byte of ` +
      `it to be sure to finish; ask for at least ${shortest}`);
  }
  if (shortest > limits.contextLength - 1) {
    throw bad("response_format", `the response format's shortest output (${shortest} bytes, a ` +
      `token each) does not fit the context of ${limits.contextLength} tokens`,
    "context_length_exceeded");
  }
}

/**
 * The fields of a request body. Each endpoint reads its own; the OpenAI fields below are
 * accepted and ignored, because ignoring them changes nothing a client can see:
 *   user, safety_identifier   an end user's id, for OpenAI's abuse monitoring
 *   metadata, store           OpenAI's stored completions (infer stores nothing)
 *   service_tier              a processing tier (a local server has one)
 *   prompt_cache_key          a caching hint (the prefix cache finds shared beginnings itself)
 *   parallel_tool_calls       only means something with tools, which are refused
 * Those in UNSUPPORTED are refused unless they ask for what infer does anyway; any other field
 * (audio, prediction, reasoning_effort, llama.cpp's own, a typo, ...) is refused by name.
 */
const SAMPLING = ["temperature", "top_p", "top_k", "min_p", "typical_p", "repeat_penalty",
  "repeat_last_n", "presence_penalty", "frequency_penalty", "logit_bias", "seed"];
const COMMON = ["model", "stream", "stream_options", "n", "max_tokens", "stop", "logprobs",
  "response_format", ...SAMPLING, "user", "safety_identifier", "metadata", "store",
  "service_tier", "prompt_cache_key", "parallel_tool_calls", "spec", "draft_max"];
const FIELDS = {
  chat: new Set([...COMMON, "messages", "max_completion_tokens", "top_logprobs", "tools",
    "tool_choice"]),
  completion: new Set([...COMMON, "prompt"]),
};
/** Fields infer does not implement, with the values that ask for nothing (their defaults). */
const UNSUPPORTED: Record<string, (v: unknown) => boolean> = {
  echo: (v) => v === false,
  best_of: (v) => v === 1,
  suffix: (v) => v === "",
  functions: (v) => Array.isArray(v) && v.length === 0,
  function_call: (v) => v === "none",
  modalities: (v) => Array.isArray(v) && v.length === 1 && v[0] === "text",
};

function checkFields(kind: "chat" | "completion", body: Body): void {
  for (const [k, v] of Object.entries(body)) {
    if (v === null || FIELDS[kind].has(k)) continue;
    if (Object.hasOwn(UNSUPPORTED, k)) {
      if (UNSUPPORTED[k](v)) continue;
      throw bad(k, `'${k}' is not supported by this server`, "unsupported_parameter");
    }
    throw bad(k, `unknown parameter ${quote(k)}`, "unsupported_parameter");
  }
}

/** Alternatives per token OpenAI allows: chat's top_logprobs, completions' logprobs. */
const TOP_LOGPROBS_MAX = { chat: 20, completion: 5 };

/** How many alternatives per token the request asks log-probabilities for; null: none. */
function logprobsAsked(kind: "chat" | "completion", body: Body): number | null {
  if (kind === "completion") {
    if (body.logprobs === undefined || body.logprobs === null) return null;
    return integer(body, "logprobs", 0, 0, TOP_LOGPROBS_MAX.completion);
  }
  const asked = boolean(body, "logprobs");
  const top = integer(body, "top_logprobs", 0, 0, TOP_LOGPROBS_MAX.chat);
  if (!asked && body.top_logprobs !== undefined && body.top_logprobs !== null) {
    throw bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
  return asked ? top : null;
}

function messageContent(v: unknown, i: number): string {
  if (typeof v === "string") return v;
  // Content parts: only text is understood here.
  if (Array.isArray(v) && v.every((p) => isObject(p) && p.type === "text" && typeof p.text === "string")) {
    return v.map((p) => (p as { text: string }).text).join("");
  }
  throw bad(`messages[${i}].content`,
    `'messages[${i}].content' must be a string or an array of text parts`);
}

/** An assistant message's tool_calls: [{id, type: "function", function: {name, arguments}}]. */
function toolCalls(v: unknown, i: number): ToolCall[] {
  const param = `messages[${i}].tool_calls`;
  if (!Array.isArray(v) || v.length > 128) {
    throw bad(param, `'${param}' must be an array of at most 128 calls`);
  }
  return v.map((c, j) => {
    const f = isObject(c) ? c.function : undefined;
    const typed = isObject(c) && (c.type === undefined || c.type === "function");
    if (!isObject(c) || typeof c.id !== "string" || !typed ||
      !isObject(f) || typeof f.name !== "string" || typeof f.arguments !== "string") {
      throw bad(`${param}[${j}]`, `'${param}[${j}]' must be {"id": string, "type": "function", ` +
        `"function": {"name": string, "arguments": string}}`);
    }
    return { id: c.id, name: f.name as string, arguments: f.arguments as string };
  });
}

function messages(body: Body): ChatMessage[] {
  const v = body.messages;
  if (!Array.isArray(v) || v.length === 0) {
    throw bad("messages", "'messages' must be a non-empty array", v === undefined ? "missing_required_parameter" : "invalid_value");
  }
  if (v.length > 1024) throw bad("messages", "'messages' holds more than 1024 messages");
  return v.map((m, i): ChatMessage => {
    if (!isObject(m)) throw bad(`messages[${i}]`, `'messages[${i}]' must be an object`);
    let role = m.role;
    if (role === "developer") role = "system";
    if (role !== "system" && role !== "user" && role !== "assistant" && role !== "tool") {
      throw bad(`messages[${i}].role`,
        `'messages[${i}].role' must be system, developer, user, assistant or tool`);
    }
    if (role === "tool") {
      if (typeof m.tool_call_id !== "string") {
        throw bad(`messages[${i}].tool_call_id`,
          `'messages[${i}].tool_call_id' must be the id of the call this message answers`);
      }
      return { role, content: messageContent(m.content, i), toolCallId: m.tool_call_id };
    }
    const calls = role === "assistant" && m.tool_calls !== undefined && m.tool_calls !== null
      ? toolCalls(m.tool_calls, i) : [];
    // An assistant's message that calls tools may have no content (OpenAI sends null).
    const content = calls.length > 0 && (m.content === null || m.content === undefined)
      ? "" : messageContent(m.content, i);
    return calls.length > 0 ? { role, content, toolCalls: calls } : { role, content };
  });
}

/** 'tools': [{"type": "function", "function": {name, description?, parameters?}}]. */
function tools(body: Body): ToolFunction[] | undefined {
  const v = body.tools;
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || v.length > 128) {
    throw bad("tools", "'tools' must be an array of at most 128 tools");
  }
  const names = new Set<string>();
  return v.map((t, i) => {
    const f = isObject(t) ? t.function : undefined;
    if (!isObject(t) || t.type !== "function" || !isObject(f)) {
      throw bad(`tools[${i}]`, `'tools[${i}]' must be {"type": "function", "function": {...}}`);
    }
    const param = `tools[${i}].function`;
    if (typeof f.name !== "string" || !/^[a-zA-Z0-9_-]{1,64}$/.test(f.name)) {
      throw bad(`${param}.name`, `'${param}.name' must be 1 to 64 letters, digits, _ or -`);
    }
    if (names.has(f.name)) throw bad(`${param}.name`, `two tools are named ${quote(f.name)}`);
    names.add(f.name);
    if (f.description !== undefined && typeof f.description !== "string") {
      throw bad(`${param}.description`, `'${param}.description' must be a string`);
    }
    if (f.parameters !== undefined && !isObject(f.parameters)) {
      throw bad(`${param}.parameters`, `'${param}.parameters' must be a JSON schema object`);
    }
    if (f.parameters !== undefined) {
      try {
        checkJsonDocument(f.parameters);
      } catch (err) {
        if (!(err instanceof InferError)) throw err;
        throw bad(`${param}.parameters`, `'${param}.parameters': ${err.message}`,
          "unsupported_schema");
      }
    }
    // OpenAI's default: a function without parameters takes an empty object.
    const parameters = f.parameters ?? { type: "object", properties: {} };
    return { name: f.name, ...(f.description === undefined ? {} : { description: f.description }),
      parameters };
  });
}

/** 'tool_choice': none, auto, required, or {"type": "function", "function": {"name"}}. */
function toolChoice(body: Body, list: readonly ToolFunction[] | undefined): ToolChoice {
  const v = body.tool_choice;
  const has = list !== undefined && list.length > 0;
  if (v === undefined || v === null) return has ? "auto" : "none";
  if (v === "none") return v;
  if (v === "auto" || v === "required") {
    if (!has) throw bad("tool_choice", `'tool_choice' ${quote(v)} needs 'tools'`);
    return v;
  }
  const f = isObject(v) ? v.function : undefined;
  if (!isObject(v) || v.type !== "function" || !isObject(f) || typeof f.name !== "string") {
    throw bad("tool_choice", `'tool_choice' must be none, auto, required or ` +
      `{"type": "function", "function": {"name": string}}`);
  }
  if (!list?.some((t) => t.name === f.name)) {
    throw bad("tool_choice",
      `'tool_choice' names ${quote(f.name as string)}, which is not in 'tools'`);
  }
  return { name: f.name as string };
}

export interface Limits {
  readonly vocabSize: number;
  readonly contextLength: number;
  /**
   * The server's --context-shift: a request with a max_tokens may ask for more than the context
   * and gets them, the context shifting; without one it ends at the context as before.
   */
  readonly contextShift?: boolean;
  /** The server's --shift-policy. */
  readonly contextShiftPolicy?: ShiftPolicy;
}

/** Validates a /v1/chat/completions or /v1/completions body. */
export function parseRequest(kind: "chat" | "completion", body: Body, limits: Limits): ParsedRequest {
  checkFields(kind, body);
  if (typeof body.model !== "string" || body.model === "") {
    throw bad("model", "'model' must be a non-empty string", "missing_required_parameter");
  }
  const stream = boolean(body, "stream");
  let includeUsage = false;
  if (body.stream_options !== undefined && body.stream_options !== null) {
    if (!isObject(body.stream_options)) throw bad("stream_options", "'stream_options' must be an object");
    includeUsage = boolean(body.stream_options as Body, "include_usage");
  }
  const n = integer(body, "n", 1, 1, 128);
  let prompt: string | undefined, msgs: ChatMessage[] | undefined;
  if (kind === "chat") {
    msgs = messages(body);
  } else {
    const p = body.prompt;
    if (typeof p === "string") prompt = p;
    else if (Array.isArray(p) && p.length === 1 && typeof p[0] === "string") prompt = p[0];
    else throw bad("prompt", "'prompt' must be a string", p === undefined ? "missing_required_parameter" : "invalid_value");
  }
  const maxKey = kind === "chat" && body.max_completion_tokens !== undefined
    ? "max_completion_tokens" : "max_tokens";
  // OpenAI's defaults: 16 tokens for completions; for chat, as many as the context holds.
  // Asking for none is an error, as in OpenAI's API.
  const maxTokens = integer(body, maxKey, kind === "chat" ? -1 : 16, 1,
    limits.contextShift ? 2 ** 31 - 1 : limits.contextLength);
  const seed = integer(body, "seed", -1, -(2 ** 53), 2 ** 53);
  // OpenAI's sampling by default (nothing cut but top_p's); top_k, min_p, typical_p and the
  // repeat penalty are llama.cpp's server's extensions, off unless asked for.
  const sampling: SamplerOptions = {
    temperature: number(body, "temperature", 1, 0, 2),
    topP: number(body, "top_p", 1, 0, 1),
    topK: integer(body, "top_k", 0, 0, 2 ** 31 - 1),
    minP: number(body, "min_p", 0, 0, 1),
    typicalP: number(body, "typical_p", 1, 0, 1),
    repeatPenalty: positive(body, "repeat_penalty", 1, 10),
    repeatLastN: integer(body, "repeat_last_n", 64, -1, limits.contextLength),
    presencePenalty: number(body, "presence_penalty", 0, -2, 2),
    frequencyPenalty: number(body, "frequency_penalty", 0, -2, 2),
    logitBias: logitBias(body, limits.vocabSize),
    seed: seed < 0 ? -1 : seed >>> 0,
  };
  const { format, shortest } = responseFormat(body);
  checkRoom(shortest, maxKey, maxTokens, limits);
  const functions = kind === "chat" ? tools(body) : undefined;
  const choice = kind === "chat" ? toolChoice(body, functions) : "none";
  if (choice !== "none" && format.type !== "text") {
    throw bad("response_format", "'response_format' cannot be combined with tools (use " +
      "'tool_choice': \"none\" or leave out the response format)");
  }
  const job: Job = {
    kind, messages: msgs, prompt, maxTokens, sampling, stop: stops(body), format,
    logprobs: logprobsAsked(kind, body), speculation: speculation(body),
    ...(limits.contextShift && maxTokens > 0
      ? { contextShift: true, ...(limits.contextShiftPolicy ? { contextShiftPolicy: limits.contextShiftPolicy } : {}) }
      : {}),
    ...(functions === undefined ? {} : { tools: functions, toolChoice: choice }),
  };
  return { model: body.model, stream, includeUsage, n, job };
}

/**
 * infer's extensions: `spec` ("ngram" or "off"; default: the server's) and `draft_max` (1..64),
 * speculative decoding for this request.
 */
function speculation(body: Body): SpeculationOptions | undefined {
  const spec = body.spec;
  if (spec !== undefined && spec !== null && !(speculationModes as readonly unknown[]).includes(spec)) {
    throw bad("spec", `'spec' must be one of ${speculationModes.join(", ")}`);
  }
  const draftMax = body.draft_max === undefined || body.draft_max === null ? undefined
    : integer(body, "draft_max", 16, 1, 64);
  if ((spec === undefined || spec === null) && draftMax === undefined) return undefined;
  return { mode: (spec ?? "ngram") as SpeculationMode, draftMax };
}

const utf8 = new TextDecoder(), strictUtf8 = new TextDecoder("utf-8", { fatal: true });
/** OpenAI's value for a log-probability too small to matter (JSON has no -Infinity). */
const logprobValue = (v: number) => (Number.isFinite(v) ? v : -9999);

/** A token's text as chat's logprobs give it: its bytes decoded (invalid UTF-8 as U+FFFD). */
function chatToken(t: { bytes: readonly number[]; logprob: number }) {
  return { token: utf8.decode(Uint8Array.from(t.bytes)), logprob: logprobValue(t.logprob),
    bytes: [...t.bytes] };
}

/** Chat's `choice.logprobs`: {content: [{token, logprob, bytes, top_logprobs}], refusal}. */
export function chatLogprobs(entries: readonly LogprobEntry[]) {
  return {
    content: entries.map((e) => ({ ...chatToken(e), top_logprobs: e.top.map(chatToken) })),
    refusal: null,
  };
}

/** A token as completions' logprobs name it: its text, or "bytes:\xNN…" if not valid UTF-8. */
function completionToken(bytes: readonly number[]): string {
  const b = Uint8Array.from(bytes);
  try {
    return strictUtf8.decode(b);
  } catch {
    return "bytes:" + Array.from(b, (x) => `\\x${x.toString(16).padStart(2, "0")}`).join("");
  }
}

/**
 * Completions' `choice.logprobs`: {tokens, token_logprobs, top_logprobs, text_offset}; each
 * top_logprobs entry maps the most likely tokens' texts, and the chosen token's, to their
 * log-probabilities (where two tokens share a text, the likelier is kept).
 */
export function completionLogprobs(entries: readonly LogprobEntry[]) {
  return {
    tokens: entries.map((e) => completionToken(e.bytes)),
    token_logprobs: entries.map((e) => logprobValue(e.logprob)),
    top_logprobs: entries.map((e) => {
      const top = new Map<string, number>();
      for (const t of [...e.top, e]) {
        const key = completionToken(t.bytes);
        if (!top.has(key)) top.set(key, logprobValue(t.logprob));
      }
      return Object.fromEntries(top);
    }),
    text_offset: entries.map((e) => e.offset),
  };
}

export type FinishReason = "stop" | "length" | "tool_calls" | null;

/** The engine's stop reason in OpenAI's words. */
export function finishReason(reason: string): FinishReason {
  if (reason === "length" || reason === "context") return "length";
  if (reason === "interrupted") return null;
  return "stop";
}
