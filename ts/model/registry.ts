// Architectures by GGUF `general.architecture`. Reading a model's shape validates its
// hyperparameters without touching a weight (so the engine can check that it fits first);
// loading it then checks every tensor's shape and type before the first token runs.
import type { Backend } from "../backend/backend.ts";
import { InferError, quote } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";
import { Gemma3, gemma3Config } from "./gemma3.ts";
import { Gemma3n, gemma3nConfig } from "./gemma3n.ts";
import { GptOss, gptossConfig } from "./gptoss.ts";
import { Hparams, LIMITS } from "./hparams.ts";
import { Llama, llamaConfig } from "./llama.ts";
import { Mistral3, mistral3Config } from "./mistral3.ts";
import type { Model, ModelShape } from "./model.ts";
import { Phi3, phi3Config } from "./phi3.ts";
import { declaredPooling, type Pooling } from "./pooling.ts";
import { qwen2Config } from "./qwen2.ts";
import { qwen3Config } from "./qwen3.ts";
import { Qwen3Moe, qwen3moeConfig } from "./qwen3moe.ts";

/** A file's validated configuration, and how to build its graph on a backend. */
export interface ModelPlan {
  readonly shape: ModelShape;
  /** How the model pools its hidden states into an embedding (pooling.ts; null: a reranker). */
  readonly pooling: Pooling | null;
  /**
   * The graph, every tensor's shape and type checked; `maxBatch` tokens per forward pass;
   * `contextLength`, each sequence's context where the family's RoPE depends on it (LongRoPE).
   */
  build(be: Backend, maxBatch: number, contextLength?: number): Model;
}

type Planner = (file: GgufFile, meta: Hparams, vocab: number) => Omit<ModelPlan, "pooling">;

/** A family: its configuration from the metadata, and the graph that runs it. */
function family<C extends ModelShape>(config: (meta: Hparams, vocab: number) => C,
  Graph: new (config: C, file: GgufFile, be: Backend, maxBatch: number, contextLength?: number)
    => Model): Planner {
  return (file, meta, vocab) => {
    const c = config(meta, vocab);
    return { shape: c,
      build: (be, maxBatch, contextLength) => new Graph(c, file, be, maxBatch, contextLength) };
  };
}

const architectures: ReadonlyMap<string, Planner> = new Map<string, Planner>([
  ["gemma3", family(gemma3Config, Gemma3)],
  ["gemma3n", family(gemma3nConfig, Gemma3n)],
  ["gpt-oss", family(gptossConfig, GptOss)],
  ["llama", family(llamaConfig, Llama)],
  ["mistral3", family(mistral3Config, Mistral3)],
  ["phi3", family(phi3Config, Phi3)],
  ["qwen2", family(qwen2Config, Llama)],
  ["qwen3", family(qwen3Config, Llama)],
  ["qwen3moe", family(qwen3moeConfig, Qwen3Moe)],
]);

export function supportedArchitectures(): string[] {
  return [...architectures.keys()];
}

/** Validates the file's hyperparameters (nothing is allocated) and plans its model. */
export function planModel(file: GgufFile): ModelPlan {
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
  const meta = new Hparams(file.metadata, arch);
  return { ...planner(file, meta, vocab), pooling: declaredPooling(meta) };
}
