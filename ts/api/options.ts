// The library's generation options, checked at the call (each bad value an InferError naming
// the option) and turned into the Job the engine's thread runs.
import type { ChatMessage } from "../chat/template.ts";
import type { ToolCall, ToolChoice, ToolFunction } from "../chat/tools.ts";
import type { StopReason } from "../engine/generation.ts";
import {
  checkSpeculation, type SpeculationMode, type SpeculationOptions, type SpeculationStats,
} from "../engine/speculation.ts";
import { InferError } from "../errors.ts";
import type { Job, ResponseFormat } from "../runtime/job.ts";
import { checkJsonDocument } from "../sample/json-schema.ts";
import { defaultSampling, type SamplerOptions } from "../sample/sampler.ts";
import { SHIFT_POLICIES, type ShiftPolicy } from "../engine/kv-cache.ts";

export interface GenerateOptions {
  /** Tokens to generate at most; -1: until the context is full (default 256). */
  readonly maxTokens?: number;
  /** 0 is greedy. The sampler chain and its defaults are llama.cpp's (temperature 0.8). */
  readonly temperature?: number;
  /** Keep the K most likely tokens; 0: all (default 40). */
  readonly topK?: number;
  /** Keep the fewest tokens reaching probability P; 1: off (default 0.95). */
  readonly topP?: number;
  /** Drop tokens under P × the most likely one's probability; 0: off (default 0.05). */
  readonly minP?: number;
  /** Locally typical sampling; 1: off (default). */
  readonly typicalP?: number;
  /** Weaken the logits of tokens seen in the last `repeatLastN`; 1: off (default). */
  readonly repeatPenalty?: number;
  /** Tokens the penalties look back over; 0: none, -1: all (default 64). */
  readonly repeatLastN?: number;
  /** Subtract F × (times seen) from a token's logit (default 0). */
  readonly frequencyPenalty?: number;
  /** Subtract P from the logit of any token seen (default 0). */
  readonly presencePenalty?: number;
  /** Added to a token's logit (by token id); -Infinity bans the token. */
  readonly logitBias?: Readonly<Record<number, number>> | ReadonlyMap<number, number>;
  /** The same seed and options give the same text (default: random). */
  readonly seed?: number;
  /** Generation ends before any of these strings, which are never part of the text. */
  readonly stop?: string | readonly string[];
  /** Constrain the output to JSON valid against this schema (a subset: see docs/generation.md). */
  readonly jsonSchema?: object;
  /** Constrain the output to a JSON object (any). */
  readonly json?: boolean;
  /** Go on past end-of-generation tokens. */
  readonly ignoreEos?: boolean;
  /**
   * When the context is full, keep its first 4 positions, drop the older half of the rest and go
   * on (llama.cpp's context shift; CPU backend), instead of finishing with "length".
   */
  readonly contextShift?: boolean;
  /**
   * Which positions the shift keeps past the first 4: "streaming" (default) the most recent;
   * "h2o" half of them the positions with the most accumulated attention (H2O, Zhang et al. 2023).
   */
  readonly contextShiftPolicy?: ShiftPolicy;
  /** Chat: functions the model may call; its calls come back in `toolCalls`. */
  readonly tools?: readonly ToolFunction[];
  /** Chat: "auto" (default with tools), "none", "required" or { name }: call that function. */
  readonly toolChoice?: ToolChoice;
  /** Ends the generation within one step; the call rejects with the signal's reason. */
  readonly signal?: AbortSignal;
  /** With `signal`: resolve with the text so far (finishReason "abort") instead of rejecting. */
  readonly stopOnAbortSignal?: boolean;
  /**
   * Speculative decoding: "ngram" drafts tokens by looking the last ones up in the prompt and
   * the text so far, and keeps those the model would have chosen itself (the same output,
   * faster on text that repeats its input); "off". Default: "ngram" on the CPU.
   */
  readonly speculation?: SpeculationMode;
  /** Drafted tokens a step at most (1..64, default 16). */
  readonly draftMax?: number;
}

/**
 * Why a generation ended: a stop (end of generation, a stop string, a complete JSON value), a
 * limit, the caller, or calls of tools (the answer waits for their results).
 */
export type FinishReason = "stop" | "length" | "abort" | "toolCalls";

export interface Usage {
  readonly promptTokens: number;
  readonly completionTokens: number;
  readonly totalTokens: number;
}

