// The anchor of a tq3/tq4 K layer on the CPU (ts/backend/cpu-kv-anchor.ts): whatever stores
// write a layer's first 16 cells (a 3-token prompt, then one token at a time; a prefix-cache
// block of a few), it ends with the anchor and the codes of one first store of those keys; a
// layer that never holds 16 keeps them coded as they are; a copy and a shift keep them right.
import { describe, expect, test } from "bun:test";
import type { KvLayer, KvType, RopeOptions } from "../ts/backend/backend.ts";
import { CpuBackend } from "../ts/backend/cpu.ts";
import { ANCHOR_ROWS_MIN } from "../ts/backend/cpu-kv-anchor.ts";
import { check, native } from "../ts/native/lib.ts";

const kvHeads = 2, headDim = 64, kvDim = kvHeads * headDim, cellsCount = 64;
const typeIds = { tq3: 103, tq4: 104 } as const;

interface Inner { kBytes: Uint8Array<ArrayBuffer>; kRowBytes: number; kAnchor?: Float32Array; kPending?: Map<number, Float32Array> }
const inner = (l: KvLayer) => l as unknown as Inner;

/** Keys sharing one large vector (as Gemma 3's do, which is why the anchor is there). */
function keys(rows: number, seed: number): Float32Array {
  let s = seed;
  const next = () => (s = (s * 1103515245 + 12345) % 2 ** 31) / 2 ** 30 - 1;
  const common = Float32Array.from({ length: kvDim }, () => 8 * next());
  return Float32Array.from({ length: rows * kvDim }, (_, i) => common[i % kvDim] + next());
}

/** Stores rows first .. first + count - 1 of `all` at their positions, `batches` rows at a time. */
function store(be: CpuBackend, layer: KvLayer, all: Float32Array, first: number, count: number): void {
  const k = be.activation("k", count, kvDim), v = be.activation("v", count, kvDim);
  be.read(k, count).set(all.subarray(first * kvDim, (first + count) * kvDim));
  be.read(v, count).fill(0.5);
  be.storeKv(layer, k, v, count, first);
}

function codes(layer: KvLayer, rows: number): Uint8Array {
  const l = inner(layer);
  return l.kBytes.slice(0, rows * l.kRowBytes);
}

function decoded(layer: KvLayer, type: "tq3" | "tq4", first: number, rows: number): Float32Array {
  const l = inner(layer), out = new Float32Array(rows * kvDim);
  check(native().infer_kv_load(l.kBytes.subarray(first * l.kRowBytes, (first + rows) * l.kRowBytes), typeIds[type],
    out.length, headDim, l.kAnchor ?? null, l.kAnchor?.length ?? 0, out), "kv_load");
  return out;
}

function rms(a: Float32Array, b: Float32Array): number {
  let e = 0;
  for (let i = 0; i < a.length; i++) e += (a[i] - b[i]) ** 2;
  return Math.sqrt(e / a.length);
}

