// Method: the Metal dispatch plan (ts/backend/metal-plan.ts) checked against what the kernels
// declare, parsed from shaders/metal: for every op, weight type and a spread of shapes, the kernel
// exists, each planned buffer name sits at the [[buffer(n)]] the kernel gives that parameter (and
// every buffer parameter is bound), the constant arguments are the kernel's struct at its index
// with args.h's fields in order, threadgroup memory is planned exactly when the kernel takes it
// and is large enough, simdgroup kernels get whole simdgroups, and no kernel is left unplanned.
import { describe, expect, test } from "bun:test";
import { ggmlTypes } from "../ts/gguf/types.ts";
import {
  argStructs, ATTENTION_HEAD_DIM_MAX, ATTENTION_PROMPT_HEAD_DIM_MAX, ATTENTION_PROMPT_QUERIES,
  ATTENTION_PROMPT_THREADS, ATTENTION_PROMPT_TOKENS_MIN, MATMUL_THREADS, MATMUL_TILE_OUT, MATMUL_TILE_TOK, matvecRows,
  metalWeightTypes, planAdd, planAddRowBias,
  planAttention, planGatedAct, planGetRows, planKvStore, planMatmul, planRmsNorm, planRmsNormAdd,
  planNormRopeStore, planRope, planScale, type AttentionPlanOptions, type KernelDispatch,
} from "../ts/backend/metal-plan.ts";
import {
  ATTENTION_DECODE_SPLITS_MAX, ATTENTION_DECODE_TOKENS_MAX, attentionDecodeVariants, baseAppleGpu,
  planAttentionDecode, planAttentionSingle, planAttentionStep,
} from "../ts/backend/metal-decode-plan.ts";
import {
  assembleMetalSource, metalArgDefines, metalArgStructs, metalKernels, parseKernels,
} from "../ts/backend/metal-shaders.ts";

const kernels = metalKernels();
const simdBuiltins = ["thread_index_in_simdgroup", "simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup"];

function argsOf(d: KernelDispatch): Record<string, number> {
  const view = new DataView(d.args.bytes.buffer, d.args.bytes.byteOffset, d.args.bytes.byteLength);
  return Object.fromEntries(argStructs[d.args.struct].map(([name, type], i) =>
    [name, type === "f32" ? view.getFloat32(i * 4, true) : view.getUint32(i * 4, true)]));
}

function checkAgainstSignature(d: KernelDispatch): void {
  const k = kernels.get(d.kernel);
  expect(k, `kernel ${d.kernel}`).toBeDefined();
  const buffers = k!.params.filter((p) => p.buffer !== null && p.pointer);
  expect(Object.fromEntries(buffers.map((p) => [p.name, p.buffer]))).toEqual({ ...d.buffers });
  for (const p of buffers) expect(p.space).toBe("device");
  // The barrier planner trusts `writes`: it must name exactly the buffers the kernel may write.
  expect([...d.writes].sort()).toEqual(buffers.filter((p) => !p.isConst).map((p) => p.name).sort());
  const constants = k!.params.filter((p) => p.buffer !== null && p.reference);
  expect(constants.length).toBe(1);
  expect(constants[0].space).toBe("constant");
  expect(constants[0].type).toBe(d.args.struct);
  expect(constants[0].buffer).toBe(d.args.index);
  expect(d.args.bytes.length).toBe(argStructs[d.args.struct].length * 4);
  const takesThreadgroupMemory = k!.params.some((p) => p.threadgroup !== null);
  expect(d.threadgroupBytes > 0).toBe(takesThreadgroupMemory);
  const threads = d.threads[0] * d.threads[1] * d.threads[2];
  expect(threads).toBeGreaterThan(0);
  expect(threads).toBeLessThanOrEqual(1024);
  if (k!.params.some((p) => p.builtin && simdBuiltins.includes(p.builtin))) expect(threads % 32).toBe(0);
  for (const g of d.grid) expect(Number.isInteger(g) && g >= 1).toBe(true);
  const unknown = k!.params.filter((p) => p.builtin === null && p.buffer === null && p.threadgroup === null);
  expect(unknown).toEqual([]);
}

