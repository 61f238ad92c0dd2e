// The CUDA backend: weights uploaded once from the mmap'd GGUF into device memory, activations and
// the KV cache (f16, or ggml's q8_0/q4_0 blocks: shaders/cuda/kv_quant.cuh) on the device, each op one or a few kernel launches on one stream (lib/cuda/,
// shaders/cuda/infer.cu). Nothing waits for the GPU until read() copies a result back, or
// takeToken() a greedy token.
//
// Decode steps (one token, or the server's batch of one token for each of up to GRAPH_ROWS
// sequences) are replayed as CUDA graphs: from setTokens(…) (or keepTokens) to read() (or
// argmaxToken) the ops are recorded with a hash of every argument; a sequence seen once before is
// captured into a graph (fused first: cuda-fuse.ts), and from then on the same sequence launches
// that graph. Kernels read positions (setPositions uploads them) and the batch's table of KV
// caches from the device, so the same graph serves every position of an attention split
// (decodeSplit). The recording and the graphs are cuda-graphs.ts. INFER_CUDA_GRAPHS=0, or
// { graphs: false }, runs every op eagerly.
//
// Greedy decoding (a lone greedy sequence in the scheduler): argmaxToken ends a step with the
// argmax of the logits written to the token ids on the device, where the next step's embedding
// reads it (keepTokens), and copied to pinned memory behind an event; the host queues the next
// step before it reads the token.
import { setting } from "../config/env.ts";
import { InferError } from "../errors.ts";
import type { GgufFile, GgufTensorInfo } from "../gguf/reader.ts";
import { GgmlType } from "../gguf/types.ts";
import { cudaDeviceInfo, cudaHostAlloc, cudaInit, cudaMalloc } from "../native/cuda.ts";
import { check, native, type Pointer } from "../native/lib.ts";
import { callNamed, type NamedArgs } from "../native/calls.ts";
import type { LaunchCall } from "./cuda-fuse.ts";
import { AttentionBuffers, decodeSplit } from "./cuda-attention.ts";
import { CudaExperts } from "./cuda-moe.ts";
import { copyCudaAnchoredKeys, pendCudaKeys, type AnchorDevice, type CudaAnchoredKeys } from "./cuda-kv-anchor.ts";
import { StepGraphs, type StepStats } from "./cuda-graphs.ts";
import { KvShifter } from "./cuda-shift.ts";
import { cudaPages } from "./cuda-pages.ts";
import { KvPagePool, type PagedLayer, type PagedRange } from "./kv-pages.ts";
import {
  kvBytes, kvTypesName, kvTypesOf, type Activation, type AttentionOptions, type Backend, type DeviceGreedy, type KvLayer, type KvType, type KvTypes,
  type RopeOptions, type Weight,
} from "./backend.ts";

type Lib = ReturnType<typeof native>;

/**
 * Rows of a step that is still a decode step (the server's batch) rather than a prompt chunk:
 * steps of up to this many rows are recorded and replayed as graphs (a step of 8 sequences was
 * 3.3 ms launched op by op against 0.69 ms as a graph on an H200's 0.6B). 64: the largest batch
 * the small-tile tensor-core matmul takes (lib/cuda/ops.zig batchMma).
 */
const GRAPH_ROWS = 64;

class CudaWeight implements Weight {
  /** typeId: the ggml type, or with gpuLayout the id of its GPU layout (shaders/cuda/packed.cuh). */
  constructor(readonly name: string, readonly typeName: string, readonly typeId: number,
    readonly dims: readonly number[], readonly address: number, readonly activationFormat: number,
    readonly gpuLayout: boolean) {}
}

class CudaActivation implements Activation {
  /** Bumped by every op that writes the activation (keys the quantized-activation cache). */
  version = 0;
  /** Pinned host copy for read(), allocated on the first read. */
  host: Float32Array | null = null;
  hostAddress = 0;
  constructor(readonly name: string, readonly rows: number, readonly cols: number, readonly address: number) {}
}

/**
 * The type id of each cache type the CUDA kernels keep: ggml's (shaders/cuda/kv_quant.cuh) and
 * infer's rotated codes past them (shaders/cuda/kv_turbo.cuh, the CPU's ids).
 */
const cudaKvTypeIds: Partial<Record<KvType, number>> = {
  f16: GgmlType.F16, q8_0: GgmlType.Q8_0, q4_0: GgmlType.Q4_0, tq3: 103, tq4: 104,
};

function isTurbo(t: KvType): boolean { return t === "tq3" || t === "tq4"; }

class CudaKvLayer implements KvLayer, CudaAnchoredKeys, PagedLayer {
  /** A paged layer's reserved ranges (k and v are their addresses); null: allocated whole. */
  pages: { readonly k: PagedRange; readonly v: PagedRange } | null = null;
  /** A tq K layer's anchor (cuda-kv-anchor.ts): on the host once set, and on the device. */
  kAnchor: Float32Array | undefined = undefined;
  kPending?: Map<number, Float32Array>;
  kAnchorAddress = 0;
  /** Bytes of one cell (kvHeads · headDim values) of the keys and of the values. */
  readonly kRowBytes: number;
  readonly vRowBytes: number;
  constructor(readonly cells: number, readonly ring: boolean, readonly kvHeads: number,
    readonly headDim: number, readonly types: KvTypes, readonly k: number, readonly v: number) {
    this.kRowBytes = kvBytes(types.k, kvHeads * headDim, headDim);
    this.vRowBytes = kvBytes(types.v, kvHeads * headDim, headDim);
  }
  /** tq codes are less their layer's anchor: another layer's would read them wrongly. */
  get shareable(): boolean { return !isTurbo(this.types.k) && !isTurbo(this.types.v); }
  get kTypeId(): number { return cudaKvTypeIds[this.types.k]!; }
  get vTypeId(): number { return cudaKvTypeIds[this.types.v]!; }
}

function w(x: Weight): CudaWeight { return x as CudaWeight; }
function a(x: Activation): CudaActivation { return x as CudaActivation; }

export interface CudaBackendOptions {
  /** Replay decode steps as CUDA graphs (default: the INFER_CUDA_GRAPHS setting, on). */
  readonly graphs?: boolean;
  /** Fuse recorded decode steps' ops (default: the INFER_CUDA_FUSE setting, on); see cuda-fuse.ts. */
  readonly fusion?: boolean;
  /** Rewrite Q4_0, Q8_0 and Q4_K weights with rows of whole 256-value groups into the GPU
   * layouts of shaders/cuda/packed.cuh at upload (default: the INFER_CUDA_REPACK setting, on). */
  readonly gpuLayouts?: boolean;
}

