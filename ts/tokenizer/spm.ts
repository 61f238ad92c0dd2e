// SentencePiece (BPE-by-score) tokenization, as llama.cpp's llm_tokenizer_spm_session: start
// from single characters, repeatedly merge the adjacent pair whose concatenation is the
// highest-scoring vocabulary entry (ties: leftmost), and emit each final piece as its token or,
// when the piece is not in the vocabulary, as byte tokens <0xXX> (byte fallback).
import { InferError } from "../errors.ts";
import { Heap } from "./heap.ts";
import { utf8Bytes } from "./unicode.ts";
import type { Vocab } from "./vocab.ts";

interface Bigram {
  left: number;
  right: number;
  score: number;
  size: number; // length of the merged text when queued; a mismatch later means it is stale
}

const bigramFirst = (a: Bigram, b: Bigram) =>
  a.score > b.score || (a.score === b.score && a.left < b.left);

const HEX = "0123456789ABCDEF";

/** The token for one byte: <0xXX>, else the byte itself as a one-character token. */
export function byteToken(vocab: Vocab, byte: number): number {
  const ids = vocab.tokenToId();
  const id = ids.get(`<0x${HEX[byte >> 4]}${HEX[byte & 15]}>`) ??
    (byte < 0x80 ? ids.get(String.fromCharCode(byte)) : undefined);
  if (id === undefined) {
    throw new InferError("bad_model", `vocabulary has no byte token for 0x${byte.toString(16)}`);
  }
  return id;
}

/** Tokenize one raw-text fragment whose spaces are already escaped to U+2581. */
export function spmTokenize(vocab: Vocab, text: string, out: number[]): void {
  if (text.length === 0) return;
  const ids = vocab.tokenToId();
  // Symbols are spans of `text`, one per code point to begin with, kept in a linked list.
  const start: number[] = [];
  const len: number[] = [];
  for (let i = 0; i < text.length;) {
    const c = text.charCodeAt(i);
    const w = c >= 0xd800 && c <= 0xdbff && i + 1 < text.length ? 2 : 1;
    start.push(i);
    len.push(w);
    i += w;
  }
  const n = start.length;
  const prev = Int32Array.from({ length: n }, (_, i) => i - 1);
  const next = Int32Array.from({ length: n }, (_, i) => (i + 1 < n ? i + 1 : -1));
  const queue = new Heap<Bigram>(bigramFirst);

  const tryAdd = (left: number, right: number) => {
    if (left < 0 || right < 0) return;
    const size = len[left] + len[right];
    const id = ids.get(text.substr(start[left], size));
    if (id === undefined) return;
    queue.push({ left, right, score: vocab.scores[id], size });
  };

  for (let i = 1; i < n; i++) tryAdd(i - 1, i);
  for (let b = queue.pop(); b !== undefined; b = queue.pop()) {
    const l = b.left;
    const r = b.right;
    if (len[l] === 0 || len[r] === 0 || len[l] + len[r] !== b.size) continue;
    len[l] += len[r];
    len[r] = 0;
    next[l] = next[r];
    if (next[r] >= 0) prev[next[r]] = l;
    tryAdd(prev[l], l);
    tryAdd(l, next[l]);
  }

  for (let i = 0; i !== -1; i = next[i]) {
    const piece = text.substr(start[i], len[i]);
    const id = ids.get(piece);
    if (id !== undefined) {
      out.push(id);
      continue;
    }
    // A piece that is not a token is always a single unmerged character: emit its bytes.
    for (const byte of utf8Bytes(piece)) out.push(byteToken(vocab, byte));
  }
}
