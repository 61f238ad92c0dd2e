// Speculative decoding: a sequence's step evaluates the token it sampled last plus up to K
// drafted tokens in one forward pass, and keeps the drafted tokens the sampler would have chosen
// itself. The scheduler samples the K+1 rows' logits one after another through the sequence's
// own Generation (sampler chain, penalties, grammar mask, stop strings): row i's logits are
// those decoding token by token gives (every row is computed with the single-token arithmetic),
// and drafted token i is accepted when the token sampled from row i equals it. The first token
// that differs is the sequence's next token; the cache drops back past it.
//
// With a deterministic drafter (prompt lookup: q is one-hot) this is the speculative-sampling
// rule itself: drafted token d is accepted with probability p(d) = min(1, p(d)/q(d)), and a
// rejection leaves the draw from p restricted to the other tokens, renormalised, which is the
// residual max(0, p − q) normalised. Because each row takes exactly one draw from the sampler's
// generator, a seeded sampled generation gives the same tokens with speculation as without.
// A draft model drafting for a sampled sequence draws its tokens instead, and those rows are
// judged by the general rule (Sampler.speculate, with the distribution each draft was drawn from).
//
// How many tokens to draft is chosen each step from two estimates: the sequence's acceptance
// rate α (per drafted token, decayed), and what a pass of n rows costs relative to plain
// decoding's one token a step (timed by the scheduler, PassCost). Drafting K tokens yields (1 − α^(K+1)) / (1 − α) tokens a
// pass on average; K is the one that makes the most tokens per unit of time, and 0 (no
// draft) when none beats plain decoding, so speculation switches itself off where it would be
// slower. A sequence that stopped drafting tries a short draft again after a growing pause.
import { InferError } from "../errors.ts";

export type SpeculationMode = "ngram" | "draft" | "off";
export const speculationModes: readonly SpeculationMode[] = ["ngram", "draft", "off"];

export interface SpeculationOptions {
  /**
   * ngram: prompt lookup (drafts what followed the last tokens earlier in the text); draft: a
   * draft model's greedy tokens (draft-model.ts; the engine must have one); off.
   */
  readonly mode: SpeculationMode;
  /** Drafted tokens a step at most (default 16). */
  readonly draftMax?: number;
}

export const defaultDraftMax = 16;

/** The draft model (--draft-model, --spec self) that is the model's own Q4_0 copy (self-draft.ts). */
export const SELF_DRAFT = "self";

/**
 * Speculation when a request names none: prompt lookup on the CPU, where it was measured never
 * to cost more than the timing noise (bench/results/speculative.md); off on the GPU backends
 * until it is measured there to hold the same (a lone greedy sequence decodes a step ahead on
 * the device, which a verification pass, waiting for its ids, cannot).
 */
export function defaultSpeculation(backend: string): SpeculationOptions {
  return { mode: backend === "cpu" ? "ngram" : "off" };
}

/** Counts of one generation's speculation. */
export interface SpeculationStats {
  /** Forward passes that carried a draft. */
  readonly passes: number;
  readonly drafted: number;
  readonly accepted: number;
}

export function checkSpeculation(o: SpeculationOptions): void {
  if (!speculationModes.includes(o.mode)) {
    throw new InferError("invalid_argument",
      `speculation: expected one of ${speculationModes.join(", ")}, got ${String(o.mode)}`);
  }
  const k = o.draftMax;
  if (k !== undefined && !(Number.isInteger(k) && k >= 1 && k <= 64)) {
    throw new InferError("invalid_argument",
      `draft-max: expected an integer in [1, 64], got ${String(k)}`);
  }
}

/**
 * Prompt lookup: the longest of the text's last `maxN`..`minN` tokens that occurred before,
 * at its latest occurrence, and up to `max` tokens that followed it there. A continuation that
 * reaches the end of the text goes on with itself: a match p tokens back drafts the last p
 * tokens over and over (text in a loop goes on looping), so a short loop still drafts `max`
 * tokens, where stopping at the text's end would draft p a pass, as few as one.
 */
