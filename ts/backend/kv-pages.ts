// The paged KV cache's bookkeeping, apart from any device (the CUDA backend's physical side is
// cuda-pages.ts on lib/cuda/vmm.zig; tests use a fake). A full-attention cache layer reserves the
// address range of its whole context for its keys and one for its values, and memory is mapped
// into them in granules (the driver's granularity, 2 MiB on current GPUs) only as positions are
// written: sequences of very different lengths share the card's memory, and no slot holds its whole
// context unless it reaches it. The addresses never move, so the kernels, the batch's table of
// caches and captured CUDA graphs are unchanged. This is the GPU analogue of the CPU's shared
// pages (docs/server.md, "Shared blocks"), as vAttention does it; sliding-window rings and the
// prefix cache's blocks stay plain allocations (small, and written whole).
//
// Granules are shared between slots: a granule wholly inside a prefix the prefix cache saved is
// sealed, and a slot restoring that prefix maps the same granule into its own range (adopt)
// instead of copying the rows, so n sequences on one long prompt hold its whole granules once.
// A granule counts how many ranges map it and its memory is released when none does; the
// prefix cache only names granules (a weak reference: it hands out one while some range still
// maps it, and copies from its own blocks otherwise), so its eviction never touches a holder.
// The GPU has no write fault, so every write path asks first (writeRows): a write into a granule
// another range maps too copies it into a fresh one, which is mapped in its place (copy-on-write
// by hand); a write into a sealed granule no other range maps unseals it (the cache's reference
// lapses) and writes in place.
//
// Out of memory never happens mid-step: the scheduler admits a sequence only when the granules
// it may still map, with those every running sequence may still map, fit what the pool can get
// (admitPages); otherwise it waits. A slot keeps what it mapped when its sequence ends (a next
// sequence with the same beginning continues in place); when a sequence needs the memory, free
// slots are emptied, the one free the longest first.
import { InferError } from "../errors.ts";
import type { KvLayer } from "./backend.ts";

/** The physical side: reserved ranges and granules of device memory mapped into them. */
export interface PhysicalPages {
  /** Bytes of a granule: every range, map and offset is a multiple of it. */
  readonly granule: number;
  /** Reserves `bytes` (a multiple of the granule) of address space; returns its address. */
  reserve(bytes: number): number;
  addressFree(address: number, bytes: number): void;
  /** A granule of fresh physical memory; its handle. Throws InferError out_of_memory. */
  create(): number;
  /** Maps the granule `handle` at `address` (a handle may be mapped at several addresses). */
  map(address: number, handle: number): void;
  /** Unmaps [address, address + bytes) once the device no longer reads it. */
  unmap(address: number, bytes: number): void;
  /** Copies mapped bytes device to device, in order with the writes queued before and after. */
  copy(dst: number, src: number, bytes: number): void;
  release(handle: number): void;
  /** Bytes the pool may still map: the device's free memory less what other buffers may need. */
  available(): number;
}

/**
 * Rows a cache maps past the last position written, at least: attention kernels load keys in
 * tiles of up to 128 rows, and a tile past the last position (masked) must still be mapped.
 */
export const ROW_PAD = 256;

/** A granule of physical memory, mapped in one range or shared by several. */
export class Granule {
  /** Ranges mapping it now; its memory is released when none does. */
  maps = 0;
  /** It holds whole positions of a saved prefix, which a prefix cache may hand to other slots. */
  sealed = false;
  constructor(readonly handle: number) {}
  /** Whether a prefix cache may still hand it out: mapped somewhere, not written since sealed. */
  get handable(): boolean { return this.sealed && this.maps > 0; }
}

/** A reserved range and the granules mapped at its start, in order. */
export class PagedRange {
  readonly granules: Granule[] = [];
  constructor(readonly address: number, readonly bytes: number) {}
}

