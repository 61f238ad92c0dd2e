// Time to pick one token from a row of Gemma 3's size (262,144 logits) with the sampler chain's
// common settings: greedy, greedy with a logit bias, llama.cpp's defaults (top-k 40), an OpenAI
// request's defaults (temperature 1, nothing cut), top-p alone and min-p alone. The row is peaked
// as a model's is: 30 logits in [5, 10], the rest in [-10, -2]. Prints a table of ms per row
// (median of --reps picks after a warm-up).
//   bun bench/sampling.ts [--reps 200] [--vocab 262144]
import { defaultSampling, seededRandom, Sampler, type SamplerOptions } from "../ts/sample/sampler.ts";

function option(name: string, fallback: number): number {
  const i = process.argv.indexOf(name);
  return i < 0 ? fallback : Number(process.argv[i + 1]);
}
const reps = option("--reps", 200), vocab = option("--vocab", 262_144);
const rand = seededRandom(1);
const logits = Float32Array.from({ length: vocab }, () => rand() * 8 - 10);
for (let i = 0; i < 30; i++) logits[Math.floor(rand() * vocab)] = 5 + rand() * 5;

const settings: [string, Partial<SamplerOptions>][] = [
  ["greedy", { temperature: 0 }],
  ["greedy, logit bias on 2 tokens", { temperature: 0, logitBias: new Map([[1, -100], [106, -100]]) }],
  ["llama.cpp defaults (top-k 40, top-p 0.95, min-p 0.05, T 0.8)", {}],
  ["OpenAI defaults (T 1, nothing cut)", { temperature: 1, topK: 0, topP: 1, minP: 0 }],
  ["top-p 0.9 alone (T 1)", { temperature: 1, topK: 0, topP: 0.9, minP: 0 }],
  ["min-p 0.05 alone (T 0.7)", { temperature: 0.7, topK: 0, topP: 1, minP: 0.05 }],
];
const lines = [`vocabulary ${vocab}; median of ${reps} picks`, "", "| settings | ms per row |", "| --- | ---: |"];
for (const [name, o] of settings) {
  const sampler = new Sampler({ ...defaultSampling, seed: 1, ...o });
  for (let i = 0; i < 20; i++) sampler.sample(logits);
  const ms: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    sampler.sample(logits);
    ms.push(performance.now() - t0);
  }
  ms.sort((a, b) => a - b);
  lines.push(`| ${name} | ${ms[ms.length >> 1].toFixed(3)} |`);
}
console.log(lines.join("\n"));
