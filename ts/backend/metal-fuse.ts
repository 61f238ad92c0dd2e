// The fusion of one step's attention inputs on Metal, as the CUDA backend fuses them
// (cuda-fuse.ts normRopeStore): selfAttention (ts/model/layers.ts) asks for
//   [rmsNormHeads(q), rmsNormHeads(k),] rope(q), rope(k), [scale(q),] storeKv(k, v)
// and the Metal backend holds those head ops back (HeldHeadOp) instead of encoding them. At the
// KV store, a held list that is exactly that chain becomes one norm_rope_store dispatch; any
// other op, a read, or a chain that does not match encodes the held ops first, unfused and in
// order, so holding them changes when they are encoded, never what runs.
import type { Activation, RopeOptions, Weight } from "./backend.ts";

export type HeldHeadOp =
  | { readonly kind: "norm"; readonly x: Activation; readonly weight: Weight; readonly rows: number;
    readonly heads: number; readonly eps: number }
  | { readonly kind: "rope"; readonly x: Activation; readonly positions: Activation; readonly rows: number;
    readonly rope: RopeOptions }
  | { readonly kind: "scale"; readonly x: Activation; readonly rows: number; readonly factor: number };

/** The most ops a chain holds: two norms, two RoPEs, one scale. */
export const HELD_HEAD_OPS_MAX = 5;

/** A matched chain: what norm_rope_store needs beside the KV layer. */
export interface HeadChain {
  readonly q: Activation;
  readonly k: Activation;
  readonly rows: number;
  readonly positions: Activation;
  readonly rope: RopeOptions;
  readonly headsQ: number;
  readonly headsK: number;
  readonly norms: { readonly q: Weight; readonly k: Weight; readonly eps: number } | null;
  readonly qScale: number;
}

function sameRope(a: RopeOptions, b: RopeOptions): boolean {
  return a.headDim === b.headDim && a.rotaryDims === b.rotaryDims && a.base === b.base && a.scale === b.scale &&
    a.neox === b.neox && (a.freqFactors ?? null) === (b.freqFactors ?? null) && (a.attnFactor ?? 1) === 1 &&
    (b.attnFactor ?? 1) === 1 && !a.yarn && !b.yarn;
}

/**
 * The chain `held` forms with a KV store of `rows` rows of keys `k` (from row 0) into a layer of
 * `kvDim` values a row, or null where it is not exactly that chain.
 */
export function matchHeadChain(held: readonly HeldHeadOp[], k: Activation, rows: number, kvDim: number): HeadChain | null {
  let i = 0;
  const n0 = held[i], n1 = held[i + 1];
  const norms = n0?.kind === "norm" && n1?.kind === "norm" ? [n0, n1] as const : null;
  if (norms) i += 2;
  const rq = held[i], rk = held[i + 1];
  if (rq?.kind !== "rope" || rk?.kind !== "rope") return null;
  i += 2;
  const sq = held[i];
  const scale = sq?.kind === "scale" ? sq : null;
  if (scale) i += 1;
  if (i !== held.length) return null;
  const headDim = rq.rope.headDim;
  if (rk.x !== k || rq.x === k || rq.rows !== rows || rk.rows !== rows || rq.positions !== rk.positions ||
    !sameRope(rq.rope, rk.rope)) return null;
  if (rq.x.cols !== rq.rope.heads * headDim || k.cols !== rk.rope.heads * headDim || kvDim !== k.cols) return null;
  if (norms) {
    const [nq, nk] = norms;
    if (nq.x !== rq.x || nk.x !== k || nq.rows !== rows || nk.rows !== rows || nq.heads !== rq.rope.heads ||
      nk.heads !== rk.rope.heads || nq.eps !== nk.eps) return null;
  }
  if (scale && (scale.x !== rq.x || scale.rows !== rows)) return null;
  return {
    q: rq.x, k, rows, positions: rq.positions, rope: rq.rope, headsQ: rq.rope.heads, headsK: rk.rope.heads,
    norms: norms ? { q: norms[0].weight, k: norms[1].weight, eps: norms[0].eps } : null,
    qScale: scale ? scale.factor : 1,
  };
}
