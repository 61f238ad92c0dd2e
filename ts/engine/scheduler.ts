// Continuous batching: several sequences share every forward pass. Each sequence holds a slot
// (its own KV cache); requests wait in arrival order for a free slot, join the running batch
// between steps and leave it when they end, are interrupted, or fail.
//
// One step() is one forward pass over:
//   - one row per decoding sequence (the token it sampled last step), and
//   - prompt rows of sequences still prefilling, in arrival order, at most `prefillChunk` rows
//     while others decode (so running streams keep their pace) or a whole batch when none does.
// A sequence's rows sit together in the batch; a prompt that completes in this step is split
// into its body and its last token, which goes with the decoding rows at the end of the batch,
// so that the rows needing logits are the last ones and the LM head runs over them alone.
// Every row is computed with the single-token arithmetic, so each sequence gets exactly the
// tokens it would get alone.
//
// A slot keeps what its last sequence left in it. A new sequence takes the free slot that holds
// the longest beginning of its prompt and continues from there in place, as llama.cpp's server
// picks a slot by prompt similarity (where a sliding-window ring cannot drop back that far, it
// starts over): a chat's next turn evaluates only its new tokens. With a prefix cache, a
// sequence also copies the longest cached prefix of its prompt into its slot when that reaches
// further, and each block a sequence completes is saved for the next ones. A sequence whose
// prompt begins like that of an earlier one still evaluating it waits for those blocks, so a
// burst of requests with one system prompt evaluates it once.
//
// A lone sequence decoding greedily on a backend that takes the argmax on the device (CUDA)
// runs a step ahead of the host (deviceStep), until another sequence joins it or it ends. A
// verification pass whose logit rows are all greedy takes their argmaxes there too, and reads
// back only the ids. A lone greedy sequence with speculation runs a step ahead too while it has
// nothing to draft, and leaves the device only for a step that will likely carry a draft
// (wouldDraft): plain decoding a step ahead is what drafts must beat, so it is never given up
// for a step without one.
//
// An embedding is a sequence too: its prompt rows are evaluated in the same batches as everyone
// else's (prompt rows never need logits), the last hidden state of each row is pooled as it
// comes (ts/model/pooling.ts), and it ends when its prompt is evaluated, freeing its slot. It
// starts its slot over: continuing from a cached prefix would skip rows whose hidden states the
// pooling needs.
//
// A sequence with speculation (speculation.ts) decodes its sampled token and the tokens drafted
// after it as consecutive rows of the same step, all with logits; it keeps the drafted tokens
// its sampler chooses itself and drops the cache back past the first it does not (sampleRow).
// A sampled sequence's draft-model tokens are drawn, not greedy; their rows are judged by the
// speculative-sampling rule (Generation.next with the draft's distribution), whose kept tokens
// are likewise those equal to the drafted ones.
import type { BatchedRounding, RowRange } from "../backend/backend.ts";
import { InferError } from "../errors.ts";
import type { SequenceRows } from "../model/model.ts";
import { Pooler, type Pooling } from "../model/pooling.ts";
import type { Engine } from "./engine.ts";
import { Generation, type GenerateOptions, type GenerateResult } from "./generation.ts";
import {
  createKvCache, createSlot, reusablePrefix, rewindSlot, shiftSlotBy, trackAttention, untrackAttention,
  type Slot,
} from "./kv-cache.ts";
import type { DraftModel } from "./draft-model.ts";
import { admitPages, neverFits, type KvPagePool } from "../backend/kv-pages.ts";
import { lookupDraft, PassCost, SequenceSpeculation } from "./speculation.ts";
import { Sampler, type TokenDistribution } from "../sample/sampler.ts";
import {
  PrefixCache, type PrefixCacheOptions, type PrefixCacheStats, type PrefixChain,
} from "./prefix-cache.ts";

export interface SequenceRequest {
  /** Prompt tokens: at least one, fewer than the context length. */
  readonly prompt: readonly number[];
  /** shouldStop is polled once per step; true ends the sequence as "interrupted". */
  readonly options: GenerateOptions;
  /** Called once when the sequence ends (interrupted ones too), with its result. */
  readonly onDone: (result: GenerateResult) => void;
  /** Called instead of onDone when the forward pass failed (a bug or an out-of-memory). */
  readonly onError: (err: Error) => void;
}

export interface EmbeddingRequest {
  /** Tokens to embed: at least one, at most the context length. */
  readonly prompt: readonly number[];
  readonly pooling: Pooling;
  /** L2-normalise the pooled vector. */
  readonly normalize: boolean;
  /** Polled once per step; true fails the sequence (the caller went away). */
  readonly shouldStop?: () => boolean;
  /** Called once with the pooled vector. */
  readonly onDone: (embedding: Float32Array) => void;
  readonly onError: (err: Error) => void;
}

