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

interface Guard {
  readonly pattern: RegExp | null;
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
  const escape = (t: string) => t.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  g = {
    pattern: kept.length === 0 ? null
      : new RegExp(kept.sort((a, b) => b.length - a.length).map(escape).join("|"), "g"),
    chars, of: new Map(chars.map((c, i) => [c, String.fromCharCode(FIRST + i)])),
  };
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
    const p = this.g.pattern;
    return p === null ? clean : clean.replace(p, (t) => this.g.of.get(t[0])! + t.slice(1));
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
