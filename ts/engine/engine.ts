// The engine: opens a GGUF, builds the model on a backend and owns one sequence's KV cache (its
// slot). generate() runs prompt → prefill (in chunks) → sample → decode through a one-slot batch
// scheduler, the path every request takes (scheduler.ts); evaluate() and prefill() run tokens
// through the model directly, for perplexity and tests.
//
// The slot remembers the tokens its cache holds. A new prompt that starts with some of them
// (the next turn of a chat) reuses that prefix and evaluates only the rest; the arithmetic is the
// same either way, because a prompt evaluated in one batch equals the same prompt fed in pieces.
import { existsSync } from "node:fs";
import { kvBytes, kvTypes, type Backend, type KvType } from "../backend/backend.ts";
import { chooseBackend, type BackendKind } from "../backend/select.ts";
import { InferError, quote } from "../errors.ts";
import { openGguf, type GgufFile } from "../gguf/reader.ts";
import type { Model, ModelShape } from "../model/model.ts";
import type { Pooling } from "../model/pooling.ts";
import { planModel } from "../model/registry.ts";
import { defaultThreads } from "../native/cpu-cores.ts";
import { tokenizerFromMetadata, type Tokenizer } from "../tokenizer/index.ts";
import type { GenerateOptions, GenerateResult } from "./generation.ts";
import { checkGpus } from "./gpus.ts";
import {
  createKvCache, createSlot, reusablePrefix, rewindSlot, type KvCache, type Slot,
} from "./kv-cache.ts";
import {
  availableHostMemory, checkFits, deviceNeeds, hostNeed, memoryPlan, type MemoryPlanOptions,
} from "./memory.ts";
import { BatchScheduler } from "./scheduler.ts";

/** Positions a slot is expected to hold on average, for the paged cache's default parallel. */
export const PAGED_SLOT_TOKENS = 2048;
/**
 * Slots by default at most with a paged cache: the largest decode step the CUDA backend replays
 * as a graph (ts/backend/cuda.ts GRAPH_ROWS); past it steps run op by op.
 */
export const PAGED_SLOTS_MAX = 64;

export type {
  GenerateOptions, GenerateResult, StopReason, TokenConstraint,
} from "./generation.ts";

export interface EngineOptions {
  readonly modelPath: string;
  readonly threads?: number;
  /** Positions the KV cache holds (default: min(4096, the model's trained context)). */
  readonly contextLength?: number;
  /** Prompt rows a forward pass takes at most (longer prompts run in chunks); default: the backend's preferredBatch. */
  readonly batch?: number;
  /** The KV cache's keys and values both (default f16; f32 for tests). */
  readonly kvType?: KvType;
  /** The keys' type, over kvType (llama.cpp's --cache-type-k): f16, q8_0, q4_0, tq3 or tq4 (CPU and CUDA). */
  readonly cacheTypeK?: KvType;
  /** The values' type, over kvType (llama.cpp's --cache-type-v). */
  readonly cacheTypeV?: KvType;
  /** cpu, cuda, metal or auto (a GPU when available); default cpu. */
  readonly backend?: BackendKind;
  /** GPUs the model is split over (tensor parallelism, gpus.ts); default 1. */
  readonly gpus?: number;
  /** Called as the model's tensors are prepared (done of total). */
  readonly onProgress?: (done: number, total: number) => void;
}

export class Engine {
  /** The engine's sequence: its KV cache and the tokens it holds (a scheduler's first slot). */
  readonly slot: Slot;
  /** generate()'s one-slot scheduler, made on first use. */
  private scheduler: BatchScheduler | null = null;

  private constructor(readonly file: GgufFile, readonly backend: Backend, readonly model: Model,
    readonly tokenizer: Tokenizer, readonly cache: KvCache, readonly loadMs: number,
    private readonly shape: ModelShape, private readonly plan: MemoryPlanOptions,
    /** How the model's metadata says to pool an embedding (null: a reranker's, not run). */
    readonly pooling: Pooling | null,
    /** Why this backend: asked for, or what `auto` found. */
    readonly backendWhy: string) {
    this.slot = createSlot(cache);
  }

