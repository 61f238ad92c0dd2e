// POST /v1/embeddings in OpenAI's shapes: `input` as a string, an array of strings, an array of
// token ids or an array of those; one vector per input, L2-normalised, as floats or (asked with
// encoding_format "base64", as the openai client does by default) as base64 of little-endian
// float32 bytes. The request is one job in the request queue; its inputs are sequences of the
// engine's batch scheduler, batched with whatever else runs (ts/engine/scheduler.ts).
import { quote } from "../errors.ts";
import type { EmbedJob } from "../runtime/job.ts";
import type { GenerationContext } from "./completions.ts";
import { json } from "./completions.ts";
import { ApiError } from "./protocol.ts";

/** Inputs one request may carry, as OpenAI allows. */
export const MAX_INPUTS = 2048;

const FIELDS = new Set(["model", "input", "encoding_format", "dimensions", "user"]);

const bad = (param: string, message: string, code: string | null = "invalid_value") =>
  new ApiError(400, message, param, code);

export interface EmbeddingRequest {
  readonly model: string;
  readonly base64: boolean;
  readonly job: EmbedJob;
}

const isTokens = (v: unknown): v is number[] =>
  Array.isArray(v) && v.every((t) => typeof t === "number" && Number.isInteger(t));

/** Validates a body into the job it asks for (every refusal a 400 naming the field). */
export function parseEmbeddingRequest(body: Record<string, unknown>,
  dimensions: number): EmbeddingRequest {
  for (const [k, v] of Object.entries(body)) {
    if (v !== null && !FIELDS.has(k)) {
      throw bad(k, `unknown parameter ${quote(k)}`, "unsupported_parameter");
    }
  }
  if (typeof body.model !== "string" || body.model === "") {
    throw bad("model", "'model' must be a non-empty string", "missing_required_parameter");
  }
  const format = body.encoding_format ?? "float";
  if (format !== "float" && format !== "base64") {
    throw bad("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
  }
  // The model's vectors have one size; a shorter one would need a model trained for it.
  const asked = body.dimensions;
  if (asked !== undefined && asked !== null && asked !== dimensions) {
    throw bad("dimensions", `'dimensions' must be ${dimensions}, this model's embedding size ` +
      `(shortened embeddings are not supported)`, "unsupported_value");
  }
  return { model: body.model, base64: format === "base64",
    job: { kind: "embedding", inputs: inputsOf(body.input), pooling: null, normalize: true } };
}

function inputsOf(input: unknown): (string | number[])[] {
  const what = "'input' must be a non-empty string, an array of them, an array of token ids " +
    "or an array of those";
  if (input === undefined || input === null) {
    throw bad("input", "'input' is required", "missing_required_parameter");
  }
  let list: (string | number[])[];
  if (typeof input === "string") list = [input];
  else if (isTokens(input) && input.length > 0) list = [input];
  else if (Array.isArray(input) && input.every((x) => typeof x === "string" || isTokens(x))) {
    list = input as (string | number[])[];
  } else throw bad("input", what);
  if (list.length === 0) throw bad("input", "'input' is an empty array");
  if (list.length > MAX_INPUTS) {
    throw bad("input", `'input' has ${list.length} items; at most ${MAX_INPUTS} per request`);
  }
  const empty = list.findIndex((x) => x.length === 0);
  if (empty >= 0) {
    throw bad("input", list.length === 1 ? "'input' is empty"
      : `'input[${empty}]' is empty`);
  }
  return list;
}

/** Little-endian float32 bytes, base64-encoded (the byte order of every platform infer runs on). */
function base64Of(v: Float32Array): string {
  return Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("base64");
}

export async function answerEmbeddings(c: GenerationContext, req: Request,
  body: Record<string, unknown>): Promise<Response> {
  const parsed = parseEmbeddingRequest(body, c.info.embeddingLength);
  if (parsed.model !== c.modelId) {
    throw new ApiError(404, `the model ${quote(parsed.model)} does not exist; this server has ` +
      `${quote(c.modelId)}`, "model", "model_not_found");
  }
  c.checkAvailable();
  const [ticket] = c.queue.submit([parsed.job]);
  const abort = () => {
    if (!ticket.finished) c.metrics.cancelled++;
    c.queue.cancel(ticket);
  };
  req.signal.addEventListener("abort", abort, { once: true });
  for (;;) {
    const e = await ticket.next();
    if (e.type === "error") throw new ApiError(e.status, e.message, e.param, e.code);
    if (e.type !== "embedded") continue;
    const tokens = e.inputTokens.reduce((n, t) => n + t, 0);
    c.metrics.promptTokens += tokens;
    return json({
      object: "list",
      data: e.embeddings.map((v, index) => ({
        object: "embedding", index, embedding: parsed.base64 ? base64Of(v) : Array.from(v),
      })),
      model: c.modelId,
      usage: { prompt_tokens: tokens, total_tokens: tokens },
    });
  }
}
