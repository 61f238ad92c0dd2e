// GGUF reader (versions 2 and 3; see ggml's docs/gguf.md). The file is untrusted input: every
// count, length, dimension and offset is bounded by the bytes that remain before it sizes an
// allocation or indexes anything, tensors must lie inside the data section without overlapping,
// and every failure is an InferError("bad_gguf") naming the problem and where it was found, in
// one line: a key or name from the file goes in through quote() (escaped, cut to 80
// characters). Tensor data is never copied: a tensor is an offset into the library-owned
// mapping, handed to kernels by address. A model split by llama.cpp's gguf-split
// (`<name>-00001-of-00003.gguf`, with split.no / split.count / split.tensors.count in each part)
// opens from its first part as one file: one tensor table whose tensors name the part (the
// mapping) that holds them.
import { existsSync } from "node:fs";
import { InferError, quote } from "../errors.ts";
import { mapFile, type MappedFile } from "../native/lib.ts";
import { ggmlTypes, type GgmlTypeInfo } from "./types.ts";

export const GGUF_MAGIC = 0x46554747; // "GGUF" read as a little-endian u32
export const GGUF_DEFAULT_ALIGNMENT = 32;

export type GgufScalar = number | bigint | boolean | string;
export type GgufArray =
  | Uint8Array | Int8Array | Uint16Array | Int16Array | Uint32Array | Int32Array
  | Float32Array | Float64Array | BigUint64Array | BigInt64Array | boolean[] | string[] | GgufArray[];
export type GgufValue = GgufScalar | GgufArray;

export interface GgufTensorInfo {
  readonly name: string;
  readonly type: GgmlTypeInfo;
  /** ggml order: dims[0] is the row length (contiguous), dims[1] the number of rows, ... */
  readonly dims: readonly number[];
  readonly elementCount: number;
  readonly byteLength: number;
  /** Offset of the tensor's first byte from the start of the file (of its part). */
  readonly fileOffset: number;
  /** Which of the file's parts holds it: 0 for a file that is not split. */
  readonly part: number;
}

/** One mapped file of a model: the whole model, or one part of a split one. */
export interface GgufPart {
  readonly path: string;
  /** The file's size. */
  readonly length: number;
  /** Native address of byte 0 of the file (for handing tensors to the library). */
  readonly baseAddress: number;
}

export interface GgufHeader {
  readonly version: number;
  readonly metadata: ReadonlyMap<string, GgufValue>;
  readonly tensors: ReadonlyMap<string, GgufTensorInfo>;
  readonly alignment: number;
  readonly dataOffset: number;
}

export interface GgufFile extends GgufHeader {
  /** The file (a split model's first part). */
  readonly path: string;
  /** The file's beginning (all of it up to VIEW_BYTES_MAX): the header; tensors: tensorBytes. */
  readonly bytes: Uint8Array;
  /** The mapped files: one, or a split model's parts in order (a tensor's `part` indexes it). */
  readonly parts: readonly GgufPart[];
  tensorAddress(t: GgufTensorInfo): number;
  tensorBytes(t: GgufTensorInfo): Uint8Array;
  /** Drops the mapped pages of bytes [offset, offset + length) of tensor `t` from the process's
   * memory once a copy serves them (a repacked weight); reads fault them back. */
  releaseTensorBytes(t: GgufTensorInfo, offset: number, length: number): void;
  close(): void;
}

// Value type ids in GGUF metadata.
const enum V { U8, I8, U16, I16, U32, I32, F32, Bool, Str, Arr, U64, I64, F64 }
const scalarBytes = [1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8];
const MAX_DIMS = 4;
const MAX_ARRAY_DEPTH = 4;
/** llama.cpp refuses tensor names of GGML_MAX_NAME (64) bytes or more. */
export const TENSOR_NAME_BYTES_MAX = 63;
/** Keys are dotted identifiers ("gemma3.attention.head_count_kv"); real ones are under 64. */
export const KEY_BYTES_MAX = 256;

class Cursor {
  pos = 0;
  readonly view: DataView;
  constructor(readonly bytes: Uint8Array, readonly where: string) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }
  fail(msg: string): never {
    throw new InferError("bad_gguf", `${this.where}: ${msg} (at byte ${this.pos})`);
  }
  need(n: number, what: string): void {
    if (n < 0 || this.pos + n > this.bytes.length) {
      this.fail(`truncated: ${what} needs ${n} bytes, ${this.bytes.length - this.pos} remain`);
    }
  }
  u32(what: string): number { this.need(4, what); const v = this.view.getUint32(this.pos, true); this.pos += 4; return v; }
  u64(what: string): number {
    this.need(8, what);
    const v = this.view.getBigUint64(this.pos, true);
    this.pos += 8;
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) this.fail(`${what} is absurd (${v})`);
    return Number(v);
  }
  /** A string of at most `maxBytes` (default: whatever remains of the file). */
  string(what: string, maxBytes = Infinity): string {
    const len = this.u64(`${what} length`);
    if (len > maxBytes) this.fail(`${what} is ${len} bytes long (at most ${maxBytes})`);
    this.need(len, what);
    const s = decodeUtf8(this.bytes.subarray(this.pos, this.pos + len));
    this.pos += len;
    return s;
  }
}