/** What the pool needs of a cache layer: its rows, their sizes, and its two ranges. */
export interface PagedLayer {
  readonly cells: number;
  readonly kRowBytes: number;
  readonly vRowBytes: number;
  readonly pages: { readonly k: PagedRange; readonly v: PagedRange } | null;
  /** False where its bytes may not be mapped into another layer (a tq layer's anchored keys). */
  readonly shareable?: boolean;
}

/** Granules of one range a saved prefix sealed: `granules[i]` is granule `first + i`. */
export interface SealedRun {
  readonly first: number;
  readonly granules: readonly Granule[];
}

/** A layer's sealed granules, keys and values. */
export interface SealedGranules {
  readonly k: SealedRun;
  readonly v: SealedRun;
}

/** A prefix's sealed granules by their index in a layer's key and value ranges. */
export interface SealedLookup {
  k(index: number): Granule | undefined;
  v(index: number): Granule | undefined;
}

/**
 * What a slot restoring a prefix takes by reference: granules [first, end) of each range, and the
 * rows [rows[0], rows[1]) lying wholly inside both runs, which need no copy.
 */
export interface SharePlan {
  readonly k: { readonly first: number; readonly granules: readonly Granule[] };
  readonly v: { readonly first: number; readonly granules: readonly Granule[] };
  readonly rows: readonly [number, number];
}

/** The layer's paging, where it has one (another backend's layers have none). */
function paged(layer: KvLayer): PagedLayer | null {
  const l = layer as Partial<PagedLayer>;
  return l.pages ? l as PagedLayer : null;
}

/** The layer's paging where its granules may be shared with other slots. */
export function sharedPaging(layer: KvLayer): PagedLayer | null {
  const l = paged(layer);
  return l && l.shareable !== false && !layer.ring ? l : null;
}

/** Rows mapped for positions 0 .. rows - 1: rounded up to ROW_PAD, at most the layer's cells. */
export function paddedRows(rows: number, cells: number): number {
  return Math.min(cells, Math.ceil(Math.max(0, rows) / ROW_PAD) * ROW_PAD);
}

/** Granules [first, end) lying wholly inside bytes [from, to) of a range. */
export function wholeGranules(from: number, to: number, granule: number): [number, number] {
  const first = Math.ceil(from / granule), end = Math.floor(to / granule);
  return [first, Math.max(first, end)];
}

export class KvPagePool {
  /** Granules of memory live now (each once, however many ranges map it). */
  mapped = 0;
  /** One reserved granule where copy-on-write maps a fresh granule to fill it. */
  private scratch = 0;
  constructor(readonly phys: PhysicalPages) {}

  get granule(): number { return this.phys.granule; }
  get mappedBytes(): number { return this.mapped * this.phys.granule; }

  /** Granules `bytes` of a range take. */
  granules(bytes: number): number { return Math.ceil(bytes / this.phys.granule); }

  /** Reserves a range of at least `bytes`, nothing mapped. */
  reserve(bytes: number): PagedRange {
    const rounded = this.granules(Math.max(1, bytes)) * this.phys.granule;
    return new PagedRange(this.phys.reserve(rounded), rounded);
  }

  /** Unmaps all of a range and gives its address space back. */
  free(range: PagedRange): void {
    this.trim(range, 0);
    this.phys.addressFree(range.address, range.bytes);
  }

  /** Gives back the copy-on-write scratch address (the ranges are freed by their owners). */
  dispose(): void {
    if (this.scratch !== 0) this.phys.addressFree(this.scratch, this.phys.granule);
    this.scratch = 0;
  }

  /** Maps fresh granules at the range's start until its first `bytes` (at most all) are mapped. */
  ensure(range: PagedRange, bytes: number): void {
    const want = Math.min(this.granules(bytes), range.bytes / this.phys.granule);
    while (range.granules.length < want) {
      const g = this.fresh();
      try {
        this.phys.map(range.address + range.granules.length * this.phys.granule, g.handle);
      } catch (err) {
        this.drop(g);
        throw err;
      }
      range.granules.push(g);
    }
  }

