// HTTP/1.x over a plain TCP socket, for tests that send what fetch() cannot: no Host header,
// bytes that are not HTTP, pipelined requests, headers or bodies a byte at a time, bodies that
// stop half way.
import { connect, type Socket } from "node:net";

export interface RawReply {
  /** Everything the server sent, as latin1 text. */
  readonly text: string;
  /** Whether the server closed the connection (false: still open when we gave up). */
  readonly closed: boolean;
  /** From the connection to its close (or to giving up). */
  readonly ms: number;
}

export interface RawOptions {
  /** Give up (and close) after this long (default 5 s). */
  readonly waitMs?: number;
  /** Called once connected, after `data` is written: more writes, trickles. */
  readonly then?: (socket: Socket) => void;
  /** Stop waiting as soon as the text received satisfies this. */
  readonly until?: (text: string) => boolean;
}

/** Writes `data` on a new connection and collects what comes back. */
export function rawExchange(port: number, data: string | Uint8Array,
  o: RawOptions = {}): Promise<RawReply> {
  return new Promise((resolve) => {
    const t0 = performance.now();
    let text = "";
    let settled = false;
    const socket = connect(port, "127.0.0.1", () => {
      socket.write(typeof data === "string" ? Buffer.from(data, "latin1") : data);
      o.then?.(socket);
    });
    const finish = (closed: boolean) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      resolve({ text, closed, ms: performance.now() - t0 });
    };
    const timer = setTimeout(() => finish(false), o.waitMs ?? 5_000);
    socket.on("data", (d) => {
      text += d.toString("latin1");
      if (o.until?.(text)) finish(false);
    });
    socket.on("close", () => finish(true));
    socket.on("error", () => finish(true));
  });
}

export interface ParsedReply {
  readonly status: number;
  readonly headers: Map<string, string>;
  readonly body: string;
}

/** The first response in `text` (a Content-Length body), or null if there is none. */
export function parseReply(text: string): ParsedReply | null {
  return parseReplies(text)[0] ?? null;
}

/** The responses in `text`, one after another (Content-Length bodies), as far as they parse. */
export function parseReplies(text: string): ParsedReply[] {
  const replies: ParsedReply[] = [];
  for (;;) {
    const m = /^HTTP\/1\.[01] (\d{3})[^\r\n]*\r\n((?:[^\r\n]+\r\n)*)\r\n/.exec(text);
    if (!m) return replies;
    const headers = new Map<string, string>();
    for (const line of m[2].split("\r\n").filter(Boolean)) {
      const at = line.indexOf(":");
      headers.set(line.slice(0, at).trim().toLowerCase(), line.slice(at + 1).trim());
    }
    const length = Number(headers.get("content-length") ?? 0);
    const bytes = text.slice(m[0].length, m[0].length + length); // latin1: a byte a character
    const body = Buffer.from(bytes, "latin1").toString("utf8");
    replies.push({ status: Number(m[1]), headers, body });
    text = text.slice(m[0].length + length);
  }
}

/** A request's bytes: `headers` as given (no Host unless listed), then the body. */
export function rawRequest(method: string, path: string, headers: Record<string, string | number>,
  body = "", version = "1.1"): string {
  const lines = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("");
  return `${method} ${path} HTTP/${version}\r\n${lines}\r\n${body}`;
}
