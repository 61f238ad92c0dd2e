// The tiny random Gemma 3 the scheduler's tests run on: sliding window 8, and batch 16, which
// makes its local layers rings of 256 cells, so prompts past that wrap them. Written to a
// temporary folder in beforeAll, with a reference engine to compare against; gone in afterAll.
import { afterAll, beforeAll } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Engine } from "../../ts/engine/engine.ts";
import { tinyGemma3Gguf } from "./tiny-gguf.ts";

export interface TinySchedulerModel {
  /** A new engine on the model (each scheduler gets its own). */
  open(): Engine;
  /** An engine opened once, for the tokens each sequence gets alone. */
  readonly reference: Engine;
}

/** Registers the model's beforeAll and afterAll; the fields are set once beforeAll has run. */
export function tinySchedulerModel(): TinySchedulerModel {
  let dir = "", modelPath = "";
  const open = () => Engine.open({ modelPath, contextLength: 1024, batch: 16, threads: 2, backend: "cpu" });
  const model = { open, reference: null as unknown as Engine };
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "infer-sched-"));
    modelPath = join(dir, "tiny.gguf");
    writeFileSync(modelPath, tinyGemma3Gguf({ shape: { layers: 3, embedding: 64, feedForward: 128,
      heads: 4, kvHeads: 2, headDim: 32 }, branchGain: 16 }));
    model.reference = open();
  });
  afterAll(() => {
    model.reference?.close();
    rmSync(dir, { recursive: true, force: true });
  });
  return model;
}

/** A prompt of `n` tokens from the toy vocabulary (BOS first, then `prefix`), varied by `seed`. */
export function toyPrompt(n: number, seed: number, prefix: readonly number[] = []): number[] {
  const out = [2, ...prefix];
  let s = seed;
  while (out.length < n) out.push(6 + ((s = (s * 1103515245 + 12345) >>> 0) % 260));
  return out;
}
