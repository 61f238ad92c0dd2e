// Byte-level BPE, as llama.cpp's llm_tokenizer_bpe_session: pre-tokenize, map each pre-token's
// UTF-8 bytes to GPT-2's printable characters, then merge adjacent symbols by merge rank (lowest
// first; ties: leftmost) and emit each final symbol's token.
import { Heap } from "./heap.ts";
import { preSplit, type PreTokenizer } from "./pretokenize.ts";
import { gpt2ByteToChar, utf8Bytes } from "./unicode.ts";
import type { Vocab } from "./vocab.ts";

interface Bigram {
  left: number;
  right: number;
  text: string;
  rank: number;
}

const bigramFirst = (a: Bigram, b: Bigram) =>
  a.rank < b.rank || (a.rank === b.rank && a.left < b.left);

export class BpeModel {
  private readonly ranks = new Map<string, number>();

  constructor(private readonly vocab: Vocab, readonly pre: PreTokenizer,
              merges: readonly string[]) {
    // "a b": the split is at the first space after the first character (as llama.cpp);
    // the first occurrence of a pair keeps its rank.
    for (let i = 0; i < merges.length; i++) {
      const m = merges[i];
      const sp = m.indexOf(" ", 1);
      const key = sp < 0 ? " " : `${m.slice(0, sp)} ${m.slice(sp + 1)}`;
      if (!this.ranks.has(key)) this.ranks.set(key, i);
    }
  }

  tokenize(text: string, out: number[]): void {
    const b2c = gpt2ByteToChar();
    for (const word of preSplit(this.pre, text)) {
      let encoded = "";
      for (const byte of utf8Bytes(word)) encoded += b2c[byte];
      this.tokenizeWord(encoded, out);
    }
  }

  private tokenizeWord(word: string, out: number[]): void {
    const ids = this.vocab.tokenToId();
    if (this.pre.ignoreMerges) {
      const id = ids.get(word);
      if (id !== undefined) {
        out.push(id);
        return;
      }
    }
    // Every GPT-2 byte character is a single UTF-16 unit, so symbols start one per unit.
    const n = word.length;
    const sym: string[] = Array.from(word);
    const prev = Int32Array.from({ length: n }, (_, i) => i - 1);
    const next = Int32Array.from({ length: n }, (_, i) => (i + 1 < n ? i + 1 : -1));
    const queue = new Heap<Bigram>(bigramFirst);
    const tryAdd = (left: number, right: number) => {
      if (left < 0 || right < 0) return;
      const rank = this.ranks.get(`${sym[left]} ${sym[right]}`);
      if (rank === undefined) return;
      queue.push({ left, right, text: sym[left] + sym[right], rank });
    };
    for (let i = 1; i < n; i++) tryAdd(i - 1, i);
    for (let b = queue.pop(); b !== undefined; b = queue.pop()) {
      const l = b.left;
      const r = b.right;
      if (sym[l] === "" || sym[r] === "" || sym[l] + sym[r] !== b.text) continue;
      sym[l] = b.text;
      sym[r] = "";
      next[l] = next[r];
      if (next[r] >= 0) prev[next[r]] = l;
      tryAdd(prev[l], l);
      tryAdd(l, next[l]);
    }
    for (let i = 0; i !== -1; i = next[i]) {
      const id = ids.get(sym[i]);
      if (id !== undefined) {
        out.push(id);
        continue;
      }
      // Not in the vocabulary: llama.cpp looks each UTF-8 byte of the piece up as a
      // one-character token and drops those it cannot find.
      for (const byte of utf8Bytes(sym[i])) {
        const b = byte < 0x80 ? ids.get(String.fromCharCode(byte)) : undefined;
        if (b !== undefined) out.push(b);
      }
    }
  }
}
