// The random-weight GGUFs and prompts that test/fixtures/gen-arch-llama-golden.ts ran llama.cpp
// on and arch-llama-golden.test.ts runs infer on: one list, so the two cannot drift apart.
import { gemma3nKQuants, gemma3nQ8_0, randomGemma3nGguf } from "./random-gemma3n-gguf.ts";
import {
  ministral3Q4_0, mistralNemoQ4_0, phi3MiniQ4_0, phi4MiniKQuants, randomQuantGguf, type RandomQuantSpec,
} from "./random-quant-gguf.ts";

export const ARCH_GOLDEN_SPECS: Record<string, RandomQuantSpec> = {
  phi4MiniKQuants, phi3MiniQ4_0, mistralNemoQ4_0, ministral3Q4_0,
};

/** Every file by name: the specs above, and Gemma 3n's (random-gemma3n-gguf.ts). */
export const ARCH_GOLDEN_FILES: Record<string, () => Uint8Array> = {
  ...Object.fromEntries(Object.entries(ARCH_GOLDEN_SPECS).map(([name, spec]) =>
    [name, () => randomQuantGguf(spec)])),
  gemma3nKQuants: () => randomGemma3nGguf(gemma3nKQuants),
  gemma3nQ8_0: () => randomGemma3nGguf(gemma3nQ8_0),
};

/** Each spec at a context: phi4MiniKQuants within its original 4096 (short factors) and past it. */
export const ARCH_GOLDEN_CASES: readonly { readonly spec: string; readonly ctx: number }[] = [
  { spec: "phi4MiniKQuants", ctx: 256 },
  { spec: "phi4MiniKQuants", ctx: 8192 },
  { spec: "phi3MiniQ4_0", ctx: 256 },
  { spec: "mistralNemoQ4_0", ctx: 256 },
  { spec: "ministral3Q4_0", ctx: 256 },
  { spec: "gemma3nKQuants", ctx: 256 },
  { spec: "gemma3nQ8_0", ctx: 256 },
];

export const ARCH_GOLDEN_PROMPTS = [
  [2, 40, 77, 123, 200, 31, 99, 150, 7, 64, 250, 180],
  [2, 100, 101, 102, 103],
];
