// Method: (1) the automaton alone accepts valid JSON texts for a schema and refuses invalid ones;
// (2) the mask it computes through the vocabulary trie equals trying every token one by one;
// (3) 50 generations on the tiny random Gemma, under the committed schemas
// (test/fixtures/json-schemas/*.json) with random seeds and temperatures and tight token budgets,
// all parse and validate (ajv, an independent validator); (4) a few on the default model.
import { describe, expect, test } from "bun:test";
import Ajv2020 from "ajv/dist/2020";
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { defaultModelPath } from "../ts/models/cache.ts";
import { Engine } from "../ts/engine/engine.ts";
import { InferError } from "../ts/errors.ts";
import { isPlainText, JsonGrammar } from "../ts/sample/json-grammar.ts";
import {
  anyObject, compileSchema, minLength, type JsonNode,
} from "../ts/sample/json-schema.ts";
import { seededRandom } from "../ts/sample/sampler.ts";
import type { Tokenizer } from "../ts/tokenizer/index.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const dir = join(import.meta.dir, "fixtures", "json-schemas");
const schemas = Object.fromEntries(readdirSync(dir).filter((f) => f.endsWith(".json")).sort()
  .map((f) => [f.replace(/\.json$/, ""), JSON.parse(readFileSync(join(dir, f), "utf8"))]));
const ajv = new Ajv2020({ strict: true, allErrors: true });
const validators = Object.fromEntries(Object.entries(schemas).map(([k, s]) => [k, ajv.compile(s)]));

const tmp = mkdtempSync(join(tmpdir(), "infer-json-"));
const tinyPath = join(tmp, "tiny.gguf");
writeFileSync(tinyPath, tinyGemma3Gguf());
const tiny = Engine.open({ modelPath: tinyPath });
const utf8 = new TextEncoder();

/** Whether the automaton for `schema` accepts `text` as a whole JSON text. */
function accepts(tokenizer: Tokenizer, schema: unknown, text: string): boolean {
  const g = new JsonGrammar(tokenizer, compileSchema(schema));
  return g.advance(utf8.encode(text)) && g.complete;
}

