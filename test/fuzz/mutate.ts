// One fuzz case: a seed model (seeds.ts) changed by one to three mutations, on its structure
// (metadata values of every type and boundary, missing and duplicate keys and tensors, huge
// strings and arrays, broken vocabularies, NaN/Inf tensor data) or on its bytes once written
// (bit flips, truncations, boundary integers in any header field, swapped types and dims,
// out-of-range and overlapping offsets). Case `index` of run `seed` is always the same file.
import { GgmlType, ggmlTypes } from "../../ts/gguf/types.ts";
import {
  gguf, writeGguf, type GgufTensorToWrite, type GgufTypedValue,
} from "../../ts/gguf/writer.ts";
import { headerMap, type Field, type HeaderMap } from "./fields.ts";
import { architectures, seedModel, weightTypes, type SeedModel } from "./seeds.ts";

/** xorshift64*, seeded per case: the same (seed, index) gives the same file anywhere. */
export class Rng {
  private s: bigint;
  constructor(seed: number, index: number) {
    this.s = (BigInt(seed) * 0x9E3779B97F4A7C15n + BigInt(index) * 0xBF58476D1CE4E5B9n + 1n) &
      0xFFFFFFFFFFFFFFFFn;
    for (let i = 0; i < 4; i++) this.u32();
  }
  u32(): number {
    let s = this.s;
    s ^= s >> 12n; s ^= (s << 25n) & 0xFFFFFFFFFFFFFFFFn; s ^= s >> 27n;
    this.s = s;
    return Number(((s * 0x2545F4914F6CDD1Dn) >> 32n) & 0xFFFFFFFFn);
  }
  /** 0 .. n-1 */
  below(n: number): number { return n <= 0 ? 0 : Math.floor((this.u32() / 2 ** 32) * n); }
  chance(p: number): boolean { return this.u32() / 2 ** 32 < p; }
  pick<T>(xs: readonly T[]): T { return xs[this.below(xs.length)]; }
}

const seedCache = new Map<number, SeedModel>();
const seedCount = architectures.length * weightTypes.length;

function seedFor(n: number): SeedModel {
  let s = seedCache.get(n);
  if (!s) {
    s = seedModel(architectures[Math.floor(n / weightTypes.length)],
      weightTypes[n % weightTypes.length], n);
    seedCache.set(n, s);
  }
  return s;
}

/** The integers that break readers: 0, 1, -1, 2^31, 2^32, 2^63 and their neighbours. */
const boundaries: bigint[] = [0n, 1n, 2n, 3n, 7n, 8n, 31n, 32n, 33n, 63n, 64n, 255n, 256n, 1023n,
  1024n, 1025n, 4095n, 4096n, 65535n, 65536n, 2n ** 24n, 2n ** 31n - 1n, 2n ** 31n, 2n ** 31n + 1n,
  2n ** 32n - 1n, 2n ** 32n, 2n ** 32n + 1n, 2n ** 53n, 2n ** 62n, 2n ** 63n - 1n, 2n ** 63n,
  2n ** 64n - 1n, 2n ** 64n - 2n];

const floats = [NaN, Infinity, -Infinity, 0, -0, 1e-45, 1e-38, 3.4e38, -1, 0.5, 12.8, 1e9, 1e30];

function boundary(rng: Rng, width: number): bigint {
  const b = rng.pick(boundaries);
  return b & ((1n << BigInt(8 * width)) - 1n);
}

function writeInt(bytes: Uint8Array, f: Field, v: bigint): void {
  if (f.at + f.width > bytes.length) return; // truncated away
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (f.width === 8) view.setBigUint64(f.at, v, true);
  else if (f.width === 4) view.setUint32(f.at, Number(v & 0xFFFFFFFFn), true);
  else if (f.width === 2) view.setUint16(f.at, Number(v & 0xFFFFn), true);
  else view.setUint8(f.at, Number(v & 0xFFn));
}

// ---- structural mutations ------------------------------------------------------------------

type Model = { metadata: [string, GgufTypedValue][]; tensors: GgufTensorToWrite[] };

/** A value of a random type, at a boundary of that type. */
function hostileValue(rng: Rng): GgufTypedValue {
  const b = rng.pick(boundaries);
  switch (rng.below(10)) {
    case 0: return { type: "u32", value: Number(b & 0xFFFFFFFFn) };
    case 1: return { type: "i32", value: Number(BigInt.asIntN(32, b)) };
    case 2: return { type: "u64", value: b & 0xFFFFFFFFFFFFFFFFn };
    case 3: return { type: "i64", value: BigInt.asIntN(64, b) };
    case 4: return { type: "f32", value: rng.pick(floats) };
    case 5: return { type: "f64", value: rng.pick(floats) };
    case 6: return { type: "bool", value: rng.chance(0.5) };
    case 7: return { type: "str", value: hostileString(rng) };
    case 8: return { type: "u8", value: Number(b & 0xFFn) };
    default: return { type: "arr", element: "u32", value: [1, 2, Number(b & 0xFFFFFFFFn)] };
  }
}

