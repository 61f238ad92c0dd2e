// Method: a five-turn greedy chat with the default model through the library's Chat, checking
// after each turn that the prompt is the template's rendering of the whole conversation, that
// only its new tokens were evaluated (the rest came from the sequence's cache: "prefilled N of
// M"), and that the answer equals a fresh evaluation of the same prompt in another model (no
// cache at all), so reuse changes nothing but speed.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadModel } from "../ts/api/index.ts";
import { parseMessages, readConversation, writeConversation } from "../ts/chat/conversation.ts";
import { chatTemplateFor, turnTokens } from "../ts/chat/template.ts";
import { openGguf } from "../ts/gguf/reader.ts";
import { defaultModelPath } from "../ts/models/cache.ts";
import { tokenizerFromMetadata } from "../ts/tokenizer/index.ts";

const modelPath = defaultModelPath();
const greedy = { temperature: 0, topK: 40, topP: 1, minP: 0, seed: 1 };

describe.skipIf(!existsSync(modelPath))("a five-turn chat on the default model", () => {
  const models = Promise.all([
    loadModel(modelPath, { contextLength: 1024, parallel: 1, prefixCacheBytes: 0 }),
    loadModel(modelPath, { contextLength: 1024, parallel: 1, prefixCacheBytes: 0 }),
  ]);
  const file = openGguf(modelPath);
  const tokenizer = tokenizerFromMetadata(file.metadata);
  const template = chatTemplateFor(file.metadata, tokenizer);
  afterAll(async () => {
    for (const m of await models) await m.close();
    file.close();
  });

  test("each turn prefills only what is new and answers as a fresh evaluation would", async () => {
    const [model, fresh] = await models;
    const chat = model.chat({ system: "You are a helpful assistant. Answer briefly." });
    const questions = ["Hello! What is your name?", "What is the capital of France?", "And of Italy?",
      "Name three colors.", "Thank you, goodbye!"];
    let cached: number[] = [];
    for (const [i, q] of questions.entries()) {
      const expectedPrompt = template.encode(tokenizer, [...chat.messages, { role: "user", content: q }]);
      const turn = await chat.send(q, { ...greedy, maxTokens: 24 });
      expect(turn.usage.promptTokens).toBe(expectedPrompt.length);
      // The cache held the previous prompt and its answer; the new prompt shares at least the
      // previous prompt, so only the rest (the end of the last turn and the new one) is evaluated.
      let common = 0;
      while (common < cached.length && cached[common] === expectedPrompt[common]) common++;
      expect(turn.timings.promptEvaluated).toBe(i === 0 ? expectedPrompt.length : expectedPrompt.length - common);
      if (i > 0) expect(turn.timings.promptEvaluated).toBeLessThan(expectedPrompt.length / 2);
      // A fresh model, given the same tokens and the template's turn ends as stops, answers alike.
      const reference = await fresh.complete(expectedPrompt, { ...greedy, maxTokens: 24,
        stop: [] });
      const stops = new Set(turnTokens(template, tokenizer));
      const cut = reference.tokens.findIndex((t) => stops.has(t) || tokenizer.isEndOfGeneration(t));
      expect(turn.tokens).toEqual(cut < 0 ? reference.tokens : reference.tokens.slice(0, cut + 1));
      cached = [...expectedPrompt, ...turn.tokens.slice(0, -1)]; // the last token is sampled, not evaluated
    }
    expect(chat.messages).toHaveLength(1 + 2 * questions.length);
  }, 120_000);

  test("a saved conversation loads back, and a bad one is refused with a reason", async () => {
    const [model] = await models;
    const dir = mkdtempSync(join(tmpdir(), "infer-chat-"));
    const chat = model.chat({ system: "sys" });
    const path = join(dir, "c.json");
    writeFileSync(path, JSON.stringify({ messages: [{ role: "system", content: "S" }, { role: "user", content: "u" },
      { role: "assistant", content: "a" }] }));
    chat.replace(readConversation(path));
    expect(chat.messages).toEqual([{ role: "system", content: "S" }, { role: "user", content: "u" },
      { role: "assistant", content: "a" }]);
    writeConversation(join(dir, "d.json"), chat.messages);
    const other = model.chat({ messages: readConversation(join(dir, "d.json")) });
    expect(other.messages).toEqual(chat.messages);
    expect(() => parseMessages({ messages: [{ role: "robot", content: "x" }] }, "f")).toThrow(/message 0 needs a role/);
    expect(() => parseMessages({ nope: 1 }, "f")).toThrow(/expected \{ "messages"/);
    // Gemma's template refuses two user turns in a row: the chat says so and stays as it was
    writeFileSync(path, JSON.stringify([{ role: "user", content: "a" }, { role: "user", content: "b" }]));
    expect(() => chat.replace(readConversation(path))).toThrow(/roles must alternate/);
    expect(chat.messages).toHaveLength(3);
  });
});
