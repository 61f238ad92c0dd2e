// Method: the Metal backend (ts/backend/metal.ts, the plan and the kernels) on the emulated device
// against the CPU backend, through the Backend interface the model graph uses, with the weights of
// small random GGUFs in every weight type (wrapped, not copied). One attention block is run as a
// prompt of 5 tokens, then 3 single-token steps, each step's outputs read back and compared by
// normalised error. setTokens/setPositions between steps with work still queued must see the
// queued work run first, as on a Mac where a step is one command buffer. Also: on Linux,
// `--backend metal` fails with one clear line and `auto` does not pick Metal. A split model wraps
// each part as its own buffer and gives the whole file's results.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Backend } from "../ts/backend/backend.ts";
import { CpuBackend } from "../ts/backend/cpu.ts";
import { MetalBackend } from "../ts/backend/metal.ts";
import type { MetalBuffer } from "../ts/backend/metal-device.ts";
import { BarrierPlanner } from "../ts/backend/metal-hazards.ts";
import { planMatmul, planRope } from "../ts/backend/metal-plan.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import { chooseBackend, createBackend, isAppleSilicon, type BackendOpeners } from "../ts/backend/select.ts";
import { InferError } from "../ts/errors.ts";
import { openGguf, type GgufFile } from "../ts/gguf/reader.ts";
import { splitGguf } from "./support/split-gguf.ts";
import { llamaFloat, qwen3KQuants, gemmaMixed, llamaQ4_0, randomQuantGguf } from "./support/random-quant-gguf.ts";
import { EmulatedMetalDevice } from "./support/metal-emu.ts";
import { normalisedError } from "./support/numeric.ts";

// Whole blocks differ by the CPU's roundings that follow ggml and the GPU kernels do not: the CPU
// quantizes activations to Q8_0/Q8_K for quantized weights (measured up to ~1e-2 of the largest
// output here), rounds them to f16/bf16 for F16/BF16 weights, and rounds the query and the
// probabilities to f16 in attention over the f16 cache (~7e-4); the GPU keeps f32 throughout.
const TOL_BLOCK_Q = 3e-2;
const TOL_BLOCK_F = 3e-3;

const dir = mkdtempSync(join(tmpdir(), "infer-metal-backend-"));
const files: GgufFile[] = [];
afterAll(() => {
  for (const f of files) f.close();
  rmSync(dir, { recursive: true, force: true });
});

/** Embeds, norms, projects q/k/v, RoPE, stores K/V, attends and adds the output projection. */
function attentionBlock(be: Backend, file: GgufFile, spec: typeof gemmaMixed) {
  const t = (name: string) => be.weight(file, file.tensors.get(name)!);
  const e = spec.embedding, q = spec.heads * spec.headDim, kv = spec.kvHeads * spec.headDim, rows = 8;
  const act = (name: string, cols: number) => be.activation(name, rows, cols);
  const s = {
    ids: act("ids", 1), pos: be.positions(rows), x: act("x", e), h: act("h", e), q: act("q", q), k: act("k", kv),
    v: act("v", kv), att: act("att", q), o: act("o", e),
    layer: be.kvLayer(64, spec.kvHeads, spec.headDim, "f16", false),
    ring: be.kvLayer(16, spec.kvHeads, spec.headDim, "f16", true),
  };
  const w = {
    embed: t("token_embd.weight"), norm: t("blk.0.attn_norm.weight"), wq: t("blk.0.attn_q.weight"),
    wk: t("blk.0.attn_k.weight"), wv: t("blk.0.attn_v.weight"), wo: t("blk.0.attn_output.weight"),
  };
  return (tokens: number[], position: number): Float32Array[] => {
    const n = tokens.length;
    be.setTokens(s.ids, tokens, n);
    be.setPositions(s.pos, position, n);
    be.embed(w.embed, s.ids, n, s.x);
    be.rmsNorm(s.x, w.norm, n, 1e-6, s.h);
    be.matmul(w.wq, s.h, n, s.q);
    be.matmul(w.wk, s.h, n, s.k);
    be.matmul(w.wv, s.h, n, s.v);
    const rope = { heads: spec.heads, headDim: spec.headDim, rotaryDims: spec.headDim, base: 10000, scale: 1, neox: true };
    be.rope(s.q, s.pos, n, rope);
    be.rope(s.k, s.pos, n, { ...rope, heads: spec.kvHeads });
    be.storeKv(s.layer, s.k, s.v, n, position);
    be.storeKv(s.ring, s.k, s.v, n, position);
    const opts = { heads: spec.heads, kvHeads: spec.kvHeads, headDim: spec.headDim, window: 0, scale: 1 / Math.sqrt(spec.headDim) };
    be.attention(s.q, s.layer, n, position, opts, s.att);
    const full = be.read(s.att, n).slice();
    be.attention(s.q, s.ring, n, position, { ...opts, window: 6 }, s.att);
    be.matmul(w.wo, s.att, n, s.o);
    be.add(s.o, s.x, n, s.o);
    const out = be.read(s.o, n).slice();
    // A matmul of the last row only (firstRow), and an embed still queued when setTokens
    // overwrites the ids it reads: it must see the old ones.
    be.matmul(w.wq, s.h, 1, s.q, n - 1);
    const last = be.read(s.q, 1).slice();
    be.embed(w.embed, s.ids, n, s.x);
    be.setTokens(s.ids, tokens.map(() => 0), n);
    const embedded = be.read(s.x, n).slice();
    be.setTokens(s.ids, tokens, n);
    return [full, out, last, embedded];
  };
}

