// Method: qwen3moe and gpt-oss on the CUDA backend (router, top k and expert ids on the device;
// matvecs indexed by expert id) against the CPU backend on small random-weight GGUFs with Q4_0,
// Q8_0, Q4_K/Q6_K and MXFP4 experts (gpt-oss: its shape scaled down, with expert biases, the
// clamped SwiGLU, attention sinks, YaRN and sliding layers). The router's choice is compared on
// its own: the GPU's experts for every token and layer are the CPU's, except where the CPU's k-th
// and (k+1)-th scores are within ROUTER_NEAR_TIE of each other (then only the k-th may differ).
// With 128 experts such near-ties come every few steps, and one other expert chosen in the last
// layer moves that step's logits by ~0.14 of their largest (measured on the CPU by swapping the
// two), so the logits are compared with the GPU's experts pinned to the CPU's choice
// (CudaExperts.pinRoute), on the CPU's tokens: the prompt and 16 steps within test/cuda.test.ts's
// tolerance for quantized models (the GPU sums in another order, see its header). Free-running,
// greedy tokens equal except at a near-tie of the top two logits; graphs against eager ops, and
// the grouped matvec against the per-slot one, bit for bit; a batch of three sequences (prompts
// and a decode step) against each sequence alone on the CPU; the grouped tensor-core path
// (moe_mmq) on prompts of 1 to 300 tokens (experts with no slot, and experts with several 32-slot
// tiles) against the CPU, its tiles of 8 and of 32 slots against each other bit for bit. Skipped
// without a GPU.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { maxAbsDiff, top2Gap } from "../bench/logits.ts";
import type { CudaBackend } from "../ts/backend/cuda.ts";
import { withSettings } from "../ts/config/env.ts";
import { Engine } from "../ts/engine/engine.ts";
import { createKvCache } from "../ts/engine/kv-cache.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import type { SequenceRows } from "../ts/model/model.ts";
import { route, type MoeShape } from "../ts/model/moe.ts";
import { cudaStatus } from "../ts/native/cuda.ts";
import { greedyRun, type GreedyRun } from "./support/engine-logits.ts";
import { normalisedError } from "./support/numeric.ts";
import {
  gptossMxfp4, qwen3moeKQuants, qwen3moeMxfp4, qwen3moeQ4_0, randomQuantGguf, type RandomQuantSpec,
} from "./support/random-quant-gguf.ts";

const status = cudaStatus();
const noCuda = !status.available;
if (!status.available) console.log(`cuda-moe: skipped, ${status.reason}`);
// As test/cuda.test.ts: logits of quantized models, and how near a top-2 gap is a tie.
const TOL_LOGITS_Q = 1e-1;
const NEAR_TIE = 4;
const STEPS = 16;
// The GPU's router logits come from hidden states ~1e-2 (normalised) off the CPU's; a k-th and a
// (k+1)-th score closer than this, relative to the token's largest |router logit|, may swap
// (twice that error; the swaps that failed the free-running comparison were at 1e-4 to 2.3e-3).
const ROUTER_NEAR_TIE = 2e-2;

