// A mixture-of-experts feed-forward layer (Shazeer et al. 2017, "Outrageously Large Neural
// Networks"; as Qwen3-MoE and llama.cpp's build_moe_ffn compute it): a router scores every expert
// for each token, the top k run their own gated FFN on it, and their outputs are summed weighted
// by the router's probabilities. Only the chosen experts' weights are read: each expert is a
// weight of its own (Backend.experts.split), and a batch's rows are grouped by expert so that an
// expert's matrices are read once per batch however many of its rows chose it.
import type { Activation, Backend, ExpertOps, Weight } from "../backend/backend.ts";
import { setting } from "../config/env.ts";
import { InferError } from "../errors.ts";
import type { WeightTable } from "./layers.ts";

export interface MoeShape {
  readonly embedding: number;
  readonly experts: number;
  /** k: experts each token runs. */
  readonly expertsUsed: number;
  /** The hidden width of one expert's FFN. */
  readonly expertFeedForward: number;
  /** Divide the chosen experts' probabilities by their sum (Qwen3-MoE's norm_topk_prob). */
  readonly normalizeTopK: boolean;
  /**
   * "softmax" (Qwen3-MoE): a softmax over every expert's logit, then the top k of the
   * probabilities; "topk-softmax" (gpt-oss, llama.cpp's SOFTMAX_WEIGHT): the top k of the raw
   * logits, their weights a softmax over those k alone. Absent: "softmax".
   */
  readonly gating?: "softmax" | "topk-softmax";
  /** The experts' gated activation: SwiGLU, or gpt-oss's clamped one (Backend.swigluOaiMul). */
  readonly activation?: "silu" | "swiglu-oai";
}

export interface MoeWeights {
  /** Router: one logit per expert ([embedding, experts]). */
  readonly router: Weight;
  readonly gate: readonly Weight[];
  readonly up: readonly Weight[];
  readonly down: readonly Weight[];
  /** gpt-oss's biases: the router's (one per expert) and each expert's gate, up and down. */
  readonly biases?: ExpertBiases;
}

export interface ExpertBiases {
  readonly router: Weight;
  readonly gate: readonly Weight[];
  readonly up: readonly Weight[];
  readonly down: readonly Weight[];
}

/** The biases as llama.cpp names them: ffn_gate_inp.bias, ffn_{gate,up,down}_exps.bias. */
export function expertBiases(t: WeightTable, prefix: string, s: MoeShape): ExpertBiases {
  const e = s.embedding, f = s.expertFeedForward, n = s.experts;
  return {
    router: t.vector(`${prefix}.ffn_gate_inp.bias`, [n]),
    gate: t.expertVectors(`${prefix}.ffn_gate_exps.bias`, [f, n]),
    up: t.expertVectors(`${prefix}.ffn_up_exps.bias`, [f, n]),
    down: t.expertVectors(`${prefix}.ffn_down_exps.bias`, [e, n]),
  };
}

/** llama.cpp's GGUF names: blk.N.ffn_gate_inp, and the experts stacked in ffn_{gate,up,down}_exps. */
export function moeWeights(t: WeightTable, prefix: string, s: MoeShape): MoeWeights {
  const e = s.embedding, f = s.expertFeedForward, n = s.experts;
  return {
    router: t.get(`${prefix}.ffn_gate_inp.weight`, [e, n]),
    gate: t.experts(`${prefix}.ffn_gate_exps.weight`, [e, f, n]),
    up: t.experts(`${prefix}.ffn_up_exps.weight`, [e, f, n]),
    down: t.experts(`${prefix}.ffn_down_exps.weight`, [f, e, n]),
  };
}

