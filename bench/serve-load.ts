// `bun bench/serve-load.ts`: an HTTP server under load, as its clients see it — `infer serve` and,
// as the peer, llama.cpp's `llama-server` on the same GGUF, each started here as a child process
// and driven by the same clients. For each client count N, N clients each send --requests
// streaming /v1/completions one after the other; a request's prompt is 128..1,024 random ASCII
// letters and words (on bench/random-model.ts's files an ASCII character is one token in both
// engines) and it asks for 128..512 tokens greedily with every control token banned (llama.cpp
// ends at any end-of-generation token it finds by name, not only the GGUF's EOS), lengths drawn
// from one seed so both servers get the same work. Reported per server and N:
//   out tok/s     completion tokens streamed (the final usage; else the text chunks) of all
//                 requests ÷ the wall time of the level
//   failed        requests answered non-200, with an error event, cut off (a reset connection)
//                 or without [DONE]: their tokens count, their failure is reported, never hidden
//   TTFT          request sent → first streamed text, p50 and p99 over the requests
//   TPOT          (last chunk − first chunk) ÷ (tokens − 1) of each request, p50 and p99
//   gap p99       the 99th percentile of the gaps between a stream's chunks (a stall shows here)
// Prints a Markdown table last.
//   bun bench/serve-load.ts --model FILE [--clients 1,8,32,64] [--requests 2] [--backend cuda]
//     [--llama-server PATH] [--no-infer] [--ctx 2048] [--seed 1] [--prompt 128..1024] [--gen 128..512]
import { spawn, type ChildProcess } from "node:child_process";
import { createServer } from "node:net";
import { join } from "node:path";
import { openGguf } from "../ts/gguf/reader.ts";

function option(name: string): string | undefined {
  const i = process.argv.indexOf(name);
  return i < 0 ? undefined : process.argv[i + 1];
}
function range(name: string, fallback: [number, number]): [number, number] {
  const v = option(name);
  if (v === undefined) return fallback;
  const [lo, hi] = v.split("..").map(Number);
  return [lo, hi ?? lo];
}
const modelPath = option("--model");
if (!modelPath) throw new Error("--model FILE is required (e.g. a bench/random-model.ts file)");
const clientCounts = (option("--clients") ?? "1,8,32,64").split(",").map(Number);
const requestsPerClient = Number(option("--requests") ?? 2);
const backend = option("--backend") ?? "auto";
const ctx = Number(option("--ctx") ?? 2048);
const seed = Number(option("--seed") ?? 1);
const promptRange = range("--prompt", [128, 1024]);
const genRange = range("--gen", [128, 512]);
const llamaServer = option("--llama-server");
const runInfer = !process.argv.includes("--no-infer");
const maxClients = Math.max(...clientCounts);

/** mulberry32: the same lengths and prompts for every server. */
function rng(s: number): () => number {
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Work { prompt: string; maxTokens: number }
/** The requests of each client at one level: lengths and letters from the seed. */
function workload(clients: number): Work[][] {
  const next = rng(seed * 1000 + clients);
  const between = ([lo, hi]: [number, number]) => lo + Math.floor(next() * (hi - lo + 1));
  return Array.from({ length: clients }, () => Array.from({ length: requestsPerClient }, () => {
    const n = between(promptRange);
    let prompt = "";
    while (prompt.length < n) prompt += next() < 0.18 ? " " : String.fromCharCode(97 + Math.floor(next() * 26));
    return { prompt, maxTokens: between(genRange) };
  }));
}

interface Timing { sentMs: number; chunkMs: number[]; tokens: number; error: string | null }

/** One streamed request; never throws: a failure is the Timing's error, with what streamed before it. */
async function streamOne(url: string, model: string, bans: Record<number, number>, work: Work): Promise<Timing> {
  const sentMs = performance.now();
  const chunkMs: number[] = [];
  let usage: number | null = null, done = false;
  const fail = (why: string): Timing => ({ sentMs, chunkMs, tokens: usage ?? chunkMs.length, error: why });
  try {
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ model, prompt: work.prompt, max_tokens: work.maxTokens, stream: true,
        stream_options: { include_usage: true }, temperature: 0, seed: 1, logit_bias: bans }),
    });
    if (res.status !== 200 || !res.body) return fail(`HTTP ${res.status}: ${(await res.text()).slice(0, 200)}`);
    const decoder = new TextDecoder();
    let buffered = "";
    for await (const bytes of res.body) {
      buffered += decoder.decode(bytes, { stream: true });
      let end: number;
      while ((end = buffered.indexOf("\n\n")) >= 0) {
        const event = buffered.slice(0, end).trim();
        buffered = buffered.slice(end + 2);
        if (!event.startsWith("data:")) continue;
        const data = event.slice(5).trim();
        if (data === "[DONE]") {
          done = true;
          continue;
        }
        const chunk = JSON.parse(data);
        if (chunk.error) return fail(`error event: ${JSON.stringify(chunk.error).slice(0, 200)}`);
        if (typeof chunk.usage?.completion_tokens === "number") usage = chunk.usage.completion_tokens;
        const text = chunk.choices?.[0]?.text;
        if (typeof text === "string" && text.length > 0) chunkMs.push(performance.now());
      }
    }
  } catch (err) { // a reset connection, a cut stream, a malformed event
    return fail(`${(err as Error).name}: ${(err as Error).message.slice(0, 200)}`);
  }
  if (!done) return fail("the stream ended without [DONE]");
  return { sentMs, chunkMs, tokens: usage ?? chunkMs.length, error: null };
}

function percentile(values: number[], p: number): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))];
}