  static open(options: EngineOptions): Engine {
    const t0 = performance.now();
    if (!existsSync(options.modelPath)) {
      throw new InferError("io", `model file not found: ${quote(options.modelPath, 200)}`);
    }
    const file = openGguf(options.modelPath);
    let backend: Backend | null = null, backendWhy = "";
    try {
      if (options.gpus !== undefined) checkGpus(options.gpus, options.backend ?? "cpu", planModel(file).shape, file);
      const chosen = chooseBackend(options.backend ?? "cpu");
      backend = chosen.backend;
      backendWhy = chosen.why;
      backend.setThreads(options.threads ?? defaultThreads());
      // Everything is validated, and the memory it takes checked, before anything is allocated.
      const planned = planModel(file), shape = planned.shape;
      const tokenizer = tokenizerFromMetadata(file.metadata);
      if (tokenizer.vocabSize !== shape.vocab) {
        throw new InferError("bad_model", `${file.path}: the tokenizer has ` +
          `${tokenizer.vocabSize} tokens, token_embd.weight ${shape.vocab} rows`);
      }
      const contextLength = options.contextLength ?? Math.min(4096, shape.contextLength);
      if (!Number.isInteger(contextLength) || contextLength < 1) {
        throw new InferError("invalid_argument",
          `context length must be a positive integer, got ${contextLength}`);
      }
      const maxBatch = options.batch ?? backend.preferredBatch;
      const kvType = {
        k: options.cacheTypeK ?? options.kvType ?? "f16", v: options.cacheTypeV ?? options.kvType ?? "f16",
      };
      for (const t of [kvType.k, kvType.v]) {
        if (!kvTypes.includes(t)) {
          throw new InferError("invalid_argument", `KV cache type '${t}' is not one of ${kvTypes.join(", ")}`);
        }
      }
      const plan = { contextLength, maxBatch, kvType, slots: 1,
        threads: options.threads ?? defaultThreads() };
      checkMemory(backend, file, shape, plan);
      const onProgress = options.onProgress;
      const total = file.tensors.size;
      const counted = onProgress ? countingWeights(backend, total, onProgress) : backend;
      const model = planned.build(counted, maxBatch, contextLength);
      onProgress?.(total, total);
      const cache = createKvCache(backend, model.info, contextLength, kvType, model.maxBatch);
      return new Engine(file, backend, model, tokenizer, cache, performance.now() - t0, shape,
        plan, planned.pooling, backendWhy);
    } catch (err) {
      backend?.dispose?.();
      file.close();
      throw err;
    }
  }

  /**
   * Throws InferError("out_of_memory") unless `slots` sequences, each with a KV cache of this
   * context, fit (the server's parallel slots; the engine's own cache is one of them).
   */
  checkSlotsFit(slots: number): void {
    checkMemory(this.backend, this.file, this.shape, { ...this.plan, slots, pagedKv: this.paged });
  }

  /** Whether the cache's full-attention layers are paged (the backend's pool: kv-pages.ts). */
  private get paged(): boolean {
    return (this.backend.kvPages?.() ?? null) !== null;
  }

  /**
   * Sequences decoded together when none is asked: 4, or with a paged cache as many as the pool
   * holds at PAGED_SLOT_TOKENS positions each (at most the context), their rings included, from
   * 1 to PAGED_SLOTS_MAX; the scheduler admits by what is mapped, so longer requests wait rather
   * than fail.
   */
  defaultParallel(): number {
    const pool = this.backend.kvPages?.() ?? null;
    if (!pool || !this.backend.sequenceBatches) return this.backend.sequenceBatches ? 4 : 1;
    const tokens = Math.min(PAGED_SLOT_TOKENS, this.contextLength);
    let rings = 0;
    for (const l of this.cache.layers) {
      if (l.ring) rings += l.cells * (kvBytes(this.cache.type.k, l.kvHeads * l.headDim, l.headDim) +
        kvBytes(this.cache.type.v, l.kvHeads * l.headDim, l.headDim));
    }
    const perSlot = pool.need(this.cache.layers, tokens) * pool.granule + rings;
    const fits = Math.floor(pool.availableGranules() * pool.granule / Math.max(1, perSlot));
    return Math.max(1, Math.min(fits, PAGED_SLOTS_MAX, this.model.maxBatch));
  }

  get contextLength(): number {
    return this.cache.contextLength;
  }

  /** Tokens the cache holds. */
  get length(): number {
    return this.slot.length;
  }

  /** The tokens the cache holds (a copy). */
  tokens(): number[] {
    return Array.from(this.slot.history.subarray(0, this.slot.length));
  }

  /** Forgets the sequence: the next evaluation starts at position 0. */
  reset(): void {
    rewindSlot(this.slot, 0);
  }

