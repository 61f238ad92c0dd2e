// Decode steps of the CUDA backend as CUDA graphs. During a step (begin … finish) every launch
// call is recorded with a hash of its code and arguments instead of run; finish() looks the hash
// up: a sequence seen before is fused (cuda-fuse.ts) and captured into a graph, which from then on
// is launched in one call. Kernels read positions and token ids from device memory, so one graph
// serves every position of a step with the same shapes and buffers.
import { callNamed } from "../native/calls.ts";
import { cudaCaptureEnd } from "../native/cuda.ts";
import { check, native } from "../native/lib.ts";
import { symbols } from "../native/symbols.gen.ts";
import { fuseStep, type PendingOp } from "./cuda-fuse.ts";

type Lib = ReturnType<typeof native>;

/**
 * Graphs kept, the least recently launched dropped first: host and device greedy steps, a few
 * attention splits each, and speculative verification passes of every draft length (2 to 65
 * rows), which a sequence's adaptive draft length moves between.
 */
const GRAPHS_MAX = 64;
/** A number for each native call, mixed into a step's hash. */
const callIds = new Map(Object.keys(symbols).map((name, i) => [name, i + 1]));

export interface StepStats {
  eagerSteps: number;
  captures: number;
  graphLaunches: number;
  /** Launch calls in the last step before and after fusion. */
  stepOps: number;
  stepOpsFused: number;
  /** Greedy device steps queued; host ms spent queueing them (from keepTokens) and waiting in takeToken. */
  greedySteps: number;
  greedyQueueMs: number;
  greedyWaitMs: number;
}

export class StepGraphs {
  recording = false;
  private pending: PendingOp[] = [];
  private h1 = 0;
  private h2 = 0;
  private readonly hashF64 = new Float64Array(1);
  private readonly hashU32 = new Uint32Array(this.hashF64.buffer);
  private readonly graphs = new Map<string, number>();
  private readonly seen = new Set<string>();
  readonly stats: StepStats = { eagerSteps: 0, captures: 0, graphLaunches: 0, stepOps: 0, stepOpsFused: 0,
    greedySteps: 0, greedyQueueMs: 0, greedyWaitMs: 0 };

  /**
   * Profiling only (bench/cuda-step-parts.ts): fused ops whose description matches are left out
   * of the step, so that the step's GPU time without them prices them in place, overlaps and
   * all. The step's results are then wrong. Each setting has graphs of its own (the key names
   * it), so a bench can replay the graphs of several settings in turn.
   */
  private skip: RegExp | null = null;
  /** What the ops of the last fused step do, in order (bench/cuda-step-parts.ts lists them). */
  lastFused: string[] = [];

  constructor(private readonly lib: Lib, private readonly fusion: boolean) {}

  setSkip(skip: RegExp | null): void {
    this.skip = skip;
  }

  begin(): void {
    this.recording = true;
    this.h1 = 0x12345678;
    this.h2 = 0x9abcdef0;
  }

  private mix(v: number): void {
    this.hashF64[0] = v;
    this.h1 = Math.imul(this.h1 ^ this.hashU32[0], 0x9e3779b1);
    this.h1 = (this.h1 << 13) | (this.h1 >>> 19);
    this.h2 = Math.imul(this.h2 ^ this.hashU32[1] ^ this.h1, 0x85ebca77);
    this.h2 = (this.h2 << 17) | (this.h2 >>> 15);
  }

  record(op: PendingOp): void {
    this.pending.push(op);
    this.mix(callIds.get(op.fn)!);
    for (const v of Object.values(op.args)) this.mix(+v);
  }

  private run(ops: PendingOp[]): void {
    for (const p of ops) check(callNamed(p.fn, p.args as never), p.what);
  }

  /** Runs what was recorded so far eagerly and records no more in this step. */
  stop(): void {
    if (!this.recording) return;
    this.recording = false;
    const ops = this.pending;
    this.pending = [];
    this.run(ops);
  }

  /**
   * Ends the step: launches its graph (captured now if the same step was seen once before), or
   * runs it op by op the first time. Returns the graph launched, 0 if none.
   */
  finish(): number {
    this.recording = false;
    const recorded = this.pending;
    this.pending = [];
    const key = `${this.h1 >>> 0}:${this.h2 >>> 0}:${recorded.length}${this.skip ? `:${this.skip.source}` : ""}`;
    this.stats.stepOps = recorded.length;
    let exec = this.graphs.get(key);
    if (exec !== undefined) { // now the most recently launched (a Map keeps insertion order)
      this.graphs.delete(key);
      this.graphs.set(key, exec);
    } else { // the common case has nothing to fuse or capture
      const fused = this.fusion ? fuseStep(recorded) : recorded;
      const ops = this.skip ? fused.filter((o) => !this.skip!.test(o.what)) : fused;
      this.stats.stepOpsFused = ops.length;
      this.lastFused = ops.map((o) => o.what);
      if (!this.seen.has(key)) {
        this.seen.add(key);
        this.stats.eagerSteps++;
        this.run(ops);
        return 0;
      }
      check(this.lib.infer_cuda_capture_begin(), "CUDA graph capture");
      try {
        this.run(ops);
      } catch (err) {
        this.lib.infer_cuda_capture_abort();
        throw err;
      }
      exec = cudaCaptureEnd();
      if (this.graphs.size >= GRAPHS_MAX) {
        const [oldest, handle] = this.graphs.entries().next().value as [string, number];
        this.lib.infer_cuda_graph_destroy(handle);
        this.graphs.delete(oldest);
      }
      this.graphs.set(key, exec);
      this.stats.captures++;
    }
    check(this.lib.infer_cuda_graph_launch(exec), "CUDA graph launch");
    this.stats.graphLaunches++;
    return exec;
  }

  /** Destroys every graph (the buffers they point at are about to change). */
  destroy(): void {
    for (const handle of this.graphs.values()) this.lib.infer_cuda_graph_destroy(handle);
    this.graphs.clear();
    this.seen.clear();
  }
}
