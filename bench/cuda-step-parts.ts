// Where a CUDA decode step's GPU time goes, priced in place: the step's graph and, beside it, graphs
// of the same step with one kind of op left out (CudaBackend.profileSkip) are replayed in turn;
// the difference prices that kind with the overlaps and launch gaps of the real step (Nsight
// Compute's per-kernel times, one kernel at a time with cold caches, add up to more than the
// step). Results of the skipped steps are wrong; only their time is read.
// With --alone, each kind is also replayed by itself (a graph of only its launches, one after the
// other as in the step): its own time, with the boundaries between its launches but no other op.
//   bun bench/cuda-step-parts.ts [--models llama-3.1-8b] [--quants Q4_0] [--context 16] [--times 100] [--rounds 5] [--alone]
import { CudaBackend } from "../ts/backend/cuda.ts";
import { Engine } from "../ts/engine/engine.ts";
import { native } from "../ts/native/lib.ts";
import { ensureRandomModel, findShape, type RandomQuant } from "./random-model.ts";

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

/** The kinds of op priced, by what their launches say (ts/backend/cuda-fuse.ts names the fused ones). */
const PARTS: [string, RegExp][] = [
  ["attention", /^attention/],
  ["add + norm + quantize", /^add \+ rms_norm/],
  ["norm + quantize", /^rms_norm \+ quantize/],
  ["head norms, rope, kv store", /rope|kv_store|rms_norm \(q and k/],
  ["q/k/v matvec", /3 matmuls|attn_[qkv]\.weight/],
  ["o-proj matvec", /attn_output/],
  ["gate/up matvec", /2 matmuls|ffn_(gate|up)\.weight/],
  ["activation + quantize", /gated activation|gelu_mul|silu_mul/],
  ["down matvec", /ffn_down/],
  ["LM head", /matmul (output|token_embd)/],
  ["every matvec", /matmul/],
  ["all but matvecs", /^(?!.*matmul)/],
];

const times = Number(arg("--times", "100"));
const rounds = Number(arg("--rounds", "5"));
/** GPU µs per replay of each graph: the graphs replayed `times` times each in turn, `rounds` times over; medians. */
function replayUs(execs: number[]): number[] {
  const lib = native();
  const runs = execs.map(() => [] as number[]);
  for (let r = -1; r < rounds; r++) { // round -1 warms up
    execs.forEach((exec, i) => {
      lib.infer_cuda_sync();
      const t0 = performance.now();
      for (let k = 0; k < times; k++) lib.infer_cuda_graph_launch(exec);
      lib.infer_cuda_sync();
      if (r >= 0) runs[i].push(((performance.now() - t0) * 1000) / times);
    });
  }
  return runs.map((xs) => xs.sort((a, b) => a - b)[xs.length >> 1]);
}

const context = Number(arg("--context", "16"));
for (const name of arg("--models", "llama-3.1-8b").split(",")) {
  const shape = findShape(name);
  if (!shape) throw new Error(`unknown model ${name}`);
  for (const quant of arg("--quants", "Q4_0").split(",")) {
    const engine = Engine.open({ modelPath: ensureRandomModel(shape, quant as RandomQuant), backend: "cuda",
      contextLength: context + 256 }); // 3 tokens a captured graph, up to 25 graphs
    const backend = engine.backend as CudaBackend;
    engine.evaluate(Array.from({ length: context }, (_, i) => 97 + (i % 26)));
    // A step run eagerly, captured, then replayed: its graph is backend.lastGraph.
    const capture = () => {
      for (let i = 0; i < 3; i++) engine.evaluate([100]);
      return backend.lastGraph;
    };
    const base = capture();
    const ops = [...backend.lastStepOps];
    const counts = new Map<string, number>();
    for (const w of ops) {
      const kind = w.replace(/blk\.\d+\./, "blk.N.");
      counts.set(kind, (counts.get(kind) ?? 0) + 1);
    }
    const parts = PARTS.map(([part, re]) => ({ part, re, n: ops.filter((w) => re.test(w)).length }))
      .filter((p) => p.n > 0);
    const execs = [base];
    for (const p of parts) {
      backend.profileSkip(p.re);
      execs.push(capture());
    }
    const us = replayUs(execs);
    // Then the graphs of each kind alone, replayed apart (the backend keeps 64 graphs at most).
    const alone = process.argv.includes("--alone");
    if (alone) {
      const own: number[] = [];
      for (const p of parts) {
        backend.profileSkip(new RegExp(`^(?!.*(?:${p.re.source}))`)); // every op but this kind's
        own.push(capture());
      }
      us.push(...replayUs(own));
    }
    backend.profileSkip(null);
    engine.close();
    console.log(`\n${shape.label} ${quant}, decode step at ~${context + 3} tokens: ${us[0].toFixed(1)} us ` +
      `(each graph replayed ${times}x in turn, median of ${rounds} rounds)`);
    console.log(`ops: ${[...counts].map(([k, v]) => `${v}x ${k}`).join(", ")}`);
    console.log(`| left out | ops | us saved | us per op | share |${alone ? " alone: us | us per op |" : ""}`);
    console.log(`|---|---|---|---|---|${alone ? "---|---|" : ""}`);
    parts.forEach((p, i) => {
      const saved = us[0] - us[i + 1];
      const own = alone ? ` ${us[parts.length + i + 1].toFixed(1)} | ${(us[parts.length + i + 1] / p.n).toFixed(2)} |` : "";
      console.log(`| ${p.part} | ${p.n} | ${saved.toFixed(1)} | ${(saved / p.n).toFixed(2)} | ${(100 * saved / us[0]).toFixed(1)}% |${own}`);
    });
  }
}
