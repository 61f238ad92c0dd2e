// The owner's side of the engine's thread (worker.ts): opens the model there, starts jobs and
// routes what the worker says about each to its Ticket, which reads them in order. The library
// (ts/api/), and through it the CLI, and the server (ts/serve/) all generate through this one
// class, so a prompt reaches a token by one path.
import { InferError } from "../errors.ts";
import { isCompiled, libraryPath } from "../native/lib.ts";
import type { AnyJob } from "./job.ts";
import type { EngineInfo, EngineStats, FromWorker, OpenSettings, ToWorker } from "./messages.ts";

export type JobEvent = Exclude<FromWorker, { type: "ready" | "failed" | "progress" | "closed" | "stats" }>;
export type JobDoneEvent = Extract<JobEvent, { type: "done" }>;
export type JobErrorEvent = Extract<JobEvent, { type: "error" }>;
export type JobEmbeddedEvent = Extract<JobEvent, { type: "embedded" }>;

/** One job's events from the worker, read in order. */
export class Ticket {
  private readonly events: JobEvent[] = [];
  private wake: (() => void) | null = null;
  finished = false;
  /** Resolves when the job has ended, whichever way. */
  readonly ended: Promise<void>;
  private markEnded!: () => void;
  constructor(readonly id: number, readonly job: AnyJob) {
    this.ended = new Promise((resolve) => (this.markEnded = resolve));
  }

  /** Adds an event; a "done", "embedded" or "error" ends the job. */
  push(e: JobEvent): void {
    if (this.finished) return;
    this.events.push(e);
    this.wake?.();
    this.wake = null;
    if (e.type === "done" || e.type === "embedded" || e.type === "error") {
      this.finished = true;
      this.markEnded();
    }
  }

  async next(): Promise<JobEvent> {
    while (this.events.length === 0) await new Promise<void>((r) => (this.wake = r));
    return this.events.shift()!;
  }
}

export type ThreadSettings = Omit<OpenSettings, "heartbeat" | "library" | "progress">;

/**
 * The worker's module. In the single executable (bun build --compile, ts/cli/build-bin.ts) it is
 * an entry point of its own, bundled beside the main one under Bun's embedded file system.
 */
function workerPath(): string {
  if (import.meta.url.includes("$bunfs")) return "/$bunfs/root/ts/runtime/worker.js";
  return new URL("./worker.ts", import.meta.url).href;
}

export class EngineThread {
  private readonly running = new Map<number, Ticket>();
  private nextId = 1;
  private closedWaiters: (() => void)[] = [];
  private closing = false;
  private readonly beat: BigInt64Array;
  /** Why the engine stopped working for good, or null. */
  broken: string | null = null;
  /** The engine's state as the worker last reported it. */
  stats: EngineStats | null = null;

  private constructor(private readonly worker: Worker, readonly info: EngineInfo,
    heartbeat: SharedArrayBuffer) {
    this.beat = new BigInt64Array(heartbeat);
    worker.onmessage = (e: MessageEvent<FromWorker>) => this.onMessage(e.data);
    worker.onerror = (e) => this.fail(e.message);
  }

  /** Starts the worker and opens the model there; rejects with the loader's InferError. */
  static async open(settings: ThreadSettings,
    onProgress?: (done: number, total: number) => void): Promise<EngineThread> {
    const worker = new Worker(workerPath());
    const heartbeat = new SharedArrayBuffer(8);
    try {
      const info = await new Promise<EngineInfo>((resolve, reject) => {
        worker.onmessage = (e: MessageEvent<FromWorker>) => {
          const m = e.data;
          if (m.type === "ready") resolve(m.info);
          else if (m.type === "failed") reject(new InferError(m.kind, m.message));
          else if (m.type === "progress") onProgress?.(m.done, m.total);
        };
        worker.onerror = (e) => reject(new InferError("internal", `the engine worker failed: ${e.message}`));
        worker.postMessage({ type: "open", settings: {
          ...settings, heartbeat, progress: onProgress !== undefined,
          library: isCompiled() ? libraryPath() : undefined,
        } } satisfies ToWorker);
      });
      return new EngineThread(worker, info, heartbeat);
    } catch (err) {
      worker.terminate();
      throw err;
    }
  }

  /** How long the engine has been in its current piece of work (0: waiting for work). */
  busyMs(): number {
    const since = Number(Atomics.load(this.beat, 0));
    return since === 0 ? 0 : Math.max(0, Date.now() - since);
  }

  /** Jobs started and not ended. */
  get active(): number {
    return this.running.size;
  }

  /** A ticket for `job`, not yet started (a queue may hold it first). */
  ticket(job: AnyJob): Ticket {
    return new Ticket(this.nextId++, job);
  }

  /** Hands the job to the engine; its events go to the ticket. */
  start(t: Ticket): void {
    if (this.broken) {
      t.push({ type: "error", id: t.id, kind: "internal", status: 503,
        message: `the engine stopped: ${this.broken}`, param: null, code: "engine_unavailable" });
      return;
    }
    this.running.set(t.id, t);
    void t.ended.then(() => this.running.delete(t.id));
    this.post({ type: "run", id: t.id, job: t.job });
  }

  /** Asks the engine to end a running job at its next step (its text so far is kept). */
  cancel(t: Ticket): void {
    if (!t.finished && this.running.has(t.id)) this.post({ type: "cancel", id: t.id });
  }

  /**
   * Ends every job at the engine's next step (each with its text so far, as "interrupted"),
   * then closes the model; resolves when the worker says it has (a step stuck in native code
   * never ends: race this with a deadline, then terminate()).
   */
  endAll(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.closedWaiters.push(resolve));
    if (!this.closing) this.post({ type: "close" });
    this.closing = true;
    return closed;
  }

  /** Stops the thread now; jobs still running fail. */
  terminate(): void {
    this.fail("the model was closed");
    this.worker.terminate();
  }

  /** endAll(), waiting at most `timeoutMs` for the worker, then terminate(). */
  async close(timeoutMs = 5_000): Promise<void> {
    if (!this.broken) {
      let timer: Timer | undefined;
      await Promise.race([this.endAll(),
        new Promise<void>((r) => { timer = setTimeout(r, timeoutMs); })]);
      clearTimeout(timer);
    }
    this.terminate();
  }

  /** The worker died (or was closed): every job still running fails. */
  fail(why: string): void {
    this.broken ??= why;
    for (const t of [...this.running.values()]) {
      t.push({ type: "error", id: t.id, kind: "internal", status: 500,
        message: `the engine stopped: ${why}`, param: null, code: "internal_error" });
    }
    this.running.clear();
  }

  private onMessage(m: FromWorker): void {
    switch (m.type) {
      case "stats": this.stats = m.stats; return;
      case "closed": for (const wake of this.closedWaiters.splice(0)) wake(); return;
      case "ready": case "failed": case "progress": return;
      default: this.running.get(m.id)?.push(m);
    }
  }

  private post(m: ToWorker): void {
    this.worker.postMessage(m);
  }
}