const HEAD_DIM_MAX = 512;
/** Rows from which a quantized matmul may run as a cuBLAS GEMM (the MMQ range, lib/cuda/ops.zig). */
const CUBLAS_ROWS_MIN = 16;
/** Token ids queued by argmaxToken at most (lib/cuda/cuda.zig event_slots). */
const TOKEN_SLOTS = 16;
const NAN_BITS = 0x7fc00000;

export class CudaBackend implements Backend {
  readonly name = "cuda";
  readonly sequenceBatches = true;
  /**
   * llama.cpp's micro-batch: a chunk's matmuls dequantize every weight once (cuBLAS GEMMs from
   * 128 rows), and longer chunks pay that less often.
   */
  readonly preferredBatch = 512;
  /**
   * 256 prompt rows beside the decode rows: a step with prompt rows runs op by op (past the
   * graphs), and its launches and weight reads are paid per step, so 64-row chunks spread each
   * prompt over four times the slow steps; 512 rows would double the running streams' longest
   * gap (a 512-row chunk of the 8B is ~31 ms on an H100).
   */
  readonly prefillChunk = 256;
  readonly deviceGreedy: DeviceGreedy = {
    argmaxToken: (logits, ids) => this.argmaxToken(logits, ids),
    keepTokens: (dst, count) => this.keepTokens(dst, count),
    takeToken: () => this.takeToken(),
    dropTokens: () => this.dropTokens(),
    argmaxRows: (logits, rows) => this.argmaxRows(logits, rows),
  };
  /** Mixture-of-experts layers, routed on the device (cuda-moe.ts). */
  readonly experts: CudaExperts = new CudaExperts({
    lib: native(),
    backend: this,
    view: (base, name, dims, offset) => {
      const b = w(base);
      return new CudaWeight(name, b.typeName, b.typeId, dims, b.address + offset, b.activationFormat, b.gpuLayout);
    },
    address: (x) => a(x).address,
    op: (fn, args, what) => this.op(fn, args, what),
    quantized: (x, rows, mode) => {
      this.quantized(a(x), 0, rows, mode);
      return { xq: this.xq, xd: this.xd };
    },
    written: (x) => { a(x).version++; },
    upload: (x, values) => this.write(x, values),
  });
  private readonly lib: Lib;
  private readonly graphsEnabled: boolean;
  private readonly shifter: KvShifter;
  private readonly gpuLayouts: boolean;
  private readonly deviceAllocations = new Set<number>();
  private readonly hostAllocations: number[] = [];
  private readonly weights = new Map<string, CudaWeight>();
  private disposed = false;
  /** The paged caches' pool (kv-pages.ts), made with the first paged layer; null: none yet. */
  private pool: KvPagePool | null = null;
  /** Why caches are allocated whole, once asked (the driver or device lacks paging). */
  private unpaged: string | null = null;
  private readonly pagedLayers = new Set<CudaKvLayer>();
  // Quantized copy of one activation (int8 values + one f32 scale per 32) for quantized matmuls.
  private xq = 0;
  private xd = 0;
  private xCapacity = 0;
  private largestActivation = 0;
  private cached: { act: CudaActivation; version: number; mode: number; first: number; rows: number } | null = null;
  /** Attention scratch, split counters and tables of caches (cuda-attention.ts). */
  private readonly attn: AttentionBuffers;
  // The step: token ids and positions as last uploaded.
  private hostIds = new Int32Array(256);
  private idCount = 0;
  /** The ids were written on the device by argmaxToken over a vocabulary of idsWidth. */
  private idsOnDevice = false;
  private idsWidth = 0;
  // Greedy tokens: argmax scratch (16 bytes), pinned slots the ids are copied into, and the
  // slots queued, oldest first.
  private argmaxScratch = 0;
  private tokenSlots: Int32Array | null = null;
  private tokenSlotsAddress = 0;
  private readonly tokenQueue: number[] = [];
  /** argmaxRows' ids on the device, and their host copy. */
  private rowIds = 0;
  private rowIdsCapacity = 0;
  private rowIdsHost = new Int32Array(0);
  private tokenCount = 0;
  private positionsAct: CudaActivation | null = null;
  private hostPositions = new Int32Array(256);
  /** Rows of positionsAct set since its row 0 was last set. */
  private positionRows = 0;
  /** Rows of hostPositions set and not uploaded yet: dirtyFrom .. dirtyTo - 1. */
  private dirtyFrom = Infinity;
  private dirtyTo = 0;
  /** Decode steps recorded, fused, captured and replayed as CUDA graphs (cuda-graphs.ts). */
  private readonly steps: StepGraphs;
  /** Decode steps run op by op, graphs captured and replayed; launch calls in the last step before and after fusion. */
  get stats(): StepStats { return this.steps.stats; }
  private stepStart = 0;
  /** The graph launched last (bench/cuda-decode.ts replays it to time the GPU alone). */
  lastGraph = 0;
  /**
   * Prompts of at least `minTokens` rows (0: none) take quantized matmuls as cuBLAS f16 GEMMs
   * (lib/cuda/ops.zig; the default, or INFER_CUDA_CUBLAS=n at init, is `cublasMinTokens`);
   * throws "cuBLAS not available: …" where it does not load. One setting for the process.
   */
  setCublas(minTokens: number): void {
    check(this.lib.infer_cuda_set_cublas(minTokens), "cuBLAS");
  }

  /** The prompt length from which quantized matmuls run as cuBLAS GEMMs where cuBLAS loads (0: never). */
  get cublasMinTokens(): number {
    return this.lib.infer_cuda_cublas_min_tokens();
  }

  /**
   * Decode batches of at least `minTokens` rows (to 64; 0: none) take the small-tile tensor-core
   * matmul (lib/cuda/ops.zig batchMma; INFER_CUDA_BATCH_MMA at init): benches compare the two
   * paths in one process. The graphs captured with the other choice are dropped.
   */
  setBatchMma(minTokens: number): void {
    check(this.lib.infer_cuda_set_batch_mma(minTokens), "batch MMA");
    this.steps.destroy();
    this.lastGraph = 0;
  }

