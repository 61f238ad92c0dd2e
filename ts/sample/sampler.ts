// Token sampling on logits, as llama.cpp's default chain orders it (common/sampling.cpp):
//   logit bias → penalties → grammar mask → top-k → typical-p → top-p → min-p → temperature
//   → draw.
// Temperature <= 0 is greedy: the first maximum of the (biased, penalised, masked) logits, as
// llama.cpp's greedy sampler picks. A seeded generator makes every draw reproducible.
//
// Buffers are sized on the first call (the vocabulary) and reused: sampling a token allocates
// nothing. Logits handed in are left as they were: a mask works on a copy, bias and penalties
// change their few logits in place and put them back before sample() returns.
// The scans over the whole vocabulary (argmax, top-k, softmax sums, the draw over every token,
// the tokens above a floor) are the library's, lib/cpu/select.zig: see bun bench/sampling.ts.
import { InferError } from "../errors.ts";
import { check, native } from "../native/lib.ts";

export interface SamplerOptions {
  /** 0 or less: greedy. */
  readonly temperature: number;
  /** Keep the K most likely tokens; 0 or less: all. */
  readonly topK: number;
  /** Nucleus: the smallest set whose probability reaches P; 1: off. */
  readonly topP: number;
  /** Drop tokens below P × the most likely token's probability; 0: off. */
  readonly minP: number;
  readonly seed: number;
  /** Locally typical sampling (Meister et al. 2022); 1: off. */
  readonly typicalP?: number;
  /** Divide positive logits (multiply negative ones) of tokens seen in the window; 1: off. */
  readonly repeatPenalty?: number;
  /** Subtract count × F from the logit of each token seen in the window; 0: off. */
  readonly frequencyPenalty?: number;
  /** Subtract P from the logit of each token seen at least once in the window; 0: off. */
  readonly presencePenalty?: number;
  /** Tokens the penalties look back over; 0: none, -1: the whole sequence. */
  readonly repeatLastN?: number;
  /** Added to a token's logit before anything else; -Infinity bans it. */
  readonly logitBias?: ReadonlyMap<number, number>;
}

/** llama.cpp's defaults (common/common.h, struct common_params_sampling). */
export const defaultSampling = {
  temperature: 0.8, topK: 40, topP: 0.95, minP: 0.05, seed: -1, typicalP: 1,
  repeatPenalty: 1, frequencyPenalty: 0, presencePenalty: 0, repeatLastN: 64,
} as const satisfies SamplerOptions;

/** Sets the logits of tokens that may not come next to -Infinity (a grammar, for one). */
export type LogitMask = (logits: Float32Array) => void;

/** Nothing is left to draw from: the bias, the penalties and the mask left no finite logit. */
export class NoTokenLeftError extends InferError {
  constructor() {
    super("bad_request", "every token is masked: the logit bias and the output grammar leave " +
      "no token to sample");
    this.name = "NoTokenLeftError";
  }
}