interface Row { server: string; clients: number; requests: number; failed: number; firstError: string | null;
  outTokS: number; ttft50: number; ttft99: number; tpot50: number; tpot99: number; gap99: number }

async function level(server: string, url: string, model: string, bans: Record<number, number>,
  clients: number): Promise<Row> {
  const plan = workload(clients);
  const start = performance.now();
  const all = (await Promise.all(plan.map(async (works) => {
    const done: Timing[] = [];
    for (const w of works) done.push(await streamOne(url, model, bans, w));
    return done;
  }))).flat();
  const wallS = (performance.now() - start) / 1000;
  // Latencies of the requests that succeeded; tokens of all that streamed.
  const timings = all.filter((t) => t.error === null);
  const failed = all.filter((t) => t.error !== null);
  const ttft = timings.filter((t) => t.chunkMs.length > 0).map((t) => t.chunkMs[0] - t.sentMs);
  const tpot = timings.filter((t) => t.chunkMs.length > 1 && t.tokens > 1)
    .map((t) => (t.chunkMs[t.chunkMs.length - 1] - t.chunkMs[0]) / (t.tokens - 1));
  const gaps = timings.flatMap((t) => t.chunkMs.slice(1).map((ms, i) => ms - t.chunkMs[i]));
  const tokens = all.reduce((s, t) => s + t.tokens, 0);
  return { server, clients, requests: all.length, failed: failed.length, firstError: failed[0]?.error ?? null,
    outTokS: tokens / wallS,
    ttft50: percentile(ttft, 50), ttft99: percentile(ttft, 99),
    tpot50: percentile(tpot, 50), tpot99: percentile(tpot, 99), gap99: percentile(gaps, 99) };
}

async function freePort(): Promise<number> {
  return await new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** Starts a server and waits until /health answers 200 (loading a model takes a while). */
async function start(command: string, args: string[], port: number): Promise<ChildProcess> {
  const child = spawn(command, args, { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr?.on("data", (b: Buffer) => { stderr = (stderr + b.toString()).slice(-4000); });
  const deadline = performance.now() + 600_000;
  while (performance.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`${command} exited ${child.exitCode}:\n${stderr}`);
    try {
      if ((await fetch(`http://127.0.0.1:${port}/health`)).status === 200) return child;
    } catch { /* not listening yet */ }
    await Bun.sleep(250);
  }
  child.kill("SIGKILL");
  throw new Error(`${command} did not become healthy in 600 s:\n${stderr}`);
}

async function stop(child: ChildProcess): Promise<void> {
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  await Promise.race([exited, Bun.sleep(15_000)]);
  if (child.exitCode === null) child.kill("SIGKILL");
}

// Every control token banned (-100: OpenAI's ban), EOS and whatever llama.cpp takes for an
// end-of-generation token among them, so both servers generate max_tokens of text.
const file = openGguf(modelPath);
const bans: Record<number, number> = {};
const types = file.metadata.get("tokenizer.ggml.token_type") as ArrayLike<number> | undefined;
for (let id = 0; id < (types?.length ?? 0); id++) if (Number(types![id]) === 3) bans[id] = -100;
bans[Number(file.metadata.get("tokenizer.ggml.eos_token_id") ?? 0)] = -100;
file.close();
const servers: { name: string; command: string; args: (port: number) => string[] }[] = [];
if (runInfer) {
  servers.push({ name: `infer (${backend})`, command: process.execPath, args: (port) => [
    join(import.meta.dir, "..", "infer.ts"), "serve", "-m", modelPath, "--backend", backend,
    "--port", String(port), "--parallel", String(maxClients), "--queue", String(maxClients * 2),
    "-c", String(ctx), "--prefix-cache", "0", "--model-id", "bench"] });
}
if (llamaServer) {
  // One slot per client, each with --ctx tokens (with -np given, llama-server splits -c over its
  // slots unless --kv-unified); its prompt cache off as infer's prefix cache is, all layers on the GPU, flash attention on.
  servers.push({ name: "llama-server", command: llamaServer, args: (port) => [
    "-m", modelPath, "--port", String(port), "-np", String(maxClients), "-c", String(ctx * maxClients),
    "-ngl", "99", "-fa", "on", "--no-cache-prompt", "--log-disable"] });
}

const rows: Row[] = [];
for (const s of servers) {
  const port = await freePort();
  let child: ChildProcess;
  try {
    child = await start(s.command, s.args(port), port);
  } catch (err) { // the other server still runs
    console.log(`${s.name} did not start: ${(err as Error).message}`);
    continue;
  }
  try {
    const url = `http://127.0.0.1:${port}`;
    await level(s.name, url, "bench", bans, 1); // warm-up: first-use costs (graphs, allocations)
    for (const n of clientCounts) {
      const row = await level(s.name, url, "bench", bans, n);
      rows.push(row);
      console.log(JSON.stringify(row));
    }
  } finally {
    await stop(child);
  }
}

const ms = (v: number) => (Number.isFinite(v) ? v.toFixed(1) : "—");
console.log("\n| server | clients | requests | failed | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | gap p99 ms |");
console.log("|---|---:|---:|---:|---:|---:|---:|---:|");
for (const r of rows) {
  console.log(`| ${r.server} | ${r.clients} | ${r.requests} | ${r.failed} | ${r.outTokS.toFixed(1)} | ` +
    `${ms(r.ttft50)} / ${ms(r.ttft99)} | ${ms(r.tpot50)} / ${ms(r.tpot99)} | ${ms(r.gap99)} |`);
}
for (const r of rows) if (r.firstError) console.log(`${r.server}, ${r.clients} clients: ${r.failed} failed; first: ${r.firstError}`);
