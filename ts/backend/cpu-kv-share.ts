// Keys and values shared by reference between sequences on the CPU, copy-on-write, through the
// system's page tables (lib/kv_share.zig). The prefix cache's blocks live in one memory file; a
// sequence's full-attention layers are page-aligned regions of their own, and handing a sequence a
// block maps the block's pages over its rows privately: every sequence holding the block reads
// the same memory, and a write to a shared page gives the writer its own copy of that page. The
// kernels keep reading each layer's rows contiguously (position p in row p), so attention, the
// stores and the context shift are unchanged. A block's rows are shared only where they fill
// whole pages (blockTokens · row bytes a multiple of the page size: f16 rows of 512 bytes or
// more with 32-token blocks); elsewhere, and in sliding-window rings, they are copied.
import { InferError } from "../errors.ts";
import { toArrayBuffer } from "bun:ffi";
import { check, native, offsetAddress, type Pointer } from "../native/lib.ts";
import { kvBytes, type KvBlockStore, type KvLayer, type KvLayerShape, type KvTypes } from "./backend.ts";

/** Where a block layer's rows lie in the store's file. */
export interface KvFileRows {
  readonly fd: number;
  readonly kOffset: number;
  readonly vOffset: number;
  /** The ranges of other layers mapping these rows now, by their key address. */
  readonly holders: Map<number, SharedRows>;
}

/** What a shareable layer needs beyond the KvLayer: its rows' addresses and sizes. */
export interface CpuKvRows extends KvLayer {
  readonly k: Pointer;
  readonly v: Pointer;
  readonly kRowBytes: number;
  readonly vRowBytes: number;
  readonly kBytes: Uint8Array;
  readonly vBytes: Uint8Array;
  readonly kTypeId: number;
  readonly vTypeId: number;
  /** Set on a layer in its own pages (kvPages), whose rows a block can be mapped over. */
  readonly held?: Map<number, SharedRows>;
  /** Set on a block layer of a store. */
  readonly file?: KvFileRows;
}

export interface SharedRows {
  readonly layer: CpuKvRows;
  readonly block: CpuKvRows;
  readonly k: number;
  readonly v: number;
  readonly kBytes: number;
  readonly vBytes: number;
  readonly rows: number;
}

/**
 * Shared ranges live at once in this process, at most: each is up to two mappings (keys, values)
 * where consecutive blocks do not merge, and Linux allows 65,530 mappings per process by default.
 * Past it rows are copied.
 */
const SHARED_RANGES_MAX = 12_000;
let sharedRanges = 0;

/** Whether this system can share rows (a memory file, private mappings over it). */
export const kvSharing = process.platform === "linux";

let pageSize = 0;
function pageBytes(): number {
  return pageSize ||= Number(native().infer_kv_pages_size());
}

/** Zeroed page-aligned memory for a layer whose rows may be shared; free() returns it. */
export function kvPages(bytes: number): { address: Pointer; bytes: Uint8Array; free(): void } {
  const lib = native(), out = new BigUint64Array(1);
  check(lib.infer_kv_pages_alloc(bytes, out), "allocate a KV cache layer");
  const address = Number(out[0]) as Pointer;
  let live = true;
  return {
    address, bytes: new Uint8Array(toArrayBuffer(address, 0, bytes)),
    free() {
      if (live) lib.infer_kv_pages_free(address as number, bytes);
      live = false;
    },
  };
}

export type BlockLayerMaker = (cells: number, shape: KvLayerShape, k: Pointer, v: Pointer,
  kBytes: Uint8Array, vBytes: Uint8Array, file: KvFileRows) => CpuKvRows;

export class CpuKvBlockStore implements KvBlockStore {
  private readonly fd: number;
  private readonly address: Pointer;
  private readonly bytes: number;
  private readonly view: Uint8Array;
  /** Per shape: where its keys' and values' block arrays begin in the file, one block's bytes. */
  private readonly plan: { k: number; v: number; kBlock: number; vBlock: number }[] = [];
  private shared = 0;
  /** Shared ranges of this store live now (of sharedRanges). */
  private ranges = 0;
  private closed = false;

  /** Null where the system cannot share (not Linux) or the file cannot be made. */
  static open(shapes: readonly KvLayerShape[], types: KvTypes, cells: number, blocks: number,
    make: BlockLayerMaker): CpuKvBlockStore | null {
    if (!kvSharing) return null;
    const page = pageBytes(), plan = [];
    let offset = 0;
    const pages = (n: number) => Math.ceil(n / page) * page;
    for (const s of shapes) {
      const kBlock = cells * kvBytes(types.k, s.kvHeads * s.headDim, s.headDim);
      const vBlock = cells * kvBytes(types.v, s.kvHeads * s.headDim, s.headDim);
      const k = offset;
      offset += pages(kBlock * blocks);
      plan.push({ k, v: offset, kBlock, vBlock });
      offset += pages(vBlock * blocks);
    }
    const out = new BigUint64Array(2);
    if (native().infer_kv_share_open(offset, out) !== 0) return null;
    return new CpuKvBlockStore(Number(out[0]), Number(out[1]) as Pointer, offset, plan, shapes,
      cells, blocks, make);
  }

