// A fake physical side for the paged KV cache (ts/backend/kv-pages.ts), and a CPU backend made to
// page its full-attention caches through it, so that the pool's bookkeeping and the scheduler's
// admission run where there is no GPU. The fake holds at most `capacity` granules (create throws
// out_of_memory past it, as a GPU would) and poisons what it maps and unmaps: a granule's rows of
// the CPU layer are filled with 0xFF bytes (f16 NaN) when mapped (fresh memory holds garbage) and
// when unmapped (the memory is gone), so a sequence reading a position it did not write, or one
// given back, gets non-finite logits instead of passing by luck.
import type { Activation, Backend, KvLayer } from "../../ts/backend/backend.ts";
import { KvPagePool, type PhysicalPages } from "../../ts/backend/kv-pages.ts";
import type { Engine } from "../../ts/engine/engine.ts";
import { InferError } from "../../ts/errors.ts";

interface Range { bytes: Uint8Array | null; size: number; mapped: Set<number> }

export class FakePhysical implements PhysicalPages {
  private next = 1 << 20;
  private readonly ranges = new Map<number, Range>();
  private handles = 0;
  /** Granules existing now, and the most that ever did. */
  live = 0;
  peak = 0;
  maps = 0;
  unmaps = 0;
  constructor(readonly granule: number, public capacity: number) {}

  reserve(bytes: number): number {
    if (bytes % this.granule !== 0) throw new Error(`reserve: ${bytes} is not whole granules`);
    const address = this.next;
    this.next += bytes + this.granule; // a gap: an overrun past a range is caught
    this.ranges.set(address, { bytes: null, size: bytes, mapped: new Set() });
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
    return ++this.handles;
  }

  private find(address: number): { r: Range; offset: number } {
    for (const [start, r] of this.ranges) {
      if (address >= start && address < start + r.size) return { r, offset: address - start };
    }
    throw new Error(`address ${address} is in no reserved range`);
  }

  private poison(r: Range, offset: number, bytes: number): void {
    r.bytes?.fill(0xff, offset, Math.min(offset + bytes, r.bytes.length));
  }

  map(address: number, _handle: number): void {
    const { r, offset } = this.find(address);
    if (offset % this.granule !== 0 || r.mapped.has(offset)) throw new Error(`map at ${offset}: misaligned or mapped`);
    r.mapped.add(offset);
    this.poison(r, offset, this.granule);
    this.maps++;
  }

  unmap(address: number, bytes: number): void {
    const { r, offset } = this.find(address);
    for (let o = offset; o < offset + bytes; o += this.granule) {
      if (!r.mapped.delete(o)) throw new Error(`unmap at ${o}: not mapped`);
    }
    this.poison(r, offset, bytes);
    this.unmaps++;
  }

  release(_handle: number): void {
    this.live--;
  }

  available(): number {
    return (this.capacity - this.live) * this.granule;
  }
}

/**
 * Makes the engine's CPU backend page its full-attention caches (its own slot's, and those the
 * scheduler makes) through a pool on `phys`: every write maps what it reaches first, as the
 * CUDA backend does. Use with the prefix cache off (its CPU blocks share pages with the layers).
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
  const attendRows = be.attendRows?.bind(be);
  Object.assign(be, {
    kvPages: () => pool,
    kvLayer: (...args: Parameters<Backend["kvLayer"]>) => {
      const layer = kvLayer(...args);
      return args[5] ? page(layer) : layer;
    },
    storeKv: (layer: KvLayer, k: Activation, v: Activation, rows: number, position: number, firstRow?: number) => {
      pool.ensureRows(layer, position + rows);
      storeKv(layer, k, v, rows, position, firstRow);
    },
    copyKv: copyKv && ((src: KvLayer, srcCell: number, dst: KvLayer, dstCell: number, cells: number) => {
      pool.ensureRows(dst, dstCell + cells);
      copyKv(src, srcCell, dst, dstCell, cells);
    }),
    attendRows: attendRows && ((q: Activation, k: Activation, v: Activation, layers: readonly KvLayer[],
      positions: readonly number[], ...rest: unknown[]) => {
      layers.forEach((l, i) => pool.ensureRows(l, positions[i] + 1));
      return (attendRows as (...a: unknown[]) => boolean)(q, k, v, layers, positions, ...rest);
    }),
  });
  return pool;
}