/** Activations and routing tables for `rows` tokens, planned once. */
export class MoeBuffers {
  readonly logits: Activation;
  /** The rows routed to one expert, gathered. */
  readonly x: Activation;
  readonly gate: Activation;
  readonly up: Activation;
  readonly down: Activation;
  /** Row r·k + j: token r's j-th expert's output, weighted. */
  readonly slots: Activation;
  /** Per token r and rank j (index r·k + j): the chosen expert and its weight. */
  readonly chosen: Int32Array;
  readonly weights: Float32Array;
  /** Per expert, the rows, slots and weights routed to it (scratch). */
  readonly rows: Int32Array;
  readonly slotIds: Int32Array;
  readonly slotWeights: Float32Array;
  readonly counts: Int32Array;
  readonly probs: Float32Array;

  constructor(be: Backend, rows: number, s: MoeShape) {
    const k = s.expertsUsed;
    this.logits = be.activation("moe_logits", rows, s.experts);
    this.x = be.activation("moe_x", rows, s.embedding);
    this.gate = be.activation("moe_gate", rows, s.expertFeedForward);
    this.up = be.activation("moe_up", rows, s.expertFeedForward);
    this.down = be.activation("moe_down", rows, s.embedding);
    this.slots = be.activation("moe_slots", rows * k, s.embedding);
    this.chosen = new Int32Array(rows * k);
    this.weights = new Float32Array(rows * k);
    this.rows = new Int32Array(rows);
    this.slotIds = new Int32Array(rows);
    this.slotWeights = new Float32Array(rows);
    this.counts = new Int32Array(s.experts);
    this.probs = new Float32Array(s.experts);
  }
}

/** Floats per batch row the buffers hold (the engine's memory plan). */
export function moeRowFloats(s: MoeShape): number {
  return s.experts + 3 * s.embedding + 2 * s.expertFeedForward + s.expertsUsed * s.embedding;
}

/**
 * p = softmax(logits); the k largest p_i, best first; with normalizeTopK each divided by their
 * sum — in f32 as ggml computes them (exp, a float64 sum, one scale by its inverse; the sum of the
 * chosen clamped below at 2^-14, ggml's guard against dividing by zero).
 */
export function route(logits: Float32Array, s: MoeShape, probs: Float32Array,
  chosen: Int32Array, weights: Float32Array, at: number): void {
  if (s.gating === "topk-softmax") {
    routeTopKSoftmax(logits, s, chosen, weights, at);
    return;
  }
  const n = s.experts, k = s.expertsUsed;
  let max = -Infinity;
  for (let i = 0; i < n; i++) max = Math.max(max, logits[i]);
  let sum = 0;
  for (let i = 0; i < n; i++) {
    probs[i] = Math.exp(logits[i] - max);
    sum += probs[i];
  }
  const inverse = Math.fround(1 / sum);
  for (let i = 0; i < n; i++) probs[i] = probs[i] * inverse;
  topK(probs, n, k, chosen, weights, at);
  if (!s.normalizeTopK) return;
  let total = 0;
  for (let j = 0; j < k; j++) total += weights[at + j];
  const divisor = Math.max(Math.fround(total), 6.103515625e-5);
  for (let j = 0; j < k; j++) weights[at + j] = weights[at + j] / divisor;
}

/** The k largest of `values`, best first (ties to the lower index), into chosen/weights. */
function topK(values: Float32Array, n: number, k: number, chosen: Int32Array,
  weights: Float32Array, at: number): void {
  for (let j = 0; j < k; j++) {
    let best = -1;
    for (let i = 0; i < n; i++) {
      if (best >= 0 && !(values[i] > values[best])) continue;
      let taken = false;
      for (let q = 0; q < j; q++) if (chosen[at + q] === i) { taken = true; break; }
      if (!taken) best = i;
    }
    chosen[at + j] = best;
    weights[at + j] = values[best];
  }
}

/**
 * gpt-oss: the k largest raw logits, then a softmax over those k, in f32 as ggml_soft_max
 * computes it (exp of the difference from the largest, a float64 sum, one scale by its inverse).
 */
