// Method: a load test on loopback. The server decodes 8 requests at a time (continuous batching,
// prompts chunked between decode steps, a small prefix cache that must evict) on a tiny random
// Gemma whose output depends on its context. 32 concurrent clients send 200 requests in all:
// chat and completions, streaming or not, short and long prompts, some sharing a system prompt,
// some cancelled mid-stream. Each answer must equal the same request's answer when it ran alone
// (greedy, so any token mixed in from another sequence shows), each cancelled stream must be a
// prefix of it, and afterwards every slot is free and memory is back near its level before the
// load. /health is probed throughout; its latency is printed (p50 / p99 / max) and checked only
// against a generous bound, since the machine may be shared.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { startServer, type InferServer } from "../ts/serve/server.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const CLIENTS = 32, REQUESTS = 200, PARALLEL = 8;
const noEos = { 1: -100 };
let dir: string, server: InferServer, client: OpenAI;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "infer-load-"));
  const modelPath = join(dir, "tiny.gguf");
  writeFileSync(modelPath, tinyGemma3Gguf({ branchGain: 16, shape: { layers: 4, embedding: 256,
    feedForward: 1024, heads: 4, kvHeads: 2, headDim: 64 } }));
  server = await startServer({ modelPath, port: 0, parallel: PARALLEL, maxQueue: CLIENTS,
    contextLength: 1024, threads: 2, backend: "cpu", prefillChunk: 32,
    prefixCacheBytes: 2 << 20 });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0, timeout: 60_000 });
});

afterAll(async () => {
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

interface Case { kind: "chat" | "completion"; text: string; system?: string; maxTokens: number }

const words = ["the", "cat", "sat", "a", "hat", "ate", "cheese", "at", "the", "sea"];
const sentence = (n: number, seed: number) =>
  Array.from({ length: n }, (_, i) => words[(i * 7 + seed * 3 + ((i * seed) % 5)) % words.length]).join(" ");
const system = sentence(120, 11); // shared by several chats: a prefix the cache serves

const cases: Case[] = [
  ...[1, 4, 12, 40, 90, 200].map((n, i) => ({ kind: "completion" as const, text: sentence(n, i),
    maxTokens: 8 + i * 10 })),
  ...[2, 9, 30, 70].map((n, i) => ({ kind: "chat" as const, text: sentence(n, 20 + i), system,
    maxTokens: 12 + i * 12 })),
  ...[3, 25].map((n, i) => ({ kind: "chat" as const, text: sentence(n, 40 + i), maxTokens: 16 })),
];

interface Answer { text: string; finish: string | null }

/** One request; a stream is aborted after `cancelAfter` chunks when that is positive. */
async function run(c: Case, stream: boolean, cancelAfter = -1): Promise<Answer> {
  const common = { model: "tiny", max_tokens: c.maxTokens, temperature: 0, logit_bias: noEos };
  const controller = new AbortController();
  const messages = [...(c.system ? [{ role: "system" as const, content: c.system }] : []),
    { role: "user" as const, content: c.text }];
  if (!stream) {
    if (c.kind === "chat") {
      const r = await client.chat.completions.create({ ...common, messages });
      return { text: r.choices[0].message.content ?? "", finish: r.choices[0].finish_reason };
    }
    const r = await client.completions.create({ ...common, prompt: c.text });
    return { text: r.choices[0].text, finish: r.choices[0].finish_reason };
  }
  let text = "", finish: string | null = null, chunks = 0;
  const signal = controller.signal;
  const it = c.kind === "chat"
    ? await client.chat.completions.create({ ...common, messages, stream: true }, { signal })
    : await client.completions.create({ ...common, prompt: c.text, stream: true }, { signal });
  try {
    for await (const chunk of it) {
      const choice = chunk.choices[0] as { text?: string; delta?: { content?: string | null };
        finish_reason: string | null } | undefined;
      text += choice?.text ?? choice?.delta?.content ?? "";
      finish = choice?.finish_reason ?? finish;
      if (++chunks === cancelAfter) controller.abort();
    }
  } catch (err) {
    if (!(err instanceof OpenAI.APIUserAbortError) && (err as Error).name !== "AbortError") throw err;
  }
  return { text, finish };
}

async function metric(name: string): Promise<number> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  return Number(new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1]);
}

