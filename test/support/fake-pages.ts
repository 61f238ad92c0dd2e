// A fake physical side for the paged KV cache (ts/backend/kv-pages.ts), and a CPU backend made to
// page its full-attention caches through it, so that the pool's bookkeeping and the scheduler's
// admission run where there is no GPU. The fake holds at most `capacity` granules (create throws
// out_of_memory past it, as a GPU would) and poisons what it maps and unmaps: a granule's rows of
// the CPU layer are filled with 0xFF bytes (f16 NaN) when mapped (fresh memory holds garbage) and
// when unmapped (the memory is gone), so a sequence reading a position it did not write, or one
// given back, gets non-finite logits instead of passing by luck.
import type { Activation, Backend, KvLayer, RopeOptions } from "../../ts/backend/backend.ts";
import { KvPagePool, type PhysicalPages } from "../../ts/backend/kv-pages.ts";
import type { Engine } from "../../ts/engine/engine.ts";
import { InferError } from "../../ts/errors.ts";

interface Range { bytes: Uint8Array | null; size: number; mapped: Map<number, number> }
interface Mapping { r: Range; offset: number }

export class FakePhysical implements PhysicalPages {
  private next = 1 << 20;
  private readonly ranges = new Map<number, Range>();
  /** Every live handle's mappings, and its bytes while it has none. */
  private readonly handles = new Map<number, { maps: Set<Mapping>; data: Uint8Array | null }>();
  private lastHandle = 0;
  /** Granules existing now, and the most that ever did. */
  live = 0;
  peak = 0;
  maps = 0;
  unmaps = 0;
  copies = 0;
  constructor(readonly granule: number, public capacity: number) {}

  reserve(bytes: number): number {
    if (bytes % this.granule !== 0) throw new Error(`reserve: ${bytes} is not whole granules`);
    const address = this.next;
    this.next += bytes + this.granule; // a gap: an overrun past a range is caught
    this.ranges.set(address, { bytes: null, size: bytes, mapped: new Map() });
    return address;
  }

  /** Backs the range at `address` with a layer's bytes, which map and unmap poison. */
  back(address: number, bytes: Uint8Array): void {
    this.ranges.get(address)!.bytes = bytes;
  }

  addressFree(address: number, _bytes: number): void {
    const r = this.ranges.get(address);
    if (!r || r.mapped.size > 0) throw new Error("addressFree of a range still mapped");
    this.ranges.delete(address);
  }

  create(): number {
    if (this.live >= this.capacity) {
      throw new InferError("out_of_memory", `fake pages: all ${this.capacity} granules are in use`);
    }
    this.live++;
    this.peak = Math.max(this.peak, this.live);
    this.handles.set(++this.lastHandle, { maps: new Set(), data: null });
    return this.lastHandle;
  }

  private find(address: number): Mapping {
    for (const [start, r] of this.ranges) {
      if (address >= start && address < start + r.size) return { r, offset: address - start };
    }
    throw new Error(`address ${address} is in no reserved range`);
  }

  /** The bytes of a granule as the range sees them (a range backed by a layer ends with it). */
  private view(m: Mapping, bytes = this.granule): Uint8Array {
    m.r.bytes ??= new Uint8Array(m.r.size);
    return m.r.bytes.subarray(m.offset, Math.min(m.offset + bytes, m.r.bytes.length));
  }

  map(address: number, handle: number): void {
    const m = this.find(address), h = this.handles.get(handle);
    if (!h) throw new Error(`map of handle ${handle}, which is released`);
    if (m.offset % this.granule !== 0 || m.r.mapped.has(m.offset)) {
      throw new Error(`map at ${m.offset}: misaligned or mapped`);
    }
    // The same memory seen at another address: its bytes as another mapping holds them.
    const other = h.maps.values().next().value;
    const into = this.view(m);
    if (other) into.set(this.view(other).subarray(0, into.length));
    else if (h.data) into.set(h.data.subarray(0, into.length));
    else into.fill(0xff);
    m.r.mapped.set(m.offset, handle);
    h.maps.add(m);
    this.maps++;
  }

  unmap(address: number, bytes: number): void {
    const { r, offset } = this.find(address);
    for (let o = offset; o < offset + bytes; o += this.granule) {
      const handle = r.mapped.get(o);
      if (handle === undefined) throw new Error(`unmap at ${o}: not mapped`);
      const h = this.handles.get(handle)!;
      const mine = [...h.maps].find((m) => m.r === r && m.offset === o)!;
      h.maps.delete(mine);
      const other = h.maps.values().next().value;
      if (other) this.same(handle, this.view(mine), this.view(other));
      else h.data = this.view(mine).slice();
      r.mapped.delete(o);
    }
    r.bytes?.fill(0xff, offset, Math.min(offset + bytes, r.bytes.length));
    this.unmaps++;
  }