  private constructor(fd: number, address: Pointer, bytes: number,
    plan: { k: number; v: number; kBlock: number; vBlock: number }[],
    private readonly shapes: readonly KvLayerShape[], private readonly cells: number,
    private readonly blocks: number, private readonly make: BlockLayerMaker) {
    this.fd = fd;
    this.address = address;
    this.bytes = bytes;
    this.view = new Uint8Array(toArrayBuffer(address, 0, bytes));
    this.plan = plan;
  }

  get sharedRows(): number {
    return this.shared;
  }

  block(index: number): readonly KvLayer[] {
    if (!(index >= 0 && index < this.blocks)) {
      throw new InferError("internal", `block ${index} of a store of ${this.blocks}`);
    }
    // Consecutive blocks lie next to each other in each layer's array, so the mappings of a
    // chain of them can merge into one.
    return this.shapes.map((shape, i) => {
      const p = this.plan[i], k = p.k + index * p.kBlock, v = p.v + index * p.vBlock;
      return this.make(this.cells, shape, offsetAddress(this.address, k), offsetAddress(this.address, v),
        this.view.subarray(k, k + p.kBlock), this.view.subarray(v, v + p.vBlock),
        { fd: this.fd, kOffset: k, vOffset: v, holders: new Map() });
    });
  }

  share(block: KvLayer, blockCell: number, dst: KvLayer, dstCell: number, cells: number): boolean {
    const b = block as CpuKvRows, d = dst as CpuKvRows, page = pageBytes();
    if (!b.file || !d.held || d.ring || b.kTypeId !== d.kTypeId || b.vTypeId !== d.vTypeId ||
      b.kRowBytes !== d.kRowBytes || b.vRowBytes !== d.vRowBytes || cells < 1 ||
      blockCell < 0 || dstCell < 0 || blockCell + cells > b.cells || dstCell + cells > d.cells) return false;
    const kBytes = cells * d.kRowBytes, vBytes = cells * d.vRowBytes;
    const k = (d.k as number) + dstCell * d.kRowBytes, v = (d.v as number) + dstCell * d.vRowBytes;
    const kFrom = b.file.kOffset + blockCell * b.kRowBytes, vFrom = b.file.vOffset + blockCell * b.vRowBytes;
    if ([kBytes, vBytes, k, v, kFrom, vFrom].some((x) => x % page !== 0)) return false;
    this.forget(d.held.get(k));
    if (sharedRanges >= SHARED_RANGES_MAX) return false;
    const lib = native();
    if (lib.infer_kv_share_map(k, kBytes, b.file.fd, kFrom) !== 0 ||
      lib.infer_kv_share_map(v, vBytes, b.file.fd, vFrom) !== 0) {
      // The system refused (too many mappings): the rows were lost, so copy them in, privately.
      const kAt = dstCell * d.kRowBytes, vAt = dstCell * d.vRowBytes;
      lib.infer_kv_share_detach(k, kBytes);
      d.kBytes.set(b.kBytes.subarray(blockCell * b.kRowBytes, blockCell * b.kRowBytes + kBytes), kAt);
      d.vBytes.set(b.vBytes.subarray(blockCell * b.vRowBytes, blockCell * b.vRowBytes + vBytes), vAt);
      return true;
    }
    const rows: SharedRows = { layer: d, block: b, k, v, kBytes, vBytes, rows: cells };
    d.held.set(k, rows);
    b.file.holders.set(k, rows);
    this.shared += cells;
    this.ranges++;
    sharedRanges++;
    return true;
  }

  detach(layers: readonly KvLayer[]): void {
    const lib = native();
    for (const layer of layers) {
      const file = (layer as CpuKvRows).file;
      if (!file) continue;
      for (const rows of [...file.holders.values()]) {
        lib.infer_kv_share_detach(rows.k, rows.kBytes);
        lib.infer_kv_share_detach(rows.v, rows.vBytes);
        this.forget(rows);
      }
    }
  }

  /** Drops the record of rows no longer mapped (detached, or mapped over by another block). */
  private forget(rows: SharedRows | undefined): void {
    if (!rows) return;
    rows.layer.held!.delete(rows.k);
    rows.block.file!.holders.delete(rows.k);
    this.shared -= rows.rows;
    this.ranges--;
    sharedRanges--;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    sharedRanges -= this.ranges; // the backend frees the holders' pages with the store
    this.ranges = 0;
    native().infer_kv_share_close(this.fd, this.address as number, this.bytes);
  }
}
