// The GPU time of one decode step alone, for the CUDA benches: the step's graph replayed back to
// back, so that the host's share of a step (sampling, FFI, scheduling) drops out.
import type { CudaBackend } from "../ts/backend/cuda.ts";
import type { Engine } from "../ts/engine/engine.ts";
import { native } from "../ts/native/lib.ts";

/**
 * Microseconds of GPU time per decode step: the graph launched last replayed `times` times back
 * to back (at the position the device holds: the last step's); NaN where no graph ran.
 */
export function replayUs(engine: Engine, times: number): number {
  const exec = (engine.backend as CudaBackend).lastGraph;
  if (exec === 0) return NaN;
  const lib = native();
  lib.infer_cuda_sync();
  const t0 = performance.now();
  for (let i = 0; i < times; i++) lib.infer_cuda_graph_launch(exec);
  lib.infer_cuda_sync();
  return ((performance.now() - t0) * 1000) / times;
}
