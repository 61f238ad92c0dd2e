// The Metal backend: weights are the mmap'd GGUF itself, wrapped once per file in a no-copy
// buffer and bound by offset; activations and the KV cache (f16, q8_0 or q4_0) are shared
// buffers; every op is one dispatch planned by metal-plan.ts and encoded into the step's command
// buffer, which runs when the CPU next needs memory the GPU writes or the CPU is about to write
// memory the GPU will read (read(), setTokens(), setPositions()): one command buffer per decode step.
// The device is an interface (metal-device.ts): NativeMetalDevice here (lib/metal, macOS), or the
// CPU emulation of the same kernels on Linux (test/support/metal-emu.ts), which is how this file
// is tested without a Mac.
import { InferError } from "../errors.ts";
import type { GgufFile, GgufTensorInfo } from "../gguf/reader.ts";
import { GgmlType } from "../gguf/types.ts";
import {
  metalBarrier, metalBufferFree, metalBufferNew, metalBufferWrap, metalDeviceLimits, metalDeviceName, metalEncode, metalFlush,
  metalInit, type MetalDeviceLimits,
} from "../native/metal.ts";
import {
  kvBytes, kvTypesOf, type Activation, type AttentionOptions, type Backend, type KvLayer, type KvType, type KvTypes, type RopeOptions,
  type Weight,
} from "./backend.ts";
import { orderBindings, type MetalBinding, type MetalBuffer, type MetalDevice } from "./metal-device.ts";
import { BarrierPlanner } from "./metal-hazards.ts";
import { ATTENTION_DECODE_TOKENS_MAX, baseAppleGpu, planAttentionStep, type AttentionCostModel } from "./metal-decode-plan.ts";
import { HELD_HEAD_OPS_MAX, matchHeadChain, type HeadChain, type HeldHeadOp } from "./metal-fuse.ts";
import {
  kvTypeArgs, metalWeightTypes, planAdd, planAddRowBias, planGatedAct, planGetRows, planKvStore, planMatmul,
  planNormRopeStore, planRmsNorm, planRmsNormAdd, planRope, planScale, type KernelDispatch,
} from "./metal-plan.ts";
import { assembleMetalSource, parseKernels } from "./metal-shaders.ts";
import { planBufferViews, viewOf, type BufferView } from "./metal-views.ts";

class NativeBuffer implements MetalBuffer {
  constructor(readonly handle: number, readonly bytes: number, readonly view: Uint8Array) {}
}

/** The real device: lib/metal through ts/native/metal.ts. */
export class NativeMetalDevice implements MetalDevice {
  readonly name: string;
  readonly limits: MetalDeviceLimits;
  private readonly pipelines = new Map<string, number>();
  pending = 0;

  private constructor() {
    const source = assembleMetalSource();
    const names = parseKernels(source).map((k) => k.name);
    metalInit(source, names);
    names.forEach((n, i) => this.pipelines.set(n, i));
    this.name = metalDeviceName();
    this.limits = metalDeviceLimits();
  }

  get maxBufferLength(): number { return this.limits.maxBufferLength; }

  /** Throws InferError("unsupported", "Metal not available: …") off macOS / Apple GPUs. */
  static open(): NativeMetalDevice {
    return new NativeMetalDevice();
  }

  newBuffer(bytes: number, what: string): MetalBuffer {
    const { handle, view } = metalBufferNew(bytes, what);
    return new NativeBuffer(handle, bytes, view);
  }

  wrap(address: number, bytes: number, what: string): MetalBuffer {
    return new NativeBuffer(metalBufferWrap(address, bytes, what), bytes, new Uint8Array(0));
  }

  encode(d: KernelDispatch, bindings: Readonly<Record<string, MetalBinding>>): void {
    const pipeline = this.pipelines.get(d.kernel);
    if (pipeline === undefined) throw new InferError("internal", `Metal: no pipeline ${d.kernel}`);
    const ordered = orderBindings(d, bindings);
    const count = Math.max(...ordered.map((o) => o.index)) + 1;
    const table = new BigUint64Array(2 * count);
    for (const { index, binding } of ordered) {
      table[2 * index] = BigInt((binding.buffer as NativeBuffer).handle);
      table[2 * index + 1] = BigInt(binding.offset);
    }
    metalEncode(pipeline, new Uint32Array([...d.grid, ...d.threads]), d.threadgroupBytes, table, d.args.bytes,
      d.args.index, d.kernel);
    this.pending++;
  }

