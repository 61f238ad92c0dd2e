// One generation's sampling side, apart from the model: from the logits after each evaluated
// token it samples the next one through the sampler chain (and a grammar mask), detokenizes,
// holds back text that could begin a stop string, and decides when to end. The caller evaluates
// the tokens it returns: the engine one sequence at a time, the batch scheduler many at once.
import { InferError } from "../errors.ts";
import {
  firstNonFinite, logprobs, NoTokenLeftError, Sampler, type Logprobs, type SamplerOptions,
  type TokenDistribution,
} from "../sample/sampler.ts";
import type { TokenConstraint } from "../sample/constraint.ts";
import { StopMatcher } from "../sample/stop.ts";
import type { SpeculationOptions, SpeculationStats } from "./speculation.ts";
import type { ShiftPolicy } from "./kv-cache.ts";

export type { TokenConstraint };
import type { StreamDecoder, Tokenizer } from "../tokenizer/index.ts";

export interface GenerateOptions {
  /** Tokens to generate at most; a negative number: until the context is full. */
  readonly maxTokens: number;
  readonly sampling: SamplerOptions;
  readonly ignoreEos?: boolean;
  /** Generation ends before any of these strings; none of it is ever emitted. */
  readonly stop?: readonly string[];
  /** Tokens that end generation as end-of-generation does (a chat template's turn markers). */
  readonly stopTokens?: readonly number[];
  /**
   * Control tokens whose text is emitted (others have none), as llama.cpp's preserved tokens:
   * Llama 3.1's <|python_tag|>, which opens a tool call.
   */
  readonly shownTokens?: readonly number[];
  readonly constraint?: TokenConstraint;
  /**
   * When the context is full, drop the older half of it past the first `contextKeep` positions
   * and go on (kv-cache.ts shiftSlot) instead of ending with "context" (where the backend can).
   */
  readonly contextShift?: boolean;
  /**
   * Which positions past the first `contextKeep` the shift keeps: "streaming" (default) the most
   * recent, "h2o" half of them the heavy hitters by accumulated attention (kv-cache.ts
   * shiftSlotHeavy; CPU backend, elsewhere "streaming").
   */
  readonly contextShiftPolicy?: ShiftPolicy;
  /** Positions the context shift keeps at the start (default SHIFT_KEEP, 4). */
  readonly contextKeep?: number;
  /** Reuse the cached prefix this prompt shares with the last sequence (default true). */
  readonly reuseCache?: boolean;
  /** Polled between tokens; true ends generation ("interrupted"). */
  readonly shouldStop?: () => boolean;
  /**
   * Report each generated token's log-probability and this many most likely alternatives (0:
   * the token's alone); computed only when set.
   */
  readonly logprobs?: number;
  /**
   * Called with each piece of text as soon as it is complete UTF-8 and past any stop string;
   * with `logprobs`, also with the tokens whose text the piece completes (a token cut short by
   * a stop string comes last, with an empty piece).
   */
  readonly onText?: (text: string, logprobs?: readonly TokenLogprob[]) => void;
  /** Speculative decoding (the same tokens, fewer forward passes where drafts hold); default off. */
  readonly speculation?: SpeculationOptions;
}

/** A token a sampling drafter drew, and the distribution it drew it from. */
export interface SampledDraft {
  readonly token: number;
  readonly q: TokenDistribution;
}

/** A generated token's log-probabilities, and where its text begins in the generated text. */
export interface TokenLogprob extends Logprobs {
  /** In UTF-16 code units of GenerateResult.text. */
  readonly offset: number;
}

export type StopReason = "eos" | "length" | "context" | "stop" | "complete" | "interrupted";

export interface GenerateResult {
  readonly promptTokens: number[];
  /** Prompt tokens evaluated now; the rest came from the cache. */
  readonly prefilled: number;
  readonly tokens: number[];
  readonly text: string;
  readonly stopReason: StopReason;
  /** With GenerateOptions.logprobs: the tokens whose text was generated, in order. */
  readonly logprobs?: readonly TokenLogprob[];
  readonly promptMs: number;
  readonly generateMs: number;
  /** With GenerateOptions.speculation: how many drafted tokens were kept, in how many passes. */
  readonly speculation?: SpeculationStats;
}

