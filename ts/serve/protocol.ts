// The OpenAI-compatible request bodies, validated into the plain jobs the worker runs. Every
// refusal is an ApiError naming the field, sent as OpenAI's error object:
//   {"error": {"message", "type", "param", "code"}}
import type { ChatMessage } from "../chat/template.ts";
import { InferError, quote } from "../errors.ts";
import { anyObject, compileSchema, minLength } from "../sample/json-schema.ts";
import type { SamplerOptions } from "../sample/sampler.ts";

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

export type ResponseFormat =
  | { readonly type: "text" }
  | { readonly type: "json_object" }
  | { readonly type: "json_schema"; readonly schema: unknown };

/** One generation, as the worker runs it. */
export interface Job {
  readonly kind: "chat" | "completion";
  readonly messages?: readonly ChatMessage[];
  readonly prompt?: string;
  readonly maxTokens: number;
  readonly sampling: SamplerOptions;
  readonly stop: readonly string[];
  readonly format: ResponseFormat;
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

function messageContent(v: unknown, i: number): string {
  if (typeof v === "string") return v;
  // Content parts: only text is understood here.
  if (Array.isArray(v) && v.every((p) => isObject(p) && p.type === "text" && typeof p.text === "string")) {
    return v.map((p) => (p as { text: string }).text).join("");
  }
  throw bad(`messages[${i}].content`,
    `'messages[${i}].content' must be a string or an array of text parts`);
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
    if (role !== "system" && role !== "user" && role !== "assistant") {
      throw bad(`messages[${i}].role`,
        `'messages[${i}].role' must be system, developer, user or assistant`);
    }
    return { role, content: messageContent(m.content, i) };
  });
}

export interface Limits {
  readonly vocabSize: number;
  readonly contextLength: number;
}

/** Validates a /v1/chat/completions or /v1/completions body. */
export function parseRequest(kind: "chat" | "completion", body: Body, limits: Limits): ParsedRequest {
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
  const maxTokens = integer(body, maxKey, kind === "chat" ? -1 : 16, 0, limits.contextLength);
  const seed = integer(body, "seed", -1, -(2 ** 53), 2 ** 53);
  const sampling: SamplerOptions = {
    temperature: number(body, "temperature", 1, 0, 2),
    topP: number(body, "top_p", 1, 0, 1),
    topK: 0, minP: 0, typicalP: 1, repeatPenalty: 1, repeatLastN: 64,
    presencePenalty: number(body, "presence_penalty", 0, -2, 2),
    frequencyPenalty: number(body, "frequency_penalty", 0, -2, 2),
    logitBias: logitBias(body, limits.vocabSize),
    seed: seed < 0 ? -1 : seed >>> 0,
  };
  const { format, shortest } = responseFormat(body);
  checkRoom(shortest, maxKey, maxTokens, limits);
  const job: Job = { kind, messages: msgs, prompt, maxTokens, sampling, stop: stops(body), format };
  return { model: body.model, stream, includeUsage, n, job };
}

export type FinishReason = "stop" | "length" | null;

/** The engine's stop reason in OpenAI's words. */
export function finishReason(reason: string): FinishReason {
  if (reason === "length" || reason === "context") return "length";
  if (reason === "interrupted") return null;
  return "stop";
}
