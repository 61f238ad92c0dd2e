// The context shift (StreamingLLM; llama.cpp's context shift): the CPU backend's shiftKv against
// keys rotated straight to their new positions, on full layers and wrapped rings, f32 and q8_0,
// normal and NeoX RoPE with several bases; then the engine generating past a small context of the
// default model, its layer-0 keys and values after the shift equal to a fresh evaluation of the
// kept tokens at their new positions (layer 0's keys depend on the token and position alone).
import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { KvLayer, KvType, RopeOptions } from "../ts/backend/backend.ts";
import { CpuBackend } from "../ts/backend/cpu.ts";
import { loadModel } from "../ts/api/model.ts";
import { Engine } from "../ts/engine/engine.ts";
import { shiftSlot, shiftSlotHeavy, trackAttention } from "../ts/engine/kv-cache.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import { defaultModelPath } from "../ts/models/cache.ts";
import { defaultSampling } from "../ts/sample/sampler.ts";
import { check, native } from "../ts/native/lib.ts";
import { parseRequest } from "../ts/serve/protocol.ts";
import { qwen3moeKQuants, randomQuantGguf } from "./support/random-quant-gguf.ts";

const typeIds: Record<string, number> = { f32: GgmlType.F32, f16: GgmlType.F16, q8_0: GgmlType.Q8_0, tq4: 104 };

/** Rows first .. first + rows - 1 of a CPU layer's keys (or values) as f32. */
function cells(layer: KvLayer, type: KvType, which: "k" | "v", first: number, rows: number): Float32Array {
  const l = layer as unknown as { kBytes: Uint8Array; vBytes: Uint8Array; kRowBytes: number; vRowBytes: number;
    kAnchor?: Float32Array | null };
  const bytes = which === "k" ? l.kBytes : l.vBytes, rowBytes = which === "k" ? l.kRowBytes : l.vRowBytes;
  const n = rows * layer.kvHeads * layer.headDim, out = new Float32Array(n);
  // tq4 keys are coded less the layer's anchor, which kv_load adds back.
  const anchor = which === "k" ? l.kAnchor ?? null : null;
  check(native().infer_kv_load(bytes.subarray(first * rowBytes, (first + rows) * rowBytes), typeIds[type], n,
    layer.headDim, anchor, anchor?.length ?? 0, out), "kv_load");
  return out;
}

function random(n: number, seed: number): Float32Array {
  let s = seed;
  return Float32Array.from({ length: n }, () => {
    s = (s * 1103515245 + 12345) % 2 ** 31;
    return s / 2 ** 30 - 1;
  });
}

