// Where the step's concurrent encoder needs barriers. lib/metal encodes with
// MTLDispatchTypeConcurrent: the dispatches between two barriers may run in any order or overlap,
// so a dispatch that reads a buffer an earlier dispatch of its section writes (read after write),
// or writes one an earlier dispatch reads or writes (write after read, write after write), starts
// a new section behind a buffer barrier. The plan says which buffers each kernel writes
// (KernelDispatch.writes, checked against the kernels' const qualifiers); weights are only read,
// so they never force one. Buffers are compared whole: the backend's activations, positions and
// each layer's K and V caches are buffers of their own, so independent work (the q, k and v
// projections of a layer; its K and V RoPE; the two caches' stores) shares a section.
import type { MetalBinding, MetalBuffer } from "./metal-device.ts";
import type { KernelDispatch } from "./metal-plan.ts";

export class BarrierPlanner {
  private readonly read = new Set<MetalBuffer>();
  private readonly written = new Set<MetalBuffer>();
  /** Barriers asked for, and dispatches seen, since construction (for tests and docs). */
  barriers = 0;
  dispatches = 0;

  /** Whether `dispatch` must wait behind a barrier; records its buffers in the section it joins. */
  needsBarrier(dispatch: KernelDispatch, bindings: Readonly<Record<string, MetalBinding>>): boolean {
    const reads: MetalBuffer[] = [], writes: MetalBuffer[] = [];
    for (const [name, binding] of Object.entries(bindings)) {
      (dispatch.writes.includes(name) ? writes : reads).push(binding.buffer);
    }
    const hazard = reads.some((b) => this.written.has(b)) ||
      writes.some((b) => this.written.has(b) || this.read.has(b));
    this.dispatches++;
    if (hazard) {
      this.read.clear();
      this.written.clear();
      this.barriers++;
    }
    for (const b of reads) this.read.add(b);
    for (const b of writes) this.written.add(b);
    return hazard;
  }

  /** The command buffer ended (committed and waited for): the next dispatch starts fresh. */
  reset(): void {
    this.read.clear();
    this.written.clear();
  }
}