  barrier(): void {
    if (this.pending > 0) metalBarrier();
  }

  flush(): void {
    if (this.pending === 0) return;
    this.pending = 0;
    metalFlush();
  }

  release(buffer: MetalBuffer): void {
    metalBufferFree((buffer as NativeBuffer).handle);
  }

  dispose(): void {
    this.flush();
  }
}

class MetalWeight implements Weight {
  constructor(readonly name: string, readonly typeName: string, readonly typeId: number,
    readonly dims: readonly number[], readonly buffer: MetalBuffer, readonly offset: number) {}
  get binding(): MetalBinding { return { buffer: this.buffer, offset: this.offset }; }
}

class MetalActivation implements Activation {
  constructor(readonly name: string, readonly rows: number, readonly cols: number, readonly buffer: MetalBuffer) {}
  at(row: number): MetalBinding { return { buffer: this.buffer, offset: row * this.cols * 4 }; }
  get f32(): Float32Array { return new Float32Array(this.buffer.view.buffer, this.buffer.view.byteOffset, this.rows * this.cols); }
}

class MetalKvLayer implements KvLayer {
  constructor(readonly cells: number, readonly ring: boolean, readonly kvHeads: number,
    readonly headDim: number, readonly types: KvTypes, readonly k: MetalBuffer, readonly v: MetalBuffer) {}
}

/** Wrapped views start on multiples of this: Apple silicon's 16 KiB pages (and so 4 KiB ones). */
const VIEW_ALIGNMENT = 16384;

/** A mapped file as the buffers that wrap it: one, or overlapping views (metal-views.ts). */
interface WrappedFile { readonly views: readonly BufferView[]; readonly buffers: readonly MetalBuffer[] }

const w = (x: Weight) => x as MetalWeight;
const a = (x: Activation) => x as MetalActivation;
const whole = (buffer: MetalBuffer): MetalBinding => ({ buffer, offset: 0 });

export interface MetalBackendOptions {
  /** The GPU the decode attention's cost model assumes (metal-decode-plan.ts); default baseAppleGpu. */
  readonly attentionCost?: AttentionCostModel;
  /** Decode attention always through attention_decode.metal with this many splits (tests). */
  readonly decodeSplits?: number;
}

export class MetalBackend implements Backend {
  readonly name = "metal";
  readonly preferredBatch = 256;
  private readonly files = new Map<string, WrappedFile>();
  private readonly buffers: MetalBuffer[] = [];
  private hostIds = new Int32Array(0);
  private disposed = false;
  /** Barriers of the step's concurrent encoder. */
  readonly barriers = new BarrierPlanner();
  /** Head norms, RoPEs and scales held back for a fused KV store (metal-fuse.ts). */
  private held: HeldHeadOp[] = [];
  /** The split decode attention's partial results, grown to the largest step seen. */
  private partials: MetalBuffer | null = null;
  private readonly attentionCost: AttentionCostModel;
  private readonly decodeSplits: number | undefined;

  constructor(private readonly device: MetalDevice, options: MetalBackendOptions = {}) {
    this.attentionCost = options.attentionCost ?? baseAppleGpu;
    this.decodeSplits = options.decodeSplits;
  }

  /** The backend on this machine's Metal device; throws "Metal not available: …" elsewhere. */
  static open(): MetalBackend {
    return new MetalBackend(NativeMetalDevice.open());
  }

  private alloc(bytes: number, what: string): MetalBuffer {
    if (this.disposed) throw new InferError("internal", "the Metal backend was disposed");
    const b = this.device.newBuffer(bytes, what);
    this.buffers.push(b);
    return b;
  }

  private run(d: KernelDispatch, bindings: Record<string, MetalBinding>): void {
    if (this.held.length > 0) this.releaseHeld();
    if (this.barriers.needsBarrier(d, bindings)) this.device.barrier();
    this.device.encode(d, bindings);
  }

  /** Ends the step: its command buffer runs, and the next dispatch opens a new one. */
  private flush(): void {
    if (this.held.length > 0) this.releaseHeld();
    this.device.flush();
    this.barriers.reset();
  }

