// The engine: opens a GGUF, builds the model on a backend, owns one sequence's KV cache and
// runs prompt → prefill (in chunks) → sample → decode, streaming text as it completes.
//
// The engine remembers the tokens its cache holds. A new prompt that starts with some of them
// (the next turn of a chat) reuses that prefix and evaluates only the rest; the arithmetic is the
// same either way, because a prompt evaluated in one batch equals the same prompt fed in pieces.
import { existsSync } from "node:fs";
import { availableParallelism } from "node:os";
import type { Backend, KvType } from "../backend/backend.ts";
import { createBackend, defaultBackendKind, type BackendKind } from "../backend/select.ts";
import { setting } from "../config/env.ts";
import { InferError } from "../errors.ts";
import { openGguf, type GgufFile } from "../gguf/reader.ts";
import type { Model, ModelShape } from "../model/model.ts";
import { planModel } from "../model/registry.ts";
import { tokenizerFromMetadata, type Tokenizer } from "../tokenizer/index.ts";
import { Generation, type GenerateOptions, type GenerateResult } from "./generation.ts";
import { canRewind, createKvCache, type KvCache } from "./kv-cache.ts";
import {
  availableHostMemory, checkFits, deviceNeeds, hostNeed, memoryPlan, type MemoryPlanOptions,
} from "./memory.ts";

export type {
  GenerateOptions, GenerateResult, StopReason, TokenConstraint,
} from "./generation.ts";

export interface EngineOptions {
  readonly modelPath: string;
  readonly threads?: number;
  /** Positions the KV cache holds (default: min(4096, the model's trained context)). */
  readonly contextLength?: number;
  /**
   * Prompt rows a forward pass takes at most (longer prompts run in chunks): default 256 on the
   * CPU, 512 on CUDA (llama.cpp's default micro-batch), where a chunk's matmuls dequantize every
   * weight once (cuBLAS GEMMs from 128 rows) and longer chunks pay that less often.
   */
  readonly batch?: number;
  readonly kvType?: KvType;
  /** cpu, cuda, metal or auto (a GPU when available); default: INFER_BACKEND, else cpu. */
  readonly backend?: BackendKind;
  /** Called as the model's tensors are prepared (done of total). */
  readonly onProgress?: (done: number, total: number) => void;
}

/** One generation in progress: the logits after the last evaluated token, or a step in flight. */
interface Running {
  readonly generation: Generation;
  logits: Float32Array;
  /** Greedy decoding with the argmax on the device (see deviceStep). */
  readonly onDevice: boolean;
  /** A device step is queued whose argmax is the next token. */
  inFlight: boolean;
}

export class Engine {
  private position = 0;
  /** The tokens whose keys and values the cache holds, positions 0..position-1. */
  private readonly history: Int32Array;

  private constructor(readonly file: GgufFile, readonly backend: Backend, readonly model: Model,
    readonly tokenizer: Tokenizer, readonly cache: KvCache, readonly loadMs: number,
    private readonly shape: ModelShape, private readonly plan: MemoryPlanOptions) {
    this.history = new Int32Array(cache.contextLength);
  }