  /** Runs tokens through the model at the current position; returns the last token's logits. */
  evaluate(tokens: readonly number[]): Float32Array {
    if (tokens.length === 0) throw new InferError("invalid_argument", "nothing to evaluate");
    const slot = this.slot;
    if (slot.length + tokens.length > this.contextLength) {
      throw new InferError("context_overflow", `${slot.length + tokens.length} tokens do not ` +
        `fit the context of ${this.contextLength} (raise --ctx-size)`);
    }
    let logits: Float32Array | null = null;
    for (let start = 0; start < tokens.length; start += this.model.maxBatch) {
      const chunk = tokens.slice(start, start + this.model.maxBatch);
      logits = this.model.forward(chunk, chunk.length, slot.length, this.cache.layers);
      slot.history.set(chunk, slot.length);
      slot.length += chunk.length;
      slot.reach = Math.max(slot.reach, slot.length);
    }
    return logits!;
  }

  /**
   * Makes the cache hold `prompt` and returns the logits after its last token, evaluating only
   * what differs from the cached sequence (at least the last token, whose logits are needed).
   */
  prefill(prompt: readonly number[], reuse = true): { logits: Float32Array; reused: number } {
    if (prompt.length === 0) throw new InferError("invalid_argument", "the prompt is empty");
    const common = reuse ? reusablePrefix(this.slot, this.model.info, prompt) : 0;
    rewindSlot(this.slot, common);
    return { logits: this.evaluate(prompt.slice(common)), reused: common };
  }

  /**
   * Generates from a prompt (text is tokenized as llama.cpp does: BOS, control tokens parsed),
   * continuing from what the cache holds of it unless options.reuseCache is false. Not while
   * another scheduler runs on this engine: they share its slot.
   */
  generate(prompt: string | readonly number[], options: GenerateOptions): GenerateResult {
    const run = this.submit(prompt, options);
    while (!run.result && !run.error) this.step();
    return run.finish();
  }

  /**
   * As generate(), but yields to the event loop between tokens, so a signal handler (Ctrl-C)
   * or another event can set what `shouldStop` reads.
   */
  async generateAsync(prompt: string | readonly number[],
    options: GenerateOptions): Promise<GenerateResult> {
    const run = this.submit(prompt, options);
    while (!run.result && !run.error) {
      this.step();
      if (!run.result && !run.error) await new Promise<void>((resolve) => setImmediate(resolve));
    }
    return run.finish();
  }

  /** Queues a generation on the one-slot scheduler. */
  private submit(prompt: string | readonly number[], options: GenerateOptions) {
    const tokens = typeof prompt === "string"
      ? this.tokenizer.encode(prompt, { addSpecial: true, parseSpecial: true })
      : [...prompt];
    this.scheduler ??= new BatchScheduler(this, { slots: 1, prefixCache: null });
    const run = {
      result: null as GenerateResult | null, error: null as Error | null,
      finish(): GenerateResult {
        if (run.error) throw run.error;
        return run.result!;
      },
    };
    this.scheduler.submit({ prompt: tokens, options, onDone: (r) => (run.result = r),
      onError: (err) => (run.error = err) });
    return run;
  }

  private step(): void {
    const scheduler = this.scheduler!;
    try {
      scheduler.step();
    } catch (err) { // outside a forward pass (a sampler's options, say): fail what runs
      scheduler.abort(err as Error);
    }
  }

  close(): void {
    this.backend.dispose?.();
    this.file.close();
  }
}

/** Checks that a model of `shape` with `plan`'s context and slots fits the backend's memory. */
function checkMemory(backend: Backend, file: GgufFile, shape: ModelShape,
  plan: MemoryPlanOptions): void {
  const bytes = memoryPlan(file, shape, plan);
  const at = { contextLength: plan.contextLength };
  const device = backend.deviceMemory?.();
  if (!device) {
    checkFits(hostNeed(bytes), { ...at, available: availableHostMemory() });
    return;
  }
  const needs = deviceNeeds(bytes);
  checkFits(needs.device, { ...at, available: { bytes: device.freeBytes,
    what: `the free memory of ${device.name}` } });
  checkFits(needs.host, { ...at, available: availableHostMemory() });
}

/** The backend, reporting each weight the model asks it to prepare. */
function countingWeights(backend: Backend, total: number,
  onProgress: (done: number, total: number) => void): Backend {
  let done = 0;
  return new Proxy(backend, {
    get(target, key) {
      if (key === "weight") {
        return (...args: Parameters<Backend["weight"]>) => {
          const w = target.weight(...args);
          onProgress(++done, total);
          return w;
        };
      }
      const value = Reflect.get(target, key, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}