  /** Profiling only: leaves the matching ops out of decode steps (StepGraphs.setSkip). */
  profileSkip(skip: RegExp | null): void {
    this.steps.setSkip(skip);
    this.lastGraph = 0;
  }
  /** What the ops of the last decode step's graph do, in order. */
  get lastStepOps(): string[] { return this.steps.lastFused; }

  private constructor(options: CudaBackendOptions) {
    this.lib = native();
    this.graphsEnabled = options.graphs ?? setting("INFER_CUDA_GRAPHS");
    this.gpuLayouts = options.gpuLayouts ?? setting("INFER_CUDA_REPACK");
    this.attn = new AttentionBuffers(this.lib, {
      alloc: (bytes, what) => this.alloc(bytes, what),
      release: (address) => this.release(address),
      beforeRealloc: () => this.beforeRealloc(),
    });
    this.steps = new StepGraphs(this.lib, options.fusion ?? setting("INFER_CUDA_FUSE"));
    this.shifter = new KvShifter(this.lib, {
      alloc: (bytes, what) => this.alloc(bytes, what),
      release: (address) => this.release(address),
      sync: () => check(this.lib.infer_cuda_sync(), "CUDA sync"),
    });
  }

  /** Initialises CUDA (throws "CUDA not available: …" as an InferError) and makes a backend. */
  static open(options: CudaBackendOptions = {}): CudaBackend {
    cudaInit();
    return new CudaBackend(options);
  }

  // ---- memory -------------------------------------------------------------------------------

  deviceMemory(): { freeBytes: number; name: string } {
    const info = cudaDeviceInfo();
    return { freeBytes: info.freeBytes, name: info.name };
  }

  private alloc(bytes: number, what: string): number {
    if (this.disposed) throw new InferError("internal", "the CUDA backend was disposed");
    const address = cudaMalloc(Math.max(bytes, 4), what);
    this.deviceAllocations.add(address);
    return address;
  }

  private release(address: number): void {
    if (address === 0 || !this.deviceAllocations.delete(address)) return;
    this.lib.infer_cuda_free(address);
  }

  weight(file: GgufFile, t: GgufTensorInfo): Weight {
    const key = `${file.path}\u0000${t.name}`;
    const known = this.weights.get(key);
    if (known) return known;
    const format = this.lib.infer_cuda_weight_activation(t.type.id);
    if (format === -2) {
      throw new InferError("unsupported", `tensor '${t.name}' has quant type ${t.type.name}, ` +
        "which the CUDA backend does not compute yet");
    }
    const address = this.alloc(t.byteLength, `uploading '${t.name}' (${t.byteLength} bytes)`);
    check(this.lib.infer_cuda_upload(address, file.tensorAddress(t) as Pointer, t.byteLength), `upload ${t.name}`);
    // Rows of whole 256-value groups of Q4_0, Q8_0 and Q4_K take the GPU layout: one aligned load
    // per lane and unit in the matvecs (same bytes, same results).
    const rows = t.dims.slice(1).reduce((n, d) => n * d, 1);
    const typeId = this.gpuLayouts ? this.lib.infer_cuda_repacked_type(t.type.id, t.dims[0]) : t.type.id;
    if (typeId !== t.type.id) check(this.lib.infer_cuda_repack(address, t.type.id, rows, t.dims[0]), `repack ${t.name}`);
    const weight = new CudaWeight(t.name, t.type.name, typeId, t.dims, address, format, typeId !== t.type.id);
    this.weights.set(key, weight);
    return weight;
  }

  activation(name: string, rows: number, cols: number): Activation {
    const values = rows * cols;
    this.largestActivation = Math.max(this.largestActivation, values);
    return new CudaActivation(name, rows, cols, this.alloc(values * 4, `activation '${name}'`));
  }

  positions(rows: number): Activation {
    return this.activation("positions", rows, 1);
  }

  /** The page pool, made on first use; null where the driver or device cannot map pages. */
  kvPages(): KvPagePool | null {
    return this.pool;
  }

  /** How full-attention caches are kept: paged (in what granules), or whole and why. */
  get kvPaging(): string {
    if (this.pool) return `paged in ${this.pool.granule >> 20} MiB granules`;
    return `allocated whole${this.unpaged ? `: ${this.unpaged}` : ""}`;
  }

  private kvPagesFor(): KvPagePool | null {
    if (this.pool || this.unpaged !== null) return this.pool;
    const phys = cudaPages(this.lib);
    if (typeof phys === "string") this.unpaged = phys;
    else this.pool = new KvPagePool(phys);
    return this.pool;
  }

  /**
   * Makes positions from .. to - 1 of a paged layer writable (nothing for a plain one): maps what
   * they take, and copies a granule other slots share before the write lands in it (kv-pages.ts
   * writeRows). A copy runs what the step recorded so far first, and the step is not replayed.
   */
  private mapRows(l: CudaKvLayer, from: number, to: number): void {
    if (!l.pages) return;
    if (this.pool!.writeCopies(l, from, to)) this.stopRecording();
    this.pool!.writeRows(l, from, to);
  }

  kvLayer(cells: number, kvHeads: number, headDim: number, types: KvType | KvTypes, ring: boolean,
    paged = false): KvLayer {
    const type = kvTypesOf(types);
    if (cudaKvTypeIds[type.k] === undefined || cudaKvTypeIds[type.v] === undefined) {
      throw new InferError("unsupported", `the CUDA backend keeps the KV cache in f16, q8_0, q4_0, tq3 or tq4, ` +
        `not ${kvTypesName(type)}`);
    }
    if (headDim > HEAD_DIM_MAX) {
      throw new InferError("unsupported", `head_dim ${headDim} is over the CUDA backend's ${HEAD_DIM_MAX}`);
    }
    const blocks = (t: KvType) => t === "q8_0" || t === "q4_0";
    if ((blocks(type.k) || blocks(type.v)) && headDim % 32 !== 0) {
      throw new InferError("unsupported", `a ${kvTypesName(type)} KV cache needs head_dim a multiple of 32, ` +
        `not ${headDim}`);
    }
    if ((isTurbo(type.k) || isTurbo(type.v)) && (headDim < 8 || (headDim & (headDim - 1)) !== 0)) {
      throw new InferError("unsupported", `a ${kvTypesName(type)} KV cache needs head_dim a power of two from 8, ` +
        `not ${headDim}`);
    }
    const values = cells * kvHeads * headDim;
    const kBytes = kvBytes(type.k, values, headDim), vBytes = kvBytes(type.v, values, headDim);
    const pool = paged && !ring ? this.kvPagesFor() : null;
    let layer: CudaKvLayer;
    if (pool) {
      const k = pool.reserve(kBytes), v = pool.reserve(vBytes);
      layer = new CudaKvLayer(cells, ring, kvHeads, headDim, type, k.address, v.address);
      layer.pages = { k, v };
      this.pagedLayers.add(layer);
    } else {
      const what = `KV cache (${cells} cells)`;
      layer = new CudaKvLayer(cells, ring, kvHeads, headDim, type, this.alloc(kBytes, what), this.alloc(vBytes, what));
    }
    if (isTurbo(type.k)) layer.kAnchorAddress = this.alloc(kvHeads * headDim * 4, "KV cache anchor");
    return layer;
  }

