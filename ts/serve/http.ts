// The server's HTTP/1.1 transport: Bun's node:http under fetch-style handlers (Request in,
// Response out). node:http rather than Bun.serve because it answers requests pipelined on one
// connection in order (Bun.serve drops the connection when a second request head arrives while
// the first is unanswered), and because its timeouts fit a server whose answers may be quiet
// for minutes:
// - headersTimeout bounds the time to receive a request head (slowloris), checked every second;
// - keepAliveTimeout closes a connection left idle after an answer;
// - nothing else: requestTimeout and the socket timeout stay off, so neither a body being read
//   (body.ts bounds that, with the error object) nor a generation that says nothing for a long
//   while is ever cut.
// A request becomes a Request whose body is a web stream read on demand and whose signal fires
// when the client goes away before its answer is written. A Response is written with its status
// and headers, an event stream chunk by chunk as it comes, anything else whole with its length;
// what the client does not take within the idle timeout ends the connection, and a client that
// goes away cancels the Response's body, and with it whatever produces it.
// Every refusal here is an ApiError, for the caller to phrase (the error object).
import { createServer, STATUS_CODES, type IncomingMessage, type ServerResponse } from "node:http";
import { isIP, type Socket } from "node:net";
import { InferError, quote } from "../errors.ts";
import { ApiError } from "./protocol.ts";

/** Bytes of a whole answer written at once (the rest waits for the client to take them). */
const PIECE_BYTES = 64 << 10;

export interface HttpOptions {
  readonly host: string;
  /** 0: any free port. */
  readonly port: number;
  /** Seconds to receive a request head, and an idle connection stays open after an answer. */
  readonly idleTimeoutSeconds: number;
  /** Answers a request; failures must be answered, not thrown. */
  readonly fetch: (req: Request) => Promise<Response>;
  /** The answer to a request refused before `fetch` sees it (not HTTP, a bad target…). */
  readonly refuse: (err: ApiError) => Response;
}

export interface HttpServer {
  /** http://host:port */
  readonly url: string;
  readonly port: number;
  /**
   * Stops accepting connections. Idle ones close now, the others once their answer is written;
   * resolves when every connection is closed.
   */
  close(): Promise<void>;
  /** Closes every connection now (after close()). */
  closeAll(): void;
}

/** Listens on host:port, or throws an InferError saying why it cannot. */
export async function listen(o: HttpOptions): Promise<HttpServer> {
  const idleMs = o.idleTimeoutSeconds * 1000;
  const server = createServer({
    headersTimeout: idleMs,
    connectionsCheckingInterval: 1_000,
    requestTimeout: 0,
    keepAliveTimeout: idleMs,
    // node:http would refuse an HTTP/1.1 request without Host with a bare 400; access.ts
    // decides about Host (a request without one is not a browser's).
    requireHostHeader: false,
  });
  let closing = false;
  const origin = `http://${isIP(o.host) === 6 ? `[${o.host}]` : o.host}`;
  let url = "";
  server.on("request", (req: IncomingMessage, res: ServerResponse) => {
    // Stopping: an answer begun before close() promised to keep its connection open; it closes
    // once the answer is out ("finish" comes when its last byte is, unlike closeIdleConnections,
    // which would cut what is still buffered), unless a pipelined answer follows on it.
    res.once("finish", () => {
      if (closing) setImmediate(() => { if (!answering(req.socket)) req.socket.destroySoon(); });
    });
    exchange(req, res, url, o, idleMs).catch((err: unknown) => {
      console.error(err);
      res.destroy();
    });
  });
  server.on("checkExpectation", (req: IncomingMessage, res: ServerResponse) => {
    const err = new ApiError(417, `the expectation ${quote(req.headers.expect ?? "")} is not ` +
      "supported", null, "expectation_failed");
    void send(res, o.refuse(err), idleMs);
  });
  server.on("clientError", (err: NodeJS.ErrnoException, socket: Socket) => {
    // An answer in progress on this connection would be mistaken for the answer to this.
    if (err.code === "ECONNRESET" || !socket.writable || answering(socket)) socket.destroy();
    else void refuseRaw(socket, o.refuse(clientFault(err, idleMs)));
  });
  // CONNECT is not a request of this API; node:http would close without a word.
  server.on("connect", (_req: IncomingMessage, socket: Socket) => {
    void refuseRaw(socket, o.refuse(new ApiError(405, "CONNECT is not supported", null,
      "method_not_allowed")));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(o.port, o.host, () => {
      server.off("error", reject);
      resolve();
    });
  }).catch((err: unknown) => { throw listenError(o.host, o.port, err); });
  const port = (server.address() as { port: number }).port;
  url = `${origin}:${port}`;
  return {
    url,
    port,
    close() {
      closing = true;
      return new Promise((resolve) => server.close(() => resolve()));
    },
    closeAll() {
      server.closeAllConnections();
    },
  };
}