export interface SchedulerOptions {
  /** Sequences decoded together, each with a KV cache of the engine's context length. */
  readonly slots: number;
  /** Prompt rows per step while other sequences decode (default: the backend's prefillChunk, or 64). */
  readonly prefillChunk?: number;
  /** Share prompt prefixes across sequences (default: on, 128 MiB); null: off. */
  readonly prefixCache?: PrefixCacheOptions | null;
  /** Greedy decoding of a lone sequence with the argmax on the device, where the backend has it (default on). */
  readonly deviceGreedy?: boolean;
  /**
   * What a pass of n rows costs relative to one row, for choosing how much to draft; default:
   * timed as the scheduler runs (a fixed function makes the drafts deterministic, for tests).
   */
  readonly passCost?: (rows: number) => number;
  /** The draft model for sequences with speculation "draft". */
  readonly draftModel?: DraftModel | null;
}

export interface SchedulerStats {
  readonly slots: number;
  readonly busySlots: number;
  readonly waiting: number;
  readonly steps: number;
  /** Prompt positions continued in place from what a slot held, since the start. */
  readonly reusedTokens: number;
  readonly prefix: PrefixCacheStats | null;
}

/** A row whose logits are sampled: the sequence's row `i` of this step, at `position`. */
interface LogitRow {
  readonly s: Sequence;
  readonly i: number;
  readonly position: number;
}

class Sequence {
  /**
   * The token sampled last, to be evaluated next step; null while the prompt is prefilled (or
   * while a device step computes the next token).
   */
  pending: number | null = null;
  /** Prompt positions not evaluated: held by the slot, or copied from the prefix cache. */
  restored = 0;
  ended = false;
  /** Why the sequence failed on its own (its sampler, grammar or callback threw). */
  error: Error | null = null;
  /** Held back this step for an earlier sequence evaluating the same prompt beginning. */
  parked = false;
  chain: PrefixChain = { blocks: 0, last: null };
  /** Drafted tokens to evaluate after `pending` this step (speculation). */
  draft: number[] = [];
  /** This step's rows judged so far: the drafted tokens accepted, and whether one was not. */
  accepted = 0;
  rejected = false;
  readonly spec: SequenceSpeculation | null;
  /**
   * A sampled sequence's draft-model sampler (its options, a generator of its own), and the
   * distribution each drafted token of this step was drawn from; null: drafts are greedy or
   * prompt lookup's, which the accept-if-sampled rule verifies.
   */
  readonly draftSampler: Sampler | null = null;
  draftProbs: TokenDistribution[] = [];
  /**
   * The context shifted under it: its cache no longer holds what evaluating its history would
   * give, so none of it goes to the prefix cache or to a later prompt.
   */
  shifted = false;
  /** Granules of the page pool its slot may come to hold (kv-pages.ts); 0 without a pool. */
  claim = 0;
  /** Exactly one of generation (a generating sequence) and pooler (an embedding) is set. */
  constructor(readonly request: SequenceRequest | EmbeddingRequest, readonly slot: Slot,
    readonly generation: Generation | null, readonly pooler: Pooler | null) {
    const o = generation ? (request as SequenceRequest).options.speculation : undefined;
    this.spec = o && o.mode !== "off" ? new SequenceSpeculation(o) : null;
    const sampling = generation ? (request as SequenceRequest).options.sampling : null;
    if (o?.mode === "draft" && sampling && sampling.temperature > 0) {
      // Seeded requests stay reproducible: the drafter's own generator, from the same seed.
      const seed = sampling.seed >= 0 ? (sampling.seed ^ 0x5bd1e995) >>> 0 : -1;
      this.draftSampler = new Sampler({ ...sampling, seed });
    }
  }

  interrupted(): boolean {
    if (this.generation) return this.generation.interrupted();
    const stop = (this.request as EmbeddingRequest).shouldStop?.() ?? false;
    if (stop) this.error = new InferError("internal", "the embedding was interrupted");
    return stop;
  }

  get prompt(): readonly number[] { return this.request.prompt; }

  /** Positions of the slot's cache that hold this sequence's keys and values. */
  get length(): number { return this.slot.length; }
  set length(n: number) {
    this.slot.length = n;
    if (n > this.slot.reach) this.slot.reach = n;
  }
}

/** Rows of a batch llama.cpp splits a sequence into (n_ubatch, its default). */
const LLAMA_UBATCH = 512;

/**
 * How many of an embedding's `rows` rows at positions position.. (of a text of `length` tokens)
 * llama-embedding computes through its batched kernels (both counts are leading rows, as
 * positions ascend). It evaluates a text in batches of LLAMA_UBATCH rows, each through batched
 * kernels unless it is a single row (`batched`: all but a last batch of one row), whose Q4_K
 * kernel takes rows four at a time and a batch's last few one at a time (`fourRows`: positions
 * below length - length % 4, as LLAMA_UBATCH is a multiple of 4).
 */
export function llamaBatchRows(length: number, position: number, rows: number):
  { batched: number; fourRows: number } {
  const leading = (end: number) => Math.max(0, Math.min(position + rows, end) - position);
  return {
    batched: leading(length % LLAMA_UBATCH === 1 ? length - 1 : length),
    fourRows: leading(length - length % 4),
  };
}

