// Safetensors reader (huggingface/safetensors' format): an 8-byte little-endian header length, a
// JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the
// raw row-major data. A checkpoint is one model.safetensors or shards listed in
// model.safetensors.index.json. Files are untrusted: the header length, every offset and every
// shape is checked against the file before anything is read, and each error names the file and
// the tensor. Data stays in the library's read-only mapping until a tensor is asked for as f32.
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { basename, join } from "node:path";
import { InferError } from "../errors.ts";
import { GgmlType } from "../gguf/types.ts";
import { check, mapFile, native, offsetAddress, type MappedFile } from "../native/lib.ts";

/** Element types we convert, with their size and the ggml type that dequantizes them. */
const DTYPES: Record<string, { bytes: number; ggml: number }> = {
  F32: { bytes: 4, ggml: GgmlType.F32 },
  F16: { bytes: 2, ggml: GgmlType.F16 },
  BF16: { bytes: 2, ggml: GgmlType.BF16 },
};
/** Largest JSON header we parse (real ones are well under 1 MiB). */
const HEADER_BYTES_MAX = 100 << 20;

export interface SafetensorsTensor {
  readonly name: string;
  readonly dtype: string;
  /** Row-major (PyTorch) order: shape[shape.length - 1] is contiguous. */
  readonly shape: readonly number[];
  readonly elementCount: number;
  readonly file: string;
  /** Offset of the first byte from the start of its file. */
  readonly fileOffset: number;
}

interface Shard { readonly path: string; readonly mapping: MappedFile }

export class SafetensorsCheckpoint {
  private constructor(readonly tensors: ReadonlyMap<string, SafetensorsTensor>,
    private readonly shards: ReadonlyMap<string, Shard>) {}

  /** Opens every safetensors file of a Hugging Face folder (
    single file or sharded with an index). */
  static open(folder: string): SafetensorsCheckpoint {
    const files = checkpointFiles(folder);
    const shards = new Map<string, Shard>();
    const tensors = new Map<string, SafetensorsTensor>();
    try {
      for (const path of files) {
        const mapping = mapFile(path);
        shards.set(path, { path, mapping });
        for (const t of parseHeader(mapping.bytes, path, mapping.length)) {
          if (tensors.has(t.name)) {
            throw new InferError("bad_model", `${basename(path)}: tensor '${t.name}' is also in ` +
              `${basename(tensors.get(t.name)!.file)}`);
          }
          tensors.set(t.name, t);
        }
      }
      checkIndex(folder, tensors);
    } catch (err) {
      for (const s of shards.values()) s.mapping.close();
      throw err;
    }
    return new SafetensorsCheckpoint(tensors, shards);
  }

  /** The tensor's values as f32 (a fresh array; F16 and BF16 are widened exactly). */
  readF32(t: SafetensorsTensor): Float32Array {
    const shard = this.shards.get(t.file)!;
    const dtype = DTYPES[t.dtype];
    const out = new Float32Array(t.elementCount);
    if (t.elementCount === 0) return out;
    if (dtype.ggml === GgmlType.F32) {
      // Copy through bytes: the data need not be 4-byte aligned in the file.
      new Uint8Array(out.buffer).set(shard.mapping.view(t.fileOffset, t.elementCount * 4));
      return out;
    }
    const src = offsetAddress(shard.mapping.base, t.fileOffset);
    check(native().infer_dequantize(dtype.ggml, src, t.elementCount, out), `reading '${t.name}'`);
    return out;
  }

  close(): void {
    for (const s of this.shards.values()) s.mapping.close();
  }
}

function bad(msg: string): never {
  throw new InferError("bad_model", msg);
}

function checkpointFiles(folder: string): string[] {
  const index = join(folder, "model.safetensors.index.json");
  if (existsSync(index)) {
    const weightMap = readIndex(index);
    return [...new Set(Object.values(weightMap))].sort().map((f) => join(folder, f));
  }
  const single = join(folder, "model.safetensors");
  if (existsSync(single)) return [single];
  const any = existsSync(folder) ? readdirSync(folder).filter((f) => f.endsWith(
    ".safetensors")).sort() : [];
  if (any.length === 0) bad(`${folder}: no model.safetensors or model.safetensors.index.json`);
  return any.map((f) => join(folder, f));
}

