// Speculative decoding: decode tokens/s with speculation off and with prompt lookup (ngram), on
// input-grounded tasks (a passage summarised, a code file rewritten with one change, a question
// answered by quoting a document, a text continued by repeating it) and on open-ended prompts;
// the median of several runs each, greedy, the prompt not reused between runs. Also acceptance
// (drafted tokens kept), tokens per forward pass, and whether both modes gave the same tokens
// (they must). With --peer, llama.cpp's llama-lookup on the same prompts: its decode speed
// without drafts (--spec-draft-n-max 0) and with them (the same draft max).
//   bun bench/speculative.ts [--threads 2] [--runs 3] [--tokens 192] [--draft-max 16]
//     [--model PATH] [--backend cpu|cuda] [--tasks all|grounded|open|repeated]
//     [--draft-model PATH|self]   (adds a column: that model drafting, e.g. a Q4_0 copy of a Q8_0
//                                  model; self: the model's own all-Q4_0 copy, cached)
//     [--force-draft]   (the draft model drafts at every step: its acceptance where it would not pay)
//     [--peer ~/.cache/infer-peers/llama.cpp/build-lookup/bin/llama-lookup]
// On random-weight models (bench/random-model.ts) only the repeated-text task means anything:
// random weights repeat what they saw, and drafts hold there as on real text.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { BackendKind } from "../ts/backend/select.ts";
import { Engine } from "../ts/engine/engine.ts";
import { DraftModel } from "../ts/engine/draft-model.ts";
import { resolveDraftModel } from "../ts/engine/self-draft.ts";
import type { GenerateResult } from "../ts/engine/generation.ts";
import { BatchScheduler } from "../ts/engine/scheduler.ts";
import type { SpeculationMode } from "../ts/engine/speculation.ts";
import { defaultModelPath } from "../ts/models/cache.ts";

function option(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i < 0 ? fallback : process.argv[i + 1];
}
const threads = Number(option("--threads", "2")), runs = Number(option("--runs", "3"));
const maxTokens = Number(option("--tokens", "192")), draftMax = Number(option("--draft-max", "16"));
const modelPath = option("--model", defaultModelPath());
const backend = option("--backend", "cpu") as BackendKind;
const which = option("--tasks", "all");
const peer = option("--peer", "");
const draftPath = option("--draft-model", "");

const root = join(import.meta.dir, "..");
const alice = readFileSync(join(root, "test/fixtures/alice-chapter1.txt"), "utf8");
const code = readFileSync(join(root, "ts/sample/stop.ts"), "utf8");
const passage = alice.slice(0, 2600);

interface Task { name: string; grounded: boolean; prompt: string }
const grounded: Task[] = [
  { name: "summarise a passage", grounded: true,
    prompt: `${passage}\n\nA summary of the passage above, quoting its key sentences:\n\n` },
  { name: "rewrite code, one change", grounded: true,
    prompt: `Here is a TypeScript file:\n\n\`\`\`ts\n${code}\`\`\`\n\nThe same file with the class ` +
      "StopMatcher renamed to StopStrings, everything else unchanged:\n\n```ts\n" },
  { name: "answer from a document", grounded: true,
    prompt: `Document:\n"""\n${alice.slice(2600, 5200)}\n"""\n\nQuestion: What did Alice find on ` +
      "the little three-legged table, and what did she do with it? Answer by quoting the " +
      "document's sentences word for word.\n\nAnswer: \"" },
];
const repeated: Task = { name: "repeated text", grounded: true,
  prompt: "the quick brown fox jumps over the lazy dog and runs into the forest. ".repeat(8) };
const open: Task[] = [
  { name: "open: a story", grounded: false, prompt: "Once upon a time, in a small village by the sea," },
  { name: "open: an essay", grounded: false, prompt: "The most important inventions of the twentieth century were" },
  { name: "open: a recipe", grounded: false, prompt: "My favourite way to cook vegetables is" },
];
const tasks = which === "repeated" ? [repeated] : which === "open" ? open
  : which === "grounded" ? [...grounded, repeated] : [...grounded, repeated, ...open];