/** An embedding's rows in this step's batch, whose hidden states go to its pooler. */
interface HiddenRows {
  readonly s: Sequence;
  readonly first: number;
  readonly rows: number;
}

export class BatchScheduler {
  private readonly slots: Slot[] = [];
  private readonly free: Slot[] = [];
  private readonly waiting: (SequenceRequest | EmbeddingRequest)[] = [];
  private running: Sequence[] = [];
  private readonly prefix: PrefixCache | null;
  private readonly prefillChunk: number;
  private readonly tokens: Int32Array;
  private readonly deviceGreedy: boolean;
  /** Greedy verification passes take their rows' argmaxes on the device (hostStep). */
  private readonly deviceArgmax: boolean;
  /** The lone greedy sequence whose next token a queued device step computes (deviceStep). */
  private ahead: Sequence | null = null;
  private steps = 0;
  private reused = 0;
  private readonly passCost: PassCost;
  /** When the last device step of an unbroken run of them returned (0: none): the time a token takes there. */
  private deviceStepEnd = 0;
  private readonly draftModel: DraftModel | null;
  /** The backend's page pool, which admission answers to (kv-pages.ts); null: caches are whole. */
  private readonly pages: KvPagePool | null;

  constructor(private readonly engine: Engine, o: SchedulerOptions) {
    const be = engine.backend, model = engine.model;
    if (!(Number.isInteger(o.slots) && o.slots >= 1)) {
      throw new InferError("invalid_argument", `slots must be a positive integer, got ${o.slots}`);
    }
    if (o.slots > 1 && !be.sequenceBatches) {
      throw new InferError("unsupported", `the ${be.name} backend runs one sequence at a time`);
    }
    if (o.slots > model.maxBatch) {
      throw new InferError("invalid_argument",
        `${o.slots} slots exceed the batch of ${model.maxBatch}`);
    }
    if (o.slots > 1) engine.checkSlotsFit(o.slots); // before the slots' caches are allocated
    this.prefillChunk = Math.max(1, Math.min(o.prefillChunk ?? be.prefillChunk ?? 64, model.maxBatch));
    this.tokens = new Int32Array(model.maxBatch);
    this.passCost = new PassCost(model.maxBatch, o.passCost ?? null);
    this.draftModel = o.draftModel ?? null;
    // The engine's own sequence is the first slot, with what it holds.
    this.slots.push(engine.slot);
    for (let i = 1; i < o.slots; i++) {
      this.slots.push(createSlot(
        createKvCache(be, model.info, engine.contextLength, engine.cache.type, model.maxBatch)));
    }
    this.free.push(...this.slots);
    this.deviceGreedy = (o.deviceGreedy ?? true) &&
      be.deviceGreedy !== undefined;
    this.deviceArgmax = this.deviceGreedy && be.deviceGreedy?.argmaxRows !== undefined;
    this.pages = be.kvPages?.() ?? null;
    this.prefix = o.prefixCache === null || !be.copyKv ? null
      : new PrefixCache(be, model.info.kvShapes, engine.cache.type, o.prefixCache);
  }

  /** Queues a sequence; it joins the batch at the next step with a free slot. */
  submit(request: SequenceRequest): void {
    const n = request.prompt.length, context = this.engine.contextLength;
    if (n === 0) throw new InferError("invalid_argument", "the prompt is empty");
    if (n >= context) {
      throw new InferError("context_overflow", `${n} prompt tokens do not fit the context of ` +
        `${context} with room to answer (raise --ctx-size)`);
    }
    if (request.options.speculation?.mode === "draft" && !this.draftModel) {
      throw new InferError("invalid_argument",
        "speculation 'draft' needs a draft model (--draft-model)");
    }
    this.waiting.push(request);
  }

  /** Queues an embedding; it joins the batch at the next step with a free slot. */
  submitEmbedding(request: EmbeddingRequest): void {
    const n = request.prompt.length, context = this.engine.contextLength;
    if (n === 0) throw new InferError("invalid_argument", "nothing to embed");
    if (n > context) {
      throw new InferError("context_overflow", `${n} tokens to embed do not fit the context ` +
        `of ${context} (raise --ctx-size)`);
    }
    this.waiting.push(request);
  }

  /** Whether a step would do anything. */
  get busy(): boolean {
    return this.running.length > 0 || this.waiting.length > 0;
  }

  stats(): SchedulerStats {
    return { slots: this.slots.length, busySlots: this.slots.length - this.free.length,
      waiting: this.waiting.length, steps: this.steps, reusedTokens: this.reused,
      prefix: this.prefix?.stats() ?? null };
  }

  /** The timed pass costs that choose draft lengths, rows → ms (PassCost.timings; for benches). */
  passTimings(): { rows: number; ms: number }[] {
    return this.passCost.timings();
  }