  /** Frees every device and pinned allocation and graph; the backend is unusable afterwards. */
  dispose(): void {
    if (this.disposed) return;
    try { this.lib.infer_cuda_sync(); } catch { /* freeing anyway */ }
    this.steps.destroy();
    try {
      for (const l of this.pagedLayers) {
        this.pool!.free(l.pages!.k);
        this.pool!.free(l.pages!.v);
      }
    } catch { /* the device failed: the process's memory goes with it */ }
    this.pagedLayers.clear();
    try { this.pool?.dispose(); } catch { /* as above */ }
    for (const address of this.deviceAllocations) this.lib.infer_cuda_free(address);
    this.deviceAllocations.clear();
    for (const address of this.hostAllocations) this.lib.infer_cuda_host_free(address);
    this.hostAllocations.length = 0;
    this.weights.clear();
    this.disposed = true;
  }

  // ---- recording and graphs -----------------------------------------------------------------

  /** Runs (or records, during a decode step) one native launch call, its arguments by name. */
  private op<F extends LaunchCall>(fn: F, args: NamedArgs<F>, what: string): void {
    if (this.dirtyTo !== 0) this.flushPositions();
    if (this.steps.recording) this.steps.record({ fn, args, what } as never);
    else check(callNamed(fn, args), what);
  }

  /** Runs what was recorded so far eagerly and records no more in this step. */
  private stopRecording(): void {
    this.steps.stop();
  }

  /** Scratch reallocation: recorded ops and graphs point at the old buffers. */
  private beforeRealloc(): void {
    this.steps.stop();
    this.steps.destroy();
    check(this.lib.infer_cuda_sync(), "CUDA sync");
  }

  // ---- the step's inputs --------------------------------------------------------------------

  setTokens(dst: Activation, ids: ArrayLike<number>, count: number): void {
    this.stopRecording(); // a step that never reached read()
    if (count > dst.rows) throw new InferError("invalid_argument", `${count} tokens do not fit ${dst.rows} rows`);
    if (this.hostIds.length < count) this.hostIds = new Int32Array(count);
    for (let i = 0; i < count; i++) this.hostIds[i] = ids[i];
    this.idCount = count;
    this.idsOnDevice = false;
    check(this.lib.infer_cuda_upload(a(dst).address, this.hostIds, count * 4), "upload token ids");
    this.beginStep(count);
  }

  private keepTokens(dst: Activation, count: number): void {
    this.stopRecording();
    if (count !== 1 || this.idsWidth === 0) {
      throw new InferError("internal", `keepTokens: ${count} ids, ${this.idsWidth ? "" : "none "}left by argmaxToken`);
    }
    this.idCount = count;
    this.idsOnDevice = true;
    this.stepStart = performance.now();
    this.beginStep(count);
  }

  private beginStep(count: number): void {
    if (this.graphsEnabled && count <= GRAPH_ROWS) this.steps.begin();
  }

  setPositions(dst: Activation, start: number, count: number, firstRow = 0): void {
    if (firstRow + count > dst.rows) {
      throw new InferError("invalid_argument", `${count} positions at row ${firstRow} do not fit ${dst.rows} rows`);
    }
    if (this.positionsAct !== a(dst)) this.flushPositions();
    if (this.hostPositions.length < dst.rows) {
      const grown = new Int32Array(dst.rows);
      grown.set(this.hostPositions);
      this.hostPositions = grown;
    }
    const host = this.hostPositions.subarray(firstRow, firstRow + count);
    for (let i = 0; i < count; i++) host[i] = start + i;
    if (this.positionsAct !== a(dst) || firstRow === 0) this.positionRows = 0;
    this.positionsAct = a(dst);
    this.positionRows = Math.max(this.positionRows, firstRow + count);
    // Uploaded by the next op (one copy for all the segments of a batch).
    this.dirtyFrom = Math.min(this.dirtyFrom, firstRow);
    this.dirtyTo = Math.max(this.dirtyTo, firstRow + count);
  }

  private flushPositions(): void {
    if (this.dirtyTo === 0 || !this.positionsAct) return;
    const from = this.dirtyFrom, to = this.dirtyTo;
    this.dirtyFrom = Infinity;
    this.dirtyTo = 0;
    check(this.lib.infer_cuda_upload(this.positionsAct.address + from * 4, this.hostPositions.subarray(from, to),
      (to - from) * 4), "upload positions");
  }

  /** The device address of the positions of rows firstRow .. firstRow + rows - 1, checked. */
  private positionsFor(position: number, rows: number, firstRow: number): number {
    const p = this.positionsAct;
    const set = this.hostPositions;
    if (!p || firstRow + rows > this.positionRows || set[firstRow] !== position ||
      set[firstRow + rows - 1] !== position + rows - 1) {
      throw new InferError("internal", `the CUDA backend reads positions from setPositions: ` +
        `${rows} rows at ${position} (row ${firstRow}) asked, not set`);
    }
    return p.address + firstRow * 4;
  }

  // ---- ops ----------------------------------------------------------------------------------

  embed(table: Weight, ids: Activation, rows: number, out: Activation): void {
    const t = w(table);
    if (rows > this.idCount) throw new InferError("internal", `embed: ${rows} ids asked, ${this.idCount} set`);
    if (this.idsOnDevice && this.idsWidth > t.dims[1]) {
      throw new InferError("invalid_argument", `an argmax over ${this.idsWidth} logits indexes ${t.dims[1]} embeddings`);
    }
    for (let i = 0; i < (this.idsOnDevice ? 0 : rows); i++) {
      const id = this.hostIds[i];
      if (id < 0 || id >= t.dims[1]) {
        throw new InferError("invalid_argument", `token id ${id} is out of range (vocabulary: ${t.dims[1]})`);
      }
    }
    this.op("infer_cuda_get_rows", { type_id: t.typeId, table: t.address, n_cols: t.dims[0], n_ids: rows,
      ids: a(ids).address, dst: a(out).address }, `embed ${t.name}`);
    a(out).version++;
  }

