// The reference a scheduled sequence is held to: one sequence alone, its prompt evaluated in one
// go by Engine.evaluate and then one token at a time, each sampled on the host by Generation.
import type { Engine } from "../../ts/engine/engine.ts";
import {
  Generation, type GenerateOptions, type GenerateResult,
} from "../../ts/engine/generation.ts";

export function referenceGenerate(engine: Engine, prompt: readonly number[],
  options: GenerateOptions): GenerateResult {
  engine.reset();
  const g = new Generation(engine.tokenizer, prompt, engine.contextLength, options);
  if (g.done) return g.finish();
  let logits = engine.evaluate(prompt);
  g.promptDone(prompt.length);
  for (let t = g.next(logits, engine.length); t !== null; t = g.next(logits, engine.length)) {
    logits = engine.evaluate([t]);
  }
  return g.finish();
}
