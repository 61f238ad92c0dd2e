// The engine's thread: a Bun Worker that opens the model and runs the batch scheduler
// (ts/engine/scheduler.ts), so that the owner's event loop (the library's caller, the CLI, the
// server answering /health) stays free. Jobs join the running batch between steps; text is
// posted back as it is generated. New jobs and "cancel" messages (the client went away) are read between steps,
// because the loop yields to this worker's event loop after each forward pass. Around every
// piece of work (a step, a job's tokenization and constraint) the worker marks the shared
// heartbeat cell, so that the owner's watchdog can tell a busy engine from a stuck one.
import { chatTemplateFor, controlToken, turnTokens, type ChatTemplate,
} from "../chat/template.ts";
import { planTools, ToolCallReader, type ToolPlan } from "../chat/tools.ts";
import { isSet, setSetting, setting } from "../config/env.ts";
import { Engine } from "../engine/engine.ts";
import type { TokenConstraint } from "../sample/constraint.ts";
import type { TokenLogprob } from "../engine/generation.ts";
import { BatchScheduler } from "../engine/scheduler.ts";
import { defaultSpeculation, type SpeculationOptions } from "../engine/speculation.ts";
import { DraftModel } from "../engine/draft-model.ts";
import type { BackendKind } from "../backend/select.ts";
import { InferError, type InferErrorCode } from "../errors.ts";
import { parameterCount, quantOf } from "../gguf/file-type.ts";
import { JsonGrammar } from "../sample/json-grammar.ts";
import { anyObject, compileSchema, minLength, type JsonNode } from "../sample/json-schema.ts";
import type { Tokenizer } from "../tokenizer/index.ts";
import type { EmbedJob, Job, LogprobEntry } from "./job.ts";
import type { EngineInfo, EngineStats, FromWorker, StallForTests, ToWorker } from "./messages.ts";

declare const self: {
  postMessage(m: FromWorker): void;
  onmessage: ((e: MessageEvent<ToWorker>) => void) | null;
};

let engine: Engine | null = null;
let scheduler: BatchScheduler | null = null;
let template: ChatTemplate | null = null;
let templateError: string | null = null;
let turnStops: number[] = [];
/** Llama 3.1's <|python_tag|>, shown in an answer read for tool calls. */
let pythonTag: number | null = null;
/** Speculation for jobs that name none. */
let speculation: SpeculationOptions = { mode: "off" };
let draftModel: DraftModel | null = null;
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
  draftModel?.close();
  draftModel = null;
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
        working(() => m.job.kind === "embedding" ? submitEmbedding(m.id, m.job)
          : submit(m.id, m.job));
      } catch (err) { // a bug, not the request's fault: report it and serve the next one
        fail(m.id, "internal", 500, (err as Error).message, null, "internal_error");
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
    const onProgress = settings.progress
      ? (done: number, total: number) => post({ type: "progress", done, total }) : undefined;
    engine = Engine.open({ ...settings, onProgress });
    const prefixBytes = settings.prefixCacheBytes ?? 128 << 20;
    if (settings.draftModel) {
      // On the same backend, with the same context, so it drafts for any sequence it serves.
      const draftEngine = Engine.open({ modelPath: settings.draftModel, threads: settings.threads,
        backend: engine.backend.name as BackendKind, contextLength: engine.contextLength });
      try {
        draftModel = new DraftModel(draftEngine, engine);
      } catch (err) {
        draftEngine.close();
        throw err;
      }
    }
    speculation = settings.speculation ??
      (draftModel ? { mode: "draft" } : defaultSpeculation(engine.backend.name));
    // A backend that runs one sequence per pass serves one request at a time.
    const asked = settings.parallel ?? 1;
    const parallel = !engine.backend.sequenceBatches ? 1
      : asked === "auto" ? engine.defaultParallel() : asked;
    scheduler = new BatchScheduler(engine, { slots: parallel,
      deviceGreedy: setting("INFER_DEVICE_GREEDY"), draftModel,
      prefillChunk: settings.prefillChunk,
      prefixCache: prefixBytes > 0 ? { bytesMax: prefixBytes } : null });
    try {
      template = chatTemplateFor(engine.file.metadata, engine.tokenizer);
      turnStops = turnTokens(template, engine.tokenizer);
      pythonTag = template.source.includes("<|python_tag|>")
        ? controlToken(engine.tokenizer, "<|python_tag|>") : null;
    } catch (err) {
      templateError = (err as Error).message; // completions still work
    }
    post({ type: "ready", info: describe(engine, parallel) });
  } catch (err) {
    const kind = err instanceof InferError ? err.code : "internal";
    post({ type: "failed", kind, message: (err as Error).message });
  }
}

