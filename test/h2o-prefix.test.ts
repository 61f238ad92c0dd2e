// The h2o shift after a reused prefix (ts/engine/kv-cache.ts shiftSlotHeavy): positions held
// before tracking began lack the attention of the queries before them; the shift estimates it
// from the queries it counted ((length - p) / (length - massFrom) times their mass), instead of
// ranking them as if nothing had attended to them. On the default model: a sequence that reuses a
// 32-token prefix then shifts keeps what the rule says, closer to what a sequence that computed the
// prefix itself keeps than zero would; the scheduler marks the prefix it continues or restores.
import { describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { Engine } from "../ts/engine/engine.ts";
import { rewindSlot, shiftSlotHeavy, trackAttention, untrackAttention, type Slot } from "../ts/engine/kv-cache.ts";
import { BatchScheduler } from "../ts/engine/scheduler.ts";
import { defaultModelPath } from "../ts/models/cache.ts";
import { tinySchedulerModel, toyPrompt } from "./support/tiny-scheduler.ts";

const CONTEXT = 64, BATCH = 16, REUSED = 32, KEEP = 4;

/** The heavy hitters shiftSlotHeavy picks from per-position totals (as it picks them at 64: 15 of 4..48). */
function heavyOf(total: ArrayLike<number>): number[] {
  return Array.from({ length: 45 }, (_, i) => KEEP + i).sort((a, b) => total[b] - total[a] || a - b)
    .slice(0, 15).sort((a, b) => a - b);
}

function totals(slot: Slot): Float64Array {
  const total = new Float64Array(CONTEXT);
  for (const m of slot.mass!) if (m) for (let p = 0; p < CONTEXT; p++) total[p] += m[p];
  return total;
}

function overlap(a: number[], b: number[]): number {
  return a.filter((p) => b.includes(p)).length;
}

describe.skipIf(!existsSync(defaultModelPath()))("the h2o shift after a reused prefix, on the default model", () => {
  test("the reused positions' mass estimated by the documented rule; the kept set closer to computing it all", () => {
    const engine = Engine.open({ modelPath: defaultModelPath(), contextLength: CONTEXT, batch: BATCH, kvType: "f32" });
    try {
      const text = "Alice was beginning to get very tired of sitting by her sister on the bank, and of having " +
        "nothing to do: once or twice she had peeped into the book her sister was reading, but it had no pictures " +
        "or conversations in it, and what is the use of a book, thought Alice without pictures or conversations?";
      const tokens = engine.tokenizer.encode(text, { addSpecial: true, parseSpecial: false }).slice(0, CONTEXT);
      const slot = engine.slot, layers = slot.cache.layers;
      const run = (from: number, to: number) => {
        for (let p = from; p < to; p += BATCH) engine.model.forward(tokens.slice(p, p + BATCH), BATCH, p, layers);
        slot.history.set(tokens.slice(from, to), from);
        slot.length = slot.reach = to;
      };

      // Computed itself: every query counted.
      rewindSlot(slot, 0);
      expect(trackAttention(engine.backend, slot)).toBe(true);
      expect(slot.massFrom).toBe(0);
      run(0, CONTEXT);
      const own = slot.mass!.map((m) => m?.slice() ?? null), ownTotal = totals(slot);
      const ownHeavy = heavyOf(ownTotal);
      expect(shiftSlotHeavy(engine.backend, slot, engine.model.info, KEEP)).toBe(30);
      expect(Array.from(slot.history.subarray(KEEP, KEEP + 15))).toEqual(ownHeavy.map((p) => tokens[p]));

      // The first 32 positions already held (as a prefix continued or restored), tracked after.
      rewindSlot(slot, 0);
      untrackAttention(engine.backend, slot);
      run(0, REUSED);
      expect(trackAttention(engine.backend, slot)).toBe(true);
      expect(slot.massFrom).toBe(REUSED);
      run(REUSED, CONTEXT);
      const counted = totals(slot);
      slot.mass!.forEach((m, i) => {
        if (!m) return;
        for (let p = 0; p < CONTEXT; p++) {
          // Past the prefix, the same queries: the same mass. Before it, only the later queries'.
          if (p >= REUSED) expect(m[p]).toBeCloseTo(own[i]![p], 4);
          else expect(m[p]).toBeLessThan(own[i]![p]);
        }
      });
      const estimate = Float64Array.from(counted, (x, p) => p < REUSED ? x * (CONTEXT - p) / (CONTEXT - REUSED) : x);
      const ruled = heavyOf(estimate), zero = heavyOf(counted);
      expect(shiftSlotHeavy(engine.backend, slot, engine.model.info, KEEP)).toBe(30);
      expect(Array.from(slot.history.subarray(KEEP, KEEP + 15))).toEqual(ruled.map((p) => tokens[p]));
      expect(slot.massFrom).toBe(0); // the estimate is kept: later queries add to it as to the rest
      const kept = overlap(ruled, ownHeavy), unestimated = overlap(zero, ownHeavy);
      const prefixKept = (set: number[]) => set.filter((p) => p < REUSED).length;
      console.log(`heavy hitters as computing it all: ${kept}/15 (zero for the prefix: ${unestimated}/15); ` +
        `prefix positions kept ${prefixKept(ruled)} (own ${prefixKept(ownHeavy)}, zero ${prefixKept(zero)})`);
      expect(kept).toBeGreaterThan(unestimated);
    } finally {
      engine.close();
    }
  }, 120_000);
});

const tiny = tinySchedulerModel();

test("the scheduler marks a prefix continued in place or restored from the prefix cache", () => {
  const engine = tiny.open();
  try {
    const scheduler = new BatchScheduler(engine, { slots: 1 });
    const slot = (scheduler as unknown as { slots: Slot[] }).slots[0];
    const sampling = { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 };
    const h2o = { maxTokens: 2, sampling, ignoreEos: true, contextShift: true, contextShiftPolicy: "h2o" as const };
    const finish = (prompt: number[], options: typeof h2o, check?: () => void) => {
      let done = false;
      scheduler.submit({ prompt, options, onDone: () => (done = true), onError: (e) => { throw e; } });
      scheduler.step(); // admits it
      check?.();
      while (!done) scheduler.step();
    };
    const a = toyPrompt(80, 1);
    finish(a, h2o, () => expect(slot.massFrom).toBe(0));
    // a's first 60 tokens, then others: continued in place from 60.
    finish(toyPrompt(80, 2, a.slice(1, 60)), h2o, () => expect(slot.massFrom).toBe(60));
    // Another prompt takes the slot; a again: its first 64 positions (two blocks of 32) restored.
    finish(toyPrompt(40, 3), { ...h2o, contextShiftPolicy: "streaming" as never }, () => expect(slot.mass).toBeUndefined());
    finish(a, h2o, () => {
      expect(slot.massFrom).toBe(64);
      expect(slot.mass).toBeDefined();
    });
  } finally {
    engine.close();
  }
}, 60_000);