const engine = Engine.open({ modelPath, threads, backend, contextLength: 2048 });
// --draft-model self: the model's own Q4_0 copy (every matrix, the LM head too), made and cached
const drafter = draftPath ? new DraftModel(Engine.open({
  modelPath: await resolveDraftModel(draftPath, modelPath), threads, backend,
  contextLength: 2048 }), engine) : null;
// The engine's path (Engine.generate's one-slot scheduler), with the draft model when there is one.
const scheduler = new BatchScheduler(engine, { slots: 1, prefixCache: null, draftModel: drafter });
// --force-draft: the draft model's runs with a pass cost that makes every draft look worth it,
// so its acceptance and tokens per pass are measured where the timed choice would not draft.
const forceDraft = process.argv.includes("--force-draft");
const draftScheduler = forceDraft
  ? new BatchScheduler(engine, { slots: 1, prefixCache: null, draftModel: drafter,
    passCost: (rows) => 1 + 0.05 * (rows - 1) })
  : scheduler;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
/** The CUDA backend's step counts (ops run one by one, graphs captured, graphs launched), per mode. */
type GraphCounts = { eagerSteps: number; captures: number; graphLaunches: number };
const graphCounts = (): GraphCounts | null => {
  const stats = (engine.backend as { stats?: GraphCounts }).stats;
  return stats && "graphLaunches" in stats ? { ...stats } : null;
};
const graphsByMode = new Map<SpeculationMode, GraphCounts>();
const generate = (prompt: string, mode: SpeculationMode): GenerateResult => {
  const before = graphCounts();
  let result: GenerateResult | null = null;
  const request = { prompt: engine.tokenizer.encode(prompt, { addSpecial: true, parseSpecial: true }),
    options: { maxTokens, ignoreEos: true, reuseCache: false,
      sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 },
      speculation: { mode, draftMax } },
    onDone: (r: GenerateResult) => (result = r), onError: (e: Error) => { throw e; } };
  const runner = mode === "draft" ? draftScheduler : scheduler;
  runner.submit(request);
  while (runner.busy) runner.step();
  const after = graphCounts();
  if (before && after) {
    const sum = graphsByMode.get(mode) ?? { eagerSteps: 0, captures: 0, graphLaunches: 0 };
    for (const k of ["eagerSteps", "captures", "graphLaunches"] as const) sum[k] += after[k] - before[k];
    graphsByMode.set(mode, sum);
  }
  return result!;
};
/** Generated tokens per forward pass: a pass yields its kept drafts and one token more. */
const perPass = (r: GenerateResult) => r.tokens.length / (r.tokens.length - r.speculation!.accepted);
const rate = (r: GenerateResult) => (r.tokens.length - 1) / (r.generateMs / 1000);

generate("Warming up the weights and the pass-cost estimate.", "ngram");
if (drafter) generate("Warming up the draft model.", "draft");
const draftCols = drafter ? " draft tok/s | × off | draft accepted | draft tokens / pass |" : "";
const lines = [
  `model ${modelPath}; backend ${engine.backend.name}; threads ${threads}; ${maxTokens} tokens ` +
  `greedy (end-of-generation ignored); draft max ${draftMax}; median of ${runs} runs` +
  (drafter ? `; draft model ${draftPath}${forceDraft ? " (forced to draft)" : ""}` : ""), "",
  "| task | prompt tokens | off tok/s | ngram tok/s | × off | accepted | tokens / pass | same tokens |" +
    draftCols + (peer ? " llama.cpp off tok/s | llama-lookup tok/s | × |" : ""),
  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | :---: |" + (drafter ? " ---: | ---: | ---: | ---: |" : "") +
    (peer ? " ---: | ---: | ---: |" : ""),
];
const ratios = { grounded: [] as number[], open: [] as number[], draft: [] as number[] };
const accepted = (s: { accepted: number; drafted: number }) =>
  `${s.drafted ? ((100 * s.accepted) / s.drafted).toFixed(0) : "-"}% (${s.accepted}/${s.drafted})`;
