// How far one decode step's rounding moves the logits of the random-weight models that
// test/cuda-batch.test.ts decodes 64 at a time, on the CPU: the test's 64 prompts run alike into
// two caches; the steps after them run once by the model and once by the model with every F32
// vector (the norms) moved one ulp, as a 64-row step on the GPU rounds otherwise than one row.
// Prints the first step's worst and median logits error and the sequences whose greedy tokens part.
//   bun bench/batch-step-sensitivity.ts [llama|qwen|llama-f16|qwen-f16]...
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Engine } from "../ts/engine/engine.ts";
import { createKvCache } from "../ts/engine/kv-cache.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import { argmax } from "../ts/sample/sampler.ts";
import { llamaQ4_0, qwen3KQuants, randomQuantGguf, type RandomQuantSpec } from "../test/support/random-quant-gguf.ts";
import { normalisedError, top2Gap } from "./logits.ts";

const f16 = { embed: GgmlType.F16, attn: GgmlType.F16, attnOut: GgmlType.F16, ffn: GgmlType.F16,
  ffnDown: GgmlType.F16, output: GgmlType.F16 };
const SPECS: Record<string, RandomQuantSpec> = {
  llama: llamaQ4_0, qwen: qwen3KQuants,
  "llama-f16": { ...llamaQ4_0, types: f16, seed: 21 }, "qwen-f16": { ...qwen3KQuants, types: f16, seed: 23 },
};
const N = 64, STEPS = 6;

/** The spec with every F32 tensor's values moved one ulp up or down (seeded). */
function oneUlp(spec: RandomQuantSpec): RandomQuantSpec {
  let seed = 12345;
  const coin = () => (seed = (seed * 1103515245 + 12345) >>> 0) < 2 ** 31;
  return { ...spec, edit: (tensors) => {
    for (const t of tensors) {
      if (t.type !== GgmlType.F32) continue;
      const bits = new Uint32Array(t.data.buffer, t.data.byteOffset, t.data.byteLength / 4);
      for (let i = 0; i < bits.length; i++) bits[i] += coin() ? 1 : -1;
    }
  } };
}

const dir = mkdtempSync(join(tmpdir(), "infer-batch-sensitivity-"));
try {
  for (const name of process.argv.length > 2 ? process.argv.slice(2) : Object.keys(SPECS)) {
    const spec = SPECS[name];
    if (!spec) throw new Error(`unknown model ${name}: ${Object.keys(SPECS).join(", ")}`);
    const open = (s: RandomQuantSpec, file: string) => {
      writeFileSync(join(dir, file), randomQuantGguf(s));
      return Engine.open({ modelPath: join(dir, file), contextLength: 160, batch: 128, backend: "cpu" });
    };
    const exact = open(spec, `${name}.gguf`), moved = open(oneUlp(spec), `${name}-ulp.gguf`);
    const errors: number[] = [], parted: string[] = [];
    for (let s = 0; s < N; s++) {
      const prompt = Array.from({ length: 2 + ((s * 37) % 120) }, (_, i) => 6 + ((i * 31 + s * 17) % 240));
      const runs = [exact, moved].map((e) => {
        const c = createKvCache(exact.backend, exact.model.info, 160, "f16", exact.model.maxBatch);
        const tokens = [argmax(exact.model.forward(prompt, prompt.length, 0, c.layers))];
        const first = e.model.forward([tokens[0]], 1, prompt.length, c.layers).slice();
        tokens.push(argmax(first));
        for (let k = 1; k < STEPS; k++) tokens.push(argmax(e.model.forward([tokens.at(-1)!], 1, prompt.length + k, c.layers)));
        return { tokens, first };
      });
      errors.push(normalisedError(runs[1].first, runs[0].first));
      if (runs[0].tokens.join() !== runs[1].tokens.join()) {
        parted.push(`seq ${s} (${prompt.length} tokens; first step's top-2 gap ${top2Gap(runs[0].first).toExponential(2)})`);
      }
    }
    exact.close();
    moved.close();
    const worst = errors.indexOf(Math.max(...errors)), sorted = [...errors].sort((a, b) => a - b);
    console.log(`${name}: first step's logits error up to ${errors[worst].toExponential(2)} (seq ${worst}), median ` +
      `${sorted[N >> 1].toExponential(2)}, ${errors.filter((e) => e > 1e-3).length}/${N} over 1e-3; ` +
      `${N - parted.length}/${N} sequences' ${STEPS + 1} tokens equal${parted.length ? `; parted: ${parted.join(", ")}` : ""}`);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
