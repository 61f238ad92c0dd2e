// A generation in flight, seen from the caller's thread: an async iterable of text pieces that
// also settles `result` with the whole completion. Pieces arrive as the engine's thread posts
// them; the caller's event loop is never blocked.
import { InferError } from "../errors.ts";
import type { EngineThread, JobDoneEvent, JobErrorEvent, Ticket } from "../runtime/engine-thread.ts";
import type { Job } from "../runtime/job.ts";
import { finishReasonOf, type Completion, type GenerateOptions, type Piece } from "./options.ts";

function completionOf(e: JobDoneEvent): Completion {
  const generated = Math.max(e.tokens.length - 1, 0);
  return {
    text: e.text, toolCalls: e.toolCalls, tokens: e.tokens,
    finishReason: finishReasonOf(e.stopReason, e.toolCalls.length > 0),
    stopReason: e.stopReason,
    usage: { promptTokens: e.promptTokens, completionTokens: e.tokens.length,
      totalTokens: e.promptTokens + e.tokens.length },
    timings: { promptEvaluated: e.prefilled, promptMs: e.promptMs, generateMs: e.generateMs,
      tokensPerSecond: e.generateMs > 0 ? (generated / e.generateMs) * 1000 : 0 },
    ...(e.speculation ? { speculation: e.speculation } : {}),
  };
}

export class CompletionStream implements AsyncIterable<Piece> {
  /** The whole completion, once generation has ended (rejects as the iteration does). */
  readonly result: Promise<Completion>;
  /**
   * Settles once the engine has taken the prompt (or the job ended first): rejects as `result`
   * does when the job failed before it began (a prompt that does not fit the context).
   */
  readonly started: Promise<void>;
  private begin!: { resolve: () => void; reject: (e: unknown) => void };
  /** The pieces so far; each iteration reads them from the start, then waits for more. */
  private readonly pieces: Piece[] = [];
  private ended = false;
  private failure: { error: unknown } | null = null;
  private wake: (() => void)[] = [];
  private readonly ticket: Ticket;

  constructor(private readonly thread: EngineThread, job: Job,
    private readonly options: Pick<GenerateOptions, "signal" | "stopOnAbortSignal">) {
    let settle!: { resolve: (c: Completion) => void; reject: (e: unknown) => void };
    this.result = new Promise<Completion>((resolve, reject) => (settle = { resolve, reject }));
    this.result.catch(() => {}); // a caller who only iterates sees the error there
    this.started = new Promise<void>((resolve, reject) => (this.begin = { resolve, reject }));
    this.started.catch(() => {});
    this.result.then(() => this.begin.resolve(), (e) => this.begin.reject(e));
    this.ticket = thread.ticket(job);
    const signal = options.signal;
    if (signal?.aborted) {
      this.finish({ error: signal.reason });
      settle.reject(signal.reason);
      return;
    }
    signal?.addEventListener("abort", () => thread.cancel(this.ticket), { once: true });
    thread.start(this.ticket);
    void this.pump(settle);
  }

  /** Reads the job's events as they come: pieces for the iterations, the end for `result`. */
  private async pump(settle: { resolve: (c: Completion) => void; reject: (e: unknown) => void }) {
    for (;;) {
      const e = await this.ticket.next();
      if (e.type === "started") this.begin.resolve();
      if (e.type === "text") {
        if (e.toolCalls) this.pieces.push({ text: e.text, toolCalls: e.toolCalls });
        else if (e.text.length > 0) this.pieces.push({ text: e.text });
        this.notify();
        continue;
      }
      if (e.type !== "done" && e.type !== "error") continue;
      try {
        const c = this.completion(e);
        this.finish(null);
        settle.resolve(c);
      } catch (error) {
        this.finish({ error });
        settle.reject(error);
      }
      return;
    }
  }

  /** The event that ended the job, as the result; throws what the caller should see. */
  private completion(e: JobDoneEvent | JobErrorEvent): Completion {
    if (e.type === "error") throw new InferError(e.kind, e.message);
    const c = completionOf(e);
    const signal = this.options.signal;
    if (c.finishReason === "abort" && signal?.aborted && !this.options.stopOnAbortSignal) {
      throw signal.reason;
    }
    return c;
  }

  private finish(failure: { error: unknown } | null): void {
    this.ended = true;
    this.failure = failure;
    this.notify();
  }

  private notify(): void {
    for (const w of this.wake.splice(0)) w();
  }

  /**
   * The pieces, each once they are decoded. Leaving the loop early (break, return, a throw in
   * its body) stops the generation at its next step; `result` then has the text generated.
   */
  async *[Symbol.asyncIterator](): AsyncIterator<Piece> {
    let read = 0;
    try {
      for (;;) {
        while (read < this.pieces.length) yield this.pieces[read++];
        if (this.ended) break;
        await new Promise<void>((resolve) => this.wake.push(resolve));
      }
      if (this.failure) throw this.failure.error;
    } finally {
      if (!this.ended) this.thread.cancel(this.ticket);
    }
  }
}
