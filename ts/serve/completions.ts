// The two generating endpoints, /v1/chat/completions and /v1/completions: a validated body
// becomes one job per choice in the request queue, and the answer goes back whole or as
// server-sent events, in OpenAI's shapes.
import type { ToolCall, ToolCallDelta } from "../chat/tools.ts";
import { quote } from "../errors.ts";
import type { EngineInfo } from "../runtime/messages.ts";
import type { Metrics } from "./metrics.ts";
import {
  ApiError, chatLogprobs, completionLogprobs, finishReason, parseRequest,
  type LogprobEntry, type ParsedRequest,
} from "./protocol.ts";
import type { Done, RequestQueue, Ticket, WorkerEvent } from "./queue.ts";
import type { ShiftPolicy } from "../engine/kv-cache.ts";

export interface GenerationContext {
  readonly queue: RequestQueue;
  readonly metrics: Metrics;
  readonly modelId: string;
  readonly info: EngineInfo;
  /** --context-shift: requests with a max_tokens generate past the context. */
  readonly contextShift?: boolean;
  /** --shift-policy: which positions the shift keeps. */
  readonly contextShiftPolicy?: ShiftPolicy;
  /** Throws the 503 when the server is stopping or the engine cannot take work. */
  readonly checkAvailable: () => void;
}

export function json(data: unknown, status = 200, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(data), {
    status, headers: { "content-type": "application/json", ...headers },
  });
}

/**
 * The engine's stop reason in OpenAI's words. A request "interrupted" whose answer is still read
 * was cut by the shutdown deadline: like one cut by max_tokens, its text is unfinished.
 */
function finishOf(stopReason: string, called = false): ReturnType<typeof finishReason> {
  const finish = stopReason === "interrupted" ? "length" : finishReason(stopReason);
  // An answer that ended by itself having called tools waits for their results.
  return called && finish === "stop" ? "tool_calls" : finish;
}

/** A call as OpenAI's message.tool_calls has it. */
const toolCallOf = (c: ToolCall) =>
  ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } });

const randomId = () => crypto.randomUUID().replaceAll("-", "").slice(0, 24);

export async function answerGeneration(c: GenerationContext, req: Request,
  kind: "chat" | "completion", body: Record<string, unknown>): Promise<Response> {
  const { queue: scheduler, metrics, modelId } = c;
  const arrived = performance.now();
  const parsed = parseRequest(kind, body, { ...c.info, contextShift: c.contextShift, contextShiftPolicy: c.contextShiftPolicy });
  if (parsed.model !== modelId) {
    throw new ApiError(404, `the model ${quote(parsed.model)} does not exist; this server has ` +
      `${quote(modelId)}`, "model", "model_not_found");
  }
  c.checkAvailable();
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
    for (const d of done) metrics.tokensGenerated += d.tokens.length;
    metrics.promptTokens += done[0].promptTokens;
    metrics.generationSeconds += (performance.now() - started) / 1000;
  };
  const id = (kind === "chat" ? "chatcmpl-" : "cmpl-") + randomId();
  const now = Math.floor(Date.now() / 1000);
  // The prompt is counted once, however many choices share it (as OpenAI counts it).
  const usage = (done: Done[]) => {
    const completion = done.reduce((sum, d) => sum + d.tokens.length, 0);
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
      const called = e.toolCalls.length > 0;
      const finishReasonText = finishOf(e.stopReason, called);
      // (OpenAI's message that calls tools has content null when it says nothing else)
      const message = called
        ? { role: "assistant", content: e.text === "" ? null : e.text, refusal: null,
          tool_calls: e.toolCalls.map(toolCallOf) }
        : { role: "assistant", content: e.text, refusal: null };
      return kind === "chat"
        ? { index, message, logprobs: logprobs(entries), finish_reason: finishReasonText }
        : { index, text: e.text, logprobs: logprobs(entries), finish_reason: finishReasonText };
    });
    return json({
      id, object: kind === "chat" ? "chat.completion" : "text_completion", created: now,
      model: modelId, system_fingerprint: null, choices, usage: usage(done),
    });
  }
  return streamResponse(modelId, tickets, parsed, kind, id, now,
    { onText, onDone, usage, cancelAll, abort, logprobs });
}

/** SSE chunks of every choice as they come; usage (if asked) and [DONE] after the last. */
function streamResponse(modelId: string, tickets: Ticket[], parsed: ParsedRequest,
  kind: "chat" | "completion",
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
  /** Per choice: calls begun so far. */
  const calls = tickets.map(() => 0);
  // As OpenAI streams a call: a delta with its index, id, type, name and empty arguments, then
  // the arguments in fragments as the model writes them.
  const callChunks = (index: number, list: readonly ToolCallDelta[]) => list.map((d) => {
    const call = d.id === undefined ? { index: d.index, function: { arguments: d.arguments } }
      : { index: d.index, id: d.id, type: "function", function: { name: d.name, arguments: "" } };
    if (d.id !== undefined) calls[index]++;
    return chunk([{ index, delta: { tool_calls: [call] }, logprobs: null, finish_reason: null }]);
  });
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
      let { index, e } = await Promise.race(pending.values());
      pending.delete(index);
      // Text held back while it may begin a tool call comes as empty pieces, with nothing to
      // send; a pull that enqueues nothing is not called again, so it reads on.
      while (e.type === "text" && e.text === "" && !e.toolCallDeltas && !e.logprobs) {
        h.onText();
        read(index);
        ({ index, e } = await Promise.race(pending.values()));
        pending.delete(index);
      }
      if (e.type === "text") {
        h.onText();
        const lp = h.logprobs(e.logprobs);
        if (e.text !== "" || lp !== null) {
          controller.enqueue(chunk([choice(index, e.text, null, false, lp)]));
        }
        if (kind === "chat" && e.toolCallDeltas) {
          for (const c of callChunks(index, e.toolCallDeltas)) controller.enqueue(c);
        }
        read(index);
      } else if (e.type === "done") {
        done[index] = e;
        const finish = finishOf(e.stopReason, calls[index] > 0) ?? "stop";
        controller.enqueue(chunk([choice(index, null, finish)]));
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
