// What constrains the next token beyond the sampler chain (the JSON-schema grammar, for one):
// the generation masks the logits with it before sampling and advances it past each token.
export interface TokenConstraint {
  /** Sets the logits of tokens that may not come next to -Infinity; `budget`: tokens left. */
  mask(logits: Float32Array, budget: number): void;
  /** Advances past `token` (one the mask allowed). */
  accept(token: number): void;
  /** The output is complete and nothing may follow it. */
  readonly done: boolean;
}
