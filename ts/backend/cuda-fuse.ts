// The peephole fusion of a recorded decode step (ts/backend/cuda.ts records every launch call of
// a one-token step with its arguments by name; the fused list is what a CUDA graph captures).
// Each rule matches calls by name and checks that they chain through the same buffers, by the
// arguments' Zig names (lib/exports/cuda.zig, lib/abi.zig).
import type { NamedArgs } from "../native/calls.ts";

/** The launch calls of a decode step: those cuda.ts records and those the rules below make. */
export type LaunchCall =
  | "infer_cuda_get_rows" | "infer_cuda_scale" | "infer_cuda_rms_norm" | "infer_cuda_rms_norm_add"
  | "infer_cuda_quantize" | "infer_cuda_matmul" | "infer_cuda_rope" | "infer_cuda_kv_store"
  | "infer_cuda_attention" | "infer_cuda_gelu_mul" | "infer_cuda_silu_mul" | "infer_cuda_add"
  | "infer_cuda_add_row_bias" | "infer_cuda_argmax" | "infer_cuda_kv_store_rows"
  | "infer_cuda_add_rms_norm_quant" | "infer_cuda_rms_norm_quant" | "infer_cuda_rms_norm2"
  | "infer_cuda_act_mul_quant" | "infer_cuda_matmul_multi" | "infer_cuda_rope2" | "infer_cuda_norm_rope_store"
  | "infer_cuda_moe_route" | "infer_cuda_moe_group" | "infer_cuda_moe_matmul" | "infer_cuda_moe_sum"
  | "infer_cuda_moe_swiglu_oai" | "infer_cuda_kv_store_turbo";

/** One recorded launch call: which, its arguments by name, and what it does (for errors and profiles). */
export type PendingOp = { [F in LaunchCall]: { fn: F; args: NamedArgs<F>; what: string } }[LaunchCall];
type Op<F extends LaunchCall> = Extract<PendingOp, { fn: F }>;

function is<F extends LaunchCall>(o: PendingOp | undefined, fn: F): o is Op<F> {
  return o?.fn === fn;
}

/** Fused norms keep a row and its weights in shared memory (lib/cuda/ops.zig fused_cols_max). */
const FUSED_COLS_MAX = 5888;

/**
 * Peephole over a recorded step: add → rms_norm → quantize, rms_norm → quantize,
 * gelu/silu/clamped SwiGLU → quantize and attention → quantize (the o-projection's input, in
 * the attention kernel's epilogue) become one kernel each; two or three one-token matmuls over the same
 * quantized input (q/k/v, gate/up) one launch; the query and key head norms, their RoPE and the
 * KV store of one token one launch (or the RoPE of both, and the head norms, one launch each).
 * Every fused kernel computes its parts' values bit for bit (the unfused path,
 * INFER_CUDA_GRAPHS=0, is the reference the tests compare it with); fewer launches make a
 * shorter graph.
 */