  scale(x: Activation, rows: number, factor: number): void {
    this.op("infer_cuda_scale", { x: a(x).address, n: rows * x.cols, s: factor }, "scale");
    a(x).version++;
  }

  rmsNorm(x: Activation, weight: Weight | null, rows: number, eps: number, out: Activation): void {
    this.op("infer_cuda_rms_norm", { x: a(x).address, weight: weight ? w(weight).address : 0, n_rows: rows,
      n_cols: x.cols, eps, out: a(out).address }, "rms_norm");
    a(out).version++;
  }

  rmsNormAdd(x: Activation, weight: Weight, rows: number, eps: number, residual: Activation): void {
    this.op("infer_cuda_rms_norm_add", { x: a(x).address, weight: w(weight).address, n_rows: rows, n_cols: x.cols,
      eps, residual: a(residual).address }, "rms_norm_add");
    a(residual).version++;
  }

  rmsNormHeads(x: Activation, weight: Weight, rows: number, heads: number, eps: number): void {
    const headDim = x.cols / heads;
    this.op("infer_cuda_rms_norm", { x: a(x).address, weight: w(weight).address, n_rows: rows * heads,
      n_cols: headDim, eps, out: a(x).address }, "rms_norm (heads)");
    a(x).version++;
  }

  /** Makes xq/xd hold rows firstRow .. firstRow + rows - 1 of x in activation format `mode`. */
  private quantized(x: CudaActivation, firstRow: number, rows: number, mode: number): void {
    const c = this.cached;
    if (c && c.act === x && c.version === x.version && c.mode === mode && c.first === firstRow && c.rows >= rows) return;
    const values = rows * x.cols;
    if (values > this.xCapacity) {
      if (this.xq !== 0) this.beforeRealloc();
      this.release(this.xq);
      this.release(this.xd);
      this.xq = this.xd = 0;
      const capacity = Math.max(values, this.largestActivation);
      this.xq = this.alloc(capacity, "quantized activations");
      this.xd = this.alloc(Math.ceil(capacity / 32) * 4, "activation scales");
      this.xCapacity = capacity;
    }
    this.op("infer_cuda_quantize", { x: x.address + firstRow * x.cols * 4, n_rows: rows, n_cols: x.cols, mode,
      q: this.xq, d: this.xd }, "quantize activations");
    this.cached = { act: x, version: x.version, mode, first: firstRow, rows };
  }

  matmul(weight: Weight, x: Activation, rows: number, out: Activation, firstRow = 0): void {
    const t = w(weight), xa = a(x);
    if (t.dims[0] !== x.cols) throw new InferError("invalid_argument", `matmul ${t.name}: x has ${x.cols} columns`);
    if (t.activationFormat >= 0) {
      this.quantized(xa, firstRow, rows, t.activationFormat);
      // Prompts pass the f32 rows too, for the cuBLAS f16 GEMM (lib/cuda/ops.zig gemmF16); a
      // decode step's matmuls (one row) keep x = 0, which the fusion rules match on.
      const x32 = rows >= CUBLAS_ROWS_MIN ? xa.address + firstRow * x.cols * 4 : 0;
      this.op("infer_cuda_matmul", { w: t.address, type_id: t.typeId, n_out: t.dims[1], n_in: t.dims[0], x: x32,
        xq: this.xq, xd: this.xd, n_tok: rows, y: a(out).address }, `matmul ${t.name}`);
    } else {
      this.op("infer_cuda_matmul", { w: t.address, type_id: t.typeId, n_out: t.dims[1], n_in: t.dims[0],
        x: xa.address + firstRow * x.cols * 4, xq: 0, xd: 0, n_tok: rows, y: a(out).address }, `matmul ${t.name}`);
    }
    a(out).version++;
  }

  rope(x: Activation, positions: Activation, rows: number, o: RopeOptions): void {
    // An attention factor beside YaRN's (LongRoPE's) is not exercised on the GPU yet.
    if ((o.attnFactor ?? 1) !== 1 && !o.yarn) {
      throw new InferError("unsupported", `the CUDA backend's RoPE takes an attention factor with YaRN only ` +
        `(${o.attnFactor}); use --backend cpu`);
    }
    this.op("infer_cuda_rope", { x: a(x).address, n_tok: rows, n_heads: o.heads, head_dim: o.headDim,
      n_rot: o.rotaryDims, positions: a(positions).address, freq_base: o.base, freq_scale: o.scale,
      mode: o.neox ? 2 : 0, freq_factors: this.ropeFactors(o), attn_factor: o.attnFactor ?? 1,
      ...(o.yarn ? { ext_factor: o.yarn.extFactor, beta_fast: o.yarn.betaFast, beta_slow: o.yarn.betaSlow,
        n_ctx_orig: o.yarn.originalContext } : {}) }, "rope");
    a(x).version++;
  }

  /** The device address of the rope's frequency factors (0: none), checked. */
  private ropeFactors(o: RopeOptions): number {
    if (!o.freqFactors) return 0;
    const f = w(o.freqFactors);
    if (f.typeId !== GgmlType.F32 || f.dims[0] * 2 !== o.rotaryDims) {
      throw new InferError("bad_model", `rope factors '${f.name}' must be ${o.rotaryDims / 2} f32 values`);
    }
    return f.address;
  }

