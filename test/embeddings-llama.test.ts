// Method: embed the texts of test/fixtures/embeddings-llama.json (short, long, multilingual,
// special characters, control-token text) with the real default model through the library, all
// in one call (so they share the scheduler's batches), and compare each with llama.cpp's
// llama-embedding on the same GGUF (mean pooling, L2-normalised; the fixture records the
// commands) by cosine distance, against two runs of it:
//   flash_attn_off   the configuration whose arithmetic infer follows (docs/correctness.md).
//                    Every text agrees to the 7 decimals llama-embedding prints (3e-13): infer
//                    embeds with the rounding of llama.cpp's batched kernels, which
//                    llama-embedding takes (docs/embeddings.md: Q4_K four rows at a time, f16
//                    attention sums in tinyBLAS's order). The bar, 1e-9, is far below what one
//                    differently rounded op anywhere gives (1e-5 to 3e-4) and far above the
//                    printed decimals' (the issue asked for 1e-4).
//   flash_attn_auto  llama.cpp's default, which turns flash attention on (f16 queries and
//                    running sums): 5e-5 to 3e-3 from infer; the bar is 1e-2.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { loadModel, type Model } from "../ts/api/index.ts";
import { defaultModelPath } from "../ts/models/cache.ts";

type Variant = "flash_attn_off" | "flash_attn_auto";
interface Case { name: string; text: string; embedding: Record<Variant, number[]> }
const fixture = await Bun.file(join(import.meta.dir, "fixtures", "embeddings-llama.json")).json();
const cases = fixture.cases as Case[];
const modelPath = defaultModelPath();
if (!existsSync(modelPath)) {
  throw new Error(`default model missing at ${modelPath}: run 'npm install' (or 'bun run setup')`);
}

const COSINE_DISTANCE_MAX: Record<Variant, number> = {
  flash_attn_off: 1e-9, flash_attn_auto: 1e-2,
};

function cosineDistance(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let ab = 0, aa = 0, bb = 0;
  for (let i = 0; i < a.length; i++) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return 1 - ab / Math.sqrt(aa * bb);
}

let model: Model, vectors: Float32Array[];
// Loading the model and embedding ~530 tokens takes seconds on a busy 2-core machine.
beforeAll(async () => {
  model = await loadModel(modelPath, { threads: 2, contextLength: 2048, backend: "cpu" });
  vectors = await model.embed(cases.map((c) => c.text));
}, 120_000);
afterAll(() => model?.close());

describe("embeddings of the default model equal llama.cpp's llama-embedding", () => {
  for (const [i, c] of cases.entries()) {
    for (const variant of ["flash_attn_off", "flash_attn_auto"] as const) {
      test(`${c.name} (llama.cpp ${variant})`, () => {
        const want = c.embedding[variant];
        expect(vectors[i]).toHaveLength(want.length);
        expect(cosineDistance(vectors[i], want)).toBeLessThan(COSINE_DISTANCE_MAX[variant]);
      });
    }
  }

  test("texts far apart in meaning are further apart than the same text twice", async () => {
    const again = await model.embed(cases[0].text);
    expect(cosineDistance(again, vectors[0])).toBeLessThan(1e-6);
    expect(cosineDistance(vectors[0], vectors[3])).toBeGreaterThan(1e-2);
  });
});
