// The OpenAI-compatible HTTP server on Bun.serve. This thread parses, validates and queues
// requests and streams answers; the engine runs in a Worker (worker.ts) that decodes up to
// `parallel` requests together (continuous batching, ts/engine/scheduler.ts). Requests beyond
// those wait here in arrival order (a FIFO queue, bounded: 429 with Retry-After when full). A
// client that goes away (a cancelled stream, an aborted request) has its sequence cancelled,
// freeing its slot, or is dropped from the queue.
import { timingSafeEqual } from "node:crypto";
import { basename } from "node:path";
import type { BackendKind } from "../backend/select.ts";
import { InferError } from "../errors.ts";
import { isCompiled, libraryPath } from "../native/lib.ts";
import type { EngineStats, FromWorker, ModelInfo, ToWorker } from "./messages.ts";
import {
  ApiError, chatLogprobs, completionLogprobs, finishReason, parseJson, parseRequest, type Job,
  type LogprobEntry, type ParsedRequest,
} from "./protocol.ts";

export interface ServeOptions {
  readonly modelPath: string;
  readonly host?: string;
  /** 0: any free port. */
  readonly port?: number;
  readonly contextLength?: number;
  readonly threads?: number;
  readonly backend?: BackendKind;
  /** Requests must carry `Authorization: Bearer KEY` (/health and /metrics excepted). */
  readonly apiKey?: string | null;
  /** Requests decoded together, each in its own KV-cache slot (default 1). */
  readonly parallel?: number;
  /** Requests waiting for a slot at most (default 16). */
  readonly maxQueue?: number;
  /** Prompt tokens evaluated per step while other requests decode (default 64). */
  readonly prefillChunk?: number;
  /** Memory for the prefix cache shared across requests (default 128 MiB); 0: none. */
  readonly prefixCacheBytes?: number;
  /** Request bodies larger than this are refused (default 1 MiB). */
  readonly maxBodyBytes?: number;
  /** The model's name in the API (default: the file name without .gguf). */
  readonly modelId?: string;
}

export interface InferServer {
  readonly url: string;
  readonly port: number;
  readonly modelId: string;
  readonly info: ModelInfo;
  /** Requests decoded together. */
  readonly parallel: number;
  stop(): Promise<void>;
}

type WorkerEvent = Exclude<FromWorker, { type: "ready" | "failed" | "closed" | "stats" }>;
type Done = Extract<WorkerEvent, { type: "done" }>;

/** One request's events from the worker, read in order. */
class Ticket {
  private readonly events: WorkerEvent[] = [];
  private wake: (() => void) | null = null;
  finished = false;
  constructor(readonly id: number, readonly job: Job) {}

  push(e: WorkerEvent): void {
    this.events.push(e);
    this.wake?.();
    this.wake = null;
  }

  async next(): Promise<WorkerEvent> {
    while (this.events.length === 0) await new Promise<void>((r) => (this.wake = r));
    return this.events.shift()!;
  }
}

class Metrics {
  readonly requests = new Map<string, number>();
  tokensGenerated = 0;
  promptTokens = 0;
  ttftSum = 0;
  ttftCount = 0;
  generationSeconds = 0;
  cancelled = 0;

  count(endpoint: string, status: number): void {
    const key = `endpoint="${endpoint}",status="${status}"`;
    this.requests.set(key, (this.requests.get(key) ?? 0) + 1);
  }