  private hold(op: HeldHeadOp): void {
    if (this.held.length >= HELD_HEAD_OPS_MAX) this.releaseHeld();
    this.held.push(op);
  }

  /** Encodes the held head ops, unfused, in the order they were asked for. */
  private releaseHeld(): void {
    const ops = this.held;
    this.held = [];
    for (const op of ops) {
      if (op.kind === "norm") {
        this.run(planRmsNorm(op.rows * op.heads, op.x.cols / op.heads, op.eps, true),
          { x: a(op.x).at(0), weight: w(op.weight).binding, out: a(op.x).at(0) });
      } else if (op.kind === "rope") {
        const o = op.rope, f = o.freqFactors ? w(o.freqFactors) : null;
        const plan = planRope({ nTok: op.rows, heads: o.heads, headDim: o.headDim, rotaryDims: o.rotaryDims,
          base: o.base, scale: o.scale, neox: o.neox, freqFactors: f !== null });
        this.run(plan, { x: a(op.x).at(0), positions: a(op.positions).at(0),
          freq_factors: f ? f.binding : a(op.positions).at(0) });
      } else {
        this.run(planScale(op.rows * op.x.cols, op.factor), { x: a(op.x).at(0) });
      }
    }
  }

  /** One norm_rope_store dispatch for a matched chain and its KV store. */
  private storeChain(c: HeadChain, l: MetalKvLayer, v: Activation, position: number): void {
    this.held = [];
    const f = c.rope.freqFactors ? w(c.rope.freqFactors) : null;
    const plan = planNormRopeStore({ nTok: c.rows, headsQ: c.headsQ, headsK: c.headsK, headDim: c.rope.headDim,
      norm: c.norms !== null, eps: c.norms?.eps ?? 0, rotaryDims: c.rope.rotaryDims, base: c.rope.base,
      scale: c.rope.scale, neox: c.rope.neox, freqFactors: f !== null, qScale: c.qScale, pos0: position,
      cells: l.cells, ring: l.ring, types: l.types });
    const positions = a(c.positions).at(0);
    this.run(plan, {
      q: a(c.q).at(0), k: a(c.k).at(0), v: a(v).at(0),
      q_norm: c.norms ? w(c.norms.q).binding : positions, k_norm: c.norms ? w(c.norms.k).binding : positions,
      positions, freq_factors: f ? f.binding : positions, k_cache: whole(l.k), v_cache: whole(l.v),
    });
  }

  weight(file: GgufFile, t: GgufTensorInfo): Weight {
    if (!metalWeightTypes[t.type.name]) {
      throw new InferError("unsupported", `tensor '${t.name}' has quant type ${t.type.name}, which the Metal backend does not compute`);
    }
    // each mapped file (a split model's parts each) is wrapped without a copy, in views of at
    // most maxBufferLength that overlap so that every tensor lies wholly inside one
    const part = file.parts[t.part];
    let wrapped = this.files.get(part.path);
    if (!wrapped) {
      let largest = 0;
      for (const info of file.tensors.values()) {
        if (info.part === t.part) largest = Math.max(largest, info.byteLength);
      }
      const views = planBufferViews(part.length, largest, this.device.maxBufferLength, VIEW_ALIGNMENT);
      const buffers = views.map((v, i) => this.device.wrap(part.baseAddress + v.offset, v.bytes,
        views.length === 1 ? `wrapping ${part.path}` : `wrapping view ${i + 1}/${views.length} of ${part.path}`));
      this.buffers.push(...buffers);
      wrapped = { views, buffers };
      this.files.set(part.path, wrapped);
    }
    const at = viewOf(wrapped.views, t.fileOffset, t.byteLength);
    const buffer = wrapped.buffers[at.index];
    return new MetalWeight(t.name, t.type.name, t.type.id, t.dims, buffer, at.offset);
  }

  activation(name: string, rows: number, cols: number): Activation {
    return new MetalActivation(name, rows, cols, this.alloc(rows * cols * 4, `activation '${name}'`));
  }

  positions(rows: number): Activation {
    return this.activation("positions", rows, 1);
  }

