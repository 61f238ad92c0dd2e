// Mixture-of-experts layers on the CUDA backend (lib/cuda/moe.zig, shaders/cuda/moe.cuh). A 3-D
// expert tensor is uploaded whole (one allocation, each expert's rows after the one before, in the
// GPU layout where its rows take one) and split into views; the layer runs as the router's matmul
// and five launches that read the chosen experts' ids from device memory, so nothing waits for the
// host and a decode step stays one CUDA graph:
//   moe_route   per token: softmax → top k → divided by their sum (Qwen3-MoE), or the top k
//               logits → a softmax over them (gpt-oss, after the router's bias), on the GPU
//   moe_group   (batches of ≥ 1 slot an expert on average) the slots sorted by expert, cut into
//               tiles of up to 8 or 32 slots of one expert
//   moe_matmul  gate and up of every slot in one launch: W[ids[s]] · x[s / k]
//   silu_mul + quantize (fused in a graph), or gpt-oss's moe_swiglu_oai (the slot's expert's
//               gate and up biases added first) + quantize; moe_matmul for down: W[ids[s]] · h[s]
//   moe_sum     out[t] = Σ_j w_j · (down[t·k + j] + its expert's down bias), in rank order as
//               the CPU sums them.
// A token's k chosen experts are its k slots (slot s = token · k + rank). Decode and small batches
// take a grid row per slot (each reads only its expert's rows: the bytes of the active
// parameters); larger batches and prompts a grid row per tile of one expert's slots, their
// activation rows gathered by the table, on the tensor cores (moe_mmq, ggml's mul_mat_id with
// MMQ): an expert's rows are read once for up to 32 of the rows routed to it (8 where an expert
// gets fewer than 16 on average), its outputs scattered back to the slots for moe_sum.
import { InferError } from "../errors.ts";
import type { GgufFile, GgufTensorInfo } from "../gguf/reader.ts";
import type { NamedArgs } from "../native/calls.ts";
import type { native } from "../native/lib.ts";
import type { LaunchCall } from "./cuda-fuse.ts";
import type { Activation, Backend, ExpertOps, ExpertWeights, Routing, Weight } from "./backend.ts";

/** What the CUDA backend's weights carry beyond Weight (ts/backend/cuda.ts CudaWeight). */
interface DeviceWeight extends Weight {
  readonly typeId: number;
  readonly address: number;
  /** The activation format its matvec reads: 0 = Q8_0, 1 = Q8_K, -1 = f32. */
  readonly activationFormat: number;
}

/** The CUDA backend's internals these ops use. */
export interface CudaMoeHost {
  readonly lib: ReturnType<typeof native>;
  readonly backend: Backend;
  /** A view of `bytes` bytes of `base` from byte `offset`: a weight of its own. */
  view(base: Weight, name: string, dims: readonly number[], offset: number): Weight;
  address(x: Activation): number;
  /** Runs (or records, in a decode step) one launch call. */
  op<F extends LaunchCall>(fn: F, args: NamedArgs<F>, what: string): void;
  /** x's first rows quantized in activation format `mode`: the device addresses of q and d. */
  quantized(x: Activation, rows: number, mode: number): { readonly xq: number; readonly xd: number };
  /** Marks x as rewritten (the quantized-activation cache keys on it). */
  written(x: Activation): void;
  /** Copies host values into x's first values, in stream order (ends a step's recording). */
  upload(x: Activation, values: Int32Array | Float32Array): void;
}

/** A layer's routing (CudaExperts.pinRoute): per slot (token · k + rank), expert and weight. */
export interface PinnedRoute {
  readonly ids: Int32Array;
  readonly weights: Float32Array;
}

/** An expert tensor as uploaded: its views' base, bytes per expert, type and activation format. */
interface ExpertTensor {
  readonly base: number;
  readonly expertBytes: number;
  readonly typeId: number;
  readonly format: number;
  readonly nOut: number;
  readonly nIn: number;
}

/** Scratch for `rows` tokens of one layer shape, planned once. */
interface MoeScratch {
  readonly logits: Activation;
  readonly ids: Activation;
  readonly weights: Activation;
  readonly gate: Activation;
  readonly up: Activation;
  readonly down: Activation;
  readonly table: Activation;
}