export interface Timings {
  /** Prompt tokens evaluated; the rest came from the KV cache (a chat's earlier turns). */
  readonly promptEvaluated: number;
  readonly promptMs: number;
  readonly generateMs: number;
  /** Generated tokens per second after the first. */
  readonly tokensPerSecond: number;
}

export interface Completion {
  /** The answer's text (with tools: the text outside its calls). */
  readonly text: string;
  /** The calls of tools the answer made (with `tools`; else empty). */
  readonly toolCalls: readonly ToolCall[];
  /** The generated tokens' ids. */
  readonly tokens: readonly number[];
  readonly finishReason: FinishReason;
  /** The engine's finer reason: eos, stop, complete (JSON), length, context, interrupted. */
  readonly stopReason: StopReason;
  readonly usage: Usage;
  readonly timings: Timings;
  /** With speculation: the drafted tokens, those kept, and the passes that carried them. */
  readonly speculation?: SpeculationStats;
}

/** A piece of streamed text, as soon as it is complete UTF-8 and past any stop string. */
export interface Piece {
  readonly text: string;
  /** Calls of tools completed with this piece. */
  readonly toolCalls?: readonly ToolCall[];
}

const bad = (option: string, message: string) =>
  new InferError("invalid_argument", `${option}: ${message}`);

function num(o: GenerateOptions, key: keyof GenerateOptions, fallback: number, min: number,
  max: number, integer = false): number {
  const v = o[key];
  if (v === undefined) return fallback;
  if (typeof v !== "number" || Number.isNaN(v) || v < min || v > max || (integer && !Number.isInteger(v))) {
    throw bad(key, `expected ${integer ? "an integer" : "a number"} in [${min}, ${max}], got ${String(v)}`);
  }
  return v;
}

function logitBias(o: GenerateOptions, vocabSize: number): Map<number, number> | undefined {
  const v = o.logitBias;
  if (v === undefined) return undefined;
  const entries = v instanceof Map ? [...v.entries()] : Object.entries(v).map(([k, b]) => [Number(k), b]);
  const out = new Map<number, number>();
  for (const [id, bias] of entries as [number, unknown][]) {
    if (!Number.isInteger(id) || id < 0 || id >= vocabSize) {
      throw bad("logitBias", `${String(id)} is not a token id (0..${vocabSize - 1})`);
    }
    if (typeof bias !== "number" || Number.isNaN(bias) || bias === Infinity) {
      throw bad("logitBias", `token ${id}'s bias must be a number or -Infinity`);
    }
    out.set(id, bias);
  }
  return out;
}

function stops(o: GenerateOptions): string[] {
  if (o.stop === undefined) return [];
  const list = typeof o.stop === "string" ? [o.stop] : o.stop;
  if (!Array.isArray(list) || !list.every((s) => typeof s === "string" && s.length > 0)) {
    throw bad("stop", "expected a non-empty string or an array of them");
  }
  return [...list];
}

function format(o: GenerateOptions): ResponseFormat {
  if (o.jsonSchema !== undefined) {
    if (typeof o.jsonSchema !== "object" || o.jsonSchema === null) {
      throw bad("jsonSchema", "expected a JSON schema object");
    }
    return { type: "json_schema", schema: o.jsonSchema };
  }
  return o.json ? { type: "json_object" } : { type: "text" };
}

export function samplingOf(o: GenerateOptions, vocabSize: number): SamplerOptions {
  const d = defaultSampling;
  const seed = num(o, "seed", -1, -1, 2 ** 32 - 1, true);
  return {
    temperature: num(o, "temperature", d.temperature, 0, 100),
    topK: num(o, "topK", d.topK, 0, 2 ** 31 - 1, true),
    topP: num(o, "topP", d.topP, 0, 1),
    minP: num(o, "minP", d.minP, 0, 1),
    typicalP: num(o, "typicalP", d.typicalP, 0, 1),
    repeatPenalty: num(o, "repeatPenalty", d.repeatPenalty, 0, 100),
    repeatLastN: num(o, "repeatLastN", d.repeatLastN, -1, 2 ** 31 - 1, true),
    frequencyPenalty: num(o, "frequencyPenalty", d.frequencyPenalty, -100, 100),
    presencePenalty: num(o, "presencePenalty", d.presencePenalty, -100, 100),
    logitBias: logitBias(o, vocabSize),
    seed,
  };
}