function routeTopKSoftmax(logits: Float32Array, s: MoeShape, chosen: Int32Array,
  weights: Float32Array, at: number): void {
  const k = s.expertsUsed;
  topK(logits, s.experts, k, chosen, weights, at);
  const max = weights[at];
  let sum = 0;
  for (let j = 0; j < k; j++) {
    weights[at + j] = Math.exp(weights[at + j] - max);
    sum += weights[at + j];
  }
  const inverse = Math.fround(1 / sum);
  for (let j = 0; j < k; j++) weights[at + j] = weights[at + j] * inverse;
}

/**
 * out = Σ_j w_j · W_down[e_j] · (silu(W_gate[e_j] x) ⊙ W_up[e_j] x) over each row's k chosen
 * experts e_j (route), summed in rank order as llama.cpp does. The backend's ffn does it all in
 * one call where it has one; otherwise here, the same sums: rows are grouped by expert, an
 * expert's matrices run once over all the rows that chose it; a lone row is read in place.
 */
export function moeFfn(be: Backend, x: Activation, rows: number, w: MoeWeights, s: MoeShape,
  b: MoeBuffers, out: Activation): void {
  const ops: ExpertOps | undefined = be.experts;
  if (!ops) throw new InferError("unsupported", `the ${be.name} backend has no expert ops`);
  const k = s.expertsUsed;
  const bias = w.biases;
  if (ops.routedFfn) {
    ops.routedFfn(w, x, rows, { experts: s.experts, k, gating: s.gating ?? "softmax",
      normalizeTopK: s.normalizeTopK, activation: s.activation ?? "silu" }, out);
    return;
  }
  be.matmul(w.router, x, rows, b.logits);
  if (bias) be.addBias(b.logits, bias.router, rows);
  const logits = be.read(b.logits, rows);
  for (let r = 0; r < rows; r++) {
    route(logits.subarray(r * s.experts, (r + 1) * s.experts), s, b.probs, b.chosen, b.weights, r * k);
  }
  const oai = s.activation === "swiglu-oai";
  if (oai && !be.swigluOaiMul) {
    throw new InferError("unsupported", `the ${be.name} backend has no clamped SwiGLU (gpt-oss)`);
  }
  // The one-call kernel computes SwiGLU without biases.
  if (!oai && !bias && ops.ffn && ops.ffnSupports?.(rows, s.expertFeedForward)) {
    ops.ffn(w.gate, w.up, w.down, x, rows, b.chosen, b.weights, k, out);
    return;
  }
  b.counts.fill(0);
  for (let i = 0; i < rows * k; i++) b.counts[b.chosen[i]]++;
  for (let e = 0; e < s.experts; e++) {
    const m = b.counts[e];
    if (m === 0) continue;
    let c = 0;
    for (let i = 0; i < rows * k && c < m; i++) {
      if (b.chosen[i] !== e) continue;
      b.rows[c] = Math.floor(i / k);
      b.slotIds[c] = i;
      b.slotWeights[c] = b.weights[i];
      c++;
    }
    if (m === 1) {
      be.matmul(w.gate[e], x, 1, b.gate, b.rows[0]);
      be.matmul(w.up[e], x, 1, b.up, b.rows[0]);
    } else {
      ops.gatherRows(x, b.rows, m, b.x);
      be.matmul(w.gate[e], b.x, m, b.gate);
      be.matmul(w.up[e], b.x, m, b.up);
    }
    if (bias) {
      be.addBias(b.gate, bias.gate[e], m);
      be.addBias(b.up, bias.up[e], m);
    }
    if (oai) be.swigluOaiMul!(b.gate, b.up, m, b.gate);
    else be.siluMul(b.gate, b.up, m, b.gate);
    be.matmul(w.down[e], b.gate, m, b.down);
    if (bias) be.addBias(b.down, bias.down[e], m);
    ops.scatterScaled(b.down, b.slotIds, b.slotWeights, m, b.slots);
  }
  ops.sumGroups(b.slots, k, rows, out);
}
