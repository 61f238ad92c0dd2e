// The peephole fusion of a recorded decode step (ts/backend/cuda.ts records every launch call of
// a one-token step with its arguments; the fused list is what a CUDA graph captures). Each rule
// matches ops by code and checks that they chain through the same buffers.
import type { native } from "../native/lib.ts";

export type Lib = ReturnType<typeof native>;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type NativeFn = (...args: any[]) => number;
export type Arg = number | boolean;
export interface PendingOp { code: number; fn: NativeFn; args: Arg[]; what: string }

// Op codes (the first argument of CudaBackend.op()); the rules match on them.
export const RMS_NORM = 3, QUANTIZE = 5, MATMUL = 6, ROPE = 7, KV_STORE = 8, ATTENTION = 9, GELU = 10, SILU = 11,
  ADD = 12;
/** Fused norms keep a row and its weights in shared memory (lib/cuda/ops.zig fused_cols_max). */
const FUSED_COLS_MAX = 5888;

/**
 * Peephole over a recorded step: add → rms_norm → quantize, rms_norm → quantize,
 * gelu/silu → quantize and attention → quantize (the o-projection's input, in the attention
 * kernel's epilogue) become one kernel each; two or three one-token matmuls over the same
 * quantized input (q/k/v, gate/up) one launch; the query and key head norms, their RoPE and the
 * KV store of one token one launch (or the RoPE of both, and the head norms, one launch each).
 * Every fused kernel computes its parts' values bit for bit (the unfused path,
 * INFER_CUDA_GRAPHS=0, is the reference the tests compare it with); fewer launches make a
 * shorter graph.
 */
export function fuseStep(L: Lib, ops: PendingOp[]): PendingOp[] {
  const out: PendingOp[] = [];
  const num = (o: PendingOp) => o.args as number[];
  for (let i = 0; i < ops.length; i++) {
    const o = ops[i], n1 = ops[i + 1], n2 = ops[i + 2];
    const qk = normRopeStore(L, ops, i);
    if (qk) {
      out.push(qk.op);
      i += qk.length - 1;
      continue;
    }
    if (o.code === ADD && n1?.code === RMS_NORM && n2?.code === QUANTIZE) {
      const [a, b, n, sum] = num(o), [x, w, rows, cols, eps, normed] = num(n1), [qx, qr, qc, mode, q, d] = num(n2);
      if (x === sum && rows * cols === n && qx === normed && qr === rows && qc === cols && cols <= FUSED_COLS_MAX) {
        out.push({ code: -1, fn: L.infer_cuda_add_rms_norm_quant, args: [a, b, sum, w, rows, cols, eps, normed, mode, q, d],
          what: "add + rms_norm + quantize" });
        i += 2;
        continue;
      }
    }
    if (o.code === ATTENTION && n1?.code === QUANTIZE) {
      // [q, k, v, out, positions, rows, heads, kvHeads, headDim, window, cells, ring, scale, scratch,
      //  scratchFloats, split, arrived]; quantize: [x, rows, cols, mode, q, d]
      const A = o.args, [qx, qr, qc, mode, q, d] = num(n1);
      if (qx === A[3] && qr === A[5] && qc === (A[6] as number) * (A[8] as number)) {
        out.push({ code: -1, fn: L.infer_cuda_attention_quant, args: [...A, mode, q, d], what: "attention + quantize" });
        i += 1;
        continue;
      }
    }
    if (o.code === RMS_NORM && n1?.code === QUANTIZE) {
      const [x, w, rows, cols, eps, normed] = num(o), [qx, qr, qc, mode, q, d] = num(n1);
      if (qx === normed && qr === rows && qc === cols && cols <= FUSED_COLS_MAX) {
        out.push({ code: -1, fn: L.infer_cuda_rms_norm_quant, args: [x, w, rows, cols, eps, normed, mode, q, d],
          what: "rms_norm + quantize" });
        i += 1;
        continue;
      }
    }
    if (o.code === RMS_NORM && n1?.code === RMS_NORM) {
      // Two in-place norms of the same width (the query and key head norms).
      const [xa, wa, ra, ca, ea, oa] = num(o), [xb, wb, rb, cb, eb, ob] = num(n1);
      if (xa === oa && xb === ob && ca === cb && ea === eb && xa !== xb) {
        out.push({ code: -1, fn: L.infer_cuda_rms_norm2, args: [xa, wa, ra, xb, wb, rb, ca, ea], what: "rms_norm (q and k heads)" });
        i += 1;
        continue;
      }
    }
    if ((o.code === GELU || o.code === SILU) && n1?.code === QUANTIZE) {
      const [g, u, n, y] = num(o), [qx, qr, qc, mode, q, d] = num(n1);
      if (qx === y && qr * qc === n) {
        out.push({ code: -1, fn: L.infer_cuda_act_mul_quant, args: [o.code === SILU ? 1 : 0, g, u, qr, qc, y, mode, q, d],
          what: "gated activation + quantize" });
        i += 1;
        continue;
      }
    }
    if (o.code === MATMUL && n1?.code === MATMUL) {
      // [w, type, n_out, n_in, x, xq, xd, rows, out]
      const first = num(o), group = [first];
      const quantized = first[4] === 0 && first[5] !== 0 && first[7] === 1;
      for (let j = i + 1; quantized && j < ops.length && group.length < 3 && ops[j].code === MATMUL; j++) {
        const m = num(ops[j]);
        if (m[1] !== first[1] || m[3] !== first[3] || m[4] !== 0 || m[5] !== first[5] || m[6] !== first[6] || m[7] !== 1) break;
        group.push(m);
      }
      if (group.length >= 2) {
        const [a, b, c] = [group[0], group[1], group[2] ?? [0, 0, 0, 0, 0, 0, 0, 0, 0]];
        out.push({ code: -1, fn: L.infer_cuda_matmul_multi, args: [first[1], first[3], first[5], first[6],
          a[0], a[2], a[8], b[0], b[2], b[8], c[0], c[2], c[8]], what: `${group.length} matmuls` });
        i += group.length - 1;
        continue;
      }
    }
    if (o.code === ROPE && n1?.code === ROPE) {
      // [x, rows, heads, headDim, rot, positions, base, scale, mode, factors]
      const A = num(o), B = num(n1);
      if ([1, 3, 4, 5, 6, 7, 8, 9].every((k) => A[k] === B[k])) {
        out.push({ code: -1, fn: L.infer_cuda_rope2, args: [A[0], A[2], B[0], B[2], A[1], A[3], A[4], A[5], A[6], A[7],
          A[8], A[9]], what: "rope (q and k)" });
        i += 1;
        continue;
      }
    }
    out.push(o);
  }
  return out;
}