  /** Admits waiting sequences, runs one forward pass, samples, and retires ended sequences. */
  step(): void {
    for (const s of this.running) if (s.interrupted()) s.ended = true;
    if (this.ahead && !this.staysOnDevice(this.ahead)) {
      const s = this.ahead, guess = this.lookupGuess(s);
      this.settle(s);
      // Whether prompt lookup foresaw the token it left the device for: a miss counts as a
      // rejected draft, so that text where lookups match but do not hold pauses speculation.
      if (guess >= 0 && s.pending !== null) s.spec!.guessed(s.pending === guess);
    }
    this.admit();
    for (const s of this.running) {
      if (s.pending !== null && s.length >= this.engine.contextLength) this.shiftContext(s);
    }
    this.retire(); // the interrupted, new ones with nothing to generate, full ones that cannot shift
    if (this.running.length === 0) return;
    this.draft();
    const lone = this.running[0];
    const onDevice = this.staysOnDevice(lone) && (this.ahead === lone || lone.pending !== null);
    if (!onDevice) this.deviceStepEnd = 0;
    if (onDevice ? !this.deviceStep(lone) : !this.hostStep()) return;
    this.steps++;
    if (this.prefix) {
      // Embeddings' texts would only push chats' prompts out of the cache.
      for (const s of this.running) if (s.generation && !s.shifted) this.prefix.save(s.chain, s.slot);
    }
    this.retire();
  }

  /** One forward pass over the planned rows, its logits sampled on the host; false: it failed. */
  private hostStep(): boolean {
    const t0 = performance.now();
    const plan = this.plan();
    const vocab = this.engine.model.info.vocabSize;
    const firstLogitRow = plan.rows - plan.logits.length;
    const hidden = plan.hidden.length === 0 ? undefined : {
      ranges: plan.hidden,
      sink: (firstRow: number, rows: number, values: Float32Array) => {
        const s = plan.hidden.find((h) => h.first === firstRow)!.s;
        s.pooler!.add(rows, values);
        if (s.pooler!.complete) s.ended = true;
      },
    };
    // A step whose logit rows are all greedy (several sequences decoding, or a verification
    // pass), on a backend that takes argmaxes on the device: only the rows' token ids come back,
    // not a row of logits each (at 64 rows of a 152k vocabulary, 39 MB a step). A greedy
    // request with banned tokens (an OpenAI client's logit_bias of -100) is served so too; the
    // rare row whose argmax is a banned token is picked from its logits (fromLogits), and so are
    // the rows after it in its chunk, so that a sequence's rows are still judged in order.
    const fromLogits = new Set<number>();
    const argmaxSink = this.deviceArgmax && plan.logits.length > 0 &&
      plan.logits.every((row) => row.s.generation!.greedyUnderBans)
      ? (firstRow: number, rows: number, ids: Int32Array) => {
        for (let r = 0; r < rows; r++) {
          const row = plan.logits[firstRow - firstLogitRow + r];
          if (fromLogits.size === 0 && row.s.generation!.argmaxServes(ids[r])) {
            this.sampleRow(row.s, row.i, row.position, null, ids[r]);
          } else fromLogits.add(firstRow + r);
        }
        return fromLogits.size > 0;
      } : undefined;
    try {
      this.engine.model.forwardBatch(
        { tokens: this.tokens, segments: plan.segments, logitRows: plan.logits.length, hidden,
          batchedRounding: plan.batchedRounding, argmaxSink },
        (firstRow, rows, logits) => {
          for (let r = 0; r < rows; r++) {
            if (argmaxSink && !fromLogits.delete(firstRow + r)) continue; // its argmax served
            const row = plan.logits[firstRow - firstLogitRow + r];
            this.sampleRow(row.s, row.i, row.position,
              logits.subarray(r * vocab, (r + 1) * vocab));
          }
        });
    } catch (err) {
      // The caches of this batch may hold half a step: fail its sequences, keep serving.
      this.failRunning(err as Error);
      return false;
    }
    this.verified();
    if (plan.rows === plan.logits.length && plan.finishing === 0) {
      this.passCost.record(plan.rows, performance.now() - t0);
    }
    return true;
  }

  /**
   * Samples the sequence's next token from the logits of its row `i` of this step (at
   * `position`): the token after its prompt, after its pending token (i = 0), or after drafted
   * token i - 1, which was accepted if this row is reached. A token that differs from the
   * drafted one at i is the sequence's next pending token; the rows after it were evaluated for
   * drafted tokens that are not the sequence's, and the cache drops back past them. Without
   * logits, `argmax` is the row's greedy token, taken on the device.
   */
  private sampleRow(s: Sequence, i: number, position: number, logits: Float32Array | null,
    argmax = -1): void {
    if (s.ended || s.rejected) return;
    const generation = s.generation!; // rows with logits are generating sequences'
    if (s.pending === null) generation.promptDone(s.prompt.length - s.restored);
    let token: number | null;
    try {
      const sampledDraft = i < s.draftProbs.length
        ? { token: s.draft[i], q: s.draftProbs[i] } : undefined;
      // logits null: the device took the row's argmax (a greedy sequence; see hostStep)
      token = logits ? generation.next(logits, position + 1, sampledDraft)
        : generation.accept(argmax, position + 1);
    } catch (err) { // this sequence's own failure: the others go on
      s.error = err as Error;
      token = null;
    }
    if (token === null) {
      s.ended = true;
      s.pending = null;
    } else if (i < s.draft.length && token === s.draft[i]) {
      s.accepted++;
      return;
    } else s.pending = token;
    s.rejected = true;
    rewindSlot(s.slot, position + 1);
  }

