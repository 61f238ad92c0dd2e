// Reading request bodies, bounded three ways: each body in bytes (413), each body in time (408:
// a client that stops sending mid-body would otherwise hold its connection and its bytes
// forever), and all bodies being received at once in bytes (503): without that, a few hundred
// connections that each send most of a large body and wait hold hundreds of MiB between them.
// A body is counted against the shared budget for its declared length as soon as its headers
// arrive (so a stall at 99% was paid for up front), and for what actually arrives otherwise.
import { ApiError } from "./protocol.ts";

export interface BodyLimits {
  /** Bytes of one body at most. */
  readonly maxBytes: number;
  /** Bytes of all the bodies being received at once, at most. */
  readonly maxBytesInFlight: number;
  /** Time to receive one body, from its headers to its last byte. */
  readonly timeoutMs: number;
}

export class BodyReader {
  private inFlight = 0;

  constructor(private readonly limits: BodyLimits) {}

  /** Bytes of bodies being received now. */
  get bytesInFlight(): number {
    return this.inFlight;
  }

  /** The body's bytes, whole, or an ApiError: 413, 408, 503 (the budget), 400 (bad length). */
  async read(req: Request): Promise<Uint8Array> {
    const { maxBytes, timeoutMs } = this.limits;
    const declared = declaredLength(req);
    if (declared !== null && declared > maxBytes) throw tooLarge(maxBytes);
    let reserved = 0;
    const reserve = (bytes: number) => {
      if (this.inFlight + bytes - reserved > this.limits.maxBytesInFlight) {
        throw new ApiError(503, "the server is receiving too many request bodies at once; " +
          "retry shortly", null, "server_busy");
      }
      this.inFlight += bytes - reserved;
      reserved = bytes;
    };
    const body = req.body;
    if (body === null) return new Uint8Array(0);
    const reader = body.getReader();
    let timer: Timer | undefined;
    const expired = new Promise<"expired">((resolve) => {
      timer = setTimeout(() => resolve("expired"), timeoutMs);
    });
    try {
      if (declared !== null) reserve(declared);
      const chunks: Uint8Array[] = [];
      let size = 0;
      for (;;) {
        const next = await Promise.race([reader.read(), expired]);
        if (next === "expired") {
          throw new ApiError(408, `the request body did not arrive within ${timeoutMs / 1000} s`,
            null, "request_timeout");
        }
        if (next.done) break;
        size += next.value.byteLength;
        if (size > maxBytes) throw tooLarge(maxBytes);
        if (size > reserved) reserve(size);
        chunks.push(next.value);
      }
      return Buffer.concat(chunks);
    } catch (err) {
      reader.cancel().catch(() => {});
      throw err;
    } finally {
      clearTimeout(timer);
      this.inFlight -= reserved;
    }
  }
}

const tooLarge = (maxBytes: number) =>
  new ApiError(413, `the request body is larger than ${maxBytes} bytes`, null,
    "request_too_large");

function declaredLength(req: Request): number | null {
  const text = req.headers.get("content-length");
  if (text === null) return null;
  if (!/^\d{1,16}$/.test(text.trim())) {
    throw new ApiError(400, "the Content-Length header is not a number", null, "invalid_header");
  }
  return Number(text.trim());
}

/** Whether a request announces a body (which must then be read, or the connection closed). */
export function hasBody(req: Request): boolean {
  const length = req.headers.get("content-length");
  return req.headers.has("transfer-encoding") || (length !== null && length.trim() !== "0");
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** A body's text: UTF-8 (as JSON must be), or 400. */
export function bodyText(bytes: Uint8Array): string {
  try {
    return utf8.decode(bytes);
  } catch {
    throw new ApiError(400, "the body is not valid UTF-8 (JSON must be)", null, "invalid_json");
  }
}
