// `infer serve`: the OpenAI-compatible HTTP server (ts/serve) on one model.
import { InferError, quote } from "../errors.ts";
import { startServer } from "../serve/server.ts";
import { parseCommand } from "./args.ts";
import { resolveModel } from "./models.ts";
import { backendOption, intOption, threadsOption } from "./options.ts";
import { defaultModelPath } from "./setup.ts";

export const serveUsage = `usage: infer serve [options]

An OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions (streaming by
SSE or not; temperature, top_p, max_tokens, stop, seed, presence/frequency_penalty, logit_bias,
response_format json_object / json_schema), GET /v1/models, /health and /metrics (Prometheus).
The model runs in a worker thread that decodes up to --parallel requests together (continuous
batching: requests join and leave the batch between steps, prompts are evaluated in chunks
between decode steps); others wait in a bounded queue (429 with Retry-After when it is full).
A prefix cache shares the keys and values of common prompt beginnings (a system prompt) across
requests. A client that disconnects cancels its request and frees its slot.

  -m, --model M          a GGUF file or the name of a model in the cache
                         (default: the installed Gemma 3 270M Q4_K_M)
  --host H               address to listen on (default 127.0.0.1)
  --port N               port (default 8080; 0: any free port)
  -c, --ctx N            context length of each sequence (default: min(4096, the model's))
  --parallel N           requests decoded together, each with its own KV cache (default 4)
  --prefill-chunk N      prompt tokens per step while other requests decode (default 64)
  --prefix-cache MIB     memory for the prefix cache (default 128; 0: off)
  -t, --threads N        CPU threads (default: all cores)
  --backend B            cpu, cuda, metal or auto: a GPU when available (default: auto)
  --api-key KEY          require 'Authorization: Bearer KEY' on /v1/* (also: INFER_API_KEY)
  --queue N              requests that may wait for a slot (default 16)
  --max-body BYTES       largest request body (default 1048576)
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
      "api-key": { type: "string" }, queue: { type: "string" }, "max-body": { type: "string" },
      "model-id": { type: "string" }, help: { type: "boolean", short: "h" },
      parallel: { type: "string" }, "prefill-chunk": { type: "string" },
      "prefix-cache": { type: "string" },
    },
  });
  if (values.help) { process.stdout.write(serveUsage); return 0; }
  const ctx = values.ctx ?? values["ctx-size"];
  const host = values.host ?? "127.0.0.1";
  const port = intOption(values.port, "--port", 8080, 0, 65535);
  const threads = threadsOption(values.threads), backend = backendOption(values.backend);
  const modelPath = resolveModel(values.model ?? defaultModelPath());
  checkCanListen(host, port);
  const server = await startServer({
    modelPath, host, port,
    contextLength: ctx === undefined ? undefined : intOption(ctx, "--ctx", 0, 1),
    threads, backend,
    apiKey: values["api-key"] ?? process.env.INFER_API_KEY ?? null,
    maxQueue: intOption(values.queue, "--queue", 16, 0),
    parallel: intOption(values.parallel, "--parallel", 4, 1),
    prefillChunk: intOption(values["prefill-chunk"], "--prefill-chunk", 64, 1),
    prefixCacheBytes: intOption(values["prefix-cache"], "--prefix-cache", 128, 0) * (1 << 20),
    maxBodyBytes: intOption(values["max-body"], "--max-body", 1 << 20, 1024),
    modelId: values["model-id"],
  });
  process.stderr.write(`infer: serving '${server.modelId}' (context ${server.info.contextLength}, ` +
    `${server.parallel} in parallel) at ${server.url}/v1\n`);
  await new Promise<void>((resolve) => {
    process.once("SIGINT", resolve);
    process.once("SIGTERM", resolve);
  });
  process.stderr.write("infer: stopping\n");
  await server.stop();
  return 0;
}

/**
 * Binds host:port once and lets go, before the model is loaded: a port in use or an address
 * this machine does not have is then one line at once, not a stack trace after the load.
 */
function checkCanListen(host: string, port: number): void {
  try {
    Bun.listen({ hostname: host, port, socket: { data() {} } }).stop(true);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const where = `${quote(host, 60)} port ${port}`;
    if (code === "EADDRINUSE") {
      throw new InferError("io", `cannot listen on ${where}: it is in use (another server?); ` +
        "choose another with --port, or --port 0 for any free one");
    }
    throw new InferError("io", `cannot listen on ${where}${code ? ` (${code})` : ""}; --host ` +
      "must be an address of this machine, e.g. 127.0.0.1 or 0.0.0.0");
  }
}
