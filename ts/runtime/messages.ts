// What the engine's thread (worker.ts) and the thread that owns it (engine-thread.ts) say to
// each other. Everything here survives structured cloning.
import type { KvType } from "../backend/backend.ts";
import type { BackendKind } from "../backend/select.ts";
import type { ToolCall, ToolCallDelta } from "../chat/tools.ts";
import type { StopReason } from "../engine/generation.ts";
import type { SpeculationOptions, SpeculationStats } from "../engine/speculation.ts";
import type { InferErrorCode } from "../errors.ts";
import type { Pooling } from "../model/pooling.ts";
import type { AnyJob, LogprobEntry } from "./job.ts";

export interface OpenSettings {
  readonly modelPath: string;
  readonly threads?: number;
  readonly contextLength?: number;
  /** The KV cache's key and value types (default f16). */
  readonly cacheTypeK?: KvType;
  readonly cacheTypeV?: KvType;
  readonly backend?: BackendKind;
  /** GPUs the model is split over (default 1; EngineOptions.gpus). */
  readonly gpus?: number;
  /** The native library the main thread chose, for a worker in the single executable. */
  readonly library?: string;
  /** Sequences decoded together (default 1); "auto": Engine.defaultParallel (what fits on CUDA). */
  readonly parallel?: number | "auto";
  /** Prompt rows per step while other sequences decode. */
  readonly prefillChunk?: number;
  /** Memory for the prefix cache (default 128 MiB); 0: no prefix cache. */
  readonly prefixCacheBytes?: number;
  /** Speculation for jobs that name none (default: draft with a draft model, else defaultSpeculation). */
  readonly speculation?: SpeculationOptions;
  /** A GGUF with the model's vocabulary that drafts for speculation "draft". */
  readonly draftModel?: string;
  /** Post "progress" messages while the weights are prepared. */
  readonly progress?: boolean;
  /**
   * The watchdog's cell (a BigInt64Array of one element over shared memory): the worker stores
   * when its current piece of work began (Date.now() in ms), 0 while it waits. Shared memory,
   * not a message, because a hung step cannot post anything; the owner reads it instead.
   */
  readonly heartbeat: SharedArrayBuffer;
  /** For tests of the watchdog: before step `atStep` (from 0), block the thread `ms`. */
  readonly stall?: StallForTests;
}

export interface StallForTests {
  readonly atStep: number;
  readonly ms: number;
}

/** The engine's state, posted by the worker whenever it changes. */
export interface EngineStats {
  readonly slots: number;
  readonly busySlots: number;
  readonly steps: number;
  readonly prefixBlocks: number;
  readonly prefixBytes: number;
  readonly prefixRestoredTokens: number;
  readonly prefixLookedUpTokens: number;
}

/** The opened model, as the worker describes it. */
export interface EngineInfo {
  /** general.name, or null. */
  readonly name: string | null;
  readonly architecture: string;
  /** Weights' elements, all tensors together. */
  readonly parameters: number;
  /** The file's type as llama.cpp names it (Q4_K_M, F16, ...). */
  readonly quantization: string;
  /** Positions the KV cache of each sequence holds. */
  readonly contextLength: number;
  /** The context the model was trained with. */
  readonly trainedContextLength: number;
  readonly vocabSize: number;
  readonly layers: number;
  /** Dimensions of an embedding (the hidden state's width). */
  readonly embeddingLength: number;
  /**
   * How embeddings are pooled unless a call asks otherwise (the GGUF's pooling_type, or mean);
   * null for a reranker (pooling_type rank), whose classifier head infer does not run.
   */
  readonly pooling: Pooling | null;
  /** The backend chosen (cpu, cuda or metal). */
  readonly backend: string;
  /** Why: asked for, or what `auto` found (the device, or why there is none). */
  readonly backendReason: string;
  /** Prompt rows one forward pass takes at most. */
  readonly batch: number;
  /** Sequences decoded together (the asked parallel, or 1 where the backend cannot batch). */
  readonly parallel: number;
  /** The model's chat template: the file's, a family fallback, or null (none fits). */
  readonly chatTemplate: "gguf" | string | null;
  readonly loadMs: number;
}

export type ToWorker =
  | { readonly type: "open"; readonly settings: OpenSettings }
  | { readonly type: "run"; readonly id: number; readonly job: AnyJob }
  | { readonly type: "cancel"; readonly id: number }
  | { readonly type: "close" };

/** Why a job failed: the library's error code, and the HTTP answer the server gives for it. */
export interface JobFailure {
  readonly kind: InferErrorCode;
  readonly status: number;
  readonly message: string;
  readonly param: string | null;
  /** OpenAI's error code string. */
  readonly code: string | null;
}

export interface JobDone {
  /** The answer's text (with tools: the text outside its calls). */
  readonly text: string;
  /** The calls read out of the answer (with tools). */
  readonly toolCalls: readonly ToolCall[];
  readonly tokens: readonly number[];
  readonly promptTokens: number;
  /** Prompt tokens evaluated for this job; the rest came from a cache. */
  readonly prefilled: number;
  readonly stopReason: StopReason;
  readonly promptMs: number;
  readonly generateMs: number;
  readonly speculation?: SpeculationStats;
}

export type FromWorker =
  | { readonly type: "ready"; readonly info: EngineInfo }
  | { readonly type: "failed"; readonly kind: InferErrorCode; readonly message: string }
  | { readonly type: "progress"; readonly done: number; readonly total: number }
  /** The prompt is tokenized and fits; generation begins. */
  | { readonly type: "started"; readonly id: number; readonly promptTokens: number }
  | {
    readonly type: "text"; readonly id: number; readonly text: string;
    /** With job.logprobs: the tokens whose text this piece completes. */
    readonly logprobs?: readonly LogprobEntry[];
    /** Calls completed with this piece (with tools). */
    readonly toolCalls?: readonly ToolCall[];
    /** Calls begun or extended with this piece (with tools): what a stream sends of them. */
    readonly toolCallDeltas?: readonly ToolCallDelta[];
  }
  | ({ readonly type: "done"; readonly id: number } & JobDone)
  | ({ readonly type: "error"; readonly id: number } & JobFailure)
  /** An embedding job's vectors, one per input in order, and each input's token count. */
  | {
    readonly type: "embedded"; readonly id: number; readonly embeddings: readonly Float32Array[];
    readonly inputTokens: readonly number[];
  }
  | { readonly type: "stats"; readonly stats: EngineStats }
  | { readonly type: "closed" };
