// Method: stop strings on random texts cut at random places (the matcher alone), then on real
// generations of the tiny random Gemma with a stop string chosen to straddle a token boundary:
// the text must end exactly before the stop string, and no streamed piece may show any of it.
import { expect, test } from "bun:test";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Engine } from "../ts/engine/engine.ts";
import { seededRandom } from "../ts/sample/sampler.ts";
import { StopMatcher } from "../ts/sample/stop.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

function feed(text: string, stops: string[], cuts: number[]): { pieces: string[]; flushed: string; stopped: boolean } {
  const m = new StopMatcher(stops);
  const pieces: string[] = [];
  let at = 0;
  for (const cut of [...cuts, text.length]) {
    pieces.push(m.push(text.slice(at, cut)));
    at = cut;
    if (m.stopped) break;
  }
  return { pieces, flushed: m.flush(), stopped: m.stopped };
}

test("text before the first stop string, and nothing of it, whatever the cuts", () => {
  const rand = seededRandom(7), alphabet = "ab c\n";
  for (let trial = 0; trial < 3000; trial++) {
    const text = Array.from({ length: Math.floor(rand() * 30) }, () => alphabet[Math.floor(rand() * alphabet.length)]).join("");
    const stops = Array.from({ length: 1 + Math.floor(rand() * 3) }, () =>
      Array.from({ length: 1 + Math.floor(rand() * 4) }, () => alphabet[Math.floor(rand() * alphabet.length)]).join(""));
    const cuts = Array.from({ length: Math.floor(rand() * 8) }, () => Math.floor(rand() * (text.length + 1))).sort((a, b) => a - b);
    const { pieces, flushed, stopped } = feed(text, stops, cuts);
    const first = Math.min(...stops.map((s) => (text.includes(s) ? text.indexOf(s) : Infinity)));
    const want = first === Infinity ? text : text.slice(0, first);
    expect(pieces.join("") + flushed).toBe(want);
    expect(stopped).toBe(first !== Infinity);
    // what was shown at each moment is a prefix of the answer: nothing later taken back
    let shown = "";
    for (const p of pieces) { shown += p; expect(want.startsWith(shown)).toBe(true); }
  }
});

test("a prefix of a stop string is held back only while it could still be one", () => {
  const m = new StopMatcher(["</end>"]);
  expect(m.push("hello </")).toBe("hello ");
  expect(m.push("e")).toBe("");
  expect(m.push("x")).toBe("</ex"); // not a stop string after all
  expect(m.push(" </en")).toBe(" ");
  expect(m.push("d> after")).toBe("");
  expect(m.stopped).toBe(true);
  expect(m.flush()).toBe("");
});

const dir = mkdtempSync(join(tmpdir(), "infer-stop-"));
const model = join(dir, "tiny.gguf");
writeFileSync(model, tinyGemma3Gguf());

test("generation ends before a stop string that straddles tokens, and never shows it", () => {
  const engine = Engine.open({ modelPath: model });
  try {
    const greedy = { temperature: 0, topK: 40, topP: 1, minP: 0, seed: 1 };
    const free = engine.generate("the cat", { maxTokens: 60, ignoreEos: true, sampling: greedy });
    // token boundaries in the text
    const decoder = engine.tokenizer.decoder();
    const bounds: number[] = [];
    let length = 0;
    for (const t of free.tokens) { length += decoder.push(t).length; bounds.push(length); }
    let tried = 0;
    for (const b of bounds.slice(3, -3)) {
      const stop = free.text.slice(b - 2, b + 3);
      const at = free.text.indexOf(stop);
      if (stop.length < 5 || at < 0) continue;
      const pieces: string[] = [];
      const r = engine.generate("the cat", {
        maxTokens: 60, ignoreEos: true, sampling: greedy, stop: [stop], onText: (p) => pieces.push(p),
      });
      expect(r.stopReason).toBe("stop");
      expect(r.text).toBe(free.text.slice(0, at));
      expect(pieces.join("")).toBe(r.text);
      expect(pieces.join("")).not.toContain(stop);
      if (++tried === 5) break;
    }
    expect(tried).toBeGreaterThan(0);
  } finally {
    engine.close();
  }
});

test("the CLI's --stop", () => {
  const cli = (...args: string[]) => Bun.spawnSync([process.execPath, "infer.ts", ...args],
    { cwd: join(import.meta.dir, ".."), stdout: "pipe", stderr: "pipe" });
  const free = cli("the cat", "--model", model, "-n", "30", "--temp", "0", "--ignore-eos").stdout.toString();
  const stop = free.slice(10, 14);
  const cut = cli("the cat", "--model", model, "-n", "30", "--temp", "0", "--ignore-eos", "--stop", stop);
  expect(cut.stdout.toString()).toBe(free.slice(0, free.indexOf(stop)) + "\n");
  expect(cut.stderr.toString()).toContain("stop: stop");
});

test("log-probabilities go out with the text they belong to: stop strings, split UTF-8", () => {
  const engine = Engine.open({ modelPath: model });
  try {
    // hot sampling of the toy vocabulary draws byte tokens: characters split across tokens
    const hot = { temperature: 10, topK: 0, topP: 1, minP: 0, seed: 2 };
    const free = engine.generate("the cat", { maxTokens: 40, ignoreEos: true, sampling: hot });
    const decoder = engine.tokenizer.decoder();
    const starts: number[] = [], ends: number[] = [];
    for (const t of free.tokens) {
      starts.push(ends.at(-1) ?? 0);
      ends.push(starts.at(-1)! + decoder.push(t).length);
    }
    expect(ends.some((e, i) => e === starts[i])).toBe(true); // a token whose text waits
    for (const stop of [[], [free.text.slice(20, 23)]]) {
      let shown = "";
      const calls: { shown: number; tokens: number[]; offsets: number[] }[] = [];
      const r = engine.generate("the cat", { maxTokens: 40, ignoreEos: true, sampling: hot,
        stop, logprobs: 2, onText: (piece, lp) => {
          shown += piece;
          calls.push({ shown: shown.length, tokens: (lp ?? []).map((p) => p.token),
            offsets: (lp ?? []).map((p) => p.offset) });
        } });
      expect(shown).toBe(r.text);
      expect(r.stopReason).toBe(stop.length > 0 ? "stop" : "length");
      const reported = calls.flatMap((c) => c.tokens);
      expect(r.logprobs!.map((p) => p.token)).toEqual(reported);
      // the tokens whose text was shown, at least in part, in order, each once
      const count = starts.filter((s, i) => i < r.tokens.length && (s < r.text.length ||
        ends[i] <= r.text.length)).length;
      expect(reported).toEqual(free.tokens.slice(0, count));
      let i = 0;
      for (const [k, c] of calls.entries()) {
        for (const offset of c.offsets) {
          expect(offset).toBe(starts[i]);
          // sent once its text is all shown (the last call: a token a stop string cut)
          if (k < calls.length - 1 || stop.length === 0) {
            expect(ends[i]).toBeLessThanOrEqual(c.shown);
          }
          i++;
        }
      }
    }
  } finally {
    engine.close();
  }
});
