// The engine's thread: a Bun Worker that opens the model and runs the batch scheduler
// (ts/engine/scheduler.ts), so the HTTP event loop (server.ts) stays free to answer /health and
// queue new requests. Jobs join the running batch between steps; text is posted back as it is
// generated. New jobs and "cancel" messages (the client went away) are read between steps,
// because the loop yields to this worker's event loop after each forward pass. Around every
// piece of work (a step, a job's tokenization and constraint) the worker marks the shared
// heartbeat cell, so that the HTTP thread's watchdog can tell a busy engine from a stuck one.
import { chatTemplateFor, turnTokens, type ChatTemplate } from "../chat/template.ts";
import { isSet, setSetting } from "../config/env.ts";
import { Engine, type TokenConstraint } from "../engine/engine.ts";
import type { TokenLogprob } from "../engine/generation.ts";
import { BatchScheduler } from "../engine/scheduler.ts";
import { InferError } from "../errors.ts";
import { JsonGrammar } from "../sample/json-grammar.ts";
import { anyObject, compileSchema, minLength, type JsonNode } from "../sample/json-schema.ts";
import type { Tokenizer } from "../tokenizer/index.ts";
import type { EngineStats, FromWorker, StallForTests, ToWorker } from "./messages.ts";
import type { Job, LogprobEntry } from "./protocol.ts";

declare const self: { postMessage(m: FromWorker): void; onmessage: ((e: MessageEvent<ToWorker>) => void) | null };

let engine: Engine | null = null;
let scheduler: BatchScheduler | null = null;
let template: ChatTemplate | null = null;
let templateError: string | null = null;
let turnStops: number[] = [];
/** Jobs handed to the scheduler and not ended yet; of those, the ones whose client went away. */
const active = new Set<number>();
const cancelled = new Set<number>();
let looping = false;
let closing = false;
let lastStats = "";
let heartbeat: BigInt64Array | null = null;
let stall: StallForTests | null = null;
let stepsRun = 0;

/** Runs `work` with the heartbeat cell saying since when the engine has been busy. */
function working<T>(work: () => T): T {
  if (heartbeat) Atomics.store(heartbeat, 0, BigInt(Date.now()));
  try {
    return work();
  } finally {
    if (heartbeat) Atomics.store(heartbeat, 0, 0n);
  }
}

/** The test hook: a step that hangs the thread as a stuck native call would. */
function maybeStall(): void {
  if (stall && stepsRun === stall.atStep) {
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, stall.ms);
  }
}

function shutDown(): void {
  engine?.close();
  engine = null;
  scheduler = null;
  post({ type: "closed" });
}

const post = (m: FromWorker) => self.postMessage(m);

self.onmessage = (e) => {
  const m = e.data;
  switch (m.type) {
    case "open": open(m.settings); break;
    case "run":
      try {
        working(() => submit(m.id, m.job));
      } catch (err) { // a bug, not the request's fault: report it and serve the next one
        fail(m.id, 500, (err as Error).message, null, "internal_error");
      }
      break;
    case "cancel": if (active.has(m.id)) cancelled.add(m.id); break; // late ones are moot
    case "close":
      closing = true; // every sequence's shouldStop is now true
      if (!looping) shutDown();
      break;
  }
};

function open(settings: Extract<ToWorker, { type: "open" }>["settings"]): void {
  heartbeat = new BigInt64Array(settings.heartbeat);
  stall = settings.stall ?? null;
  try {
    // In the single executable the worker is bundled apart from the embedded libraries; it
    // loads the one the main thread found.
    if (settings.library && !isSet("INFER_LIB")) setSetting("INFER_LIB", settings.library);
    engine = Engine.open(settings);
    const prefixBytes = settings.prefixCacheBytes ?? 128 << 20;
    // A backend that runs one sequence per pass serves one request at a time.
    const parallel = engine.backend.sequenceBatches ? settings.parallel ?? 1 : 1;
    scheduler = new BatchScheduler(engine, { slots: parallel,
      prefillChunk: settings.prefillChunk,
      prefixCache: prefixBytes > 0 ? { bytesMax: prefixBytes } : null });
    try {
      template = chatTemplateFor(engine.file.metadata, engine.tokenizer);
      turnStops = turnTokens(template, engine.tokenizer);
    } catch (err) {
      templateError = (err as Error).message; // completions still work
    }
    const name = engine.file.metadata.get("general.name");
    post({ type: "ready", info: {
      contextLength: engine.contextLength, vocabSize: engine.tokenizer.vocabSize, parallel,
      name: typeof name === "string" ? name : null,
    } });
  } catch (err) {
    post({ type: "failed", message: (err as Error).message });
  }
}