  static open(options: EngineOptions): Engine {
    const t0 = performance.now();
    if (!existsSync(options.modelPath)) {
      throw new InferError("io", `model file not found: ${options.modelPath}`);
    }
    const file = openGguf(options.modelPath);
    let backend: Backend | null = null;
    try {
      backend = createBackend(options.backend ?? defaultBackendKind());
      if (options.threads !== undefined) backend.setThreads(options.threads);
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
      const maxBatch = options.batch ?? (backend.name === "cuda" ? 512 : 256);
      const kvType = options.kvType ?? "f16";
      const plan = { contextLength, maxBatch, kvType, slots: 1,
        threads: options.threads ?? availableParallelism() };
      checkMemory(backend, file, shape, plan);
      const onProgress = options.onProgress;
      const total = file.tensors.size;
      const counted = onProgress ? countingWeights(backend, total, onProgress) : backend;
      const model = planned.build(counted, maxBatch);
      onProgress?.(total, total);
      const cache = createKvCache(backend, model.info, contextLength, kvType, model.maxBatch);
      return new Engine(file, backend, model, tokenizer, cache, performance.now() - t0, shape,
        plan);
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
    checkMemory(this.backend, this.file, this.shape, { ...this.plan, slots });
  }

  get contextLength(): number {
    return this.cache.contextLength;
  }

  /** Tokens the cache holds. */
  get length(): number {
    return this.position;
  }

  /** The tokens the cache holds (a copy). */
  tokens(): number[] {
    return Array.from(this.history.subarray(0, this.position));
  }

  /** Forgets the sequence: the next evaluation starts at position 0. */
  reset(): void {
    this.position = 0;
  }

  /** Runs tokens through the model at the current position; returns the last token's logits. */
  evaluate(tokens: readonly number[]): Float32Array {
    if (tokens.length === 0) throw new InferError("invalid_argument", "nothing to evaluate");
    if (this.position + tokens.length > this.contextLength) {
      throw new InferError("context_overflow", `${this.position + tokens.length} tokens do not ` +
        `fit the context of ${this.contextLength} (raise --ctx-size)`);
    }
    let logits: Float32Array | null = null;
    for (let start = 0; start < tokens.length; start += this.model.maxBatch) {
      const chunk = tokens.slice(start, start + this.model.maxBatch);
      logits = this.model.forward(chunk, chunk.length, this.position, this.cache.layers);
      this.history.set(chunk, this.position);
      this.position += chunk.length;
    }
    return logits!;
  }

  /**
   * Makes the cache hold `prompt` and returns the logits after its last token, evaluating only
   * what differs from the cached sequence (at least the last token, whose logits are needed).
   */
  prefill(prompt: readonly number[], reuse = true): { logits: Float32Array; reused: number } {
    if (prompt.length === 0) throw new InferError("invalid_argument", "the prompt is empty");
    let common = 0;
    if (reuse) {
      const limit = Math.min(this.position, prompt.length - 1);
      while (common < limit && this.history[common] === prompt[common]) common++;
      if (!this.canRewindTo(common)) common = 0;
    }
    this.position = common;
    return { logits: this.evaluate(prompt.slice(common)), reused: common };
  }

  /** Whether the cache can drop back to `position` (see canRewind). */
  private canRewindTo(position: number): boolean {
    return canRewind(this.cache, this.model.info, this.position, position);
  }

  /** Generates from a prompt (text is tokenized as llama.cpp does: BOS, control tokens parsed). */
  generate(prompt: string | readonly number[], options: GenerateOptions): GenerateResult {
    const g = this.start(prompt, options);
    try {
      while (this.step(g));
    } finally {
      this.settle(g);
    }
    return g.generation.finish();
  }

  /**
   * As generate(), but yields to the event loop between tokens, so a signal handler (Ctrl-C)
   * or another event can set what `shouldStop` reads.
   */
  async generateAsync(prompt: string | readonly number[],
    options: GenerateOptions): Promise<GenerateResult> {
    const g = this.start(prompt, options);
    try {
      while (this.step(g)) await new Promise<void>((resolve) => setImmediate(resolve));
    } finally {
      this.settle(g);
    }
    return g.generation.finish();
  }

  private start(prompt: string | readonly number[], options: GenerateOptions): Running {
    const promptTokens = typeof prompt === "string"
      ? this.tokenizer.encode(prompt, { addSpecial: true, parseSpecial: true })
      : [...prompt];
    const generation = new Generation(this.tokenizer, promptTokens, this.contextLength, options);
    const { logits, reused } = this.prefill(promptTokens, options.reuseCache ?? true);
    generation.promptDone(promptTokens.length - reused);
    const be = this.backend;
    const onDevice = generation.greedy && be.argmaxToken !== undefined && setting("INFER_DEVICE_GREEDY");
    return { generation, logits, onDevice, inFlight: false };
  }

  /** Samples one token and evaluates it; false once generation has ended. */
  private step(g: Running): boolean {
    if (g.onDevice) return this.deviceStep(g);
    const token = g.generation.next(g.logits, this.position);
    if (token === null) return false;
    g.logits = this.evaluate([token]);
    return true;
  }

  /**
   * Greedy decoding with the argmax on the device, one step ahead of the host: the step that
   * evaluates token k+1 (the one step k's argmax left in device memory) is queued before the
   * host reads token k, so the GPU never waits for the host's sampling, streaming or launches.
   * The tokens and stop decisions are next()'s. When token k ends the generation, step k+1 was
   * speculative: its keys and values lie past the sequence's length and are never read.
   */
  private deviceStep(g: Running): boolean {
    const be = this.backend;
    if (!g.inFlight) {
      const token = g.generation.next(g.logits, this.position); // the prompt's logits, on the host
      if (token === null) return false;
      this.queueGreedy(token);
      this.history[this.position++] = token;
      g.inFlight = true;
      return true;
    }
    const ahead = this.position < this.contextLength;
    if (ahead) this.queueGreedy(null);
    const token = g.generation.accept(be.takeToken!(), this.position);
    if (token === null) {
      g.inFlight = false;
      be.dropTokens!();
      return false;
    }
    if (!ahead) throw new InferError("internal", "a token past the context was accepted");
    this.history[this.position++] = token;
    return true;
  }

  /** Queues one greedy step at the current position: `token`, or (null) the device's. */
  private queueGreedy(token: number | null): void {
    this.model.forwardBatch({
      tokens: token === null ? [] : [token],
      segments: [{ rows: 1, position: this.position, cache: this.cache.layers }],
      logitRows: 1, greedy: { tokenOnDevice: token === null },
    }, () => {
      throw new InferError("internal", "greedy decoding on the device produced host logits");
    });
  }

  /** After a generation (ended or failed): no device step stays queued. */
  private settle(g: Running): void {
    if (g.onDevice) {
      g.inFlight = false;
      this.backend.dropTokens!();
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
