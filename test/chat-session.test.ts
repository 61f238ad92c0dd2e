// Method: a five-turn greedy chat with the default model through ChatSession, checking after
// each turn that the prompt is the template's rendering of the whole conversation, that only
// its new tokens were evaluated (the rest came from the cache: "prefilled N of M"), and that the
// answer equals the one computed with no cache reuse at all, so reuse changes nothing but speed.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ChatSession, parseMessages } from "../ts/chat/session.ts";
import { defaultModelPath } from "../ts/models/cache.ts";
import { Engine } from "../ts/engine/engine.ts";

const modelPath = defaultModelPath();
const greedy = { temperature: 0, topK: 40, topP: 1, minP: 0, seed: 1 };

describe.skipIf(!existsSync(modelPath))("a five-turn chat on the default model", () => {
  const engine = Engine.open({ modelPath, contextLength: 1024 });
  const fresh = Engine.open({ modelPath, contextLength: 1024 });
  afterAll(() => { engine.close(); fresh.close(); });

  test("each turn prefills only what is new and answers as a fresh evaluation would", async () => {
    const session = new ChatSession(engine, "You are a helpful assistant. Answer briefly.");
    const questions = ["Hello! What is your name?", "What is the capital of France?", "And of Italy?",
      "Name three colors.", "Thank you, goodbye!"];
    let previous: number[] = [];
    for (const [i, q] of questions.entries()) {
      const expectedPrompt = session.template.encode(engine.tokenizer, [...session.messages, { role: "user", content: q }]);
      const cachedBefore = engine.tokens();
      const turn = await session.send(q, { sampling: greedy, maxTokens: 24 });
      expect(turn.promptTokens).toEqual(expectedPrompt);
      // The cache held the previous prompt and its answer; the new prompt shares at least the
      // previous prompt, so only the rest (the end of the last turn and the new one) is evaluated.
      let common = 0;
      while (common < cachedBefore.length && cachedBefore[common] === expectedPrompt[common]) common++;
      expect(turn.prefilled).toBe(i === 0 ? expectedPrompt.length : expectedPrompt.length - common);
      if (i > 0) {
        expect(common).toBeGreaterThanOrEqual(previous.length);
        expect(turn.prefilled).toBeLessThan(expectedPrompt.length / 2);
      }
      const reference = fresh.generate(expectedPrompt, { sampling: greedy, maxTokens: 24, reuseCache: false,
        stopTokens: session.stopTokens });
      expect(turn.tokens).toEqual(reference.tokens);
      expect(turn.reply).toBe(reference.text);
      previous = expectedPrompt;
    }
    expect(session.messages).toHaveLength(1 + 2 * questions.length);
  }, 120_000);

  test("a saved conversation loads back, and a bad one is refused with a reason", () => {
    const dir = mkdtempSync(join(tmpdir(), "infer-chat-"));
    const session = new ChatSession(engine, "sys");
    const path = join(dir, "c.json");
    writeFileSync(path, JSON.stringify({ messages: [{ role: "system", content: "S" }, { role: "user", content: "u" },
      { role: "assistant", content: "a" }] }));
    session.load(path);
    expect(session.messages).toEqual([{ role: "system", content: "S" }, { role: "user", content: "u" },
      { role: "assistant", content: "a" }]);
    session.save(join(dir, "d.json"));
    const other = new ChatSession(engine);
    other.load(join(dir, "d.json"));
    expect(other.messages).toEqual(session.messages);
    expect(() => parseMessages({ messages: [{ role: "robot", content: "x" }] }, "f")).toThrow(/message 0 needs a role/);
    expect(() => parseMessages({ nope: 1 }, "f")).toThrow(/expected \{ "messages"/);
    // Gemma's template refuses two user turns in a row: the session says so and stays as it was
    writeFileSync(path, JSON.stringify([{ role: "user", content: "a" }, { role: "user", content: "b" }]));
    expect(() => session.load(path)).toThrow(/roles must alternate/);
    expect(session.messages).toHaveLength(3);
  });
});