export class CudaExperts implements ExpertOps {
  /**
   * Batches of at least this many slots an expert on average take the grouped matvec (a grid
   * row per tile of up to 8 slots of one expert); fewer, a grid row per slot. 1: from
   * experts / k tokens (Qwen3-30B-A3B: 16), where most chosen experts serve more than one slot.
   * Benches set 0 (always grouped) or Infinity (never) to compare the two.
   */
  groupSlotsPerExpert = 1;
  /**
   * Tests: called once per MoE layer, in order, with the experts the router chose and their
   * weights (slot by slot), the layer's tokens and k; the experts and weights it returns replace the router's (the CPU's
   * choice, say), so that the rest of the layer is compared with the CPU's even where their k-th
   * and (k+1)-th scores nearly tie and a rounding picks another expert. Each call reads and
   * uploads: steps run as eager ops, not graphs.
   */
  pinRoute: ((chosen: PinnedRoute, rows: number, k: number) => PinnedRoute) | null = null;
  /**
   * The grouped kernel: "mma" (tensor-core tiles, moe_mmq) or "matvec" (moe_mv8: a warp a weight
   * row, tiles of 8 slots, each slot's sums as the per-slot matvec's, bit for bit). Benches set
   * "matvec" to compare the two.
   */
  groupKernel: "mma" | "matvec" = "mma";
  /**
   * Grouped tensor-core batches of at least this many slots an expert on average take tiles of
   * 32 slots (an expert's rows read once per 32), fewer tiles of 8 (less MMA work spent on
   * slots that are not there). The results do not depend on the tile.
   */
  wideTileSlotsPerExpert = 16;
  private readonly tensors = new WeakMap<readonly Weight[], ExpertTensor>();
  /** Per-expert vectors (splitVectors): the device address of expert 0's. */
  private readonly vectors = new WeakMap<readonly Weight[], number>();
  /** Scratch by layer shape (a model has one; a draft model beside it another). */
  private readonly scratch = new Map<string, MoeScratch>();

  constructor(private readonly host: CudaMoeHost) {}

  /** The 3-D tensor uploaded whole; expert e a view of its e-th slice. */
  split(file: GgufFile, t: GgufTensorInfo): readonly Weight[] {
    if (t.dims.length !== 3) throw new InferError("bad_model", `tensor '${t.name}' is not 3-D`);
    const whole = this.host.backend.weight(file, t) as DeviceWeight;
    if (!this.host.lib.infer_cuda_moe_supports(whole.typeId)) {
      throw new InferError("unsupported", `experts '${t.name}' are ${t.type.name}, which the CUDA backend ` +
        "does not run as experts yet (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K and MXFP4 do); use --backend cpu");
    }
    const [cols, rows, experts] = t.dims as [number, number, number];
    const expertBytes = t.byteLength / experts;
    const views = Array.from({ length: experts }, (_, e) =>
      this.host.view(whole, `${t.name}[${e}]`, [cols, rows], e * expertBytes));
    this.tensors.set(views, { base: whole.address, expertBytes, typeId: whole.typeId,
      format: whole.activationFormat, nOut: rows, nIn: cols });
    return views;
  }

  /** The [n, experts] F32 tensor uploaded whole; expert e's vector a view of its e-th row. */
  splitVectors(file: GgufFile, t: GgufTensorInfo): readonly Weight[] {
    if (t.dims.length !== 2 || t.type.name !== "F32") {
      throw new InferError("bad_model", `tensor '${t.name}' is not a 2-D F32 table of expert vectors`);
    }
    const whole = this.host.backend.weight(file, t) as DeviceWeight;
    const [n, experts] = t.dims as [number, number];
    const views = Array.from({ length: experts }, (_, e) =>
      this.host.view(whole, `${t.name}[${e}]`, [n], 4 * n * e));
    this.vectors.set(views, whole.address);
    return views;
  }

  private vectorTable(v: readonly Weight[], cols: number): number {
    const address = this.vectors.get(v);
    if (address === undefined || v[0]?.dims[0] !== cols) {
      throw new InferError("internal",
        `expert vectors '${v[0]?.name}' are not a CUDA table of ${cols} values`);
    }
    return address;
  }

  private tensor(experts: readonly Weight[]): ExpertTensor {
    const t = this.tensors.get(experts);
    if (!t) throw new InferError("internal", `experts '${experts[0]?.name}' were not split by the CUDA backend`);
    return t;
  }

