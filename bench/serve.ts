// `bun run bench/serve.ts`: the server under concurrent streams (issue 6), on the default model
// through HTTP on loopback, as a client sees it. Two measures, each the median of --runs rounds
// after a warm-up round:
//   - aggregate decode tokens/s with 1, 2, 4 and 8 concurrent streams (--parallel 8; each stream
//     a distinct prompt of ~10 tokens, --gen tokens, end-of-generation banned): tokens after each
//     stream's first, over the time from the first stream's first token to the last stream's end.
//     A round runs 1, 2, 4, 8, then 1 stream again; each ratio is to the mean of that round's two
//     single-stream runs, so that a machine whose load changes between rounds (it is shared)
//     skews the ratios less than the rates;
//   - time to first token of a chat whose long system prompt (--system tokens) repeats while the
//     user's question changes, with the prefix cache off and on (the cache warmed by one request).
// The machine is shared: before each round it waits (up to --max-wait seconds) for other
// processes to use under a quarter of the CPUs, and the table reports the load seen then.
// Prints a Markdown table last.
//   bun run bench/serve.ts [--runs 3] [--gen 128] [--system 1000] [--threads N] [--model PATH]
//                          [--max-wait 120] [--temperature 0 (greedy; 1: an OpenAI default request)]
import { availableParallelism } from "node:os";
import { defaultModelPath } from "../ts/models/cache.ts";
import { startServer, type InferServer } from "../ts/serve/server.ts";
import { backgroundLoad } from "./peers.ts";

function option(name: string, fallback: number): number {
  const i = process.argv.indexOf(name);
  return i < 0 ? fallback : Number(process.argv[i + 1]);
}
const runs = option("--runs", 3), gen = option("--gen", 128), systemTokens = option("--system", 1000);
// 0: greedy; 1 with nothing else set is what an OpenAI client's default request samples with.
const temperature = option("--temperature", 0);
const threads = option("--threads", availableParallelism());
const maxWaitS = option("--max-wait", 120);
const backgrounds: number[] = [];

/** Waits for other processes to use under a quarter of the CPUs; records what it saw last. */
async function quiet(): Promise<void> {
  const end = performance.now() + maxWaitS * 1000;
  let load = await backgroundLoad(1000);
  while (load !== null && load >= 0.25 && performance.now() < end) load = await backgroundLoad(1000);
  if (load !== null) backgrounds.push(load);
}
const modelArg = process.argv.indexOf("--model");
const modelPath = modelArg < 0 ? defaultModelPath() : process.argv[modelArg + 1];
const STREAMS = [1, 2, 4, 8];
// Gemma's <eos> and <end_of_turn>: banned so that every stream generates exactly --gen tokens.
const noEnd = { 1: -100, 106: -100 };

interface StreamTiming { firstMs: number; endMs: number; tokens: number }

/** One streaming request; times are performance.now() values. */
async function stream(server: InferServer, body: object): Promise<StreamTiming> {
  const path = "messages" in body ? "/v1/chat/completions" : "/v1/completions";
  const res = await fetch(server.url + path, { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: server.modelId, stream: true, stream_options: { include_usage: true },
      temperature, seed: 1, logit_bias: noEnd, ...body }) });
  if (!res.ok || !res.body) throw new Error(`${res.status}: ${await res.text()}`);
  let firstMs = 0, tokens = 0, buffered = "";
  const decoder = new TextDecoder();
  for await (const bytes of res.body) {
    buffered += decoder.decode(bytes, { stream: true });
    let end: number;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, end).replace(/^data: /, "");
      buffered = buffered.slice(end + 2);
      if (event === "[DONE]") continue;
      const chunk = JSON.parse(event);
      const c = chunk.choices?.[0];
      if (!firstMs && (c?.text || c?.delta?.content)) firstMs = performance.now();
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
    }
  }
  return { firstMs, endMs: performance.now(), tokens };
}

const prompts = ["The history of the printing press", "A recipe for bread begins with",
  "In the year 2050, cities will", "The mitochondria is the part of the cell that",
  "Here is a short poem about the sea:", "To install the package, first run",
  "The three laws of thermodynamics are", "Once upon a time, in a small village,"];

async function aggregateDecode(server: InferServer, streams: number): Promise<number> {
  const timings = await Promise.all(prompts.slice(0, streams).map((prompt) =>
    stream(server, { prompt, max_tokens: gen })));
  const first = Math.min(...timings.map((t) => t.firstMs)), end = Math.max(...timings.map((t) => t.endMs));
  const tokens = timings.reduce((sum, t) => sum + t.tokens - 1, 0);
  return tokens / ((end - first) / 1000);
}

