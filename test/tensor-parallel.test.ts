// Tensor parallelism's arithmetic on the CPU: a random-weight model run as N CPU ranks, each with
// its slice of the weights cut from the file by the sharding plan, the partial sums added where
// NCCL's all-reduce would add them and the LM head's vocabulary rows gathered, against the same
// model run whole: equal logits (bit for bit at N = 1) and equal greedy tokens at N = 1, 2, 4.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadModel } from "../ts/api/index.ts";
import type { Backend, KvLayer } from "../ts/backend/backend.ts";
import { CpuBackend } from "../ts/backend/cpu.ts";
import { openGguf, type GgufFile } from "../ts/gguf/reader.ts";
import { ncclVersion } from "../ts/native/cuda.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import type { DecoderConfig } from "../ts/model/llama.ts";
import type { Model } from "../ts/model/model.ts";
import { planModel } from "../ts/model/registry.ts";
import {
  copySlice, rankShapes, rankTensor, rankTensors, splitOf,
} from "../ts/model/tensor-parallel.ts";
import { HostCollective, TensorParallelLlama } from "../ts/model/tensor-parallel-llama.ts";
import { randomQuantGguf, type RandomQuantSpec } from "./support/random-quant-gguf.ts";
import { rankGguf } from "./support/rank-gguf.ts";

const dir = mkdtempSync(join(tmpdir(), "infer-tp-"));
const opened: { close(): void }[] = [];
afterAll(() => {
  for (const f of opened) f.close();
  rmSync(dir, { recursive: true, force: true });
});

/** Four KV heads, so 1, 2 and 4 ranks each hold whole ones; Q8_0 columns cut at 32 values. */
const llamaTp: RandomQuantSpec = {
  arch: "llama", layers: 2, embedding: 256, feedForward: 1024, heads: 8, kvHeads: 4, headDim: 64,
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q4_0, attnOut: GgmlType.Q8_0, ffn: GgmlType.Q4_0,
    ffnDown: GgmlType.Q8_0, output: GgmlType.Q6_K },
  seed: 11,
};
/** K-quants cut by columns (Q5_K attention output, Q6_K down: 256-value blocks), QK-norm. */
const qwen3TpK: RandomQuantSpec = {
  arch: "qwen3", layers: 2, embedding: 256, feedForward: 1024, heads: 4, kvHeads: 2, headDim: 128,
  types: { embed: GgmlType.Q8_0, attn: GgmlType.Q4_K, attnOut: GgmlType.Q5_K, ffn: GgmlType.Q4_K,
    ffnDown: GgmlType.Q6_K, output: GgmlType.Q8_0 },
  seed: 13,
};
/** The LM head tied to token_embd: the head is the embedding's vocabulary rows. */
const llamaTied: RandomQuantSpec = { ...llamaTp, types: { ...llamaTp.types, output: undefined }, seed: 17 };

function open(name: string, bytes: Uint8Array): GgufFile {
  const path = join(dir, `${name}.gguf`);
  writeFileSync(path, bytes);
  const file = openGguf(path);
  opened.push(file);
  return file;
}

const MAX_BATCH = 16, CELLS = 64;
const PROMPT = [2, 262, 265, 270, 271, 263, 9, 40];
const GENERATED = 12;

/** The prompt's last logits, then GENERATED greedy tokens with each step's logits. */
function run(model: Model, cache: readonly KvLayer[]): { tokens: number[]; logits: Float32Array[] } {
  const logits: Float32Array[] = [], tokens: number[] = [];
  let last = model.forward(PROMPT, PROMPT.length, 0, cache);
  for (let i = 0; i < GENERATED; i++) {
    logits.push(last.slice());
    let best = 0;
    for (let j = 1; j < last.length; j++) if (last[j] > last[best]) best = j;
    tokens.push(best);
    last = model.forward([best], 1, PROMPT.length + i, cache);
  }
  return { tokens, logits };
}

