// Method: compare our tokenizer with llama.cpp's (node-llama-cpp) on recorded corpora: encodings
// with and without special-token parsing, decodes with and without special tokens, round trips,
// and streaming decode one token at a time. Fixtures: test/fixtures/gen-tokenizer-fixtures.mjs.
import { describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { InferError } from "../ts/errors.ts";
import { openGguf } from "../ts/gguf/reader.ts";
import { tokenizerFromMetadata, type Tokenizer } from "../ts/tokenizer/index.ts";
import { preSplit, preTokenizer } from "../ts/tokenizer/pretokenize.ts";
import { cleanSpaces } from "../ts/tokenizer/stream.ts";

interface Case {
  text: string;
  plain: number[];
  special: number[];
  decodePlain: string;
  decodeSpecial: string;
}

const fixtures = join(import.meta.dir, "fixtures");
const GEMMA_PATH = process.env.INFER_GEMMA_GGUF ??
  "/root/.cache/infer/models/gemma-3-270m-q4_k_m.gguf";

function streamed(tok: Tokenizer, ids: readonly number[], special: boolean): string {
  const d = tok.decoder({ special });
  let s = "";
  for (const id of ids) s += d.push(id);
  return s + d.flush();
}

/** Every check against one fixture; returns the number of mismatching cases per kind. */
function checkCorpus(tok: Tokenizer, cases: Case[]) {
  const bad = { plain: [] as string[], special: [] as string[], decode: [] as string[],
    stream: [] as string[] };
  for (const c of cases) {
    const plain = tok.encode(c.text, { addSpecial: false, parseSpecial: false });
    const special = tok.encode(c.text, { addSpecial: false, parseSpecial: true });
    if (JSON.stringify(plain) !== JSON.stringify(c.plain)) bad.plain.push(c.text);
    if (JSON.stringify(special) !== JSON.stringify(c.special)) bad.special.push(c.text);
    if (tok.decode(c.plain) !== c.decodePlain ||
        tok.decode(c.special, { special: true }) !== c.decodeSpecial) bad.decode.push(c.text);
    if (streamed(tok, c.plain, false) !== tok.decode(c.plain) ||
        streamed(tok, c.special, true) !== tok.decode(c.special, { special: true })) {
      bad.stream.push(c.text);
    }
  }
  return bad;
}

const noMismatch = { plain: [], special: [], decode: [], stream: [] };

describe("gemma 3 (SentencePiece) against llama.cpp", () => {
  const haveModel = existsSync(GEMMA_PATH);
  if (!haveModel) {
    test.skip(`model file missing at ${GEMMA_PATH} (set INFER_GEMMA_GGUF)`, () => {});
    return;
  }
  const fx = require(join(fixtures, "tokenizer-gemma3.json")) as {
    bos: number; eos: number; eog: number[]; cases: Case[];
  };
  let tok: Tokenizer;
  const load = () => {
    if (tok) return tok;
    const file = openGguf(GEMMA_PATH);
    try {
      tok = tokenizerFromMetadata(file.metadata);
    } finally {
      file.close();
    }
    return tok;
  };

  test("special ids and end-of-generation set", () => {
    const t = load();
    expect(t.vocabSize).toBe(262144);
    expect([t.bos, t.eos, t.addBos]).toEqual([fx.bos, fx.eos, true]);
    const eog = [];
    for (let id = 0; id < t.vocabSize; id++) if (t.isEndOfGeneration(id)) eog.push(id);
    expect(eog).toEqual(fx.eog);
    expect(t.tokenText(106)).toBe("<end_of_turn>");
  });

  test(`encodes, decodes and streams the corpus exactly as llama.cpp`, () => {
    expect(checkCorpus(load(), fx.cases)).toEqual(noMismatch);
  });

  test("round trip: decode(encode(s)) === s, BOS added and ignored", () => {
    const t = load();
    for (const c of fx.cases) {
      // SentencePiece spells spaces as U+2581, so a literal U+2581 comes back as a space.
      const want = c.text.replaceAll("\u2581", " ");
      const ids = t.encode(c.text);
      expect(ids[0]).toBe(fx.bos);
      expect(t.decode(ids)).toBe(want);
      const withSpecial = t.encode(c.text, { addSpecial: false, parseSpecial: true });
      expect(t.decode(withSpecial, { special: true })).toBe(want);
    }
    expect(t.encode("", { addSpecial: true })).toEqual([fx.bos]);
    expect(t.encode("", { addSpecial: false })).toEqual([]);
  });

  test("streaming holds back partial UTF-8 from byte tokens", () => {
    const t = load();
    const byteIds = [0xe2, 0x82, 0xac].map((b) => {
      const text = `<0x${b.toString(16).toUpperCase()}>`;
      for (let id = 0; id < t.vocabSize; id++) if (t.tokenText(id) === text) return id;
      throw new Error(`no byte token ${text}`);
    });
    const d = t.decoder();
    expect(byteIds.map((id) => d.push(id))).toEqual(["", "", "€"]);
    expect(d.flush()).toBe("");
    const cut = t.decoder();
    cut.push(byteIds[0]);
    expect(cut.flush()).toBe("\ufffd");
  });

  test("a 2,000-token prompt encodes in well under 100 ms", () => {
    const t = load();
    const long = fx.cases[fx.cases.length - 1].text;
    t.encode(long); // warm the lazily built tables
    const t0 = performance.now();
    const ids = t.encode(long);
    const ms = performance.now() - t0;
    expect(ids.length).toBeGreaterThan(2000);
    expect(ms * 2000 / ids.length).toBeLessThan(50);
  });
});

interface BpeFixture {
  pre: string;
  metadata: Record<string, unknown>;
  bos: number | null;
  eos: number | null;
  eog: number[];
  cases: Case[];
}

function bpeTokenizer(fx: BpeFixture): Tokenizer {
  return tokenizerFromMetadata(new Map(Object.entries(fx.metadata)));
}

for (const pre of ["llama-bpe", "qwen2"]) {
  describe(`byte-level BPE, pre-tokenizer ${pre}, against llama.cpp`, () => {
    const fx = require(join(fixtures, `tokenizer-bpe-${pre}.json`)) as BpeFixture;
    const tok = bpeTokenizer(fx);

    test("special ids and end-of-generation set", () => {
      expect([tok.bos, tok.eos]).toEqual([fx.bos, fx.eos]);
      const eog = [];
      for (let id = 0; id < tok.vocabSize; id++) if (tok.isEndOfGeneration(id)) eog.push(id);
      expect(eog).toEqual(fx.eog);
    });

    test("encodes, decodes and streams the corpus exactly as llama.cpp", () => {
      expect(checkCorpus(tok, fx.cases)).toEqual(noMismatch);
    });

    test("BOS is added as the model asks", () => {
      const ids = tok.encode("hi", { addSpecial: true });
      if (tok.addBos) expect(ids[0]).toBe(tok.bos!);
      else expect(ids).toEqual(tok.encode("hi", { addSpecial: false }));
    });
  });
}

describe("the o200k pre-tokenizer (gpt-4o: gpt-oss)", () => {
  // Expected pieces: Hugging Face tokenizers' Split on gpt-oss's tokenizer.json regex (recorded
  // by hand with tokenizers 0.22). llama.cpp has no scanner for it and runs its lookahead form
  // over category-collapsed text (src/unicode.cpp), as infer does: there a non-ASCII capital is
  // any letter, so " ÉCOLE" splits after "É" where the real \p{Lu} keeps it whole (read from
  // llama.cpp's code; not run against it).
  const cases: [string, string[]][] = [
    ["Hello WORLDs don't HelloWorld 12345 x\n\n y ...//\n", ["Hello", " WORLDs", " don't", " Hello",
      "World", " ", "123", "45", " x", "\n\n", " y", " ...//\n"]],
    ["I'M here, THEY'RE there; camelCaseWord ABCdef", ["I'M", " here", ",", " THEY'RE", " there",
      ";", " camel", "Case", "Word", " ABCdef"]],
    ["  tabs\tand   spaces  \r\n end", [" ", " tabs", "\tand", "  ", " spaces", "  \r\n", " end"]],
    ["\u4e16\u754c 2024-12-07 $100", ["\u4e16\u754c", " ", "202", "4", "-", "12", "-", "07", " $", "100"]],
    ["caf\u00e9 na\u00efve \u00fcber", ["caf\u00e9", " na\u00efve", " \u00fcber"]],
  ];
  for (const [text, pieces] of cases) {
    test(JSON.stringify(text), () => expect(preSplit(preTokenizer("gpt-4o"), text)).toEqual(pieces));
  }
  test("a non-ASCII capital splits as in llama.cpp's collapsed regex", () => {
    expect(preSplit(preTokenizer("gpt-4o"), " \u00c9COLE")).toEqual([" \u00c9", "COLE"]);
  });
});

describe("clean-up of spaces (llama-bpe detokenization) while streaming", () => {
  test("cutting the stream anywhere gives the whole-text result", () => {
    // Random byte strings over the characters the clean-up rules look at.
    const alphabet = Array.from(" ' ?!.,smtdlrveax", (c) => c.charCodeAt(0));
    let seed = 7;
    const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32);
    const fx = require(join(fixtures, "tokenizer-bpe-llama-bpe.json")) as BpeFixture;
    const tok = bpeTokenizer(fx);
    for (let n = 0; n < 300; n++) {
      const text = Array.from({ length: 1 + Math.floor(rand() * 14) },
        () => String.fromCharCode(alphabet[Math.floor(rand() * alphabet.length)])).join("");
      const ids = tok.encode(text, { addSpecial: false });
      const whole = new TextDecoder().decode(cleanSpaces(new TextEncoder().encode(text)));
      expect(tok.decode(ids)).toBe(whole);
      expect(streamed(tok, ids, false)).toBe(whole);
    }
  });
});

