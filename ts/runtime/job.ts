// One generation as the engine's thread runs it, whoever asked for it: the library (ts/api/),
// the CLI (through the library) or the server (ts/serve/). Everything in a Job survives
// structured cloning, because it crosses to the worker as a message.
import type { ChatMessage } from "../chat/template.ts";
import type { ToolChoice, ToolFunction } from "../chat/tools.ts";
import type { Pooling } from "../model/pooling.ts";
import type { SpeculationOptions } from "../engine/speculation.ts";
import type { SamplerOptions } from "../sample/sampler.ts";
import type { ShiftPolicy } from "../engine/kv-cache.ts";

export type ResponseFormat =
  | { readonly type: "text" }
  | { readonly type: "json_object" }
  | { readonly type: "json_schema"; readonly schema: unknown };

export interface Job {
  /** chat: `messages` rendered through the model's chat template; completion: `prompt`. */
  readonly kind: "chat" | "completion";
  readonly messages?: readonly ChatMessage[];
  /** Text is tokenized as llama.cpp does (BOS, control tokens parsed); ids are taken as given. */
  readonly prompt?: string | readonly number[];
  /** Tokens to generate at most; negative: until the context is full. */
  readonly maxTokens: number;
  readonly sampling: SamplerOptions;
  readonly stop: readonly string[];
  readonly format: ResponseFormat;
  /** Log-probabilities of each token and of this many alternatives; null: none asked. */
  readonly logprobs: number | null;
  /** Generate past end-of-generation tokens. */
  readonly ignoreEos?: boolean;
  /** When the context is full, shift it (drop the older half) and go on, where the backend can. */
  readonly contextShift?: boolean;
  /** Which positions the shift keeps (kv-cache.ts ShiftPolicy; default "streaming"). */
  readonly contextShiftPolicy?: ShiftPolicy;
  /** Chat: functions the model may call (chat/tools.ts), and whether it must. */
  readonly tools?: readonly ToolFunction[];
  readonly toolChoice?: ToolChoice;
  /** Speculative decoding; undefined: the engine's default (defaultSpeculation). */
  readonly speculation?: SpeculationOptions;
}

/**
 * Embeddings of one or more inputs, each a sequence of its own in the batch scheduler: one
 * vector each, the last hidden state pooled (ts/model/pooling.ts).
 */
export interface EmbedJob {
  readonly kind: "embedding";
  /** Texts (tokenized as llama.cpp does: BOS, control tokens parsed) or token ids. */
  readonly inputs: readonly (string | readonly number[])[];
  /** null: the model's own (its GGUF pooling_type; mean where it declares none). */
  readonly pooling: Pooling | null;
  /** L2-normalise each vector. */
  readonly normalize: boolean;
}

/** Whatever the engine's thread runs. */
export type AnyJob = Job | EmbedJob;

/** One generated token's log-probabilities, as the worker reports them. */
export interface LogprobEntry {
  /** The token's text as bytes (a control token's: its name). */
  readonly bytes: readonly number[];
  readonly logprob: number;
  /** The most likely tokens at its position, best first. */
  readonly top: readonly { readonly bytes: readonly number[]; readonly logprob: number }[];
  /** Where its text begins in the choice's text (UTF-16 code units). */
  readonly offset: number;
}
