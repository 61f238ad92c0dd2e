// Streams a GGUF to disk: the header first (every tensor's type and shape is known up front),
// then each tensor's data as it is produced, so that converting a large model never holds more
// than one tensor. The file is written beside its destination and renamed into place at the
// end, so a failed run leaves no half-written model behind.
import { accessSync, closeSync, constants, openSync, renameSync, rmSync, statSync, writeSync,
  type Stats } from "node:fs";
import { dirname, resolve } from "node:path";
import { InferError, quote } from "../errors.ts";
import { ggufLayout, type GgufTypedValue } from "../gguf/writer.ts";
import type { Progress } from "./progress.ts";

export interface TensorToProduce {
  readonly name: string;
  readonly type: number;
  readonly dims: number[];
  /** The tensor's bytes in `type`; called once, in order. */
  produce(): Uint8Array;
}

/**
 * Fails before any work when `path` cannot become the output: a folder, something other than a
 * file (a device, a FIFO: renaming over it would replace it), one of `inputs` (the same file by
 * another name included), or in a folder that does not exist or cannot be written.
 */
export function checkOutputPath(path: string, inputs: readonly string[] = []): void {
  const shown = quote(path);
  const existing = statOrNull(path);
  if (existing?.isDirectory()) {
    throw new InferError("invalid_argument", `the output ${shown} is a folder; give a file ` +
      "path, e.g. FOLDER/model.gguf");
  }
  if (existing && !existing.isFile()) {
    throw new InferError("invalid_argument", `the output ${shown} exists and is not a file`);
  }
  for (const input of inputs) {
    const s = statOrNull(input);
    const same = resolve(input) === resolve(path)
      || (existing !== null && s !== null && s.dev === existing.dev && s.ino === existing.ino);
    if (same) {
      throw new InferError("invalid_argument", `the output ${shown} is the input; write to ` +
        "another file");
    }
  }
  const folder = dirname(resolve(path));
  const parent = statOrNull(folder);
  if (!parent?.isDirectory()) {
    throw new InferError("io", `cannot write ${shown}: the folder ${quote(folder)} does not ` +
      "exist");
  }
  try {
    accessSync(folder, constants.W_OK);
  } catch (err) {
    throw new InferError("io", `cannot write ${shown}: the folder ${quote(folder)} is not ` +
      `writable (${(err as NodeJS.ErrnoException).code ?? "error"})`);
  }
}

function statOrNull(path: string): Stats | null {
  try {
    return statSync(path);
  } catch {
    return null;
  }
}

export function writeGgufFile(path: string, metadata: ReadonlyArray<readonly [string,
  GgufTypedValue]>,
  tensors: readonly TensorToProduce[], options: {
    alignment?: number; progress?: Progress } = {}): number {
  const layout = ggufLayout(metadata, tensors, { alignment: options.alignment });
  const partial = `${path}.part`;
  let fd: number;
  try {
    fd = openSync(partial, "w");
  } catch (err) {
    throw new InferError("io", `cannot write ${quote(path)}: ${(err as Error).message}`);
  }
  let bytes = 0;
  try {
    bytes += writeAll(fd, layout.header);
    tensors.forEach((t, i) => {
      options.progress?.(i, tensors.length, t.name);
      const data = t.produce();
      if (data.length !== layout.dataBytes[i]) {
        throw new InferError("internal", `tensor '${t.name}': produced ${data.length} bytes, ` +
          `its type and shape need ${layout.dataBytes[i]}`);
      }
      bytes += writeAll(fd, data);
      bytes += writeAll(fd, new Uint8Array(layout.paddingBytes[i]));
    });
    options.progress?.(tensors.length, tensors.length, "done");
    closeSync(fd);
    renameSync(partial, path);
  } catch (err) {
    try { closeSync(fd); } catch { /* already closed */ }
    rmSync(partial, { force: true });
    throw err;
  }
  return bytes;
}

function writeAll(fd: number, data: Uint8Array): number {
  let at = 0;
  while (at < data.length) at += writeSync(fd, data, at, data.length - at);
  return data.length;
}
