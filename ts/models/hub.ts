// Pulling a model from the Hugging Face Hub, speaking its HTTP API as huggingface_hub does:
// the tree API (GET {endpoint}/api/models/{repo}/tree/{revision}?recursive=true, paged by Link
// headers) lists a repo's files when a quantization is to be picked; for each file a HEAD of
// {endpoint}/{repo}/resolve/{revision}/{path}, redirects not followed, gives the download URL
// (the 302's Location, a CDN for LFS files), the size (x-linked-size), the SHA-256 the Hub
// publishes (x-linked-etag) and the commit (x-repo-commit); the file comes by a resumable GET
// (./download.ts) into models/<repo>/<path> and lands only once its SHA-256 is right. A split
// model's parts all come. HF_TOKEN goes as a Bearer token to the Hub, never to the CDN.
import { readFileSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { setting } from "../config/env.ts";
import { InferError, quote } from "../errors.ts";
import { SPLIT_PART_NAME } from "../gguf/reader.ts";
import {
  cachedHubFile, modelFilesOf, modelsDir, readSource, sourceRecordPath, type HubSource,
} from "./cache.ts";
import {
  getResumable, makeFolder, PartialFile, stderrProgress, writeWhole, type DownloadProgress,
} from "./download.ts";
import { hubRefText, parseHubRef, pickHubFile, type HubRef } from "./hub-ref.ts";

export interface PullOptions {
  /** Download progress; by default stderrProgress (a bar on a terminal, else a line per 10%). */
  readonly onProgress?: DownloadProgress;
  /** Told which file was picked when no quantization was asked for (default: stderr). */
  readonly onNote?: (line: string) => void;
  /** The Hub (default HF_ENDPOINT, https://huggingface.co). */
  readonly endpoint?: string;
  /** An access token (default HF_TOKEN). */
  readonly token?: string | null;
  readonly revision?: string;
  /** A download that brings no byte for this long is cut and resumed (default 30 s). */
  readonly stallMs?: number;
}

interface RemoteFile {
  readonly path: string;
  readonly url: string;
  readonly bytes: number;
  readonly sha256: string | null;
  readonly commit: string | null;
}

interface Hub {
  readonly endpoint: string;
  readonly token: string | null;
  readonly revision: string;
  readonly stallMs?: number;
}

/**
 * The access token as huggingface_hub finds it: HF_TOKEN, else the file `hf auth login` wrote
 * (HF_TOKEN_PATH, default $HF_HOME/token), else none.
 */
export function hubToken(): string | null {
  const fromEnv = setting("HF_TOKEN");
  if (fromEnv !== null) return fromEnv.trim();
  const file = setting("HF_TOKEN_PATH") ?? join(setting("HF_HOME"), "token");
  try {
    const token = readFileSync(file, "utf8").trim();
    return token === "" ? null : token;
  } catch {
    return null; // no file: no token, as huggingface_hub has it
  }
}

function hubOf(options: PullOptions): Hub {
  return {
    endpoint: (options.endpoint ?? setting("HF_ENDPOINT")).replace(/\/+$/, ""),
    token: options.token === undefined ? hubToken() : options.token,
    revision: options.revision ?? "main",
    stallMs: options.stallMs,
  };
}

function authHeaders(hub: Hub): Record<string, string> {
  return hub.token ? { authorization: `Bearer ${hub.token}` } : {};
}

async function hubFetch(hub: Hub, url: string, init: RequestInit = {}): Promise<Response> {
  try {
    return await fetch(url, { ...init, headers: { ...authHeaders(hub), ...init.headers } });
  } catch (err) {
    throw new InferError("io", `cannot reach the Hub at ${hub.endpoint}: ` +
      `${(err as Error).message} (HF_ENDPOINT names another)`);
  }
}

/** The error for a Hub answer that is not a success, in one line. */
async function hubError(hub: Hub, response: Response, repo: string, path: string | null,
): Promise<InferError> {
  const code = response.headers.get("x-error-code");
  let said = response.headers.get("x-error-message") ?? "";
  if (!said && response.body) said = (await response.text().catch(() => "")).split("\n")[0];
  const hubSays = said ? ` (the Hub says: ${quote(said, 160)})` : "";
  const what = path === null ? repo : `${repo}/${path}`;
  switch (response.status) {
    case 401:
      return new InferError("io", hub.token
        ? `the Hub refused HF_TOKEN for ${repo}: it is gated or private and this token cannot ` +
          `read it, or it does not exist${hubSays}`
        : `${repo} needs a token: it is gated or private (or does not exist); set HF_TOKEN to ` +
          `an access token that can read it${hubSays}`);
    case 403:
      return new InferError("io", `${repo} is gated and this token's account has no access ` +
        `yet: ask for it on ${hub.endpoint}/${repo}${hubSays}`);
    case 404:
      if (code === "RevisionNotFound") {
        return new InferError("io", `${repo} has no revision ${quote(hub.revision, 60)}`);
      }
      if (code === "EntryNotFound" || (path !== null && code !== "RepoNotFound")) {
        return new InferError("io", `${repo} has no file ${quote(path ?? "", 120)} at ` +
          `${quote(hub.revision, 60)}`);
      }
      return new InferError("io", `no model repository ${repo} on ${hub.endpoint}`);
    default:
      return new InferError("io", `${what}: HTTP ${response.status} from ${hub.endpoint}` +
        hubSays);
  }
}

const encodePath = (path: string) => path.split("/").map(encodeURIComponent).join("/");

/** The paths of the repo's files (the tree API, every page). */
async function listRepo(hub: Hub, repo: string): Promise<string[]> {
  let url: string | null = `${hub.endpoint}/api/models/${repo}/tree/` +
    `${encodeURIComponent(hub.revision)}?recursive=true`;
  const paths: string[] = [];
  for (let page = 0; url !== null && page < 1000; page++) {
    const response = await hubFetch(hub, url, { headers: { accept: "application/json" } });
    if (!response.ok) throw await hubError(hub, response, repo, null);
    let entries: unknown;
    try {
      entries = await response.json();
    } catch {
      throw new InferError("io", `${url} did not answer JSON`);
    }
    if (!Array.isArray(entries)) throw new InferError("io", `${url} did not answer a file list`);
    for (const e of entries as { type?: string; path?: unknown }[]) {
      if (e.type === "file" && typeof e.path === "string") paths.push(e.path);
    }
    const next = /<([^>]+)>;\s*rel="next"/.exec(response.headers.get("link") ?? "");
    url = next ? new URL(next[1], url).href : null;
  }
  return paths;
}

function unquoteEtag(etag: string | null): string | null {
  return etag === null ? null : etag.replace(/^W\//, "").replace(/^"|"$/g, "");
}

/** Where `path` downloads from, its size, SHA-256 and commit: a HEAD of its resolve URL. */
async function remoteFile(hub: Hub, repo: string, path: string): Promise<RemoteFile> {
  let url = `${hub.endpoint}/${repo}/resolve/${encodeURIComponent(hub.revision)}/` +
    encodePath(path);
  let response = await hubFetch(hub, url, { method: "HEAD", redirect: "manual" });
  // a redirect on the Hub itself without a linked file is a renamed repo: followed
  for (let hop = 0; hop < 5 && response.status >= 301 && response.status <= 308 &&
    !response.headers.has("x-linked-etag"); hop++) {
    const next = new URL(response.headers.get("location") ?? "", url);
    if (next.origin !== new URL(hub.endpoint).origin) break;
    url = next.href;
    response = await hubFetch(hub, url, { method: "HEAD", redirect: "manual" });
  }
  const redirected = response.status >= 301 && response.status <= 308;
  if (!response.ok && !redirected) throw await hubError(hub, response, repo, path);
  const h = response.headers;
  const linked = unquoteEtag(h.get("x-linked-etag"));
  const etag = unquoteEtag(h.get("etag"));
  const sha256 = linked ?? (etag && /^[0-9a-f]{64}$/i.test(etag) ? etag : null);
  const bytes = Number(h.get("x-linked-size") ?? h.get("content-length") ?? NaN);
  if (!Number.isSafeInteger(bytes) || bytes <= 0) {
    throw new InferError("io", `${repo}/${path}: the Hub gave no size for it`);
  }
  const location = redirected ? h.get("location") : null;
  return { path, url: location ? new URL(location, url).href : url, bytes, sha256,
    commit: h.get("x-repo-commit") };
}

/** The file in the repo that `ref` names or picks (listing the repo for a quantization). */
async function chooseFile(hub: Hub, ref: HubRef, note: (line: string) => void): Promise<string> {
  if (ref.file !== null) return ref.file;
  const { file, chosen } = pickHubFile(ref, await listRepo(hub, ref.repo));
  if (chosen) note(`${ref.repo}: ${chosen}`);
  return file;
}

const inFlight = new Map<string, Promise<string>>();

/**
 * Pulls `ref` (a Hub reference or its text) into the cache and returns its (first) file's
 * path. What is cached already with the SHA-256 the Hub gives now is not fetched again.
 */
export function pullModel(ref: HubRef | string, options: PullOptions = {}): Promise<string> {
  const parsed = typeof ref === "string" ? parseHubRef(ref) : ref;
  if (parsed === null) {
    return Promise.reject(new InferError("invalid_argument", `${quote(String(ref))} is not a ` +
      "Hub model: give org/repo, org/repo:QUANT or org/repo/path/file.gguf"));
  }
  const key = `${hubRefText(parsed)}@${options.revision ?? "main"}`;
  let pending = inFlight.get(key);
  if (!pending) {
    pending = pull(parsed, options).finally(() => inFlight.delete(key));
    inFlight.set(key, pending);
  }
  return pending;
}

/** The cached file of `ref` when there is one (no network), else pullModel's. */
export function ensureHubModel(ref: HubRef, options: PullOptions = {}): Promise<string> {
  const cached = cachedHubFile(ref);
  return cached ? Promise.resolve(cached) : pullModel(ref, options);
}

async function pull(ref: HubRef, options: PullOptions): Promise<string> {
  const hub = hubOf(options);
  const note = options.onNote ?? ((line: string) => process.stderr.write(`${line}\n`));
  const file = await chooseFile(hub, ref, note);
  const split = SPLIT_PART_NAME.exec(file);
  if (split && Number(split[2]) !== 1) {
    throw new InferError("invalid_argument", `${ref.repo}/${file} is one part of a split ` +
      `model: give its first part, ${file.replace(/-\d{5}-of-/, "-00001-of-")}`);
  }
  const remote: RemoteFile[] = [];
  for (const path of modelFilesOf(file)) remote.push(await remoteFile(hub, ref.repo, path));
  const targets = remote.map((r) => join(modelsDir(), ref.repo, r.path));
  const current = (r: RemoteFile, target: string) => {
    const source = readSource(target);
    return source !== null && source.sha256 === r.sha256 && fileSize(target) === r.bytes;
  };
  if (remote.every((r, i) => current(r, targets[i]))) {
    note(`${ref.repo}/${file}: the cached copy is the Hub's (${hub.revision})`);
    return targets[0];
  }
  const totalBytes = remote.reduce((sum, r) => sum + r.bytes, 0);
  const report = options.onProgress ?? stderrProgress(`${ref.repo}/${file}`);
  let doneBytes = 0;
  for (const [i, r] of remote.entries()) {
    if (!current(r, targets[i])) {
      await download(hub, ref.repo, r, targets[i], (n) => report(doneBytes + n, totalBytes));
    }
    doneBytes += r.bytes;
  }
  report(totalBytes, totalBytes);
  return targets[0];
}

function fileSize(path: string): number {
  try {
    return statSync(path).size;
  } catch {
    return -1;
  }
}

/** One file into `target`, resumed from its partial, with its source record beside it. */
async function download(hub: Hub, repo: string, r: RemoteFile, target: string,
  onBytes: (bytesNow: number) => void): Promise<void> {
  makeFolder(dirname(target));
  const partial = PartialFile.resume(target);
  const sameOrigin = new URL(r.url).origin === new URL(hub.endpoint).origin;
  try {
    await getResumable(partial, {
      url: r.url, headers: sameOrigin ? authHeaders(hub) : {}, totalBytes: r.bytes, onBytes,
      what: `${repo}/${r.path}`, stallMs: hub.stallMs,
    });
  } catch (err) {
    partial.close(); // kept: the same command resumes it
    throw err;
  }
  partial.land(r.sha256, `${repo}/${r.path} from ${hub.endpoint}`, () => {
    const source: HubSource = { endpoint: hub.endpoint, repo, revision: hub.revision,
      commit: r.commit, path: r.path, sha256: r.sha256, bytes: r.bytes };
    writeWhole(sourceRecordPath(target), JSON.stringify(source, null, 2) + "\n");
  });
}
