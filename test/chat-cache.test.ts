// Method: on the tiny random Gemma (sliding window 8, so its local layers keep a ring of cells),
// prefill prompts that share a prefix with what the cache holds and compare the logits with a
// fresh evaluation of the whole prompt, bit for bit: when the shared part is reused, when the
// prompt goes back a little (within what the ring still holds) and when it goes back too far
// for the ring (then the engine must evaluate from the start), counting what earlier, longer
// sequences wrote there.
import { expect, test } from "bun:test";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Engine } from "../ts/engine/engine.ts";
import { ringCells } from "../ts/engine/kv-cache.ts";
import { seededRandom } from "../ts/sample/sampler.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const dir = mkdtempSync(join(tmpdir(), "infer-cache-"));
const modelPath = join(dir, "tiny.gguf");
writeFileSync(modelPath, tinyGemma3Gguf());
const contextLength = 2048; // past the ring, so the local layers really are rings
const engine = Engine.open({ modelPath, contextLength });
const fresh = Engine.open({ modelPath, contextLength });
const rand = seededRandom(3);
const tokens = (n: number) => Array.from({ length: n }, () => 6 + Math.floor(rand() * (engine.tokenizer.vocabSize - 6)));

function freshLogits(prompt: number[]): number[] {
  fresh.reset();
  return Array.from(fresh.evaluate(prompt));
}

test("the tiny model's local layers are rings", () => {
  const ring = ringCells(8, engine.model.maxBatch);
  expect(ring).toBeLessThan(contextLength);
  expect(engine.cache.layers.filter((l) => l.ring).map((l) => l.cells)).toContain(ring);
});

test("a prompt that extends the cached sequence evaluates only its new tokens", () => {
  const base = tokens(700);
  engine.reset();
  engine.evaluate(base);
  const prompt = [...base, ...tokens(50)];
  const { logits, reused } = engine.prefill(prompt);
  expect(reused).toBe(700);
  expect(Array.from(logits)).toEqual(freshLogits(prompt));
  expect(engine.tokens()).toEqual(prompt);
});

test("a prompt that diverges a little goes back, within the ring", () => {
  const base = tokens(1000);
  engine.reset();
  engine.evaluate(base);
  const prompt = [...base.slice(0, 900), ...tokens(30)]; // 100 positions back: the ring still has them
  const { logits, reused } = engine.prefill(prompt);
  expect(reused).toBe(900);
  expect(Array.from(logits)).toEqual(freshLogits(prompt));
});

test("a prompt that diverges too far back for the ring is evaluated from the start", () => {
  const base = tokens(1200);
  engine.reset();
  engine.evaluate(base);
  const prompt = [...base.slice(0, 400), ...tokens(30)]; // 800 back: past the ring's 512 cells
  const { logits, reused } = engine.prefill(prompt);
  expect(reused).toBe(0);
  expect(Array.from(logits)).toEqual(freshLogits(prompt));
});

test("going back counts the positions written before an earlier rewind", () => {
  const base = tokens(1300);
  engine.reset();
  engine.evaluate(base);
  engine.prefill([...base.slice(0, 1000), ...tokens(10)]); // 300 back: the ring still has them
  // 310 back from the 1010 held, but positions 1204..1299 took the ring cells of 692..787
  const prompt = [...base.slice(0, 700), ...tokens(3)]; // its last token attends to 695..702
  const { logits, reused } = engine.prefill(prompt);
  expect(reused).toBe(0);
  expect(Array.from(logits)).toEqual(freshLogits(prompt));
});

test("the same prompt again re-evaluates only its last token", () => {
  const prompt = tokens(300);
  engine.reset();
  engine.prefill(prompt);
  const { logits, reused } = engine.prefill(prompt);
  expect(reused).toBe(299);
  expect(Array.from(logits)).toEqual(freshLogits(prompt));
});

test("reuseCache: false evaluates everything", () => {
  const prompt = tokens(50);
  engine.prefill(prompt);
  const r = engine.generate(prompt, { maxTokens: 1, reuseCache: false, sampling: { temperature: 0, topK: 1, topP: 1, minP: 0, seed: 0 } });
  expect(r.prefilled).toBe(50);
});