  storeKv(layer: KvLayer, k: Activation, v: Activation, rows: number, position: number,
    firstRow = 0): void {
    const l = layer as CudaKvLayer;
    if (!l.ring && position + rows > l.cells) {
      throw new InferError("context_overflow", `KV cache holds ${l.cells} positions, ${position + rows} needed`);
    }
    if (rows > l.cells) throw new InferError("invalid_argument", `${rows} rows do not fit a ring of ${l.cells}`);
    const kvDim = l.kvHeads * l.headDim;
    if (k.cols !== kvDim || v.cols !== kvDim) throw new InferError("invalid_argument", "storeKv: k/v width is not kvHeads·headDim");
    const p = this.positionsFor(position, rows, firstRow);
    this.mapRows(l, position, position + rows);
    const rowBytes = kvDim * 4, kAddress = a(k).address + firstRow * rowBytes, vAddress = a(v).address + firstRow * rowBytes;
    const kTurbo = isTurbo(l.types.k), vTurbo = isTurbo(l.types.v);
    // kv_store writes the halves of 32-value blocks or f16; a tq half is kv_store_turbo's.
    if (!kTurbo || !vTurbo) {
      this.op("infer_cuda_kv_store", { k: kAddress, v: vAddress, kv_dim: kvDim, n_tok: rows, k_cache: l.k, v_cache: l.v,
        positions: p, cells: l.cells, ring: l.ring, k_type: l.kTypeId, v_type: l.vTypeId }, "kv_store");
    }
    const turbo = (x: number, cache: number, type: number, anchor: number) => this.op("infer_cuda_kv_store_turbo", {
      x, n_tok: rows, kv_heads: l.kvHeads, head_dim: l.headDim, cache, cache_type: type, positions: p, first_cell: 0,
      cells: l.cells, ring: l.ring, anchor }, "kv_store_turbo");
    if (vTurbo) turbo(vAddress, l.v, l.vTypeId, 0);
    if (!kTurbo) return;
    if (l.kAnchor !== undefined) return turbo(kAddress, l.k, l.kTypeId, l.kAnchorAddress);
    // No anchor yet: the keys come back to the host, which decides it (cuda-kv-anchor.ts).
    this.stopRecording();
    const keys = new Float32Array(rows * kvDim);
    check(this.lib.infer_cuda_download(keys, kAddress, keys.byteLength), "read keys for the tq anchor");
    const cells = Array.from({ length: rows }, (_, r) => l.ring ? (position + r) % l.cells : position + r);
    if (!pendCudaKeys(this.anchorDevice, l, keys, cells)) turbo(kAddress, l.k, l.kTypeId, 0);
  }

  /** The device side of the tq anchor (cuda-kv-anchor.ts): eager, outside any recorded step. */
  private readonly anchorDevice: AnchorDevice = {
    storeHostKeys: (layer, keys, cell, rows, anchored) => {
      const l = layer as CudaKvLayer;
      this.stopRecording();
      const staging = this.turboStaging(keys.byteLength);
      check(this.lib.infer_cuda_upload(staging, keys, keys.byteLength), "upload keys for the tq anchor");
      check(callNamed("infer_cuda_kv_store_turbo", { x: staging, n_tok: rows, kv_heads: l.kvHeads, head_dim: l.headDim,
        cache: l.k, positions: 0, first_cell: cell, cells: l.cells, anchor: anchored ? l.kAnchorAddress : 0,
        cache_type: l.kTypeId, ring: l.ring }), "kv_store_turbo");
    },
    uploadAnchor: (layer) => {
      const l = layer as CudaKvLayer;
      this.stopRecording();
      check(this.lib.infer_cuda_upload(l.kAnchorAddress, l.kAnchor!, l.kAnchor!.byteLength), "upload the tq anchor");
    },
    copyCodes: (src, srcCell, dst, dstCell, cells) => {
      const s = src as CudaKvLayer, d = dst as CudaKvLayer, kb = s.kRowBytes;
      check(this.lib.infer_cuda_copy(d.k + dstCell * kb, s.k + srcCell * kb, cells * kb), "copy kv");
    },
  };

  /** A device buffer of at least `bytes` for keys coded again (grown after the stream drains). */
  private turboStaging(bytes: number): number {
    if (bytes > this.turboStagingBytes) {
      check(this.lib.infer_cuda_sync(), "CUDA sync");
      this.release(this.turboStagingAddress);
      this.turboStagingAddress = this.alloc(bytes, "tq anchor staging");
      this.turboStagingBytes = bytes;
    }
    return this.turboStagingAddress;
  }
  private turboStagingAddress = 0;
  private turboStagingBytes = 0;

  copyKv(src: KvLayer, srcCell: number, dst: KvLayer, dstCell: number, cells: number): void {
    const s = src as CudaKvLayer, d = dst as CudaKvLayer;
    // Cells are whole rows of blocks, so the prefix cache's copies move bytes as they are.
    if (s.kRowBytes !== d.kRowBytes || s.vRowBytes !== d.vRowBytes || s.types.k !== d.types.k ||
      s.types.v !== d.types.v) throw new InferError("invalid_argument", "copyKv: the layers differ in shape or type");
    if (srcCell < 0 || dstCell < 0 || srcCell + cells > s.cells || dstCell + cells > d.cells) {
      throw new InferError("invalid_argument", `copyKv: ${cells} cells from ${srcCell} to ${dstCell} overrun`);
    }
    this.stopRecording();
    this.mapRows(d, dstCell, dstCell + cells);
    const kb = s.kRowBytes, vb = s.vRowBytes;
    // A tq K layer's codes are less its anchor: copied as they are only between layers of one
    // anchor, else coded again (cuda-kv-anchor.ts), never mapped.
    if (isTurbo(s.types.k)) copyCudaAnchoredKeys(this.anchorDevice, s, srcCell, d, dstCell, cells);
    else check(this.lib.infer_cuda_copy(d.k + dstCell * kb, s.k + srcCell * kb, cells * kb), "copy kv");
    check(this.lib.infer_cuda_copy(d.v + dstCell * vb, s.v + srcCell * vb, cells * vb), "copy kv");
  }

  /**
   * The context shift (cuda-shift.ts): launched at once, outside any recorded step. Nothing the
   * backend keeps depends on a sequence's length: the graphs read positions from the device and
   * caches by address, and the next step's positions are uploaded anew.
   */
  shiftKv(layer: KvLayer, rope: RopeOptions, keep: number, discard: number, length: number): void {
    this.stopRecording();
    const l = layer as CudaKvLayer;
    // The rows moved down land in positions keep .. length - discard - 1.
    if (!l.ring && discard > 0 && keep >= 0 && length <= l.cells) {
      this.mapRows(l, keep, length - discard);
    }
    this.shifter.shift(layer as CudaKvLayer, rope, this.ropeFactors(rope), keep, discard, length);
  }

  compactKv(layer: KvLayer, rope: RopeOptions, from: Int32Array, to: number): void {
    this.stopRecording();
    const l = layer as CudaKvLayer;
    if (!l.ring && to >= 0) this.mapRows(l, to, to + from.length);
    this.shifter.compact(layer as CudaKvLayer, rope, this.ropeFactors(rope), from, to);
  }