/** One generation: next() turns the logits after each evaluated token into the next token. */
export class Generation {
  private readonly sampler: Sampler;
  private readonly decoder: StreamDecoder;
  private readonly stops: StopMatcher;
  private readonly stopTokens: ReadonlySet<number>;
  private readonly tokens: number[] = [];
  private readonly t0 = performance.now();
  private t1 = this.t0;
  private prefilled = 0;
  private text = "";
  private stopReason: StopReason = "length";
  private finished = false;
  /** Text decoded so far, emitted or held back (UTF-16 code units). */
  private decoded = 0;
  /** Log-probabilities of tokens whose text is not all emitted yet (end: where it ends). */
  private readonly pending: { entry: TokenLogprob; end: number }[] = [];
  private readonly reported: TokenLogprob[] = [];

  constructor(private readonly tokenizer: Tokenizer, readonly promptTokens: readonly number[],
    private readonly contextLength: number, private readonly o: GenerateOptions) {
    this.sampler = new Sampler(o.sampling);
    for (const t of promptTokens) this.sampler.accept(t);
    this.decoder = tokenizer.decoder();
    this.stops = new StopMatcher(o.stop ?? []);
    this.stopTokens = new Set(o.stopTokens ?? []);
    if (o.maxTokens === 0) this.finished = true;
  }

  /** The prompt is in the cache; `evaluated` of its tokens were evaluated now (the rest reused). */
  promptDone(evaluated: number): void {
    this.prefilled = evaluated;
    this.t1 = performance.now();
  }

  private get maxTokens(): number {
    return this.o.maxTokens < 0 ? Infinity : this.o.maxTokens;
  }

  /** Tokens generated so far. */
  get count(): number {
    return this.tokens.length;
  }

  /** Tokens it may still generate (Infinity: until the context is full). */
  get tokensLeft(): number {
    return this.maxTokens - this.tokens.length;
  }

  /** The caller asked to stop (shouldStop); ends the generation as "interrupted" if it did. */
  interrupted(): boolean {
    if (this.finished || !this.o.shouldStop?.()) return false;
    this.end("interrupted");
    return true;
  }

  /**
   * Samples and emits one token from the logits after the last evaluated token, the cache
   * holding `length` positions; returns the token to evaluate next, or null once generation
   * has ended. With `drafted` (a token a sampling drafter drew from its distribution q), the
   * token comes from the speculative-sampling rule (Sampler.speculate): drafted.token when it is
   * kept, else a draw from the residual; distributed as sampling without a draft gives.
   */
  next(logits: Float32Array, length: number, drafted?: SampledDraft): number | null {
    if (this.finished || this.interrupted()) return null;
    refuseNonFinite(logits, length - 1);
    const constraint = this.o.constraint;
    const budget = Math.min(this.maxTokens - this.tokens.length,
      this.o.contextShift ? Infinity : this.contextLength - length);
    let token: number;
    try {
      const mask = constraint ? (x: Float32Array) => constraint.mask(x, budget) : undefined;
      token = drafted ? this.sampler.speculate(logits, mask, drafted.token, drafted.q)
        : this.sampler.sample(logits, mask);
    } catch (err) {
      // A caller that checked that the constraint's shortest output fits the budget does not
      // get here (the JSON grammar's promise, given single-byte tokens); a vocabulary without
      // them, or a logit bias that bans what the grammar needs, ends the output as cut short.
      if (constraint && err instanceof NoTokenLeftError) return this.end("length");
      throw err;
    }
    const top = this.o.logprobs;
    return this.take(token, length, top === undefined ? null : logprobs(logits, token, top));
  }

  /**
   * Whether every token is the first maximum of the logits (no sampling, bias, penalty or
   * constraint): then the argmax may be taken on the device and handed to accept().
   */
  get greedy(): boolean {
    return this.sampler.plainGreedy && !this.o.constraint && this.o.logprobs === undefined;
  }

