// A GGUF's metadata with its value types, for re-writing a file (quantize): the reader keeps
// values as JavaScript numbers, which lose the difference between u32, i32 and f32. The file has
// already been validated by parseGguf, so this walk only records types.
import { InferError } from "../errors.ts";
import type { GgufTypedValue } from "../gguf/writer.ts";

const SCALARS = ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64",
  "f64"] as const;
type Scalar = Exclude<(typeof SCALARS)[number], "arr">;
const SIZES: Record<string, number> = { u8: 1, i8: 1, u16: 2, i16: 2, u32: 4, i32: 4, f32: 4,
  bool: 1, u64: 8, i64: 8, f64: 8 };

export function typedMetadata(bytes: Uint8Array, where: string): [string, GgufTypedValue][] {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const text = new TextDecoder("utf-8", { ignoreBOM: true });
  let pos = 24; // after magic, version, tensor count and metadata count
  const u32 = () => { const v = view.getUint32(pos, true); pos += 4; return v; };
  const u64 = () => { const v = Number(view.getBigUint64(pos, true)); pos += 8; return v; };
  const str = () => { const n = u64(); const s = text.decode(bytes.subarray(pos,
    pos + n)); pos += n; return s; };
  const scalar = (type: Scalar): number | bigint | boolean | string => {
    const at = pos;
    if (type === "str") return str();
    pos += SIZES[type];
    switch (type) {
      case "u8": return view.getUint8(at);
      case "i8": return view.getInt8(at);
      case "u16": return view.getUint16(at, true);
      case "i16": return view.getInt16(at, true);
      case "u32": return view.getUint32(at, true);
      case "i32": return view.getInt32(at, true);
      case "f32": return view.getFloat32(at, true);
      case "bool": return view.getUint8(at) !== 0;
      case "u64": return view.getBigUint64(at, true);
      case "i64": return view.getBigInt64(at, true);
      case "f64": return view.getFloat64(at, true);
    }
  };
  const count = Number(view.getBigUint64(16, true));
  const out: [string, GgufTypedValue][] = [];
  for (let i = 0; i < count; i++) {
    const key = str();
    const type = SCALARS[u32()];
    if (type !== "arr") {
      out.push([key, { type, value: scalar(type) } as GgufTypedValue]);
      continue;
    }
    const element = SCALARS[u32()];
    if (element === "arr") throw new InferError("unsupported",
      `${where}: nested array in '${key}' cannot be copied`);
    const n = u64();
    const values = new Array(n);
    for (let j = 0; j < n; j++) values[j] = scalar(element);
    out.push([key, { type: "arr", element, value: values }]);
  }
  return out;
}
