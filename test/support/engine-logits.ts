// The logits a CPU engine gives for a prompt and then a few single tokens: what tests compare
// bit for bit between two ways of computing the same model (e.g. repacked or not).
import { withSettings } from "../../ts/config/env.ts";
import { Engine } from "../../ts/engine/engine.ts";
import { argmax } from "../../ts/sample/sampler.ts";

export function promptAndStepLogits(modelPath: string, prompt: readonly number[],
  steps: readonly number[] = [7, 8, 9]): Float32Array[] {
  const engine = Engine.open({ modelPath, backend: "cpu", contextLength: 256, batch: 16 });
  try {
    const logits = [engine.evaluate([...prompt]).slice()];
    for (const t of steps) logits.push(engine.evaluate([t]).slice());
    return logits;
  } finally {
    engine.close();
  }
}

/** A prompt's logits, then `steps` greedy tokens with the logits after each. */
export interface GreedyRun { tokens: number[]; promptLogits: Float32Array; stepLogits: Float32Array[] }

/** The prompt (after a reset), then `steps` greedy tokens; logits copied at every step. */
export function greedyRun(engine: Engine, prompt: number[], steps: number): GreedyRun {
  engine.reset();
  let logits = engine.evaluate(prompt);
  const promptLogits = logits.slice(), tokens: number[] = [], stepLogits: Float32Array[] = [];
  for (let i = 0; i < steps; i++) {
    tokens.push(argmax(logits));
    logits = engine.evaluate([tokens[i]]);
    stepLogits.push(logits.slice());
  }
  return { tokens, promptLogits, stepLogits };
}

/** `f` with the CUDA backend's step graphs on or off (INFER_CUDA_GRAPHS), restored after. */
export function withCudaGraphs<T>(on: boolean, f: () => T): T {
  return withSettings({ INFER_CUDA_GRAPHS: on ? "1" : "0" }, f);
}