/** Whether an answer is being written on `socket` (node:http's own record of it). */
const answering = (socket: Socket): boolean =>
  (socket as { _httpMessage?: unknown })._httpMessage != null;

/** Why host:port cannot be listened on, in one line (the port in use, an address not ours). */
export function listenError(host: string, port: number, err: unknown): InferError {
  const code = (err as NodeJS.ErrnoException)?.code;
  const where = `${quote(host, 60)} port ${port}`;
  if (code === "EADDRINUSE") {
    return new InferError("io", `cannot listen on ${where}: it is in use (another server?); ` +
      "choose another with --port, or --port 0 for any free one");
  }
  return new InferError("io", `cannot listen on ${where}${code ? ` (${code})` : ""}; --host ` +
    "must be an address of this machine, e.g. 127.0.0.1 or 0.0.0.0");
}

/** One request answered: made a Request, handed to `fetch`, its Response written. */
async function exchange(req: IncomingMessage, res: ServerResponse, url: string,
  o: HttpOptions, idleMs: number): Promise<void> {
  const gone = new AbortController();
  let written = false;
  res.once("finish", () => (written = true));
  res.once("close", () => { if (!written) gone.abort(); });
  let response: Response;
  try {
    response = await o.fetch(toRequest(req, url, gone.signal));
  } catch (err) {
    if (!(err instanceof ApiError)) console.error(err);
    response = o.refuse(err instanceof ApiError ? err
      : new ApiError(500, "internal error", null, "internal_error"));
  }
  await send(res, response, idleMs);
}

/**
 * The request as a fetch Request. Its URL is this server's origin and the request target as
 * sent (an origin-form target is never resolved: //a/b stays a path); `signal` fires when the
 * client goes away before the answer is written.
 */
function toRequest(req: IncomingMessage, origin: string, signal: AbortSignal): Request {
  const target = req.url ?? "";
  let href: string;
  try {
    href = target.startsWith("/") ? new URL(origin + target).href : new URL(target).href;
  } catch {
    throw new ApiError(400, `the request target ${quote(target)} is not a path`, null,
      "invalid_path");
  }
  const headers = new Headers();
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) headers.append(raw[i], raw[i + 1]);
  const method = req.method ?? "GET";
  const announced = headers.has("transfer-encoding") ||
    (headers.get("content-length") ?? "0").trim() !== "0";
  const body = method !== "GET" && method !== "HEAD" && announced ? bodyStream(req) : null;
  return new Request(href, { method, headers, body, signal, duplex: "half" } as RequestInit);
}

/**
 * A request's body as a web stream, read from the connection only as the stream is read.
 * Cancelled (the handler refuses the rest), the rest is discarded as it arrives, as node:http
 * discards a body nobody reads, until the connection closes after the answer.
 */
function bodyStream(req: IncomingMessage): ReadableStream<Uint8Array> {
  let started = false, settled = false;
  const stop = () => {
    settled = true;
    req.removeAllListeners("data");
  };
  return new ReadableStream<Uint8Array>({
    pull(controller) {
      if (!started) {
        started = true;
        if (req.destroyed) {
          stop();
          controller.error(endedEarly());
          return;
        }
        req.on("data", (chunk: Buffer) => {
          controller.enqueue(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength));
          if ((controller.desiredSize ?? 0) <= 0) req.pause();
        });
        req.once("end", () => { if (!settled) { stop(); controller.close(); } });
        req.once("close", () => {
          if (!settled) {
            stop();
            controller.error(endedEarly());
          }
        });
      }
      req.resume();
    },
    cancel() {
      stop();
      req.resume();
    },
  }, { highWaterMark: 0 });
}