describe("shiftKv on the CPU backend", () => {
  const kvHeads = 2, headDim = 64, kvDim = kvHeads * headDim;
  const ropes: RopeOptions[] = [
    { heads: kvHeads, headDim, rotaryDims: headDim, base: 10_000, scale: 1, neox: false },
    { heads: kvHeads, headDim, rotaryDims: headDim, base: 1_000_000, scale: 0.125, neox: true },
  ];
  const cases = [
    { name: "a full layer", cellsCount: 48, ring: false, length: 48, keep: 4, discard: 22 },
    { name: "a wrapped ring", cellsCount: 32, ring: true, length: 45, keep: 2, discard: 9 },
  ];
  for (const type of ["f32", "q8_0", "tq4"] as const) {
    for (const c of cases) {
      for (const rope of ropes) {
        test(`${c.name}, ${type}, ${rope.neox ? "NeoX" : "normal"} RoPE base ${rope.base}`, () => {
          const be = new CpuBackend();
          try {
            const raw = random(c.length * kvDim, c.length + (rope.neox ? 7 : 0));
            const values = random(c.length * kvDim, 99);
            const k = be.activation("k", c.length, kvDim), v = be.activation("v", c.length, kvDim);
            const pos = be.positions(c.length);
            be.read(k, c.length).set(raw);
            be.read(v, c.length).set(values);
            be.setPositions(pos, 0, c.length);
            be.rope(k, pos, c.length, rope);
            const layer = be.kvLayer(c.cellsCount, kvHeads, headDim, type, c.ring);
            // A ring takes the positions it can hold, as the engine writes them batch by batch
            // (16 at first for tq4, so that its keys take an anchor).
            for (let p = 0, batch = type === "tq4" ? 16 : 8; p < c.length; p += batch) {
              const rows = Math.min(batch, c.length - p);
              const kk = be.activation("kk", rows, kvDim), vv = be.activation("vv", rows, kvDim);
              be.read(kk, rows).set(be.read(k, c.length).subarray(p * kvDim, (p + rows) * kvDim));
              be.read(vv, rows).set(values.subarray(p * kvDim, (p + rows) * kvDim));
              be.storeKv(layer, kk, vv, rows, p);
            }
            be.shiftKv(layer, rope, c.keep, c.discard, c.length);
            // Kept positions p >= keep + discard now at p - discard, keys rotated to it.
            const newLength = c.length - c.discard;
            const firstHeld = c.ring ? Math.max(c.keep, c.length - c.cellsCount - c.discard) : c.keep;
            let squares = 0, count = 0;
            for (let q = Math.max(firstHeld, c.keep); q < newLength; q++) {
              const old = q + c.discard;
              const want = be.activation("want", 1, kvDim), wantPos = be.positions(1);
              be.read(want, 1).set(raw.subarray(old * kvDim, (old + 1) * kvDim));
              be.setPositions(wantPos, q, 1);
              be.rope(want, wantPos, 1, rope);
              const cell = c.ring ? q % c.cellsCount : q;
              const gotK = cells(layer, type, "k", cell, 1), gotV = cells(layer, type, "v", cell, 1);
              const wantK = be.read(want, 1), wantV = values.subarray(old * kvDim, (old + 1) * kvDim);
              if (type === "tq4") { // a code's error is per vector: measured as an RMS below
                for (let i = 0; i < kvDim; i++) squares += (gotK[i] - wantK[i]) ** 2;
                count += kvDim;
                continue;
              }
              // q8_0 re-quantizes the rotated keys: within a step of the block's scale.
              const tol = type === "f32" ? 1e-4 : 2.5e-2;
              for (let i = 0; i < kvDim; i++) {
                expect(Math.abs(gotK[i] - wantK[i])).toBeLessThan(tol);
                expect(Math.abs(gotV[i] - wantV[i])).toBeLessThan(type === "f32" ? 1e-7 : 1e-2);
              }
            }
            // tq4: coded, decoded, rotated and coded again; keys of RMS 0.58 keep about 0.077
            // (a key left unrotated, or its anchor lost, is much further off).
            if (type === "tq4") expect(Math.sqrt(squares / count)).toBeLessThan(0.1);
            if (!c.ring && type !== "tq4") { // the first `keep` positions stay as they were
              const kept = cells(layer, type, "k", 0, c.keep), orig = be.read(k, c.length);
              for (let i = 0; i < c.keep * kvDim; i++) {
                expect(Math.abs(kept[i] - orig[i])).toBeLessThan(type === "f32" ? 0 + 1e-7 : 1e-2);
              }
            }
          } finally {
            be.dispose();
          }
        });
      }
    }
  }
});

test("every architecture declares its keys' RoPE, so each can shift (a random Qwen3-MoE here)", () => {
  const path = join(mkdtempSync(join(tmpdir(), "infer-shift-")), "moe.gguf");
  writeFileSync(path, randomQuantGguf(qwen3moeKQuants));
  const engine = Engine.open({ modelPath: path, contextLength: 32, batch: 16 });
  try {
    const greedy = { maxTokens: 80, sampling: { ...defaultSampling, temperature: 0 }, ignoreEos: true };
    const r = engine.generate([1, 5, 9, 13], { ...greedy, contextShift: true });
    expect(r.stopReason).toBe("length");
    expect(r.tokens.length).toBe(80);
  } finally {
    engine.close();
    rmSync(dirname(path), { recursive: true, force: true });
  }
}, 60_000);

