// qwen3moe and gpt-oss against llama.cpp: random-weight GGUFs with Qwen3-30B-A3B's routing (128
// experts, 8 chosen, scaled-down widths; Q4_0 experts), K-quant experts and MXFP4 experts, and
// gpt-oss-20b's shape scaled down (MXFP4 experts, sinks, sliding layers, YaRN, biases), rebuilt here
// exactly as test/fixtures/gen-moe-llama-golden.ts wrote them for dump-logits.c (libllama). The
// greedy tokens must be llama.cpp's, and the top logits at the last prompt position close to its.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Engine } from "../ts/engine/engine.ts";
import { argmax } from "../ts/sample/sampler.ts";
import {
  gptossMxfp4, qwen3moeKQuants, qwen3moeMxfp4, qwen3moeQ4_0, randomQuantGguf, type RandomQuantSpec,
} from "./support/random-quant-gguf.ts";

interface Case { spec: string; prompt: number[]; top: [number, number][]; generated: number[] }
const fixture = await Bun.file(join(import.meta.dir, "fixtures", "moe-llama-golden.json")).json();
const specs: Record<string, RandomQuantSpec> = { qwen3moeQ4_0, qwen3moeKQuants, qwen3moeMxfp4, gptossMxfp4 };
const dir = mkdtempSync(join(tmpdir(), "infer-moe-golden-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Relative to the largest of llama.cpp's top logits; its f32 sums run in another order. */
const TOP_LOGITS_TOLERANCE = 1e-3;

describe("qwen3moe and gpt-oss equal llama.cpp on random-weight GGUFs", () => {
  for (const [name, spec] of Object.entries(specs)) {
    const path = join(dir, `${name}.gguf`);
    writeFileSync(path, randomQuantGguf(spec));
    for (const c of (fixture.cases as Case[]).filter((x) => x.spec === name)) {
      for (const batch of [256, 4]) {
        test(`${name}, ${c.prompt.length} prompt tokens in batches of ${batch}: greedy tokens ` +
          "and top logits", () => {
          const engine = Engine.open({ modelPath: path, contextLength: 256, batch, kvType: "f16",
            threads: 2 });
          try {
            let logits = engine.evaluate(c.prompt);
            const scale = Math.max(...c.top.map(([, l]) => Math.abs(l)));
            for (const [id, l] of c.top) {
              expect(Math.abs(logits[id] - l) / scale).toBeLessThan(TOP_LOGITS_TOLERANCE);
            }
            const tokens: number[] = [];
            for (let i = 0; i < c.generated.length; i++) {
              tokens.push(argmax(logits));
              if (i + 1 < c.generated.length) logits = engine.evaluate([tokens[i]]);
            }
            expect(tokens).toEqual(c.generated);
          } finally {
            engine.close();
          }
        });
      }
    }
  }
});