const backends: Backend[] = [];
afterAll(() => { for (const b of backends) b.dispose?.(); });
function cpu(): Backend {
  const be = new CpuBackend();
  be.setThreads(2);
  backends.push(be);
  return be;
}

function whole(file: GgufFile) {
  const plan = planModel(file), be = cpu();
  const model = plan.build(be, MAX_BATCH);
  const cache = plan.shape.kvShapes.map((s) => be.kvLayer(CELLS, s.kvHeads, s.headDim, "f32", false));
  return { shape: plan.shape as DecoderConfig, ...run(model, cache) };
}

function split(name: string, file: GgufFile, config: DecoderConfig, n: number, contiguousColumns = false) {
  const ranks = rankShapes(config, n).map((shape) => ({ shape, be: cpu(),
    file: open(`${name}-rank${shape.rank}of${n}${contiguousColumns ? "-wrong" : ""}`,
      rankGguf(file, config, shape, contiguousColumns)) }));
  const model = new TensorParallelLlama(config, ranks, new HostCollective(ranks.map((r) => r.be)), MAX_BATCH);
  return run(model, model.cache(CELLS, "f32"));
}

/**
 * The split forward reorders f32 sums only: each W_o and W_down dot product is summed as N
 * partial dots (the same quantized blocks and the same Q8 activation blocks, since every cut
 * falls on a block boundary) and then added. Each reordering moves a sum by a few ulps of its
 * terms' magnitude; through 2 layers and the norms that stays near 1e-6 of the logits' scale.
 * 1e-4 leaves room for NCCL's own (ring) order on GPUs while failing any wrong slice, which
 * moves logits by their own scale.
 */
const RELATIVE_LOGIT_BOUND = 1e-4;

/** The largest logit difference over every step, relative to the largest reference logit. */
function relativeDifference(got: Float32Array[], want: Float32Array[]): { worst: number; scale: number } {
  let worst = 0, scale = 0;
  got.forEach((l, i) => {
    for (let j = 0; j < l.length; j++) {
      worst = Math.max(worst, Math.abs(l[j] - want[i][j]));
      scale = Math.max(scale, Math.abs(want[i][j]));
    }
  });
  return { worst, scale };
}

describe("tensor-parallel forward on CPU ranks equals the whole model", () => {
  for (const [name, spec, counts] of [["llama-q4_0-q8_0", llamaTp, [1, 2, 4]], ["qwen3-k-quants", qwen3TpK, [1, 2]],
    ["llama-tied-head", llamaTied, [2]]] as const) {
    const file = open(name, randomQuantGguf(spec));
    const reference = whole(file);
    for (const n of counts) {
      test(`${name}: ${n} rank${n > 1 ? "s" : ""}, ${GENERATED} greedy tokens and every step's logits`, () => {
        const got = split(name, file, reference.shape, n);
        expect(got.tokens).toEqual(reference.tokens);
        const { worst, scale } = relativeDifference(got.logits, reference.logits);
        console.log(`${name} N=${n}: largest logit difference ${worst.toExponential(2)} ` +
          `(logits up to ${scale.toFixed(2)}), tokens ${got.tokens.join(" ")}`);
        if (n === 1) expect(worst).toBe(0); // the same ops on the same bytes
        else expect(worst / scale).toBeLessThan(RELATIVE_LOGIT_BOUND);
        // A test that cannot fail is no test: greedy tokens must vary for equality to mean much.
        expect(new Set(reference.tokens).size).toBeGreaterThan(name.includes("tied") ? 0 : 2);
      });
    }
  }
});