  attention(q: Activation, layer: KvLayer, rows: number, position: number, o: AttentionOptions,
    out: Activation, firstRow = 0): void {
    const l = layer as CudaKvLayer;
    const sinks = this.sinksAddress(o);
    if (l.ring && (o.window === 0 || l.cells < o.window + rows - 1)) {
      throw new InferError("invalid_argument", `attention: a ring of ${l.cells} cells needs a window and at least ` +
        `window + rows - 1 = ${o.window + rows - 1} cells`);
    }
    const p = this.positionsFor(position, rows, firstRow);
    // Decode: split the keys over blocks so that a long context fills the GPU; prefill has rows.
    const split = rows <= 2 ? decodeSplit(l, position + rows) : 1;
    const chunk = this.attn.ensure(rows, q.rows, o, l.cells, split);
    const rowBytes = q.cols * 4;
    for (let r0 = 0; r0 < rows; r0 += chunk) {
      const n = Math.min(chunk, rows - r0), r = firstRow + r0;
      this.op("infer_cuda_attention", { q: a(q).address + r * rowBytes, k_cache: l.k, v_cache: l.v,
        out: a(out).address + r * rowBytes, positions: p + r0 * 4, n_tok: n, n_head: o.heads, n_kv_head: o.kvHeads,
        head_dim: o.headDim, window: o.window, cells: l.cells, ring: l.ring, scale: o.scale,
        scratch: this.attn.scratch, scratch_floats: this.attn.scratchFloats, n_split: split,
        arrived: split > 1 ? this.attn.arrived : 0, k_type: l.kTypeId, v_type: l.vTypeId, sinks }, "attention");
    }
    a(out).version++;
  }

  /** The device address of gpt-oss's attention sinks (one F32 logit per query head), or 0. */
  private sinksAddress(o: AttentionOptions): number {
    if (!o.sinks) return 0;
    const s = w(o.sinks);
    if (s.typeId !== GgmlType.F32 || s.dims.length !== 1 || s.dims[0] !== o.heads) {
      throw new InferError("bad_model", `attention sinks '${s.name}' must be ${o.heads} F32 values, ` +
        `not ${s.typeName} ${s.dims.join("x")}`);
    }
    return s.address;
  }

  /**
   * Rows of different sequences, one each (the server's batched decode): their keys and values
   * stored and their attention computed in one launch each (kv_store_rows, attn_decode_* with a
   * table of the caches' addresses), where one launch per sequence and layer set the step's cost.
   */
  attendRows(q: Activation, k: Activation, v: Activation, layers: readonly KvLayer[], positions: readonly number[],
    o: AttentionOptions, out: Activation, firstRow = 0): boolean {
    const l0 = layers[0] as CudaKvLayer;
    if (!this.lib.infer_cuda_attention_rows_fit(o.heads, o.kvHeads, o.headDim, l0.kTypeId, l0.vTypeId,
      o.sinks !== undefined)) return false;
    for (const layer of layers) {
      const l = layer as CudaKvLayer;
      if (l.cells !== l0.cells || l.ring !== l0.ring || l.kvHeads !== l0.kvHeads || l.headDim !== l0.headDim ||
        l.types.k !== l0.types.k || l.types.v !== l0.types.v) return false;
    }
    const rows = layers.length, kvDim = l0.kvHeads * l0.headDim;
    if (k.cols !== kvDim || v.cols !== kvDim) throw new InferError("invalid_argument", "attendRows: k/v width is not kvHeads·headDim");
    if (l0.ring && (o.window === 0 || l0.cells < o.window)) {
      throw new InferError("invalid_argument", `attention: a ring of ${l0.cells} cells needs a window of at most that`);
    }
    let visible = 0;
    for (let i = 0; i < rows; i++) {
      if (!l0.ring && positions[i] + 1 > l0.cells) {
        throw new InferError("context_overflow", `KV cache holds ${l0.cells} positions, ${positions[i] + 1} needed`);
      }
      this.positionsFor(positions[i], 1, firstRow + i);
      visible = Math.max(visible, positions[i] + 1);
    }
    const p = this.positionsFor(positions[0], 1, firstRow);
    for (let i = 0; i < rows; i++) {
      this.mapRows(layers[i] as CudaKvLayer, positions[i], positions[i] + 1);
    }
    const table = this.attn.kvTable(layers as readonly CudaKvLayer[]);
    const split = decodeSplit(l0, visible);
    if (this.attn.ensure(rows, rows, o, l0.cells, split) < rows) return false;
    const kvBytes = kvDim * 4;
    this.op("infer_cuda_kv_store_rows", { k: a(k).address + firstRow * kvBytes, v: a(v).address + firstRow * kvBytes,
      kv_dim: kvDim, n_tok: rows, kv_table: table, positions: p, cells: l0.cells, ring: l0.ring,
      k_type: l0.kTypeId, v_type: l0.vTypeId }, "kv_store_rows");
    const rowBytes = q.cols * 4;
    this.op("infer_cuda_attention", { q: a(q).address + firstRow * rowBytes, kv_table: table,
      out: a(out).address + firstRow * rowBytes, positions: p, n_tok: rows, n_head: o.heads, n_kv_head: o.kvHeads,
      head_dim: o.headDim, window: o.window, cells: l0.cells, ring: l0.ring, scale: o.scale,
      scratch: this.attn.scratch, scratch_floats: this.attn.scratchFloats, n_split: split,
      arrived: split > 1 ? this.attn.arrived : 0, k_type: l0.kTypeId, v_type: l0.vTypeId,
      sinks: this.sinksAddress(o) }, "attention_rows");
    a(out).version++;
    return true;
  }

  geluMul(gate: Activation, up: Activation, rows: number, out: Activation): void {
    this.op("infer_cuda_gelu_mul", { gate: a(gate).address, up: a(up).address, n: rows * gate.cols,
      out: a(out).address }, "gelu_mul");
    a(out).version++;
  }

  siluMul(gate: Activation, up: Activation, rows: number, out: Activation): void {
    this.op("infer_cuda_silu_mul", { gate: a(gate).address, up: a(up).address, n: rows * gate.cols,
      out: a(out).address }, "silu_mul");
    a(out).version++;
  }

  swigluOaiMul(gate: Activation, up: Activation, rows: number, out: Activation): void {
    this.op("infer_cuda_moe_swiglu_oai", { gate: a(gate).address, up: a(up).address, bias_gate: 0, bias_up: 0,
      ids: 0, n_rows: rows, n_cols: gate.cols, out: a(out).address }, "swiglu_oai");
    a(out).version++;
  }

