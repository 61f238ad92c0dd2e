// The requests in front of the engine's worker: each is a Ticket that reads the worker's events
// for it in order; the Scheduler runs up to `parallel` of them at once and keeps the others in
// a bounded FIFO queue (429 when it is full).
import type { EngineStats, FromWorker, ToWorker } from "./messages.ts";
import { ApiError, type Job } from "./protocol.ts";

export type WorkerEvent = Exclude<FromWorker, { type: "ready" | "failed" | "closed" | "stats" }>;
export type Done = Extract<WorkerEvent, { type: "done" }>;

/** One request's events from the worker, read in order. */
export class Ticket {
  private readonly events: WorkerEvent[] = [];
  private wake: (() => void) | null = null;
  finished = false;
  /** Resolves when the request has ended, whichever way. */
  readonly ended: Promise<void>;
  markEnded!: () => void;
  constructor(readonly id: number, readonly job: Job) {
    this.ended = new Promise((resolve) => (this.markEnded = resolve));
  }

  push(e: WorkerEvent): void {
    this.events.push(e);
    this.wake?.();
    this.wake = null;
  }

  async next(): Promise<WorkerEvent> {
    while (this.events.length === 0) await new Promise<void>((r) => (this.wake = r));
    return this.events.shift()!;
  }
}

/** The worker and the FIFO queue in front of it: up to `parallel` requests run at once. */
export class Scheduler {
  private readonly queue: Ticket[] = [];
  private readonly running = new Set<Ticket>();
  private readonly tickets = new Map<number, Ticket>();
  private nextId = 1;
  private idleWaiters: (() => void)[] = [];
  /** Why the engine stopped working for good, or null. */
  broken: string | null = null;
  /** The engine's state as the worker last reported it. */
  engine: EngineStats | null = null;

  constructor(private readonly worker: Worker, private readonly maxQueue: number,
    private readonly parallel: number) {}

  get depth(): number { return this.queue.length; }
  get active(): number { return this.running.size; }

  /** Queues the jobs of one request (its choices) together, or none of them. */
  submit(jobs: Job[]): Ticket[] {
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
    const tickets = jobs.map((job) => new Ticket(this.nextId++, job));
    for (const t of tickets) {
      this.tickets.set(t.id, t);
      this.queue.push(t);
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
      t.push({ type: "error", id: t.id, status: 499, message: "the client went away", param: null,
        code: "cancelled" });
      this.end(t);
    } else {
      this.post({ type: "cancel", id: t.id });
    }
  }

  onMessage(m: FromWorker): void {
    if (m.type === "stats") { this.engine = m.stats; return; }
    if (m.type === "ready" || m.type === "failed" || m.type === "closed") return;
    const t = this.tickets.get(m.id);
    if (!t) return;
    t.push(m);
    if (m.type === "done" || m.type === "error") this.end(t);
  }

  /** Answers every waiting request with `status` (the running ones go on). */
  refuseWaiting(status: number, message: string, code: string): void {
    for (const t of this.queue.splice(0)) {
      t.push({ type: "error", id: t.id, status, message, param: null, code });
      this.end(t);
    }
  }

  /** Resolves once no request runs or waits. */
  whenIdle(): Promise<void> {
    if (this.tickets.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** The worker died: every request fails. */
  fail(why: string): void {
    this.broken = why;
    for (const t of [...this.tickets.values()]) {
      t.push({ type: "error", id: t.id, status: 500, message: `the engine stopped: ${why}`,
        param: null, code: "internal_error" });
      this.end(t);
    }
    this.queue.length = 0;
  }

  private end(t: Ticket): void {
    t.finished = true;
    t.markEnded();
    this.tickets.delete(t.id);
    this.running.delete(t);
    this.dispatch();
    if (this.tickets.size === 0) for (const wake of this.idleWaiters.splice(0)) wake();
  }

  private dispatch(): void {
    while (this.running.size < this.parallel && this.queue.length > 0 && !this.broken) {
      const t = this.queue.shift()!;
      this.running.add(t);
      this.post({ type: "run", id: t.id, job: t.job });
    }
  }

  private post(m: ToWorker): void {
    this.worker.postMessage(m);
  }
}
