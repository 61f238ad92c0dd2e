// One decode step of the server's batched forward pass, in-process on the default model: the
// time of Model.forwardBatch for 1 and for 8 one-token sequences (each with its own KV cache,
// 20 tokens in), and of picking the next token of 8 rows as bench/serve.ts's requests do
// (greedy, end-of-generation tokens banned by a logit bias). Shows how much of a server step is
// the forward pass and how far 8 rows are from 8 times one.
//   bun bench/batch-step.ts [--steps 40] [--threads N]
import { availableParallelism } from "node:os";
import { defaultModelPath } from "../ts/models/cache.ts";
import { Engine } from "../ts/engine/engine.ts";
import { createKvCache } from "../ts/engine/kv-cache.ts";
import { Sampler } from "../ts/sample/sampler.ts";

function option(name: string, fallback: number): number {
  const i = process.argv.indexOf(name);
  return i < 0 ? fallback : Number(process.argv[i + 1]);
}
const steps = option("--steps", 40), threads = option("--threads", availableParallelism());
const engine = Engine.open({ modelPath: defaultModelPath(), threads });
const model = engine.model, vocab = model.info.vocabSize;
const caches = Array.from({ length: 8 }, () => createKvCache(engine.backend, model.info, 512, "f16", model.maxBatch));
const prompt = Array.from({ length: 20 }, (_, i) => 100 + i * 37);
for (const c of caches) {
  model.forwardBatch({ tokens: prompt, segments: [{ rows: 20, position: 0, cache: c.layers }], logitRows: 1 }, () => {});
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
const samplers = caches.map(() => new Sampler({ temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1,
  logitBias: new Map([[1, -100], [106, -100]]) }));
const lines = [`model ${defaultModelPath()}; threads ${threads}; median of ${steps} steps`, "",
  "| rows | forwardBatch ms | tokens/s | × one row | picking the tokens, ms |", "| ---: | ---: | ---: | ---: | ---: |"];
let oneRowMs = 0;
for (const rows of [1, 8]) {
  const forward: number[] = [], picking: number[] = [];
  for (let step = 0; step < steps; step++) {
    // As the scheduler does: the tokens are picked inside the sink, from the logits in place.
    let pickMs = 0;
    const t0 = performance.now();
    model.forwardBatch({
      tokens: Array(rows).fill(500), logitRows: rows,
      segments: caches.slice(0, rows).map((c) => ({ rows: 1, position: 20 + (step % 400), cache: c.layers })),
    }, (first, n, logits) => {
      const t1 = performance.now();
      for (let r = 0; r < n; r++) samplers[first + r].sample(logits.subarray(r * vocab, (r + 1) * vocab));
      pickMs += performance.now() - t1;
    });
    forward.push(performance.now() - t0 - pickMs);
    picking.push(pickMs);
  }
  const ms = median(forward);
  if (rows === 1) oneRowMs = ms;
  lines.push(`| ${rows} | ${ms.toFixed(2)} | ${(rows * 1000 / ms).toFixed(1)} | ` +
    `${((rows * oneRowMs) / ms).toFixed(2)}× | ${median(picking).toFixed(2)} |`);
}
console.log(lines.join("\n"));
engine.close();
