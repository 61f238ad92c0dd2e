// The logits a CPU engine gives for a prompt and then a few single tokens: what tests compare
// bit for bit between two ways of computing the same model (e.g. repacked or not).
import { Engine } from "../../ts/engine/engine.ts";

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