/** mulberry32: small, fast, and good enough to draw tokens; seeded for reproducibility. */
export function seededRandom(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const selected = new Uint32Array(1);
const sum = new Float64Array(1);
const F32_MAX = 3.4028234663852886e38;

/** Sum of exp((x - max) · scale) over the logits at or above floor (an f32), in the library. */
function expSum(x: Float32Array, max: number, scale: number, floor: number): number {
  check(native().infer_exp_sum(x, x.length, max, scale, floor, sum), "softmax");
  return sum[0];
}

const f32Bits = new Float32Array(1), u32Bits = new Uint32Array(f32Bits.buffer);

/** The least f32 at or above v: for an f32 logit l, l >= v exactly when l >= atLeastF32(v). */
function atLeastF32(v: number): number {
  f32Bits[0] = v;
  if (f32Bits[0] >= v) return f32Bits[0];
  if (f32Bits[0] > 0 || Object.is(f32Bits[0], 0)) u32Bits[0]++; // one step toward +Infinity
  else u32Bits[0]--;
  return f32Bits[0];
}

/** The first maximum; NaN never wins, and with nothing above -Infinity it is 0. */
export function argmax(logits: Float32Array): number {
  check(native().infer_argmax(logits, logits.length, selected), "argmax");
  return selected[0];
}

const nonFiniteAt = new BigUint64Array(1);

/**
 * The index of the first NaN or infinite logit, or logits.length where all are finite. One
 * pass in the library (a JavaScript loop took 0.3 ms for a 262k vocabulary, a few percent of a
 * decode step; this takes 12 µs).
 */
export function firstNonFinite(logits: Float32Array): number {
  check(native().infer_first_nonfinite(logits, logits.length, nonFiniteAt), "logits check");
  return Number(nonFiniteAt[0]);
}

/** A token's log-probability under the model, and the most likely tokens at its position. */
export interface Logprobs {
  readonly token: number;
  readonly logprob: number;
  /** Best first (ties: the lower id first). */
  readonly top: readonly { readonly token: number; readonly logprob: number }[];
}

/**
 * The model's log-probabilities at one position: the log-softmax of the raw logits (before bias,
 * penalties, a grammar or temperature, as llama.cpp's server reports them by default), of
 * `token` and of the `top` most likely tokens. Three passes over the row, in the library; only
 * for requests that ask (it is not part of sampling).
 */
export function logprobs(logits: Float32Array, token: number, top: number): Logprobs {
  const max = logits[argmax(logits)];
  const logZ = max + Math.log(expSum(logits, max, 1, -Infinity));
  const list: { token: number; logprob: number }[] = [];
  const k = Math.min(top, logits.length);
  if (k > 0) {
    const ids = new Int32Array(k), values = new Float32Array(k);
    check(native().infer_top_k(logits, logits.length, k, ids, values, selected), "top-k");
    for (let i = 0; i < selected[0]; i++) {
      list.push({ token: ids[i], logprob: logits[ids[i]] - logZ });
    }
  }
  return { token, logprob: logits[token] - logZ, top: list };
}

/** Candidate tokens and their probabilities (summing to 1). */
export interface TokenDistribution {
  readonly ids: Int32Array;
  readonly probs: Float64Array;
}

/** Top-k below this count is kept by insertion (in the library); at or above, sorted whole. */
const INSERTION_MAX = 256;

export class Sampler {
  readonly options: Required<Omit<SamplerOptions, "logitBias">> & Pick<SamplerOptions, "logitBias">;
  private readonly random: () => number;
  // The penalty window: the last repeatLastN accepted tokens and how often each occurs in it.
  private readonly window: number[] = [];
  private windowStart = 0;
  private counts = new Int32Array(0); // by token id, grown as ids arrive
  private stamps = new Int32Array(0); // by token id: the call that last penalised it
  private stamp = 0;
  private readonly biasIds: Int32Array;
  private readonly biasValues: Float32Array;
  private z = 0; // the softmax normaliser aboveFloor() leaves for topP()
  // Scratch, sized to the vocabulary on first use.
  private work: Float32Array = new Float32Array(0);
  // What edit() replaced, for undo().
  private editedIds = new Int32Array(0);
  private editedValues = new Float32Array(0);
  private edited = 0;
  private ids = new Int32Array(0);
  private probs = new Float64Array(0);
  private scores = new Float64Array(0);
  private byLogit: (a: number, b: number) => number = () => 0;
  private byScore: (a: number, b: number) => number = () => 0;
  private values: Float32Array = new Float32Array(0);
  private dense = new Float64Array(0); // speculate()'s q by token id, zero between calls
  private readonly kept = new Float32Array(INSERTION_MAX); // top-k's values, unread

  constructor(options: SamplerOptions) {
    this.options = { ...defaultSampling, ...options };
    const o = this.options;
    const seed = o.seed >= 0 ? o.seed : Math.floor(Math.random() * 2 ** 32);
    this.random = seededRandom(seed);
    const bias = [...(o.logitBias ?? [])];
    this.biasIds = Int32Array.from(bias, ([id]) => id);
    this.biasValues = Float32Array.from(bias, ([, v]) => v);
  }

  private get penalised(): boolean {
    const o = this.options;
    const any = o.repeatPenalty !== 1 || o.frequencyPenalty !== 0 || o.presencePenalty !== 0;
    return o.repeatLastN !== 0 && any;
  }

  /** Whether sample() is the first maximum of the logits as they are (no bias, penalty, draw). */
  get plainGreedy(): boolean {
    return this.options.temperature <= 0 && this.biasIds.length === 0 && !this.penalised;
  }

  /**
   * Whether sample() is the first maximum of the logits as they are whenever that maximum is a
   * token the bias does not lower: greedy, no penalty, no bias above 0 (a ban, as an OpenAI
   * client's -100, is the common one). The lowered tokens can only lose; any other keeps its
   * logit, so the first maximum of the raw row, if not lowered, is the biased row's first maximum.
   */
  get greedyUnderBans(): boolean {
    return this.options.temperature <= 0 && !this.penalised && this.biasValues.every((v) => v <= 0);
  }

  /** Whether the bias lowers `token`'s logit. */
  lowers(token: number): boolean {
    for (let i = 0; i < this.biasIds.length; i++) {
      if (this.biasIds[i] === token && this.biasValues[i] < 0) return true;
    }
    return false;
  }

  /** Records a token of the sequence (prompt or generated) for the penalty window. */
  accept(token: number): void {
    if (!this.penalised) return;
    const n = this.options.repeatLastN;
    if (token >= this.counts.length) { // grown by doubling: a handful of times per vocabulary
      const grown = new Int32Array(Math.max(2 * this.counts.length, token + 1, 1024));
      grown.set(this.counts);
      this.counts = grown;
      this.stamps = new Int32Array(grown.length);
    }
    this.window.push(token);
    this.counts[token]++;
    if (n > 0 && this.window.length - this.windowStart > n) {
      this.counts[this.window[this.windowStart++]]--;
      if (this.windowStart > 4 * n) { // compact now and then; amortised, never per token
        this.window.splice(0, this.windowStart);
        this.windowStart = 0;
      }
    }
  }

  /** Picks the next token from `logits` (not modified), after `mask` if one is given. */
  sample(logits: Float32Array, mask?: LogitMask): number {
    const changed = this.biasIds.length > 0 || this.penalised || mask !== undefined;
    if (!changed || mask !== undefined) return this.pick(changed ? this.prepare(logits, mask) : logits);
    // Bias and penalties change a few logits: in place (a copy of a 262,144-logit row cost more
    // than the pick), put back before returning.
    try {
      return this.pick(this.edit(logits));
    } finally {
      this.undo(logits);
    }
  }

  private pick(x: Float32Array): number {
    const o = this.options;
    if (o.temperature <= 0) {
      const best = argmax(x);
      if (x[best] === -Infinity) throw new NoTokenLeftError();
      return best;
    }
    if (this.uncut(x.length)) return this.drawAll(x, o.temperature);
    return this.draw(x, this.cut(x), o.temperature);
  }

  /** Whether no sampler of the chain cuts candidates: the draw is over every finite logit. */
  private uncut(vocab: number): boolean {
    const o = this.options;
    return (o.topK <= 0 || o.topK >= vocab) && !(o.typicalP > 0 && o.typicalP < 1) &&
      o.topP >= 1 && o.minP <= 0;
  }

  /** Temperature, softmax and one seeded draw over the whole row, in the library. */
  private drawAll(x: Float32Array, temperature: number): number {
    const max = this.max(x), scale = 1 / temperature;
    const target = this.random() * expSum(x, max, scale, -Infinity);
    check(native().infer_draw(x, x.length, max, scale, target, selected), "draw");
    return selected[0];
  }

  /** The largest logit; an error when none is above -Infinity. */
  private max(x: Float32Array): number {
    const max = x[argmax(x)];
    if (!(max > -Infinity)) throw new NoTokenLeftError();
    return max;
  }

  /**
   * A draw from the distribution the next draw would be made from (after bias, penalties, the
   * mask, truncation and temperature), with that distribution: a sampling drafter's token and its
   * q for speculate(). The same draw as sample()'s, over the candidates in another order.
   */
  sampleWithDistribution(logits: Float32Array, mask?: LogitMask): { token: number; q: TokenDistribution } {
    const q = this.candidates(logits, mask);
    let r = this.random();
    for (let i = 0; i < q.ids.length; i++) {
      r -= q.probs[i];
      if (r < 0) return { token: q.ids[i], q };
    }
    return { token: q.ids[q.ids.length - 1], q };
  }

  /**
   * The speculative-sampling rule (Leviathan et al. 2023; Chen et al. 2023) for a token
   * `drafted` that a drafter drew from `q`: with p the distribution sample() draws from here, it
   * is kept with probability min(1, p(drafted)/q(drafted)), and otherwise the token is drawn from
   * max(0, p − q), normalised. The token returned is distributed as p whatever q is (a drafter
   * that agrees with p more is kept more often); a deterministic drafter (q one-hot) makes it
   * "keep the drafted token with probability p(drafted), else draw from p without it". A
   * rejection never returns `drafted` (its residual is 0).
   */
  speculate(logits: Float32Array, mask: LogitMask | undefined, drafted: number,
    q: TokenDistribution): number {
    const p = this.candidates(logits, mask);
    if (this.dense.length < logits.length) this.dense = new Float64Array(logits.length);
    const dense = this.dense;
    for (let i = 0; i < q.ids.length; i++) dense[q.ids[i]] = q.probs[i];
    try {
      const qd = dense[drafted];
      let pd = 0;
      for (let i = 0; i < p.ids.length; i++) if (p.ids[i] === drafted) pd = p.probs[i];
      if (qd > 0 && this.random() * qd < pd) return drafted;
      let total = 0;
      for (let i = 0; i < p.ids.length; i++) total += Math.max(0, p.probs[i] - dense[p.ids[i]]);
      if (!(total > 0)) return this.drawFrom(p); // p ≤ q everywhere: only where p equals q, by rounding
      let r = this.random() * total;
      let last = -1;
      for (let i = 0; i < p.ids.length; i++) {
        const w = Math.max(0, p.probs[i] - dense[p.ids[i]]);
        if (w <= 0) continue;
        last = p.ids[i];
        r -= w;
        if (r < 0) return last;
      }
      return last;
    } finally {
      for (let i = 0; i < q.ids.length; i++) dense[q.ids[i]] = 0;
    }
  }

  private drawFrom(d: TokenDistribution): number {
    let r = this.random();
    for (let i = 0; i < d.ids.length; i++) {
      r -= d.probs[i];
      if (r < 0) return d.ids[i];
    }
    return d.ids[d.ids.length - 1];
  }

  /**
   * Empties the penalty window and fills it with `tokens` (a drafter's sampler following the
   * sequence it drafts for: the penalties see what the target's see).
   */
  resetWindow(tokens: ArrayLike<number>): void {
    if (!this.penalised) return;
    for (let i = this.windowStart; i < this.window.length; i++) this.counts[this.window[i]]--;
    this.window.length = 0;
    this.windowStart = 0;
    const n = this.options.repeatLastN;
    for (let i = n > 0 ? Math.max(0, tokens.length - n) : 0; i < tokens.length; i++) this.accept(tokens[i]);
  }

  /** The candidates after every transform and their probabilities, in no particular order. */
  private candidates(logits: Float32Array, mask?: LogitMask): TokenDistribution {
    const o = this.options;
    const x = this.prepare(logits, mask);
    if (o.temperature <= 0) {
      const best = argmax(x);
      if (x[best] === -Infinity) throw new NoTokenLeftError();
      return { ids: Int32Array.of(best), probs: Float64Array.of(1) };
    }
    const n = this.cut(x);
    const ids = this.ids.slice(0, n), probs = new Float64Array(n);
    let max = -Infinity, total = 0;
    for (let i = 0; i < n; i++) if (x[ids[i]] > max) max = x[ids[i]];
    for (let i = 0; i < n; i++) total += (probs[i] = Math.exp((x[ids[i]] - max) / o.temperature));
    for (let i = 0; i < n; i++) probs[i] /= total;
    return { ids, probs };
  }

  /**
   * The distribution the next draw would be made from: candidate ids, best first, and their
   * probabilities after temperature. For tests and diagnostics (it allocates).
   */
  distribution(logits: Float32Array, mask?: LogitMask): { ids: number[]; probs: number[] } {
    const o = this.options;
    const x = this.prepare(logits, mask);
    if (o.temperature <= 0) return { ids: [argmax(x)], probs: [1] };
    const n = this.cut(x);
    const ids = Array.from(this.ids.subarray(0, n)).sort((a, b) => x[b] - x[a] || a - b);
    const weights = ids.map((id) => Math.exp((x[id] - x[ids[0]]) / o.temperature));
    const total = weights.reduce((a, b) => a + b, 0);
    return { ids, probs: weights.map((w) => w / total) };
  }

  /** Runs the truncation samplers; leaves the survivors in ids[0..n), best first. */
  private cut(x: Float32Array): number {
    const o = this.options;
    this.grow(x.length);
    const all = o.topK <= 0 || o.topK >= x.length;
    const typical = o.typicalP > 0 && o.typicalP < 1;
    let n: number;
    this.z = 0;
    if (all && !typical && o.topP >= 1 && o.minP <= 0) {
      // Nothing is cut: draw from every finite logit, unsorted.
      let count = 0;
      for (let i = 0; i < x.length; i++) if (x[i] > -Infinity) this.ids[count++] = i;
      if (count === 0) throw new NoTokenLeftError();
      return count;
    }
    if (all && !typical && o.minP > 0) {
      // Top-p then min-p keep two best-first prefixes: cut by min-p first, so only the few
      // tokens near the top are sorted, and let top-p normalise over everything.
      n = this.aboveFloor(x, o.minP);
    } else if (all && !typical && o.topP < 1) {
      n = this.nucleus(x, o.topP);
    } else {
      n = this.topK(x, o.topK > 0 ? o.topK : x.length);
      if (n === 0) throw new NoTokenLeftError();
      if (typical) n = this.typical(x, n, o.typicalP);
    }
    if (o.topP < 1) n = this.topP(x, n, o.topP, this.z);
    if (o.minP > 0) n = this.minP(x, n, o.minP);
    return n;
  }

  /** Copy of the logits with the bias, the penalties and the mask applied. */
  private prepare(logits: Float32Array, mask?: LogitMask): Float32Array {
    if (this.work.length !== logits.length) this.work = new Float32Array(logits.length);
    const x = this.work;
    x.set(logits);
    this.edit(x);
    this.edited = 0; // the copy is not put back
    mask?.(x);
    return x;
  }

  /** Applies the bias and the penalties to x in place, remembering each value it replaces. */
  private edit(x: Float32Array): Float32Array {
    const o = this.options;
    const most = this.biasIds.length + this.window.length - this.windowStart;
    if (this.editedIds.length < most) {
      this.editedIds = new Int32Array(Math.max(most, 2 * this.editedIds.length));
      this.editedValues = new Float32Array(this.editedIds.length);
    }
    for (let i = 0; i < this.biasIds.length; i++) {
      const id = this.biasIds[i];
      if (id >= 0 && id < x.length) this.replace(x, id, x[id] + this.biasValues[i]);
    }
    // llama_sampler_penalties_apply: the repeat penalty scales away from zero, then the
    // frequency and presence penalties subtract; each token of the window once.
    const stamp = ++this.stamp;
    for (let i = this.windowStart; i < this.window.length; i++) {
      const id = this.window[i];
      if (id < 0 || id >= x.length || this.stamps[id] === stamp) continue;
      this.stamps[id] = stamp;
      const count = this.counts[id];
      const v = x[id];
      this.replace(x, id, (v <= 0 ? v * o.repeatPenalty : v / o.repeatPenalty)
        - count * o.frequencyPenalty - o.presencePenalty);
    }
    return x;
  }

  private replace(x: Float32Array, id: number, v: number): void {
    this.editedIds[this.edited] = id;
    this.editedValues[this.edited++] = x[id];
    x[id] = v;
  }

  /** Puts back what edit() replaced, last first (a token both biased and penalised). */
  private undo(x: Float32Array): void {
    while (this.edited > 0) {
      this.edited--;
      x[this.editedIds[this.edited]] = this.editedValues[this.edited];
    }
  }

  private grow(vocab: number): void {
    if (this.ids.length >= vocab) return;
    this.ids = new Int32Array(vocab);
    this.probs = new Float64Array(vocab);
    this.scores = new Float64Array(vocab);
    // Comparators read the current logits / scores through these fields, set once here.
    this.byLogit = (a, b) => this.values[b] - this.values[a] || a - b;
    this.byScore = (a, b) => this.scores[a] - this.scores[b] || a - b;
  }

  /**
   * ids[0..n) := the k largest finite logits, best first (ties: lower id first, so top-k = 1
   * is the greedy choice); returns n.
   */
  private topK(x: Float32Array, k: number): number {
    const ids = this.ids;
    if (k >= INSERTION_MAX) {
      let n = 0;
      for (let i = 0; i < x.length; i++) if (x[i] > -Infinity) ids[n++] = i;
      this.values = x;
      ids.subarray(0, n).sort(this.byLogit);
      return Math.min(n, k);
    }
    check(native().infer_top_k(x, x.length, Math.min(k, x.length), ids, this.kept, selected),
      "top-k");
    return selected[0];
  }

  /**
   * ids[0..n) := the tokens with logit >= max + ln(p), best first; returns n and leaves in z
   * the softmax normaliser (sum of exp(logit - max)) over every finite logit.
   */
  private aboveFloor(x: Float32Array, p: number): number {
    const max = this.max(x);
    this.z = expSum(x, max, 1, -Infinity);
    return this.sortedAbove(x, atLeastF32(max + Math.log(p)));
  }

  /**
   * Top-p with nothing cut before it: the tokens at or above a floor stepped down from the
   * largest logit until they hold p of the mass, best first (top-p then takes its prefix of
   * them, which a sort of the whole row would give too); leaves the normaliser in z.
   */
  private nucleus(x: Float32Array, p: number): number {
    const max = this.max(x);
    const z = this.z = expSum(x, max, 1, -Infinity);
    let floor = max;
    for (let step = 1; expSum(x, max, 1, floor) < p * z; step *= 2) {
      // exp(-128) is 4e-56 of the largest weight: past that, the floor takes every finite logit.
      if (step > 128) {
        floor = -F32_MAX;
        break;
      }
      floor = max - step;
    }
    return this.sortedAbove(x, floor);
  }

  /** ids[0..n) := the tokens with logit >= floor (an f32), best first; returns n. */
  private sortedAbove(x: Float32Array, floor: number): number {
    check(native().infer_above(x, x.length, floor, this.ids, selected), "above");
    const n = selected[0];
    this.values = x;
    this.ids.subarray(0, n).sort(this.byLogit);
    return n;
  }

  /**
   * llama_sampler_typical: keep the tokens whose surprisal is closest to the distribution's
   * entropy until their probability passes p; the survivors go back to logit order.
   */
  private typical(x: Float32Array, n: number, p: number): number {
    const ids = this.ids, max = x[ids[0]];
    let z = 0, entropy = 0;
    for (let i = 0; i < n; i++) z += Math.exp(x[ids[i]] - max);
    for (let i = 0; i < n; i++) {
      const q = Math.exp(x[ids[i]] - max) / z;
      if (q > 0) entropy -= q * Math.log(q);
    }
    for (let i = 0; i < n; i++) {
      this.scores[ids[i]] = Math.abs(-Math.log(Math.exp(x[ids[i]] - max) / z) - entropy);
    }
    ids.subarray(0, n).sort(this.byScore);
    let keep = n, cumulative = 0;
    for (let i = 0; i < n; i++) {
      cumulative += Math.exp(x[ids[i]] - max) / z;
      if (cumulative > p) { keep = i + 1; break; }
    }
    this.values = x;
    ids.subarray(0, keep).sort(this.byLogit);
    return keep;
  }

  /**
   * llama_sampler_top_p: the smallest best-first prefix whose probability reaches p; `z` is
   * the softmax normaliser when the candidates were already cut (0: they are all there is).
   */
  private topP(x: Float32Array, n: number, p: number, z: number): number {
    const ids = this.ids, max = x[ids[0]];
    if (z === 0) for (let i = 0; i < n; i++) z += Math.exp(x[ids[i]] - max);
    let cumulative = 0;
    for (let i = 0; i < n; i++) {
      cumulative += Math.exp(x[ids[i]] - max) / z;
      if (cumulative >= p) return i + 1;
    }
    return n;
  }

  /** llama_sampler_min_p: keep logits >= max + ln(p), i.e. probability >= p × the best's. */
  private minP(x: Float32Array, n: number, p: number): number {
    const floor = x[this.ids[0]] + Math.log(p);
    let keep = 1;
    while (keep < n && x[this.ids[keep]] >= floor) keep++;
    return keep;
  }

  /** Temperature, softmax and one seeded draw among ids[0..n). */
  private draw(x: Float32Array, n: number, temperature: number): number {
    const ids = this.ids;
    let max = -Infinity;
    for (let i = 0; i < n; i++) if (x[ids[i]] > max) max = x[ids[i]];
    let total = 0;
    for (let i = 0; i < n; i++) {
      total += (this.probs[i] = Math.exp((x[ids[i]] - max) / temperature));
    }
    let r = this.random() * total;
    for (let i = 0; i < n; i++) {
      r -= this.probs[i];
      if (r <= 0) return ids[i];
    }
    return ids[n - 1];
  }
}