/** Chat templates that loop for minutes or refuse with long or odd text. */
const hostileTemplates = [
  "{% for i in range(4294967296) %}x{% endfor %}",
  "{% for a in range(30000) %}{% for b in range(30000) %}{% endfor %}{% endfor %}",
  "{{ raise_exception('\u001b[2J\u001b]0;pwned\u0007' + messages[0]['content']) }}",
  "{% set x = 'ab' %}{% for i in range(40) %}{% set x = x + x %}{% endfor %}{{ x }}",
  "{% for m in messages %}{{ m.content | upper }}{% endfor %}{{ undefined_thing.x.y }}",
  "{{ messages[99999]['content'] }}", "{% if %}", "{{ ' }}",
];

function hostileString(rng: Rng): string {
  switch (rng.below(6)) {
    case 5: return rng.pick(hostileTemplates);
    case 0: return "";
    case 1: return "\u001b[2J\u001b]0;title\u0007\r\n\u0000\u0085\u009b31m";
    case 2: return "x".repeat(1 + rng.below(1 << 20)); // up to 1 MiB
    case 3: return "\ud800\udfff\u2028é🙂".repeat(1 + rng.below(100));
    default: return rng.pick(["gemma3", "llama", "qwen2", "qwen3", "mamba", "gpt2", "llama3",
      "qwen2 ", "linear", "yarn", "none"]);
  }
}

function setValue(m: Model, key: string, v: GgufTypedValue): void {
  const i = m.metadata.findIndex(([k]) => k === key);
  if (i >= 0) m.metadata[i] = [key, v];
  else m.metadata.push([key, v]);
}

/** Keys a mutation is worth aiming at: the seed's own, and optional ones the loaders read. */
function keysOf(m: Model, arch: string): string[] {
  const optional = ["rope.scaling.type", "rope.scaling.factor", "attention.scale",
    "attention.sliding_window", "rope.dimension_count", "attention.key_length",
    "attention.value_length"].map((k) => `${arch}.${k}`);
  return [...m.metadata.map(([k]) => k), ...optional, "general.alignment",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.pre", "tokenizer.ggml.merges", "tokenizer.ggml.eot_token_id",
    "tokenizer.chat_template"];
}

/** Quiet NaN, infinities and huge values in the bit patterns of a tensor's type. */
function spoilData(rng: Rng, t: GgufTensorToWrite): string {
  const info = ggmlTypes.get(t.type)!;
  const data = t.data.slice();
  t.data = data;
  const view = new DataView(data.buffer);
  const f16 = rng.pick([0x7e00, 0x7c00, 0xfc00, 0x7bff, 0xffff]);
  const f32 = rng.pick([0x7fc00000, 0x7f800000, 0xff800000, 0x7f7fffff, 0xffffffff]);
  const all = rng.chance(0.3);
  const blocks = data.length / info.blockBytes;
  const count = all ? blocks : 1 + rng.below(Math.min(4, blocks));
  for (let k = 0; k < count; k++) {
    const b = all ? k : rng.below(blocks), o = b * info.blockBytes;
    switch (t.type) {
      case GgmlType.F32: view.setUint32(o, f32, true); break;
      case GgmlType.F16: view.setUint16(o, f16, true); break;
      case GgmlType.BF16: view.setUint16(o, f32 >>> 16, true); break;
      case GgmlType.Q6_K: view.setUint16(o + 208, f16, true); break; // d after the quants
      default: // Q4_0, Q5_0, Q8_0: d first; Q4_K, Q5_K: d, then dmin
        view.setUint16(o + (rng.chance(0.5) && t.type >= GgmlType.Q4_K ? 2 : 0), f16, true);
    }
  }
  return `${all ? "all" : count} ${info.name} value(s) of ${t.name} set to ` +
    `0x${(t.type === GgmlType.F32 ? f32 : f16).toString(16)}`;
}