  /** Unmaps the granules past the range's first `bytes`. */
  trim(range: PagedRange, bytes: number): void {
    const keep = this.granules(bytes);
    if (range.granules.length <= keep) return;
    const g = this.phys.granule;
    this.phys.unmap(range.address + keep * g, (range.granules.length - keep) * g);
    for (const dropped of range.granules.splice(keep)) this.drop(dropped);
  }

  /** A granule of fresh memory, counted as mapped once. */
  private fresh(): Granule {
    const g = new Granule(this.phys.create());
    g.maps = 1;
    this.mapped++;
    return g;
  }

  /** One mapping of `g` fewer; its memory goes when it was the last. */
  private drop(g: Granule): void {
    if (--g.maps > 0) return;
    g.sealed = false;
    this.phys.release(g.handle);
    this.mapped--;
  }

  /** Granules a paged layer takes to hold positions 0 .. rows - 1 (0 for a plain one). */
  layerGranules(layer: KvLayer, rows: number): number {
    const l = paged(layer);
    if (!l) return 0;
    const r = paddedRows(rows, layer.cells);
    return this.granules(r * l.kRowBytes) + this.granules(r * l.vRowBytes);
  }

  /** Granules the layers take to hold positions 0 .. rows - 1. */
  need(layers: readonly KvLayer[], rows: number): number {
    return layers.reduce((n, l) => n + this.layerGranules(l, rows), 0);
  }

  /** Sums `count` over the layers' ranges. */
  private overRanges(layers: readonly KvLayer[],
    count: (r: PagedRange, rowBytes: number, cells: number) => number): number {
    let n = 0;
    for (const layer of layers) {
      const l = paged(layer);
      if (!l?.pages) continue;
      n += count(l.pages.k, l.kRowBytes, l.cells) + count(l.pages.v, l.vRowBytes, l.cells);
    }
    return n;
  }

  /** Granules mapped for the layers now, shared ones included. */
  held(layers: readonly KvLayer[]): number {
    return this.overRanges(layers, (r) => r.granules.length);
  }

  /** Granules mapped for the layers that no other range maps. */
  owned(layers: readonly KvLayer[]): number {
    return this.overRanges(layers, (r) => r.granules.filter((g) => g.maps === 1).length);
  }

  /**
   * Splits the granules the layers map by what a sequence writing positions `from` .. rows - 1
   * does with them: kept as they are (their own among the first `need(layers, rows)`, and shared
   * ones wholly below `from`), or leaving: given back (past `rows`; or from the first shared one
   * wholly past `from` on, unshareFrom) or, shared and written into, copied first (the copy is a
   * new granule). `freed`: the leaving granules no other range maps, whose memory comes back.
   */
  private split(layers: readonly KvLayer[], from: number, rows: number):
    { kept: number; freed: number; leaving: Granule[] } {
    let kept = 0, freed = 0;
    const leaving: Granule[] = [];
    this.overRanges(layers, (r, rowBytes, cells) => {
      const n = this.granules((rows === 0 ? 0 : paddedRows(rows, cells)) * rowBytes);
      const past = Math.ceil(from * rowBytes / this.granule);
      let cut = r.granules.findIndex((g, i) => i >= past && g.maps > 1);
      if (cut < 0) cut = r.granules.length;
      for (const [i, g] of r.granules.entries()) {
        const given = i >= n || i >= cut;
        if (!given && (g.maps === 1 || (i + 1) * this.granule <= from * rowBytes)) kept++;
        else {
          leaving.push(g);
          if (given && g.maps === 1) freed++;
        }
      }
      return 0;
    });
    return { kept, freed, leaving };
  }

  /** Granules of the first `need(layers, rows)` kept as they are when writing from `from` on. */
  kept(layers: readonly KvLayer[], from: number, rows: number): number {
    return this.split(layers, from, rows).kept;
  }

  /** Granules whose memory comes back when the layers start writing `from` .. rows - 1. */
  freed(layers: readonly KvLayer[], from: number, rows: number): number {
    return this.split(layers, from, rows).freed;
  }

