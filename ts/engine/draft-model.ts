// A draft model for speculative decoding: a smaller GGUF with the target's vocabulary (or the
// same weights in a cheaper quantization: a Q4_0 copy drafting for a Q8_0 target), with a KV
// cache per scheduler slot. For a greedy sequence it drafts its argmax (K one-row passes), so q
// is one-hot and the scheduler's accept-if-sampled rule is exact (speculation.ts). For a sampled
// sequence it draws each token through a sampler of the sequence's options (temperature,
// truncation, bias, the same penalty window; not the grammar, whose state is the target's) and
// hands back each draw's distribution q, for the speculative-sampling rule (Sampler.speculate).
// Each slot's cache keeps what it evaluated; the next draft evaluates only what the target's
// sequence added since (the accepted tokens), dropping back past drafted tokens that were not.
import { InferError } from "../errors.ts";
import { argmax, type Sampler, type TokenDistribution } from "../sample/sampler.ts";
import type { Engine } from "./engine.ts";
import { createKvCache, createSlot, reusablePrefix, rewindSlot, type Slot } from "./kv-cache.ts";

export class DraftModel {
  private readonly slots = new Map<object, Slot>();
  /** Average milliseconds of one drafted token (a one-row pass of the draft model). */
  msPerToken = 0;
  private timed = 0;

  constructor(readonly engine: Engine, target: Engine) {
    const a = engine.tokenizer, b = target.tokenizer;
    let differs = a.vocabSize !== b.vocabSize;
    // the same pieces, sampled through the vocabulary (checking all of 262k costs a few ms)
    for (let id = 0; !differs && id < a.vocabSize; id += 97) differs = a.tokenText(id) !== b.tokenText(id);
    if (differs) {
      throw new InferError("invalid_argument", `the draft model ${engine.file.path} has another ` +
        `vocabulary than the model (${a.vocabSize} and ${b.vocabSize} tokens)`);
    }
  }

  /**
   * Up to `max` tokens the draft model predicts after text[0..length), for the sequence whose
   * target slot is `key` (each gets a cache of its own, kept between its drafts).
   */
  draft(key: object, text: Int32Array, length: number, max: number,
    sampler: Sampler | null = null, probs: TokenDistribution[] | null = null): number[] {
    if (max <= 0) return [];
    const e = this.engine, context = e.contextLength;
    if (length + max > context) max = context - length;
    if (max <= 0) return [];
    let slot = this.slots.get(key);
    if (!slot) {
      slot = createSlot(createKvCache(e.backend, e.model.info, context, e.cache.type, e.model.maxBatch));
      this.slots.set(key, slot);
    }
    const t0 = performance.now();
    const common = reusablePrefix(slot, e.model.info, Array.from(text.subarray(0, length)));
    rewindSlot(slot, common);
    let logits = this.evaluate(slot, text.subarray(common, length));
    const out: number[] = [];
    sampler?.resetWindow(text.subarray(0, length));
    for (;;) {
      let token: number;
      if (sampler) {
        const drawn = sampler.sampleWithDistribution(logits);
        token = drawn.token;
        probs!.push(drawn.q);
        sampler.accept(token);
      } else token = argmax(logits);
      out.push(token);
      if (out.length >= max) break;
      logits = this.evaluate(slot, [token]);
    }
    // Timed when it continued from its last draft, not when it evaluated a whole prompt first.
    if (length - common <= 64) {
      const ms = (performance.now() - t0) / out.length;
      this.timed = Math.min(this.timed + 1, 32);
      this.msPerToken += (ms - this.msPerToken) / this.timed;
    }
    return out;
  }

  /** Runs tokens through the draft model at the slot's length, in chunks; the last logits. */
  private evaluate(slot: Slot, tokens: ArrayLike<number>): Float32Array {
    const model = this.engine.model;
    let logits: Float32Array | null = null;
    for (let start = 0; start < tokens.length; start += model.maxBatch) {
      const n = Math.min(model.maxBatch, tokens.length - start);
      const chunk = Array.from({ length: n }, (_, i) => tokens[start + i]);
      logits = model.forward(chunk, n, slot.length, slot.cache.layers);
      slot.history.set(chunk, slot.length);
      slot.length += n;
      slot.reach = Math.max(slot.reach, slot.length);
    }
    return logits!;
  }

  close(): void {
    this.slots.clear();
    this.engine.close();
  }
}
