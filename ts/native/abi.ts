// The C structs of the ABI (lib/abi.zig), packed field by field from the layouts gen-symbols.ts
// writes into symbols.gen.ts: a call that takes a struct gets the Uint8Array of its bytes, passed
// as the argument itself (so it cannot move while the library reads it). Fields go by their Zig
// names; a field with a default in the Zig struct may be left out.
import { InferError } from "../errors.ts";
import { structs } from "./symbols.gen.ts";

export type StructName = keyof typeof structs;
type Fields<N extends StructName> = (typeof structs)[N]["fields"];
type ValueOf<F> = F extends { length: number } ? Uint8Array : F extends { type: "bool" } ? boolean : number;
type Defaulted<N extends StructName> =
  { [K in keyof Fields<N>]: Fields<N>[K] extends { value: unknown } ? K : never }[keyof Fields<N>];
/** A struct's field values by name: the fields without a default in lib/abi.zig required. */
export type StructValues<N extends StructName> =
  & { -readonly [K in Exclude<keyof Fields<N>, Defaulted<N>>]: ValueOf<Fields<N>[K]> }
  & { -readonly [K in Defaulted<N>]?: ValueOf<Fields<N>[K]> };

interface FieldLayout {
  readonly name: string;
  readonly type: string;
  readonly offset: number;
  readonly length?: number;
  readonly value?: number | boolean;
}

/** Each struct's fields as a list, in declaration order (the packer's loop). */
const layouts = new Map<string, readonly FieldLayout[]>(Object.entries(structs).map(([name, s]) =>
  [name, Object.entries(s.fields).map(([field, f]) => ({ name: field, ...(f as Omit<FieldLayout, "name">) }))]));

const TWO_32 = 2 ** 32;

function put(view: DataView, f: FieldLayout, v: number | boolean, struct: string): void {
  const o = f.offset;
  if (f.type === "bool") {
    view.setUint8(o, v ? 1 : 0);
    return;
  }
  if (typeof v !== "number" || !Number.isFinite(v)) {
    throw new InferError("internal", `${struct}.${f.name} is ${String(v)}`);
  }
  switch (f.type) {
    case "f32": view.setFloat32(o, v, true); return;
    case "f64": view.setFloat64(o, v, true); return;
    case "u8": view.setUint8(o, v); return;
    case "i8": view.setInt8(o, v); return;
    case "u16": view.setUint16(o, v, true); return;
    case "i16": view.setInt16(o, v, true); return;
    case "u32": view.setUint32(o, v, true); return;
    case "i32": view.setInt32(o, v, true); return;
    case "u64":
      if (v < 0 || !Number.isSafeInteger(v)) throw new InferError("internal", `${struct}.${f.name} is ${v}`);
      view.setUint32(o, v % TWO_32, true);
      view.setUint32(o + 4, Math.floor(v / TWO_32), true);
      return;
    case "i64": view.setBigInt64(o, BigInt(v), true); return;
    default: throw new InferError("internal", `${struct}.${f.name}: no packing for ${f.type}`);
  }
}

/** The bytes of struct `name` with `values` (into `into`, reused, when given; else a new array). */
export function packStruct<N extends StructName>(name: N, values: StructValues<N>,
  into: Uint8Array = new Uint8Array(structs[name].size)): Uint8Array {
  const fields = layouts.get(name)!;
  const view = new DataView(into.buffer, into.byteOffset, into.byteLength);
  const given = values as Record<string, number | boolean | Uint8Array | undefined>;
  for (const f of fields) {
    const v = given[f.name];
    if (f.length !== undefined) {
      const bytes = (v ?? new Uint8Array(0)) as Uint8Array;
      if (bytes.length > f.length) throw new InferError("invalid_argument", `${name}.${f.name}: ${bytes.length} bytes`);
      into.fill(0, f.offset, f.offset + f.length);
      into.set(bytes, f.offset);
      continue;
    }
    if (v === undefined && f.value === undefined) throw new InferError("internal", `${name}.${f.name} is missing`);
    put(view, f, (v ?? f.value) as number | boolean, name);
  }
  return into;
}

const reused = new Map<string, Uint8Array>();

/**
 * packStruct into a buffer kept for struct `name`: for a call made at once (calls are synchronous
 * and the library does not keep the pointer), without an allocation per call. The bytes are good
 * until the next packed() of the same struct.
 */
export function packed<N extends StructName>(name: N, values: StructValues<N>): Uint8Array {
  let into = reused.get(name);
  if (!into) reused.set(name, into = new Uint8Array(structs[name].size));
  return packStruct(name, values, into);
}

/** A struct's default values (lib/abi.zig), by field: what the library holds until told otherwise. */
export function structDefaults(name: StructName): Record<string, number | boolean> {
  const out: Record<string, number | boolean> = {};
  for (const f of layouts.get(name)!) if (f.value !== undefined) out[f.name] = f.value;
  return out;
}