const quantile = (xs: number[], q: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1,
  Math.floor(q * xs.length))];

test(`${CLIENTS} clients, ${REQUESTS} requests, ${PARALLEL} at a time: each its own answer`, async () => {
  // Every case alone first: the reference answers, and the caches warmed to their working size.
  const alone: Answer[] = [];
  for (const c of cases) alone.push(await run(c, false));
  expect(new Set(alone.map((a) => a.text)).size).toBeGreaterThan(cases.length / 2);
  const idleRss = await metric("infer_resident_memory_bytes");

  let probing = true;
  const healthMs: number[] = [];
  const prober = (async () => {
    while (probing) {
      const t0 = performance.now();
      const r = await fetch(`${server.url}/health`);
      await r.json();
      healthMs.push(performance.now() - t0);
      await Bun.sleep(10);
    }
  })();

  let next = 0, completed = 0, cancelled = 0, maxRunning = 0;
  const failures: string[] = [];
  const worker = async () => {
    for (let i = next++; i < REQUESTS; i = next++) {
      const c = cases[i % cases.length], want = alone[i % cases.length];
      const stream = i % 3 !== 0, cancel = stream && i % 7 === 3;
      const got = await run(c, stream, cancel ? 2 : -1);
      if (cancel) {
        cancelled++;
        if (!want.text.startsWith(got.text)) failures.push(`#${i} (cancelled): not a prefix`);
      } else {
        completed++;
        if (got.text !== want.text || got.finish !== want.finish) {
          failures.push(`#${i} (${c.kind}, ${c.text.length} chars): ` +
            `${JSON.stringify(got)} != ${JSON.stringify(want)}`);
        }
      }
    }
  };
  const watcher = (async () => {
    while (probing) {
      const h = await (await fetch(`${server.url}/health`)).json() as { running: number };
      maxRunning = Math.max(maxRunning, h.running);
      await Bun.sleep(25);
    }
  })();
  const t0 = performance.now();
  await Promise.all(Array.from({ length: CLIENTS }, worker));
  const seconds = (performance.now() - t0) / 1000;
  probing = false;
  await Promise.all([prober, watcher]);

  expect(failures).toEqual([]);
  expect(completed + cancelled).toBe(REQUESTS);
  expect(maxRunning).toBe(PARALLEL);

  // Nothing leaks: every slot is free, the queue is empty, the prefix cache is within its budget.
  let h = await (await fetch(`${server.url}/health`)).json() as Record<string, number>;
  for (let i = 0; i < 200 && (h.running !== 0 || h.slots_busy !== 0); i++) {
    await Bun.sleep(10);
    h = await (await fetch(`${server.url}/health`)).json() as Record<string, number>;
  }
  expect(h).toMatchObject({ running: 0, queue_depth: 0, slots: PARALLEL, slots_busy: 0 });
  expect(await metric("infer_prefix_cache_bytes")).toBeLessThanOrEqual(2 << 20);
  expect(await metric("infer_prefix_cache_restored_tokens_total")).toBeGreaterThan(0);
  Bun.gc(true);
  const rss = await metric("infer_resident_memory_bytes");
  const p50 = quantile(healthMs, 0.5), p99 = quantile(healthMs, 0.99), max = Math.max(...healthMs);
  console.log(`load: ${REQUESTS} requests (${cancelled} cancelled) in ${seconds.toFixed(1)} s; ` +
    `/health over ${healthMs.length} probes: p50 ${p50.toFixed(1)} ms, p99 ${p99.toFixed(1)} ms, ` +
    `max ${max.toFixed(1)} ms; resident memory ${(idleRss / 2 ** 20).toFixed(0)} MiB before, ` +
    `${(rss / 2 ** 20).toFixed(0)} MiB after`);
  expect(p99).toBeLessThan(500); // the target is 50 ms; the bound only catches a blocked loop
  expect(rss - idleRss).toBeLessThan(256 * 2 ** 20);
}, 180_000);