const dir = mkdtempSync(join(tmpdir(), "infer-cuda-moe-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Q8_0 experts of 256-wide rows (the GPU layout), 32 experts, 4 chosen. */
const qwen3moeQ8_0: RandomQuantSpec = {
  arch: "qwen3moe", layers: 2, embedding: 256, feedForward: 512, heads: 4, kvHeads: 2, headDim: 64,
  moe: { experts: 32, used: 4, feedForward: 256 },
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q8_0, attnOut: GgmlType.Q8_0, ffn: GgmlType.Q8_0,
    ffnDown: GgmlType.Q8_0, output: GgmlType.Q8_0 },
  seed: 19,
};

const MODELS: [string, RandomQuantSpec][] = [
  // 128 experts, 8 chosen (Qwen3-30B-A3B's routing): Q4_0 gate/up in the GPU layout, down 64 wide
  ["Q4_0 experts, 128 of them, 8 chosen", qwen3moeQ4_0],
  ["Q8_0 experts", qwen3moeQ8_0],
  ["Q4_K gate/up, Q6_K down", qwen3moeKQuants],
  // gpt-oss's expert format (17-byte blocks, 160-value down rows), the rest Q8_0
  ["MXFP4 experts", qwen3moeMxfp4],
  // gpt-oss-20b's shape scaled down: top k then softmax, biases, clamped SwiGLU, sinks, YaRN,
  // a window of 8 on the even layers (the prompt's 24 tokens pass it)
  ["gpt-oss (MXFP4 experts, the rest Q8_0)", gptossMxfp4],
];

function prompt(length: number, seed: number): number[] {
  return Array.from({ length }, (_, i) => 6 + ((i * 37 + seed * 11) % 260));
}

/** Equal tokens, or a first difference where the CPU's top-2 gap is within rounding. */
function compareRuns(got: GreedyRun, want: GreedyRun): { stepErr: number; same: number } {
  let stepErr = 0, same = 0;
  for (let i = 0; i < STEPS; i++) {
    const before = (r: GreedyRun) => (i === 0 ? r.promptLogits : r.stepLogits[i - 1]);
    if (i > 0) stepErr = Math.max(stepErr, normalisedError(before(got), before(want)));
    if (got.tokens[i] !== want.tokens[i]) {
      expect(top2Gap(before(want))).toBeLessThanOrEqual(NEAR_TIE * maxAbsDiff(before(got), before(want)));
      break;
    }
    same++;
  }
  return { stepErr, same };
}

function experts(e: Engine): CudaBackend["experts"] {
  return (e.backend as CudaBackend).experts;
}

/** One MoE layer's routing on the CPU: per slot, expert and weight; per token, the k-th gap. */
interface LayerRoute {
  readonly ids: Int32Array;
  readonly weights: Float32Array;
  /** (k-th − (k+1)-th router logit) / the token's largest |router logit|. */
  readonly gaps: Float32Array;
}

function moeShape(spec: RandomQuantSpec): MoeShape {
  const moe = spec.moe!;
  const base = { embedding: spec.embedding, experts: moe.experts, expertsUsed: moe.used,
    expertFeedForward: moe.feedForward };
  return spec.arch === "gpt-oss"
    ? { ...base, normalizeTopK: false, gating: "topk-softmax", activation: "swiglu-oai" }
    : { ...base, normalizeTopK: true };
}

/** The CPU engine's routing, layer by layer as its forward passes read the router's logits. */
function recordRoutes(e: Engine, shape: MoeShape): LayerRoute[] {
  const routes: LayerRoute[] = [], be = e.backend, read = be.read.bind(be);
  const n = shape.experts, k = shape.expertsUsed, probs = new Float32Array(n);
  be.read = (x, rows) => {
    const v = read(x, rows);
    if (x.name !== "moe_logits") return v;
    const r: LayerRoute = { ids: new Int32Array(rows * k), weights: new Float32Array(rows * k),
      gaps: new Float32Array(rows) };
    for (let t = 0; t < rows; t++) {
      const l = v.subarray(t * n, (t + 1) * n);
      route(l, shape, probs, r.ids, r.weights, t * k);
      const sorted = Float32Array.from(l).sort();
      const largest = Math.max(Math.abs(sorted[0]), Math.abs(sorted[n - 1]));
      r.gaps[t] = (sorted[n - k] - sorted[n - k - 1]) / largest;
    }
    routes.push(r);
    return v;
  };
  return routes;
}

/** The prompt's logits, then each of `tokens` evaluated in turn (teacher-forced). */
function forcedRun(engine: Engine, prompt: number[], tokens: readonly number[]): GreedyRun {
  engine.reset();
  const promptLogits = engine.evaluate(prompt).slice();
  const stepLogits = tokens.map((t) => engine.evaluate([t]).slice());
  return { tokens: [...tokens], promptLogits, stepLogits };
}

/**
 * The GPU run on the CPU's tokens with the CPU's experts and weights (pinned), and how the GPU's
 * own choice compared with the CPU's: tokens whose expert sets differ, by whether the CPU's k-th
 * gap was a near-tie (then only the k-th expert may differ).
 */
function pinnedRun(gpu: Engine, prompt: number[], want: GreedyRun, routes: readonly LayerRoute[]) {
  let layer = 0, choices = 0, nearTieSwaps = 0, weightErr = 0;
  const wrong: string[] = [];
  experts(gpu).pinRoute = (chosen, rows, k) => {
    const r = routes[layer];
    if (!r || r.gaps.length !== rows) {
      throw new Error(`MoE layer call ${layer}: ${rows} tokens, the CPU's had ${r?.gaps.length}`);
    }
    for (let t = 0; t < rows; t++) {
      const cpu = new Map<number, number>();
      for (let j = t * k; j < (t + 1) * k; j++) cpu.set(r.ids[j], r.weights[j]);
      let shared = 0, diff = 0, largest = 0;
      for (let j = t * k; j < (t + 1) * k; j++) {
        const w = cpu.get(chosen.ids[j]);
        largest = Math.max(largest, r.weights[j]);
        if (w === undefined) continue;
        shared++;
        diff = Math.max(diff, Math.abs(chosen.weights[j] - w));
      }
      choices++;
      if (shared === k) weightErr = Math.max(weightErr, diff / largest);
      else if (r.gaps[t] < ROUTER_NEAR_TIE && shared === k - 1) nearTieSwaps++;
      else {
        wrong.push(`layer call ${layer}, token ${t}: ${k - shared} of ${k} differ ` +
          `(CPU gap ${r.gaps[t].toExponential(1)})`);
      }
    }
    layer++;
    return r;
  };
  const run = forcedRun(gpu, prompt, want.tokens);
  experts(gpu).pinRoute = null;
  expect(layer).toBe(routes.length);
  return { run, choices, nearTieSwaps, wrong, weightErr };
}

describe.skipIf(noCuda)("mixtures of experts on CUDA equal the CPU", () => {
  for (const [name, spec] of MODELS) {
    test(name, () => {
      const path = join(dir, `moe-${spec.seed}.gguf`);
      writeFileSync(path, randomQuantGguf(spec));
      const open = (backend: "cpu" | "cuda", graphs = true) => withSettings(
        { INFER_CUDA_GRAPHS: graphs ? "1" : "0" },
        () => Engine.open({ modelPath: path, backend, contextLength: 256, batch: 64 }));
      // 24 tokens: at 8 of 128 experts, more slots than experts (the grouped matvec)
      const p = prompt(24, spec.seed ?? 1);
      const cpu = open("cpu");
      const routes = recordRoutes(cpu, moeShape(spec));
      const want = greedyRun(cpu, p, STEPS);
      cpu.close();
      const gpu = open("cuda");
      const got = greedyRun(gpu, p, STEPS);
      const sampling = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 };
      const deviceGreedy = gpu.generate(p, { maxTokens: STEPS, sampling, ignoreEos: true, reuseCache: false });
      // the grouped matvec and a grid row per slot (no grouping): the same sums, bit for bit
      experts(gpu).groupKernel = "matvec";
      const tiles = greedyRun(gpu, p, 1);
      experts(gpu).groupSlotsPerExpert = Infinity;
      const perSlot = greedyRun(gpu, p, 1);
      gpu.close();
      const eager = open("cuda", false);
      const plain = greedyRun(eager, p, STEPS);
      const pinned = pinnedRun(eager, p, want, routes);
      eager.close();
      const promptErr = normalisedError(pinned.run.promptLogits, want.promptLogits);
      let stepErr = 0;
      for (let i = 0; i < STEPS; i++) {
        stepErr = Math.max(stepErr, normalisedError(pinned.run.stepLogits[i], want.stepLogits[i]));
      }
      const free = compareRuns(got, want);
      console.log(`  ${name}: router: ${pinned.choices - pinned.nearTieSwaps - pinned.wrong.length} of ` +
        `${pinned.choices} tokens' experts the CPU's, ${pinned.nearTieSwaps} the k-th swapped at a near-tie ` +
        `(gap < ${ROUTER_NEAR_TIE}), weights' error ${pinned.weightErr.toExponential(2)}; experts pinned: ` +
        `prompt logits error ${promptErr.toExponential(2)}, worst step ${stepErr.toExponential(2)} ` +
        `(tolerance ${TOL_LOGITS_Q}); free-running: worst step ${free.stepErr.toExponential(2)}, ` +
        `greedy tokens equal ${free.same}/${STEPS}`);
      expect(pinned.wrong).toEqual([]);
      expect(pinned.weightErr).toBeLessThanOrEqual(TOL_LOGITS_Q);
      expect(promptErr).toBeLessThanOrEqual(TOL_LOGITS_Q);
      expect(stepErr).toBeLessThanOrEqual(TOL_LOGITS_Q);
      expect(deviceGreedy.tokens).toEqual(got.tokens);
      expect(normalisedError(perSlot.promptLogits, tiles.promptLogits)).toBe(0);
      expect(normalisedError(tiles.promptLogits, want.promptLogits)).toBeLessThanOrEqual(TOL_LOGITS_Q);
      expect(plain.tokens).toEqual(got.tokens);
      expect(normalisedError(plain.promptLogits, got.promptLogits)).toBe(0);
      for (let i = 0; i < STEPS; i++) expect(normalisedError(plain.stepLogits[i], got.stepLogits[i])).toBe(0);
    });
  }

  test("the K-quants in the GGUF's layout (INFER_CUDA_REPACK=0)", () => {
    const path = join(dir, "moe-k-plain.gguf");
    writeFileSync(path, randomQuantGguf(qwen3moeKQuants));
    const p = prompt(24, 3);
    const run = (backend: "cpu" | "cuda") => withSettings({ INFER_CUDA_REPACK: "0" }, () => {
      const e = Engine.open({ modelPath: path, backend, contextLength: 256, batch: 64 });
      try {
        return greedyRun(e, p, STEPS);
      } finally {
        e.close();
      }
    });
    const want = run("cpu"), got = run("cuda");
    const promptErr = normalisedError(got.promptLogits, want.promptLogits);
    const { stepErr, same } = compareRuns(got, want);
    console.log(`  GGUF layout: prompt logits error ${promptErr.toExponential(2)}, worst step ` +
      `${stepErr.toExponential(2)}; greedy tokens equal ${same}/${STEPS}`);
    expect(promptErr).toBeLessThanOrEqual(TOL_LOGITS_Q);
    expect(stepErr).toBeLessThanOrEqual(TOL_LOGITS_Q);
  });

  for (const [label, spec] of [["qwen3moe", qwen3moeQ4_0], ["gpt-oss", gptossMxfp4]] as const) {
    test(`${label}: a batch of three sequences, each its logits alone, per slot or grouped`, () => {
      batchOfThree(`moe-batch-${label}.gguf`, spec);
    });
  }

  // The grouped tensor-core path on prompts of 1, 7, 64 and 300 tokens (one forward pass each):
  // at 128 experts most get no slot from the short prompts; at 16 experts of 4 chosen, 300
  // tokens give each about 75 slots, several 32-slot tiles and a partial one. Forced grouped
  // (groupSlotsPerExpert 0) so that the 1- and 7-token prompts take it too.
  for (const [name, spec] of MODELS.slice(0, 4)) {
    test(`${name}: the tensor-core expert tiles, prompts of 1 to 300 tokens`, () => {
      const path = join(dir, `moe-mma-${spec.seed}.gguf`);
      writeFileSync(path, randomQuantGguf(spec));
      const open = (backend: "cpu" | "cuda") => Engine.open({ modelPath: path, backend, contextLength: 512,
        batch: 512 });
      const lengths = [1, 7, 64, 300];
      const cpu = open("cpu");
      const want = lengths.map((n) => {
        cpu.reset();
        return cpu.evaluate(prompt(n, 5)).slice();
      });
      cpu.close();
      const gpu = open("cuda");
      const run = (n: number, grouping: number, wide: number) => {
        experts(gpu).groupSlotsPerExpert = grouping;
        experts(gpu).wideTileSlotsPerExpert = wide;
        gpu.reset();
        return gpu.evaluate(prompt(n, 5)).slice();
      };
      const errors: string[] = [];
      for (const [i, n] of lengths.entries()) {
        const auto = run(n, 1, 16), narrow = run(n, 0, Infinity), wide = run(n, 0, 0);
        expect(normalisedError(wide, narrow)).toBe(0);
        const err = Math.max(normalisedError(auto, want[i]), normalisedError(narrow, want[i]));
        errors.push(`${n}: ${err.toExponential(2)}`);
        expect(err).toBeLessThanOrEqual(TOL_LOGITS_Q);
      }
      gpu.close();
      console.log(`  ${name}, tensor-core tiles: prompt logits error by length ${errors.join(", ")}`);
    });
  }

  function batchOfThree(name: string, spec: RandomQuantSpec): void {
    const path = join(dir, name);
    writeFileSync(path, randomQuantGguf(spec));
    const open = (backend: "cpu" | "cuda") => Engine.open({ modelPath: path, contextLength: 256, batch: 64,
      backend });
    const cpu = open("cpu"), gpu = open("cuda");
    const vocab = cpu.model.info.vocabSize;
    const prompts = [prompt(3, 1), prompt(5, 2), prompt(9, 3)], next = [33, 44, 55];
    // the CPU: each sequence alone
    const wantPrompt: Float32Array[] = [], wantStep: Float32Array[] = [];
    for (const q of prompts) {
      const cache = createKvCache(cpu.backend, cpu.model.info, 256, "f16", cpu.model.maxBatch);
      wantPrompt.push(cpu.model.forward(q, q.length, 0, cache.layers).slice());
      wantStep.push(cpu.model.forward([next[wantStep.length]], 1, q.length, cache.layers).slice());
    }
    const batched = (grouping: number, kernel: "mma" | "matvec" = "mma") => {
      experts(gpu).groupSlotsPerExpert = grouping;
      experts(gpu).groupKernel = kernel;
      const caches = prompts.map(() => createKvCache(gpu.backend, gpu.model.info, 256, "f16", gpu.model.maxBatch));
      const rows: Float32Array[] = [];
      const segments: SequenceRows[] = prompts.map((q, i) => ({ rows: q.length, position: 0,
        cache: caches[i].layers }));
      const total = prompts.reduce((n, q) => n + q.length, 0);
      const all = new Float32Array(total * vocab);
      gpu.model.forwardBatch({ tokens: prompts.flat(), segments, logitRows: total },
        (first, rows, logits) => all.set(logits.subarray(0, rows * vocab), first * vocab));
      let at = 0;
      for (const q of prompts) {
        at += q.length;
        rows.push(all.slice((at - 1) * vocab, at * vocab));
      }
      const decode: SequenceRows[] = prompts.map((q, i) => ({ rows: 1, position: q.length,
        cache: caches[i].layers }));
      // three times: run while recorded, captured into a graph, replayed (the same cells rewritten
      // with the same keys and values each time)
      const steps: Float32Array[] = [];
      for (let i = 0; i < 3; i++) {
        gpu.model.forwardBatch({ tokens: next, segments: decode, logitRows: 3 },
          (_first, _rows, logits) => { steps.push(logits.slice()); });
      }
      for (const s of steps) expect(normalisedError(s, steps[0])).toBe(0);
      const step = steps[0];
      return { prompt: rows, step };
    };
    const auto = batched(Infinity), grouped = batched(0, "matvec"), mma = batched(0, "mma");
    let promptErr = 0, stepErr = 0;
    for (let i = 0; i < prompts.length; i++) {
      const row = (x: Float32Array) => x.subarray(i * vocab, (i + 1) * vocab);
      for (const r of [auto, mma]) {
        promptErr = Math.max(promptErr, normalisedError(r.prompt[i], wantPrompt[i]));
        stepErr = Math.max(stepErr, normalisedError(row(r.step), wantStep[i]));
      }
      expect(normalisedError(grouped.prompt[i], auto.prompt[i])).toBe(0);
    }
    expect(normalisedError(grouped.step, auto.step)).toBe(0);
    console.log(`  batch of 3 (per slot and tensor-core tiles): prompt logits error ${promptErr.toExponential(2)}, decode step ` +
      `${stepErr.toExponential(2)} (tolerance ${TOL_LOGITS_Q})`);
    expect(promptErr).toBeLessThanOrEqual(TOL_LOGITS_Q);
    expect(stepErr).toBeLessThanOrEqual(TOL_LOGITS_Q);
    cpu.close();
    gpu.close();
  }
});

