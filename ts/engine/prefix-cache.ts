// The prefix cache: keys and values of token blocks, shared across requests, so that a prompt
// beginning like an earlier one (a system prompt, the previous turns of a chat) copies those
// positions instead of evaluating them again. Every row is computed with the single-token
// arithmetic, so a position's keys and values depend only on the tokens up to it: a copied
// block is exactly what evaluating it again would give.
//
// A block holds `blockTokens` consecutive positions of every layer, as full rows (not a ring).
// Block j of a sequence is keyed by its parent block (j - 1) and its own tokens, so a lookup
// walks from the first block and stops at the first miss. Blocks are saved from a sequence's
// slot right after the step that completes them, while a sliding-window ring still holds them,
// and restored into a slot's layers at their positions (ring cell p % cells). Storage is a pool
// of blocks allocated on demand up to `bytesMax` and then reused: when it is full the least
// recently used block with no children is evicted (a parent is never dropped before its
// children, which would strand them).
//
// Where the backend has a block store (KvBlockStore: the CPU on Linux, cpu-kv-share.ts), a
// sequence holds the blocks of its full-attention layers by reference instead of a copy: restoring
// a block maps it over the slot's rows, and a block a sequence saves is mapped back over the rows
// it was read from, so n sequences with one 1,000-token prompt hold those rows once. A write to a
// held row (a slot reused for another prompt) gives the writer its own copy of that page; before
// a block's storage is reused the store gives every holder its own copy. Rings (sliding-window
// layers, overwritten as the window moves) and rows not on page boundaries are copied as before.
//
// Where the backend pages its full-attention layers (KvPagePool: the CUDA backend's paged cache,
// ts/backend/kv-pages.ts), a block names the granules of the saving slot's layers that it
// completes (sealed: each wholly inside the chain's positions up to the block's end). A slot
// restoring a chain maps the named granules that still live in some slot into its own ranges
// instead of copying their rows, so n sequences on one long prompt hold its whole granules once;
// the rows of a granule not whole (the end of the prefix, and every row where the prefix covers
// no whole granule) are copied from the blocks as before. The blocks keep their copies: a named
// granule no slot maps any more is gone, and the block's rows are there to copy. The pool copies
// a shared granule before a write lands in it (copy-on-write by hand, as the GPU has no write
// fault), so evicting a block, or a holder writing, never changes another holder's rows.
import {
  kvBytes, kvTypesOf, type Backend, type KvBlockStore, type KvLayer, type KvType, type KvTypes,
} from "../backend/backend.ts";
import type { Granule, KvPagePool, SealedGranules, SealedLookup } from "../backend/kv-pages.ts";
import { InferError } from "../errors.ts";
import type { KvShape } from "../model/model.ts";
import type { Slot } from "./kv-cache.ts";

export interface PrefixCacheOptions {
  /** Positions per block (default 32). */
  readonly blockTokens?: number;
  /** Memory for blocks at most (default 128 MiB). */
  readonly bytesMax?: number;
  /** Hand sequences the blocks by reference where the backend can (default true); false: copies. */
  readonly share?: boolean;
}

interface Block {
  readonly id: number;
  readonly key: string;
  readonly parent: Block | null;
  readonly layers: readonly KvLayer[];
  children: number;
  evicted: boolean;
  /** Per layer, the slot's granules this block completed (kv-pages.ts seal); null: none named. */
  granules: (SealedGranules | null)[] | null;
}

/** Where a sequence's chain of saved blocks ends; kept by the sequence between steps. */
export interface PrefixChain {
  /** Blocks of the sequence saved or restored so far (positions 0 .. blocks · blockTokens). */
  blocks: number;
  last: Block | null;
}

export interface PrefixCacheStats {
  readonly blocks: number;
  readonly bytes: number;
  readonly bytesMax: number;
  /** Prompt positions copied from the cache, and looked up, since the start. */
  readonly restoredTokens: number;
  readonly lookedUpTokens: number;
  /** Rows of blocks sequences hold by reference now (summed over layers); 0 where all are copies. */
  readonly sharedRows: number;
  /** Paged caches: granules mapped in more than one slot now (each once); 0 without a pool. */
  readonly sharedGranules: number;
}

export class PrefixCache {
  readonly blockTokens: number;
  private readonly blockBytes: number;
  private readonly blocksMax: number;
  /** Every live block by key, least recently used first (a Map keeps insertion order). */
  private readonly byKey = new Map<string, Block>();
  private readonly type: KvTypes;
  private readonly store: KvBlockStore | null;
  /** The backend's page pool, through which blocks name granules that slots share. */
  private readonly pages: KvPagePool | null;
  /** The slots' layers, whose shared granules stats() counts. */
  private readonly slotLayers = new Set<readonly KvLayer[]>();
  private allocated = 0;
  private nextId = 1;
  private restored = 0;
  private lookedUp = 0;

