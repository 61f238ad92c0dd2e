// Architectures by GGUF `general.architecture`. Loading validates the hyperparameters and every
// tensor's shape and type before the first token runs.
import type { Backend } from "../backend/backend.ts";
import { InferError } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";
import { Gemma3, gemma3Config } from "./gemma3.ts";
import { Hparams, LIMITS } from "./hparams.ts";
import { Llama, llamaConfig } from "./llama.ts";
import type { Model } from "./model.ts";
import { qwen2Config } from "./qwen2.ts";
import { qwen3Config } from "./qwen3.ts";

export interface LoadOptions {
  /** Tokens per forward pass; longer prompts are fed in chunks of this size. */
  readonly maxBatch: number;
}

type Loader = (file: GgufFile, meta: Hparams, vocab: number, be: Backend, o: LoadOptions) => Model;

const architectures: ReadonlyMap<string, Loader> = new Map<string, Loader>([
  ["gemma3", (file, meta, vocab, be, o) => new Gemma3(gemma3Config(meta, vocab), file, be, o.maxBatch)],
  ["llama", (file, meta, vocab, be, o) => new Llama(llamaConfig(meta, vocab), file, be, o.maxBatch)],
  ["qwen2", (file, meta, vocab, be, o) => new Llama(qwen2Config(meta, vocab), file, be, o.maxBatch)],
  ["qwen3", (file, meta, vocab, be, o) => new Llama(qwen3Config(meta, vocab), file, be, o.maxBatch)],
]);

export function supportedArchitectures(): string[] {
  return [...architectures.keys()];
}

export function loadModel(file: GgufFile, be: Backend, options: LoadOptions): Model {
  const arch = file.metadata.get("general.architecture");
  if (typeof arch !== "string") {
    throw new InferError("bad_model", `${file.path}: no general.architecture in the metadata`);
  }
  const loader = architectures.get(arch);
  if (!loader) {
    throw new InferError("unsupported", `${file.path}: architecture '${arch}' is not supported ` +
      `(supported: ${supportedArchitectures().join(", ")})`);
  }
  const embd = file.tensors.get("token_embd.weight");
  if (!embd || embd.dims.length !== 2) throw new InferError("bad_model", `${file.path}: no 2-D token_embd.weight`);
  const vocab = embd.dims[1];
  if (vocab > LIMITS.vocab) throw new InferError("bad_model", `${file.path}: vocabulary of ${vocab} is too large`);
  return loader(file, new Hparams(file.metadata, arch), vocab, be, options);
}