describe("the automaton", () => {
  const t = tiny.tokenizer;
  test("accepts what the schema allows, in any spacing llama.cpp's grammar allows", () => {
    const p = schemas.person;
    for (const text of [
      `{"name":"Ann","age":30}`,
      `{"name": "Ann", "age": -0, "tags": ["a", "b\\"c", "\\u00e9\\n"], "address": {"city": "Oslo"}}`,
      `{\n  "name": "Ann",\n\t"age": 7,\n  "email": "a@b.c"\n}`,
      `{"name":"😀 é","age":1,"address":{"street":"x","city":"y","zip":"0"}}`,
    ]) expect(accepts(t, p, text)).toBe(true);
    expect(accepts(t, schemas.numbers, `{"x":1.5e-3,"y":-0.25,"values":[1,2E+10],"count":3}`)).toBe(true);
    expect(accepts(t, schemas.tree, `{"name":"a","children":[{"name":"b","children":[]},{"name":"c"}]}`)).toBe(true);
    expect(accepts(t, schemas.map, `{"a":1,"b":-2,"a":3}`)).toBe(true);
    expect(accepts(t, schemas["root-enum"], `"reddish"`)).toBe(true);
    expect(accepts(t, schemas.enums, `{"status":"pending","priority":12,"note":"ok","mixed":{"a":"b"}}`)).toBe(true);
    expect(accepts(t, schemas.shapes, `{"kind":"rect","w":1,"h":2}`)).toBe(true);
  });

  test("refuses what it does not", () => {
    const p = schemas.person;
    for (const text of [
      `{"age":30,"name":"Ann"}`, // out of order: properties follow the schema's order
      `{"name":"Ann"}`, // a required property missing
      `{"name":"Ann","age":30,}`, // trailing comma
      `{"name":"Ann","age":3.5}`, // not an integer
      `{"name":"Ann","age":30,"extra":1}`, // not a property
      `{"name":"a\nb","age":1}`, // raw newline in a string
      `{"name":"\\x","age":1}`, // bad escape
      `{"name":"Ann","age":01}`, // leading zero
      `{"name":"Ann","age":1}x`, // anything after the end
      `{"name":"Ann",  "age":1}`, // two spaces
      `{"name":"Ann","age":1,"address":{}}`, // nested required
    ]) expect(accepts(t, p, text)).toBe(false);
    expect(accepts(t, schemas["root-enum"], `"redd"`)).toBe(false);
    expect(accepts(t, schemas.numbers, `{"x":1,"y":2,"values":[1],"count":3}`)).toBe(false); // minItems
    expect(accepts(t, schemas.matrix, `{"matrix":[[1,2,3,4]]}`)).toBe(false); // maxItems
    expect(accepts(t, schemas.shapes, `{"kind":"circle","w":1,"h":2}`)).toBe(false);
    expect(new JsonGrammar(t, anyObject).advance(utf8.encode(`{"a": [1, 2], "b": {"c": null}}`))).toBe(true);
    expect(new JsonGrammar(t, anyObject).advance(utf8.encode(`[1]`))).toBe(false); // --json wants an object
  });

  test("plain string text is recognised byte for byte", () => {
    expect(isPlainText(utf8.encode("hello world é 日本 🙂"))).toBe(true);
    for (const bad of [`a"`, "a\\", "a\n", "\t"]) expect(isPlainText(utf8.encode(bad))).toBe(false);
    expect(isPlainText(Uint8Array.of(0xc3))).toBe(false); // half a character
    expect(isPlainText(Uint8Array.of(0xe0, 0x80, 0x80))).toBe(false); // overlong
    expect(isPlainText(Uint8Array.of(0xed, 0xa0, 0x80))).toBe(false); // a surrogate
  });

  test("unsupported keywords are refused by name and path", () => {
    expect(() => compileSchema({ type: "string", pattern: "^a" }))
      .toThrow(/at "#": the keyword "pattern"/);
    expect(() => compileSchema({ properties: { n: { type: "number", minimum: 0 } } }))
      .toThrow(/"#\/properties\/n": the keyword "minimum"/);
    expect(() => compileSchema({ $ref: "http://x/y.json" })).toThrow(/only local references/);
    expect(() => compileSchema({ required: ["a"], properties: {} }))
      .toThrow(/"a" is not in 'properties'/);
  });

  test("minimal lengths", () => {
    expect(minLength(compileSchema(schemas.person))).toBe(`{"name":"","age":0}`.length);
    expect(minLength(compileSchema(schemas.tree))).toBe(`{"name":""}`.length);
    expect(minLength(compileSchema(schemas["root-array"]))).toBe(`[{"id":0,"ok":true}]`.length);
  });
});

/** The allowed set by brute force: each token's bytes tried on a fresh grammar at `prefix`. */
function bruteForce(tokenizer: Tokenizer, schema: unknown, prefix: string, ids: Iterable<number>): Set<number> {
  const ok = new Set<number>();
  const node = compileSchema(schema);
  const at = new JsonGrammar(tokenizer, node);
  at.advance(utf8.encode(prefix));
  for (const id of ids) {
    if (tokenizer.isEndOfGeneration(id)) { if (at.complete) ok.add(id); continue; }
    const bytes = tokenizer.tokenBytes(id);
    if (bytes.length === 0) continue;
    const g = new JsonGrammar(tokenizer, node);
    if (g.advance(utf8.encode(prefix)) && g.advance(bytes)) ok.add(id);
  }
  return ok;
}

function masked(tokenizer: Tokenizer, schema: unknown, prefix: string): Set<number> {
  const g = new JsonGrammar(tokenizer, compileSchema(schema));
  expect(g.advance(utf8.encode(prefix))).toBe(true);
  const logits = new Float32Array(tokenizer.vocabSize);
  g.mask(logits, 1 << 20);
  return new Set(Array.from(logits.keys()).filter((i) => logits[i] === 0));
}

