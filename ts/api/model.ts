// The library's model: loadModel() opens a GGUF on the engine's own thread (ts/runtime/) and
// returns a Model whose calls never block the caller's event loop. Calls in flight together
// share forward passes (the batch scheduler), each getting exactly the tokens it gets alone.
import type { KvType } from "../backend/backend.ts";
import { defaultBackendKind, parseBackendKind, type BackendKind } from "../backend/select.ts";
import { chatTemplateFor, type ChatMessage, type ChatTemplate } from "../chat/template.ts";
import { InferError, quote } from "../errors.ts";
import { openGguf, type GgufFile } from "../gguf/reader.ts";
import { DEFAULT_MODEL } from "../models/cache.ts";
import { ensureModel } from "../models/fetch.ts";
import { resolveDraftModel } from "../engine/self-draft.ts";
import type { SpeculationMode } from "../engine/speculation.ts";
import { EngineThread } from "../runtime/engine-thread.ts";
import type { EngineInfo } from "../runtime/messages.ts";
import { tokenizerFromMetadata, type Tokenizer } from "../tokenizer/index.ts";
import { Chat, type ChatOptions } from "./chat.ts";
import { embedJobOf, runEmbedding, type EmbedOptions } from "./embed.ts";
import { jobOf, speculationOf, type Completion, type GenerateOptions } from "./options.ts";
import { CompletionStream } from "./stream.ts";

export interface LoadOptions {
  /** cpu, cuda, metal, or auto: Metal on Apple silicon, else CUDA when available, else the CPU (default). */
  readonly backend?: BackendKind;
  /** CPU threads (default: physical cores). */
  readonly threads?: number;
  /**
   * GPUs of this host to split the model over (tensor parallelism; default 1). Checked against
   * the model's heads and quant blocks; more than 1 is refused for now (docs/cuda.md, "Several GPUs").
   */
  readonly gpus?: number;
  /** Positions each sequence's KV cache holds (default: min(4096, the model's)). */
  readonly contextLength?: number;
  /**
   * How the KV cache stores keys (llama.cpp's --cache-type-k): "f16" (default), "q8_0" or
   * "q4_0" (32 values to an f16 scale: about half and a quarter of f16's memory), or infer's
   * rotated codes "tq4" and "tq3" (about 4 and 3 bits a value; head_dim a power of two). CPU and CUDA.
   */
  readonly cacheTypeK?: KvType;
  /** How the KV cache stores values (llama.cpp's --cache-type-v), as cacheTypeK. */
  readonly cacheTypeV?: KvType;
  /**
   * Generations decoded together, each with a KV cache of `contextLength` (default 4; on CUDA
   * with its paged cache, as many as fit: docs/server.md; 1 on a backend that runs one sequence
   * at a time). More calls than this wait their turn.
   */
  readonly parallel?: number;
  /** Memory for sharing prompt beginnings across calls, in bytes (default 128 MiB; 0: none). */
  readonly prefixCacheBytes?: number;
  /** Speculative decoding for calls that name none (GenerateOptions.speculation). */
  readonly speculation?: SpeculationMode;
  /** Drafted tokens a step at most, for calls that name none (1..64, default 16). */
  readonly draftMax?: number;
  /**
   * A GGUF (path or cached name) with the model's vocabulary that drafts for speculation
   * "draft" (then the default): a smaller model of the family, or a Q4_0 copy of this one;
   * "self": this model's own Q4_0 copy, made once and cached (ts/engine/self-draft.ts).
   */
  readonly draftModel?: string;
  /** Called as the weights are prepared: done of total tensors. */
  readonly onProgress?: (done: number, total: number) => void;
  /**
   * Called as a model is downloaded (the default model on its first use, or a Hub model not yet
   * cached): received of total bytes. When given, nothing is printed; else progress goes to
   * stderr.
   */
  readonly onDownloadProgress?: (receivedBytes: number, totalBytes: number) => void;
}

export interface ModelInfo extends EngineInfo {
  /** The GGUF file. */
  readonly path: string;
}

export interface TokenizeOptions {
  /** Add the model's BOS (and EOS where it asks) as llama.cpp does (default false). */
  readonly addSpecial?: boolean;
  /** Read control-token text (`<start_of_turn>`) as those tokens (default false). */
  readonly parseSpecial?: boolean;
}

/**
 * Opens a model: a GGUF path, the name of a model in the cache (`infer models` lists them;
 * default: Gemma 3 270M Q4_K_M, fetched into the cache on its first use), or a model on the
 * Hugging Face Hub, `org/repo:QUANT` or `org/repo/file.gguf`, pulled into the cache unless it is
 * there. Rejects with an
 * InferError whose `code` says why (io, bad_gguf, bad_model, out_of_memory, unsupported, ...).
 */