  constructor(private readonly be: Backend, private readonly shapes: readonly KvShape[],
    types: KvType | KvTypes, o: PrefixCacheOptions = {}) {
    const type = this.type = kvTypesOf(types);
    if (!be.copyKv) {
      throw new InferError("unsupported", `the ${be.name} backend cannot copy KV rows`);
    }
    this.blockTokens = o.blockTokens ?? 32;
    this.blockBytes = shapes.reduce((sum, s) =>
      sum + kvBytes(type.k, s.kvHeads * s.headDim, s.headDim) + kvBytes(type.v, s.kvHeads * s.headDim, s.headDim), 0) * this.blockTokens;
    this.blocksMax = Math.floor((o.bytesMax ?? 128 << 20) / this.blockBytes);
    if (!(this.blockTokens >= 1) || this.blocksMax < 1) {
      throw new InferError("invalid_argument", `a prefix cache of ${o.bytesMax} bytes holds no ` +
        `block of ${this.blockTokens} positions (${this.blockBytes} bytes)`);
    }
    const share = o.share ?? true;
    this.pages = share ? be.kvPages?.() ?? null : null;
    this.store = share && !this.pages && be.kvBlockStore
      ? be.kvBlockStore(shapes, type, this.blockTokens, this.blocksMax) : null;
  }

  stats(): PrefixCacheStats {
    return { blocks: this.byKey.size, bytes: this.allocated * this.blockBytes,
      bytesMax: this.blocksMax * this.blockBytes, restoredTokens: this.restored,
      lookedUpTokens: this.lookedUp, sharedRows: this.store?.sharedRows ?? 0,
      sharedGranules: this.pages?.shared([...this.slotLayers].flat()) ?? 0 };
  }

  private key(parent: Block | null, tokens: ArrayLike<number>, block: number): string {
    const b = this.blockTokens, ids: number[] = [];
    for (let i = block * b; i < (block + 1) * b; i++) ids.push(tokens[i]);
    return `${parent?.id ?? 0}:${ids.join(",")}`;
  }

  /**
   * Copies the longest cached prefix of `prompt` (whole blocks, fewer than prompt.length
   * positions: the last prompt token is always evaluated, for its logits) into `layers`, past
   * the `held` positions they already hold of it (a slot continued in place): nothing when the
   * blocks reach no further, else the full layers from there on and the rings whole. Returns the
   * chain for the sequence to extend; max(held, blocks · blockTokens) positions are in the slot.
   */
  restore(prompt: readonly number[], layers: readonly KvLayer[], held = 0): PrefixChain {
    const found: Block[] = [];
    const usable = Math.floor((prompt.length - 1) / this.blockTokens);
    let parent: Block | null = null;
    for (let j = 0; j < usable; j++) {
      const block = this.byKey.get(this.key(parent, prompt, j));
      if (!block) break;
      found.push(block);
      parent = block;
    }
    this.lookedUp += prompt.length;
    // Most recently used last, the first block last of all: parents outlive their children.
    for (let j = found.length - 1; j >= 0; j--) this.touch(found[j]);
    const chain = { blocks: found.length, last: found.at(-1) ?? null };
    const positions = found.length * this.blockTokens;
    if (positions <= held) return chain;
    this.restored += positions - held;
    this.slotLayers.add(layers);
    for (let i = 0; i < layers.length; i++) {
      const dst = layers[i];
      // A ring only needs (and holds) its last `cells` positions; a full layer keeps what it held.
      const from = dst.ring ? Math.max(0, positions - dst.cells) : held;
      const plan = this.pages?.sharePlan(dst, held, positions, sealedOf(found, i)) ?? null;
      const [skipFrom, skipTo] = plan?.rows ?? [positions, positions];
      for (let j = Math.floor(from / this.blockTokens); j < found.length; j++) {
        const start = Math.max(from, j * this.blockTokens), end = (j + 1) * this.blockTokens;
        if (start === j * this.blockTokens && this.hand(found[j].layers[i], dst, start)) continue;
        // Rows inside the granules the plan maps are not copied.
        for (const [a, b] of [[start, Math.min(end, skipFrom)], [Math.max(start, skipTo), end]]) {
          if (b > a) this.transfer(dst, found[j].layers[i], j * this.blockTokens, a, b - a, true);
        }
      }
      if (plan) this.pages!.adopt(dst, plan, positions);
    }
    return chain;
  }

