// What the HTTP thread and the engine's worker (worker.ts) say to each other.
import type { BackendKind } from "../backend/select.ts";
import type { Job, LogprobEntry } from "./protocol.ts";

export interface OpenSettings {
  readonly modelPath: string;
  readonly threads?: number;
  readonly contextLength?: number;
  readonly backend?: BackendKind;
  /** The native library the main thread chose, for a worker in the single executable. */
  readonly library?: string;
  /** Sequences decoded together (default 1). */
  readonly parallel?: number;
  /** Prompt rows per step while other sequences decode. */
  readonly prefillChunk?: number;
  /** Memory for the prefix cache (default 128 MiB); 0: no prefix cache. */
  readonly prefixCacheBytes?: number;
  /**
   * The watchdog's cell (a BigInt64Array of one element over shared memory): the worker stores
   * when its current piece of work began (Date.now() in ms), 0 while it waits. Shared memory,
   * not a message, because a hung step cannot post anything; the HTTP thread reads it instead.
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

export type ToWorker =
  | { readonly type: "open"; readonly settings: OpenSettings }
  | { readonly type: "run"; readonly id: number; readonly job: Job }
  | { readonly type: "cancel"; readonly id: number }
  | { readonly type: "close" };

export interface ModelInfo {
  readonly contextLength: number;
  readonly vocabSize: number;
  readonly name: string | null;
  /** Requests decoded together (the asked --parallel, or 1 where the backend cannot batch). */
  readonly parallel: number;
}

export type FromWorker =
  | { readonly type: "ready"; readonly info: ModelInfo }
  | { readonly type: "failed"; readonly message: string }
  /** The prompt is tokenized and fits; generation begins. */
  | { readonly type: "started"; readonly id: number; readonly promptTokens: number }
  | {
    readonly type: "text"; readonly id: number; readonly text: string;
    /** With job.logprobs: the tokens whose text this piece completes. */
    readonly logprobs?: readonly LogprobEntry[];
  }
  | {
    readonly type: "done"; readonly id: number; readonly text: string;
    readonly promptTokens: number; readonly completionTokens: number;
    readonly stopReason: string;
  }
  | {
    readonly type: "error"; readonly id: number; readonly status: number;
    readonly message: string; readonly param: string | null; readonly code: string | null;
  }
  | { readonly type: "stats"; readonly stats: EngineStats }
  | { readonly type: "closed" };