function structural(rng: Rng, m: Model, arch: string): string {
  const keys = keysOf(m, arch);
  switch (rng.below(13)) {
    case 12: { // a chat template that loops for minutes, or breaks
      const t = rng.pick(hostileTemplates);
      setValue(m, "tokenizer.chat_template", gguf.str(t));
      return `chat template := ${t.slice(0, 40)}`;
    }
    case 0: case 1: case 2: { // a hyperparameter of any type, at a boundary
      const key = rng.pick(keys), v = hostileValue(rng);
      setValue(m, key, v);
      return `${key} := ${v.type} ${String(v.value).slice(0, 40)}`;
    }
    case 3: { // an integer hyperparameter at a boundary, its type kept
      const key = rng.pick(keys.filter((k) => k.startsWith(arch)));
      const b = rng.pick(boundaries);
      setValue(m, key, rng.chance(0.5) ? gguf.u32(Number(b & 0xFFFFFFFFn))
        : gguf.u64(b & 0xFFFFFFFFFFFFFFFFn));
      return `${key} := ${b}`;
    }
    case 4: { // a key removed
      const i = rng.below(m.metadata.length);
      const [key] = m.metadata.splice(i, 1)[0];
      return `removed ${key}`;
    }
    case 5: { // a key twice
      const [key, v] = rng.pick(m.metadata);
      const again: GgufTypedValue = rng.chance(0.5) ? v : hostileValue(rng);
      m.metadata.splice(rng.below(m.metadata.length), 0, [key, again]);
      return `duplicated ${key}`;
    }
    case 6: { // a huge string or array
      const key = rng.chance(0.5) ? rng.pick(keys) : `fuzz.${rng.below(100)}`;
      const size = 1 << (16 + rng.below(7));
      const big: GgufTypedValue = rng.chance(0.5) ? gguf.str("y".repeat(size))
        : { type: "arr", element: "u8", value: new Uint8Array(size) };
      setValue(m, key, big);
      return `${key} := huge ${big.type}`;
    }
    case 7: { // a vocabulary cut, padded, or with odd tokens
      const entry = m.metadata.find(([k]) => k === "tokenizer.ggml.tokens");
      if (!entry || entry[1].type !== "arr") return "tokens: none to change";
      const tokens = Array.from(entry[1].value as ArrayLike<string>);
      const what = rng.below(4);
      if (what === 0) tokens.length = rng.below(tokens.length);
      else if (what === 1) {
        tokens.push(...Array.from({ length: 1 + rng.below(50) }, (_, i) => `<x${i}>`));
      }
      else if (what === 2) tokens[rng.below(tokens.length)] = tokens[rng.below(tokens.length)];
      else tokens[rng.below(tokens.length)] = hostileString(rng);
      setValue(m, "tokenizer.ggml.tokens", gguf.strs(tokens));
      return `tokens: change ${what}, ${tokens.length} tokens`;
    }
    case 8: { // a tensor removed, or renamed to another's name or a long or odd one
      const i = rng.below(m.tensors.length), t = m.tensors[i];
      const how = rng.below(3);
      if (how === 0) m.tensors.splice(i, 1);
      else t.name = how === 1 ? rng.pick(m.tensors).name : hostileString(rng).slice(0, 200);
      const done = ["removed", "renamed to another's", "renamed"][how];
      return `tensor ${t.name.slice(0, 40)}: ${done}`;
    }
    case 9: { // a tensor's shape changed, its bytes kept where the type allows
      const t = rng.pick(m.tensors), info = ggmlTypes.get(t.type)!;
      const values = (t.data.length / info.blockBytes) * info.blockValues;
      const rows = [values / info.blockValues, 1, 2, values].filter((r) => values % r === 0);
      const r = rng.pick(rows);
      t.dims = rng.chance(0.5) ? [values / r, r] : [values];
      if (t.dims[0] % info.blockValues !== 0) t.dims = [values];
      return `${t.name} dims := [${t.dims}]`;
    }
    default: return spoilData(rng, rng.pick(m.tensors));
  }
}

// ---- byte mutations ------------------------------------------------------------------------

