// Embedding throughput through the library (model.embed: each text a sequence of the batch
// scheduler on the engine's thread), on the default model (or --model):
//   batched   all texts in one call: they share forward passes, `--parallel` sequences at a time;
//   one by one each text in a call of its own, waiting for the last.
// Texts: sentences of the Alice chapter (~50 tokens) and paragraphs of it (~230 tokens).
// Each cell is the median of --runs rounds after one warm-up; tokens count BOS. Tests never time this.
//   bun bench/embeddings.ts [--runs 3] [--threads 2] [--parallel 4] [--model PATH]
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { loadModel } from "../ts/api/index.ts";
import { defaultModelPath } from "../ts/models/cache.ts";

const argv = process.argv.slice(2);
const opt = (name: string, fallback: string) => {
  const i = argv.indexOf(name);
  return i >= 0 && i + 1 < argv.length ? argv[i + 1] : fallback;
};
const runs = Number(opt("--runs", "3"));
const threads = Number(opt("--threads", "2"));
const parallel = Number(opt("--parallel", "4"));
const modelPath = opt("--model", defaultModelPath());

const alice = readFileSync(join(import.meta.dir, "..", "test", "fixtures", "alice-chapter1.txt"),
  "utf8").replace(/\s+/g, " ");
const sentences = alice.split(/(?<=[.!?]) /).filter((s) => s.length > 40).slice(0, 64);
const model = await loadModel(modelPath, { threads, parallel, contextLength: 1024,
  backend: "cpu", prefixCacheBytes: 0 });
const words = alice.split(" ");
const paragraphs: string[] = [];
for (let at = 0; paragraphs.length < 16 && at < words.length; at += 200) {
  let n = 150, text = words.slice(at, at + n).join(" ");
  while (model.tokenize(text, { addSpecial: true }).length < 256 && at + n < words.length) {
    text = words.slice(at, at + ++n).join(" ");
  }
  paragraphs.push(text);
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function time(texts: string[], batched: boolean): Promise<number> {
  const t0 = performance.now();
  if (batched) await model.embed(texts);
  else for (const t of texts) await model.embed(t);
  return (performance.now() - t0) / 1000;
}

console.log(`model ${modelPath}, ${threads} threads, ${parallel} slots, ${runs} runs (median)`);
console.log("| texts | tokens each (mean) | path | texts/s | tokens/s |");
console.log("| --- | ---: | --- | ---: | ---: |");
for (const [name, texts] of [["64 sentences", sentences], ["16 paragraphs", paragraphs]] as const) {
  const tokens = texts.reduce((n, t) => n + model.tokenize(t, { addSpecial: true }).length, 0);
  for (const batched of [true, false]) {
    await time(texts.slice(0, 4), batched);
    const seconds = median(await Array.fromAsync({ length: runs }, () => time(texts, batched)));
    console.log(`| ${name} | ${(tokens / texts.length).toFixed(0)} | ` +
      `${batched ? "one call (batched)" : "one call per text"} | ` +
      `${(texts.length / seconds).toFixed(1)} | ${(tokens / seconds).toFixed(0)} |`);
  }
}
await model.close();
