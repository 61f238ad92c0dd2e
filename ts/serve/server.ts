// The OpenAI-compatible HTTP server. This thread parses, validates and queues requests and
// streams answers; the engine runs on its own thread (ts/runtime/) that decodes up to `parallel` requests
// together (continuous batching, ts/engine/scheduler.ts). Requests beyond those wait here in
// arrival order (a FIFO queue, bounded: 429 with Retry-After when full). A client that goes away
// (a cancelled stream, an aborted request) has its sequence cancelled, freeing its slot, or is
// dropped from the queue (queue.ts). How requests arrive and answers leave is http.ts's (on
// node:http); who may call, access.ts's; how bodies are read, body.ts's. A watchdog reads the
// worker's heartbeat: /health answers 503 while one step has run past its deadline. stop() shuts
// down gracefully: no new requests, the running ones get a deadline to finish and then end early
// with a final chunk, the waiting ones get 503.
import type { KvType } from "../backend/backend.ts";
import { basename } from "node:path";
import type { BackendKind } from "../backend/select.ts";
import { InferError, quote } from "../errors.ts";
import { Access } from "./access.ts";
import { BodyReader, bodyText, hasBody } from "./body.ts";
import { listen, type HttpServer } from "./http.ts";
import { EngineThread } from "../runtime/engine-thread.ts";
import type { EngineInfo, StallForTests } from "../runtime/messages.ts";
import type { SpeculationOptions } from "../engine/speculation.ts";
import { Metrics } from "./metrics.ts";
import { answerGeneration, json, type GenerationContext } from "./completions.ts";
import { ApiError, parseJson } from "./protocol.ts";
import { answerEmbeddings } from "./embeddings.ts";
import { RequestQueue } from "./queue.ts";
import type { ShiftPolicy } from "../engine/kv-cache.ts";

export interface ServeOptions {
  readonly modelPath: string;
  readonly host?: string;
  /** 0: any free port. */
  readonly port?: number;
  readonly contextLength?: number;
  readonly threads?: number;
  readonly backend?: BackendKind;
  /** GPUs the model is split over (EngineOptions.gpus). */
  readonly gpus?: number;
  /** Requests must carry `Authorization: Bearer KEY` (/health and /metrics excepted). */
  readonly apiKey?: string | null;
  /**
   * Requests decoded together, each in its own KV-cache slot (default 1; "auto": 4, or on CUDA
   * with its paged cache as many as fit).
   */
  readonly parallel?: number | "auto";
  /** Requests waiting for a slot at most (default 16). */
  readonly maxQueue?: number;
  /** Prompt tokens evaluated per step while other requests decode (default 64). */
  readonly prefillChunk?: number;
  /** Memory for the prefix cache shared across requests (default 128 MiB); 0: none. */
  readonly prefixCacheBytes?: number;
  /** Speculation for requests that name none (`spec`); default: prompt lookup on the CPU. */
  readonly speculation?: SpeculationOptions;
  /** A GGUF with the model's vocabulary drafting for speculation "draft". */
  readonly draftModel?: string;
  /** Requests with a max_tokens generate past the context, shifting it (default off). */
  readonly contextShift?: boolean;
  /** Which positions the shift keeps (default "streaming"; "h2o": heavy hitters too). */
  readonly contextShiftPolicy?: ShiftPolicy;
  /** The KV cache's key and value types (default f16). */
  readonly cacheTypeK?: KvType;
  readonly cacheTypeV?: KvType;
  /** Request bodies larger than this are refused (default 1 MiB). */
  readonly maxBodyBytes?: number;
  /** Bytes of all bodies being received at once (default: 16 MiB or 4 bodies, the larger). */
  readonly maxBodyBytesInFlight?: number;
  /** Time to receive a request's body (default 30 s); a stalled one gets 408. */
  readonly bodyTimeoutMs?: number;
  /** Seconds a connection may sit idle with no request in progress (default 10). */
  readonly idleTimeoutSeconds?: number;
  /**
   * One engine step (a batch's forward pass, or a prompt chunk) running longer than this makes
   * /health answer 503 and new requests be refused (default 60 s: a slow CPU evaluating a long
   * prompt chunk takes seconds, a stuck one forever).
   */
  readonly stepTimeoutMs?: number;
  /** On stop(), how long running requests may go on before they are ended (default 10 s). */
  readonly shutdownTimeoutMs?: number;
  /** Web page origins allowed to call the server (CORS); "*": any. Default: none. */
  readonly corsOrigins?: readonly string[];
  /** The model's name in the API (default: the file name without .gguf). */
  readonly modelId?: string;
  /** Tests of the watchdog only: a step that blocks the engine's thread. */
  readonly stallForTests?: StallForTests;
}

export interface StopOptions {
  /** Overrides ServeOptions.shutdownTimeoutMs; 0 ends running requests now. */
  readonly timeoutMs?: number;
}