  kvLayer(cells: number, kvHeads: number, headDim: number, types: KvType | KvTypes, ring: boolean): KvLayer {
    const type = kvTypesOf(types);
    kvTypeArgs(type, headDim);
    const values = cells * kvHeads * headDim;
    return new MetalKvLayer(cells, ring, kvHeads, headDim, type,
      this.alloc(kvBytes(type.k, values, headDim), "KV cache"), this.alloc(kvBytes(type.v, values, headDim), "KV cache"));
  }

  // The CPU writes these buffers: work still queued may read them, so it runs first.
  setTokens(dst: Activation, ids: ArrayLike<number>, count: number): void {
    if (count > dst.rows) throw new InferError("invalid_argument", `${count} tokens do not fit ${dst.rows} rows`);
    this.flush();
    const view = new Int32Array(a(dst).f32.buffer, a(dst).f32.byteOffset, count);
    if (this.hostIds.length < count) this.hostIds = new Int32Array(count);
    for (let i = 0; i < count; i++) view[i] = this.hostIds[i] = ids[i];
  }

  setPositions(dst: Activation, start: number, count: number, firstRow = 0): void {
    if (firstRow + count > dst.rows) throw new InferError("invalid_argument", `${count} positions do not fit ${dst.rows} rows`);
    this.flush();
    const view = new Int32Array(a(dst).f32.buffer, a(dst).f32.byteOffset + firstRow * 4, count);
    for (let i = 0; i < count; i++) view[i] = start + i;
  }

  embed(table: Weight, ids: Activation, rows: number, out: Activation): void {
    const t = w(table);
    for (let i = 0; i < rows; i++) {
      if (this.hostIds[i] < 0 || this.hostIds[i] >= t.dims[1]) {
        throw new InferError("invalid_argument", `token id ${this.hostIds[i]} is out of range (vocabulary: ${t.dims[1]})`);
      }
    }
    this.run(planGetRows(t.typeId, t.dims[0], t.dims[1], rows), { table: t.binding, ids: a(ids).at(0), dst: a(out).at(0) });
  }

  scale(x: Activation, rows: number, factor: number): void {
    this.hold({ kind: "scale", x, rows, factor });
  }

  rmsNorm(x: Activation, weight: Weight | null, rows: number, eps: number, out: Activation): void {
    this.run(planRmsNorm(rows, x.cols, eps, weight !== null),
      { x: a(x).at(0), weight: weight ? w(weight).binding : a(x).at(0), out: a(out).at(0) });
  }

  rmsNormAdd(x: Activation, weight: Weight, rows: number, eps: number, residual: Activation): void {
    this.run(planRmsNormAdd(rows, x.cols, eps), { x: a(x).at(0), weight: w(weight).binding, residual: a(residual).at(0) });
  }

  rmsNormHeads(x: Activation, weight: Weight, rows: number, heads: number, eps: number): void {
    this.hold({ kind: "norm", x, weight, rows, heads, eps });
  }

  matmul(weight: Weight, x: Activation, rows: number, out: Activation, firstRow = 0): void {
    const t = w(weight);
    this.run(planMatmul(t.typeId, t.dims[0], t.dims[1], rows), { w: t.binding, x: a(x).at(firstRow), y: a(out).at(0) });
  }

  rope(x: Activation, positions: Activation, rows: number, o: RopeOptions): void {
    if (o.yarn) throw new InferError("unsupported", `the Metal backend's RoPE has no YaRN; use --backend cpu`);
    if ((o.attnFactor ?? 1) !== 1) {
      throw new InferError("unsupported", `the Metal backend's RoPE takes no attention factor ` +
        `(${o.attnFactor}); use --backend cpu`);
    }
    const f = o.freqFactors ? w(o.freqFactors) : null;
    if (f && (f.typeId !== GgmlType.F32 || f.dims[0] * 2 !== o.rotaryDims)) {
      throw new InferError("bad_model", `rope factors '${f.name}' must be ${o.rotaryDims / 2} f32 values`);
    }
    // planned now so that a bad shape fails at this call, not where the held op is encoded
    planRope({ nTok: rows, heads: o.heads, headDim: o.headDim, rotaryDims: o.rotaryDims, base: o.base,
      scale: o.scale, neox: o.neox, freqFactors: f !== null });
    this.hold({ kind: "rope", x, positions, rows, rope: o });
  }