  /**
   * Granules emptying each of `slots` gives back, emptied in order: those no range outside the
   * ones emptied so far maps (a granule two of them share comes back with the second). `admitted`:
   * the slot a sequence writing `from` .. rows - 1 starts in, whose mappings of the granules it
   * gives back or copies leave too.
   */
  reclaimable(slots: readonly (readonly KvLayer[])[],
    admitted?: { layers: readonly KvLayer[]; from: number; rows: number }): number[] {
    const seen = new Map<Granule, number>();
    if (admitted) {
      for (const g of this.split(admitted.layers, admitted.from, admitted.rows).leaving) {
        seen.set(g, (seen.get(g) ?? 0) + 1);
      }
    }
    return slots.map((layers) => {
      let freed = 0;
      this.overRanges(layers, (r) => {
        for (const g of r.granules) {
          const n = (seen.get(g) ?? 0) + 1;
          seen.set(g, n);
          if (n === g.maps) freed++;
        }
        return 0;
      });
      return freed;
    });
  }

  /** Maps what a write of positions up to rows - 1 needs. */
  ensureRows(layer: KvLayer, rows: number): void {
    const l = paged(layer);
    if (!l?.pages) return;
    const r = paddedRows(rows, l.cells);
    this.ensure(l.pages.k, r * l.kRowBytes);
    this.ensure(l.pages.v, r * l.vRowBytes);
  }

  /** Unmaps what positions from `rows` on take (rows 0: everything). */
  trimRows(layer: KvLayer, rows: number): void {
    const l = paged(layer);
    if (!l?.pages) return;
    const r = rows === 0 ? 0 : paddedRows(rows, l.cells);
    this.trim(l.pages.k, r * l.kRowBytes);
    this.trim(l.pages.v, r * l.vRowBytes);
  }

  /**
   * A slot about to write positions from `from` on gives back, instead of copying later, the
   * shared granules lying wholly past `from` (their bytes are of a prefix it no longer holds),
   * and with each of them what follows it in its range.
   */
  unshareFrom(layer: KvLayer, from: number): void {
    const l = paged(layer);
    if (!l?.pages) return;
    for (const [r, rowBytes] of [[l.pages.k, l.kRowBytes], [l.pages.v, l.vRowBytes]] as const) {
      const first = Math.ceil(from * rowBytes / this.granule);
      const i = r.granules.findIndex((g, n) => n >= first && g.maps > 1);
      if (i >= 0) this.trim(r, i * this.granule);
    }
  }

  /** Indices of the range's granules that bytes [from, to) touch and that exist. */
  private touched(r: PagedRange, from: number, to: number): [number, number] {
    if (to <= from) return [0, 0];
    return [Math.floor(from / this.granule), Math.min(r.granules.length, this.granules(to))];
  }

  /** Whether a write of positions from .. to - 1 would copy a shared granule first. */
  writeCopies(layer: KvLayer, from: number, to: number): boolean {
    const l = paged(layer);
    if (!l?.pages) return false;
    return this.sharesRows(l.pages.k, l.kRowBytes, from, to) || this.sharesRows(l.pages.v, l.vRowBytes, from, to);
  }

  /**
   * Makes positions from .. to - 1 writable: maps what they need, gives the layer its own copy
   * of every granule they touch that another range maps too, and unseals the rest they touch.
   */
  writeRows(layer: KvLayer, from: number, to: number): void {
    const l = paged(layer);
    if (!l?.pages) return;
    this.ensureRows(layer, to);
    this.ownRows(l.pages.k, l.kRowBytes, from, to);
    this.ownRows(l.pages.v, l.vRowBytes, from, to);
  }

  /** Whether rows from .. to - 1 of a range touch a granule another range maps too. */
  private sharesRows(r: PagedRange, rowBytes: number, from: number, to: number): boolean {
    const [a, b] = this.touched(r, from * rowBytes, to * rowBytes);
    for (let i = a; i < b; i++) if (r.granules[i].maps > 1) return true;
    return false;
  }

