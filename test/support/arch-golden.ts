// The random-weight GGUFs and prompts that test/fixtures/gen-arch-llama-golden.ts ran llama.cpp
// on and arch-llama-golden.test.ts runs infer on: one list, so the two cannot drift apart.
import {
  ministral3Q4_0, mistralNemoQ4_0, phi3MiniQ4_0, phi4MiniKQuants, type RandomQuantSpec,
} from "./random-quant-gguf.ts";

export const ARCH_GOLDEN_SPECS: Record<string, RandomQuantSpec> = {
  phi4MiniKQuants, phi3MiniQ4_0, mistralNemoQ4_0, ministral3Q4_0,
};

/** Each spec at a context: phi4MiniKQuants within its original 4096 (short factors) and past it. */
export const ARCH_GOLDEN_CASES: readonly { readonly spec: string; readonly ctx: number }[] = [
  { spec: "phi4MiniKQuants", ctx: 256 },
  { spec: "phi4MiniKQuants", ctx: 8192 },
  { spec: "phi3MiniQ4_0", ctx: 256 },
  { spec: "mistralNemoQ4_0", ctx: 256 },
  { spec: "ministral3Q4_0", ctx: 256 },
];

export const ARCH_GOLDEN_PROMPTS = [
  [2, 40, 77, 123, 200, 31, 99, 150, 7, 64, 250, 180],
  [2, 100, 101, 102, 103],
];
