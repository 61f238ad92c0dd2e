// Where every number of a valid GGUF header sits: counts, lengths, value and element types,
// scalar values, tensor dimensions, types and offsets, so that a mutation can write a boundary
// value into exactly one field of the width the reader reads it at. Walks a file the fuzzer
// wrote itself (no validation: the seeds are valid).

export type FieldKind =
  | "tensor count" | "metadata count" | "key length" | "value type" | "value" | "string length"
  | "element type" | "array count" | "name length" | "dimension count" | "dimension"
  | "tensor type" | "offset";

export interface Field {
  readonly kind: FieldKind;
  readonly at: number;
  /** Bytes: 1, 2, 4 or 8. */
  readonly width: number;
  /** The metadata key or tensor name it belongs to. */
  readonly owner: string;
}

export interface HeaderMap {
  readonly fields: Field[];
  /** Each tensor's info: name, the positions of its type and offset fields, its dims' fields. */
  readonly tensors: { name: string; type: Field; offset: Field; dims: Field[] }[];
  /** Where the header (and its padding) ends: the data section begins. */
  readonly headerEnd: number;
}

const scalarWidth = [1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8];
const STR = 8, ARR = 9;

export function headerMap(bytes: Uint8Array): HeaderMap {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const fields: Field[] = [];
  let pos = 8;
  const field = (kind: FieldKind, width: number, owner: string): Field => {
    const f = { kind, at: pos, width, owner };
    fields.push(f);
    pos += width;
    return f;
  };
  const u64 = (at: number) => Number(view.getBigUint64(at, true));
  const text = (owner: string, kind: FieldKind): string => {
    const len = u64(pos);
    field(kind, 8, owner);
    const s = new TextDecoder().decode(bytes.subarray(pos, pos + len));
    pos += len;
    return s;
  };
  const value = (type: number, owner: string, depth: number): void => {
    if (type === STR) {
      text(owner, "string length");
      return;
    }
    if (type === ARR) {
      const element = view.getUint32(pos, true);
      field("element type", 4, owner);
      const count = u64(pos);
      field("array count", 8, owner);
      // Long arrays (a vocabulary) add their first few elements' fields only.
      for (let i = 0; i < count; i++) {
        if (i < 4 && depth < 2) value(element, owner, depth + 1);
        else if (element === STR) pos += 8 + u64(pos);
        else if (element === ARR) value(element, owner, depth + 1);
        else pos += scalarWidth[element];
      }
      return;
    }
    field("value", scalarWidth[type], owner);
  };
  const tensorCount = u64(pos);
  field("tensor count", 8, "");
  const kvCount = u64(pos);
  field("metadata count", 8, "");
  let alignment = 32;
  for (let i = 0; i < kvCount; i++) {
    const key = text("", "key length");
    const type = view.getUint32(pos, true);
    field("value type", 4, key);
    // (A mutated alignment of another type or value leaves the reader's default.)
    const U32 = 4;
    if (key === "general.alignment" && type === U32 && view.getUint32(pos, true) % 8 === 0 &&
      view.getUint32(pos, true) > 0) alignment = view.getUint32(pos, true);
    value(type, key, 0);
  }
  const tensors: HeaderMap["tensors"] = [];
  for (let i = 0; i < tensorCount; i++) {
    const name = text("", "name length");
    const nDims = view.getUint32(pos, true);
    field("dimension count", 4, name);
    const dims: Field[] = [];
    for (let d = 0; d < nDims; d++) dims.push(field("dimension", 8, name));
    const type = field("tensor type", 4, name);
    const offset = field("offset", 8, name);
    tensors.push({ name, type, offset, dims });
  }
  return { fields, tensors, headerEnd: Math.ceil(pos / alignment) * alignment };
}