/** Runs steps while sequences run or wait, yielding to messages between them. */
async function loop(): Promise<void> {
  if (looping) return;
  looping = true;
  try {
    while (scheduler?.busy) {
      const sched = scheduler;
      try {
        working(() => {
          maybeStall();
          sched.step();
        });
      } catch (err) { // a bug: the requests in flight fail, the server goes on
        sched.abort(err as Error);
      }
      stepsRun++;
      postStats();
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
  } finally {
    looping = false;
    postStats();
    if (closing) shutDown();
  }
}

function postStats(): void {
  const s = scheduler?.stats();
  if (!s) return;
  const stats: EngineStats = {
    slots: s.slots, busySlots: s.busySlots, steps: s.steps,
    prefixBlocks: s.prefix?.blocks ?? 0, prefixBytes: s.prefix?.bytes ?? 0,
    prefixRestoredTokens: s.prefix?.restoredTokens ?? 0,
    prefixLookedUpTokens: s.prefix?.lookedUpTokens ?? 0,
  };
  const key = JSON.stringify({ ...stats, steps: 0 });
  if (key === lastStats) return; // posted when the occupancy or the cache changes, not per step
  lastStats = key;
  post({ type: "stats", stats });
}

function fail(id: number, status: number, message: string, param: string | null = null,
  code: string | null = null): void {
  post({ type: "error", id, status, message, param, code });
}

/** Tokenizes and checks a job, then hands it to the scheduler. */
function submit(id: number, job: Job): void {
  const e = engine, sched = scheduler;
  if (!e || !sched) return fail(id, 503, "the model is not loaded");
  let prompt: number[];
  try {
    if (job.kind === "chat") {
      if (!template) return fail(id, 400, templateError ?? "the model has no chat template", "messages");
      prompt = template.encode(e.tokenizer, job.messages!);
    } else {
      prompt = e.tokenizer.encode(job.prompt!, { addSpecial: true, parseSpecial: true });
    }
  } catch (err) {
    if (err instanceof InferError) return fail(id, 400, err.message, job.kind === "chat" ? "messages" : "prompt");
    throw err;
  }
  const param = job.kind === "chat" ? "messages" : "prompt";
  if (prompt.length === 0) return fail(id, 400, "the prompt is empty", param);
  if (prompt.length >= e.contextLength) {
    return fail(id, 400, `the prompt (${prompt.length} tokens) does not fit the context of ` +
      `${e.contextLength} tokens with room to answer`, param, "context_length_exceeded");
  }
  let constraint: TokenConstraint | undefined;
  const format = job.format;
  if (format.type !== "text") {
    const node: JsonNode = format.type === "json_object" ? anyObject : compileSchema(format.schema);
    // As protocol.ts checked against max_tokens: the grammar needs a token per byte of its
    // shortest output, here against the room the prompt leaves.
    const room = e.contextLength - prompt.length, shortest = minLength(node);
    if (shortest > room) {
      return fail(id, 400, `the prompt (${prompt.length} tokens) leaves room for ${room} ` +
        `tokens in the context of ${e.contextLength}, fewer than the response format's shortest ` +
        `output needs (${shortest} bytes, a token each)`, param, "context_length_exceeded");
    }
    constraint = new JsonGrammar(e.tokenizer, node);
  }
  const entries = (list: readonly TokenLogprob[] | undefined) =>
    list?.map((p) => logprobEntry(e.tokenizer, p));
  post({ type: "started", id, promptTokens: prompt.length });
  const end = () => { active.delete(id); cancelled.delete(id); };
  sched.submit({
    prompt,
    options: {
      maxTokens: job.maxTokens, sampling: job.sampling, stop: [...job.stop], constraint,
      stopTokens: job.kind === "chat" ? turnStops : undefined,
      shouldStop: () => closing || cancelled.has(id),
      logprobs: job.logprobs ?? undefined,
      onText: (text, logprobs) => post({ type: "text", id, text, logprobs: entries(logprobs) }),
    },
    onDone: (result) => {
      end();
      post({ type: "done", id, text: result.text, promptTokens: prompt.length,
        completionTokens: result.tokens.length, stopReason: result.stopReason });
    },
    onError: (err) => {
      end();
      fail(id, 500, err.message, null, "internal_error");
    },
  });
  active.add(id);
  void loop();
}

const utf8 = new TextEncoder();

/** A token's bytes for the API: its text, or (a control token, which has none) its name. */
function tokenBytes(tokenizer: Tokenizer, id: number): number[] {
  const bytes = tokenizer.tokenBytes(id);
  return Array.from(bytes.length > 0 ? bytes : utf8.encode(tokenizer.tokenText(id)));
}

function logprobEntry(tokenizer: Tokenizer, p: TokenLogprob): LogprobEntry {
  return {
    bytes: tokenBytes(tokenizer, p.token), logprob: p.logprob, offset: p.offset,
    top: p.top.map((t) => ({ bytes: tokenBytes(tokenizer, t.token), logprob: t.logprob })),
  };
}
