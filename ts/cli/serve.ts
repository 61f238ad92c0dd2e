// `infer serve`: the OpenAI-compatible HTTP server (ts/serve) on one model.
import { setting } from "../config/env.ts";
import { InferError, quote } from "../errors.ts";
import { ensureModel } from "../models/fetch.ts";
import { resolveDraftModel } from "../engine/self-draft.ts";
import { listenError } from "../serve/http.ts";
import { startServer } from "../serve/server.ts";
import { parseCommand } from "./args.ts";
import {
  backendOption, cacheTypeOption, floatOption, gpusOption, intOption, speculationHelp,
  shiftPolicyOption, speculationLoad,
  threadsOption,
} from "./options.ts";

export const serveUsage = `usage: infer serve [options]

An OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions (streaming by
SSE or not; temperature, top_p, max_tokens, stop, seed, presence/frequency_penalty, logit_bias,
logprobs (chat: top_logprobs), response_format json_object / json_schema, tools and
tool_choice (chat), and llama.cpp's top_k, min_p, typical_p, repeat_penalty, repeat_last_n;
OpenAI fields infer does not implement, such as echo, best_of or suffix, are refused by name),
POST /v1/embeddings (strings or token ids, float or base64), GET /v1/models, /health, /metrics.
The model runs in a worker thread that decodes up to --parallel requests together (continuous
batching: requests join and leave the batch between steps, prompts are evaluated in chunks
between decode steps); others wait in a bounded queue (429 with Retry-After when it is full).
A prefix cache shares the keys and values of common prompt beginnings (a system prompt) across
requests. A client that disconnects cancels its request and frees its slot.

Limits: a request body must arrive within --body-timeout (408) and fit --max-body (413); while
bodies being received at once exceed 16 MiB (or four of --max-body), new ones get 503. Idle
connections close after 10 s. /health answers 503 while an engine step has run longer than
--step-timeout (a stuck engine), and new requests are refused until it finishes.
SIGTERM or Ctrl-C stops gracefully: no new connections, waiting requests get 503, running ones
may finish within --shutdown-timeout and are then ended early (finish_reason "length", then
[DONE]); a second signal ends them at once.
Access: with --api-key, /v1/* needs the key. Without it, only requests whose Host names this
server (localhost or an IP address, with its port) are answered. Requests from web pages of
another origin are refused (403) unless --cors allows that origin.

  -m, --model M          a GGUF file, the name of a model in the cache, or org/repo[:QUANT]
                         on the Hugging Face Hub, pulled on first use
                         (default: the installed Gemma 3 270M Q4_K_M)
  --host H               address to listen on (default 127.0.0.1)
  --port N               port (default 8080; 0: any free port)
  -c, --ctx N            context length of each sequence (default: min(4096, the model's))
  -ctk, --cache-type-k T KV cache keys: f16, q8_0, q4_0, tq4 or tq3 (default f16; tq: CPU, CUDA)
  -ctv, --cache-type-v T KV cache values, as -ctk
  --context-shift        a request with max_tokens past the context gets them: the context
                         keeps its first 4 tokens and drops the older half of the rest (CPU)
  --shift-policy P       with --context-shift: streaming (default: keep the newest) or h2o
                         (half of what is kept: the positions with the most attention so far)
  --parallel N           requests decoded together, each with its own KV cache (default 4;
                         CUDA, whose caches map memory as they fill: as many as fit at 2048
                         tokens each, up to 64; longer requests wait for memory, not fail)
  --prefill-chunk N      prompt tokens per step while other requests decode (default 64;
                         256 on CUDA)
  --prefix-cache MIB     memory for the prefix cache (default 128; 0: off)
${speculationHelp.trimEnd()}
                         (for requests without infer's own fields "spec" and "draft_max")
  -t, --threads N        CPU threads (default: physical cores)
  --backend B            cpu, cuda, metal or auto: a GPU when available (default: auto)
  --gpus N               GPUs to split the model over (default 1; more not yet: docs/cuda.md)
  --api-key KEY          require 'Authorization: Bearer KEY' on /v1/* (also: INFER_API_KEY)
  --queue N              requests that may wait for a slot (default 16)
  --max-body BYTES       largest request body (default 1048576)
  --body-timeout S       seconds to receive a request body (default 30)
  --step-timeout S       seconds one engine step may take before /health reports it stuck
                         (default 60)
  --shutdown-timeout S   on SIGTERM/SIGINT, seconds running requests may take to finish
                         (default 10)
  --cors ORIGIN          let web pages from ORIGIN call the server (repeatable or a comma
                         list; * allows any page: mind --api-key then)
  --model-id NAME        the model's name in the API (default: the file name without .gguf)
  -h, --help             this text
`;