test("a batch of two sequences on 2 ranks gives each its logits alone on the whole model", () => {
  const file = open("batch-llama", randomQuantGguf(llamaTp)), plan = planModel(file);
  const config = plan.shape as DecoderConfig, be = cpu(), wholeModel = plan.build(be, MAX_BATCH);
  const prompts = [PROMPT, [2, 270, 263, 40, 9]];
  const alone = prompts.map((p) => wholeModel.forward(p, p.length, 0,
    config.kvShapes.map((s) => be.kvLayer(CELLS, s.kvHeads, s.headDim, "f32", false))).slice());
  const ranks = rankShapes(config, 2).map((shape) => ({ shape, be: cpu(),
    file: open(`batch-llama-rank${shape.rank}`, rankGguf(file, config, shape)) }));
  const model = new TensorParallelLlama(config, ranks, new HostCollective(ranks.map((r) => r.be)), MAX_BATCH);
  const caches = prompts.map(() => model.cache(CELLS, "f32"));
  // Each sequence's last row needs logits: the body of the first, then both last rows.
  const body = prompts[0].slice(0, -1), tokens = [...body, ...prompts[1].slice(0, -1),
    prompts[0].at(-1)!, prompts[1].at(-1)!];
  const got: Float32Array[] = [];
  model.forwardBatch({ tokens, logitRows: 2, segments: [
    { rows: body.length, position: 0, cache: caches[0] },
    { rows: prompts[1].length - 1, position: 0, cache: caches[1] },
    { rows: 1, position: body.length, cache: caches[0] },
    { rows: 1, position: prompts[1].length - 1, cache: caches[1] },
  ] }, (_first, rows, logits) => {
    for (let r = 0; r < rows; r++) got.push(logits.slice(r * config.vocab, (r + 1) * config.vocab));
  });
  expect(got).toHaveLength(2);
  const { worst, scale } = relativeDifference(got, alone);
  expect(worst / scale).toBeLessThan(RELATIVE_LOGIT_BOUND);
});

describe("the sharding plan", () => {
  const file = open("plan-llama", randomQuantGguf(llamaTp));
  const config = planModel(file).shape;

  test("a wrong cut (column slices taken as contiguous bytes) is caught by the comparison", () => {
    const reference = whole(file);
    const got = split("plan-llama", file, config as DecoderConfig, 2, true);
    const { worst, scale } = relativeDifference(got.logits, reference.logits);
    expect(worst / scale).toBeGreaterThan(100 * RELATIVE_LOGIT_BOUND);
  });

  test("each split tensor's rank parts cover its bytes exactly once", () => {
    for (const n of [2, 4]) {
      const shapes = rankShapes(config, n);
      for (const t of file.tensors.values()) {
        const s = splitOf(t, config);
        if (s.kind === "replicated") continue;
        const seen = new Uint8Array(t.byteLength);
        for (const r of shapes) {
          const c = rankTensor(t, s, r).copy;
          for (let i = 0; i < c.rows; i++) {
            for (let b = 0; b < c.bytes; b++) seen[c.offset + i * c.pitch + b]++;
          }
        }
        expect(seen.every((v) => v === 1)).toBe(true);
      }
    }
  });

  test("rows are one contiguous range; columns one run per row, a row's bytes apart", () => {
    const [r0, r1] = rankShapes(config, 2);
    const q = file.tensors.get("blk.0.attn_q.weight")!; // Q4_0 [256, 512]: 18-byte blocks, 144 a row
    expect(rankTensor(q, splitOf(q, config), r1)).toMatchObject({ dims: [256, 256],
      copy: { offset: 256 * 144, bytes: 256 * 144, rows: 1 } });
    const o = file.tensors.get("blk.0.attn_output.weight")!; // Q8_0 [512, 256]: 34-byte blocks
    expect(rankTensor(o, splitOf(o, config), r1)).toMatchObject({ dims: [256, 256],
      copy: { offset: 8 * 34, bytes: 8 * 34, pitch: 16 * 34, rows: 256 } });
    const parts = rankTensors(file.tensors, config, r0);
    expect(parts.find((p) => p.name === "output.weight")!.dims).toEqual([256, Math.floor(config.vocab / 2)]);
    const bytes = file.tensorBytes(o), part = copySlice(bytes, rankTensor(o, splitOf(o, config), r0).copy);
    expect(part.subarray(0, 8 * 34)).toEqual(bytes.subarray(0, 8 * 34));
    expect(part.subarray(8 * 34, 16 * 34)).toEqual(bytes.subarray(16 * 34, 24 * 34));
  });

  test("splits the shapes do not allow are refused in one line", () => {
    expect(() => rankShapes(config, 3)).toThrow(/4 KV heads .* do not split evenly 3 ways/);
    expect(() => rankShapes(config, 0)).toThrow(/--gpus must be a whole number of at least 1/);
    const k = open("plan-qwen3-k", randomQuantGguf(qwen3TpK)), kc = planModel(k).shape;
    expect(() => rankShapes(kc, 4)).toThrow(/2 KV heads/);
    // 4 ranks of 8 heads of 64: 128 columns of a Q4_K attention output, half a 256-value block.
    const cut = open("plan-cut", randomQuantGguf({ ...llamaTp, types: { ...llamaTp.types, attnOut: GgmlType.Q4_K } }));
    const cc = planModel(cut).shape;
    expect(() => rankTensors(cut.tensors, cc, rankShapes(cc, 4)[1])).toThrow(
      /'blk\.0\.attn_output\.weight' \(Q4_K, 256-value blocks\) would be cut at column 128 of 512/);
  });
});