/** Every plan the backend can make, over a spread of shapes. */
function allPlans(): KernelDispatch[] {
  const plans: KernelDispatch[] = [];
  for (const name of Object.keys(metalWeightTypes)) {
    const t = [...ggmlTypes.values()].find((x) => x.name === name)!;
    const nIn = t.blockValues === 1 ? 33 : t.blockValues * 3;
    for (const nTok of [1, 4, 5, 300]) plans.push(planMatmul(t.id, nIn, 67, nTok));
    plans.push(planGetRows(t.id, nIn, 10, 3));
  }
  for (const cols of [1, 64, 640, 5000]) {
    plans.push(planRmsNorm(3, cols, 1e-6, true), planRmsNorm(3, cols, 1e-6, false), planRmsNormAdd(3, cols, 1e-6));
  }
  for (const neox of [false, true]) {
    plans.push(planRope({ nTok: 5, heads: 4, headDim: 256, rotaryDims: 128, base: 1e6, scale: 1, neox, freqFactors: !neox }));
  }
  plans.push(planGatedAct("gelu", 1000), planGatedAct("silu", 7), planAdd(33), planScale(5, 2), planAddRowBias(3, 17));
  plans.push(planKvStore(256, 4, 10, 768, true), planKvStore(7, 1, 0, 16, false));
  for (const headDim of [32, 40, 256, ATTENTION_HEAD_DIM_MAX]) {
    for (const nTok of [3, ATTENTION_PROMPT_TOKENS_MIN, 70]) {
      plans.push(planAttention({ nTok, heads: 8, kvHeads: 2, headDim, pos0: 9, window: 4, cells: 96, ring: true, scale: 0.1 }));
    }
  }
  for (const headDim of [33, 64, 80, 128, 256, 300, ATTENTION_HEAD_DIM_MAX]) {
    for (const splits of [1, 5, ATTENTION_DECODE_SPLITS_MAX]) {
      const o = { nTok: 2, heads: 16, kvHeads: 2, headDim, pos0: 90, window: 0, cells: 96, ring: false, scale: 0.1 };
      plans.push(...planAttentionDecode(o, splits).dispatches);
    }
  }
  for (const norm of [true, false]) {
    plans.push(planNormRopeStore({ nTok: 3, headsQ: 8, headsK: 2, headDim: 256, norm, eps: 1e-6, rotaryDims: 128,
      base: 1e6, scale: 1, neox: norm, freqFactors: !norm, qScale: 0.0625, pos0: 5, cells: 16, ring: norm }));
  }
  return plans;
}