describe.skipIf(!existsSync(defaultModelPath()))("generating past the context of the default model", () => {
  const open = () => Engine.open({ modelPath: defaultModelPath(), contextLength: 64, batch: 16, kvType: "f32" });
  const prompt = "Alice was beginning to get very tired of sitting by her sister on the bank, and";

  test("without the shift it ends at the context; with it, it goes on", () => {
    const engine = open();
    try {
      const ended = engine.generate(prompt, { maxTokens: 200, sampling: { ...defaultSampling, temperature: 0 }, ignoreEos: true });
      expect(ended.stopReason).toBe("context");
      const shifted = engine.generate(prompt, { maxTokens: 200, sampling: { ...defaultSampling, temperature: 0 }, ignoreEos: true,
        contextShift: true });
      expect(shifted.stopReason).toBe("length");
      expect(shifted.tokens.length).toBe(200);
      // Before the first shift both generations are the same tokens.
      expect(shifted.tokens.slice(0, ended.tokens.length - 1)).toEqual(ended.tokens.slice(0, -1));
    } finally {
      engine.close();
    }
  }, 120_000);

  test("after a shift, layer 0 holds what evaluating the kept tokens at their new positions gives", () => {
    const engine = open(), fresh = open();
    try {
      const text = `${prompt} of having nothing to do: once or twice she had peeped into the book her sister ` +
        "was reading, but it had no pictures or conversations in it, and what is the use of a book, thought Alice " +
        "without pictures or conversations? So she was considering in her own mind (as well as she could)";
      const tokens = engine.tokenizer.encode(text, { addSpecial: true, parseSpecial: false }).slice(0, 64);
      expect(tokens.length).toBe(64);
      const slot = engine.slot;
      for (let p = 0; p < 64; p += 16) engine.model.forward(tokens.slice(p, p + 16), 16, p, slot.cache.layers);
      slot.history.set(tokens);
      slot.length = slot.reach = 64;
      expect(shiftSlot(engine.backend, slot, engine.model.info)).toBe(30); // keep 4, half of 60
      expect(slot.length).toBe(34);
      const history = Array.from(slot.history.subarray(0, 34));
      expect(history).toEqual([...tokens.slice(0, 4), ...tokens.slice(34)]);
      expectLayer0AsFresh(slot.cache.layers[0], fresh, history);
    } finally {
      engine.close();
      fresh.close();
    }
  }, 120_000);
});

/**
 * Layer 0 of a shifted cache (f32) against `fresh` running the kept history from position 0: the
 * keys as rotated back by RoPE (1e-3), the values as they were (1e-5).
 */
function expectLayer0AsFresh(shifted: KvLayer, fresh: Engine, history: number[]): void {
  for (let p = 0; p < history.length; p += 16) {
    const n = Math.min(16, history.length - p);
    fresh.model.forward(history.slice(p, p + n), n, p, fresh.slot.cache.layers);
  }
  const b = fresh.slot.cache.layers[0];
  for (const which of ["k", "v"] as const) {
    const got = cells(shifted, "f32", which, 0, history.length), want = cells(b, "f32", which, 0, history.length);
    let worst = 0;
    for (let i = 0; i < got.length; i++) worst = Math.max(worst, Math.abs(got[i] - want[i]));
    expect(worst).toBeLessThan(which === "k" ? 1e-3 : 1e-5);
  }
}

describe.skipIf(!existsSync(defaultModelPath()))("the h2o shift on the default model", () => {
  test("keeps the sinks, the heavy hitters by accumulated attention and the recent half; layer 0 as fresh", () => {
    const open = () => Engine.open({ modelPath: defaultModelPath(), contextLength: 64, batch: 16, kvType: "f32" });
    const engine = open(), fresh = open();
    try {
      const text = "Alice was beginning to get very tired of sitting by her sister on the bank, and of having " +
        "nothing to do: once or twice she had peeped into the book her sister was reading, but it had no pictures " +
        "or conversations in it, and what is the use of a book, thought Alice without pictures or conversations?";
      const tokens = engine.tokenizer.encode(text, { addSpecial: true, parseSpecial: false }).slice(0, 64);
      expect(tokens.length).toBe(64);
      const slot = engine.slot;
      expect(trackAttention(engine.backend, slot)).toBe(true);
      for (let p = 0; p < 64; p += 16) engine.model.forward(tokens.slice(p, p + 16), 16, p, slot.cache.layers);
      slot.history.set(tokens);
      slot.length = slot.reach = 64;
      // Every query head's weights sum to 1: each layer's mass totals heads x tokens.
      expect(slot.mass!.every((m) => m !== null)).toBe(true); // 64 cells: no ring
      const total = new Float64Array(64);
      let sum = 0;
      for (const m of slot.mass!) for (let p = 0; p < 64; p++) { total[p] += m![p]; sum += m![p]; }
      const queryHeads = sum / (64 * slot.cache.layers.length);
      expect(Math.abs(queryHeads - Math.round(queryHeads))).toBeLessThan(1e-3);
      const heavy = Array.from({ length: 45 }, (_, i) => 4 + i).sort((a, b) => total[b] - total[a] || a - b)
        .slice(0, 15).sort((a, b) => a - b);
      expect(shiftSlotHeavy(engine.backend, slot, engine.model.info)).toBe(30); // as shiftSlot: keep 4, half of 60
      expect(slot.length).toBe(34);
      const from = [0, 1, 2, 3, ...heavy, ...Array.from({ length: 15 }, (_, i) => 49 + i)];
      const history = Array.from(slot.history.subarray(0, 34));
      expect(history).toEqual(from.map((p) => tokens[p]));
      // What was accumulated moves with its position.
      for (let i = 0; i < 34; i++) expect(slot.mass![0]![i]).toBeGreaterThan(0);
      expectLayer0AsFresh(slot.cache.layers[0], fresh, history);
    } finally {
      engine.close();
      fresh.close();
    }
  }, 120_000);

  test("generation with the h2o policy goes on past the context", async () => {
    const model = await loadModel(defaultModelPath(), { contextLength: 64, threads: 2 });
    try {
      const r = await model.complete("Alice was beginning to get very tired", {
        maxTokens: 150, temperature: 0, ignoreEos: true, contextShift: true, contextShiftPolicy: "h2o" });
      expect(r.tokens.length).toBe(150);
      expect(r.finishReason).toBe("length");
      await expect(model.complete("x", { contextShift: true, contextShiftPolicy: "lru" as "h2o" }))
        .rejects.toThrow(/contextShiftPolicy/);
    } finally {
      await model.close();
    }
  }, 120_000);
});

