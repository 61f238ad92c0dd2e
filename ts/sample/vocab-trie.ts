// The vocabulary as a byte trie, for grammar masks: a grammar walks it once per token and
// drops a whole subtree the moment its prefix is impossible, instead of trying 262k tokens one
// by one. Nodes are stored flat in preorder (typed arrays), each with the index just past its
// subtree, so the walk is one loop that can skip a dead subtree in one step.
import type { Tokenizer } from "../tokenizer/index.ts";

export interface ByteTrie {
  /** Nodes; node i spells the bytes on the path to it, the last of which is byte[i]. */
  readonly size: number;
  readonly byte: Uint8Array;
  /** Depth of the node: 0 for the children of the (implicit) root. */
  readonly depth: Uint16Array;
  /** One past the last node of i's subtree (preorder). */
  readonly end: Int32Array;
  /** Token ids whose bytes end at node i: ids[first[i] .. first[i + 1]). */
  readonly first: Int32Array;
  readonly ids: Int32Array;
  /** The deepest node. */
  readonly maxDepth: number;
}

/** Builds the trie of `tokens` (ids with non-empty byte strings). */
export function buildTrie(tokens: readonly number[], bytesOf: (id: number) => Uint8Array,
): ByteTrie {
  // Keys are the bytes as latin1 strings: the engine's native string sort then orders them
  // lexicographically by byte, each key before every key it is a prefix of (preorder).
  const byKey = new Map<string, number[]>();
  for (const id of tokens) {
    const key = String.fromCharCode(...bytesOf(id));
    const list = byKey.get(key);
    if (list) list.push(id);
    else byKey.set(key, [id]);
  }
  const keys = [...byKey.keys()].sort();
  let capacity = 1024;
  let byte = new Uint8Array(capacity), depth = new Uint16Array(capacity);
  let end = new Int32Array(capacity), first = new Int32Array(capacity + 1);
  const ids = new Int32Array(tokens.length);
  const open: number[] = []; // open[d]: the node at depth d on the current path
  let size = 0, idCount = 0, prev = "", maxDepth = 0;
  const close = (toDepth: number) => {
    while (open.length > toDepth) end[open.pop()!] = size;
  };
  const grow = <T extends Uint8Array | Uint16Array | Int32Array>(a: T, n: number): T => {
    const g = new (a.constructor as new (n: number) => T)(n);
    g.set(a);
    return g;
  };
  for (const s of keys) {
    let lcp = 0;
    while (lcp < s.length && lcp < prev.length && s.charCodeAt(lcp) === prev.charCodeAt(lcp)) lcp++;
    close(lcp);
    for (let d = lcp; d < s.length; d++) {
      if (size + 1 >= capacity) {
        capacity *= 2;
        byte = grow(byte, capacity); depth = grow(depth, capacity); end = grow(end, capacity);
        first = grow(first, capacity + 1);
      }
      byte[size] = s.charCodeAt(d);
      depth[size] = d;
      first[size] = idCount;
      open.push(size++);
      maxDepth = Math.max(maxDepth, d + 1);
    }
    // The key's ids belong to the node that ends it, the last one opened: ids of a node are
    // ids[first[i] .. first[i + 1]), and first[] of the next node is written when it opens.
    for (const id of byKey.get(s)!) ids[idCount++] = id;
    first[size] = idCount;
    prev = s;
  }
  close(0);
  return { size, byte, depth, end, first, ids, maxDepth };
}

/** What a grammar needs to know about a vocabulary, computed once per tokenizer. */
export class GrammarVocab {
  private static readonly cache = new WeakMap<Tokenizer, GrammarVocab>();
  readonly bytes: Uint8Array[];
  readonly eog: Int32Array;
  readonly size: number;

  private constructor(tokenizer: Tokenizer) {
    this.size = tokenizer.vocabSize;
    this.bytes = Array.from({ length: this.size }, (_, id) => tokenizer.tokenBytes(id));
    const eog: number[] = [];
    for (let id = 0; id < this.size; id++) if (tokenizer.isEndOfGeneration(id)) eog.push(id);
    this.eog = Int32Array.from(eog);
  }

  static for(tokenizer: Tokenizer): GrammarVocab {
    let v = GrammarVocab.cache.get(tokenizer);
    if (!v) {
      v = new GrammarVocab(tokenizer);
      GrammarVocab.cache.set(tokenizer, v);
    }
    return v;
  }

  private tries = new Map<string, ByteTrie>();
  private bitmaps = new Map<string, Uint8Array>();

  /** The trie of the tokens `keep` accepts (built once per name). */
  trie(name: string, keep: (bytes: Uint8Array, id: number) => boolean): ByteTrie {
    let t = this.tries.get(name);
    if (!t) {
      const ids: number[] = [];
      for (let id = 0; id < this.size; id++) {
        if (this.bytes[id].length > 0 && keep(this.bytes[id], id)) ids.push(id);
      }
      t = buildTrie(ids, (id) => this.bytes[id]);
      this.tries.set(name, t);
    }
    return t;
  }

  /** 1 for each token `keep` accepts, by id (computed once per name). */
  bitmap(name: string, keep: (bytes: Uint8Array) => boolean): Uint8Array {
    let l = this.bitmaps.get(name);
    if (!l) {
      l = new Uint8Array(this.size);
      for (let id = 0; id < this.size; id++) {
        if (this.bytes[id].length > 0 && keep(this.bytes[id])) l[id] = 1;
      }
      this.bitmaps.set(name, l);
    }
    return l;
  }
}