function describe(e: Engine, parallel: number): EngineInfo {
  const info = e.model.info;
  return {
    name: info.name ?? null, architecture: info.architecture, parameters: parameterCount(e.file),
    quantization: quantOf(e.file), contextLength: e.contextLength,
    trainedContextLength: info.contextLength, vocabSize: info.vocabSize,
    layers: info.kvShapes.length, embeddingLength: info.embedding, pooling: e.pooling,
    backend: e.backend.name, backendReason: e.backendWhy,
    batch: e.model.maxBatch, parallel,
    chatTemplate: template?.origin ?? null, loadMs: e.loadMs,
  };
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

function fail(id: number, kind: InferErrorCode, status: number, message: string,
  param: string | null = null, code: string | null = null): void {
  post({ type: "error", id, kind, status, message, param, code });
}

/** Tokenizes and checks a job, then hands it to the scheduler. */
function submit(id: number, job: Job): void {
  const e = engine, sched = scheduler;
  if (!e || !sched) return fail(id, "internal", 503, "the model is not loaded");
  const param = job.kind === "chat" ? "messages" : "prompt";
  if ((job.speculation ?? speculation).mode === "draft" && !draftModel) {
    return fail(id, "invalid_argument", 400, "speculation 'draft' needs a draft model, and " +
      "none was loaded (--draft-model)", "spec");
  }
  let prompt: number[];
  let tools: ToolPlan | null = null;
  try {
    if (job.kind === "chat") {
      if (!template) {
        return fail(id, "unsupported", 400, templateError ?? "the model has no chat template", param);
      }
      try {
        tools = planTools(template.source, job.messages!, job.tools, job.toolChoice);
      } catch (err) {
        if (err instanceof InferError) {
          return fail(id, err.code, 400, err.message, "tools", "unsupported_schema");
        }
        throw err;
      }
      prompt = template.encode(e.tokenizer, tools.messages, { tools: tools.renderTools,
        builtinTools: tools.builtinTools });
    } else if (typeof job.prompt === "string") {
      prompt = e.tokenizer.encode(job.prompt, { addSpecial: true, parseSpecial: true });
    } else {
      prompt = [...job.prompt!];
      const bad = prompt.find((t) => !(Number.isInteger(t) && t >= 0 && t < e.tokenizer.vocabSize));
      if (bad !== undefined) {
        return fail(id, "invalid_argument", 400, `the prompt's token ${bad} is not in the ` +
          `vocabulary (0..${e.tokenizer.vocabSize - 1})`, param);
      }
    }
  } catch (err) {
    if (err instanceof InferError) return fail(id, err.code, 400, err.message, param);
    throw err;
  }
  if (prompt.length === 0) return fail(id, "invalid_argument", 400, "the prompt is empty", param);
  if (prompt.length >= e.contextLength) {
    return fail(id, "context_overflow", 400, `the prompt (${prompt.length} tokens) does not fit ` +
      `the context of ${e.contextLength} tokens with room to answer`, param,
    "context_length_exceeded");
  }
  let constraint: TokenConstraint | undefined;
  const format = job.format;
  let grammar: { node: JsonNode; prefix: string; suffix: string; what: string } | null = null;
  if (tools?.grammar) grammar = { ...tools.grammar, what: "tool call" };
  else if (format.type !== "text") {
    try {
      const node = format.type === "json_object" ? anyObject : compileSchema(format.schema);
      grammar = { node, prefix: "", suffix: "", what: "response format" };
    } catch (err) {
      if (err instanceof InferError) {
        return fail(id, err.code, 400, err.message, "response_format", "unsupported_schema");
      }
      throw err;
    }
  }
  if (grammar) {
    // The grammar needs a token per byte of its shortest output (so that output cut short still
    // parses): the asked tokens and the room the prompt leaves must both hold it.
    const room = e.contextLength - prompt.length;
    const shortest = minLength(grammar.node) + utf8.encode(grammar.prefix + grammar.suffix).length;
    const what = grammar.what;
    if (job.maxTokens >= 0 && shortest > job.maxTokens) {
      return fail(id, "invalid_argument", 400, `max tokens (${job.maxTokens}) is too small for ` +
        `the ${what}: its shortest output is ${shortest} bytes, and structured output ` +
        `needs a token per byte of it to be sure to finish`, "max_tokens", "invalid_value");
    }
    if (shortest > room) {
      return fail(id, "context_overflow", 400, `the prompt (${prompt.length} tokens) leaves ` +
        `room for ${room} tokens in the context of ${e.contextLength}, fewer than the ${what}'s ` +
        `shortest output needs (${shortest} bytes, a token each)`, param,
      "context_length_exceeded");
    }
    constraint = new JsonGrammar(e.tokenizer, grammar.node, grammar);
  }
  // Calls are read out of the text as it comes: text that may begin a call is held back.
  const reader = tools?.parse ? new ToolCallReader(tools.format) : null;
  const entries = (list: readonly TokenLogprob[] | undefined) =>
    list?.map((p) => logprobEntry(e.tokenizer, p));
  post({ type: "started", id, promptTokens: prompt.length });
  const end = () => { active.delete(id); cancelled.delete(id); };
  sched.submit({
    prompt,
    options: {
      maxTokens: job.maxTokens, sampling: job.sampling, stop: [...job.stop], constraint,
      ignoreEos: job.ignoreEos, contextShift: job.contextShift, contextShiftPolicy: job.contextShiftPolicy,
      speculation: job.speculation ?? speculation,
      stopTokens: job.kind === "chat" ? turnStops : undefined,
      shownTokens: reader && tools?.format === "llama3" && pythonTag !== null ? [pythonTag]
        : undefined,
      shouldStop: () => closing || cancelled.has(id),
      logprobs: job.logprobs ?? undefined,
      onText: (text, logprobs) => {
        if (!reader) return post({ type: "text", id, text, logprobs: entries(logprobs) });
        const piece = reader.feed(text);
        post({ type: "text", id, text: piece.content, logprobs: entries(logprobs),
          ...(piece.calls.length > 0 ? { toolCalls: piece.calls } : {}),
          ...(piece.deltas.length > 0 ? { toolCallDeltas: piece.deltas } : {}) });
      },
    },
    onDone: (r) => {
      end();
      const last = reader?.end();
      if (last && (last.content !== "" || last.calls.length > 0 || last.deltas.length > 0)) {
        post({ type: "text", id, text: last.content,
          ...(last.calls.length > 0 ? { toolCalls: last.calls } : {}),
          ...(last.deltas.length > 0 ? { toolCallDeltas: last.deltas } : {}) });
      }
      post({ type: "done", id, text: reader ? reader.content : r.text,
        toolCalls: reader ? reader.calls : [], tokens: r.tokens, promptTokens: r.promptTokens.length,
        prefilled: r.prefilled, stopReason: r.stopReason, promptMs: r.promptMs,
        generateMs: r.generateMs, speculation: r.speculation });
    },
    onError: (err) => {
      end();
      const kind = err instanceof InferError ? err.code : "internal";
      // The scheduler refuses a request whose KV cache can never fit the GPU's page pool.
      if (kind === "context_overflow") {
        fail(id, kind, 400, err.message, "max_tokens", "context_length_exceeded");
      } else fail(id, kind, 500, err.message, null, "internal_error");
    },
  });
  active.add(id);
  void loop();
}

/**
 * Tokenizes and checks every input of an embedding job, then hands each to the scheduler as a
 * sequence of its own; the job ends when all have their vectors, or at the first failure.
 */
function submitEmbedding(id: number, job: EmbedJob): void {
  const e = engine, sched = scheduler;
  if (!e || !sched) return fail(id, "internal", 503, "the model is not loaded");
  const pooling = job.pooling ?? e.pooling;
  if (pooling === null) {
    return fail(id, "unsupported", 400, "the model is a reranker (pooling_type rank), whose " +
      "classifier head infer does not run; ask for a pooling (mean, cls, last) to embed with it",
    null, "unsupported_model");
  }
  const inputs: number[][] = [];
  for (const [i, input] of job.inputs.entries()) {
    const at = job.inputs.length > 1 ? `input ${i}` : "the input";
    let tokens: number[];
    if (typeof input === "string") {
      tokens = e.tokenizer.encode(input, { addSpecial: true, parseSpecial: true });
    } else {
      tokens = [...input];
      const bad = tokens.find((t) => !(Number.isInteger(t) && t >= 0 && t < e.tokenizer.vocabSize));
      if (bad !== undefined) {
        return fail(id, "invalid_argument", 400, `${at}: token ${bad} is not in the vocabulary ` +
          `(0..${e.tokenizer.vocabSize - 1})`, "input", "invalid_value");
      }
    }
    if (tokens.length === 0) {
      return fail(id, "invalid_argument", 400, `${at} is empty`, "input", "invalid_value");
    }
    if (tokens.length > e.contextLength) {
      return fail(id, "context_overflow", 400, `${at} (${tokens.length} tokens) does not fit the ` +
        `context of ${e.contextLength} tokens`, "input", "context_length_exceeded");
    }
    inputs.push(tokens);
  }
  if (inputs.length === 0) {
    return fail(id, "invalid_argument", 400, "nothing to embed", "input", "invalid_value");
  }
  post({ type: "started", id, promptTokens: inputs.reduce((n, t) => n + t.length, 0) });
  const embeddings: Float32Array[] = new Array(inputs.length);
  let left = inputs.length, failed = false;
  active.add(id);
  const end = () => { active.delete(id); cancelled.delete(id); };
  for (const [i, prompt] of inputs.entries()) {
    sched.submitEmbedding({
      prompt, pooling, normalize: job.normalize,
      shouldStop: () => closing || failed || cancelled.has(id),
      onDone: (vector) => {
        embeddings[i] = vector;
        if (--left > 0 || failed) return;
        end();
        post({ type: "embedded", id, embeddings, inputTokens: inputs.map((t) => t.length) });
      },
      onError: (err) => {
        if (failed) return;
        failed = true; // the other inputs stop at the next step
        end();
        const kind = err instanceof InferError ? err.code : "internal";
        fail(id, kind, 500, err.message, null, "internal_error");
      },
    });
  }
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