const prefixes: [string, string][] = [
  ["person", ""], ["person", "{"], ["person", `{"na`], ["person", `{"name"`], ["person", `{"name": "ab`],
  ["person", `{"name": "a\\`], ["person", `{"name": "a\\u00`], ["person", `{"name":"x","age":1`],
  ["person", `{"name":"x","age":12,`], ["enums", `{"status":"`], ["enums", `{"status":"active","priority":1`],
  ["numbers", `{"x":-`], ["numbers", `{"x":1.`], ["numbers", `{"x":1e`], ["map", `{"k`], ["tree", `{"name":"a","children":[`],
  ["root-enum", `"red`], ["any", `[1, {"a": "`], ["escapes", `{"text":"\u00e9`], ["root-array", `[{"id":1,"ok":true}`],
];

test("the trie walk allows exactly the tokens that fit (tiny vocabulary, every token)", () => {
  const t = tiny.tokenizer;
  const all = Array.from({ length: t.vocabSize }, (_, i) => i);
  for (const [name, prefix] of prefixes) expect(masked(t, schemas[name], prefix)).toEqual(bruteForce(t, schemas[name], prefix, all));
});

const modelPath = defaultModelPath();
const hasModel = existsSync(modelPath);

test.skipIf(!hasModel)("the trie walk allows exactly the tokens that fit (default vocabulary, a sample)", () => {
  const engine = Engine.open({ modelPath, contextLength: 256 });
  try {
    const t = engine.tokenizer, rand = seededRandom(99);
    const sample = new Set(Array.from({ length: 4000 }, () => Math.floor(rand() * t.vocabSize)));
    for (const [name, prefix] of prefixes) {
      const want = bruteForce(t, schemas[name], prefix, sample);
      const got = new Set([...masked(t, schemas[name], prefix)].filter((id) => sample.has(id)));
      expect(got).toEqual(want);
    }
  } finally {
    engine.close();
  }
}, 120_000);

function checkOutput(name: string, text: string): void {
  let value: unknown;
  expect(() => { value = JSON.parse(text); }).not.toThrow();
  const validate = validators[name];
  if (!validate(value)) throw new Error(`${name}: ${JSON.stringify(validate.errors)} for ${text}`);
}

test("50 generations under random schemas all parse and validate (tiny random Gemma)", () => {
  const names = Object.keys(schemas), rand = seededRandom(2025);
  const reasons = new Map<string, number>();
  for (let i = 0; i < 50; i++) {
    const name = names[Math.floor(rand() * names.length)];
    const node = compileSchema(schemas[name]);
    // tight budgets too: the grammar must close everything within them
    const maxTokens = minLength(node) + Math.floor(rand() * 120);
    const r = tiny.generate("the cat", {
      maxTokens, constraint: new JsonGrammar(tiny.tokenizer, node),
      sampling: { temperature: 0.5 + rand() * 1.5, topK: 0, topP: 1, minP: 0, seed: i },
    });
    checkOutput(name, r.text);
    reasons.set(r.stopReason, (reasons.get(r.stopReason) ?? 0) + 1);
  }
  expect(reasons.get("complete") ?? 0).toBeGreaterThan(25);
}, 60_000);

test.skipIf(!hasModel)("generations on the default model parse and validate", () => {
  const engine = Engine.open({ modelPath, contextLength: 512 });
  try {
    for (const [i, name] of ["person", "root-array", "escapes", "shapes"].entries()) {
      const r = engine.generate("Here is the JSON you asked for:\n", {
        maxTokens: 120, constraint: new JsonGrammar(engine.tokenizer, compileSchema(schemas[name])),
        sampling: { temperature: 0.8, topK: 40, topP: 0.95, minP: 0.05, seed: i },
      });
      checkOutput(name, r.text);
    }
  } finally {
    engine.close();
  }
}, 120_000);