// ignoreBOM: a token may begin with U+FEFF (Gemma has six); it is text, not a byte-order mark.
const utf8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
function decodeUtf8(b: Uint8Array): string {
  // Most keys and tokens are short ASCII: skip the decoder for them.
  if (b.length < 16) {
    let ascii = true;
    for (let i = 0; i < b.length; i++) if (b[i] >= 0x80) { ascii = false; break; }
    if (ascii) return String.fromCharCode(...b);
  }
  return utf8.decode(b);
}

function readScalar(c: Cursor, type: number, what: string): GgufScalar {
  switch (type) {
    case V.U8: c.need(1, what); return c.view.getUint8(c.pos++);
    case V.I8: c.need(1, what); return c.view.getInt8(c.pos++);
    case V.U16: { c.need(2, what); const v = c.view.getUint16(c.pos, true); c.pos += 2; return v; }
    case V.I16: { c.need(2, what); const v = c.view.getInt16(c.pos, true); c.pos += 2; return v; }
    case V.U32: return c.u32(what);
    case V.I32: { c.need(4, what); const v = c.view.getInt32(c.pos, true); c.pos += 4; return v; }
    case V.F32: { c.need(4, what); const v = c.view.getFloat32(c.pos, true); c.pos += 4; return v; }
    case V.Bool: {
      c.need(1, what);
      const b = c.view.getUint8(c.pos++);
      if (b > 1) c.fail(`${what}: bool byte is ${b}`);
      return b === 1;
    }
    case V.Str: return c.string(what);
    case V.U64: case V.I64: {
      c.need(8, what);
      const v = type === V.U64 ? c.view.getBigUint64(c.pos, true) : c.view.getBigInt64(c.pos, true);
      c.pos += 8;
      return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
    }
    case V.F64: { c.need(8, what); const v = c.view.getFloat64(c.pos, true); c.pos += 8; return v; }
    default: return c.fail(`${what}: unknown value type ${type}`);
  }
}

function readArray(c: Cursor, what: string, depth: number): GgufArray {
  if (depth > MAX_ARRAY_DEPTH) c.fail(`${what}: arrays nested deeper than ${MAX_ARRAY_DEPTH}`);
  const type = c.u32(`${what} element type`);
  const count = c.u64(`${what} count`);
  if (type > V.F64) c.fail(`${what}: unknown array element type ${type}`);
  // Every element takes at least this many bytes, so a count the file cannot hold is refused
  // before anything is allocated.
  const minBytes = type === V.Str || type === V.Arr ? 8 : scalarBytes[type];
  c.need(count * minBytes, `${what} (${count} elements)`);
  if (type === V.Str) {
    const out = new Array<string>(count);
    for (let i = 0; i < count; i++) out[i] = c.string(what);
    return out;
  }
  if (type === V.Arr) {
    const out = new Array<GgufArray>(count);
    for (let i = 0; i < count; i++) out[i] = readArray(c, what, depth + 1);
    return out;
  }
  if (type === V.Bool) {
    const out = new Array<boolean>(count);
    for (let i = 0; i < count; i++) out[i] = readScalar(c, V.Bool, what) as boolean;
    return out;
  }
  const bytes = c.bytes.slice(c.pos, c.pos + count * minBytes); // copy: aligned, and metadata is small
  c.pos += count * minBytes;
  const ctor = [Uint8Array, Int8Array, Uint16Array, Int16Array, Uint32Array, Int32Array, Float32Array,
    null, null, null, BigUint64Array, BigInt64Array, Float64Array][type];
  if (!ctor) return c.fail(`${what}: bad element type ${type}`);
  return new ctor(bytes.buffer, 0, count);
}

/**
 * Parses the header at the start of `bytes`; `fileLength` is the whole file's size where `bytes`
 * is only its beginning (a mapping's first view: see VIEW_BYTES_MAX).
 */
