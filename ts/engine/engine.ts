// The engine: opens a GGUF, builds the model on a backend, owns one sequence's KV cache and
// runs prompt → prefill (in chunks) → sample → decode, streaming text as it completes.
import { existsSync } from "node:fs";
import type { Backend, KvType } from "../backend/backend.ts";
import { CpuBackend } from "../backend/cpu.ts";
import { InferError } from "../errors.ts";
import { openGguf, type GgufFile } from "../gguf/reader.ts";
import type { Model } from "../model/model.ts";
import { loadModel } from "../model/registry.ts";
import { Sampler, type SamplerOptions } from "../sample/sampler.ts";
import { tokenizerFromMetadata, type Tokenizer } from "../tokenizer/index.ts";
import { createKvCache, type KvCache } from "./kv-cache.ts";

export interface EngineOptions {
  readonly modelPath: string;
  readonly threads?: number;
  /** Positions the KV cache holds (default: min(4096, the model's trained context)). */
  readonly contextLength?: number;
  readonly batch?: number;
  readonly kvType?: KvType;
}

export interface GenerateOptions {
  readonly maxTokens: number;
  readonly sampling: SamplerOptions;
  readonly ignoreEos?: boolean;
  /** Called with each piece of text as soon as it is complete UTF-8. */
  readonly onText?: (text: string) => void;
}

export type StopReason = "eos" | "length" | "context";

export interface GenerateResult {
  readonly promptTokens: number[];
  readonly tokens: number[];
  readonly text: string;
  readonly stopReason: StopReason;
  readonly promptMs: number;
  readonly generateMs: number;
}

export class Engine {
  private position = 0;

  private constructor(readonly file: GgufFile, readonly backend: Backend, readonly model: Model,
    readonly tokenizer: Tokenizer, readonly cache: KvCache, readonly loadMs: number) {}

  static open(options: EngineOptions): Engine {
    const t0 = performance.now();
    if (!existsSync(options.modelPath)) {
      throw new InferError("io", `model file not found: ${options.modelPath}`);
    }
    const file = openGguf(options.modelPath);
    try {
      const backend = new CpuBackend();
      if (options.threads !== undefined) backend.setThreads(options.threads);
      const model = loadModel(file, backend, { maxBatch: options.batch ?? 256 });
      const tokenizer = tokenizerFromMetadata(file.metadata);
      const contextLength = options.contextLength ?? Math.min(4096, model.info.contextLength);
      if (!Number.isInteger(contextLength) || contextLength < 1) {
        throw new InferError("invalid_argument", `context length must be a positive integer, got ${contextLength}`);
      }
      const cache = createKvCache(backend, model.info, contextLength, options.kvType ?? "f16", model.maxBatch);
      return new Engine(file, backend, model, tokenizer, cache, performance.now() - t0);
    } catch (err) {
      file.close();
      throw err;
    }
  }

  get contextLength(): number {
    return this.cache.contextLength;
  }

  /** Forgets the sequence: the next evaluation starts at position 0. */
  reset(): void {
    this.position = 0;
  }

  /** Runs tokens through the model at the current position; returns the last token's logits. */
  evaluate(tokens: readonly number[]): Float32Array {
    if (tokens.length === 0) throw new InferError("invalid_argument", "nothing to evaluate");
    if (this.position + tokens.length > this.contextLength) {
      throw new InferError("context_overflow", `${this.position + tokens.length} tokens do not fit ` +
        `the context of ${this.contextLength} (raise --ctx-size)`);
    }
    let logits: Float32Array | null = null;
    for (let start = 0; start < tokens.length; start += this.model.maxBatch) {
      const chunk = tokens.slice(start, start + this.model.maxBatch);
      logits = this.model.forward(chunk, chunk.length, this.position, this.cache.layers);
      this.position += chunk.length;
    }
    return logits!;
  }

  generate(prompt: string | readonly number[], options: GenerateOptions): GenerateResult {
    const promptTokens = typeof prompt === "string"
      ? this.tokenizer.encode(prompt, { addSpecial: true, parseSpecial: true })
      : [...prompt];
    const t0 = performance.now();
    this.reset();
    let logits = this.evaluate(promptTokens);
    const t1 = performance.now();
    const sampler = new Sampler(options.sampling);
    const decoder = this.tokenizer.decoder();
    const tokens: number[] = [];
    let text = "", stopReason: StopReason = "length";
    while (tokens.length < options.maxTokens) {
      const token = sampler.sample(logits);
      if (!options.ignoreEos && this.tokenizer.isEndOfGeneration(token)) { stopReason = "eos"; break; }
      tokens.push(token);
      const piece = decoder.push(token);
      if (piece) { text += piece; options.onText?.(piece); }
      if (tokens.length === options.maxTokens) break;
      if (this.position >= this.contextLength) { stopReason = "context"; break; }
      logits = this.evaluate([token]);
    }
    const tail = decoder.flush();
    if (tail) { text += tail; options.onText?.(tail); }
    return { promptTokens, tokens, text, stopReason, promptMs: t1 - t0, generateMs: performance.now() - t1 };
  }

  close(): void {
    this.file.close();
  }
}