  /** Counts each sequence's drafted tokens kept, for its next drafts; clears the step's state. */
  private verified(): void {
    for (const s of this.running) {
      if (s.draft.length > 0) s.spec?.verified(s.draft.length, s.accepted);
      s.draft = [];
      s.draftProbs = [];
      s.accepted = 0;
      s.rejected = false;
    }
  }

  /**
   * Drafts tokens after the pending token of each sequence with speculation, as many as its
   * estimate says pay (SequenceSpeculation.plan), within its token and context limits and the
   * batch (every decoding sequence keeps its row).
   */
  private draft(): void {
    const maxBatch = this.engine.model.maxBatch, context = this.engine.contextLength;
    let spare = maxBatch - this.running.filter((s) => s.pending !== null).length;
    for (const s of this.running) {
      s.draft = [];
      s.draftProbs = [];
      if (!s.spec || s.pending === null || s.ended || spare <= 0) continue;
      const g = s.generation!; // only generating sequences have speculation
      const room = Math.min(spare, context - s.length - 1, g.tokensLeft - 1);
      const drafter = s.spec.mode === "draft" ? this.draftModel : null;
      const oneRow = this.passCost.oneRowMs;
      const perDraft = drafter ? (oneRow > 0 ? drafter.msPerToken / oneRow : 0.3) : 0;
      const k = s.spec.plan(room, g.count, this.passCost, perDraft);
      if (k <= 0) continue;
      const history = s.slot.history;
      history[s.length] = s.pending;
      s.draft = drafter ? drafter.draft(s.slot, history, s.length + 1, k, s.draftSampler, s.draftProbs)
        : lookupDraft(history, s.length + 1, k);
      spare -= s.draft.length;
    }
  }

  /**
   * Whether `s` may decode with the argmax on the device: it decodes greedily, alone, and no
   * waiting sequence could join it (none waits, or no slot is free).
   */
  private staysOnDevice(s: Sequence): boolean {
    return this.deviceGreedy && !s.ended && this.running.length === 1 &&
      this.running[0] === s && (this.waiting.length === 0 || this.free.length === 0) &&
      s.generation?.greedy === true && !this.wouldDraft(s);
  }

  /**
   * Whether `s` drafts this step. With its next token on the host (pending), whether draft()
   * drafted. With it still on the device (a step ahead), whether it likely will: a draft model
   * always drafts; prompt lookup does when the n-gram ending at the last token the host has
   * occurred before, which predicts the token in flight. Only then does the host wait for that
   * token (settle) to draft after it: a miss costs one step taken without the device's lead.
   */
  private wouldDraft(s: Sequence): boolean {
    if (s.draft.length > 0) return true;
    const spec = s.spec;
    if (!spec || s.pending !== null || this.ahead !== s || !spec.active(s.generation!.count)) return false;
    return spec.mode === "draft" || this.lookupGuess(s) >= 0;
  }

  /** Prompt lookup's guess of the token a device step computes for `s` (-1: none, or not lookup). */
  private lookupGuess(s: Sequence): number {
    if (s.spec?.mode !== "ngram" || this.ahead !== s) return -1;
    return lookupDraft(s.slot.history, s.length, 1)[0] ?? -1;
  }

  /**
   * Greedy decoding with the argmax on the device, one step ahead of the host: the step that
   * evaluates token k+1 (the one step k's argmax left in device memory) is queued before the
   * host reads token k, so the GPU never waits for the host's sampling, streaming or launches.
   * The tokens and stop decisions are the generation's own (accept()). The first device step
   * evaluates the token the host sampled and reads nothing. When token k ends the sequence, step
   * k+1 was speculative: its keys and values lie past the sequence's length and are never read.
   * Returns false when the device failed (the sequence failed with it).
   */
  private deviceStep(s: Sequence): boolean {
    const be = this.engine.backend;
    try {
      if (this.ahead === null) { // queues a step and reads nothing: no token's time to take
        this.deviceStepEnd = 0;
        const token = s.pending!;
        s.pending = null;
        this.queueGreedy(s, token);
        s.slot.history[s.length] = token;
        s.length++;
        this.ahead = s;
        return true;
      }
      const room = s.length < this.engine.contextLength;
      if (room) this.queueGreedy(s, null);
      const token = this.acceptDeviceToken(s, be.deviceGreedy!.takeToken());
      if (token === null) return true;
      if (!room) throw new InferError("internal", "a token past the context was accepted");
      s.slot.history[s.length] = token;
      s.length++;
      // A token a step, the GPU's time and the host's overlapped: plain decoding's cost, which
      // a verification pass's time is weighed against (a one-row pass that waits for its
      // result costs more on an asynchronous device, and would flatter the drafts).
      const now = performance.now();
      if (this.deviceStepEnd > 0) this.passCost.record(1, now - this.deviceStepEnd);
      this.deviceStepEnd = now;
      return true;
    } catch (err) {
      this.failRunning(err as Error);
      return false;
    }
  }