  text(queueDepth: number, running: number, engine: EngineStats | null): string {
    const e = engine;
    const lines = [
      "# HELP infer_requests_total HTTP requests answered, by endpoint and status.",
      "# TYPE infer_requests_total counter",
      ...[...this.requests].map(([k, v]) => `infer_requests_total{${k}} ${v}`),
      "# HELP infer_queue_depth Requests waiting for the engine.",
      "# TYPE infer_queue_depth gauge", `infer_queue_depth ${queueDepth}`,
      "# HELP infer_requests_running Requests the engine is generating for.",
      "# TYPE infer_requests_running gauge", `infer_requests_running ${running}`,
      "# HELP infer_tokens_generated_total Completion tokens generated.",
      "# TYPE infer_tokens_generated_total counter", `infer_tokens_generated_total ${this.tokensGenerated}`,
      "# HELP infer_prompt_tokens_total Prompt tokens of finished requests.",
      "# TYPE infer_prompt_tokens_total counter", `infer_prompt_tokens_total ${this.promptTokens}`,
      "# HELP infer_generation_seconds_total Seconds spent generating (tokens/s = tokens / seconds).",
      "# TYPE infer_generation_seconds_total counter",
      `infer_generation_seconds_total ${this.generationSeconds.toFixed(6)}`,
      "# HELP infer_time_to_first_token_seconds From a request's arrival to its first text.",
      "# TYPE infer_time_to_first_token_seconds summary",
      `infer_time_to_first_token_seconds_sum ${this.ttftSum.toFixed(6)}`,
      `infer_time_to_first_token_seconds_count ${this.ttftCount}`,
      "# HELP infer_requests_cancelled_total Requests whose client went away before the end.",
      "# TYPE infer_requests_cancelled_total counter", `infer_requests_cancelled_total ${this.cancelled}`,
      "# HELP infer_slots Sequence slots (KV caches) of the engine.",
      "# TYPE infer_slots gauge", `infer_slots ${e?.slots ?? 0}`,
      "# HELP infer_slots_busy Slots holding a running sequence.",
      "# TYPE infer_slots_busy gauge", `infer_slots_busy ${e?.busySlots ?? 0}`,
      "# HELP infer_prefix_cache_blocks Blocks of keys and values the prefix cache holds.",
      "# TYPE infer_prefix_cache_blocks gauge", `infer_prefix_cache_blocks ${e?.prefixBlocks ?? 0}`,
      "# HELP infer_prefix_cache_bytes Memory the prefix cache has allocated (bounded by its budget).",
      "# TYPE infer_prefix_cache_bytes gauge", `infer_prefix_cache_bytes ${e?.prefixBytes ?? 0}`,
      "# HELP infer_prefix_cache_restored_tokens_total Prompt tokens copied from the prefix cache.",
      "# TYPE infer_prefix_cache_restored_tokens_total counter",
      `infer_prefix_cache_restored_tokens_total ${e?.prefixRestoredTokens ?? 0}`,
      "# HELP infer_prefix_cache_prompt_tokens_total Prompt tokens looked up in the prefix cache.",
      "# TYPE infer_prefix_cache_prompt_tokens_total counter",
      `infer_prefix_cache_prompt_tokens_total ${e?.prefixLookedUpTokens ?? 0}`,
      "# HELP infer_resident_memory_bytes Resident memory of the process (the engine's worker included).",
      "# TYPE infer_resident_memory_bytes gauge", `infer_resident_memory_bytes ${process.memoryUsage.rss()}`,
    ];
    return lines.join("\n") + "\n";
  }
}

/** The worker and the FIFO queue in front of it: up to `parallel` requests run at once. */
class Scheduler {
  private readonly queue: Ticket[] = [];
  private readonly running = new Set<Ticket>();
  private readonly tickets = new Map<number, Ticket>();
  private nextId = 1;
  private broken: string | null = null;
  /** The engine's state as the worker last reported it. */
  engine: EngineStats | null = null;

  constructor(private readonly worker: Worker, private readonly maxQueue: number,
    private readonly parallel: number) {}

  get depth(): number { return this.queue.length; }
  get active(): number { return this.running.size; }

  /** Queues the jobs of one request (its choices) together, or none of them. */
  submit(jobs: Job[]): Ticket[] {
    if (this.broken) throw new ApiError(503, `the engine stopped: ${this.broken}`, null, "engine_unavailable");
    if (jobs.length > this.parallel + this.maxQueue) {
      throw new ApiError(400, `'n' must be at most ${this.parallel + this.maxQueue} on this ` +
        `server (${this.parallel} slots and a queue of ${this.maxQueue})`, "n", "invalid_value");
    }
    const room = Math.max(0, this.parallel - this.running.size) + this.maxQueue - this.queue.length;
    if (jobs.length > room) {
      throw new ApiError(429, `the server is busy: ${this.queue.length} requests are waiting`,
        null, "queue_full");
    }
    const tickets = jobs.map((job) => new Ticket(this.nextId++, job));
    for (const t of tickets) {
      this.tickets.set(t.id, t);
      this.queue.push(t);
    }
    this.dispatch();
    return tickets;
  }

  /** The client went away: drop the request if it waits, stop it if it runs. */
  cancel(t: Ticket): void {
    if (t.finished) return;
    const at = this.queue.indexOf(t);
    if (at >= 0) {
      this.queue.splice(at, 1);
      t.push({ type: "error", id: t.id, status: 499, message: "the client went away", param: null,
        code: "cancelled" });
      this.end(t);
    } else {
      this.post({ type: "cancel", id: t.id });
    }
  }

  onMessage(m: FromWorker): void {
    if (m.type === "stats") { this.engine = m.stats; return; }
    if (m.type === "ready" || m.type === "failed" || m.type === "closed") return;
    const t = this.tickets.get(m.id);
    if (!t) return;
    t.push(m);
    if (m.type === "done" || m.type === "error") this.end(t);
  }

