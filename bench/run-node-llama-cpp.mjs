// One measured node-llama-cpp run (what a TypeScript user would pick), in its own Node process.
// Prints one JSON line shaped like bench/run-infer.ts's (or {"error": ...} and exit code 1).
//   node bench/run-node-llama-cpp.mjs --peers DIR --model M --mode prefill|decode|decode-deep
//       --tokens FILE [--threads N] [--ctx 2048] [--batch 512] [--gen 128] [--deep-gen 32]
//   node bench/run-node-llama-cpp.mjs --peers DIR --model M --mode text --text PROMPT [--gen 128] ...
// --mode text is bench/cli-e2e.ts's peer of the infer CLI: the prompt as text (BOS first where the
// model wants it, as llama.cpp does), no warm-up, `gen` greedy tokens streamed to stdout as text
// (never stopping at EOS), then the JSON line on a line of its own.
// The same token ids as infer; greedy (temperature 0); the generator never stops on EOS because
// we stop iterating ourselves. Each process warms up first (as llama-bench does), then clears the
// sequence. TTFT: from evaluate(prompt) to the first generated token.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  if (i >= 0 && i + 1 < process.argv.length) return process.argv[i + 1];
  if (fallback === undefined) throw new Error(`missing ${name}`);
  return fallback;
}

function peakRssKiB() {
  try {
    const m = /VmHWM:\s+(\d+)\s+kB/.exec(readFileSync("/proc/self/status", "utf8"));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

/** Feeds `prompt`, then `n` greedy steps; returns [ms to the first token, ms of the n steps, last]. */
async function generate(sequence, prompt, n) {
  const t0 = performance.now();
  let first = 0, count = -1, last = -1;
  for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
    last = token;
    if (++count === 0) first = performance.now();
    if (count === n) break;
  }
  return [first - t0, performance.now() - first, last];
}

async function main() {
  const peers = arg("--peers");
  const entry = join(peers, "node_modules", "node-llama-cpp", "dist", "index.js");
  const { getLlama, LlamaLogLevel } = await import(pathToFileURL(entry).href);
  const mode = arg("--mode");
  const tokens = mode === "text" ? null : JSON.parse(readFileSync(arg("--tokens"), "utf8"));
  const threads = Number(arg("--threads", "0"));
  const gen = Number(arg("--gen", "128")), deepGen = Number(arg("--deep-gen", "32"));
  const tLoad = performance.now();
  const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
  const model = await llama.loadModel({ modelPath: arg("--model") });
  const context = await model.createContext({
    contextSize: Number(arg("--ctx", "2048")), batchSize: Number(arg("--batch", "512")),
    threads, sequences: 1,
  });
  const sequence = context.getSequence();
  const loadMs = performance.now() - tLoad;
  let result;
  if (mode === "text") {
    const prompt = model.tokenize(arg("--text"), true);
    if (model.tokens.shouldPrependBosToken && model.tokens.bos !== null) prompt.unshift(model.tokens.bos);
    const t0 = performance.now();
    let first = 0, count = 0;
    const out = [];
    for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
      if (count === 0) first = performance.now();
      out.push(token);
      process.stdout.write(model.detokenize([token], false, out.slice(-8, -1)));
      if (++count === gen) break;
    }
    process.stdout.write("\n");
    const ms = performance.now() - first;
    result = { tokensPerSec: (gen - 1) / (ms / 1000), ttftMs: first - t0, tokens: gen, ms, lastToken: out.at(-1) };
  } else if (mode === "prefill") {
    await sequence.evaluateWithoutGeneratingNewTokens(tokens.prefill); // warm-up
    await sequence.clearHistory();
    const t0 = performance.now();
    await sequence.evaluateWithoutGeneratingNewTokens(tokens.prefill);
    const ms = performance.now() - t0;
    result = { tokensPerSec: tokens.prefill.length / (ms / 1000), ttftMs: null, tokens: tokens.prefill.length, ms };
  } else if (mode === "decode") {
    await generate(sequence, tokens.short.slice(0, 1), 1); // warm-up
    await sequence.clearHistory();
    const [ttft, ms, last] = await generate(sequence, tokens.short, gen);
    result = { tokensPerSec: gen / (ms / 1000), ttftMs: ttft, tokens: gen, ms, lastToken: last };
  } else if (mode === "decode-deep") {
    await generate(sequence, tokens.deep.slice(0, 1), 1); // warm-up
    await sequence.clearHistory();
    const deep = tokens.deep;
    await sequence.evaluateWithoutGeneratingNewTokens(deep.slice(0, -1));
    // The last prompt token goes in with the generator; its step yields the first new token.
    const [, ms, last] = await generate(sequence, deep.slice(-1), deepGen);
    result = { tokensPerSec: deepGen / (ms / 1000), ttftMs: null, tokens: deepGen, ms, lastToken: last };
  } else {
    throw new Error(`unknown --mode ${mode} (prefill, decode, decode-deep)`);
  }
  const out = { mode, ...result, peakRssKiB: peakRssKiB(), loadMs };
  await context.dispose();
  await model.dispose();
  await llama.dispose();
  return out;
}

main().then(
  (out) => { console.log(JSON.stringify(out)); process.exit(0); },
  (err) => { console.log(JSON.stringify({ error: String(err?.message ?? err).split("\n")[0] })); process.exit(1); },
);
