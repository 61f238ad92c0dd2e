// Method: split a model with test/support/split-gguf.ts (llama.cpp's gguf-split layout), open its
// first part, and demand the same tensor table and exactly the same greedy tokens as the whole
// file, on a tiny random Gemma 3 and on the default model; a missing or wrong part is one line.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Engine } from "../ts/engine/engine.ts";
import { InferError } from "../ts/errors.ts";
import { openGguf } from "../ts/gguf/reader.ts";
import { defaultModelPath } from "../ts/models/cache.ts";
import { argmax } from "../ts/sample/sampler.ts";
import { splitGguf } from "./support/split-gguf.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const dir = mkdtempSync(join(tmpdir(), "infer-split-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function greedy(modelPath: string, prompt: number[], n: number): number[] {
  const engine = Engine.open({ modelPath, contextLength: 64, threads: 2 });
  try {
    let logits = engine.evaluate(prompt);
    const tokens: number[] = [];
    for (let i = 0; i < n; i++) {
      tokens.push(argmax(logits));
      if (i + 1 < n) logits = engine.evaluate([tokens[i]]);
    }
    return tokens;
  } finally {
    engine.close();
  }
}

function error(f: () => unknown): InferError {
  try {
    f();
  } catch (err) {
    expect(err).toBeInstanceOf(InferError);
    return err as InferError;
  }
  throw new Error("expected an error");
}

describe("a split model opens from its first part as one", () => {
  const whole = join(dir, "tiny.gguf");
  writeFileSync(whole, tinyGemma3Gguf());
  const parts = splitGguf(whole, join(dir, "tiny"), 3);

  test("the parts are named as llama.cpp names them and hold one tensor table", () => {
    expect(parts.map((p) => p.slice(dir.length + 1))).toEqual(["tiny-00001-of-00003.gguf",
      "tiny-00002-of-00003.gguf", "tiny-00003-of-00003.gguf"]);
    const a = openGguf(whole), b = openGguf(parts[0]);
    try {
      expect(b.parts.map((p) => p.path)).toEqual(parts);
      expect([...b.tensors.keys()].sort()).toEqual([...a.tensors.keys()].sort());
      expect(new Set([...b.tensors.values()].map((t) => t.part))).toEqual(new Set([0, 1, 2]));
      for (const t of a.tensors.values()) {
        expect(b.tensorBytes(b.tensors.get(t.name)!)).toEqual(a.tensorBytes(t));
      }
      expect(b.metadata.get("general.architecture")).toBe("gemma3");
    } finally {
      a.close();
      b.close();
    }
  });

  test("greedy tokens of the split tiny model equal the whole one's", () => {
    expect(greedy(parts[0], [2, 270, 271, 272], 12)).toEqual(greedy(whole, [2, 270, 271, 272], 12));
  });

  test("a later part, a missing part or a part of another split is one clear line", () => {
    const later = error(() => openGguf(parts[1]));
    expect(later.code).toBe("invalid_argument");
    expect(later.message).toBe(`${parts[1]} is part 2 of 3 of a split model; give ${parts[0]}`);
    renameSync(parts[2], `${parts[2]}.away`);
    try {
      const missing = error(() => openGguf(parts[0]));
      expect(missing.code).toBe("io");
      expect(missing.message).toBe(`${parts[0]} is part 1 of 3; part 3 (${parts[2]}) is missing`);
      // part 3 of another split in its place: its header says which it is
      splitGguf(whole, join(dir, "other"), 3);
      renameSync(join(dir, "other-00002-of-00003.gguf"), parts[2]);
      const wrong = error(() => openGguf(parts[0]));
      expect(wrong.code).toBe("bad_gguf");
      expect(wrong.message).toContain("expected part 3 of 3, its header says it is part 2 of 3");
    } finally {
      rmSync(parts[2], { force: true });
      renameSync(`${parts[2]}.away`, parts[2]);
    }
  });
});

describe.skipIf(!existsSync(defaultModelPath()))("the default model split in two", () => {
  test("gives exactly the greedy tokens of the whole file", () => {
    const parts = splitGguf(defaultModelPath(), join(dir, "gemma"), 2);
    const prompt = [2, 818, 5279, 529, 7001, 563]; // <bos>The capital of France is
    expect(greedy(parts[0], prompt, 16)).toEqual(greedy(defaultModelPath(), prompt, 16));
  }, 60_000);
});
