// --gpus N (LoadOptions.gpus): tensor parallelism over N GPUs of one host. The sharding plan
// (ts/model/tensor-parallel.ts) is checked for the model here, before any backend or weight is
// touched, so a model that cannot be split N ways is refused with the reason. One GPU is the
// plan of one rank (the whole model), the backend's own path. Running N > 1 is not wired yet: the
// CUDA backend drives one device, so N > 1 is refused in one line after the plan is checked.
import type { BackendKind } from "../backend/select.ts";
import { InferError } from "../errors.ts";
import type { GgufFile } from "../gguf/reader.ts";
import type { ModelShape } from "../model/model.ts";
import { rankShapes, rankTensors, rankWeightBytes } from "../model/tensor-parallel.ts";
import { formatBytes } from "./memory.ts";

/** Checks `gpus` against the model and the backend (one GPU: any model any backend runs). */
export function checkGpus(gpus: number, backend: BackendKind, shape: ModelShape, file: GgufFile): void {
  const ranks = rankShapes(shape, gpus);
  if (gpus === 1) return;
  if (backend !== "cuda" && backend !== "auto") {
    throw new InferError("unsupported", `--gpus ${gpus} runs on the CUDA backend, not ${backend}`);
  }
  const bytes = ranks.map((r) => rankWeightBytes(rankTensors(file.tensors, shape, r)));
  throw new InferError("unsupported", `--gpus ${gpus}: running one model over several GPUs is not ` +
    `implemented yet (this model's split checks out, ${formatBytes(Math.max(...bytes))} of ` +
    "weights per GPU, but the CUDA backend drives one GPU); use --gpus 1");
}