function shiftPolicyOf(o: GenerateOptions): ShiftPolicy | undefined {
  const p = o.contextShiftPolicy;
  if (p === undefined) return undefined;
  if (!(SHIFT_POLICIES as readonly unknown[]).includes(p)) throw bad("contextShiftPolicy", `must be one of ${SHIFT_POLICIES.join(", ")}`);
  return p;
}

/** The job for a prompt (completion) or a conversation (chat), options checked. */
export function jobOf(input: { prompt: string | readonly number[] } | { messages: readonly ChatMessage[] },
  o: GenerateOptions, vocabSize: number): Job {
  if (o.signal !== undefined && !(o.signal instanceof AbortSignal)) {
    throw bad("signal", "expected an AbortSignal");
  }
  const common = {
    maxTokens: num(o, "maxTokens", 256, -1, 2 ** 31 - 1, true),
    sampling: samplingOf(o, vocabSize), stop: stops(o), format: format(o), logprobs: null,
    ignoreEos: o.ignoreEos === true, speculation: speculationOf(o),
    contextShift: o.contextShift === true, contextShiftPolicy: shiftPolicyOf(o),
  };
  if (common.maxTokens === 0) throw bad("maxTokens", "must be at least 1, or -1 for no limit");
  const tools = toolsOf(o);
  if ("messages" in input) return { kind: "chat", messages: input.messages, ...common, ...tools };
  if (o.tools !== undefined) throw bad("tools", "only a chat calls tools");
  const p = input.prompt;
  if (typeof p !== "string" && !(Array.isArray(p) && p.every((t) => Number.isInteger(t)))) {
    throw new InferError("invalid_argument", "the prompt must be a string or an array of token ids");
  }
  return { kind: "completion", prompt: typeof p === "string" ? p : [...p], ...common };
}

function toolsOf(o: GenerateOptions): { tools?: ToolFunction[]; toolChoice?: ToolChoice } {
  if (o.tools === undefined) {
    if (o.toolChoice !== undefined && o.toolChoice !== "none") {
      throw bad("toolChoice", "needs tools");
    }
    return {};
  }
  if (!Array.isArray(o.tools)) throw bad("tools", "expected an array of { name, parameters }");
  const tools = o.tools.map((t: ToolFunction, i) => {
    if (typeof t !== "object" || t === null || typeof t.name !== "string" || t.name === "" ||
      (t.parameters !== undefined && (typeof t.parameters !== "object" || t.parameters === null)) ||
      (t.description !== undefined && typeof t.description !== "string")) {
      throw bad("tools", `tool ${i}: expected { name, description?, parameters? (a JSON schema) }`);
    }
    if (t.parameters !== undefined) {
      try {
        checkJsonDocument(t.parameters);
      } catch (err) {
        if (err instanceof InferError) throw bad("tools", `tool ${i}'s parameters: ${err.message}`);
        throw err;
      }
    }
    return { name: t.name, ...(t.description === undefined ? {} : { description: t.description }),
      parameters: t.parameters ?? { type: "object", properties: {} } };
  });
  const choice = o.toolChoice ?? "auto";
  const named = typeof choice === "object" && choice !== null;
  if (!named && !["auto", "none", "required"].includes(choice as string)) {
    throw bad("toolChoice", 'expected "auto", "none", "required" or { name }');
  }
  if (named && !tools.some((t) => t.name === choice.name)) {
    throw bad("toolChoice", `no tool is named ${JSON.stringify(String(choice.name))}`);
  }
  return { tools, toolChoice: named ? { name: choice.name } : choice };
}

/** The speculation asked for; undefined: the engine's default. */
export function speculationOf(o: { speculation?: unknown; draftMax?: unknown; draftModel?: unknown }):
  SpeculationOptions | undefined {
  if (o.speculation === undefined && o.draftMax === undefined) return undefined;
  const spec = { mode: (o.speculation ?? (o.draftModel ? "draft" : "ngram")) as SpeculationMode,
    draftMax: o.draftMax as number | undefined };
  try {
    checkSpeculation(spec);
  } catch (err) {
    if (!(err instanceof InferError)) throw err;
    throw bad(o.speculation !== undefined && err.message.startsWith("speculation")
      ? "speculation" : "draftMax", err.message.replace(/^[a-z-]+: /, ""));
  }
  return spec;
}

export function finishReasonOf(stop: StopReason, called = false): FinishReason {
  if (stop === "interrupted") return "abort";
  if (called && stop !== "length" && stop !== "context") return "toolCalls";
  return stop === "length" || stop === "context" ? "length" : "stop";
}