  /** The range's own copy of every granule rows from .. to - 1 touch, unsealed. */
  private ownRows(r: PagedRange, rowBytes: number, from: number, to: number): void {
    const [a, b] = this.touched(r, from * rowBytes, to * rowBytes);
    for (let i = a; i < b; i++) {
      if (r.granules[i].maps > 1) this.copyOnWrite(r, i);
      else r.granules[i].sealed = false;
    }
  }

  /** Replaces granule `index` of the range by a fresh one holding the same bytes. */
  private copyOnWrite(r: PagedRange, index: number): void {
    const size = this.granule, at = r.address + index * size;
    if (this.scratch === 0) this.scratch = this.phys.reserve(size);
    const g = this.fresh();
    try {
      this.phys.map(this.scratch, g.handle);
    } catch (err) {
      this.drop(g);
      throw err;
    }
    this.phys.copy(this.scratch, at, size);
    this.phys.unmap(at, size);
    const old = r.granules[index];
    r.granules[index] = g;
    this.drop(old);
    g.maps++;
    this.phys.map(at, g.handle);
    this.drop(g); // the scratch mapping goes; the range's stays
    this.phys.unmap(this.scratch, size);
  }

  /**
   * Seals the granules of a slot's layer whose last byte lies in positions from .. to - 1 (all
   * earlier positions hold the same prefix): a prefix cache names them for the block that ends
   * at `to`. Null where the layer's granules are not shared.
   */
  seal(layer: KvLayer, from: number, to: number): SealedGranules | null {
    const l = sharedPaging(layer);
    if (!l?.pages) return null;
    const run = (r: PagedRange, rowBytes: number): SealedRun => {
      const first = Math.floor(from * rowBytes / this.granule);
      const end = Math.min(r.granules.length, Math.floor(to * rowBytes / this.granule));
      const granules = r.granules.slice(first, Math.max(first, end));
      for (const g of granules) g.sealed = true;
      return { first, granules };
    };
    return { k: run(l.pages.k, l.kRowBytes), v: run(l.pages.v, l.vRowBytes) };
  }

  /**
   * What a slot's layer holding positions 0 .. held - 1 takes by reference of a prefix of
   * `positions` positions, whose sealed granules `k(i)` and `v(i)` name: for each range the run
   * of whole granules from the first past `held`, as far as each is still handable.
   */
  sharePlan(layer: KvLayer, held: number, positions: number,
    sealed: SealedLookup): SharePlan | null {
    const l = sharedPaging(layer);
    if (!l?.pages || positions <= held) return null;
    const run = (rowBytes: number, at: (i: number) => Granule | undefined) => {
      const [first, end] = wholeGranules(held * rowBytes, positions * rowBytes, this.granule);
      const granules: Granule[] = [];
      for (let i = first; i < end; i++) {
        const g = at(i);
        if (!g?.handable) break;
        granules.push(g);
      }
      return { first, granules };
    };
    const k = run(l.kRowBytes, sealed.k), v = run(l.vRowBytes, sealed.v);
    if (k.granules.length === 0 && v.granules.length === 0) return null;
    // Rows wholly inside both runs need no copy.
    const inside = (r: { first: number; granules: readonly Granule[] }, rowBytes: number) =>
      [Math.ceil(r.first * this.granule / rowBytes),
        Math.floor((r.first + r.granules.length) * this.granule / rowBytes)];
    const [ka, kb] = inside(k, l.kRowBytes), [va, vb] = inside(v, l.vRowBytes);
    const a = Math.max(ka, va), b = Math.min(kb, vb);
    return { k, v, rows: b > a ? [a, b] : [held, held] };
  }

