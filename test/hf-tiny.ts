// The tiny random Hugging Face models of test/fixtures/hf-tiny, rebuilt outside the repository.
//
// gen-hf-reference.py trains each folder's tokenizer, draws its weights and records transformers'
// logits for them; the repository keeps the small text files (config, tokenizer, chat template,
// shard index) and weights.json, but not the safetensors files: weights are not committed. This
// module draws the same numbers as the script's tensor_values() (mulberry32 seeded by the
// tensor's name; every step exact or correctly rounded in float64), rounds them to float32 and
// then to the saved dtype (round to nearest even, as torch does), writes the safetensors files
// into $INFER_CACHE/hf-tiny/<arch> (default ~/.cache/infer) and checks each tensor's bytes
// against the SHA-256 the script read back from what transformers saved, so a drift between the
// two generators fails loudly instead of testing other weights.
//
// Run `bun test/hf-tiny.ts` to build all folders and print their paths (for the manual scripts).
import { createHash } from "node:crypto";
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync,
  writeFileSync } from "node:fs";
import { join } from "node:path";
import { cacheDir } from "../ts/models/cache.ts";

export const HF_TINY_ARCHS = ["llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "phi3", "mistral", "gptoss",
  "ministral3", "gemma3n"] as const;
export type HfTinyArch = (typeof HF_TINY_ARCHS)[number];

const FIXTURES = join(import.meta.dir, "fixtures", "hf-tiny");

type Dtype = "F32" | "F16" | "BF16";
interface WeightsManifest {
  seed: number;
  norm_offset: number;
  dtype: Dtype;
  /** Per safetensors file: [tensor name, shape, SHA-256 of its bytes]. */
  files: Record<string, [string, number[], string][]>;
}

export interface SafetensorsEntry {
  name: string;
  dtype: Dtype;
  shape: number[];
  bytes: Uint8Array;
}

/** A safetensors file: u64 header length, JSON header padded to 8 bytes, tensor data. */
export function writeSafetensors(path: string, tensors: SafetensorsEntry[],
  metadata?: Record<string, string>): void {
  const header: Record<string, unknown> = metadata ? { __metadata__: metadata } : {};
  let offset = 0;
  for (const t of tensors) {
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + t.bytes.length] };
    offset += t.bytes.length;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (json.length % 8)) % 8);
  const out = new Uint8Array(8 + json.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(new TextEncoder().encode(json), 8);
  let at = 8 + json.length;
  for (const t of tensors) {
    out.set(t.bytes, at);
    at += t.bytes.length;
  }
  writeFileSync(path, out);
}

function fnv1a32(text: string): number {
  let h = 0x811C9DC5;
  for (const b of new TextEncoder().encode(text)) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return h;
}

/** gen-hf-reference.py's tensor_values(), in the same order and the same float64 steps. */
export function tensorValues(name: string, shape: number[], seed: number,
  normOffset: number): Float64Array {
  let a = (fnv1a32(name) ^ Math.imul(seed, 0x9E3779B1)) >>> 0;
  const uniform = (): number => {
    a = (a + 0x6D2B79F5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return (((t ^ (t >>> 14)) >>> 0) + 0.5) / 4294967296;
  };
  const n = shape.reduce((p, d) => p * d, 1);
  const out = new Float64Array(n);
  const cols = Math.sqrt(shape[shape.length - 1]!);
  for (let i = 0; i < n; i++) {
    const z = ((((uniform() + uniform()) + uniform()) + uniform()) - 2.0) * 1.7320508075688772;
    if (shape.length > 1) out[i] = z / cols;
    else if (name.includes("norm")) out[i] = normOffset + 0.2 * z;
    else out[i] = 0.3 * z; // biases
  }
  return out;
}

/** float32 bits to bfloat16, round to nearest even (no NaNs occur here). */
function bf16(bits: number): number {
  return ((bits + 0x7FFF + ((bits >>> 16) & 1)) >>> 16) & 0xFFFF;
}

/** float32 bits to IEEE half, round to nearest even, subnormals included. */
export function f16(bits: number): number {
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xFF;
  const mant = bits & 0x7FFFFF;
  if (exp === 0xFF) return sign | 0x7C00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1F) return sign | 0x7C00;
  if (e <= 0) { // half subnormal: m · 2^-24 with m = (1.mant) · 2^(exp - 126)
    if (e < -10) return sign;
    const full = mant | 0x800000, shift = 14 - e;
    const rem = full & ((1 << shift) - 1), half = 1 << (shift - 1);
    let m = full >>> shift;
    if (rem > half || (rem === half && (m & 1))) m++;
    return sign | m;
  }
  const rem = mant & 0x1FFF;
  let h = sign | (e << 10) | (mant >>> 13);
  if (rem > 0x1000 || (rem === 0x1000 && (h & 1))) h++; // a carry rolls into the exponent
  return h;
}

function encode(values: Float64Array, dtype: Dtype): Uint8Array {
  const f32 = Float32Array.from(values); // rounds each float64 to nearest even
  if (dtype === "F32") return new Uint8Array(f32.buffer);
  const bits = new Uint32Array(f32.buffer), out = new Uint16Array(f32.length);
  for (let i = 0; i < f32.length; i++) out[i] = dtype === "BF16" ? bf16(bits[i]!) : f16(bits[i]!);
  return new Uint8Array(out.buffer);
}

function build(arch: HfTinyArch, folder: string, manifest: WeightsManifest): void {
  const work = `${folder}.tmp-${process.pid}`;
  rmSync(work, { recursive: true, force: true });
  cpSync(join(FIXTURES, arch), work, { recursive: true });
  for (const [file, rows] of Object.entries(manifest.files)) {
    const tensors = rows.map(([name, shape, sha256]) => {
      const bytes = encode(tensorValues(name, shape, manifest.seed, manifest.norm_offset),
        manifest.dtype);
      const got = createHash("sha256").update(bytes).digest("hex");
      if (got !== sha256) {
        throw new Error(`hf-tiny/${arch}: ${name} does not match weights.json (sha256 ${got}, ` +
          `want ${sha256}): test/hf-tiny.ts and gen-hf-reference.py draw different weights`);
      }
      return { name, dtype: manifest.dtype, shape, bytes };
    });
    writeSafetensors(join(work, file), tensors, { format: "pt" });
  }
  rmSync(folder, { recursive: true, force: true });
  renameSync(work, folder);
}

/** The folder of one tiny model, built on first use and rebuilt when its fixture changes. */
export function hfTinyFolder(arch: HfTinyArch): string {
  const source = join(FIXTURES, arch);
  const hash = createHash("sha256");
  for (const file of readdirSync(source).sort()) {
    hash.update(file).update("\0").update(readFileSync(join(source, file))).update("\0");
  }
  const stamp = hash.digest("hex");
  const folder = join(cacheDir(), "hf-tiny", arch);
  const stampPath = join(folder, ".fixture-sha256");
  if (existsSync(stampPath) && readFileSync(stampPath, "utf8") === stamp) return folder;
  mkdirSync(join(cacheDir(), "hf-tiny"), { recursive: true });
  build(arch, folder, JSON.parse(readFileSync(join(source, "weights.json"), "utf8")));
  writeFileSync(stampPath, stamp);
  return folder;
}

if (import.meta.main) {
  for (const arch of HF_TINY_ARCHS) console.log(`${arch}\t${hfTinyFolder(arch)}`);
}