describe("--gpus", () => {
  const path = join(dir, "gpus-llama.gguf");
  writeFileSync(path, randomQuantGguf(llamaTp));
  const cli = (...args: string[]) => {
    const p = Bun.spawnSync([process.execPath, "infer.ts", "the cat", "-m", path, "-n", "4", "--temp", "0",
      "-t", "2", ...args], { cwd: join(import.meta.dir, ".."), stdout: "pipe", stderr: "pipe", timeout: 60_000 });
    return { code: p.exitCode, out: p.stdout.toString(), err: p.stderr.toString().trim() };
  };

  test("1 runs the model as without it (one rank: the whole model)", () => {
    const plain = cli("--backend", "cpu"), one = cli("--backend", "cpu", "--gpus", "1");
    expect(one.code).toBe(0);
    expect(one.out).toBe(plain.out);
  });

  test("bad counts and unsplittable or unwired runs are refused in one line", () => {
    const usage = cli("--gpus", "0");
    expect(usage.code).not.toBe(0);
    expect(usage.err).toMatch(/^infer: --gpus must be an integer from 1 to 64, got "0"/);
    const uneven = cli("--backend", "cuda", "--gpus", "3");
    expect(uneven.code).not.toBe(0);
    expect(uneven.err.split("\n")).toHaveLength(1);
    expect(uneven.err).toMatch(/3 GPUs: the model's 4 KV heads .* do not split evenly 3 ways/);
    const cpuRanks = cli("--backend", "cpu", "--gpus", "2");
    expect(cpuRanks.err).toMatch(/--gpus 2 runs on the CUDA backend, not cpu/);
    const two = cli("--backend", "cuda", "--gpus", "2");
    expect(two.code).not.toBe(0);
    expect(two.err.split("\n")).toHaveLength(1);
    expect(two.err).toMatch(/--gpus 2: running one model over several GPUs is not implemented yet/);
  });

  test("the library option is checked the same way", async () => {
    const err = await loadModel(path, { backend: "cuda", gpus: 4 }).then(() => null, (e: unknown) => e);
    expect(err).toMatchObject({ name: "InferError", code: "unsupported" });
    expect(String((err as Error).message)).toMatch(/--gpus 4: running one model over several GPUs is not implemented yet/);
  });
});

test("NCCL loads at run time, or is reported missing in one line", () => {
  let version = 0, error: unknown = null;
  try {
    version = ncclVersion();
  } catch (err) {
    error = err;
  }
  if (error) {
    expect(error).toMatchObject({ code: "unsupported" });
    expect(String((error as Error).message)).toMatch(/^nccl: NCCL not available: cannot load libnccl\.so\.2 [^\n]*$/);
  } else {
    expect(version).toBeGreaterThanOrEqual(20000); // NCCL 2.x
  }
});