const endedEarly = () => new ApiError(400, "the request body ended early (the connection closed)",
  null, "invalid_body");

/** Writes `response` (see the file's head); resolves once it is written or the client left. */
async function send(res: ServerResponse, response: Response, idleMs: number): Promise<void> {
  const streamed = response.body !== null &&
    (response.headers.get("content-type") ?? "").startsWith("text/event-stream");
  const whole = streamed ? null : new Uint8Array(await response.arrayBuffer());
  if (res.destroyed || res.writableEnded) {
    await response.body?.cancel().catch(() => {});
    return;
  }
  const headers = headerList(response.headers);
  // A null body (a 204) has no length; any other that is not a stream is sent with its length.
  if (whole !== null && response.body !== null) {
    headers.push(["content-length", String(whole.byteLength)]);
  }
  res.writeHead(response.status, headers);
  if (whole !== null) {
    // In pieces, so that a client that stops reading is let go like one of a stream.
    for (let at = 0; at < whole.byteLength; at += PIECE_BYTES) {
      if (!res.write(whole.subarray(at, at + PIECE_BYTES)) && !(await drained(res, idleMs))) {
        res.destroy();
        return;
      }
    }
    res.end();
    return;
  }
  res.flushHeaders();
  const reader = response.body!.getReader();
  const cancel = () => void reader.cancel().catch(() => {});
  res.once("close", cancel);
  let complete = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) complete = !res.destroyed;
      if (done || res.destroyed || (!res.write(value) && !(await drained(res, idleMs)))) break;
    }
  } catch (err) {
    console.error(err);
  } finally {
    res.off("close", cancel);
  }
  if (complete) {
    res.end();
  } else {
    cancel();
    res.destroy(); // a cut chunked answer tells the client it is incomplete
  }
}

/**
 * Connection is the transport's to decide (node:http keeps a connection alive where HTTP
 * allows); a handler may only ask for it to close.
 */
function headerList(headers: Headers): [string, string][] {
  const list: [string, string][] = [];
  for (const [name, value] of headers) {
    if (name === "content-length") continue; // the length of what is sent, set where it is sent
    if (name !== "connection") list.push([name, value]);
    else if (/\bclose\b/i.test(value)) list.push([name, "close"]);
  }
  return list;
}

/**
 * Whether the client took what was written within `ms` (false: it left, or reads nothing). An
 * answer pipelined behind another has no socket yet: its time starts when it gets one.
 */
function drained(res: ServerResponse, ms: number): Promise<boolean> {
  return new Promise((resolve) => {
    let timer: Timer | undefined;
    const done = (ok: boolean) => {
      clearTimeout(timer);
      res.off("drain", onDrain);
      res.off("close", onClose);
      res.off("socket", arm);
      resolve(ok);
    };
    const onDrain = () => done(true), onClose = () => done(false);
    const arm = () => { timer = setTimeout(() => done(false), ms); };
    res.on("drain", onDrain);
    res.on("close", onClose);
    if (res.socket) arm();
    else res.once("socket", arm);
  });
}

/** The refusal of bytes node:http's parser could not take as a request. */
function clientFault(err: NodeJS.ErrnoException, idleMs: number): ApiError {
  if (err.code === "ERR_HTTP_REQUEST_TIMEOUT") {
    return new ApiError(408, `the request head did not arrive within ${idleMs / 1000} s`, null,
      "request_timeout");
  }
  if (err.code === "HPE_HEADER_OVERFLOW") {
    return new ApiError(431, "the request head is too large", null, "headers_too_large");
  }
  return new ApiError(400, `the request is not valid HTTP/1.1 (${err.code ?? "unknown"})`, null,
    "invalid_http");
}

/** Writes `response` on a connection that has no request object, then closes it. */
async function refuseRaw(socket: Socket, response: Response): Promise<void> {
  const body = Buffer.from(await response.arrayBuffer());
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  let head = `HTTP/1.1 ${response.status} ${STATUS_CODES[response.status] ?? "Error"}\r\n`;
  for (const [name, value] of headerList(response.headers)) head += `${name}: ${value}\r\n`;
  head += `content-length: ${body.byteLength}\r\nconnection: close\r\n\r\n`;
  socket.write(Buffer.concat([Buffer.from(head, "latin1"), body]));
  socket.destroySoon();
}
