// The requests in front of the engine's thread: each is a Ticket (ts/runtime/engine-thread.ts)
// that reads the engine's events for it in order; the Queue runs up to `parallel` of them at
// once and keeps the others in a bounded FIFO (429 when it is full), so that a burst of requests
// waits here, where a client that leaves can be dropped, rather than in the engine.
import type { EngineThread, JobDoneEvent, JobEvent, Ticket } from "../runtime/engine-thread.ts";
import type { AnyJob } from "../runtime/job.ts";
import { ApiError } from "./protocol.ts";

export type WorkerEvent = JobEvent;
export type Done = JobDoneEvent;
export type { Ticket };

/** The engine's thread and the FIFO queue in front of it: up to `parallel` requests run at once. */
export class RequestQueue {
  private readonly queue: Ticket[] = [];
  private readonly running = new Set<Ticket>();
  private readonly open = new Set<Ticket>();
  private idleWaiters: (() => void)[] = [];

  constructor(private readonly thread: EngineThread, private readonly maxQueue: number,
    private readonly parallel: number) {}

  get depth(): number { return this.queue.length; }
  get active(): number { return this.running.size; }
  /** Why the engine stopped working for good, or null. */
  get broken(): string | null { return this.thread.broken; }

  /** Queues the jobs of one request (its choices) together, or none of them. */
  submit(jobs: AnyJob[]): Ticket[] {
    if (this.broken) {
      throw new ApiError(503, `the engine stopped: ${this.broken}`, null, "engine_unavailable");
    }
    if (jobs.length > this.parallel + this.maxQueue) {
      throw new ApiError(400, `'n' must be at most ${this.parallel + this.maxQueue} on this ` +
        `server (${this.parallel} slots and a queue of ${this.maxQueue})`, "n", "invalid_value");
    }
    const room = Math.max(0, this.parallel - this.running.size) + this.maxQueue - this.queue.length;
    if (jobs.length > room) {
      throw new ApiError(429, `the server is busy: ${this.queue.length} requests are waiting`,
        null, "queue_full");
    }
    const tickets = jobs.map((job) => this.thread.ticket(job));
    for (const t of tickets) {
      this.open.add(t);
      this.queue.push(t);
      void t.ended.then(() => this.end(t));
    }
    this.dispatch();
    return tickets;
  }

  /** The client went away: drop the request if it waits, stop it if it runs. */
  cancel(t: Ticket): void {
    if (t.finished) return;
    const at = this.queue.indexOf(t);
    if (at >= 0) {
      this.queue.splice(at, 1);
      t.push({ type: "error", id: t.id, kind: "internal", status: 499,
        message: "the client went away", param: null, code: "cancelled" });
    } else {
      this.thread.cancel(t);
    }
  }

  /** Answers every waiting request with `status` (the running ones go on). */
  refuseWaiting(status: number, message: string, code: string): void {
    for (const t of this.queue.splice(0)) {
      t.push({ type: "error", id: t.id, kind: "internal", status, message, param: null, code });
    }
  }

  /** Resolves once no request runs or waits. */
  whenIdle(): Promise<void> {
    if (this.open.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** Every request, running or waiting, fails (the engine is gone). */
  fail(why: string): void {
    this.thread.fail(why);
    this.refuseWaiting(500, `the engine stopped: ${why}`, "internal_error");
  }

  private end(t: Ticket): void {
    this.open.delete(t);
    this.running.delete(t);
    const at = this.queue.indexOf(t);
    if (at >= 0) this.queue.splice(at, 1);
    this.dispatch();
    if (this.open.size === 0) for (const wake of this.idleWaiters.splice(0)) wake();
  }

  private dispatch(): void {
    while (this.running.size < this.parallel && this.queue.length > 0 && !this.broken) {
      const t = this.queue.shift()!;
      this.running.add(t);
      this.thread.start(t);
    }
  }
}