export interface InferServer {
  readonly url: string;
  readonly port: number;
  readonly modelId: string;
  readonly info: EngineInfo;
  /** Requests decoded together. */
  readonly parallel: number;
  /**
   * Stops gracefully: stops accepting, answers waiting requests 503, lets running ones finish
   * within the shutdown timeout and then ends them (a final chunk with finish_reason "length"
   * and [DONE]). A second call while stopping may shorten the deadline.
   */
  stop(options?: StopOptions): Promise<void>;
}

function errorResponse(err: ApiError): Response {
  const headers: Record<string, string> = {};
  if (err.status === 429 || err.code === "server_busy") headers["retry-after"] = "1";
  if (err.status === 401) headers["www-authenticate"] = "Bearer";
  return json(err.body(), err.status, headers);
}

const endpoints = ["/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions",
  "/v1/embeddings"];

const notFound = (path: string) => new ApiError(404, `no route ${quote(path)}`, null, "not_found");

/** The request's path (http.ts made the URL: it parses). */
const pathOf = (req: Request): string => new URL(req.url).pathname;

/** Whether `p` settles within `ms`; the timer is cleared either way, holding no process up. */
async function within(p: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: Timer | undefined;
  const expired = new Promise<false>((resolve) => { timer = setTimeout(() => resolve(false), ms); });
  try {
    return await Promise.race([p.then(() => true), expired]);
  } finally {
    clearTimeout(timer);
  }
}

/** A percent-encoded path segment, decoded; a malformed one is the client's error. */
function decodePath(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw new ApiError(400, `the path segment ${quote(segment)} is not valid percent-encoding`,
      null, "invalid_path");
  }
}