describe("the Metal dispatch plan matches the kernels' declarations", () => {
  test("argument structs: the plan packs args.h's fields, in order, with their types", () => {
    const parsed = metalArgStructs();
    const fieldType: Record<string, string> = { uint32_t: "u32", int32_t: "i32", float: "f32" };
    expect([...parsed.keys()].sort()).toEqual(Object.keys(argStructs).sort());
    for (const [name, fields] of parsed) {
      expect(fields.map((f) => [f.name, fieldType[f.type] ?? f.type])).toEqual(argStructs[name].map(([n, t]) => [n, t]));
    }
    const defines = metalArgDefines();
    expect(defines.get("MATMUL_TILE_OUT")).toBe(MATMUL_TILE_OUT);
    expect(defines.get("MATMUL_TILE_TOK")).toBe(MATMUL_TILE_TOK);
    expect(defines.get("MATMUL_THREADS")).toBe(MATMUL_THREADS);
    expect(defines.get("ATTENTION_PROMPT_QUERIES")).toBe(ATTENTION_PROMPT_QUERIES);
    expect(defines.get("ATTENTION_PROMPT_THREADS")).toBe(ATTENTION_PROMPT_THREADS);
    expect(defines.get("ATTENTION_PROMPT_HEAD_DIM_MAX")).toBe(ATTENTION_PROMPT_HEAD_DIM_MAX);
    expect(defines.get("ATTENTION_HEAD_DIM_MAX")).toBe(ATTENTION_HEAD_DIM_MAX);
    for (const { headDim, groupMax } of attentionDecodeVariants) {
      expect(defines.get(`ATTENTION_DECODE_GROUP_D${headDim}`)).toBe(groupMax);
    }
    expect(attentionDecodeVariants.at(-1)!.headDim).toBe(ATTENTION_HEAD_DIM_MAX);
    for (const [suffix, { rows }] of Object.entries(matvecRows)) {
      expect(defines.get(`MATVEC_ROWS_${suffix.toUpperCase()}`)).toBe(rows);
    }
  });

  test("every plan binds each buffer at the index its kernel declares", () => {
    for (const d of allPlans()) checkAgainstSignature(d);
  });

  test("planned threadgroup memory and per-thread work fit what the kernels assume", () => {
    for (const d of allPlans()) {
      const a = argsOf(d), threads = d.threads[0] * d.threads[1] * d.threads[2];
      if (d.kernel.startsWith("matmul_")) {
        // Weight and activation tiles of 32 values a row; the edge-tile staging (4 simdgroups ×
        // 16 tokens × 32 rows) reuses the weight tile.
        expect(d.threadgroupBytes).toBe((MATMUL_TILE_OUT + MATMUL_TILE_TOK) * 32 * 4);
        expect(4 * 16 * 32).toBeLessThanOrEqual(MATMUL_TILE_OUT * 32);
        expect(threads).toBe(MATMUL_THREADS);
        expect(d.grid[0]).toBe(Math.ceil(a.n_out / MATMUL_TILE_OUT));
        expect(d.grid[1]).toBe(Math.ceil(a.n_tok / MATMUL_TILE_TOK));
      }
      if (d.kernel.startsWith("matvec_")) {
        const rows = matvecRows[d.kernel.slice("matvec_".length)]?.rows ?? 1;
        expect(d.grid[0] * (threads / 32) * rows).toBeGreaterThanOrEqual(a.n_out);
        expect(d.grid[0] * (threads / 32) * rows).toBeLessThan(a.n_out + rows * (threads / 32));
        expect(d.grid[1]).toBe(a.n_tok);
      }
      if (d.kernel.startsWith("rms_norm")) expect(d.threadgroupBytes).toBeGreaterThanOrEqual((threads / 32) * 4);
      if (d.kernel.startsWith("attention_prompt_")) {
        const dp = Math.ceil(a.head_dim / 8) * 8;
        expect(dp).toBeLessThanOrEqual(Number(d.kernel.slice("attention_prompt_d".length)));
        expect(d.threadgroupBytes).toBe((threads / 32) * 192 * 4 + 2 * 16 * dp * 2);
        expect(threads).toBe(ATTENTION_PROMPT_THREADS);
        expect(d.grid).toEqual([a.n_head, Math.ceil(a.n_tok / ATTENTION_PROMPT_QUERIES), 1]);
        expect(a.n_tok).toBeGreaterThanOrEqual(ATTENTION_PROMPT_TOKENS_MIN);
      }
      if (d.kernel.startsWith("attention_decode_d")) {
        const dims = Number(d.kernel.slice("attention_decode_d".length));
        const variant = attentionDecodeVariants.find((v) => v.headDim === dims)!;
        expect(a.head_dim).toBeLessThanOrEqual(dims);
        expect(a.group).toBeLessThanOrEqual(variant.groupMax);
        expect((a.n_head / a.n_kv_head) % a.group).toBe(0);
        expect(d.grid).toEqual([a.n_head / a.group, a.n_split, a.n_tok]);
        expect(d.threadgroupBytes).toBeGreaterThanOrEqual((threads / 32) * a.group * (a.head_dim + 2) * 4);
        expect(d.threadgroupBytes).toBeLessThanOrEqual(32768);
      }
      if (d.kernel === "norm_rope_store") {
        // as many threads per head as planRmsNorm gives a row of head_dim, so the sums match it
        expect(d.threads).toEqual(planRmsNorm(1, a.head_dim, 1e-6, true).threads);
        expect(d.threadgroupBytes).toBeGreaterThanOrEqual((threads / 32) * 4);
        expect(d.grid).toEqual([a.heads_q + a.heads_k, a.n_tok, 1]);
      }
      if (d.kernel === "attention") {
        expect(d.threadgroupBytes).toBeGreaterThanOrEqual((threads / 32) * (a.head_dim + 2) * 4);
        expect(a.head_dim).toBeLessThanOrEqual(ATTENTION_HEAD_DIM_MAX);
      }
    }
  });

  test("every kernel in shaders/metal is planned, and every weight type has its three kernels", () => {
    const planned = new Set(allPlans().map((d) => d.kernel));
    expect([...kernels.keys()].filter((k) => !planned.has(k))).toEqual([]);
    for (const suffix of Object.values(metalWeightTypes)) {
      for (const prefix of ["matvec_", "matmul_", "get_rows_"]) expect(kernels.has(prefix + suffix)).toBe(true);
    }
  });

  test("the assembled source (what the library compiles) holds every kernel once, no local #include left", () => {
    const source = assembleMetalSource();
    expect(source).not.toMatch(/^#include "/m);
    expect(parseKernels(source).map((k) => k.name).sort()).toEqual([...kernels.keys()].sort());
    // Threadgroup memory comes only from [[threadgroup(n)]] parameters sized by the plan:
    // a threadgroup array declared inside a kernel would be sized in no plan.
    expect(source).not.toMatch(/^\s+threadgroup\s+\w+\s+\w+\s*\[/m);
  });
});

describe("decode attention: the cost model's choice (metal-decode-plan.ts)", () => {
  const gemma270m = (keys: number): AttentionPlanOptions =>
    ({ nTok: 1, heads: 4, kvHeads: 1, headDim: 256, pos0: keys - 1, window: 0, cells: 4096, ring: false, scale: 0.0625 });

  test("a short context stays on attention.metal; a long one splits until the cores are busy", () => {
    expect(planAttentionStep(gemma270m(8)).dispatches.map((d) => d.kernel)).toEqual(["attention"]);
    const long = planAttentionStep(gemma270m(512));
    expect(long.dispatches.map((d) => d.kernel)).toEqual(["attention_decode_d256", "attention_decode_combine"]);
    expect(long.splits).toBe(baseAppleGpu.cores);
    // 4 query heads share the KV head: K and V are read once, over the cores, not 4 times over 4
    expect(long.costUs).toBeLessThan(planAttentionSingle(gemma270m(512)).costUs / 3);
    expect(long.scratchFloats).toBe(4 * long.splits * (256 + 2));
  });

  test("many query heads per KV head are grouped even unsplit; prompts take attention_prompt.metal", () => {
    const llama8b: AttentionPlanOptions = { nTok: 1, heads: 32, kvHeads: 8, headDim: 128, pos0: 40, window: 0,
      cells: 4096, ring: false, scale: 0.088 };
    const step = planAttentionStep(llama8b);
    expect(step.dispatches.map((d) => d.kernel)).toEqual(["attention_decode_d128"]);
    expect(step.dispatches[0].grid).toEqual([8, 1, 1]);
    expect(ATTENTION_DECODE_TOKENS_MAX + 1).toBe(ATTENTION_PROMPT_TOKENS_MIN);
    const prompt = { ...llama8b, nTok: ATTENTION_PROMPT_TOKENS_MIN };
    expect(planAttentionStep(prompt).dispatches.map((d) => d.kernel)).toEqual(["attention_prompt_d128"]);
    // over attention_prompt.metal's head_dim, a prompt stays on attention.metal
    expect(planAttentionStep({ ...prompt, headDim: 512, scale: 0.04 }).dispatches.map((d) => d.kernel))
      .toEqual(["attention"]);
  });

  test("the choice is never dearer than attention.metal, nor than any split count, by the model", () => {
    for (const keys of [1, 7, 50, 200, 1000, 5000]) {
      for (const [heads, kvHeads, headDim] of [[4, 1, 256], [32, 8, 128], [8, 8, 64], [16, 2, 512]]) {
        const o: AttentionPlanOptions = { nTok: 1, heads, kvHeads, headDim, pos0: keys - 1, window: 0, cells: 8192,
          ring: false, scale: 0.1 };
        const chosen = planAttentionStep(o);
        expect(chosen.costUs).toBeLessThanOrEqual(planAttentionSingle(o).costUs);
        for (const s of [1, 2, 8, 64]) {
          if (s <= keys) expect(chosen.costUs).toBeLessThanOrEqual(planAttentionDecode(o, s).costUs);
        }
      }
    }
  });
});