  /**
   * Whether the first maximum of the raw logits is this generation's token unless the logit bias
   * lowers it (Sampler.greedyUnderBans): then a device argmax serves, and only a row whose
   * argmax the bias lowers needs its logits (argmaxServes).
   */
  get greedyUnderBans(): boolean {
    return this.sampler.greedyUnderBans && !this.o.constraint && this.o.logprobs === undefined;
  }

  /** Whether the raw logits' first maximum `token` is this generation's pick (see greedyUnderBans). */
  argmaxServes(token: number): boolean {
    return !this.sampler.lowers(token);
  }

  /** As next(), for the token a greedy argmax already chose from those logits (see greedy). */
  accept(token: number, length: number): number | null {
    if (this.finished || this.interrupted()) return null;
    return this.take(token, length, null);
  }

  private take(token: number, length: number, probs: Logprobs | null): number | null {
    const o = this.o, constraint = o.constraint;
    // Under a constraint, end-of-generation is allowed only once the output is complete.
    const eog = this.tokenizer.isEndOfGeneration(token);
    if (this.stopTokens.has(token) || (eog && (!o.ignoreEos || constraint))) return this.end("eos");
    constraint?.accept(token);
    this.sampler.accept(token);
    this.tokens.push(token);
    let piece = this.decoder.push(token);
    if (o.shownTokens?.includes(token)) piece += this.tokenizer.tokenText(token);
    if (probs) {
      const end = this.decoded + piece.length;
      this.pending.push({ entry: { ...probs, offset: this.decoded }, end });
    }
    this.decoded += piece.length;
    this.emit(piece);
    if (this.stops.stopped) return this.end("stop");
    if (constraint?.done) return this.end("complete");
    if (this.tokens.length >= this.maxTokens) return this.end("length");
    if (length >= this.contextLength && !this.o.contextShift) return this.end("context");
    return token;
  }

  get done(): boolean {
    return this.finished;
  }

  private emit(piece: string): void {
    const out = this.stops.push(piece);
    if (out) {
      this.text += out;
      this.o.onText?.(out, this.release(false));
    }
  }

  /**
   * The pending log-probabilities of tokens whose text is all emitted now (`partly`: at least
   * begun), in order; undefined when there are none.
   */
  private release(partly: boolean): TokenLogprob[] | undefined {
    const emitted = this.text.length;
    let n = 0;
    while (n < this.pending.length) {
      const p = this.pending[n];
      if (!(p.end <= emitted || (partly && p.entry.offset < emitted))) break;
      n++;
    }
    if (n === 0) return undefined;
    const out = this.pending.splice(0, n).map((p) => p.entry);
    this.reported.push(...out);
    return out;
  }

  /** The context is full and cannot shift: the generation ends as "context". */
  endAtContext(): void {
    this.end("context");
  }

  private end(reason: StopReason): null {
    this.stopReason = reason;
    this.finished = true;
    return null;
  }

  /** Flushes held-back text and returns the result. */
  finish(): GenerateResult {
    if (!this.stops.stopped) this.emit(this.decoder.flush());
    const tail = this.stops.flush();
    if (tail) {
      this.text += tail;
      this.o.onText?.(tail, this.release(true));
    }
    const cut = this.release(true); // tokens a stop string cut in the middle
    if (cut) this.o.onText?.("", cut);
    this.pending.length = 0; // the rest was held back and never shown (a stop string's)
    return {
      promptTokens: [...this.promptTokens], prefilled: this.prefilled, tokens: this.tokens,
      text: this.text, stopReason: this.stopReason, promptMs: this.t1 - this.t0,
      generateMs: performance.now() - this.t1,
      logprobs: this.o.logprobs === undefined ? undefined : this.reported,
    };
  }
}

/**
 * Throws where a forward pass gave NaN or infinite logits (NaN weights, or an overflow): no
 * token is drawn from them, so garbage never reaches the output as text.
 */
export function refuseNonFinite(logits: Float32Array, position: number): void {
  const at = firstNonFinite(logits);
  if (at === logits.length) return;
  const what = Number.isNaN(logits[at]) ? "NaN" : "an infinite logit";
  throw new InferError("bad_model", `the model produced ${what} at position ${position} ` +
    "(NaN in its weights, or an overflow)");
}