export function parseGguf(bytes: Uint8Array, where = "gguf", fileLength = bytes.length,
  part = 0): GgufHeader {
  const c: Cursor = new Cursor(bytes, where); // annotated so c.fail() narrows
  if (bytes.length < 4 || c.view.getUint32(0, true) !== GGUF_MAGIC) {
    c.fail("not a GGUF file (bad magic)");
  }
  c.pos = 4;
  const version = c.u32("version");
  if (version !== 2 && version !== 3) c.fail(`unsupported GGUF version ${version} (2 and 3 are read)`);
  const tensorCount = c.u64("tensor count");
  const kvCount = c.u64("metadata count");
  // Each metadata entry needs >= 12 bytes (key length + value type), each tensor >= 28.
  c.need(kvCount * 12, `${kvCount} metadata entries`);
  c.need(tensorCount * 28, `${tensorCount} tensor entries`);

  const metadata = new Map<string, GgufValue>();
  for (let i = 0; i < kvCount; i++) {
    const key = c.string(`metadata key #${i}`, KEY_BYTES_MAX);
    const what = quote(key);
    const type = c.u32(`type of ${what}`);
    const value = type === V.Arr ? readArray(c, what, 1) : readScalar(c, type, what);
    if (metadata.has(key)) c.fail(`duplicate metadata key ${what}`);
    metadata.set(key, value);
  }

  const alignment = metadata.get("general.alignment") ?? GGUF_DEFAULT_ALIGNMENT;
  if (typeof alignment !== "number" || alignment <= 0 || alignment % 8 !== 0 || alignment > 1 << 16) {
    c.fail(`general.alignment ${quote(String(alignment))} is not a multiple of 8 in 8..65536`);
  }

  const raw: { name: string; type: GgmlTypeInfo; dims: number[]; count: number; offset: number }[] = [];
  const names = new Set<string>();
  for (let i = 0; i < tensorCount; i++) {
    const name = c.string(`tensor #${i} name`, TENSOR_NAME_BYTES_MAX);
    const tensor = `tensor ${quote(name)}`;
    if (names.has(name)) c.fail(`duplicate ${tensor}`);
    names.add(name);
    const nDims = c.u32(`${tensor} dimension count`);
    if (nDims === 0 || nDims > MAX_DIMS) {
      c.fail(`${tensor} has ${nDims} dimensions (1..${MAX_DIMS})`);
    }
    const dims: number[] = [];
    let count = 1;
    for (let d = 0; d < nDims; d++) {
      const n = c.u64(`${tensor} dimension ${d}`);
      if (n === 0) c.fail(`${tensor} has a zero dimension`);
      count *= n;
      if (count > fileLength * 8) c.fail(`${tensor} is larger than the file could hold`);
      dims.push(n);
    }
    const typeId = c.u32(`${tensor} type`);
    const type = ggmlTypes.get(typeId);
    if (!type) c.fail(`${tensor} has unknown type ${typeId}`);
    if (dims[0] % type.blockValues !== 0) {
      c.fail(`${tensor} row of ${dims[0]} is not a multiple of the ${type.name} block ` +
        `(${type.blockValues})`);
    }
    const offset = c.u64(`${tensor} offset`);
    if (offset % alignment !== 0) {
      c.fail(`${tensor} offset ${offset} is not aligned to ${alignment}`);
    }
    raw.push({ name, type, dims, count, offset });
  }

  const dataOffset = Math.ceil(c.pos / alignment) * alignment;
  const dataBytes = fileLength - dataOffset;
  const tensors = new Map<string, GgufTensorInfo>();
  for (const t of raw) {
    const byteLength = (t.count / t.type.blockValues) * t.type.blockBytes;
    if (t.offset + byteLength > dataBytes) {
      throw new InferError("bad_gguf", `${where}: tensor ${quote(t.name)} (${byteLength} bytes ` +
        `at data offset ${t.offset}) runs past the end of the file (truncated?)`);
    }
    tensors.set(t.name, Object.freeze({
      name: t.name, type: t.type, dims: Object.freeze(t.dims), elementCount: t.count, byteLength,
      fileOffset: dataOffset + t.offset, part,
    }));
  }
  refuseOverlaps([...tensors.values()], where);
  return { version, metadata, tensors, alignment, dataOffset };
}

/**
 * Tensors whose bytes overlap: llama.cpp lays them out back to back and refuses anything else;
 * here any order is read, but no two may share a byte (1,024 layers over one 576 KiB blob
 * made a 4 MB file ask for 4.2 GB of repacked copies).
 */
function refuseOverlaps(tensors: GgufTensorInfo[], where: string): void {
  tensors.sort((a, b) => a.fileOffset - b.fileOffset);
  for (let i = 1; i < tensors.length; i++) {
    const prev = tensors[i - 1], t = tensors[i];
    if (t.fileOffset < prev.fileOffset + prev.byteLength) {
      throw new InferError("bad_gguf", `${where}: tensor ${quote(t.name)} overlaps ` +
        `${quote(prev.name)} (data offsets ${t.fileOffset - prev.fileOffset} bytes apart, ` +
        `${prev.byteLength} needed)`);
    }
  }
}