export async function serveCommand(argv: string[]): Promise<number> {
  const { values } = parseCommand(argv, {
    positionals: { expected: "no arguments", min: 0, max: 0 },
    options: {
      model: { type: "string", short: "m" }, host: { type: "string" }, port: { type: "string" },
      ctx: { type: "string", short: "c" }, "ctx-size": { type: "string" },
      threads: { type: "string", short: "t" }, backend: { type: "string" },
      gpus: { type: "string" },
      "api-key": { type: "string" }, queue: { type: "string" }, "max-body": { type: "string" },
      "model-id": { type: "string" }, help: { type: "boolean", short: "h" },
      parallel: { type: "string" }, "prefill-chunk": { type: "string" },
      "prefix-cache": { type: "string" }, "body-timeout": { type: "string" },
      "step-timeout": { type: "string" }, "shutdown-timeout": { type: "string" },
      cors: { type: "string", multiple: true },
      spec: { type: "string" }, "draft-max": { type: "string" }, "draft-model": { type: "string" },
      "cache-type-k": { type: "string" }, "cache-type-v": { type: "string" },
      "context-shift": { type: "boolean" }, "shift-policy": { type: "string" },
    },
  });
  if (values.help) { process.stdout.write(serveUsage); return 0; }
  const ctx = values.ctx ?? values["ctx-size"];
  const host = values.host ?? "127.0.0.1";
  const port = intOption(values.port, "--port", 8080, 0, 65535);
  const threads = threadsOption(values.threads), backend = backendOption(values.backend);
  const spec = speculationLoad(values); // (a usage error before any download)
  const contextShiftPolicy = shiftPolicyOption(values["shift-policy"]);
  const modelPath = await ensureModel(values.model);
  const draftModel = spec.draftModel === undefined ? undefined
    : await resolveDraftModel(spec.draftModel, modelPath);
  checkCanListen(host, port);
  const server = await startServer({
    modelPath, host, port,
    contextLength: ctx === undefined ? undefined : intOption(ctx, "--ctx", 0, 1),
    threads, backend, gpus: gpusOption(values.gpus),
    cacheTypeK: cacheTypeOption(values["cache-type-k"], "--cache-type-k"),
    cacheTypeV: cacheTypeOption(values["cache-type-v"], "--cache-type-v"),
    contextShift: values["context-shift"] ?? false,
    contextShiftPolicy,
    apiKey: values["api-key"] ?? setting("INFER_API_KEY"),
    maxQueue: intOption(values.queue, "--queue", 16, 0),
    parallel: values.parallel === undefined ? "auto"
      : intOption(values.parallel, "--parallel", 4, 1),
    prefillChunk: values["prefill-chunk"] === undefined ? undefined
      : intOption(values["prefill-chunk"], "--prefill-chunk", 64, 1),
    prefixCacheBytes: intOption(values["prefix-cache"], "--prefix-cache", 128, 0) * (1 << 20),
    speculation: spec.speculation && { mode: spec.speculation, draftMax: spec.draftMax },
    draftModel,
    maxBodyBytes: intOption(values["max-body"], "--max-body", 1 << 20, 1024),
    bodyTimeoutMs: seconds(values["body-timeout"], "--body-timeout", 30) * 1000,
    stepTimeoutMs: seconds(values["step-timeout"], "--step-timeout", 60) * 1000,
    shutdownTimeoutMs: floatOption(values["shutdown-timeout"], "--shutdown-timeout", 10) * 1000,
    corsOrigins: corsOrigins(values.cors ?? []),
    modelId: values["model-id"],
  });
  process.stderr.write(`infer: serving '${server.modelId}' (context ${server.info.contextLength}, ` +
    `${server.parallel} in parallel) at ${server.url}/v1\n`);
  // The first SIGINT or SIGTERM stops gracefully; a second one ends running requests now.
  let signals = 0;
  let onSignal = () => {};
  await new Promise<void>((resolve, reject) => {
    onSignal = () => {
      if (signals++ > 0) return void server.stop({ timeoutMs: 0 });
      process.stderr.write(`infer: stopping (running requests may take ` +
        `${values["shutdown-timeout"] ?? 10} s to finish; a second signal ends them now)\n`);
      server.stop().then(resolve, reject);
    };
    process.on("SIGINT", onSignal);
    process.on("SIGTERM", onSignal);
  });
  process.off("SIGINT", onSignal);
  process.off("SIGTERM", onSignal);
  process.stderr.write("infer: stopped\n");
  return 0;
}

/** Seconds for a timeout: a positive number. */
function seconds(value: string | undefined, name: string, fallback: number): number {
  const s = floatOption(value, name, fallback);
  if (s <= 0) throw new InferError("invalid_argument", `${name} must be more than 0 seconds`);
  return s;
}

/** --cors values: origins (scheme://host[:port]) or *, each flag possibly a comma list. */
function corsOrigins(values: readonly string[]): string[] {
  const origins = values.flatMap((v) => v.split(",")).map((v) => v.trim()).filter((v) => v !== "");
  for (const origin of origins) {
    let valid = origin === "*";
    try {
      valid ||= new URL(origin).origin === origin.replace(/\/$/, "").toLowerCase();
    } catch { /* not a URL */ }
    if (!valid) {
      throw new InferError("invalid_argument", `--cors wants an origin such as ` +
        `http://localhost:3000 (or *), got ${quote(origin)}`);
    }
  }
  return origins.map((o) => o.replace(/\/$/, ""));
}

/**
 * Binds host:port once and lets go, before the model is loaded: a port in use or an address
 * this machine does not have is then one line at once, not a stack trace after the load.
 */
function checkCanListen(host: string, port: number): void {
  try {
    Bun.listen({ hostname: host, port, socket: { data() {} } }).stop(true);
  } catch (err) {
    throw listenError(host, port, err);
  }
}