describe("the Metal backend on the emulated device equals the CPU backend", () => {
  for (const [name, spec, tol] of [["Q8_0/Q5_0/Q4_K", gemmaMixed, TOL_BLOCK_Q], ["Q4_0", llamaQ4_0, TOL_BLOCK_Q],
    ["Q4_K/Q5_K", qwen3KQuants, TOL_BLOCK_Q], ["F16/BF16", llamaFloat, TOL_BLOCK_F]] as const) {
    test(`attention block, prompt then single tokens: ${name}`, () => {
      const path = join(dir, `${spec.arch}-${spec.seed}.gguf`);
      writeFileSync(path, randomQuantGguf({ ...spec, layers: 1 }));
      const file = openGguf(path);
      files.push(file);
      const cpu = new CpuBackend();
      const device = new EmulatedMetalDevice({ seed: spec.seed });
      const metal = new MetalBackend(device);
      try {
        const runCpu = attentionBlock(cpu, file, spec), runMetal = attentionBlock(metal, file, spec);
        let position = 0, worst = 0;
        for (const tokens of [[2, 17, 270, 5, 41], [7], [260], [33]]) {
          const want = runCpu(tokens, position), got = runMetal(tokens, position);
          want.forEach((w, i) => {
            const err = normalisedError(got[i], w);
            worst = Math.max(worst, err);
            expect(err).toBeLessThanOrEqual(tol);
          });
          position += tokens.length;
        }
        console.log(`  ${name}: worst normalised error ${worst.toExponential(2)}`);
      } finally {
        metal.dispose();
        device.dispose();
      }
    }, 60_000);
  }
});

test("decode attention through the split kernels and their combine equals the CPU under every seed", () => {
  // The cost model keeps these short contexts on attention.metal; forced splits run
  // attention_decode.metal and attention_decode_combine, whose partials the barriers must order.
  for (const [spec, splits] of [[gemmaMixed, 3], [llamaQ4_0, 2], [qwen3KQuants, 4], [llamaFloat, 5]] as const) {
    const path = join(dir, `splits-${spec.arch}-${spec.seed}.gguf`);
    writeFileSync(path, randomQuantGguf({ ...spec, layers: 1 }));
    const file = openGguf(path);
    files.push(file);
    for (const seed of [1, 2]) {
      const device = new EmulatedMetalDevice({ seed });
      const metal = new MetalBackend(device, { decodeSplits: splits });
      try {
        const runCpu = attentionBlock(new CpuBackend(), file, spec), runMetal = attentionBlock(metal, file, spec);
        let position = 0;
        for (const tokens of [[2, 17, 270, 5, 41], [7], [260]]) {
          const want = runCpu(tokens, position), got = runMetal(tokens, position);
          const tol = spec === llamaFloat ? TOL_BLOCK_F : TOL_BLOCK_Q;
          want.forEach((w, i) => expect(normalisedError(got[i], w)).toBeLessThanOrEqual(tol));
          position += tokens.length;
        }
      } finally {
        metal.dispose();
        device.dispose();
      }
    }
  }
}, 60_000);

