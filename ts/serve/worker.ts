// The engine's thread: a Bun Worker that opens the model and runs one job at a time, so the
// HTTP event loop (server.ts) stays free to answer /health and queue new requests. Text is
// posted back as it is generated; a "cancel" message (the client went away) is read between
// tokens, because the generation loop yields to this worker's event loop after each one.
import { chatTemplateFor, turnTokens, type ChatTemplate } from "../chat/template.ts";
import { Engine, type TokenConstraint } from "../engine/engine.ts";
import { InferError } from "../errors.ts";
import { JsonGrammar } from "../sample/json-grammar.ts";
import { anyObject, compileSchema } from "../sample/json-schema.ts";
import type { FromWorker, ToWorker } from "./messages.ts";
import type { Job } from "./protocol.ts";

declare const self: { postMessage(m: FromWorker): void; onmessage: ((e: MessageEvent<ToWorker>) => void) | null };

let engine: Engine | null = null;
let template: ChatTemplate | null = null;
let templateError: string | null = null;
let turnStops: number[] = [];
const cancelled = new Set<number>();
const pending: { id: number; job: Job }[] = [];
let busy = false;
let closing = false;

function shutDown(): void {
  engine?.close();
  engine = null;
  post({ type: "closed" });
}

const post = (m: FromWorker) => self.postMessage(m);

self.onmessage = (e) => {
  const m = e.data;
  switch (m.type) {
    case "open": open(m.settings); break;
    case "run": pending.push({ id: m.id, job: m.job }); void drain(); break;
    case "cancel": cancelled.add(m.id); break;
    case "close":
      closing = true;
      pending.length = 0;
      if (!busy) shutDown();
      break;
  }
};

function open(settings: Extract<ToWorker, { type: "open" }>["settings"]): void {
  try {
    // In the single executable the worker is bundled apart from the embedded libraries; it
    // loads the one the main thread found.
    if (settings.library && !process.env.INFER_LIB) process.env.INFER_LIB = settings.library;
    engine = Engine.open(settings);
    try {
      template = chatTemplateFor(engine.file.metadata, engine.tokenizer);
      turnStops = turnTokens(template, engine.tokenizer);
    } catch (err) {
      templateError = (err as Error).message; // completions still work
    }
    const name = engine.file.metadata.get("general.name");
    post({ type: "ready", info: {
      contextLength: engine.contextLength, vocabSize: engine.tokenizer.vocabSize,
      name: typeof name === "string" ? name : null,
    } });
  } catch (err) {
    post({ type: "failed", message: (err as Error).message });
  }
}

async function drain(): Promise<void> {
  if (busy) return;
  busy = true;
  try {
    while (pending.length > 0) {
      const { id, job } = pending.shift()!;
      if (cancelled.delete(id)) continue;
      try {
        await run(id, job);
      } catch (err) { // a bug, not the request's fault: report it and serve the next one
        engine?.reset();
        fail(id, 500, (err as Error).message, null, "internal_error");
      }
      cancelled.delete(id);
    }
  } finally {
    busy = false;
    if (closing) shutDown();
  }
}

function fail(id: number, status: number, message: string, param: string | null = null,
  code: string | null = null): void {
  post({ type: "error", id, status, message, param, code });
}

async function run(id: number, job: Job): Promise<void> {
  const e = engine;
  if (!e) return fail(id, 503, "the model is not loaded");
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
  if (job.format.type === "json_object") constraint = new JsonGrammar(e.tokenizer, anyObject);
  else if (job.format.type === "json_schema") {
    constraint = new JsonGrammar(e.tokenizer, compileSchema(job.format.schema));
  }
  post({ type: "started", id, promptTokens: prompt.length });
  try {
    const result = await e.generateAsync(prompt, {
      maxTokens: job.maxTokens, sampling: job.sampling, stop: [...job.stop], constraint,
      stopTokens: job.kind === "chat" ? turnStops : undefined,
      shouldStop: () => closing || cancelled.has(id),
      onText: (text) => post({ type: "text", id, text }),
    });
    post({ type: "done", id, text: result.text, promptTokens: prompt.length,
      completionTokens: result.tokens.length, stopReason: result.stopReason });
  } catch (err) {
    // The cache may hold a half-evaluated sequence: start the next one from nothing.
    e.reset();
    fail(id, 500, (err as Error).message, null, "internal_error");
  }
}
