// Each rank's part of a model as a GGUF of its own, its tensors cut from the mapped file by the
// sharding plan's copies (copySlice, the host twin of the cuMemcpy2D a GPU rank uploads with):
// what the CPU ranks of the tensor-parallel test load.
import type { GgufFile } from "../../ts/gguf/reader.ts";
import { gguf, writeGguf } from "../../ts/gguf/writer.ts";
import { copySlice, rankTensors, type RankShape } from "../../ts/model/tensor-parallel.ts";
import type { ModelShape } from "../../ts/model/model.ts";

/**
 * `contiguousColumns` cuts column slices as if they were contiguous (a wrong plan), so a test
 * can show that its comparison catches a bad slice.
 */
export function rankGguf(file: GgufFile, shape: ModelShape, rank: RankShape,
  contiguousColumns = false): Uint8Array {
  const tensors = rankTensors(file.tensors, shape, rank).map((p) => {
    const source = file.tensors.get(p.source)!;
    const c = p.copy, wrong = contiguousColumns && c.rows > 1;
    const copy = wrong ? { offset: rank.rank * c.bytes * c.rows, bytes: c.bytes * c.rows,
      pitch: c.bytes * c.rows, rows: 1 } : c;
    return { name: p.name, type: source.type.id, dims: [...p.dims],
      data: copySlice(file.tensorBytes(source), copy) };
  });
  return writeGguf([["general.architecture", gguf.str(shape.architecture)]], tensors);
}
