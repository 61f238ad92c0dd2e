// Method: run the real default model (Gemma 3 270M Q4_K_M) on every prompt of the llama.cpp
// fixture (test/fixtures/gen-llama-golden.mjs: node-llama-cpp 3.21.1 and libllama on the same GGUF)
// and demand llama.cpp's answer: the logits at the last prompt position and 32 greedy tokens.
//
// The reference is llama.cpp's "token_by_token" variant (flash attention off, one token per ubatch).
// infer reproduces that arithmetic operation for operation (see docs/correctness.md, "Same
// answers as llama.cpp"), so logits are compared for equality as float32, not within a
// tolerance: this model turns a 1-ulp difference into a different greedy token within a few
// dozen steps, so anything short of equality would let a numerical slip through unnoticed.
import { describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { defaultModelPath } from "../ts/models/cache.ts";
import { Engine } from "../ts/engine/engine.ts";
import { argmax } from "../ts/sample/sampler.ts";

interface Reference { top_logits: [number, number][]; generated_tokens: number[]; gen_margins: number[] }
interface Case extends Reference { name: string; prompt_tokens: number[]; token_by_token: Reference; no_flash_attn: Reference }

const fixture = await Bun.file(join(import.meta.dir, "fixtures", "gemma3-golden.json")).json();
const modelPath = defaultModelPath();
if (!existsSync(modelPath)) throw new Error(`default model missing at ${modelPath}: run 'npm install' (or 'bun run setup')`);
const engine = Engine.open({ modelPath, contextLength: fixture.settings.context_size });

function greedy(prompt: number[], n: number): { logits: Float32Array; tokens: number[] } {
  engine.reset();
  let logits = engine.evaluate(prompt);
  const first = logits.slice();
  const tokens: number[] = [];
  for (let i = 0; i < n; i++) {
    tokens.push(argmax(logits));
    if (i + 1 < n) logits = engine.evaluate([tokens[i]]);
  }
  return { logits: first, tokens };
}

describe("Gemma 3 270M Q4_K_M equals llama.cpp", () => {
  for (const c of fixture.cases as Case[]) {
    test(`${c.name} (${c.prompt_tokens.length} prompt tokens)`, () => {
      const ref = c.token_by_token;
      const { logits, tokens } = greedy(c.prompt_tokens, ref.generated_tokens.length);
      // The fixture prints float32 with 9 significant digits, which round-trips through fround.
      const expected = ref.top_logits.map(([id, l]) => [id, Math.fround(l)]);
      expect(ref.top_logits.map(([id]) => [id, logits[id]])).toEqual(expected);
      expect(tokens).toEqual(ref.generated_tokens);
    }, 60_000);
  }
});

test("a prompt evaluated in one batch equals the same prompt fed token by token", () => {
  const prompt = (fixture.cases as Case[]).find((c) => c.name === "long-300")!.prompt_tokens.slice(0, 40);
  engine.reset();
  const batched = engine.evaluate(prompt).slice();
  engine.reset();
  let single: Float32Array = new Float32Array(0);
  for (const t of prompt) single = engine.evaluate([t]);
  expect(Array.from(single)).toEqual(Array.from(batched));
});