describe("the concurrent encoder's barriers (metal-hazards.ts)", () => {
  // The emulated device runs each section's dispatches in a seeded random order: with the
  // planner's barriers the block equals the CPU under every seed; with barriers ignored it does
  // not under some seed, so a barrier the planner failed to ask for would show.
  const spec = gemmaMixed;
  const run = (barriers: boolean, seed: number) => {
    const path = join(dir, `barriers-${spec.arch}-${spec.seed}.gguf`);
    writeFileSync(path, randomQuantGguf({ ...spec, layers: 1 }));
    const file = openGguf(path);
    files.push(file);
    const cpu = new CpuBackend();
    const device = new EmulatedMetalDevice({ seed, barriers });
    const metal = new MetalBackend(device);
    try {
      const runCpu = attentionBlock(cpu, file, spec), runMetal = attentionBlock(metal, file, spec);
      let position = 0, worst = 0;
      for (const tokens of [[2, 17, 270, 5, 41], [7]]) {
        const want = runCpu(tokens, position), got = runMetal(tokens, position);
        want.forEach((w, i) => { worst = Math.max(worst, normalisedError(got[i], w)); });
        position += tokens.length;
      }
      return { worst, barriers: metal.barriers.barriers, dispatches: metal.barriers.dispatches };
    } finally {
      metal.dispose();
      device.dispose();
    }
  };

  test("with the planned barriers every seed equals the CPU, in fewer sections than dispatches", () => {
    for (let seed = 1; seed <= 6; seed++) {
      const r = run(true, seed);
      expect(r.worst).toBeLessThanOrEqual(TOL_BLOCK_Q);
      expect(r.barriers).toBeGreaterThan(0);
      expect(r.barriers).toBeLessThan(r.dispatches);
    }
  }, 60_000);

  test("with barriers ignored some seed gets a wrong block", () => {
    let wrong = 0;
    for (let seed = 1; seed <= 6; seed++) if (!(run(false, seed).worst <= TOL_BLOCK_Q)) wrong++;
    expect(wrong).toBeGreaterThan(0);
  }, 60_000);

  test("independent dispatches share a section; a reader of a write waits", () => {
    const planner = new BarrierPlanner();
    const buf = (bytes: number): MetalBuffer => ({ bytes, view: new Uint8Array(0) });
    const h = buf(64), wq = buf(64), wk = buf(64), q = buf(64), k = buf(64), pos = buf(64);
    const at = (buffer: MetalBuffer) => ({ buffer, offset: 0 });
    const mm = planMatmul(GgmlType.Q8_0, 32, 2, 1);
    const rope = planRope({ nTok: 1, heads: 1, headDim: 2, rotaryDims: 2, base: 1e4, scale: 1, neox: false,
      freqFactors: false });
    expect(planner.needsBarrier(mm, { w: at(wq), x: at(h), y: at(q) })).toBe(false);
    expect(planner.needsBarrier(mm, { w: at(wk), x: at(h), y: at(k) })).toBe(false); // reads h too
    expect(planner.needsBarrier(rope, { x: at(q), positions: at(pos), freq_factors: at(pos) })).toBe(true);
    // k was written before that barrier: the K RoPE joins the Q RoPE's section
    expect(planner.needsBarrier(rope, { x: at(k), positions: at(pos), freq_factors: at(pos) })).toBe(false);
    expect(planner.needsBarrier(mm, { w: at(wq), x: at(k), y: at(h) })).toBe(true); // k written just now
    planner.reset();
    expect(planner.needsBarrier(mm, { w: at(wq), x: at(h), y: at(q) })).toBe(false);
  });
});

test("a split model: each part wrapped as its own buffer, the same results as the whole file", () => {
  const spec = gemmaMixed;
  const path = join(dir, "split-whole.gguf");
  writeFileSync(path, randomQuantGguf({ ...spec, layers: 1 }));
  const whole = openGguf(path), split = openGguf(splitGguf(path, join(dir, "split"), 3)[0]);
  files.push(whole, split);
  expect(split.parts.length).toBe(3);
  const cpu = new CpuBackend();
  const device = new EmulatedMetalDevice({ seed: spec.seed });
  const metal = new MetalBackend(device);
  try {
    const runCpu = attentionBlock(cpu, whole, spec), runMetal = attentionBlock(metal, split, spec);
    let position = 0;
    for (const tokens of [[2, 17, 270, 5, 41], [7]]) {
      const want = runCpu(tokens, position), got = runMetal(tokens, position);
      want.forEach((w, i) => expect(normalisedError(got[i], w)).toBeLessThanOrEqual(TOL_BLOCK_Q));
      position += tokens.length;
    }
  } finally {
    metal.dispose();
    device.dispose();
  }
}, 60_000);