const systemPrompt = (() => {
  const words = "You are a careful assistant for a library. Answer questions about opening hours, " +
    "borrowing rules, fines, rooms, printing and the catalogue. Be brief and polite.";
  const rules = Array.from({ length: 400 }, (_, i) => `Rule ${i + 1}: ${words}`);
  return rules.join("\n");
})();

async function ttft(server: InferServer, question: string): Promise<number> {
  const t0 = performance.now();
  const t = await stream(server, { max_tokens: 2, messages: [
    { role: "system", content: systemText }, { role: "user", content: question }] });
  return t.firstMs - t0;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
let systemText = systemPrompt;

async function main(): Promise<void> {
  const common = { modelPath, port: 0, parallel: 8, maxQueue: 64, contextLength: 2048, threads,
    backend: "cpu" as const };
  // Trim the system prompt to about --system tokens (the model's tokenizer counts).
  const probe = await startServer({ ...common, prefixCacheBytes: 0 });
  try {
    const count = async (text: string) => {
      const r = await fetch(`${probe.url}/v1/chat/completions`, { method: "POST", body: JSON.stringify({
        model: probe.modelId, max_tokens: 1, messages: [{ role: "system", content: text },
          { role: "user", content: "?" }] }) });
      return (await r.json() as { usage: { prompt_tokens: number } }).usage.prompt_tokens;
    };
    // The rules are alike: tokens grow in proportion to characters.
    const sample = systemPrompt.slice(0, 2000);
    systemText = systemPrompt.slice(0, Math.floor(sample.length * systemTokens / await count(sample)));
    const tokens = await count(systemText);
    process.stderr.write(`system prompt: ${tokens} tokens with the chat template\n`);

    const decode = new Map<number, number[]>(STREAMS.map((n) => [n, []]));
    const ratios = new Map<number, number[]>(STREAMS.map((n) => [n, []]));
    for (let r = 0; r <= runs; r++) {
      const rates = new Map<number, number>();
      await quiet();
      for (const n of [...STREAMS, 1]) {
        const rate = await aggregateDecode(probe, n);
        rates.set(n, n === 1 && rates.has(1) ? (rates.get(1)! + rate) / 2 : rate);
        process.stderr.write(`round ${r}: ${n} streams ${rate.toFixed(1)} tok/s\n`);
      }
      if (r === 0) continue; // warm-up
      for (const n of STREAMS) {
        decode.get(n)!.push(rates.get(n)!);
        ratios.get(n)!.push(rates.get(n)! / rates.get(1)!);
      }
    }
    const questions = Array.from({ length: runs + 1 }, (_, i) => `When does the library open on day ${i + 3}?`);
    const cold: number[] = [];
    for (let r = 0; r <= runs; r++) {
      await quiet();
      const ms = await ttft(probe, questions[r]);
      if (r > 0) cold.push(ms);
      process.stderr.write(`TTFT, no prefix cache: ${ms.toFixed(0)} ms\n`);
    }
    await probe.stop();

    const cached = await startServer({ ...common, prefixCacheBytes: 256 << 20 });
    const warm: number[] = [];
    try {
      await ttft(cached, "Hello?"); // fills the cache with the system prompt
      for (let r = 0; r < runs; r++) {
        await quiet();
        const ms = await ttft(cached, questions[r + 1]);
        warm.push(ms);
        process.stderr.write(`TTFT, prefix cache: ${ms.toFixed(0)} ms\n`);
      }
    } finally {
      await cached.stop();
    }

    const lines = [
      `model: ${modelPath.split("/").at(-1)}; threads ${threads}; --parallel 8; temperature ${temperature}; ${runs} runs ` +
        `(median) after a warm-up; other processes' CPU share before the rounds: ` +
        `${backgrounds.map((b) => `${Math.round(b * 100)}%`).join(" ")}`,
      "",
      "| measure | value | ratio |",
      "| --- | ---: | ---: |",
      ...STREAMS.map((n) => {
        const v = median(decode.get(n)!);
        return `| decode, ${n} stream${n > 1 ? "s" : ""} (${gen} tokens each), aggregate tok/s | ` +
          `${v.toFixed(1)} | ${median(ratios.get(n)!).toFixed(2)}× |`;
      }),
      `| TTFT, ${tokens}-token system prompt, prefix cache off | ${median(cold).toFixed(0)} ms | |`,
      `| TTFT, same system prompt repeated, prefix cache on | ${median(warm).toFixed(0)} ms | ` +
        `${(median(cold) / median(warm)).toFixed(1)}× faster |`,
    ];
    console.log(lines.join("\n"));
  } finally {
    await probe.stop().catch(() => {});
  }
}

await main();
process.exit(0);