describe.skipIf(!existsSync(defaultModelPath()))("a long chat through a small context", () => {
  test("40 turns through a 512-token context each get an answer", async () => {
    const model = await loadModel(defaultModelPath(), { contextLength: 512, parallel: 1 });
    try {
      const chat = model.chat({ system: "You are a helpful assistant." });
      let forgot = 0;
      for (let turn = 0; turn < 40; turn++) {
        const reply = await chat.send(`Tell me fact number ${turn + 1} about rabbits, in one sentence.`, {
          maxTokens: 32, temperature: 0, contextShift: true,
        });
        expect(reply.tokens.length).toBeGreaterThan(0);
        if (reply.messages.length < 2 * (turn + 1) + 1) forgot++;
      }
      // The conversation outgrew the context: its oldest turns were forgotten, every turn answered.
      expect(forgot).toBeGreaterThan(0);
      expect(chat.messages[0]).toEqual({ role: "system", content: "You are a helpful assistant." });
    } finally {
      await model.close();
    }
  }, 600_000);

  test("without contextShift the turn that does not fit fails as before", async () => {
    const model = await loadModel(defaultModelPath(), { contextLength: 64, parallel: 1 });
    try {
      const chat = model.chat();
      const long = "Tell me everything you know about rabbits and their long ears and their burrows. ".repeat(4);
      let message = "";
      try {
        await chat.send(long, { maxTokens: 8, temperature: 0 });
      } catch (err) {
        message = (err as Error).message;
      }
      expect(message).toMatch(/does not fit the context of 64 tokens/);
    } finally {
      await model.close();
    }
  }, 120_000);
});

describe("the server's --context-shift", () => {
  const limits = { vocabSize: 1000, contextLength: 64 };
  const body = { model: "m", prompt: "hi", max_tokens: 500 };
  test("without it, max_tokens past the context is a 400", () => {
    expect(() => parseRequest("completion", body, limits)).toThrow(/max_tokens/);
  });
  test("with it, max_tokens past the context is taken and the job shifts", () => {
    const parsed = parseRequest("completion", body, { ...limits, contextShift: true });
    expect(parsed.job.maxTokens).toBe(500);
    expect(parsed.job.contextShift).toBe(true);
    expect(parsed.job.contextShiftPolicy).toBeUndefined();
    const heavy = parseRequest("completion", body, { ...limits, contextShift: true, contextShiftPolicy: "h2o" });
    expect(heavy.job.contextShiftPolicy).toBe("h2o");
  });
  test("with it, a chat without max_tokens still ends at the context", () => {
    const parsed = parseRequest("chat", { model: "m", messages: [{ role: "user", content: "hi" }] },
      { ...limits, contextShift: true });
    expect(parsed.job.contextShift).toBeUndefined();
  });
});