describe("errors", () => {
  const base = (model: string, pre?: string) => new Map<string, unknown>([
    ["tokenizer.ggml.model", model],
    ...(pre === undefined ? [] : [["tokenizer.ggml.pre", pre] as [string, unknown]]),
    ["tokenizer.ggml.tokens", ["a", "b", "ab"]],
    ["tokenizer.ggml.merges", ["a b"]],
  ]);
  const fails = (meta: Map<string, unknown>, needle: string) => {
    try {
      tokenizerFromMetadata(meta);
    } catch (e) {
      expect(e).toBeInstanceOf(InferError);
      expect((e as InferError).code).toBe("bad_model");
      expect((e as InferError).message).toContain(needle);
      return;
    }
    throw new Error("expected an InferError");
  };

  test("unknown tokenizer model names the model", () => fails(base("wordpiece9"), "wordpiece9"));
  test("unknown pre-tokenizer names it", () => fails(base("gpt2", "mystery-pre"), "mystery-pre"));
  test("missing token list", () => {
    const m = base("llama");
    m.delete("tokenizer.ggml.tokens");
    fails(m, "tokenizer.ggml.tokens");
  });
  test("missing merges for BPE", () => {
    const m = base("gpt2", "qwen2");
    m.delete("tokenizer.ggml.merges");
    fails(m, "merges");
  });
  test("missing model key", () => fails(new Map(), "tokenizer.ggml.model"));
  test("an id outside the vocabulary is an invalid argument", () => {
    const t = tokenizerFromMetadata(base("gpt2", "qwen2"));
    expect(() => t.decode([99])).toThrow(InferError);
  });
});