export function lookupDraft(text: ArrayLike<number>, length: number, max: number,
  maxN = 4, minN = 2): number[] {
  if (max <= 0) return [];
  for (let n = Math.min(maxN, length - 1); n >= minN; n--) {
    const tail = length - n;
    // Latest start j < tail of the n-gram text[tail..length), with at least one token after it.
    for (let j = tail - 1; j >= 0; j--) {
      let k = 0;
      while (k < n && text[j + k] === text[tail + k]) k++;
      if (k < n) continue;
      const from = j + n, period = length - from;
      const out: number[] = [];
      for (let i = 0; i < max; i++) out.push(i < period ? text[from + i] : out[i - period]);
      return out;
    }
  }
  return [];
}

/** A row's share of a one-row pass before any timing says otherwise. */
const PRIOR_ROW_SHARE = 0.15;

/**
 * What a forward pass of n rows costs, relative to one row, from the times of decode passes
 * (no prompt rows): an average per row count, and a straight line through them where a count
 * was not timed yet. A pass is timed from its start to its tokens on the host, but the one-row
 * time is plain decoding's time per token as the scheduler runs it: on a backend that decodes a
 * step ahead on the device (CUDA), the time between those steps, in which the host's work hides
 * behind the GPU's, which a verification pass (its ids awaited) cannot do.
 */
export class PassCost {
  private readonly ms: Float64Array;
  private readonly seen: Float64Array;

  /** fixed: a cost function to use instead of timing (tests). */
  constructor(private readonly maxRows: number,
    private readonly fixed: ((rows: number) => number) | null = null) {
    this.ms = new Float64Array(maxRows + 1);
    this.seen = new Float64Array(maxRows + 1);
  }

  record(rows: number, ms: number): void {
    if (this.fixed || rows < 1 || rows > this.maxRows || !(ms > 0)) return;
    const w = Math.min(this.seen[rows] + 1, 16); // a running average over the last ~16
    this.ms[rows] += (ms - this.ms[rows]) / w;
    this.seen[rows] = w;
  }

  /** Milliseconds of a one-row pass (0 before one was timed). */
  get oneRowMs(): number {
    return this.seen[1] > 0 ? this.ms[1] : 0;
  }

  /** The time of an n-row pass over a one-row pass's (≥ 1). */
  relative(rows: number): number {
    if (this.fixed) return this.fixed(rows);
    if (rows <= 1) return 1;
    const { a, b, timed } = this.line();
    // Without a one-row time, a time of n rows alone says nothing of the ratio: the prior line.
    if (!timed) return 1 + PRIOR_ROW_SHARE * (rows - 1);
    const one = this.seen[1] > 0 ? this.ms[1] : a + b;
    if (this.seen[rows] >= 2) return Math.max(1, this.ms[rows] / one);
    return Math.max(1, (a + b * rows) / one);
  }

  /** The timed pass times, rows → milliseconds (bench/speculative.ts prints them). */
  timings(): { rows: number; ms: number }[] {
    const out: { rows: number; ms: number }[] = [];
    for (let n = 1; n <= this.maxRows; n++) if (this.seen[n] > 0) out.push({ rows: n, ms: this.ms[n] });
    return out;
  }

  /**
   * Least squares over the timed row counts; a prior slope until two counts were timed (timed:
   * whether the line is in milliseconds, from a one-row time or two counts).
   */
  private line(): { a: number; b: number; timed: boolean } {
    let sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0, counts = 0;
    for (let n = 1; n <= this.maxRows; n++) {
      const w = this.seen[n];
      if (w === 0) continue;
      counts++;
      sw += w; sx += w * n; sy += w * this.ms[n]; sxx += w * n * n; sxy += w * n * this.ms[n];
    }
    if (counts < 2) {
      const t1 = this.seen[1] > 0 ? this.ms[1] : 1;
      return { a: t1 * (1 - PRIOR_ROW_SHARE), b: t1 * PRIOR_ROW_SHARE, timed: this.seen[1] > 0 };
    }
    const b = Math.max(0, (sw * sxy - sx * sy) / (sw * sxx - sx * sx));
    const a = Math.max(1e-6, (sy - b * sx) / sw);
    return { a, b, timed: true };
  }
}

