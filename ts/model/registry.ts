// Architectures by GGUF `general.architecture`. Reading a model's shape validates its
// hyperparameters without touching a weight (so the engine can check that it fits first);
// loading it then checks every tensor's shape and type before the first token runs.
import type { Backend } from "../backend/backend.ts";
import { InferError, quote } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";
import { Gemma3, gemma3Config } from "./gemma3.ts";
import { Hparams, LIMITS } from "./hparams.ts";
import { Llama, llamaConfig } from "./llama.ts";
import type { Model, ModelShape } from "./model.ts";
import { qwen2Config } from "./qwen2.ts";
import { qwen3Config } from "./qwen3.ts";

export interface LoadOptions {
  /** Tokens per forward pass; longer prompts are fed in chunks of this size. */
  readonly maxBatch: number;
}

/** A file's validated configuration, and how to build its graph on a backend. */
interface Plan {
  readonly shape: ModelShape;
  build(be: Backend, maxBatch: number): Model;
}

type Planner = (file: GgufFile, meta: Hparams, vocab: number) => Plan;

const architectures: ReadonlyMap<string, Planner> = new Map<string, Planner>([
  ["gemma3", (file, meta, vocab) => {
    const c = gemma3Config(meta, vocab);
    return { shape: c, build: (be, maxBatch) => new Gemma3(c, file, be, maxBatch) };
  }],
  ["llama", (file, meta, vocab) => {
    const c = llamaConfig(meta, vocab);
    return { shape: c, build: (be, maxBatch) => new Llama(c, file, be, maxBatch) };
  }],
  ["qwen2", (file, meta, vocab) => {
    const c = qwen2Config(meta, vocab);
    return { shape: c, build: (be, maxBatch) => new Llama(c, file, be, maxBatch) };
  }],
  ["qwen3", (file, meta, vocab) => {
    const c = qwen3Config(meta, vocab);
    return { shape: c, build: (be, maxBatch) => new Llama(c, file, be, maxBatch) };
  }],
]);

export function supportedArchitectures(): string[] {
  return [...architectures.keys()];
}

function plan(file: GgufFile): Plan {
  const arch = file.metadata.get("general.architecture");
  if (typeof arch !== "string") {
    throw new InferError("bad_model", `${file.path}: no general.architecture in the metadata`);
  }
  const planner = architectures.get(arch);
  if (!planner) {
    throw new InferError("unsupported", `${file.path}: architecture ${quote(arch)} is not ` +
      `supported (supported: ${supportedArchitectures().join(", ")})`);
  }
  const embd = file.tensors.get("token_embd.weight");
  if (!embd || embd.dims.length !== 2) {
    throw new InferError("bad_model", `${file.path}: no 2-D token_embd.weight`);
  }
  const vocab = embd.dims[1];
  if (vocab > LIMITS.vocab) {
    throw new InferError("bad_model", `${file.path}: vocabulary of ${vocab} is too large`);
  }
  return planner(file, new Hparams(file.metadata, arch), vocab);
}

/** The model's validated shape; nothing is allocated. */
export function modelShape(file: GgufFile): ModelShape {
  return plan(file).shape;
}

export function loadModel(file: GgufFile, be: Backend, options: LoadOptions): Model {
  return plan(file).build(be, options.maxBatch);
}