  copy(dst: number, src: number, bytes: number): void {
    const to = this.view(this.find(dst), bytes), from = this.view(this.find(src), bytes);
    to.set(from.subarray(0, Math.min(to.length, from.length)));
    this.copies++;
  }

  release(handle: number): void {
    const h = this.handles.get(handle);
    if (!h || h.maps.size > 0) throw new Error(`release of handle ${handle}: released or still mapped`);
    this.handles.delete(handle);
    this.live--;
  }

  available(): number {
    return (this.capacity - this.live) * this.granule;
  }

  /** Handles mapped at more than one address now. */
  get sharedHandles(): number {
    return [...this.handles.values()].filter((h) => h.maps.size > 1).length;
  }

  /**
   * Throws where a granule mapped at several addresses reads differently at them: the fake keeps a
   * copy per address, so a write into a shared granule shows here (on the GPU it would have
   * changed every holder's rows).
   */
  checkShared(): void {
    for (const [handle, h] of this.handles) {
      const [first, ...rest] = [...h.maps].map((m) => this.view(m));
      for (const v of rest) this.same(handle, first, v);
    }
  }

  private same(handle: number, a: Uint8Array, b: Uint8Array): void {
    const n = Math.min(a.length, b.length);
    for (let i = 0; i < n; i++) {
      if (a[i] !== b[i]) throw new Error(`granule ${handle} was written while shared (byte ${i})`);
    }
  }
}

/**
 * Makes the engine's CPU backend page its full-attention caches (its own slot's, and those the
 * scheduler makes) through a pool on `phys`: every write maps what it reaches first, as the
 * CUDA backend does, copying a granule other ranges share before a write lands in it. A prefix
 * cache then shares whole granules through the pool (the CPU's own block store, whose pages would
 * be mapped over the same layers, is not opened beside a pool).
 */
export function withFakePages(engine: Engine, phys: FakePhysical): KvPagePool {
  const be = engine.backend;
  const pool = new KvPagePool(phys);
  const page = (layer: KvLayer): KvLayer => {
    const l = layer as KvLayer & { kRowBytes: number; vRowBytes: number; kBytes: Uint8Array; vBytes: Uint8Array };
    if (l.ring) return l;
    const k = pool.reserve(l.cells * l.kRowBytes), v = pool.reserve(l.cells * l.vRowBytes);
    phys.back(k.address, l.kBytes);
    phys.back(v.address, l.vBytes);
    l.kBytes.fill(0xff);
    l.vBytes.fill(0xff);
    return Object.assign(l, { pages: { k, v } });
  };
  for (const layer of engine.cache.layers) page(layer);
  const kvLayer = be.kvLayer.bind(be), storeKv = be.storeKv.bind(be), copyKv = be.copyKv?.bind(be);
  const attendRows = be.attendRows?.bind(be), shiftKv = be.shiftKv?.bind(be), compactKv = be.compactKv?.bind(be);
  Object.assign(be, {
    kvPages: () => pool,
    kvLayer: (...args: Parameters<Backend["kvLayer"]>) => {
      const layer = kvLayer(...args);
      return args[5] ? page(layer) : layer;
    },
    storeKv: (layer: KvLayer, k: Activation, v: Activation, rows: number, position: number, firstRow?: number) => {
      pool.writeRows(layer, position, position + rows);
      storeKv(layer, k, v, rows, position, firstRow);
    },
    copyKv: copyKv && ((src: KvLayer, srcCell: number, dst: KvLayer, dstCell: number, cells: number) => {
      pool.writeRows(dst, dstCell, dstCell + cells);
      copyKv(src, srcCell, dst, dstCell, cells);
    }),
    attendRows: attendRows && ((q: Activation, k: Activation, v: Activation, layers: readonly KvLayer[],
      positions: readonly number[], ...rest: unknown[]) => {
      layers.forEach((l, i) => pool.writeRows(l, positions[i], positions[i] + 1));
      return (attendRows as (...a: unknown[]) => boolean)(q, k, v, layers, positions, ...rest);
    }),
    shiftKv: shiftKv && ((layer: KvLayer, rope: RopeOptions, keep: number, discard: number, length: number) => {
      if (!layer.ring && discard > 0) pool.writeRows(layer, keep, length - discard);
      shiftKv(layer, rope, keep, discard, length);
    }),
    compactKv: compactKv && ((layer: KvLayer, rope: RopeOptions, from: Int32Array, to: number) => {
      pool.writeRows(layer, to, to + from.length);
      compactKv(layer, rope, from, to);
    }),
  });
  return pool;
}