export async function loadModel(nameOrPath: string = DEFAULT_MODEL.name,
  options: LoadOptions = {}): Promise<Model> {
  if (typeof nameOrPath !== "string" || nameOrPath === "") {
    throw new InferError("invalid_argument", "loadModel: expected a GGUF path or a cached model's name");
  }
  if (options.draftModel !== undefined &&
    (typeof options.draftModel !== "string" || options.draftModel === "")) {
    throw new InferError("invalid_argument",
      "loadModel: draftModel must be a GGUF path, a cached model's name or \"self\"");
  }
  const gpus: unknown = options.gpus;
  if (gpus !== undefined && !(Number.isInteger(gpus) && (gpus as number) >= 1 &&
    (gpus as number) <= 64)) {
    throw new InferError("invalid_argument", `loadModel: gpus must be an integer from 1 to 64, ` +
      `got ${typeof gpus === "string" ? quote(gpus) : String(gpus)}`);
  }
  const backend = options.backend === undefined ? defaultBackendKind("auto")
    : parseBackendKind(options.backend, "backend");
  // the default model on its first use, and a Hub model not yet cached, are fetched first
  const onProgress = options.onDownloadProgress;
  const path = await ensureModel(nameOrPath,
    onProgress ? { onProgress, onNote: () => {} } : {});
  const thread = await EngineThread.open({
    modelPath: path, backend, gpus: options.gpus, threads: options.threads,
    contextLength: options.contextLength,
    cacheTypeK: options.cacheTypeK, cacheTypeV: options.cacheTypeV,
    parallel: options.parallel ?? "auto", prefixCacheBytes: options.prefixCacheBytes,
    speculation: speculationOf(options),
    draftModel: options.draftModel === undefined ? undefined
      : await resolveDraftModel(options.draftModel, path, onProgress !== undefined),
  }, options.onProgress);
  return new Model(thread, path);
}

export class Model implements AsyncDisposable {
  readonly info: ModelInfo;
  private file: GgufFile | null = null;
  private tokenizerCache: Tokenizer | null = null;
  private templateCache: ChatTemplate | null = null;
  private closed: Promise<void> | null = null;

  /** @internal loadModel() makes models. */
  constructor(private readonly thread: EngineThread, path: string) {
    this.info = { ...thread.info, path };
  }

  /** Generates a continuation of `prompt` (text, tokenized as llama.cpp does, or token ids). */
  complete(prompt: string | readonly number[], options: GenerateOptions = {}): Promise<Completion> {
    try {
      return this.start({ prompt }, options).result;
    } catch (err) {
      return Promise.reject(err);
    }
  }

  /**
   * As complete(), piece by piece: `for await (const p of model.stream(prompt)) ...`; the
   * returned stream's `result` holds the whole completion once it has ended.
   */
  stream(prompt: string | readonly number[], options: GenerateOptions = {}): CompletionStream {
    return this.start({ prompt }, options);
  }

  /**
   * The embedding of a text (or one per text, in order): the model's last hidden state pooled
   * (options.pooling) and L2-normalised, as llama.cpp's llama-embedding computes it. Texts are
   * tokenized as for complete() (BOS added); each must fit the context.
   */
  embed(text: string, options?: EmbedOptions): Promise<Float32Array>;
  embed(texts: readonly string[], options?: EmbedOptions): Promise<Float32Array[]>;
  async embed(input: string | readonly string[],
    options: EmbedOptions = {}): Promise<Float32Array | Float32Array[]> {
    if (this.closed) throw new InferError("invalid_argument", "the model is closed");
    const one = typeof input === "string";
    const texts = one ? [input] : input;
    if (!Array.isArray(texts) || !texts.every((t) => typeof t === "string")) {
      throw new InferError("invalid_argument", "embed: expected a string or an array of strings");
    }
    if (texts.length === 0) return [];
    const r = await runEmbedding(this.thread, embedJobOf(texts, options), options.signal);
    return one ? r.embeddings[0] : [...r.embeddings];
  }

  /** A conversation in the model's chat template; its KV cache is reused between turns. */
  chat(options: ChatOptions = {}): Chat {
    return new Chat(this, options);
  }

  /** Text to token ids, without BOS unless asked (see TokenizeOptions). */
  tokenize(text: string, options: TokenizeOptions = {}): number[] {
    if (typeof text !== "string") throw new InferError("invalid_argument", "tokenize: expected a string");
    return this.tokenizer().encode(text, { addSpecial: options.addSpecial ?? false,
      parseSpecial: options.parseSpecial ?? false });
  }

  /** Token ids to text (control tokens have none). */
  detokenize(tokens: readonly number[]): string {
    const vocab = this.info.vocabSize;
    if (!Array.isArray(tokens) || !tokens.every((t) => Number.isInteger(t) && t >= 0 && t < vocab)) {
      throw new InferError("invalid_argument", `detokenize: expected token ids in 0..${vocab - 1}`);
    }
    return this.tokenizer().decode(tokens);
  }

  /** Ends every generation (with its text so far), then frees the model. */
  close(): Promise<void> {
    this.closed ??= this.thread.close().finally(() => {
      this.file?.close();
      this.file = null;
    });
    return this.closed;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  /** @internal A generation of a prompt or (for Chat) a conversation. */
  start(input: { prompt: string | readonly number[] } | { messages: readonly ChatMessage[] },
    options: GenerateOptions): CompletionStream {
    if (this.closed) throw new InferError("invalid_argument", "the model is closed");
    return new CompletionStream(this.thread, jobOf(input, options, this.info.vocabSize), options);
  }

  /** @internal The chat template, read on this thread (Chat checks loaded conversations with it). */
  template(): ChatTemplate {
    this.templateCache ??= chatTemplateFor(this.gguf().metadata, this.tokenizer());
    return this.templateCache;
  }

  private tokenizer(): Tokenizer {
    this.tokenizerCache ??= tokenizerFromMetadata(this.gguf().metadata);
    return this.tokenizerCache;
  }

  /** The file's metadata on this thread, for the tokenizer (the weights stay the engine's). */
  private gguf(): GgufFile {
    if (this.closed) throw new InferError("invalid_argument", "the model is closed");
    this.file ??= openGguf(this.info.path);
    return this.file;
  }
}
