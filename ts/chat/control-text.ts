// Text a conversation brings (message contents, tool calls' names and arguments, tool results,
// the tools' descriptions and schemas) must reach the model as text, never as a control token:
// a tool result that says `<|im_end|>` must not end a turn. The template renders all of it, and
// may transform it on the way (JSON-encode arguments, split on `</think>`), so what came from
// the conversation cannot always be found again in the rendering. Instead, before rendering,
// the first character of every control token's text in it is swapped for a Unicode
// noncharacter (U+FDD0..U+FDEF, which text never carries), so no control token matches there;
// after rendering, the swapped characters are put back and marked, and the tokenizer parses no
// control token that covers a mark. llama.cpp and transformers tokenize the rendered prompt with
// control tokens parsed everywhere, so there such text does inject the token.
import type { Tokenizer } from "../tokenizer/index.ts";

const FIRST = 0xfdd0, COUNT = 32;
const NONCHARACTER = /[\uFDD0-\uFDEF]/g;

interface Trie {
  readonly next: Map<string, Trie>;
  end: boolean;
}

interface Guard {
  /** The control texts by character (a regular expression of thousands is slow). */
  readonly trie: Trie;
  /** The character each noncharacter stands for. */
  readonly chars: string[];
  readonly of: Map<string, string>;
}

const guards = new WeakMap<Tokenizer, Guard>();

function guardFor(tokenizer: Tokenizer): Guard {
  let g = guards.get(tokenizer);
  if (g) return g;
  const texts = tokenizer.controlTexts().filter((t) => t.charCodeAt(0) < 0xd800 ||
    t.charCodeAt(0) > 0xdfff); // (a first character of one UTF-16 unit can be swapped)
  const chars = [...new Set(texts.map((t) => t[0]))].slice(0, COUNT);
  const kept = texts.filter((t) => chars.includes(t[0]));
  const trie: Trie = { next: new Map(), end: false };
  for (const t of kept) {
    let node = trie;
    for (let k = 0; k < t.length; k++) { // (by UTF-16 unit, as hide() reads)
      const c = t[k];
      let child = node.next.get(c);
      if (!child) node.next.set(c, child = { next: new Map(), end: false });
      node = child;
    }
    node.end = true;
  }
  g = { trie, chars, of: new Map(chars.map((c, i) => [c, String.fromCharCode(FIRST + i)])) };
  guards.set(tokenizer, g);
  return g;
}

export class ControlTextGuard {
  private readonly g: Guard;

  constructor(tokenizer: Tokenizer) {
    this.g = guardFor(tokenizer);
  }

  /** `text` with no control token's text left in it (noncharacters it had become U+FFFD). */
  hide(text: string): string {
    const clean = text.replace(NONCHARACTER, "\uFFFD");
    let out = "", from = 0;
    for (let i = 0; i < clean.length; i++) {
      let node = this.g.trie.next.get(clean[i]);
      let end = -1; // the longest control text starting at i
      for (let j = i + 1; node; j++) {
        if (node.end) end = j;
        if (j >= clean.length) break;
        node = node.next.get(clean[j]);
      }
      if (end < 0) continue;
      out += clean.slice(from, i) + this.g.of.get(clean[i])!;
      from = i + 1;
      i = end - 1;
    }
    return out + clean.slice(from);
  }

  /** hide() over every string of a JSON-like value. */
  hideAll<T>(value: T): T {
    if (typeof value === "string") return this.hide(value) as T;
    if (Array.isArray(value)) return value.map((v) => this.hideAll(v)) as T;
    if (typeof value === "object" && value !== null) {
      return Object.fromEntries(Object.entries(value).map(([k, v]) =>
        [this.hide(k), this.hideAll(v)])) as T;
    }
    return value;
  }

  /** The rendering with the swapped characters back, and where they were. */
  reveal(rendered: string): { text: string; marks: number[] } {
    const marks: number[] = [];
    const text = rendered.replace(NONCHARACTER, (c, at: number) => {
      marks.push(at);
      return this.g.chars[c.charCodeAt(0) - FIRST] ?? "\uFFFD";
    });
    return { text, marks };
  }
}