  add(x: Activation, y: Activation, rows: number, out: Activation): void {
    this.op("infer_cuda_add", { a: a(x).address, b: a(y).address, n: rows * x.cols, out: a(out).address }, "add");
    a(out).version++;
  }

  addBias(x: Activation, bias: Weight, rows: number): void {
    const b = w(bias);
    if (b.typeId !== GgmlType.F32 || b.dims.length !== 1 || b.dims[0] !== x.cols) {
      throw new InferError("bad_model", `bias '${b.name}' must be ${x.cols} f32 values`);
    }
    this.op("infer_cuda_add_row_bias", { x: a(x).address, bias: b.address, n_rows: rows, n_cols: x.cols },
      `add bias ${b.name}`);
    a(x).version++;
  }

  private ensureArgmaxScratch(): void {
    if (this.argmaxScratch !== 0) return;
    this.argmaxScratch = this.alloc(16, "argmax scratch");
    check(this.lib.infer_cuda_fill32(this.argmaxScratch, 0, 4), "zero argmax scratch");
    const { address, buffer } = cudaHostAlloc(TOKEN_SLOTS * 4, "greedy token slots");
    this.hostAllocations.push(address);
    this.tokenSlots = new Int32Array(buffer);
    this.tokenSlotsAddress = address;
  }

  /**
   * One argmax launch per row (each reads its row once, as a one-row step's does; the launches
   * share the scratch, which each leaves zero), into a small id buffer, then one copy of the ids.
   */
  private argmaxRows(logits: Activation, rows: number): Int32Array {
    if (!(rows >= 1 && rows <= logits.rows)) {
      throw new InferError("internal", `argmax of ${rows} rows of ${logits.rows}`);
    }
    this.ensureArgmaxScratch();
    if (this.rowIdsCapacity < rows) {
      this.release(this.rowIds);
      this.rowIdsCapacity = Math.max(rows, 64);
      this.rowIds = this.alloc(this.rowIdsCapacity * 4, "argmax row ids");
      this.rowIdsHost = new Int32Array(this.rowIdsCapacity);
    }
    const x = a(logits).address, rowBytes = logits.cols * 4;
    for (let r = 0; r < rows; r++) {
      this.op("infer_cuda_argmax", { x: x + r * rowBytes, n: logits.cols, scratch: this.argmaxScratch,
        out: this.rowIds + r * 4 }, "argmax of a row");
    }
    if (this.steps.recording) this.lastGraph = this.steps.finish() || this.lastGraph;
    check(this.lib.infer_cuda_download(this.rowIdsHost, this.rowIds, rows * 4), "read argmax ids");
    return this.rowIdsHost.subarray(0, rows);
  }

  private argmaxToken(logits: Activation, ids: Activation): void {
    if (this.tokenQueue.length >= TOKEN_SLOTS) throw new InferError("internal", "too many greedy tokens queued");
    this.ensureArgmaxScratch();
    this.op("infer_cuda_argmax", { x: a(logits).address, n: logits.cols, scratch: this.argmaxScratch,
      out: a(ids).address }, "argmax");
    a(ids).version++;
    this.idsWidth = logits.cols;
    if (this.steps.recording) this.lastGraph = this.steps.finish() || this.lastGraph;
    const slot = this.tokenCount++ % TOKEN_SLOTS;
    check(this.lib.infer_cuda_download_async(this.tokenSlotsAddress + slot * 4, a(ids).address, 4, slot),
      "queue a greedy token");
    this.tokenQueue.push(slot);
    if (this.idsOnDevice) {
      this.stats.greedySteps++;
      this.stats.greedyQueueMs += performance.now() - this.stepStart;
    }
  }

  private takeToken(): number {
    const slot = this.tokenQueue.shift();
    if (slot === undefined) throw new InferError("internal", "takeToken: no greedy token queued");
    const t0 = performance.now();
    check(this.lib.infer_cuda_event_wait(slot), "greedy token");
    this.stats.greedyWaitMs += performance.now() - t0;
    return this.tokenSlots![slot];
  }

  private dropTokens(): void {
    if (this.tokenQueue.length === 0) return;
    this.tokenQueue.length = 0;
    check(this.lib.infer_cuda_sync(), "CUDA sync");
  }

  read(x: Activation, rows: number): Float32Array {
    if (this.steps.recording) this.lastGraph = this.steps.finish() || this.lastGraph;
    const xa = a(x);
    if (!xa.host) {
      const { address, buffer } = cudaHostAlloc(x.rows * x.cols * 4, `host copy of '${x.name}'`);
      this.hostAllocations.push(address);
      xa.host = new Float32Array(buffer);
      xa.hostAddress = address;
    }
    const bytes = rows * x.cols * 4;
    check(this.lib.infer_cuda_download(xa.hostAddress as Pointer, xa.address, bytes), `read ${x.name}`);
    return xa.host.subarray(0, rows * x.cols);
  }

  setThreads(_n: number): void {
    // Kernels run on the GPU; the CPU thread pool is not used.
  }

  // ---- for tests ----------------------------------------------------------------------------

  /** Copies f32 values (or i32 bit patterns) into the first rows of an activation. */
  write(x: Activation, values: Float32Array | Int32Array): void {
    this.stopRecording();
    if (values.length > x.rows * x.cols) throw new InferError("invalid_argument", `write: ${values.length} values do not fit '${x.name}'`);
    check(this.lib.infer_cuda_upload(a(x).address, values, values.length * 4), `write ${x.name}`);
    a(x).version++;
  }

  /** Fills an activation with NaN, so that a test sees every value an op failed to write. */
  poison(x: Activation): void {
    this.stopRecording();
    check(this.lib.infer_cuda_fill32(a(x).address, NAN_BITS, x.rows * x.cols), `poison ${x.name}`);
    a(x).version++;
  }

  /** Reads the KV cache of a layer (its bytes: f16 values or ggml blocks) for tests. */
  readKv(layer: KvLayer): { k: Uint8Array; v: Uint8Array } {
    const l = layer as CudaKvLayer;
    const k = new Uint8Array(l.cells * l.kRowBytes), v = new Uint8Array(l.cells * l.vRowBytes);
    check(this.lib.infer_cuda_download(k, l.k, k.length), "read kv");
    check(this.lib.infer_cuda_download(v, l.v, v.length), "read kv");
    return { k, v };
  }
}
