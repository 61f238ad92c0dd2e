// The engine: opens a GGUF, builds the model on a backend, owns one sequence's KV cache and
// runs prompt → prefill (in chunks) → sample → decode, streaming text as it completes.
//
// The engine remembers the tokens its cache holds. A new prompt that starts with some of them
// (the next turn of a chat) reuses that prefix and evaluates only the rest; the arithmetic is the
// same either way, because a prompt evaluated in one batch equals the same prompt fed in pieces.
import { existsSync } from "node:fs";
import type { Backend, KvType } from "../backend/backend.ts";
import { createBackend, defaultBackendKind, type BackendKind } from "../backend/select.ts";
import { InferError } from "../errors.ts";
import { openGguf, type GgufFile } from "../gguf/reader.ts";
import type { Model } from "../model/model.ts";
import { loadModel } from "../model/registry.ts";
import { Sampler, type SamplerOptions } from "../sample/sampler.ts";
import { StopMatcher } from "../sample/stop.ts";
import { tokenizerFromMetadata, type StreamDecoder, type Tokenizer } from "../tokenizer/index.ts";
import { createKvCache, type KvCache } from "./kv-cache.ts";

export interface EngineOptions {
  readonly modelPath: string;
  readonly threads?: number;
  /** Positions the KV cache holds (default: min(4096, the model's trained context)). */
  readonly contextLength?: number;
  readonly batch?: number;
  readonly kvType?: KvType;
  /** cpu, cuda, or auto (CUDA when available); default: INFER_BACKEND, else cpu. */
  readonly backend?: BackendKind;
  /** Called as the model's tensors are prepared (done of total). */
  readonly onProgress?: (done: number, total: number) => void;
}

/** What constrains the next token (a JSON-schema grammar, for one). */
export interface TokenConstraint {
  /** Sets the logits of tokens that may not come next to -Infinity; `budget`: tokens left. */
  mask(logits: Float32Array, budget: number): void;
  /** Advances past `token` (one the mask allowed). */
  accept(token: number): void;
  /** The output is complete and nothing may follow it. */
  readonly done: boolean;
}

export interface GenerateOptions {
  /** Tokens to generate at most; a negative number: until the context is full. */
  readonly maxTokens: number;
  readonly sampling: SamplerOptions;
  readonly ignoreEos?: boolean;
  /** Generation ends before any of these strings; none of it is ever emitted. */
  readonly stop?: readonly string[];
  /** Tokens that end generation as end-of-generation does (a chat template's turn markers). */
  readonly stopTokens?: readonly number[];
  readonly constraint?: TokenConstraint;
  /** Reuse the cached prefix this prompt shares with the last sequence (default true). */
  readonly reuseCache?: boolean;
  /** Polled between tokens; true ends generation ("interrupted"). */
  readonly shouldStop?: () => boolean;
  /** Called with each piece of text as soon as it is complete UTF-8 and past any stop string. */
  readonly onText?: (text: string) => void;
}

export type StopReason = "eos" | "length" | "context" | "stop" | "complete" | "interrupted";

export interface GenerateResult {
  readonly promptTokens: number[];
  /** Prompt tokens evaluated now; the rest came from the cache. */
  readonly prefilled: number;
  readonly tokens: number[];
  readonly text: string;
  readonly stopReason: StopReason;
  readonly promptMs: number;
  readonly generateMs: number;
}

export class Engine {
  private position = 0;
  /** The tokens whose keys and values the cache holds, positions 0..position-1. */
  private readonly history: Int32Array;

  private constructor(readonly file: GgufFile, readonly backend: Backend, readonly model: Model,
    readonly tokenizer: Tokenizer, readonly cache: KvCache, readonly loadMs: number) {
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
      const onProgress = options.onProgress;
      const total = file.tensors.size;
      const counted = onProgress ? countingWeights(backend, total, onProgress) : backend;
      const model = loadModel(file, counted, { maxBatch: options.batch ?? 256 });
      onProgress?.(total, total);
      const tokenizer = tokenizerFromMetadata(file.metadata);
      const contextLength = options.contextLength ?? Math.min(4096, model.info.contextLength);
      if (!Number.isInteger(contextLength) || contextLength < 1) {
        throw new InferError("invalid_argument",
          `context length must be a positive integer, got ${contextLength}`);
      }
      const kvType = options.kvType ?? "f16";
      const cache = createKvCache(backend, model.info, contextLength, kvType, model.maxBatch);
      return new Engine(file, backend, model, tokenizer, cache, performance.now() - t0);
    } catch (err) {
      backend?.dispose?.();
      file.close();
      throw err;
    }
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