/** A byte mutation; `map` is the header as written (an earlier mutation may have broken it). */
function bytewise(rng: Rng, bytes: Uint8Array,
  map: HeaderMap): { bytes: Uint8Array; what: string } {
  const header = Math.min(map.headerEnd, bytes.length);
  switch (rng.below(9)) {
    case 0: { // bit flips, mostly in the header
      const n = 1 + rng.below(16);
      for (let i = 0; i < n; i++) {
        const at = rng.chance(0.8) ? rng.below(header) : rng.below(bytes.length);
        bytes[at] ^= 1 << rng.below(8);
      }
      return { bytes, what: `${n} bit flips` };
    }
    case 1: { // a run of random bytes
      const at = rng.chance(0.7) ? rng.below(header) : rng.below(bytes.length);
      const n = 1 + rng.below(32);
      for (let i = at; i < Math.min(bytes.length, at + n); i++) bytes[i] = rng.below(256);
      return { bytes, what: `${n} random bytes at ${at}` };
    }
    case 2: { // truncated
      const at = rng.chance(0.5) ? rng.below(header + 1) : rng.below(bytes.length);
      return { bytes: bytes.subarray(0, at), what: `truncated to ${at} bytes` };
    }
    case 3: case 4: { // a boundary integer in one header field
      const f = rng.pick(map.fields), v = boundary(rng, f.width);
      writeInt(bytes, f, v);
      return { bytes, what: `${f.kind} of ${f.owner.slice(0, 40) || "file"} := ${v}` };
    }
    case 5: { // a tensor's offset: onto another's, past the end, unaligned, huge
      const t = rng.pick(map.tensors), other = rng.pick(map.tensors);
      const view = new DataView(bytes.buffer, bytes.byteOffset);
      const otherOffset = other.offset.at + 8 <= bytes.length
        ? view.getBigUint64(other.offset.at, true) : 0n;
      const v = rng.pick([otherOffset, otherOffset + 32n, BigInt(bytes.length),
        BigInt(bytes.length - header), otherOffset + 1n, 2n ** 63n, boundary(rng, 8)]);
      writeInt(bytes, t.offset, v);
      return { bytes, what: `offset of ${t.name} := ${v}` };
    }
    case 6: { // two tensors' types swapped, or one set to another type id
      const a = rng.pick(map.tensors), b = rng.pick(map.tensors);
      const view = new DataView(bytes.buffer, bytes.byteOffset);
      if (Math.max(a.type.at, b.type.at) + 4 > bytes.length) return { bytes, what: "nothing" };
      const ta = view.getUint32(a.type.at, true), tb = view.getUint32(b.type.at, true);
      if (rng.chance(0.5)) {
        view.setUint32(a.type.at, tb, true);
        view.setUint32(b.type.at, ta, true);
        return { bytes, what: `types of ${a.name} and ${b.name} swapped` };
      }
      const id = rng.pick([...ggmlTypes.keys(), 1002, 1008, 1012, 40, 2 ** 31]);
      view.setUint32(a.type.at, id, true);
      return { bytes, what: `type of ${a.name} := ${id}` };
    }
    case 7: { // a tensor's dims swapped
      const t = rng.pick(map.tensors.filter((x) => x.dims.length > 1));
      if (!t || t.dims[1].at + 8 > bytes.length) return { bytes, what: "nothing" };
      const view = new DataView(bytes.buffer, bytes.byteOffset);
      const d0 = view.getBigUint64(t.dims[0].at, true), d1 = view.getBigUint64(t.dims[1].at, true);
      view.setBigUint64(t.dims[0].at, d1, true);
      view.setBigUint64(t.dims[1].at, d0, true);
      return { bytes, what: `dims of ${t.name} swapped` };
    }
    default: { // garbage appended
      const extra = new Uint8Array(1 + rng.below(4096));
      for (let i = 0; i < extra.length; i++) extra[i] = rng.below(256);
      const out = new Uint8Array(bytes.length + extra.length);
      out.set(bytes);
      out.set(extra, bytes.length);
      return { bytes: out, what: `${extra.length} bytes appended` };
    }
  }
}

export interface FuzzCase {
  readonly seed: string;
  readonly bytes: Uint8Array;
  /** What was done, one mutation a line. */
  readonly mutations: string[];
  /** Prompt and options for the token it generates. */
  readonly prompt: string;
  readonly greedy: boolean;
  readonly contextLength?: number;
}

export function fuzzCase(runSeed: number, index: number): FuzzCase {
  const rng = new Rng(runSeed, index);
  const seed = seedFor(rng.below(seedCount));
  const m: Model = {
    metadata: seed.metadata.map(([k, v]) => [k, v]),
    tensors: seed.tensors.map((t) => ({ ...t, dims: [...t.dims] })),
  };
  const mutations: string[] = [];
  const n = 1 + (rng.chance(0.3) ? rng.below(3) : 0);
  const structuralOnes = Array.from({ length: n }, () => rng.chance(0.5));
  for (const s of structuralOnes) if (s) mutations.push(structural(rng, m, seed.architecture));
  let bytes: Uint8Array;
  try {
    bytes = writeGguf(m.metadata, m.tensors, { alignment: 32 }).slice();
  } catch (err) { // the writer refuses a shape its data does not fill: keep the seed's
    mutations.push(`(writer: ${(err as Error).message.slice(0, 60)}; the seed kept)`);
    bytes = writeGguf(seed.metadata, seed.tensors).slice();
  }
  const map = headerMap(bytes);
  for (const s of structuralOnes) {
    if (s) continue;
    const r = bytewise(rng, bytes, map);
    bytes = r.bytes;
    mutations.push(r.what);
  }
  return {
    seed: seed.name, bytes, mutations,
    prompt: rng.pick(["the cat sat", "a", "<start_of_turn>user\nhi", "\u0000\u001b é🙂", ""]),
    greedy: rng.chance(0.5),
    contextLength: rng.chance(0.1) ? rng.pick([1, 2, 8, 1 << 20, 1 << 30]) : undefined,
  };
}
