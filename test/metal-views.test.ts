// Method: the arithmetic that splits a GGUF larger than the device's maxBufferLength into
// overlapping no-copy views (ts/backend/metal-views.ts, as ggml-metal does) over many random
// layouts of tensors, small page sizes and limits: every view starts on a page, is at most
// maxBufferLength long and lies inside the file, the views cover the file, and every tensor lies
// wholly inside the view viewOf gives it at the offset it gives. A tensor larger than one buffer
// is refused with one line. The Metal backend on such views is run against the CPU backend in
// test/metal-backend.test.ts.
import { expect, test } from "bun:test";
import { planBufferViews, viewOf } from "../ts/backend/metal-views.ts";

function random(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

test("every tensor lies wholly inside one view, over random layouts and limits", () => {
  const rand = random(49);
  let split = 0;
  for (let trial = 0; trial < 2000; trial++) {
    const page = [64, 4096, 16384][trial % 3];
    const header = Math.floor(rand() * 5 * page);
    const tensors: { offset: number; bytes: number }[] = [];
    let at = header;
    const n = 1 + Math.floor(rand() * 40);
    for (let i = 0; i < n; i++) {
      at += Math.floor(rand() * 32) * 32; // alignment padding
      const bytes = 1 + Math.floor(rand() * 20 * page);
      tensors.push({ offset: at, bytes });
      at += bytes;
    }
    const fileBytes = at;
    const largest = Math.max(...tensors.map((t) => t.bytes));
    const maxBufferLength = largest + 2 * page + Math.floor(rand() * fileBytes);
    const views = planBufferViews(fileBytes, largest, maxBufferLength, page);
    if (views.length > 1) split++;
    expect(views[0].offset).toBe(0);
    expect(views.at(-1)!.offset + views.at(-1)!.bytes).toBe(fileBytes);
    for (let i = 0; i < views.length; i++) {
      const v = views[i];
      expect(v.offset % page).toBe(0);
      expect(v.bytes).toBeGreaterThan(0);
      expect(v.bytes).toBeLessThanOrEqual(maxBufferLength);
      if (i > 0) expect(v.offset).toBeLessThanOrEqual(views[i - 1].offset + views[i - 1].bytes);
    }
    for (const t of tensors) {
      const { index, offset } = viewOf(views, t.offset, t.bytes);
      expect(offset).toBe(t.offset - views[index].offset);
      expect(offset).toBeGreaterThanOrEqual(0);
      expect(offset + t.bytes).toBeLessThanOrEqual(views[index].bytes);
    }
  }
  expect(split).toBeGreaterThan(1000);
});

test("a file within maxBufferLength is one view; a tensor over it is refused with one line", () => {
  expect(planBufferViews(1000, 600, 1000, 64)).toEqual([{ offset: 0, bytes: 1000 }]);
  // step = 1024 - 900 rounded down to a page = 64; the last view starts at 9024 (9024 + 1024 ≥ 10000).
  const views = planBufferViews(10_000, 900, 1024, 64);
  expect(views.length).toBe(9024 / 64 + 1);
  expect(views.at(-1)).toEqual({ offset: 9024, bytes: 976 });
  expect(() => planBufferViews(10_000, 1000, 1024, 64)).toThrow(/a tensor of 1000 bytes is too large to split .* into Metal buffers of at most 1024 bytes/);
});