/** Opens the model on the engine's thread, then listens. */
export async function startServer(o: ServeOptions): Promise<InferServer> {
  const thread = await EngineThread.open({
    modelPath: o.modelPath, threads: o.threads, contextLength: o.contextLength, backend: o.backend,
    gpus: o.gpus,
    cacheTypeK: o.cacheTypeK, cacheTypeV: o.cacheTypeV,
    parallel: o.parallel ?? 1, prefillChunk: o.prefillChunk, prefixCacheBytes: o.prefixCacheBytes,
    speculation: o.speculation, draftModel: o.draftModel, stall: o.stallForTests,
  });
  const info = thread.info;

  const modelId = o.modelId ?? basename(o.modelPath).replace(/\.gguf$/i, "");
  const maxBody = o.maxBodyBytes ?? 1 << 20;
  const bodies = new BodyReader({ maxBytes: maxBody, timeoutMs: o.bodyTimeoutMs ?? 30_000,
    maxBytesInFlight: o.maxBodyBytesInFlight ?? Math.max(16 << 20, 4 * maxBody) });
  const idleSeconds = o.idleTimeoutSeconds ?? 10;
  const stepTimeoutMs = o.stepTimeoutMs ?? 60_000;
  const busyMs = () => thread.busyMs();
  const scheduler = new RequestQueue(thread, o.maxQueue ?? 16, info.parallel);
  const metrics = new Metrics();
  const created = Math.floor(Date.now() / 1000);

  /** Why the engine cannot take work now (stalled, dead or stopping), or null. */
  const unavailable = (): string | null => {
    if (scheduler.broken) return `the engine stopped: ${scheduler.broken}`;
    const ms = busyMs();
    if (ms > stepTimeoutMs) {
      return `the engine has been in one step for ${(ms / 1000).toFixed(1)} s (the step ` +
        `timeout is ${stepTimeoutMs / 1000} s)`;
    }
    return null;
  };

  /** One request, and whether its body was read. */
  interface Exchange {
    readonly req: Request;
    bodyRead: boolean;
  }

  async function readJson(x: Exchange): Promise<Record<string, unknown>> {
    const bytes = await bodies.read(x.req);
    x.bodyRead = true;
    return parseJson(bodyText(bytes));
  }

  const generation: GenerationContext = { queue: scheduler, metrics, modelId, info, contextShift: o.contextShift,
    contextShiftPolicy: o.contextShiftPolicy,
    checkAvailable() {
      if (stopping) throw new ApiError(503, "the server is stopping", null, "server_shutting_down");
      const down = unavailable();
      if (down) throw new ApiError(503, down, null, "engine_unavailable");
    } };
  const generate = async (x: Exchange, kind: "chat" | "completion") =>
    answerGeneration(generation, x.req, kind, await readJson(x));

  function health(): Response {
    const down = stopping ? "the server is stopping" : unavailable();
    const state = stopping ? "stopping" : scheduler.broken ? "failed" : down ? "stalled" : "ok";
    return json({ status: state, ...(down ? { reason: down } : {}), model: modelId,
      queue_depth: scheduler.depth, running: scheduler.active, slots: info.parallel,
      slots_busy: thread.stats?.busySlots ?? 0,
      engine_busy_seconds: Number((busyMs() / 1000).toFixed(3)) }, down ? 503 : 200);
  }

  async function route(x: Exchange, path: string): Promise<Response> {
    const req = x.req;
    if (path === "/health") return health();
    if (path === "/metrics") {
      const busy = busyMs();
      return new Response(metrics.text({ queueDepth: scheduler.depth, running: scheduler.active,
        slots: info.parallel, engine: thread.stats, busyMs: busy,
        stalled: busy > stepTimeoutMs, bodyBytesInFlight: bodies.bytesInFlight }), {
        headers: { "content-type": "text/plain; version=0.0.4" },
      });
    }
    if (!path.startsWith("/v1/")) throw notFound(path);
    access.checkKey(req);
    const method = (m: string) => {
      if (req.method !== m) {
        throw new ApiError(405, `${quote(path)} takes ${m}`, null, "method_not_allowed");
      }
    };
    const model = { id: modelId, object: "model", created, owned_by: "infer" };
    if (path === "/v1/models") { method("GET"); return json({ object: "list", data: [model] }); }
    if (path.startsWith("/v1/models/")) {
      method("GET");
      const asked = decodePath(path.slice("/v1/models/".length));
      if (asked !== modelId) {
        throw new ApiError(404, `the model ${quote(asked)} does not exist`, "model",
          "model_not_found");
      }
      return json(model);
    }
    if (path === "/v1/chat/completions") { method("POST"); return generate(x, "chat"); }
    if (path === "/v1/completions") { method("POST"); return generate(x, "completion"); }
    if (path === "/v1/embeddings") {
      method("POST");
      return answerEmbeddings(generation, x.req, await readJson(x));
    }
    throw notFound(path);
  }

  /** Answers one request: every failure, whatever its kind, as OpenAI's error object. */
  async function answer(x: Exchange): Promise<{ res: Response; endpoint: string }> {
    let endpoint = "other";
    try {
      const path = pathOf(x.req);
      endpoint = endpoints.find((p) => path === p || path.startsWith(p + "/")) ?? "other";
      // Health checks answer anyone, as they do with an API key: they tell nothing secret.
      if (path !== "/health" && path !== "/metrics") access.checkOrigin(x.req);
      const preflight = access.preflight(x.req);
      if (preflight) return { res: preflight, endpoint };
      if (stopping && path !== "/health") {
        throw new ApiError(503, "the server is stopping", null, "server_shutting_down");
      }
      return { res: await route(x, path), endpoint };
    } catch (err) {
      if (err instanceof ApiError) return { res: errorResponse(err), endpoint };
      console.error(err);
      const message = `internal error: ${quote(String((err as Error)?.message ?? err))}`;
      return { res: errorResponse(new ApiError(500, message, null, "internal_error")), endpoint };
    }
  }

  let stopping = false;
  const host = o.host ?? "127.0.0.1";
  let http: HttpServer;
  try {
    http = await listen({ host, port: o.port ?? 8080, idleTimeoutSeconds: idleSeconds,
      refuse: errorResponse,
      async fetch(req) {
        const x: Exchange = { req, bodyRead: false };
        const { res, endpoint } = await answer(x);
        for (const [k, v] of Object.entries(access.corsHeaders(req))) res.headers.set(k, v);
        // A body left unread: close, rather than read and discard what may be gigabytes.
        if (stopping || (hasBody(req) && !x.bodyRead)) res.headers.set("connection", "close");
        metrics.count(endpoint, res.status);
        return res;
      } });
  } catch (err) {
    thread.terminate();
    throw err;
  }
  const access = new Access({ apiKey: o.apiKey ?? null, corsOrigins: o.corsOrigins ?? [],
    host, port: http.port });

  const shutdownTimeoutMs = o.shutdownTimeoutMs ?? 10_000;
  let stopped: Promise<void> | null = null;
  let hurry: (() => void) | null = null;

  async function shutDown(timeoutMs: number): Promise<void> {
    stopping = true;
    // Stop listening; idle keep-alive connections close, requests in progress go on.
    const drained = http.close();
    scheduler.refuseWaiting(503, "the server is stopping", "server_shutting_down");
    const hurried = new Promise<void>((resolve) => (hurry = resolve));
    await within(Promise.race([scheduler.whenIdle(), hurried]), timeoutMs);
    // Past the deadline: the engine ends every sequence at its next step, each with the text
    // it has (finish_reason "length"); an engine stuck in a step cannot, and its requests fail.
    const engineClosed = thread.endAll();
    if (!(await within(scheduler.whenIdle(), 5_000))) scheduler.fail("the server is stopping");
    await within(drained, 2_000); // the last chunks on their way out
    http.closeAll();
    await within(engineClosed, 2_000);
    thread.terminate();
  }

  return {
    url: http.url,
    port: http.port,
    modelId,
    info,
    parallel: info.parallel,
    stop(options = {}) {
      const timeoutMs = options.timeoutMs ?? shutdownTimeoutMs;
      // A second call (a second Ctrl-C) may only bring the deadline closer.
      if (stopped) setTimeout(() => hurry?.(), timeoutMs).unref();
      else stopped = shutDown(timeoutMs);
      return stopped;
    },
  };
}
