// Splitting special tokens out of the text before the tokenizer runs, as llama.cpp's
// tokenizer_st_partition does: for each special token, longest first, every occurrence in every
// still-raw fragment becomes a token fragment. User-defined tokens are always split out; control
// and unknown tokens only when parsing special tokens. A trie finds which special tokens occur in
// the text at all, so the exact (token-by-token) procedure runs only over those.
import { Attr, type Vocab } from "./vocab.ts";

export type Fragment =
  | { readonly kind: "text"; readonly start: number; readonly end: number }
  | { readonly kind: "token"; readonly id: number };

interface TrieNode {
  next: Map<number, TrieNode>;
  id: number; // -1 when no token ends here
}

const tries = new WeakMap<Vocab, TrieNode>();

function trieFor(vocab: Vocab): TrieNode {
  let root = tries.get(vocab);
  if (root) return root;
  root = { next: new Map(), id: -1 };
  for (const id of vocab.specialTokens) {
    const text = vocab.tokens[id];
    let node = root;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      let child = node.next.get(c);
      if (!child) {
        child = { next: new Map(), id: -1 };
        node.next.set(c, child);
      }
      node = child;
    }
    node.id = id;
  }
  tries.set(vocab, root);
  return root;
}

/** Special tokens that occur anywhere in `text`. */
function occurring(vocab: Vocab, text: string): Set<number> {
  const root = trieFor(vocab);
  const found = new Set<number>();
  for (let i = 0; i < text.length; i++) {
    let node = root.next.get(text.charCodeAt(i));
    for (let j = i + 1; node; j++) {
      if (node.id >= 0) found.add(node.id);
      if (j >= text.length) break;
      node = node.next.get(text.charCodeAt(j));
    }
  }
  return found;
}

// C isspace() in the "C" locale, as used for lstrip/rstrip.
function isCSpace(c: number): boolean {
  return c === 0x20 || (c >= 0x09 && c <= 0x0d);
}

/**
 * Whether control tokens are parsed: never, always, or where `(start, end)` (the occurrence's
 * span in the text) says so, e.g. in a chat template's own text but not in what the user typed.
 */
export type ParseSpecial = boolean | ((start: number, end: number) => boolean);

export function partition(vocab: Vocab, text: string, parseSpecial: ParseSpecial): Fragment[] {
  if (text.length === 0) return [];
  let frags: Fragment[] = [{ kind: "text", start: 0, end: text.length }];
  const present = occurring(vocab, text);
  if (present.size === 0) return frags;
  for (const id of vocab.specialTokens) {
    if (!present.has(id)) continue;
    const attr = vocab.attrs[id];
    const gated = (attr & (Attr.control | Attr.unknown)) !== 0;
    if (gated && parseSpecial === false) continue;
    const allowed = gated && typeof parseSpecial === "function" ? parseSpecial : null;
    const tok = vocab.tokens[id];
    const out: Fragment[] = [];
    for (const f of frags) {
      if (f.kind !== "text") {
        out.push(f);
        continue;
      }
      let start = f.start, from = f.start;
      const end = f.end;
      for (;;) {
        const m = text.indexOf(tok, from);
        if (m < 0 || m + tok.length > end) {
          if (start < end) out.push({ kind: "text", start, end });
          break;
        }
        if (allowed && !allowed(m, m + tok.length)) { // stays text
          from = m + 1;
          continue;
        }
        let leftEnd = m;
        if (attr & Attr.lstrip) {
          while (leftEnd > start && isCSpace(text.charCodeAt(leftEnd - 1))) leftEnd--;
        }
        if (leftEnd > start) out.push({ kind: "text", start, end: leftEnd });
        out.push({ kind: "token", id });
        start = m + tok.length;
        if (attr & Attr.rstrip) {
          while (start < end && isCSpace(text.charCodeAt(start))) start++;
        }
        from = start;
        if (start >= end) break;
      }
    }
    frags = out;
  }
  return frags;
}