  /**
   * Maps a plan's granules into the layer in place of its own (after the rows outside the plan
   * were copied in: a copy into a row that reaches into an adopted granule lands in the granule
   * it replaces), then what positions 0 .. positions - 1 need beyond them.
   */
  adopt(layer: KvLayer, plan: SharePlan, positions: number): void {
    const l = paged(layer)!;
    this.adoptRun(l.pages!.k, plan.k.first, plan.k.granules);
    this.adoptRun(l.pages!.v, plan.v.first, plan.v.granules);
    this.ensureRows(layer, positions);
  }

  private adoptRun(r: PagedRange, first: number, granules: readonly Granule[]): void {
    const size = this.granule;
    this.ensure(r, first * size);
    for (const [n, g] of granules.entries()) {
      const i = first + n, at = r.address + i * size;
      if (r.granules[i] === g) continue;
      if (i < r.granules.length) {
        this.phys.unmap(at, size);
        this.drop(r.granules[i]);
      }
      g.maps++;
      r.granules[i] = g;
      try {
        this.phys.map(at, g.handle);
      } catch (err) {
        // Unmapped, it may not stay in the range, nor what follows it.
        for (const dropped of r.granules.splice(i)) this.drop(dropped);
        if (r.granules.length > i) this.phys.unmap(at + size, (r.granules.length - i - 1) * size);
        throw err;
      }
    }
  }

  /** Granules mapped in more than one range now (memory that sharing saves, once each). */
  shared(layers: readonly KvLayer[]): number {
    const seen = new Set<Granule>();
    this.overRanges(layers, (r) => {
      for (const g of r.granules) if (g.maps > 1) seen.add(g);
      return 0;
    });
    return seen.size;
  }

  /** Granules the pool may still map. */
  availableGranules(): number {
    return Math.max(0, Math.floor(this.phys.available() / this.phys.granule));
  }
}

/** A running sequence's slot as admission sees it. */
export interface RunningPages {
  /** Granules mapped for the slot now that it keeps as it writes on. */
  readonly held: number;
  /** The granules it takes at the furthest position its sequence may write. */
  readonly claim: number;
}

/** What admission weighs (every figure in granules). */
export interface AdmissionInput {
  /** What the sequence takes at the furthest position it may write. */
  readonly need: number;
  /** Of those, what its slot must newly get: need less what the slot keeps as it is. */
  readonly grows: number;
  readonly running: readonly RunningPages[];
  /** What emptying each other free slot gives back, in the order they are to be emptied. */
  readonly free: readonly number[];
  /** What the pool can get now (what the slot gives back past its reach included). */
  readonly available: number;
  /** What the pool could have with every slot empty: available and all it maps, each once. */
  readonly capacity: number;
}

export type Admission =
  | { readonly kind: "admit"; readonly reclaim: number }
  | { readonly kind: "wait" }
  | { readonly kind: "never"; readonly need: number; readonly capacity: number };

/**
 * Whether a sequence may start in a slot now, beside the running sequences' slots and the other
 * free slots (emptied the one free the longest first). "admit" says how many of `free` (from the
 * front) to empty first; "wait": not while the running sequences may still map their claims;
 * "never": not even with every other slot empty.
 */
export function admitPages(a: AdmissionInput): Admission {
  if (a.need > a.capacity) return { kind: "never", need: a.need, capacity: a.capacity };
  let outstanding = 0;
  for (const s of a.running) outstanding += Math.max(0, s.claim - s.held);
  let room = a.available - outstanding, reclaim = 0;
  while (a.grows > room && reclaim < a.free.length) room += a.free[reclaim++];
  if (a.grows > room) return { kind: "wait" };
  return { kind: "admit", reclaim };
}

/** The error of a sequence that can never fit the pool (the server's 400, a context overflow). */
export function neverFits(need: number, capacity: number, granule: number): InferError {
  const mib = (g: number) => Math.ceil(g * granule / 2 ** 20);
  return new InferError("context_overflow", `the request's KV cache needs ${mib(need)} MiB of GPU ` +
    `memory, and at most ${mib(capacity)} MiB can be had: lower max_tokens or the prompt`);
}