  storeKv(layer: KvLayer, k: Activation, v: Activation, rows: number, position: number, firstRow = 0): void {
    const l = layer as MetalKvLayer;
    if (!l.ring && position + rows > l.cells) {
      throw new InferError("context_overflow", `KV cache holds ${l.cells} positions, ${position + rows} needed`);
    }
    if (rows > l.cells) throw new InferError("invalid_argument", `${rows} rows do not fit a ring of ${l.cells}`);
    const kvDim = l.kvHeads * l.headDim;
    const chain = firstRow === 0 && v.cols === kvDim ? matchHeadChain(this.held, k, rows, kvDim) : null;
    if (chain && chain.rope.headDim === l.headDim) {
      this.storeChain(chain, l, v, position);
      return;
    }
    this.run(planKvStore(l.kvHeads * l.headDim, rows, position, l.cells, l.ring, l.types),
      { k: a(k).at(firstRow), v: a(v).at(firstRow), k_cache: whole(l.k), v_cache: whole(l.v) });
  }

  attention(q: Activation, layer: KvLayer, rows: number, position: number, o: AttentionOptions, out: Activation,
    firstRow = 0): void {
    const l = layer as MetalKvLayer;
    if (o.sinks) throw new InferError("unsupported", `attention sinks are not implemented on the ${this.name} backend`);
    if (l.ring && (o.window === 0 || l.cells < o.window + rows - 1)) {
      throw new InferError("invalid_argument", `a ring of ${l.cells} cells cannot serve window ${o.window} with ${rows} rows`);
    }
    const step = planAttentionStep({ nTok: rows, heads: o.heads, kvHeads: o.kvHeads, headDim: o.headDim, pos0: position,
      window: o.window, cells: l.cells, ring: l.ring, scale: o.scale, types: l.types }, this.attentionCost,
    rows <= ATTENTION_DECODE_TOKENS_MAX ? this.decodeSplits : undefined);
    const bindings: Record<string, MetalBinding> = { q: a(q).at(firstRow), k_cache: whole(l.k), v_cache: whole(l.v),
      out: a(out).at(firstRow), partials: whole(this.partialsFor(step.scratchFloats)) };
    for (const d of step.dispatches) {
      this.run(d, Object.fromEntries(Object.keys(d.buffers).map((name) => [name, bindings[name]])));
    }
  }

  /**
   * The partials buffer, at least `floats` long. A grown one replaces it for later steps; the
   * old one stays allocated (work already encoded may use it) until dispose.
   */
  private partialsFor(floats: number): MetalBuffer {
    const bytes = Math.max(1, floats) * 4;
    if (!this.partials || this.partials.bytes < bytes) this.partials = this.alloc(bytes, "attention partials");
    return this.partials;
  }

  geluMul(gate: Activation, up: Activation, rows: number, out: Activation): void {
    this.run(planGatedAct("gelu", rows * gate.cols), { gate: a(gate).at(0), up: a(up).at(0), out: a(out).at(0) });
  }

  siluMul(gate: Activation, up: Activation, rows: number, out: Activation): void {
    this.run(planGatedAct("silu", rows * gate.cols), { gate: a(gate).at(0), up: a(up).at(0), out: a(out).at(0) });
  }

  add(x: Activation, y: Activation, rows: number, out: Activation): void {
    this.run(planAdd(rows * x.cols), { a: a(x).at(0), b: a(y).at(0), out: a(out).at(0) });
  }

  addBias(x: Activation, bias: Weight, rows: number): void {
    this.run(planAddRowBias(rows, x.cols), { x: a(x).at(0), bias: w(bias).binding });
  }

  /** Runs the step's command buffer, then views the rows (shared memory: no copy). */
  read(x: Activation, rows: number): Float32Array {
    this.flush();
    return a(x).f32.subarray(0, rows * x.cols);
  }

  setThreads(): void {
    // The GPU schedules itself; the CPU threads are not used.
  }

  dispose(): void {
    if (this.disposed) return;
    this.flush();
    for (const b of this.buffers) this.device.release(b);
    this.buffers.length = 0;
    this.files.clear();
    this.disposed = true;
  }
}
