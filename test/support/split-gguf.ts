// Splits a GGUF as llama.cpp's gguf-split --split-max-tensors does: the first part holds all the
// metadata, every part holds split.no (u16), split.count (u16) and split.tensors.count (i32) and
// its share of the tensors, in order, named <prefix>-00001-of-0000N.gguf.
import { typedMetadata } from "../../ts/convert/gguf-metadata.ts";
import { writeGgufFile } from "../../ts/convert/gguf-out.ts";
import { openGguf, splitPartPath } from "../../ts/gguf/reader.ts";
import type { GgufTypedValue } from "../../ts/gguf/writer.ts";

/** Writes `input` as `count` parts beside `prefix`; returns their paths in order. */
export function splitGguf(input: string, prefix: string, count: number): string[] {
  const file = openGguf(input);
  try {
    const tensors = [...file.tensors.values()].sort((a, b) => a.fileOffset - b.fileOffset);
    const perPart = Math.ceil(tensors.length / count);
    const metadata = typedMetadata(file.bytes, input).filter(([k]) => !k.startsWith("split."));
    const paths: string[] = [];
    for (let i = 0; i < count; i++) {
      const split: [string, GgufTypedValue][] = [
        ["split.no", { type: "u16", value: i }],
        ["split.count", { type: "u16", value: count }],
        ["split.tensors.count", { type: "i32", value: tensors.length }],
      ];
      const path = splitPartPath(prefix, i, count);
      const mine = tensors.slice(i * perPart, (i + 1) * perPart).map((t) => ({
        name: t.name, type: t.type.id, dims: [...t.dims], produce: () => file.tensorBytes(t),
      }));
      // a part's tensors are laid out at the alignment its own header gives
      const alignment = metadata.filter(([k]) => k === "general.alignment");
      writeGgufFile(path, i === 0 ? [...metadata, ...split] : [...split, ...alignment], mine,
        { alignment: file.alignment });
      paths.push(path);
    }
    return paths;
  } finally {
    file.close();
  }
}