  /**
   * Saves the sequence's blocks that are complete among the slot's positions and not saved yet,
   * reading them from its layers. A ring holds a position until one `cells` further on is
   * written: the slot's reach, which after a rewind lies past its length, says how far that went.
   */
  save(chain: PrefixChain, slot: Slot): void {
    const b = this.blockTokens, layers = slot.cache.layers;
    while ((chain.blocks + 1) * b <= slot.length) {
      const j = chain.blocks, start = j * b;
      if (chain.last?.evicted) return; // the chain was broken: its descendants would be unreachable
      if (layers.some((l) => l.ring && start < slot.reach - l.cells)) return; // overwritten already
      const key = this.key(chain.last, slot.history, j);
      let block = this.byKey.get(key);
      if (block) this.touch(block);
      else {
        const storage = this.storage(chain.last);
        if (!storage) return;
        for (let i = 0; i < layers.length; i++) {
          this.transfer(layers[i], storage[i], start, start, b, false);
        }
        block = { id: this.nextId++, key, parent: chain.last, layers: storage, children: 0,
          evicted: false, granules: null };
        if (chain.last) chain.last.children++;
        this.byKey.set(key, block);
      }
      // The slot now holds the block by reference instead of its own copy of the same rows.
      for (let i = 0; i < layers.length; i++) this.hand(block.layers[i], layers[i], start);
      if (this.pages) this.name(block, layers, start);
      chain.last = block;
      chain.blocks++;
    }
  }

  /** Shares a whole block's rows into a slot's full layer at `position`; false: copy them. */
  private hand(block: KvLayer, slot: KvLayer, position: number): boolean {
    return !slot.ring && this.store !== null &&
      this.store.share(block, 0, slot, position, this.blockTokens);
  }

  /**
   * Names the slot's granules the block completes, where it names none yet or those it named
   * can no longer be handed out (released, or written since).
   */
  private name(block: Block, layers: readonly KvLayer[], start: number): void {
    this.slotLayers.add(layers);
    const end = start + this.blockTokens;
    const stale = (g: SealedGranules | null) =>
      g !== null && [...g.k.granules, ...g.v.granules].some((x) => !x.handable);
    if (block.granules && !block.granules.some(stale)) return;
    block.granules = layers.map((l, i) => {
      const had = block.granules?.[i] ?? null;
      return had && !stale(had) ? had : this.pages!.seal(l, start, end);
    });
  }

  private touch(block: Block): void {
    this.byKey.delete(block.key);
    this.byKey.set(block.key, block);
  }

  /** Storage for a new block: a new allocation, or an evicted leaf other than `parent`. */
  private storage(parent: Block | null): readonly KvLayer[] | null {
    if (this.allocated < this.blocksMax) {
      if (this.store) return this.store.block(this.allocated++);
      this.allocated++;
      return this.shapes.map((s) =>
        this.be.kvLayer(this.blockTokens, s.kvHeads, s.headDim, this.type, false));
    }
    for (const block of this.byKey.values()) {
      if (block.children > 0 || block === parent) continue;
      this.byKey.delete(block.key);
      block.evicted = true;
      if (block.parent) block.parent.children--;
      this.store?.detach(block.layers);
      block.granules = null; // the slots mapping them keep them; the storage is another block's now
      return block.layers;
    }
    return null;
  }

  /**
   * Copies positions position .. position + count - 1 between a slot's layer (position p in
   * cell p, or p % cells in a ring, wrapping) and a block starting at position `blockStart`.
   */
  private transfer(slot: KvLayer, block: KvLayer, blockStart: number, position: number,
    count: number, toSlot: boolean): void {
    const end = position + count;
    for (let p = position; p < end;) {
      const cell = slot.ring ? p % slot.cells : p;
      const n = Math.min(end - p, slot.cells - cell);
      if (toSlot) this.be.copyKv!(block, p - blockStart, slot, cell, n);
      else this.be.copyKv!(slot, cell, block, p - blockStart, n);
      p += n;
    }
  }
}

/** The granules a chain of blocks names for layer `i`, by their index in the layer's ranges. */
function sealedOf(chain: readonly Block[], i: number): SealedLookup {
  const k = new Map<number, Granule>(), v = new Map<number, Granule>();
  for (const block of chain) {
    const g = block.granules?.[i];
    if (!g) continue;
    g.k.granules.forEach((x, n) => k.set(g.k.first + n, x));
    g.v.granules.forEach((x, n) => v.set(g.v.first + n, x));
  }
  return { k: (index) => k.get(index), v: (index) => v.get(index) };
}