/** Maps `path` (and, for a split model's first part, the other parts) and parses it; the
 * mappings live until close(). */
export function openGguf(path: string): GgufFile {
  const mappings: MappedFile[] = [];
  try {
    const first = mapFile(path);
    mappings.push(first);
    const header = parseGguf(first.bytes, path, first.length);
    const split = splitOf(header, path);
    let tensors = header.tensors;
    if (split) {
      const all = new Map(header.tensors);
      for (let i = 1; i < split.paths.length; i++) {
        const partPath = split.paths[i];
        if (!existsSync(partPath)) {
          throw new InferError("io", `${path} is part 1 of ${split.paths.length}; part ${i + 1} ` +
            `(${partPath}) is missing`);
        }
        const mapped = mapFile(partPath);
        mappings.push(mapped);
        const part = parseGguf(mapped.bytes, partPath, mapped.length, i);
        checkPart(part, i, split.paths.length, partPath);
        for (const [name, t] of part.tensors) {
          if (all.has(name)) {
            throw new InferError("bad_gguf", `${partPath}: tensor ${quote(name)} is also in an ` +
              "earlier part");
          }
          all.set(name, t);
        }
      }
      if (all.size !== split.tensorCount) {
        throw new InferError("bad_gguf", `${path}: the parts hold ${all.size} tensors, ` +
          `split.tensors.count says ${split.tensorCount}`);
      }
      tensors = all;
    }
    return mappedGguf(split?.paths ?? [path], header, tensors, mappings);
  } catch (err) {
    for (const m of mappings) m.close();
    throw err;
  }
}

function mappedGguf(paths: string[], header: GgufHeader,
  tensors: ReadonlyMap<string, GgufTensorInfo>, mappings: MappedFile[]): GgufFile {
  const parts = mappings.map((m, i) =>
    Object.freeze({ path: paths[i], length: m.length, baseAddress: m.base }));
  return {
    ...header,
    tensors,
    path: paths[0],
    bytes: mappings[0].bytes,
    parts,
    tensorAddress: (t) => mappings[t.part].base + t.fileOffset,
    tensorBytes: (t) => mappings[t.part].view(t.fileOffset, t.byteLength),
    releaseTensorBytes: (t, offset, length) =>
      mappings[t.part].release(t.fileOffset + offset, length),
    close: () => { for (const m of mappings) m.close(); },
  };
}

/** llama.cpp's name for part `i` (0-based) of `count`: `<prefix>-00001-of-00003.gguf`. */
export function splitPartPath(prefix: string, i: number, count: number): string {
  const n = (k: number) => String(k).padStart(5, "0");
  return `${prefix}-${n(i + 1)}-of-${n(count)}.gguf`;
}

/** The split part name's pattern: prefix, part number (1-based), count. */
export const SPLIT_PART_NAME = /^(.*)-(\d{5})-of-(\d{5})\.gguf$/;

/** A split model's parts (from its first part's header), or null for a whole file. */
function splitOf(header: GgufHeader, path: string,
): { paths: string[]; tensorCount: number } | null {
  const count = header.metadata.get("split.count");
  if (count === undefined) return null;
  const no = header.metadata.get("split.no");
  const tensorCount = header.metadata.get("split.tensors.count");
  if (typeof count !== "number" || typeof no !== "number" || typeof tensorCount !== "number" ||
    count < 1 || count > 9999 || no < 0 || no >= count) {
    throw new InferError("bad_gguf", `${path}: split.count, split.no or split.tensors.count is ` +
      "missing or out of range");
  }
  const named = SPLIT_PART_NAME.exec(path);
  if (no !== 0) {
    const first = named ? splitPartPath(named[1], 0, count) : "its first part";
    throw new InferError("invalid_argument", `${path} is part ${no + 1} of ${count} of a split ` +
      `model; give ${first}`);
  }
  if (count === 1) return null;
  if (!named) {
    throw new InferError("invalid_argument", `${path} is part 1 of a split model, but its name ` +
      "does not end in -00001-of-NNNNN.gguf, so its other parts cannot be found");
  }
  const paths = Array.from({ length: count }, (_, i) => splitPartPath(named[1], i, count));
  paths[0] = path;
  return { paths, tensorCount };
}

function checkPart(part: GgufHeader, i: number, count: number, path: string): void {
  const no = part.metadata.get("split.no"), partCount = part.metadata.get("split.count");
  if (no !== i || partCount !== count) {
    const says = typeof no === "number" && typeof partCount === "number"
      ? `it is part ${no + 1} of ${partCount}` : "nothing valid of its split";
    throw new InferError("bad_gguf", `${path}: expected part ${i + 1} of ${count}, its header ` +
      `says ${says}`);
  }
}
