// Embeddings in the library: model.embed(text | texts) checks its options here and runs one
// EmbedJob on the engine's thread, where each input is a sequence of the batch scheduler beside
// any generation in flight (ts/engine/scheduler.ts; the pooling in ts/model/pooling.ts).
import { InferError } from "../errors.ts";
import { parsePooling, type Pooling } from "../model/pooling.ts";
import type { EngineThread } from "../runtime/engine-thread.ts";
import type { EmbedJob } from "../runtime/job.ts";

export interface EmbedOptions {
  /**
   * How a text's token vectors become one: mean, cls (the first token's) or last (default: the
   * model's GGUF pooling_type, mean where it declares none).
   */
  readonly pooling?: Pooling;
  /** L2-normalise each vector (default true), so a dot product is the cosine similarity. */
  readonly normalize?: boolean;
  /** Stops the embedding within one step; the call rejects with the signal's reason. */
  readonly signal?: AbortSignal;
}

/** The job for `inputs`, options checked (each bad value an InferError naming the option). */
export function embedJobOf(inputs: readonly (string | readonly number[])[],
  o: EmbedOptions): EmbedJob {
  if (o.signal !== undefined && !(o.signal instanceof AbortSignal)) {
    throw new InferError("invalid_argument", "signal: expected an AbortSignal");
  }
  if (o.normalize !== undefined && typeof o.normalize !== "boolean") {
    throw new InferError("invalid_argument", "normalize: expected a boolean");
  }
  return {
    kind: "embedding", inputs,
    pooling: o.pooling === undefined ? null : parsePooling(o.pooling, "pooling"),
    normalize: o.normalize ?? true,
  };
}

export interface Embedded {
  readonly embeddings: readonly Float32Array[];
  /** Each input's tokens (BOS included). */
  readonly inputTokens: readonly number[];
}

/** Runs an embedding job on the engine's thread; rejects with its InferError or the signal's. */
export async function runEmbedding(thread: EngineThread, job: EmbedJob,
  signal?: AbortSignal): Promise<Embedded> {
  if (signal?.aborted) throw signal.reason;
  const ticket = thread.ticket(job);
  const onAbort = () => thread.cancel(ticket);
  signal?.addEventListener("abort", onAbort, { once: true });
  thread.start(ticket);
  try {
    for (;;) {
      const e = await ticket.next();
      if (e.type === "embedded") return { embeddings: e.embeddings, inputTokens: e.inputTokens };
      if (e.type === "error") {
        if (signal?.aborted) throw signal.reason;
        throw new InferError(e.kind, e.message);
      }
    }
  } finally {
    signal?.removeEventListener("abort", onAbort);
  }
}