  /** The worker died: every request fails. */
  fail(why: string): void {
    this.broken = why;
    for (const t of [...this.tickets.values()]) {
      t.push({ type: "error", id: t.id, status: 500, message: `the engine stopped: ${why}`,
        param: null, code: "internal_error" });
      this.end(t);
    }
    this.queue.length = 0;
  }

  private end(t: Ticket): void {
    t.finished = true;
    this.tickets.delete(t.id);
    this.running.delete(t);
    this.dispatch();
  }

  private dispatch(): void {
    while (this.running.size < this.parallel && this.queue.length > 0 && !this.broken) {
      const t = this.queue.shift()!;
      this.running.add(t);
      this.post({ type: "run", id: t.id, job: t.job });
    }
  }

  private post(m: ToWorker): void {
    this.worker.postMessage(m);
  }
}

function json(data: unknown, status = 200, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(data), {
    status, headers: { "content-type": "application/json", ...headers },
  });
}

function errorResponse(err: ApiError): Response {
  const headers: Record<string, string> = {};
  if (err.status === 429) headers["retry-after"] = "1";
  if (err.status === 401) headers["www-authenticate"] = "Bearer";
  return json(err.body(), err.status, headers);
}

const randomId = () => crypto.randomUUID().replaceAll("-", "").slice(0, 24);

/**
 * The worker's module. In the single executable (bun build --compile, ts/cli/build-bin.ts) it is
 * an entry point of its own, bundled beside the main one under Bun's embedded file system.
 */
function workerPath(): string {
  if (import.meta.url.includes("$bunfs")) return "/$bunfs/root/ts/serve/worker.js";
  return new URL("./worker.ts", import.meta.url).href;
}