for (const task of tasks) {
  const off: number[] = [], on: number[] = [], drafted: number[] = [];
  let last: GenerateResult | null = null, lastDraft: GenerateResult | null = null, same = true;
  let promptTokens = 0;
  for (let run = 0; run < runs; run++) { // alternated, so a change in the machine's speed hits all
    const a = generate(task.prompt, "off"), b = generate(task.prompt, "ngram");
    off.push(rate(a));
    on.push(rate(b));
    same &&= a.tokens.join() === b.tokens.join();
    if (drafter) {
      lastDraft = generate(task.prompt, "draft");
      drafted.push(rate(lastDraft));
      same &&= a.tokens.join() === lastDraft.tokens.join();
    }
    last = b;
    promptTokens = a.promptTokens.length;
  }
  const s = last!.speculation!;
  const ratio = median(on) / median(off);
  (task.grounded ? ratios.grounded : ratios.open).push(ratio);
  const peerOff = peer ? lookupPeer(task.prompt, 0) : null;
  const peerOn = peer ? lookupPeer(task.prompt, draftMax) : null;
  const peerCells = !peer ? "" : ` ${peerOff?.toFixed(1) ?? "failed"} | ${peerOn?.toFixed(1) ?? "failed"} | ` +
    `${peerOff && peerOn ? (peerOn / peerOff).toFixed(2) + "×" : "-"} |`;
  let draftCells = "";
  if (lastDraft) {
    const draftRatio = median(drafted) / median(off);
    if (task.grounded) ratios.draft.push(draftRatio);
    draftCells = ` ${median(drafted).toFixed(1)} | ${draftRatio.toFixed(2)}× | ` +
      `${accepted(lastDraft.speculation!)} | ${perPass(lastDraft).toFixed(2)} |`;
  }
  lines.push(`| ${task.name} | ${promptTokens} | ${median(off).toFixed(1)} | ${median(on).toFixed(1)} | ` +
    `${ratio.toFixed(2)}× | ${accepted(s)} | ${perPass(last!).toFixed(2)} | ` +
    `${same ? "yes" : "NO"} |${draftCells}${peerCells}`);
}
const geo = (xs: number[]) => Math.exp(xs.reduce((a, x) => a + Math.log(x), 0) / xs.length);
lines.push("");
if (ratios.grounded.length) lines.push(`grounded: ngram ${geo(ratios.grounded).toFixed(2)}× off (geometric mean)`);
if (ratios.open.length) lines.push(`open-ended: ngram ${geo(ratios.open).toFixed(2)}× off (geometric mean)`);
if (ratios.draft.length) lines.push(`grounded: draft model ${geo(ratios.draft).toFixed(2)}× off (geometric mean)`);
// What chose the draft lengths: the scheduler's timed passes (one row: plain decoding's time a
// token, a step ahead on CUDA), and on CUDA how the steps ran (graphs, or op by op).
lines.push(`pass times, rows: ms (the last ~16 of each): ${scheduler.passTimings()
  .map((t) => `${t.rows}: ${t.ms.toFixed(2)}`).join(", ")}`);
for (const [mode, g] of graphsByMode) {
  lines.push(`CUDA steps with speculation ${mode}: ${g.graphLaunches} graph launches, ` +
    `${g.captures} captures, ${g.eagerSteps} op by op`);
}
console.log(lines.join("\n"));
drafter?.close();
engine.close();

/** llama.cpp's prompt-lookup example on the same prompt, drafting `k` tokens at most: its decode speed, or null. */
function lookupPeer(prompt: string, k: number): number | null {
  const dir = mkdtempSync(join(tmpdir(), "infer-spec-"));
  try {
    const file = join(dir, "prompt.txt");
    writeFileSync(file, prompt);
    const rates: number[] = [];
    for (let run = 0; run < runs; run++) {
      const r = spawnSync(peer, ["-m", modelPath, "-f", file, "-n", String(maxTokens), "-t", String(threads),
        "--temp", "0", "--spec-draft-n-max", String(k), "-c", "2048", "--ignore-eos",
        ...(backend === "cuda" ? ["-ngl", "99"] : [])],
      { encoding: "utf8" });
      const m = /decoded\s+\d+\s+tokens in\s+[\d.]+\s+seconds, speed:\s+([\d.]+) t\/s/.exec(r.stderr + r.stdout);
      if (!m) {
        console.error(`llama-lookup failed: ${(r.stderr || r.stdout || "").trim().split("\n").slice(-3).join(" | ")}`);
        return null;
      }
      rates.push(Number(m[1]));
    }
    return median(rates);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
