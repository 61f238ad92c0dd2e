// GGUF v3 writer: metadata with explicit value types, tensors aligned to general.alignment.
// Used by import/quantize, by tests that craft hostile files, and to write random-weight models
// with real shapes (so no test or benchmark needs a download).
import { GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC } from "./reader.ts";
import { ggmlTypes } from "./types.ts";

export type GgufTypedValue =
  | { type: "u8" | "i8" | "u16" | "i16" | "u32" | "i32" | "f32" | "f64"; value: number }
  | { type: "u64" | "i64"; value: number | bigint }
  | { type: "bool"; value: boolean }
  | { type: "str"; value: string }
  | { type: "arr"; element: "u8" | "i8" | "u16" | "i16" | "u32" | "i32" | "f32" | "f64" | "u64" | "i64"
      | "bool" | "str"; value: ArrayLike<number | bigint | boolean | string> };

export const gguf = {
  u32: (value: number): GgufTypedValue => ({ type: "u32", value }),
  i32: (value: number): GgufTypedValue => ({ type: "i32", value }),
  u64: (value: number | bigint): GgufTypedValue => ({ type: "u64", value }),
  f32: (value: number): GgufTypedValue => ({ type: "f32", value }),
  bool: (value: boolean): GgufTypedValue => ({ type: "bool", value }),
  str: (value: string): GgufTypedValue => ({ type: "str", value }),
  strs: (value: readonly string[]): GgufTypedValue => ({ type: "arr", element: "str", value }),
  f32s: (value: ArrayLike<number>): GgufTypedValue => ({ type: "arr", element: "f32", value }),
  i32s: (value: ArrayLike<number>): GgufTypedValue => ({ type: "arr", element: "i32", value }),
};

export interface GgufTensorToWrite {
  name: string;
  type: number; // ggml type id
  dims: number[]; // ggml order: dims[0] is the row length
  data: Uint8Array;
}

const typeIds = { u8: 0, i8: 1, u16: 2, i16: 3, u32: 4, i32: 5, f32: 6, bool: 7, str: 8, arr: 9, u64: 10, i64: 11, f64: 12 } as const;

class ByteSink {
  private buf = new Uint8Array(1 << 16);
  private view = new DataView(this.buf.buffer);
  length = 0;
  private grow(n: number): void {
    if (this.length + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.length + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.length));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }
  u8(v: number) { this.grow(1); this.view.setUint8(this.length, v); this.length += 1; }
  u32(v: number) { this.grow(4); this.view.setUint32(this.length, v, true); this.length += 4; }
  u64(v: number | bigint) { this.grow(8); this.view.setBigUint64(this.length, BigInt(v), true); this.length += 8; }
  bytes(b: Uint8Array) { this.grow(b.length); this.buf.set(b, this.length); this.length += b.length; }
  str(s: string) { const b = new TextEncoder().encode(s); this.u64(b.length); this.bytes(b); }
  pad(alignment: number) { while (this.length % alignment !== 0) this.u8(0); }
  scalar(type: keyof typeof typeIds, v: number | bigint | boolean | string): void {
    this.grow(8);
    const p = this.length;
    switch (type) {
      case "u8": this.view.setUint8(p, Number(v)); this.length += 1; break;
      case "i8": this.view.setInt8(p, Number(v)); this.length += 1; break;
      case "u16": this.view.setUint16(p, Number(v), true); this.length += 2; break;
      case "i16": this.view.setInt16(p, Number(v), true); this.length += 2; break;
      case "u32": this.view.setUint32(p, Number(v), true); this.length += 4; break;
      case "i32": this.view.setInt32(p, Number(v), true); this.length += 4; break;
      case "f32": this.view.setFloat32(p, Number(v), true); this.length += 4; break;
      case "f64": this.view.setFloat64(p, Number(v), true); this.length += 8; break;
      case "u64": this.view.setBigUint64(p, BigInt(v), true); this.length += 8; break;
      case "i64": this.view.setBigInt64(p, BigInt(v), true); this.length += 8; break;
      case "bool": this.view.setUint8(p, v ? 1 : 0); this.length += 1; break;
      case "str": this.str(String(v)); break;
      default: throw new Error(`gguf writer: bad scalar type ${type}`);
    }
  }
  result(): Uint8Array { return this.buf.subarray(0, this.length); }
}