describe.each(["tq4", "tq3"] as const)("a %s K layer's anchor", (type) => {
  const types = { k: type as KvType, v: "f16" as KvType };

  test("a 3-row first store, then one row at a time: the anchor and codes of one 16-row store", () => {
    const be = new CpuBackend();
    try {
      const all = keys(24, 1);
      const stepped = be.kvLayer(cellsCount, kvHeads, headDim, types, false);
      const whole = be.kvLayer(cellsCount, kvHeads, headDim, types, false);
      store(be, stepped, all, 0, 3);
      for (let p = 3; p < ANCHOR_ROWS_MIN; p++) {
        expect(inner(stepped).kAnchor).toBeUndefined(); // not yet: coded as they are, kept exact
        store(be, stepped, all, p, 1);
      }
      store(be, whole, all, 0, ANCHOR_ROWS_MIN);
      for (let p = ANCHOR_ROWS_MIN; p < 24; p++) {
        store(be, stepped, all, p, 1);
        store(be, whole, all, p, 1);
      }
      const anchor = inner(stepped).kAnchor!;
      expect(anchor).toBeInstanceOf(Float32Array);
      expect(anchor).toEqual(inner(whole).kAnchor!); // bit for bit: the same sum in the same order
      expect(inner(stepped).kPending).toBeUndefined();
      expect(codes(stepped, 24)).toEqual(codes(whole, 24));
      // The exact mean of the first 16 keys.
      for (let i = 0; i < kvDim; i++) {
        let sum = 0;
        for (let r = 0; r < ANCHOR_ROWS_MIN; r++) sum += all[r * kvDim + i];
        expect(anchor[i]).toBeCloseTo(sum / ANCHOR_ROWS_MIN, 4);
      }
      // Coded less it, far closer than coded as they are.
      const plain = new Uint8Array(24 * inner(whole).kRowBytes), back = new Float32Array(24 * kvDim);
      check(native().infer_kv_store(all, plain, typeIds[type], all.length, headDim, null, 0), "kv_store");
      check(native().infer_kv_load(plain, typeIds[type], all.length, headDim, null, 0, back), "kv_load");
      expect(rms(decoded(stepped, type, 0, 24), all) * 3).toBeLessThan(rms(back, all));
    } finally {
      be.dispose();
    }
  });

  test("3 rows, then a 17-row store: as one 20-row store", () => {
    const be = new CpuBackend();
    try {
      const all = keys(20, 2);
      const split = be.kvLayer(cellsCount, kvHeads, headDim, types, false);
      const whole = be.kvLayer(cellsCount, kvHeads, headDim, types, false);
      store(be, split, all, 0, 3);
      store(be, split, all, 3, 17);
      store(be, whole, all, 0, 20);
      expect(inner(split).kAnchor!).toEqual(inner(whole).kAnchor!);
      expect(codes(split, 20)).toEqual(codes(whole, 20));
    } finally {
      be.dispose();
    }
  });

  test("a sequence that never holds 16 keys: coded as they are, rewritten cells kept current", () => {
    const be = new CpuBackend();
    try {
      const all = keys(12, 3), other = keys(12, 4);
      const layer = be.kvLayer(cellsCount, kvHeads, headDim, types, false);
      store(be, layer, all, 0, 3);
      for (let p = 3; p < 12; p++) store(be, layer, all, p, 1);
      // A new sequence in the same slot writes cells 0..5 again: still 12 cells known, no anchor.
      store(be, layer, other, 0, 6);
      expect(inner(layer).kAnchor).toBeUndefined();
      expect(inner(layer).kPending!.size).toBe(12);
      const want = new Float32Array(12 * kvDim);
      want.set(other.subarray(0, 6 * kvDim));
      want.set(all.subarray(6 * kvDim, 12 * kvDim), 6 * kvDim);
      const plain = new Uint8Array(12 * inner(layer).kRowBytes);
      check(native().infer_kv_store(want, plain, typeIds[type], want.length, headDim, null, 0), "kv_store");
      expect(codes(layer, 12)).toEqual(plain);
      // Four more cells: the anchor is the mean of the 16 keys held, the current ones.
      const next = keys(16, 5);
      for (let p = 12; p < 16; p++) store(be, layer, next, p, 1);
      const held = new Float32Array(16 * kvDim);
      held.set(want);
      held.set(next.subarray(12 * kvDim, 16 * kvDim), 12 * kvDim);
      const whole = be.kvLayer(cellsCount, kvHeads, headDim, types, false);
      store(be, whole, held, 0, 16);
      expect(inner(layer).kAnchor!).toEqual(inner(whole).kAnchor!);
      expect(codes(layer, 16)).toEqual(codes(whole, 16));
    } finally {
      be.dispose();
    }
  });

  test("the prefix cache's copies: a short block keeps its keys exact; an anchored copy gives its anchor", () => {
    const be = new CpuBackend();
    try {
      const all = keys(40, 6);
      // A slot that held 3 keys saves them into a block of 4 (no anchor on either), and a fresh
      // slot restores them and goes on one key at a time: as one 16-key store.
      const slot = be.kvLayer(cellsCount, kvHeads, headDim, types, false);
      store(be, slot, all, 0, 3);
      const block = be.kvLayer(4, kvHeads, headDim, types, false);
      be.copyKv(slot, 0, block, 0, 3);
      expect(inner(block).kAnchor).toBeUndefined();
      const restored = be.kvLayer(cellsCount, kvHeads, headDim, types, false);
      be.copyKv(block, 0, restored, 0, 3);
      for (let p = 3; p < 20; p++) store(be, restored, all, p, 1);
      const whole = be.kvLayer(cellsCount, kvHeads, headDim, types, false);
      store(be, whole, all, 0, 16);
      for (let p = 16; p < 20; p++) store(be, whole, all, p, 1);
      expect(inner(restored).kAnchor!).toEqual(inner(whole).kAnchor!);
      expect(codes(restored, 20)).toEqual(codes(whole, 20));

      // An anchored block copied into a slot holding 2 keys of its own past it: the slot takes the
      // block's anchor and codes its 2 keys again less it, from their exact values.
      const anchored = be.kvLayer(32, kvHeads, headDim, types, false);
      be.copyKv(whole, 0, anchored, 0, 20);
      expect(inner(anchored).kAnchor).toBe(inner(whole).kAnchor);
      const taker = be.kvLayer(cellsCount, kvHeads, headDim, types, false);
      store(be, taker, all, 30, 2); // positions 30, 31 (of a longer prompt)
      be.copyKv(anchored, 0, taker, 0, 20);
      expect(inner(taker).kAnchor).toBe(inner(whole).kAnchor);
      expect(inner(taker).kPending).toBeUndefined();
      store(be, whole, all, 30, 2);
      expect(codes(taker, 32)).toEqual(codes(whole, 32));

      // A pending block copied into an anchored slot: its exact keys coded less the slot's anchor.
      be.copyKv(block, 0, taker, 32, 3);
      const k = inner(taker);
      expect(k.kBytes.slice(32 * k.kRowBytes, 35 * k.kRowBytes))
        .toEqual(storedLess(all.subarray(0, 3 * kvDim), k.kAnchor!, type));
    } finally {
      be.dispose();
    }
  });

  test("a shift before 16 keys: the anchor from those held, the kept keys rotated", () => {
    const be = new CpuBackend();
    try {
      const rope: RopeOptions = { heads: kvHeads, headDim, rotaryDims: headDim, base: 10_000, scale: 1, neox: false };
      const length = 12, keep = 2, discard = 5, raw = keys(length, 7);
      const layer = be.kvLayer(length, kvHeads, headDim, types, false);
      // Keys at positions 0..11, stored 3 then one at a time; the reference keys rotated straight
      // to their new positions.
      const k = be.activation("k", length, kvDim), pos = be.positions(length);
      be.read(k, length).set(raw);
      be.setPositions(pos, 0, length);
      be.rope(k, pos, length, rope);
      const roped = be.read(k, length).slice();
      store(be, layer, roped, 0, 3);
      for (let p = 3; p < length; p++) store(be, layer, roped, p, 1);
      be.shiftKv(layer, rope, keep, discard, length);
      const l = inner(layer);
      expect(l.kAnchor).toBeInstanceOf(Float32Array);
      expect(l.kPending).toBeUndefined();
      const want = be.activation("want", length - keep - discard, kvDim), wantPos = be.positions(length - keep - discard);
      be.read(want, length - keep - discard).set(raw.subarray((keep + discard) * kvDim));
      be.setPositions(wantPos, keep, length - keep - discard);
      be.rope(want, wantPos, length - keep - discard, rope);
      const n = length - keep - discard, got = decoded(layer, type, keep, n), wanted = be.read(want, n);
      // Coded less the anchor, decoded, rotated and coded again: about one code's error more than
      // coding the rotated keys once less the same anchor (a key left unrotated is far off).
      const once = new Float32Array(n * kvDim);
      check(native().infer_kv_load(storedLess(wanted, l.kAnchor!, type), typeIds[type], once.length, headDim,
        l.kAnchor!, kvDim, once), "kv_load");
      const error = rms(got, wanted), codeError = rms(once, wanted);
      expect(error).toBeLessThan(2 * codeError);
      expect(rms(roped.subarray((keep + discard) * kvDim), wanted)).toBeGreaterThan(4 * error);
      // The sinks, coded again less the anchor from their exact keys: one code's error.
      const sinks = decoded(layer, type, 0, keep), sinkOnce = new Float32Array(keep * kvDim);
      check(native().infer_kv_load(storedLess(roped.subarray(0, keep * kvDim), l.kAnchor!, type), typeIds[type],
        sinkOnce.length, headDim, l.kAnchor!, kvDim, sinkOnce), "kv_load");
      expect(sinks).toEqual(sinkOnce);
    } finally {
      be.dispose();
    }
  });
});

/** Keys coded less an anchor, as bytes. */
function storedLess(src: Float32Array, anchor: Float32Array, type: "tq3" | "tq4"): Uint8Array<ArrayBuffer> {
  const rowBytes = (kvDim / headDim) * (2 + (headDim * (type === "tq4" ? 4 : 3)) / 8);
  const out = new Uint8Array((src.length / kvDim) * rowBytes);
  check(native().infer_kv_store(src, out, typeIds[type], src.length, headDim, anchor, anchor.length), "kv_store");
  return out;
}