/** Opens the model in a worker, then listens. */
export async function startServer(o: ServeOptions): Promise<InferServer> {
  const worker = new Worker(workerPath());
  const info = await new Promise<ModelInfo>((resolve, reject) => {
    worker.onmessage = (e: MessageEvent<FromWorker>) => {
      if (e.data.type === "ready") resolve(e.data.info);
      else if (e.data.type === "failed") reject(new InferError("io", e.data.message));
    };
    worker.onerror = (e) => reject(new InferError("internal", `the engine worker failed: ${e.message}`));
    worker.postMessage({ type: "open", settings: {
      modelPath: o.modelPath, threads: o.threads, contextLength: o.contextLength, backend: o.backend,
      library: isCompiled() ? libraryPath() : undefined, parallel: o.parallel ?? 1,
      prefillChunk: o.prefillChunk, prefixCacheBytes: o.prefixCacheBytes,
    } } satisfies ToWorker);
  }).catch((err) => { worker.terminate(); throw err; });

  const modelId = o.modelId ?? basename(o.modelPath).replace(/\.gguf$/i, "");
  const maxBody = o.maxBodyBytes ?? 1 << 20;
  const scheduler = new Scheduler(worker, o.maxQueue ?? 16, info.parallel);
  const metrics = new Metrics();
  const created = Math.floor(Date.now() / 1000);
  let closed: (() => void) | null = null;
  worker.onmessage = (e: MessageEvent<FromWorker>) => {
    if (e.data.type === "closed") closed?.();
    else scheduler.onMessage(e.data);
  };
  worker.onerror = (e) => scheduler.fail(e.message);

  const key = o.apiKey ? Buffer.from(o.apiKey) : null;
  const authorized = (req: Request): boolean => {
    if (!key) return true;
    const m = /^Bearer\s+(.+)$/i.exec(req.headers.get("authorization") ?? "");
    const given = Buffer.from(m?.[1].trim() ?? "");
    return given.length === key.length && timingSafeEqual(given, key);
  };

  async function readBody(req: Request): Promise<Record<string, unknown>> {
    const declared = Number(req.headers.get("content-length") ?? "0");
    const tooLarge = () => new ApiError(413, `the body is larger than ${maxBody} bytes`, null,
      "request_too_large");
    if (declared > maxBody) throw tooLarge();
    const bytes = await req.arrayBuffer();
    if (bytes.byteLength > maxBody) throw tooLarge();
    return parseJson(new TextDecoder().decode(bytes));
  }

  async function generate(req: Request, kind: "chat" | "completion"): Promise<Response> {
    const arrived = performance.now();
    const parsed = parseRequest(kind, await readBody(req), info);
    if (parsed.model !== modelId) {
      throw new ApiError(404, `the model '${parsed.model}' does not exist; this server has ` +
        `'${modelId}'`, "model", "model_not_found");
    }
    // Choice i samples with seed + i, so that a seeded request's choices differ and repeat.
    const seed = parsed.job.sampling.seed;
    const tickets = scheduler.submit(Array.from({ length: parsed.n }, (_, i) => ({
      ...parsed.job, sampling: { ...parsed.job.sampling, seed: seed < 0 ? -1 : (seed + i) >>> 0 },
    })));
    const cancelAll = () => { for (const t of tickets) scheduler.cancel(t); };
    const abort = () => { if (tickets.some((t) => !t.finished)) metrics.cancelled++; cancelAll(); };
    req.signal.addEventListener("abort", abort, { once: true });
    for (const t of tickets) {
      const first = await t.next();
      if (first.type === "error") {
        cancelAll();
        throw new ApiError(first.status, first.message, first.param, first.code);
      }
    }
    let firstText = true;
    const onText = () => {
      if (!firstText) return;
      firstText = false;
      metrics.ttftSum += (performance.now() - arrived) / 1000;
      metrics.ttftCount++;
    };
    const started = performance.now();
    const onDone = (done: Done[]) => {
      for (const d of done) metrics.tokensGenerated += d.completionTokens;
      metrics.promptTokens += done[0].promptTokens;
      metrics.generationSeconds += (performance.now() - started) / 1000;
    };
    const id = (kind === "chat" ? "chatcmpl-" : "cmpl-") + randomId();
    const now = Math.floor(Date.now() / 1000);
    // The prompt is counted once, however many choices share it (as OpenAI counts it).
    const usage = (done: Done[]) => {
      const completion = done.reduce((sum, d) => sum + d.completionTokens, 0);
      return { prompt_tokens: done[0].promptTokens, completion_tokens: completion,
        total_tokens: done[0].promptTokens + completion };
    };
    // Log-probabilities in the endpoint's shape, where the request asked for them.
    const logprobs = (entries: readonly LogprobEntry[] | undefined) =>
      parsed.job.logprobs === null ? null
        : kind === "chat" ? chatLogprobs(entries ?? []) : completionLogprobs(entries ?? []);
    if (!parsed.stream) {
      const finish = async (t: Ticket): Promise<{ done: Done; entries: LogprobEntry[] }> => {
        const entries: LogprobEntry[] = [];
        for (;;) {
          const e = await t.next();
          if (e.type === "text") {
            onText();
            if (e.logprobs) entries.push(...e.logprobs);
            continue;
          }
          if (e.type === "error") throw new ApiError(e.status, e.message, e.param, e.code);
          if (e.type === "done") return { done: e, entries };
        }
      };
      let results: { done: Done; entries: LogprobEntry[] }[];
      try {
        results = await Promise.all(tickets.map(finish));
      } catch (err) {
        cancelAll();
        throw err;
      }
      const done = results.map((r) => r.done);
      onDone(done);
      const choices = results.map(({ done: e, entries }, index) => {
        const finishReasonText = finishReason(e.stopReason);
        return kind === "chat"
          ? { index, message: { role: "assistant", content: e.text, refusal: null },
            logprobs: logprobs(entries), finish_reason: finishReasonText }
          : { index, text: e.text, logprobs: logprobs(entries), finish_reason: finishReasonText };
      });
      return json({
        id, object: kind === "chat" ? "chat.completion" : "text_completion", created: now,
        model: modelId, system_fingerprint: null, choices, usage: usage(done),
      });
    }
    return streamResponse(tickets, parsed, kind, id, now,
      { onText, onDone, usage, cancelAll, abort, logprobs });
  }

  /** SSE chunks of every choice as they come; usage (if asked) and [DONE] after the last. */
  function streamResponse(tickets: Ticket[], parsed: ParsedRequest, kind: "chat" | "completion",
    id: string, now: number, h: {
      onText: () => void; onDone: (done: Done[]) => void; usage: (done: Done[]) => object;
      cancelAll: () => void; abort: () => void;
      logprobs: (entries: readonly LogprobEntry[] | undefined) => object | null;
    }): Response {
    const encoder = new TextEncoder();
    const object = kind === "chat" ? "chat.completion.chunk" : "text_completion";
    const chunk = (choices: object[], extra: object = {}) => encoder.encode(`data: ${JSON.stringify({
      id, object, created: now, model: modelId, system_fingerprint: null, choices, ...extra,
    })}\n\n`);
    const choice = (index: number, text: string | null, finish: string | null, role = false,
      logprobs: object | null = null) =>
      kind === "chat"
        ? { index, delta: text === null ? {} : role ? { role: "assistant", content: text } : { content: text },
          logprobs, finish_reason: finish }
        : { index, text: text ?? "", logprobs, finish_reason: finish };
    // One pending read per choice still running; whichever event comes first is sent first.
    const pending = new Map<number, Promise<{ index: number; e: WorkerEvent }>>();
    const read = (index: number) =>
      pending.set(index, tickets[index].next().then((e) => ({ index, e })));
    tickets.forEach((_, index) => read(index));
    const done: Done[] = [];
    let opened = false;
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        if (!opened) {
          opened = true;
          if (kind === "chat") {
            tickets.forEach((_, index) => controller.enqueue(chunk([choice(index, "", null, true)])));
            return;
          }
        }
        const { index, e } = await Promise.race(pending.values());
        pending.delete(index);
        if (e.type === "text") {
          h.onText();
          controller.enqueue(chunk([choice(index, e.text, null, false, h.logprobs(e.logprobs))]));
          read(index);
        } else if (e.type === "done") {
          done[index] = e;
          controller.enqueue(chunk([choice(index, null, finishReason(e.stopReason) ?? "stop")]));
          if (pending.size > 0) return;
          h.onDone(done);
          if (parsed.includeUsage) controller.enqueue(chunk([], { usage: h.usage(done) }));
          controller.enqueue(encoder.encode("data: [DONE]\n\n"));
          controller.close();
        } else if (e.type === "error") {
          h.cancelAll();
          const err = new ApiError(e.status, e.message, e.param, e.code);
          controller.enqueue(encoder.encode(`data: ${JSON.stringify(err.body())}\n\n`));
          controller.enqueue(encoder.encode("data: [DONE]\n\n")); // a stream always ends so
          controller.close();
        } else {
          read(index);
        }
      },
      cancel() { h.abort(); },
    });
    return new Response(body, { headers: {
      "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive",
    } });
  }

  async function route(req: Request, path: string): Promise<Response> {
    if (path === "/health") {
      return json({ status: "ok", model: modelId, queue_depth: scheduler.depth, running: scheduler.active,
        slots: scheduler.engine?.slots ?? 0, slots_busy: scheduler.engine?.busySlots ?? 0 });
    }
    if (path === "/metrics") {
      return new Response(metrics.text(scheduler.depth, scheduler.active, scheduler.engine), {
        headers: { "content-type": "text/plain; version=0.0.4" },
      });
    }
    if (!path.startsWith("/v1/")) throw new ApiError(404, `no route ${path}`, null, "not_found");
    if (!authorized(req)) {
      throw new ApiError(401, "the API key is missing or wrong", null, "invalid_api_key");
    }
    const method = (m: string) => {
      if (req.method !== m) throw new ApiError(405, `${path} takes ${m}`, null, "method_not_allowed");
    };
    const model = { id: modelId, object: "model", created, owned_by: "infer" };
    if (path === "/v1/models") { method("GET"); return json({ object: "list", data: [model] }); }
    if (path.startsWith("/v1/models/")) {
      method("GET");
      const asked = decodeURIComponent(path.slice("/v1/models/".length));
      if (asked !== modelId) throw new ApiError(404, `the model '${asked}' does not exist`, "model", "model_not_found");
      return json(model);
    }
    if (path === "/v1/chat/completions") { method("POST"); return generate(req, "chat"); }
    if (path === "/v1/completions") { method("POST"); return generate(req, "completion"); }
    throw new ApiError(404, `no route ${path}`, null, "not_found");
  }

  const server = Bun.serve({
    hostname: o.host ?? "127.0.0.1",
    port: o.port ?? 8080,
    idleTimeout: 0, // a long generation sends nothing for a while; never cut it off
    maxRequestBodySize: 4 * maxBody,
    async fetch(req) {
      const path = new URL(req.url).pathname;
      const endpoint = ["/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions"]
        .find((p) => path === p || path.startsWith(p + "/")) ?? "other";
      let res: Response;
      try {
        res = await route(req, path);
      } catch (err) {
        if (err instanceof ApiError) res = errorResponse(err);
        else {
          console.error(err);
          res = errorResponse(new ApiError(500, (err as Error).message, null, "internal_error"));
        }
      }
      metrics.count(endpoint, res.status);
      return res;
    },
  });

  return {
    url: `http://${server.hostname}:${server.port}`,
    port: server.port!,
    modelId,
    info,
    parallel: info.parallel,
    async stop() {
      await server.stop(true);
      scheduler.fail("the server is stopping");
      await Promise.race([
        new Promise<void>((r) => { closed = r; worker.postMessage({ type: "close" } satisfies ToWorker); }),
        Bun.sleep(2000),
      ]);
      worker.terminate();
    },
  };
}