describe("schemas a client or a file may send: refused by name, bounded, never a hang", () => {
  const refused = (schema: unknown, message: RegExp) => {
    let error: unknown = null;
    try { compileSchema(schema); } catch (err) { error = err; }
    expect(error).toBeInstanceOf(InferError);
    expect((error as InferError).code).toBe("unsupported");
    expect((error as Error).message).toMatch(message);
    expect((error as Error).message.length).toBeLessThan(400);
    expect((error as Error).message).not.toContain("\n");
  };

  test("a reference that leads back to itself before any object or array", () => {
    refused({ $ref: "#" }, /the reference "#" leads back to itself .*"# → #"/);
    refused({ $defs: { a: { $ref: "#/$defs/b" }, b: { $ref: "#/$defs/a" } }, $ref: "#/$defs/a" },
      /"#\/\$defs\/a → #\/\$defs\/b → #\/\$defs\/a"/);
    refused({ $defs: { a: { anyOf: [{ $ref: "#/$defs/a" }, { type: "string" }] } },
      $ref: "#/$defs/a" }, /the reference "#\/\$defs\/a" leads back to itself/);
    refused({ anyOf: [{ type: "null" }, { $ref: "#" }] }, /the reference "#" leads back/);
    // a union of references that recurse only through unions, with a way out beside them
    refused({ $defs: { a: { anyOf: [{ $ref: "#/$defs/b" }, { $ref: "#/$defs/c" }] },
      b: { oneOf: [{ $ref: "#/$defs/a" }] }, c: { type: "null" } }, $ref: "#/$defs/a" },
    /"#\/\$defs\/a → #\/\$defs\/b → #\/\$defs\/a"/);
    // behind an object: found too, though the root itself reads "{" first
    refused({ type: "object", properties: { x: { $defs: {}, $ref: "#/$defs/x" } },
      $defs: { x: { allOf: [{ $ref: "#/$defs/x" }] } } }, /"#\/\$defs\/x" leads back/);
  });

  test("recursion through a property or an item is a tree, and generates", () => {
    const nested = { $defs: { v: { anyOf: [{ type: "integer" },
      { type: "array", items: { $ref: "#/$defs/v" }, maxItems: 3 }] } }, $ref: "#/$defs/v" };
    expect(accepts(tiny.tokenizer, nested, "[1,[2,[]],3]")).toBe(true);
    expect(accepts(tiny.tokenizer, schemas.tree, `{"name":"a","children":[{"name":"b"}]}`))
      .toBe(true);
    const validate = ajv.compile(nested);
    for (let seed = 0; seed < 10; seed++) {
      const r = tiny.generate("the cat", { maxTokens: 40,
        constraint: new JsonGrammar(tiny.tokenizer, compileSchema(nested)),
        sampling: { temperature: 1.5, topK: 0, topP: 1, minP: 0, seed } });
      expect(validate(JSON.parse(r.text))).toBe(true);
    }
  });

  test("a schema with no finite text is refused", () => {
    refused({ type: "object", properties: { a: { $ref: "#" } }, required: ["a"] },
      /no JSON text of finite length/);
    refused({ type: "array", items: { $ref: "#" }, minItems: 1 }, /no JSON text of finite length/);
  });

  test("shortest lengths are exact through cycles", () => {
    // b is reached while a is still being measured: a memo of "Infinity, in progress" got it wrong
    const root = compileSchema({ $defs: {
      a: { anyOf: [{ type: "null" }, { type: "object", properties: { y: { $ref: "#/$defs/b" } },
        required: ["y"] }] },
      b: { type: "array", items: { $ref: "#/$defs/a" }, minItems: 1 } }, $ref: "#/$defs/a" });
    expect(minLength(root)).toBe("null".length);
    const a = (root as { target: JsonNode }).target as JsonNode & { kind: "union" };
    const object = a.options[1] as JsonNode & { kind: "object" };
    expect(minLength(object)).toBe(`{"y":[null]}`.length);
    expect(minLength(object.props[0].node)).toBe("[null]".length);
  });

  test("nesting and size have budgets, each a clear error (no stack overflow)", () => {
    let deep: unknown = { type: "string" };
    for (let i = 0; i < 20_000; i++) deep = { type: "object", properties: { a: deep } };
    refused(deep, /nests deeper than 128 levels/);
    // a const nested 100,000 deep (JSON.parse handles it; a recursive walk would not)
    refused(JSON.parse(`{"const":${"[".repeat(100_000)}${"]".repeat(100_000)}}`),
      /nests deeper than 128/);
    const defs: Record<string, unknown> = {};
    for (let i = 0; i < 1000; i++) {
      defs[`d${i}`] = { type: "object", properties: { next: { $ref: `#/$defs/d${i + 1}` } } };
    }
    defs.d1000 = { type: "null" };
    refused({ $defs: defs, $ref: "#/$defs/d0" }, /nest deeper than 128 levels \(references/);
    const properties = Object.fromEntries(Array.from({ length: 20_000 }, (_, i) => [`p${i}`, {}]));
    refused({ type: "object", properties }, /too large/);
    refused({ enum: Array.from({ length: 20_000 }, (_, i) => i) }, /too large/);
    refused({ type: "string", [`x${"y".repeat(10_000)}`]: 1 },
      /the keyword "xyyy.*\(10001 characters\)/);
  });

  test("a union of thousands of options keeps the automaton's work bounded", () => {
    // The alternatives kept at once are capped (the first ones win), so this is fast and valid.
    const schema = { anyOf: Array.from({ length: 3000 }, (_, i) => ({ type: "object",
      properties: { [`k${i}`]: { type: "integer" } }, required: [`k${i}`] })) };
    const node = compileSchema(schema);
    expect(accepts(tiny.tokenizer, schema, `{"k1":1}`)).toBe(true);
    for (let seed = 0; seed < 3; seed++) {
      const r = tiny.generate("the cat", { maxTokens: 30,
        constraint: new JsonGrammar(tiny.tokenizer, node),
        sampling: { temperature: 1, topK: 0, topP: 1, minP: 0, seed } });
      // (ajv takes a second over this schema: checked by hand)
      const entries = Object.entries(JSON.parse(r.text));
      expect(entries).toHaveLength(1);
      expect(entries[0][0]).toMatch(/^k\d+$/);
      expect(Number.isInteger(entries[0][1])).toBe(true);
    }
  });
});

describe("a budget that holds the shortest output never leaves every token masked", () => {
  test("every committed schema, at exactly its shortest length, completes and validates", () => {
    for (const [name, schema] of Object.entries(schemas)) {
      const node = compileSchema(schema);
      for (let seed = 0; seed < 3; seed++) {
        const r = tiny.generate("the cat", { maxTokens: minLength(node),
          constraint: new JsonGrammar(tiny.tokenizer, node),
          sampling: { temperature: 1.5, topK: 0, topP: 1, minP: 0, seed } });
        checkOutput(name, r.text);
        // a number at the top level could go on, so it ends by length
        expect(r.stopReason).toBe(/^-?\d/.test(r.text) ? "length" : "complete");
      }
    }
  });

  test("below it, generation ends as cut short (\"length\") instead of failing", () => {
    const node = compileSchema(schemas.person);
    for (const maxTokens of [1, 3, 5]) {
      const r = tiny.generate("the cat", { maxTokens,
        constraint: new JsonGrammar(tiny.tokenizer, node),
        sampling: { temperature: 1, topK: 0, topP: 1, minP: 0, seed: maxTokens } });
      expect(r.stopReason).toBe("length");
    }
  });

  test("the CLI refuses -n below the shortest output in one line, before generating", () => {
    const run = Bun.spawnSync([process.execPath, join(import.meta.dir, "..", "infer.ts"), "the cat",
      "-m", tinyPath, "--json-schema", join(dir, "person.json"), "-n", "5"], { stderr: "pipe" });
    const err = run.stderr.toString();
    expect(run.exitCode).toBe(2);
    expect(run.stdout.toString()).toBe("");
    expect(err.trim().split("\n")).toHaveLength(1);
    expect(err).toMatch(/the shortest valid output is 19 bytes, and -n 5 cannot hold it.*-n 19/);
  });
});