  routedFfn(w: ExpertWeights, x: Activation, rows: number, r: Routing, out: Activation): void {
    const h = this.host, be = h.backend;
    const gate = this.tensor(w.gate), up = this.tensor(w.up), down = this.tensor(w.down);
    if (gate.nIn !== x.cols || down.nOut !== out.cols || up.nOut !== gate.nOut || down.nIn !== gate.nOut) {
      throw new InferError("bad_model", `expert shapes [${gate.nIn}, ${gate.nOut}] / [${down.nIn}, ${down.nOut}] ` +
        `do not chain from ${x.cols} to ${out.cols} values`);
    }
    const k = r.k, slots = rows * k, b = this.buffers(x.rows, r, gate.nOut, down.nOut);
    const bias = w.biases;
    // Checked before any launch: expert biases come with gpt-oss's activation only.
    if (bias && r.activation !== "swiglu-oai") {
      throw new InferError("unsupported", "expert biases with SwiGLU are not implemented on CUDA");
    }
    be.matmul(w.router, x, rows, b.logits);
    if (bias) be.addBias(b.logits, bias.router, rows);
    h.op("infer_cuda_moe_route", { logits: h.address(b.logits), n_tok: rows, n_expert: r.experts, k,
      gating: r.gating === "topk-softmax" ? 1 : 0, norm: r.normalizeTopK, ids: h.address(b.ids),
      weights: h.address(b.weights) }, "moe route");
    if (this.pinRoute) {
      const own = be.read(b.ids, slots); // i32 bit patterns
      const ids = new Int32Array(own.buffer, own.byteOffset, slots).slice();
      const pin = this.pinRoute({ ids, weights: be.read(b.weights, slots).slice() }, rows, k);
      if (pin.ids.length !== slots || pin.weights.length !== slots ||
        pin.ids.some((e) => !(e >= 0 && e < r.experts))) {
        throw new InferError("invalid_argument", `a pinned route of ${pin.ids.length} slots for ${slots}`);
      }
      h.upload(b.ids, pin.ids);
      h.upload(b.weights, pin.weights);
    }
    const grouped = slots >= this.groupSlotsPerExpert * r.experts;
    const table = grouped ? h.address(b.table) : 0;
    const mma = this.groupKernel === "mma" ? 1 : 0;
    const tile = mma && slots >= this.wideTileSlotsPerExpert * r.experts ? 32 : 8;
    if (grouped) {
      h.op("infer_cuda_moe_group", { ids: h.address(b.ids), n_slots: slots, n_expert: r.experts, tile, table },
        "moe group");
    }
    const ids = h.address(b.ids);
    const run = (t: ExpertTensor, input: Activation, xDiv: number, y: Activation, t1?: ExpertTensor,
      y1?: Activation) => {
      const q = h.quantized(input, slots / xDiv, t.format);
      h.op("infer_cuda_moe_matmul", { type_id: t.typeId, n_out: t.nOut, n_in: t.nIn, expert_bytes: t.expertBytes,
        n_expert: r.experts, xq: q.xq, xd: q.xd, x_div: xDiv, ids, n_slots: slots, groups: table,
        w0: t.base, y0: h.address(y), w1: t1?.base ?? 0, y1: y1 ? h.address(y1) : 0, tile, mma }, "moe matmul");
      h.written(y);
      if (y1) h.written(y1);
    };
    // gate and up in one launch where they share a type (they share the input)
    if (gate.typeId === up.typeId) run(gate, x, k, b.gate, up, b.up);
    else {
      run(gate, x, k, b.gate);
      run(up, x, k, b.up);
    }
    if (r.activation === "swiglu-oai") {
      h.op("infer_cuda_moe_swiglu_oai", { gate: h.address(b.gate), up: h.address(b.up),
        bias_gate: bias ? this.vectorTable(bias.gate, gate.nOut) : 0,
        bias_up: bias ? this.vectorTable(bias.up, gate.nOut) : 0, ids: bias ? ids : 0, n_rows: slots,
        n_cols: gate.nOut, out: h.address(b.gate) }, "moe swiglu_oai");
      h.written(b.gate);
    } else {
      be.siluMul(b.gate, b.up, slots, b.gate);
    }
    run(down, b.gate, 1, b.down);
    h.op("infer_cuda_moe_sum", { y: h.address(b.down), weights: h.address(b.weights), k, n_cols: out.cols,
      n_tok: rows, bias: bias ? this.vectorTable(bias.down, down.nOut) : 0, ids: bias ? ids : 0,
      out: h.address(out) }, "moe sum");
    h.written(out);
  }

  /** The layer's scratch for up to `rows` tokens (every layer of a model shares one). */
  private buffers(rows: number, r: Routing, feedForward: number, embedding: number): MoeScratch {
    const key = `${rows}/${r.experts}/${r.k}/${feedForward}/${embedding}`;
    const known = this.scratch.get(key);
    if (known) return known;
    const be = this.host.backend, slots = rows * r.k;
    const tableInts = Number(this.host.lib.infer_cuda_moe_group_ints(slots, r.experts));
    const scratch: MoeScratch = {
      logits: be.activation("moe_logits", rows, r.experts),
      ids: be.activation("moe_ids", slots, 1),
      weights: be.activation("moe_weights", slots, 1),
      gate: be.activation("moe_gate", slots, feedForward),
      up: be.activation("moe_up", slots, feedForward),
      down: be.activation("moe_down", slots, embedding),
      table: be.activation("moe_groups", tableInts, 1),
    };
    this.scratch.set(key, scratch);
    return scratch;
  }

  gatherRows(): void {
    throw unsupportedHostRouting();
  }

  scatterScaled(): void {
    throw unsupportedHostRouting();
  }

  sumGroups(): void {
    throw unsupportedHostRouting();
  }
}

/** The host-routed path (per-expert matmuls with rows moved by index) is the CPU's. */
function unsupportedHostRouting(): InferError {
  return new InferError("unsupported", "the CUDA backend routes experts on the device only " +
    "(no per-row scaling by host tables); use --backend cpu");
}