  /**
   * Whether the cache can drop back to `position`. A sliding-window ring reuses cells, so the
   * positions the next query sees (the window before `position`) must not have been overwritten
   * by positions past it: at most cells - window positions may be dropped.
   */
  private canRewindTo(position: number): boolean {
    if (position === 0 || position >= this.position) return true;
    return this.cache.layers.every((layer, i) => {
      if (!layer.ring) return true;
      return this.position - position <= layer.cells - this.model.info.kvShapes[i].window;
    });
  }

  /** Generates from a prompt (text is tokenized as llama.cpp does: BOS, control tokens parsed). */
  generate(prompt: string | readonly number[], options: GenerateOptions): GenerateResult {
    const g = this.start(prompt, options);
    while (g.step());
    return g.finish();
  }

  /**
   * As generate(), but yields to the event loop between tokens, so a signal handler (Ctrl-C)
   * or another event can set what `shouldStop` reads.
   */
  async generateAsync(prompt: string | readonly number[],
    options: GenerateOptions): Promise<GenerateResult> {
    const g = this.start(prompt, options);
    while (g.step()) await new Promise<void>((resolve) => setImmediate(resolve));
    return g.finish();
  }

  private start(prompt: string | readonly number[], options: GenerateOptions): Generation {
    const promptTokens = typeof prompt === "string"
      ? this.tokenizer.encode(prompt, { addSpecial: true, parseSpecial: true })
      : [...prompt];
    return new Generation(this, promptTokens, options);
  }

  close(): void {
    this.backend.dispose?.();
    this.file.close();
  }
}

/** One generation: prefill, then a token per step(). */
class Generation {
  private readonly sampler: Sampler;
  private readonly decoder: StreamDecoder;
  private readonly stops: StopMatcher;
  private readonly stopTokens: ReadonlySet<number>;
  private readonly tokens: number[] = [];
  private readonly t0 = performance.now();
  private readonly t1: number;
  private readonly prefilled: number;
  private logits: Float32Array;
  private text = "";
  private stopReason: StopReason = "length";
  private finished = false;

  constructor(private readonly engine: Engine, private readonly promptTokens: number[],
    private readonly o: GenerateOptions) {
    const { logits, reused } = engine.prefill(promptTokens, o.reuseCache ?? true);
    this.logits = logits;
    this.prefilled = promptTokens.length - reused;
    this.t1 = performance.now();
    this.sampler = new Sampler(o.sampling);
    for (const t of promptTokens) this.sampler.accept(t);
    this.decoder = engine.tokenizer.decoder();
    this.stops = new StopMatcher(o.stop ?? []);
    this.stopTokens = new Set(o.stopTokens ?? []);
    if (o.maxTokens === 0) this.finished = true;
  }

  private get maxTokens(): number {
    return this.o.maxTokens < 0 ? Infinity : this.o.maxTokens;
  }

  /** Samples and emits one token; false once generation has ended. */
  step(): boolean {
    if (this.finished) return false;
    const e = this.engine, o = this.o;
    if (o.shouldStop?.()) return this.end("interrupted");
    const constraint = o.constraint;
    const budget = Math.min(this.maxTokens - this.tokens.length, e.contextLength - e.length);
    const token = this.sampler.sample(this.logits,
      constraint ? (x) => constraint.mask(x, budget) : undefined);
    // Under a constraint, end-of-generation is allowed only once the output is complete.
    const eog = e.tokenizer.isEndOfGeneration(token);
    if (this.stopTokens.has(token) || (eog && (!o.ignoreEos || constraint))) return this.end("eos");
    constraint?.accept(token);
    this.sampler.accept(token);
    this.tokens.push(token);
    this.emit(this.decoder.push(token));
    if (this.stops.stopped) return this.end("stop");
    if (constraint?.done) return this.end("complete");
    if (this.tokens.length >= this.maxTokens) return this.end("length");
    if (e.length >= e.contextLength) return this.end("context");
    this.logits = e.evaluate([token]);
    return true;
  }

  private emit(piece: string): void {
    const out = this.stops.push(piece);
    if (out) {
      this.text += out;
      this.o.onText?.(out);
    }
  }

  private end(reason: StopReason): false {
    this.stopReason = reason;
    this.finished = true;
    return false;
  }

  finish(): GenerateResult {
    if (!this.stops.stopped) this.emit(this.decoder.flush());
    const tail = this.stops.flush();
    if (tail) {
      this.text += tail;
      this.o.onText?.(tail);
    }
    return {
      promptTokens: this.promptTokens, prefilled: this.prefilled, tokens: this.tokens,
      text: this.text, stopReason: this.stopReason, promptMs: this.t1 - this.t0,
      generateMs: performance.now() - this.t1,
    };
  }
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