function readIndex(path: string): Record<string, string> {
  let json: unknown;
  try {
    json = JSON.parse(readFileSync(path, "utf8"));
  } catch (err) {
    bad(`${path}: not valid JSON (${(err as Error).message})`);
  }
  const map = (json as { weight_map?: unknown })?.weight_map;
  if (typeof map !== "object" || map === null) bad(`${path}: no weight_map`);
  for (const [name, file] of Object.entries(map)) {
    if (typeof file !== "string" || file.includes("/") || file.includes("\\") || !file.endsWith(
      ".safetensors")) {
      bad(`${path}: tensor '${name}' maps to a bad file name ${JSON.stringify(file)}`);
    }
    if (!existsSync(join(path, "..", file))) bad(
      `${path}: shard '${file}' (for '${name}') is missing`);
  }
  return map as Record<string, string>;
}

/** Every tensor the index lists must be in the shard it names. */
function checkIndex(folder: string, tensors: ReadonlyMap<string, SafetensorsTensor>): void {
  const index = join(folder, "model.safetensors.index.json");
  if (!existsSync(index)) return;
  for (const [name, file] of Object.entries(readIndex(index))) {
    const t = tensors.get(name);
    if (!t) bad(`${file}: tensor '${name}' (listed in model.safetensors.index.json) is missing`);
    if (basename(t.file) !== file) bad(
      `tensor '${name}' is in ${basename(t.file)}, the index says ${file}`);
  }
}

/** `fileLength`: the whole file's size where `bytes` is only its beginning (a mapping's view). */
export function parseHeader(bytes: Uint8Array, path: string, fileLength = bytes.length): SafetensorsTensor[] {
  const where = basename(path);
  if (fileLength < 8) bad(`${where}: truncated safetensors file (${fileLength} bytes)`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerBytes = Number(view.getBigUint64(0, true));
  if (headerBytes > HEADER_BYTES_MAX || 8 + headerBytes > fileLength) {
    bad(`${where}: header of ${headerBytes} bytes does not fit the file of ${fileLength} (truncated?)`);
  }
  let header: Record<string, unknown>;
  try {
    header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerBytes)));
  } catch (err) {
    bad(`${where}: header is not valid JSON (${(err as Error).message})`);
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) bad(
    `${where}: header is not an object`);
  const dataStart = 8 + headerBytes, dataBytes = fileLength - dataStart;
  const out: SafetensorsTensor[] = [];
  for (const [name, entry] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const e = entry as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    const dtype = DTYPES[e?.dtype as string];
    if (!dtype) {
      throw new InferError("unsupported",
        `${where}: tensor '${name}' has dtype ${String(e?.dtype)} ` +
        `(F32, F16 and BF16 are read)`);
    }
    const shape = e.shape;
    if (!Array.isArray(shape) || shape.length > 4 || shape.some((d) => !Number.isSafeInteger(d)
      || d < 0)) {
      bad(`${where}: tensor '${name}' has a bad shape ${JSON.stringify(shape)}`);
    }
    const offsets = e.data_offsets;
    if (!Array.isArray(offsets) || offsets.length !== 2 || offsets.some((
      o) => !Number.isSafeInteger(o) || o < 0)) {
      bad(`${where}: tensor '${name}' has bad data_offsets ${JSON.stringify(offsets)}`);
    }
    const count = (shape as number[]).reduce((a, b) => a * b, 1);
    const [begin, end] = offsets as number[];
    if (end < begin || end - begin !== count * dtype.bytes) {
      bad(`${where}: tensor '${name}' spans ${end - begin} bytes, its shape [${shape}] needs ${count * dtype.bytes}`);
    }
    if (end > dataBytes) {
      bad(`${where}: tensor '${name}' ends at byte ${end} of ${dataBytes} data bytes (truncated file?)`);
    }
    out.push({ name, dtype: e.dtype as string, shape: shape as number[], elementCount: count,
      file: path,
      fileOffset: dataStart + begin });
  }
  return out;
}