  /** Queues one greedy step at the sequence's length: `token`, or (null) the device's. */
  private queueGreedy(s: Sequence, token: number | null): void {
    this.tokens[0] = token ?? 0;
    const position = s.length;
    this.engine.model.forwardBatch({
      tokens: this.tokens, segments: [{ rows: 1, position, cache: s.slot.cache.layers }],
      logitRows: 1, greedy: { tokenOnDevice: token === null },
    }, () => {
      throw new InferError("internal", "greedy decoding on the device produced host logits");
    });
    s.slot.reach = Math.max(s.slot.reach, position + 1); // written, if only speculatively
  }

  /**
   * Hands the token the device chose to the sequence: the token to evaluate next, or null when
   * it ended the sequence (then no device step stays queued).
   */
  private acceptDeviceToken(s: Sequence, taken: number): number | null {
    let token: number | null;
    try {
      token = s.generation!.accept(taken, s.length);
    } catch (err) { // this sequence's own failure (its callback threw)
      s.error = err as Error;
      token = null;
    }
    if (token !== null) return token;
    s.ended = true;
    this.ahead = null;
    this.engine.backend.deviceGreedy!.dropTokens();
    return null;
  }

  /**
   * Leaves device decoding (another sequence joins, or `s` was interrupted): the token in
   * flight becomes the one the host evaluates next, as if the host had sampled it.
   */
  private settle(s: Sequence): void {
    const be = this.engine.backend;
    this.deviceStepEnd = 0;
    try {
      if (s.ended) { // interrupted: its next token is not wanted
        this.ahead = null;
        be.deviceGreedy!.dropTokens();
        return;
      }
      const token = this.acceptDeviceToken(s, be.deviceGreedy!.takeToken());
      this.ahead = null;
      s.pending = token;
    } catch (err) {
      this.failRunning(err as Error);
    }
  }

  /**
   * Gives free slots to waiting sequences, in arrival order: each the slot that holds the
   * longest beginning of its prompt, which it continues from in place.
   */
  private admit(): void {
    while (this.free.length > 0 && this.waiting.length > 0) {
      const request = this.waiting[0];
      if ("pooling" in request) {
        const claim = this.claimPages(this.free[0], 0, request.prompt.length);
        if (claim === null) break;
        this.waiting.shift();
        if (claim instanceof InferError) request.onError(claim);
        else this.admitEmbedding(request, claim);
        continue;
      }
      const reuse = request.options.reuseCache ?? true;
      // Every position it may write: the prompt, its tokens, and one a device step runs ahead.
      const max = request.options.maxTokens;
      const { slot, common } = this.pickSlot(request.prompt, reuse);
      const reach = max < 0 ? Infinity : request.prompt.length + max + 1;
      const claim = this.claimPages(slot, common, reach);
      if (claim === null) break;
      this.waiting.shift();
      if (claim instanceof InferError) {
        request.onError(claim);
        continue;
      }
      // A backend that cannot shift ends at the context, as without the shift.
      const shifts = request.options.contextShift && this.engine.backend.shiftKv !== undefined;
      const generation = new Generation(this.engine.tokenizer, request.prompt,
        this.engine.contextLength, { ...request.options, contextShift: shifts });
      this.free.splice(this.free.indexOf(slot), 1);
      rewindSlot(slot, common);
      for (const l of slot.cache.layers) this.pages?.unshareFrom(l, common);
      this.reused += common;
      const s = new Sequence(request, slot, generation, null);
      s.claim = claim;
      if (reuse) this.restore(s);
      s.restored = s.length;
      // The h2o shift needs the attention each position got: tracked from here, a reused
      // prefix's (held in place or restored) estimated by shiftSlotHeavy.
      if (shifts && request.options.contextShiftPolicy === "h2o") trackAttention(this.engine.backend, slot);
      else untrackAttention(this.engine.backend, slot);
      if (generation.interrupted() || generation.done) s.ended = true;
      this.running.push(s);
    }
  }

