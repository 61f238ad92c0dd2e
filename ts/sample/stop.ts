// Stop strings over streamed text. Token boundaries fall anywhere in a stop string, so text is
// released only once it cannot be the start of one: the longest tail of the pending text that is
// a prefix of some stop string is held back until the next piece decides it. Neither a stop
// string nor anything after it is ever released.

export class StopMatcher {
  private pending = "";
  private matched = false;

  constructor(private readonly stops: readonly string[]) {
    for (const s of stops) if (s.length === 0) throw new Error("a stop string is empty");
  }

  /** True once a stop string has appeared; nothing more is released after it. */
  get stopped(): boolean {
    return this.matched;
  }

  /** Adds a piece of text; returns the part that is now safe to show. */
  push(text: string): string {
    if (this.matched) return "";
    if (this.stops.length === 0) return text;
    this.pending += text;
    let first = -1;
    for (const s of this.stops) {
      const at = this.pending.indexOf(s);
      if (at >= 0 && (first < 0 || at < first)) first = at;
    }
    if (first >= 0) {
      this.matched = true;
      const out = this.pending.slice(0, first);
      this.pending = "";
      return out;
    }
    const hold = this.heldLength();
    const out = this.pending.slice(0, this.pending.length - hold);
    this.pending = this.pending.slice(this.pending.length - hold);
    return out;
  }

  /** End of the text: what was held back was not a stop string after all. */
  flush(): string {
    const out = this.matched ? "" : this.pending;
    this.pending = "";
    return out;
  }

  /** Length of the longest tail of `pending` that a stop string starts with. */
  private heldLength(): number {
    const p = this.pending;
    let best = 0;
    for (const s of this.stops) {
      for (let n = Math.min(s.length - 1, p.length); n > best; n--) {
        if (p.endsWith(s.slice(0, n))) { best = n; break; }
      }
    }
    return best;
  }
}