/**
 * One token's [head norm of q, head norm of k,] RoPE of q, RoPE of k, KV store, as recorded by
 * selfAttention (ts/model/layers.ts), into one norm_rope_store launch; null when ops[i..] is not
 * that chain.
 */
function normRopeStore(L: Lib, ops: PendingOp[], i: number): { op: PendingOp; length: number } | null {
  const num = (j: number) => ops[j].args as number[];
  const norms = ops[i]?.code === RMS_NORM && ops[i + 1]?.code === RMS_NORM;
  const r = norms ? i + 2 : i;
  if (ops[r]?.code !== ROPE || ops[r + 1]?.code !== ROPE || ops[r + 2]?.code !== KV_STORE) return null;
  // rope: [x, rows, heads, headDim, rot, positions, base, scale, mode, factors]
  const A = num(r), B = num(r + 1);
  // kv_store: [k, v, kvDim, rows, kCache, vCache, positions, cells, ring]
  const S = ops[r + 2].args;
  const [rows, headDim] = [A[1], A[3]];
  if (rows !== 1 || ![1, 3, 4, 5, 6, 7, 8, 9].every((k) => A[k] === B[k]) || A[0] === B[0]) return null;
  if (S[0] !== B[0] || S[2] !== B[2] * headDim || S[3] !== 1 || S[6] !== A[5]) return null;
  let wq = 0, wk = 0, eps = 0;
  if (norms) {
    // rms_norm (heads, in place): [x, w, rows·heads, headDim, eps, out]
    const Q = num(i), K = num(i + 1);
    if (Q[0] !== A[0] || Q[5] !== A[0] || K[0] !== B[0] || K[5] !== B[0] || Q[2] !== A[2] || K[2] !== B[2] ||
      Q[3] !== headDim || K[3] !== headDim || Q[4] !== K[4] || Q[1] === 0 || K[1] === 0) return null;
    [wq, wk, eps] = [Q[1], K[1], Q[4]];
  }
  return {
    op: { code: -1, fn: L.infer_cuda_norm_rope_store, what: "head norms + rope + kv_store",
      args: [A[0], A[2], B[0], B[2], S[1], wq, wk, eps, headDim, A[4], A[5], A[6], A[7], A[8], A[9], S[4], S[5], S[7],
        S[8]] },
    length: (norms ? 2 : 0) + 3,
  };
}