  /**
   * With a page pool: whether a sequence writing positions from `from` (what it continues of
   * the slot) up to `rows` - 1 (at most the context) may start in `slot` now. Returns the
   * granules it claims (0 without a pool), null when it must wait for running sequences to end,
   * or the error of one that can never fit. Free slots are emptied, the one free the longest
   * first, where that makes the room, and the slot gives back what it maps past `rows`
   * (positions the sequence overwrites or never reaches). A granule the slot shares with
   * another and will write into counts as a new one (it is copied first); one shared by slots
   * comes back only when the last of them is emptied.
   */
  private claimPages(slot: Slot, from: number, rows: number): number | null | InferError {
    const pool = this.pages;
    if (!pool) return 0;
    rows = Math.min(rows, this.engine.contextLength);
    const layers = slot.cache.layers, need = pool.need(layers, rows);
    const others = this.free.filter((f) => f !== slot);
    const excess = pool.held(layers) > need;
    const decision = admitPages({
      need, grows: need - pool.kept(layers, from, rows),
      // A sequence that may shift its context writes into every granule it holds.
      running: this.running.map((s) => ({ claim: s.claim, held: mayShift(s)
        ? pool.owned(s.slot.cache.layers) : pool.held(s.slot.cache.layers) })),
      free: pool.reclaimable(others.map((f) => f.cache.layers), { layers, from, rows }),
      // What the slot gives back counts as to be had: it goes before the sequence starts.
      available: pool.availableGranules() + pool.freed(layers, from, rows),
      capacity: pool.availableGranules() + pool.mapped,
    });
    if (decision.kind === "wait") return null;
    if (decision.kind === "never") return neverFits(decision.need, decision.capacity, pool.granule);
    for (const f of others.slice(0, decision.reclaim)) {
      for (const l of f.cache.layers) pool.trimRows(l, 0);
      rewindSlot(f, 0);
    }
    if (excess) {
      // Positions below `rows` stay mapped: the prefix it continues from (shorter) is kept.
      for (const l of layers) pool.trimRows(l, rows);
      if (slot.length > rows) rewindSlot(slot, rows);
    }
    return need;
  }

  /** An embedding takes the slot free the longest and starts it over. */
  private admitEmbedding(request: EmbeddingRequest, claim: number): void {
    const slot = this.free.shift()!;
    rewindSlot(slot, 0);
    for (const l of slot.cache.layers) this.pages?.unshareFrom(l, 0);
    const pooler = new Pooler(request.pooling, this.engine.model.info.embedding,
      request.prompt.length);
    const s = new Sequence(request, slot, null, pooler);
    s.claim = claim;
    if (s.interrupted()) s.ended = true;
    this.running.push(s);
  }

  /**
   * The free slot that can continue the longest beginning of `prompt` (reusablePrefix), and that
   * length; among equals, the one free the longest, so a prompt matching none takes the least
   * recently used and leaves the others what they hold.
   */
  private pickSlot(prompt: readonly number[], reuse: boolean): { slot: Slot; common: number } {
    let slot = this.free[0], common = 0;
    if (!reuse) return { slot, common };
    for (const candidate of this.free) {
      const n = reusablePrefix(candidate, this.engine.model.info, prompt);
      if (n > common) {
        slot = candidate;
        common = n;
      }
    }
    return { slot, common };
  }

  /**
   * Copies the cached blocks of the prompt into the slot of a sequence yet to start, where they
   * reach past what the slot holds of it; the sequence's chain follows its blocks either way.
   */
  private restore(s: Sequence): void {
    if (!this.prefix) return;
    const held = s.length;
    s.chain = this.prefix.restore(s.prompt, s.slot.cache.layers, held);
    const positions = s.chain.blocks * this.prefix.blockTokens;
    if (positions <= held) return;
    s.slot.history.set(s.prompt.slice(held, positions), held);
    s.length = positions;
  }

  /**
   * Whether `s`, which has evaluated nothing of its own yet, should wait for an earlier sequence
   * still evaluating a longer beginning of the same prompt (a burst of requests with one system
   * prompt): the prefix cache then hands it those blocks instead of their being evaluated twice.
   */
  private waitsForEarlier(s: Sequence, index: number): boolean {
    if (!this.prefix || s.length !== s.restored) return false;
    const block = this.prefix.blockTokens;
    for (let i = 0; i < index; i++) {
      const t = this.running[i];
      if (t.pooler) continue; // an embedding saves nothing to the cache
      const limit = Math.min(t.prompt.length, s.prompt.length - 1);
      let shared = 0;
      while (shared < limit && t.prompt[shared] === s.prompt[shared]) shared++;
      shared -= shared % block;
      if (shared > s.length && t.length < shared) return true;
    }
    return false;
  }

