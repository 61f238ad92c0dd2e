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
  /** Maps the granule `handle` at `address`. */
  map(address: number, handle: number): void;
  /** Unmaps [address, address + bytes) once the device no longer reads it. */
  unmap(address: number, bytes: number): void;
  release(handle: number): void;
  /** Bytes the pool may still map: the device's free memory less what other buffers may need. */
  available(): number;
}

/**
 * Rows a cache maps past the last position written, at least: attention kernels load keys in
 * tiles of up to 128 rows, and a tile past the last position (masked) must still be mapped.
 */
export const ROW_PAD = 256;

/** A reserved range and the granules mapped at its start, in order. */
export class PagedRange {
  readonly handles: number[] = [];
  constructor(readonly address: number, readonly bytes: number) {}
}

/** What the pool needs of a cache layer: its rows, their sizes, and its two ranges. */
export interface PagedLayer {
  readonly cells: number;
  readonly kRowBytes: number;
  readonly vRowBytes: number;
  readonly pages: { readonly k: PagedRange; readonly v: PagedRange } | null;
}

/** Rows mapped for positions 0 .. rows - 1: rounded up to ROW_PAD, at most the layer's cells. */
/** The layer's paging, where it has one (another backend's layers have none). */
function paged(layer: KvLayer): PagedLayer | null {
  const l = layer as Partial<PagedLayer>;
  return l.pages ? l as PagedLayer : null;
}

export function paddedRows(rows: number, cells: number): number {
  return Math.min(cells, Math.ceil(Math.max(0, rows) / ROW_PAD) * ROW_PAD);
}

export class KvPagePool {
  /** Granules mapped now, over every range. */
  mapped = 0;
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

  /** Maps granules at the range's start until its first `bytes` (at most all of it) are mapped. */
  ensure(range: PagedRange, bytes: number): void {
    const want = Math.min(this.granules(bytes), range.bytes / this.phys.granule);
    while (range.handles.length < want) {
      const handle = this.phys.create();
      try {
        this.phys.map(range.address + range.handles.length * this.phys.granule, handle);
      } catch (err) {
        this.phys.release(handle);
        throw err;
      }
      range.handles.push(handle);
      this.mapped++;
    }
  }

  /** Unmaps the granules past the range's first `bytes`. */
  trim(range: PagedRange, bytes: number): void {
    const keep = this.granules(bytes);
    if (range.handles.length <= keep) return;
    const g = this.phys.granule;
    this.phys.unmap(range.address + keep * g, (range.handles.length - keep) * g);
    const dropped = range.handles.splice(keep);
    for (const handle of dropped) this.phys.release(handle);
    this.mapped -= dropped.length;
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

  /** Granules mapped for the layers now. */
  held(layers: readonly KvLayer[]): number {
    return layers.reduce((n, layer) => {
      const p = paged(layer)?.pages;
      return n + (p ? p.k.handles.length + p.v.handles.length : 0);
    }, 0);
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

  /** Granules the pool may still map. */
  availableGranules(): number {
    return Math.max(0, Math.floor(this.phys.available() / this.phys.granule));
  }
}

/** A running sequence's slot as admission sees it. */
export interface RunningPages {
  /** Granules mapped for the slot now. */
  readonly held: number;
  /** The granules it takes at the furthest position its sequence may write. */
  readonly claim: number;
}

export type Admission =
  | { readonly kind: "admit"; readonly reclaim: number }
  | { readonly kind: "wait" }
  | { readonly kind: "never"; readonly need: number; readonly capacity: number };

/**
 * Whether a sequence needing `need` granules may start in a slot holding `held` now, beside the
 * running sequences' slots and the other free slots (`free`: the granules each holds, in the
 * order they are to be emptied, the one free the longest first), with `available` granules still
 * to be had. "admit" says how many of `free` (from the front) to empty first; "wait": not while
 * the running sequences may still map their claims; "never": not even with every other slot
 * empty.
 */
export function admitPages(need: number, held: number, running: readonly RunningPages[],
  free: readonly number[], available: number): Admission {
  let outstanding = 0, total = held;
  for (const s of running) {
    outstanding += Math.max(0, s.claim - s.held);
    total += s.held;
  }
  for (const h of free) total += h;
  const capacity = available + total;
  if (need > capacity) return { kind: "never", need, capacity };
  const grows = Math.max(0, need - held);
  let room = available - outstanding, reclaim = 0;
  while (grows > room && reclaim < free.length) room += free[reclaim++];
  if (grows > room) return { kind: "wait" };
  return { kind: "admit", reclaim };
}
/** The error of a sequence that can never fit the pool (the server's 400, a context overflow). */
export function neverFits(need: number, capacity: number, granule: number): InferError {
  const mib = (g: number) => Math.ceil(g * granule / 2 ** 20);
  return new InferError("context_overflow", `the request's KV cache needs ${mib(need)} MiB of GPU ` +
    `memory, and at most ${mib(capacity)} MiB can be had: lower max_tokens or the prompt`);
}