export function fuseStep(ops: PendingOp[]): PendingOp[] {
  const out: PendingOp[] = [];
  for (let i = 0; i < ops.length; i++) {
    const o = ops[i], n1 = ops[i + 1], n2 = ops[i + 2];
    const qk = normRopeStore(ops, i);
    if (qk) {
      out.push(qk.op);
      i += qk.length - 1;
      continue;
    }
    if (is(o, "infer_cuda_add") && is(n1, "infer_cuda_rms_norm") && is(n2, "infer_cuda_quantize")) {
      const add = o.args, norm = n1.args, quant = n2.args;
      if (norm.x === add.out && norm.n_rows * norm.n_cols === add.n && quant.x === norm.out &&
        quant.n_rows === norm.n_rows && quant.n_cols === norm.n_cols && norm.n_cols <= FUSED_COLS_MAX) {
        out.push({ fn: "infer_cuda_add_rms_norm_quant", what: "add + rms_norm + quantize", args: {
          a: add.a, b: add.b, sum: add.out, weight: norm.weight, n_rows: norm.n_rows, n_cols: norm.n_cols,
          eps: norm.eps, out: norm.out, mode: quant.mode, q: quant.q, d: quant.d,
        } });
        i += 2;
        continue;
      }
    }
    if (is(o, "infer_cuda_attention") && is(n1, "infer_cuda_quantize") && o.args.quant_mode === undefined) {
      const attn = o.args, quant = n1.args;
      if (quant.x === attn.out && quant.n_rows === attn.n_tok && quant.n_cols === attn.n_head * attn.head_dim) {
        out.push({ fn: "infer_cuda_attention", what: "attention + quantize",
          args: { ...attn, quant_mode: quant.mode, quant_q: quant.q, quant_d: quant.d } });
        i += 1;
        continue;
      }
    }
    if (is(o, "infer_cuda_rms_norm") && is(n1, "infer_cuda_quantize")) {
      const norm = o.args, quant = n1.args;
      if (quant.x === norm.out && quant.n_rows === norm.n_rows && quant.n_cols === norm.n_cols &&
        norm.n_cols <= FUSED_COLS_MAX) {
        out.push({ fn: "infer_cuda_rms_norm_quant", what: "rms_norm + quantize",
          args: { ...norm, mode: quant.mode, q: quant.q, d: quant.d } });
        i += 1;
        continue;
      }
    }
    if (is(o, "infer_cuda_rms_norm") && is(n1, "infer_cuda_rms_norm")) {
      // Two in-place norms of the same width (the query and key head norms).
      const a = o.args, b = n1.args;
      if (a.x === a.out && b.x === b.out && a.n_cols === b.n_cols && a.eps === b.eps && a.x !== b.x) {
        out.push({ fn: "infer_cuda_rms_norm2", what: "rms_norm (q and k heads)", args: {
          xa: a.x, wa: a.weight, rows_a: a.n_rows, xb: b.x, wb: b.weight, rows_b: b.n_rows, n_cols: a.n_cols,
          eps: a.eps,
        } });
        i += 1;
        continue;
      }
    }
    if ((is(o, "infer_cuda_gelu_mul") || is(o, "infer_cuda_silu_mul")) && is(n1, "infer_cuda_quantize")) {
      const act = o.args, quant = n1.args;
      if (quant.x === act.out && quant.n_rows * quant.n_cols === act.n) {
        out.push({ fn: "infer_cuda_act_mul_quant", what: "gated activation + quantize", args: {
          kind: o.fn === "infer_cuda_silu_mul" ? 1 : 0, gate: act.gate, up: act.up, n_rows: quant.n_rows,
          n_cols: quant.n_cols, out: act.out, mode: quant.mode, q: quant.q, d: quant.d,
        } });
        i += 1;
        continue;
      }
    }
    if (is(o, "infer_cuda_moe_swiglu_oai") && is(n1, "infer_cuda_quantize")) {
      const act = o.args, quant = n1.args;
      if (quant.x === act.out && quant.n_rows === act.n_rows && quant.n_cols === act.n_cols) {
        out.push({ fn: "infer_cuda_act_mul_quant", what: "clamped SwiGLU + quantize", args: {
          kind: 2, gate: act.gate, up: act.up, n_rows: quant.n_rows, n_cols: quant.n_cols, out: act.out,
          mode: quant.mode, q: quant.q, d: quant.d, bias_gate: act.bias_gate, bias_up: act.bias_up, ids: act.ids,
        } });
        i += 1;
        continue;
      }
    }
    if (is(o, "infer_cuda_matmul") && is(n1, "infer_cuda_matmul")) {
      const first = o.args, group = [first];
      const quantized = first.x === 0 && first.xq !== 0 && first.n_tok === 1;
      for (let j = i + 1; quantized && j < ops.length && group.length < 3; j++) {
        const m = ops[j];
        if (!is(m, "infer_cuda_matmul")) break;
        const a = m.args;
        if (a.type_id !== first.type_id || a.n_in !== first.n_in || a.x !== 0 || a.xq !== first.xq ||
          a.xd !== first.xd || a.n_tok !== 1) break;
        group.push(a);
      }
      if (group.length >= 2) {
        const [a, b, c] = [group[0], group[1], group[2] ?? { w: 0, n_out: 0, y: 0 }];
        out.push({ fn: "infer_cuda_matmul_multi", what: `${group.length} matmuls`, args: {
          type_id: first.type_id, n_in: first.n_in, xq: first.xq, xd: first.xd,
          w0: a.w, n0: a.n_out, y0: a.y, w1: b.w, n1: b.n_out, y1: b.y, w2: c.w, n2: c.n_out, y2: c.y,
        } });
        i += group.length - 1;
        continue;
      }
    }
    if (is(o, "infer_cuda_rope") && is(n1, "infer_cuda_rope")) {
      const a = o.args, b = n1.args;
      if (sameRope(a, b)) {
        out.push({ fn: "infer_cuda_rope2", what: "rope (q and k)", args: {
          xa: a.x, heads_a: a.n_heads, xb: b.x, heads_b: b.n_heads, n_tok: a.n_tok, head_dim: a.head_dim,
          n_rot: a.n_rot, positions: a.positions, freq_base: a.freq_base, freq_scale: a.freq_scale, mode: a.mode,
          freq_factors: a.freq_factors, ...yarnOf(a),
        } });
        i += 1;
        continue;
      }
    }
    out.push(o);
  }
  return out;
}