  /** This step's rows: prompt bodies first, then the rows that need logits. */
  private plan(): {
    segments: SequenceRows[]; logits: LogitRow[]; rows: number; finishing: number;
    hidden: HiddenRows[]; batchedRounding: BatchedRounding;
  } {
    const maxBatch = this.engine.model.maxBatch;
    const decoding = this.running.filter((s) => s.pending !== null);
    const decodeRows = decoding.reduce((n, s) => n + 1 + s.draft.length, 0);
    let budget = Math.min(maxBatch - decodeRows,
      decoding.length > 0 ? this.prefillChunk : maxBatch);
    const bodies: { s: Sequence; rows: number }[] = [], finishing: Sequence[] = [];
    for (const [i, s] of this.running.entries()) {
      if (s.pending !== null || budget <= 0) continue;
      if (s.pooler) { // every row of an embedding is a body row: none needs logits
        const take = Math.min(s.prompt.length - s.length, budget);
        budget -= take;
        bodies.push({ s, rows: take });
        continue;
      }
      if (this.waitsForEarlier(s, i)) {
        s.parked = true;
        continue;
      }
      // What it waited for is in the cache now; or, held back by the budget until now, it may
      // find blocks an earlier sequence saved since it was admitted.
      if (s.parked || (this.prefix && s.length === s.restored)) {
        s.parked = false;
        this.restore(s);
        s.restored = s.length;
      }
      const left = s.prompt.length - s.length, take = Math.min(left, budget);
      budget -= take;
      if (take < left) bodies.push({ s, rows: take });
      else {
        if (take > 1) bodies.push({ s, rows: take - 1 });
        finishing.push(s);
      }
    }
    // Bodies of prompts that complete now go last, just before their last tokens.
    bodies.sort((a, b) => Number(finishing.includes(a.s)) - Number(finishing.includes(b.s)));
    const segments: SequenceRows[] = [];
    let rows = 0;
    const add = (s: Sequence, n: number, token: (i: number) => number) => {
      for (let i = 0; i < n; i++) {
        this.tokens[rows + i] = token(i);
        s.slot.history[s.length + i] = this.tokens[rows + i];
      }
      const last = segments.at(-1);
      if (last && last.cache === s.slot.cache.layers && last.position + last.rows === s.length) {
        segments[segments.length - 1] = { ...last, rows: last.rows + n };
      } else segments.push({ rows: n, position: s.length, cache: s.slot.cache.layers });
      s.length += n;
      rows += n;
    };
    const logits: LogitRow[] = [];
    const hidden: HiddenRows[] = [];
    const batchedRounding = { rows: [] as RowRange[], fourRows: [] as RowRange[] };
    for (const { s, rows: n } of bodies) {
      if (s.pooler) {
        hidden.push({ s, first: rows, rows: n });
        const llama = llamaBatchRows(s.prompt.length, s.length, n);
        if (llama.batched > 0) batchedRounding.rows.push({ first: rows, rows: llama.batched });
        if (llama.fourRows > 0) batchedRounding.fourRows.push({ first: rows, rows: llama.fourRows });
      }
      add(s, n, (i) => s.prompt[s.length + i]);
    }
    for (const s of finishing) {
      logits.push({ s, i: 0, position: s.length });
      add(s, 1, () => s.prompt[s.length]);
    }
    for (const s of decoding) {
      for (let i = 0; i <= s.draft.length; i++) logits.push({ s, i, position: s.length + i });
      add(s, 1 + s.draft.length, (i) => i === 0 ? s.pending! : s.draft[i - 1]);
    }
    if (!this.engine.backend.sequenceBatches && segments.length > 1) {
      throw new InferError("internal", "a batch of several segments on a one-sequence backend");
    }
    return { segments, logits, rows, finishing: finishing.length, hidden, batchedRounding };
  }

  /**
   * Fails every sequence, running or waiting (after an error outside the forward pass, which
   * step() handles itself); the scheduler is empty and usable afterwards.
   */
  abort(err: Error): void {
    const waiting = this.waiting.splice(0);
    this.failRunning(err);
    for (const r of waiting) r.onError(err);
  }

  private failRunning(err: Error): void {
    if (this.ahead) {
      this.ahead = null;
      try {
        this.engine.backend.deviceGreedy!.dropTokens();
      } catch { // the device failed: its queue is forgotten all the same, and err says why
      }
    }
    const failed = this.running;
    this.running = [];
    for (const s of failed) {
      rewindSlot(s.slot, 0); // the cache may hold half a step
      this.release(s);
    }
    for (const s of failed) s.request.onError(err);
  }

  /** Ends the sequences that ended: their results go out and their slots are free again. */
  private retire(): void {
    if (!this.running.some((s) => s.ended)) return;
    const ended = this.running.filter((s) => s.ended);
    this.running = this.running.filter((s) => !s.ended);
    for (const s of ended) {
      this.release(s);
      if (s.error) s.request.onError(s.error);
      else if (s.pooler) {
        const r = s.request as EmbeddingRequest;
        r.onDone(s.pooler.result(r.normalize));
      } else {
        const result = s.generation!.finish();
        (s.request as SequenceRequest).onDone(s.spec ? { ...result, speculation: s.spec.stats() } : result);
      }
    }
  }

  /**
   * A sequence whose next token has no position left: the context shift makes room where it
   * was asked for (and the backend can), else the generation ends as "context".
   */
  private shiftContext(s: Sequence): void {
    const o = (s.request as SequenceRequest).options;
    const dropped = o.contextShift ? shiftSlotBy(o.contextShiftPolicy ?? "streaming", this.engine.backend,
      s.slot, this.engine.model.info, o.contextKeep) : 0;
    if (dropped > 0) {
      s.shifted = true;
      return;
    }
    s.generation!.endAtContext();
    s.pending = null;
    s.ended = true;
  }

  private release(s: Sequence): void {
    if (s.shifted) rewindSlot(s.slot, 0);
    this.free.push(s.slot);
  }
}

/** Whether a sequence may shift its context (and so write over the positions it holds). */
function mayShift(s: Sequence): boolean {
  return s.generation !== null && (s.request as SequenceRequest).options.contextShift === true;
}