/** One sequence's speculation: its drafter's state, acceptance estimate and counts. */
export class SequenceSpeculation {
  readonly draftMax: number;
  readonly mode: SpeculationMode;
  /** Decayed counts of drafted tokens accepted, and of those judged (accepted or the first rejected). */
  private hits = 1.5;
  private trials = 2;
  /** Generated tokens before which no draft is tried again, and how long the next pause is. */
  private pausedUntil = 0;
  private nextPause = 8;
  /** The pause just ended: the next draft is a probe, whatever the estimates say. */
  private probing = false;
  passes = 0;
  drafted = 0;
  accepted = 0;

  constructor(o: SpeculationOptions) {
    this.draftMax = o.draftMax ?? defaultDraftMax;
    this.mode = o.mode;
  }

  /** The acceptance rate per drafted token. */
  get alpha(): number {
    return this.hits / this.trials;
  }

  /** Whether drafts are tried at this count of generated tokens (not paused). */
  active(generated: number): boolean {
    return generated >= this.pausedUntil;
  }

  /**
   * Up to how many tokens to draft this step (0: decode plainly), at most `room`, with
   * `generated` tokens so far: the K that gives the most tokens per unit of time under `cost`,
   * drafting a token costing `perDraft` one-row passes of the target (a draft model's).
   */
  plan(room: number, generated: number, cost: PassCost, perDraft = 0): number {
    const limit = Math.min(this.draftMax, room);
    if (limit <= 0 || !this.active(generated)) return 0;
    if (this.probing) {
      // Without drafts neither estimate would ever change (timings of a busy moment would
      // keep speculation off for good): a short draft measures both again.
      this.probing = false;
      return Math.min(limit, 4);
    }
    const alpha = Math.min(this.alpha, 0.999);
    let best = 0, bestRate = 1; // plain decoding: one token per one-row pass
    let expected = 1, power = 1;
    for (let k = 1; k <= limit; k++) {
      power *= alpha;
      expected += power;
      const rate = expected / (cost.relative(k + 1) + k * perDraft);
      if (rate > bestRate * 1.02) { // a margin: timings are noisy, and a loss is worse than no gain
        best = k;
        bestRate = rate;
      }
    }
    if (best > 0) return best;
    // Not worth it at the current estimate: pause, then probe with a short draft.
    this.pausedUntil = generated + this.nextPause;
    this.probing = true;
    this.nextPause = Math.min(this.nextPause * 2, 256);
    this.hits = this.trials * 0.6; // the probe starts from a middling estimate
    return 0;
  }

  /** A verified draft of `drafted` tokens of which the first `accepted` were kept. */
  verified(drafted: number, accepted: number): void {
    if (drafted <= 0) return;
    this.passes++;
    this.drafted += drafted;
    this.accepted += accepted;
    const judged = accepted + (accepted < drafted ? 1 : 0);
    const decay = Math.pow(0.97, judged);
    this.hits = this.hits * decay + accepted;
    this.trials = this.trials * decay + judged;
    if (accepted === drafted) this.nextPause = 8;
  }

  /**
   * A prediction of one token made without a pass (prompt lookup guessing the token a device step
   * was computing) turned out right or wrong: it counts toward the acceptance rate as a drafted
   * token would, but not in the stats, since nothing was evaluated for it.
   */
  guessed(right: boolean): void {
    this.hits = this.hits * 0.97 + (right ? 1 : 0);
    this.trials = this.trials * 0.97 + 1;
  }

  stats(): SpeculationStats {
    return { passes: this.passes, drafted: this.drafted, accepted: this.accepted };
  }
}