test("a model over maxBufferLength: weights bound through overlapping views equal the CPU", () => {
  const spec = gemmaMixed;
  const path = join(dir, `views-${spec.arch}-${spec.seed}.gguf`);
  writeFileSync(path, randomQuantGguf({ ...spec, layers: 1 }));
  const file = openGguf(path);
  files.push(file);
  let largest = 0;
  for (const t of file.tensors.values()) largest = Math.max(largest, t.byteLength);
  // Room for the largest tensor plus two 16 KiB steps: the file takes several views.
  const maxBufferLength = Math.ceil(largest / 16384) * 16384 + 2 * 16384;
  expect(file.parts[0].length).toBeGreaterThan(2 * maxBufferLength);
  const cpu = new CpuBackend();
  const device = new EmulatedMetalDevice({ seed: 7, maxBufferLength });
  const metal = new MetalBackend(device);
  try {
    const runCpu = attentionBlock(cpu, file, spec), runMetal = attentionBlock(metal, file, spec);
    expect(device.wrapped.length).toBeGreaterThan(2);
    for (const v of device.wrapped) {
      expect(v.bytes).toBeLessThanOrEqual(maxBufferLength);
      expect((v.address - file.parts[0].baseAddress) % 16384).toBe(0);
    }
    let position = 0;
    for (const tokens of [[2, 17, 270], [7]]) {
      const want = runCpu(tokens, position), got = runMetal(tokens, position);
      want.forEach((w, i) => expect(normalisedError(got[i], w)).toBeLessThanOrEqual(TOL_BLOCK_Q));
      position += tokens.length;
    }
  } finally {
    metal.dispose();
    device.dispose();
  }
}, 60_000);

test("on Linux, --backend metal fails with one clear line and auto does not pick Metal", () => {
  if (isAppleSilicon()) return;
  let error: unknown;
  try {
    createBackend("metal");
  } catch (err) {
    error = err;
  }
  expect(error).toBeInstanceOf(InferError);
  expect((error as InferError).code).toBe("unsupported");
  expect((error as Error).message).toMatch(/^Metal not available: .+/);
  expect((error as Error).message).not.toContain("\n");
  const auto = createBackend("auto");
  expect(auto.name).not.toBe("metal");
  auto.dispose?.();
});


describe("auto on Apple silicon falls back to the CPU when Metal fails to start", () => {
  const cudaUnused = () => { throw new Error("auto must not try CUDA on Apple silicon"); };
  const openers = (metal: () => Backend, lines: string[]): BackendOpeners =>
    ({ metal, cuda: cudaUnused, appleSilicon: true, warn: (line) => lines.push(line) });

  test("a kernel the compiler rejects: the CPU, and one line on stderr saying why", () => {
    const lines: string[] = [];
    const failing = () => {
      throw new InferError("internal", "Metal: compiling the kernels failed: program_source:12:5: error: bad\nnote: more");
    };
    const { backend, why } = chooseBackend("auto", openers(failing, lines));
    expect(backend.name).toBe("cpu");
    expect(lines).toEqual(["infer: the Metal backend failed to start, using the CPU: " +
      "Metal: compiling the kernels failed: program_source:12:5: error: bad"]);
    expect(why).toContain("Metal failed to start (Metal: compiling the kernels failed");
    backend.dispose?.();
  });

  test("a missing shader directory (not an InferError) also falls back", () => {
    const lines: string[] = [];
    const { backend } = chooseBackend("auto", openers(() => { throw new Error("ENOENT: no such file, scandir 'x'"); }, lines));
    expect(backend.name).toBe("cpu");
    expect(lines.length).toBe(1);
    backend.dispose?.();
  });

  test("no Metal device: the CPU quietly, the reason kept for -v", () => {
    const lines: string[] = [];
    const absent = () => { throw new InferError("unsupported", "Metal not available: no Metal device"); };
    const { backend, why } = chooseBackend("auto", openers(absent, lines));
    expect(backend.name).toBe("cpu");
    expect(lines).toEqual([]);
    expect(why).toBe("auto: Metal not available: no Metal device");
  });

  test("a working Metal device is taken; --backend metal still fails loudly", () => {
    const device = new EmulatedMetalDevice();
    try {
      const { backend, why } = chooseBackend("auto", openers(() => new MetalBackend(device), []));
      expect(backend.name).toBe("metal");
      expect(why).toBe("auto: metal");
      backend.dispose?.();
      const failing = () => { throw new InferError("internal", "Metal: pipeline rope: bad"); };
      expect(() => chooseBackend("metal", openers(failing, []))).toThrow("Metal: pipeline rope: bad");
    } finally {
      device.dispose();
    }
  });
});