/** Two RoPE calls of the same rows, head size, positions and frequencies (heads may differ). */
function sameRope(a: NamedArgs<"infer_cuda_rope">, b: NamedArgs<"infer_cuda_rope">): boolean {
  const ya = yarnOf(a), yb = yarnOf(b);
  return a.n_tok === b.n_tok && a.head_dim === b.head_dim && a.n_rot === b.n_rot && a.positions === b.positions &&
    a.freq_base === b.freq_base && a.freq_scale === b.freq_scale && a.mode === b.mode &&
    a.freq_factors === b.freq_factors && ya.attn_factor === yb.attn_factor && ya.ext_factor === yb.ext_factor &&
    ya.beta_fast === yb.beta_fast && ya.beta_slow === yb.beta_slow && ya.n_ctx_orig === yb.n_ctx_orig;
}

/** A RoPE call's attention factor and YaRN fields, with lib/abi.zig's defaults where absent. */
function yarnOf(a: NamedArgs<"infer_cuda_rope">): { attn_factor: number; ext_factor: number; beta_fast: number;
  beta_slow: number; n_ctx_orig: number } {
  return { attn_factor: a.attn_factor ?? 1, ext_factor: a.ext_factor ?? 0, beta_fast: a.beta_fast ?? 32,
    beta_slow: a.beta_slow ?? 1, n_ctx_orig: a.n_ctx_orig ?? 0 };
}

/**
 * One token's [head norm of q, head norm of k,] RoPE of q, RoPE of k, KV store, as recorded by
 * selfAttention (ts/model/layers.ts), into one norm_rope_store launch; null when ops[i..] is not
 * that chain.
 */
function normRopeStore(ops: PendingOp[], i: number): { op: PendingOp; length: number } | null {
  const qn = ops[i], kn = ops[i + 1];
  const norms = is(qn, "infer_cuda_rms_norm") && is(kn, "infer_cuda_rms_norm");
  const r = norms ? i + 2 : i;
  const qr = ops[r], kr = ops[r + 1], st = ops[r + 2];
  if (!is(qr, "infer_cuda_rope") || !is(kr, "infer_cuda_rope") || !is(st, "infer_cuda_kv_store")) return null;
  const A = qr.args, B = kr.args, S = st.args;
  // A tq3/tq4 half (ids 103, 104) is stored by kv_store_turbo, a block a head vector.
  if ((S.k_type ?? 1) >= 103 || (S.v_type ?? 1) >= 103) return null;
  if (A.n_tok !== 1 || !sameRope(A, B) || A.x === B.x) return null;
  if (S.k !== B.x || S.kv_dim !== B.n_heads * A.head_dim || S.n_tok !== 1 || S.positions !== A.positions) return null;
  let wq = 0, wk = 0, eps = 0;
  if (is(qn, "infer_cuda_rms_norm") && is(kn, "infer_cuda_rms_norm")) {
    // rms_norm (heads, in place): rows·heads rows of headDim values.
    const Q = qn.args, K = kn.args;
    if (Q.x !== A.x || Q.out !== A.x || K.x !== B.x || K.out !== B.x || Q.n_rows !== A.n_heads ||
      K.n_rows !== B.n_heads || Q.n_cols !== A.head_dim || K.n_cols !== A.head_dim || Q.eps !== K.eps ||
      Q.weight === 0 || K.weight === 0) return null;
    [wq, wk, eps] = [Q.weight, K.weight, Q.eps];
  }
  return {
    op: { fn: "infer_cuda_norm_rope_store", what: "head norms + rope + kv_store", args: {
      q: A.x, heads_q: A.n_heads, k: B.x, heads_k: B.n_heads, v: S.v, wq, wk, eps, head_dim: A.head_dim,
      n_rot: A.n_rot, positions: A.positions, freq_base: A.freq_base, freq_scale: A.freq_scale, mode: A.mode,
      freq_factors: A.freq_factors, k_cache: S.k_cache, v_cache: S.v_cache, cells: S.cells, ring: S.ring,
      k_type: S.k_type, v_type: S.v_type, ...yarnOf(A),
    } },
    length: (norms ? 2 : 0) + 3,
  };
}
