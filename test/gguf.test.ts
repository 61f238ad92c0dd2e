// Method: write small GGUFs with our writer, read them back, then break them in every way a
// hostile or damaged file can be broken; the reader must answer each with InferError("bad_gguf")
// naming the problem — never another exception, a crash or a hang.
import { describe, expect, test } from "bun:test";
import { closeSync, mkdtempSync, openSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { InferError } from "../ts/errors.ts";
import { openGguf, parseGguf } from "../ts/gguf/reader.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import { gguf, ggufLayout, writeGguf, type GgufTensorToWrite } from "../ts/gguf/writer.ts";

function sample(version = 3): Uint8Array {
  const f32 = new Float32Array([1, 2, 3, 4, 5, 6, 7, 8]);
  const tensors: GgufTensorToWrite[] = [
    { name: "a.weight", type: GgmlType.F32, dims: [4, 2], data: new Uint8Array(f32.buffer) },
    { name: "b.weight", type: GgmlType.Q8_0, dims: [32], data: new Uint8Array(34).fill(1) },
  ];
  return writeGguf([
    ["general.architecture", gguf.str("llama")],
    ["general.alignment", gguf.u32(64)],
    ["x.count", gguf.u64(123456789012)],
    ["x.flag", gguf.bool(true)],
    ["x.eps", gguf.f32(1e-6)],
    ["x.names", gguf.strs(["a", "bé", "🙂"])],
    ["x.scores", gguf.f32s([0.5, -1.5])],
    ["x.ids", gguf.i32s([-1, 7])],
    ["x.i8", { type: "i8", value: -3 }],
    ["x.f64", { type: "f64", value: Math.PI }],
    ["x.big", { type: "u64", value: 2n ** 60n }],
  ], tensors, { version, alignment: 64 });
}

function expectBad(bytes: Uint8Array, fragment: string): void {
  try {
    parseGguf(bytes, "t.gguf");
  } catch (err) {
    expect(err).toBeInstanceOf(InferError);
    expect((err as InferError).code).toBe("bad_gguf");
    expect((err as Error).message).toContain(fragment);
    return;
  }
  throw new Error(`expected a bad_gguf error containing '${fragment}'`);
}

function patched(bytes: Uint8Array, at: number, write: (v: DataView) => void): Uint8Array {
  const copy = bytes.slice();
  write(new DataView(copy.buffer, at));
  return copy;
}

function find(bytes: Uint8Array, text: string): number {
  const needle = new TextEncoder().encode(text);
  outer: for (let i = 0; i + needle.length <= bytes.length; i++) {
    for (let j = 0; j < needle.length; j++) if (bytes[i + j] !== needle[j]) continue outer;
    return i;
  }
  throw new Error(`'${text}' not in file`);
}

describe("round trip", () => {
  for (const version of [2, 3]) {
    test(`v${version}: metadata of every kind and the tensor table`, () => {
      const h = parseGguf(sample(version));
      expect(h.version).toBe(version);
      expect(h.metadata.get("general.architecture")).toBe("llama");
      expect(h.metadata.get("x.count")).toBe(123456789012);
      expect(h.metadata.get("x.flag")).toBe(true);
      expect(h.metadata.get("x.eps")).toBeCloseTo(1e-6, 12);
      expect(h.metadata.get("x.names")).toEqual(["a", "bé", "🙂"]);
      expect(Array.from(h.metadata.get("x.scores") as Float32Array)).toEqual([0.5, -1.5]);
      expect(Array.from(h.metadata.get("x.ids") as Int32Array)).toEqual([-1, 7]);
      expect(h.metadata.get("x.i8")).toBe(-3);
      expect(h.metadata.get("x.f64")).toBe(Math.PI);
      expect(h.metadata.get("x.big")).toBe(2n ** 60n);
      expect(h.alignment).toBe(64);
      expect(h.dataOffset % 64).toBe(0);
      const a = h.tensors.get("a.weight")!;
      expect(a.dims).toEqual([4, 2]);
      expect(a.byteLength).toBe(32);
      const b = h.tensors.get("b.weight")!;
      expect(b.type.name).toBe("Q8_0");
      expect(b.fileOffset % 64).toBe(0);
    });
  }

  test("openGguf maps the file and tensor bytes are views of it", () => {
    const dir = mkdtempSync(join(tmpdir(), "infer-gguf-"));
    const path = join(dir, "s.gguf");
    writeFileSync(path, sample());
    const f = openGguf(path);
    const a = f.tensors.get("a.weight")!;
    expect(Array.from(new Float32Array(f.tensorBytes(a).slice().buffer))).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(f.tensorAddress(a)).toBe(f.parts[0].baseAddress + a.fileOffset);
    f.close();
  });

  test("a file past 4 GiB (an 8B model in Q8_0 is 8.5 GB) opens, and its last tensor is readable", () => {
    // Sparse: the header, then a hole up to the end of 5 GiB of tensors, with one marked byte.
    const dir = mkdtempSync(join(tmpdir(), "infer-gguf-"));
    const path = join(dir, "big.gguf");
    const rows = 1 << 20, cols = 1280; // 1,280 F32 values a row: 5 MiB per 1,024 rows
    const tensors = [{ name: "a.weight", type: GgmlType.F32, dims: [cols, rows / 2] },
      { name: "b.weight", type: GgmlType.F32, dims: [cols, rows / 2] }];
    const layout = ggufLayout([["general.architecture", { type: "str", value: "llama" }]], tensors);
    const total = layout.header.length + layout.dataBytes[0] + layout.paddingBytes[0] + layout.dataBytes[1];
    expect(total).toBeGreaterThan(2 ** 32);
    const fd = openSync(path, "w");
    try {
      writeSync(fd, layout.header);
      writeSync(fd, new Uint8Array([42]), 0, 1, total - 1);
    } finally {
      closeSync(fd);
    }
    const f = openGguf(path);
    try {
      expect(f.parts[0].length).toBe(total);
      const b = f.tensors.get("b.weight")!;
      expect(b.fileOffset + b.byteLength).toBe(total);
      const bytes = f.tensorBytes(b);
      expect(bytes.length).toBe(b.byteLength);
      expect(bytes[0]).toBe(0);
      expect(bytes[bytes.length - 1]).toBe(42);
    } finally {
      f.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("hostile and damaged files", () => {
  const good = sample();
  test("bad magic", () => expectBad(patched(good, 0, (v) => v.setUint32(0, 0x12345678, true)), "bad magic"));
  test("empty and tiny files", () => {
    expectBad(new Uint8Array(0), "bad magic");
    expectBad(good.subarray(0, 6), "truncated");
  });
  test("unsupported version", () => {
    expectBad(patched(good, 4, (v) => v.setUint32(0, 1, true)), "version 1");
    expectBad(patched(good, 4, (v) => v.setUint32(0, 99, true)), "version 99");
  });
  test("absurd tensor and metadata counts", () => {
    expectBad(patched(good, 8, (v) => v.setBigUint64(0, 1n << 40n, true)), "tensor entries");
    expectBad(patched(good, 16, (v) => v.setBigUint64(0, 1n << 62n, true)), "absurd");
  });
  test("absurd string length", () => {
    expectBad(patched(good, 24, (v) => v.setBigUint64(0, 1n << 50n, true)), "metadata key #0");
  });
  test("unknown metadata value type", () => {
    const at = find(good, "general.architecture") + "general.architecture".length;
    expectBad(patched(good, at, (v) => v.setUint32(0, 77, true)), "unknown value type 77");
  });
  test("absurd array count", () => {
    const at = find(good, "x.scores") + "x.scores".length + 8; // after value type + element type
    expectBad(patched(good, at, (v) => v.setBigUint64(0, 1n << 40n, true)), "elements");
  });
  test("unknown tensor type", () => {
    const at = find(good, "a.weight") + "a.weight".length + 4 + 16; // n_dims, 2 dims
    expectBad(patched(good, at, (v) => v.setUint32(0, 250, true)), "unknown type 250");
  });
  test("too many dimensions, zero dimension", () => {
    const at = find(good, "a.weight") + "a.weight".length;
    expectBad(patched(good, at, (v) => v.setUint32(0, 9, true)), "9 dimensions");
    expectBad(patched(good, at + 4, (v) => v.setBigUint64(0, 0n, true)), "zero dimension");
  });
  test("tensor offset past the end, misaligned offset", () => {
    const at = find(good, "b.weight") + "b.weight".length + 4 + 8 + 4;
    expectBad(patched(good, at, (v) => v.setBigUint64(0, 1n << 20n, true)), "runs past the end");
    expectBad(patched(good, at, (v) => v.setBigUint64(0, 65n, true)), "not aligned");
  });
  test("row not a multiple of the block", () => {
    const at = find(good, "b.weight") + "b.weight".length + 4;
    expectBad(patched(good, at, (v) => v.setBigUint64(0, 33n, true)), "not a multiple");
  });
  test("every truncation is a clean error", () => {
    const b = parseGguf(good).tensors.get("b.weight")!;
    const end = b.fileOffset + b.byteLength; // what follows is alignment padding
    for (let n = 0; n < end; n++) {
      try {
        parseGguf(good.subarray(0, n));
        throw new Error(`truncated to ${n} bytes parsed`);
      } catch (err) {
        if (!(err instanceof InferError)) throw err;
      }
    }
  });
  test("random corruption never escapes as anything but InferError", () => {
    let seed = 12345;
    const rand = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32;
    for (let trial = 0; trial < 3000; trial++) {
      const copy = good.slice();
      const flips = 1 + Math.floor(rand() * 4);
      for (let k = 0; k < flips; k++) copy[Math.floor(rand() * copy.length)] = Math.floor(rand() * 256);
      try {
        parseGguf(copy);
      } catch (err) {
        if (!(err instanceof InferError)) throw err;
      }
    }
  });
  test("tensors that overlap, or start before another ends, are refused", () => {
    const at = find(good, "b.weight") + "b.weight".length + 4 + 8 + 4; // b's offset field
    expectBad(patched(good, at, (v) => v.setBigUint64(0, 0n, true)), "overlaps");
    // a.weight is 32 bytes at 0: b at 0 (same bytes) or in its last bytes overlaps it.
    const moved = writeGguf([["general.alignment", gguf.u32(8)]], [
      { name: "a.weight", type: GgmlType.F32, dims: [8], data: new Uint8Array(32) },
      { name: "b.weight", type: GgmlType.F32, dims: [8], data: new Uint8Array(32) },
    ], { alignment: 8 });
    const bAt = find(moved, "b.weight") + "b.weight".length + 4 + 8 + 4;
    expectBad(patched(moved, bAt, (v) => v.setBigUint64(0, 24n, true)), 'overlaps "a.weight"');
    const after = patched(moved, bAt, (v) => v.setBigUint64(0, 32n, true)); // right after a
    expect(parseGguf(after).tensors.size).toBe(2);
  });
  test("a name or key longer than any real one is refused before it is read", () => {
    const at = find(good, "a.weight") - 8; // the name's length
    expectBad(patched(good, at, (v) => v.setBigUint64(0, 64n, true)), "64 bytes long (at most 63)");
    expectBad(patched(good, at, (v) => v.setBigUint64(0, 250_000_000n, true)), "at most 63");
    expectBad(patched(good, 24, (v) => v.setBigUint64(0, 100_000n, true)), "(at most 256)");
  });
  test("file strings reach a message escaped and cut: one line of bounded length", () => {
    const hostile = "\u001b[2J\u001b]0;pwned\u0007\n" + "x".repeat(200);
    const name = "\u001b[31m\nred\r" + "y".repeat(40);
    const unknownType = writeGguf([[hostile, gguf.u32(1)]], []); // then its value type: 77
    unknownType[24 + 8 + new TextEncoder().encode(hostile).length] = 77;
    const cases = [
      writeGguf([[hostile, gguf.u32(1)], [hostile, gguf.u32(2)]], []),
      writeGguf([["general.architecture", gguf.str("llama")]], [
        { name, type: GgmlType.F32, dims: [1], data: new Uint8Array(4) },
        { name, type: GgmlType.F32, dims: [1], data: new Uint8Array(4) },
      ]),
      unknownType,
    ];
    for (const bytes of cases) {
      try {
        parseGguf(bytes, "t.gguf");
        throw new Error("parsed");
      } catch (err) {
        expect(err).toBeInstanceOf(InferError);
        const message = (err as Error).message;
        expect(message).not.toMatch(/[\u0000-\u001f\u007f-\u009f]/);
        expect(message.length).toBeLessThan(300);
      }
    }
  });
  test("openGguf on a non-GGUF file names the path", () => {
    const dir = mkdtempSync(join(tmpdir(), "infer-gguf-"));
    const path = join(dir, "notes.txt");
    writeFileSync(path, "just some text, not a model");
    expect(() => openGguf(path)).toThrow(/notes\.txt.*bad magic/);
  });
});