/** A tensor's entry in the header: its data is written after the header, in this order. */
export interface GgufTensorHeader {
  name: string;
  type: number; // ggml type id
  dims: number[]; // ggml order: dims[0] is the row length
}

export interface GgufLayout {
  /** Everything before the tensor data, padded to the alignment. */
  readonly header: Uint8Array;
  /** Byte length of each tensor's data and the zero padding that follows it. */
  readonly dataBytes: readonly number[];
  readonly paddingBytes: readonly number[];
  readonly alignment: number;
}

/**
 * Serialises the header for tensors whose data will follow in order (each padded to the
 * alignment), so that a converter can stream gigabytes of tensor data without holding them.
 */
export function ggufLayout(
  metadata: ReadonlyArray<readonly [string, GgufTypedValue]>,
  tensors: readonly GgufTensorHeader[],
  options: { version?: number; alignment?: number } = {},
): GgufLayout {
  const alignment = options.alignment ?? GGUF_DEFAULT_ALIGNMENT;
  const s = new ByteSink();
  s.u32(GGUF_MAGIC);
  s.u32(options.version ?? 3);
  s.u64(tensors.length);
  s.u64(metadata.length);
  for (const [key, v] of metadata) {
    s.str(key);
    s.u32(typeIds[v.type]);
    if (v.type === "arr") {
      s.u32(typeIds[v.element]);
      s.u64(v.value.length);
      for (let i = 0; i < v.value.length; i++) s.scalar(v.element, v.value[i]);
    } else {
      s.scalar(v.type, v.value);
    }
  }
  let offset = 0;
  const dataBytes: number[] = [], paddingBytes: number[] = [];
  for (const t of tensors) {
    const info = ggmlTypes.get(t.type);
    if (!info) throw new Error(`gguf writer: unknown tensor type ${t.type}`);
    const count = t.dims.reduce((a, b) => a * b, 1);
    if (t.dims[0] % info.blockValues !== 0) {
      throw new Error(`gguf writer: '${t.name}' row of ${t.dims[0]} is not a multiple of the ` +
        `${info.name} block (${info.blockValues})`);
    }
    const bytes = (count / info.blockValues) * info.blockBytes;
    s.str(t.name);
    s.u32(t.dims.length);
    for (const d of t.dims) s.u64(d);
    s.u32(t.type);
    s.u64(offset);
    const padded = Math.ceil(bytes / alignment) * alignment;
    dataBytes.push(bytes);
    paddingBytes.push(padded - bytes);
    offset += padded;
  }
  s.pad(alignment);
  return { header: s.result(), dataBytes, paddingBytes, alignment };
}

/** Serialises a whole GGUF (header and tensor data) in memory. */
export function writeGguf(
  metadata: ReadonlyArray<readonly [string, GgufTypedValue]>,
  tensors: readonly GgufTensorToWrite[],
  options: { version?: number; alignment?: number } = {},
): Uint8Array {
  const layout = ggufLayout(metadata, tensors, options);
  const total = layout.header.length + layout.dataBytes.reduce((a, b, i) => a + b + layout.paddingBytes[i], 0);
  const out = new Uint8Array(total);
  out.set(layout.header);
  let at = layout.header.length;
  tensors.forEach((t, i) => {
    if (t.data.length !== layout.dataBytes[i]) {
      throw new Error(`gguf writer: '${t.name}' has ${t.data.length} bytes, its shape needs ${layout.dataBytes[i]}`);
    }
    out.set(t.data, at);
    at += t.data.length + layout.paddingBytes[i];
  });
  return out;
}
