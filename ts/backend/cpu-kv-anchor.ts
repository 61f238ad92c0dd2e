// The anchor of a tq3/tq4 K layer on the CPU (lib/cpu/attention.zig storeAnchored): keys are
// coded less a vector common to them all, which moves every score of a query by the same q·anchor
// (no softmax sees it) while the codes stop spending their precision on the large vector Gemma 3's
// keys share. The anchor is the mean of the keys of the layer's first ANCHOR_ROWS_MIN cells,
// whatever stores wrote them (a 3-token prompt, then one token at a time), or the anchor of a
// layer copied into it first (the prefix cache); until then keys are coded as they are and kept
// exact, and setting it codes them again, so the codes equal those of one first store of them all.
import { check, native, offsetAddress, type Pointer } from "../native/lib.ts";

/** Cells of keys that set a tq3/tq4 K layer's anchor (their mean), whatever stores wrote them. */
export const ANCHOR_ROWS_MIN = 16;

/** A K layer's rows and anchor state (CpuKvLayer's key half). */
export interface AnchoredKeys {
  readonly kvHeads: number;
  readonly headDim: number;
  readonly kTypeId: number;
  readonly k: Pointer;
  readonly kBytes: Uint8Array;
  readonly kRowBytes: number;
  /** Fixed once set; undefined: not yet, keys coded as they are (kPending holds them exact). */
  kAnchor: Float32Array | undefined;
  /** While there is no anchor: the exact f32 key of each cell written so far. */
  kPending?: Map<number, Float32Array>;
}

/** Codes rows of f32 keys at `cell`, less `anchor` (null: as they are). */
export function storeKeys(l: AnchoredKeys, keys: Float32Array, cell: number, rows: number,
  anchor: Float32Array | null): void {
  check(native().infer_kv_store(keys, offsetAddress(l.k, cell * l.kRowBytes), l.kTypeId,
    rows * l.kvHeads * l.headDim, l.headDim, anchor, anchor?.length ?? 0), "kv_store k");
}

/**
 * Writes keys at `cell` of a layer without an anchor yet: kept exact, coded as they are until
 * ANCHOR_ROWS_MIN cells are known, when the anchor is set and they are all coded again.
 */
export function pendKeys(l: AnchoredKeys, keys: Float32Array, cell: number, rows: number): void {
  const kvDim = l.kvHeads * l.headDim, pending = l.kPending ??= new Map();
  for (let r = 0; r < rows; r++) pending.set(cell + r, keys.slice(r * kvDim, (r + 1) * kvDim));
  if (pending.size >= ANCHOR_ROWS_MIN) setAnchor(l);
  else storeKeys(l, keys, cell, rows, null);
}

/**
 * Sets the anchor to the mean of the pending keys, however few (summed in cell order, so that
 * the same cells give the same anchor whatever stores wrote them), and codes them again less it.
 * Nothing where the anchor is set or no key was written.
 */
export function setAnchor(l: AnchoredKeys): void {
  const pending = l.kPending;
  if (l.kAnchor !== undefined || !pending || pending.size === 0) return;
  l.kAnchor = anchorMean(pending, l.kvHeads * l.headDim);
  recodePending(l);
}

/** The mean of pending keys, summed in f64 in cell order (the CPU's and CUDA's anchor alike). */
export function anchorMean(pending: ReadonlyMap<number, Float32Array>, kvDim: number): Float32Array {
  const sum = new Float64Array(kvDim), cells = [...pending.keys()].sort((x, y) => x - y);
  for (const c of cells) {
    const key = pending.get(c)!;
    for (let i = 0; i < kvDim; i++) sum[i] += key[i];
  }
  return Float32Array.from(sum, (x) => x / cells.length);
}

/** Codes the pending keys again less the anchor now set, and forgets them. */
function recodePending(l: AnchoredKeys): void {
  const pending = l.kPending;
  l.kPending = undefined;
  if (!pending) return;
  const kvDim = l.kvHeads * l.headDim, cells = [...pending.keys()].sort((x, y) => x - y);
  for (let i = 0; i < cells.length;) { // runs of consecutive cells, one native call each
    let j = i + 1;
    while (j < cells.length && cells[j] === cells[j - 1] + 1) j++;
    const keys = new Float32Array((j - i) * kvDim);
    for (let r = i; r < j; r++) keys.set(pending.get(cells[r])!, (r - i) * kvDim);
    storeKeys(l, keys, cells[i], j - i, l.kAnchor ?? null);
    i = j;
  }
}

/** Keys of cells first .. first + cells - 1 as f32: a pending key exact, the others decoded. */
export function keysOf(l: AnchoredKeys, first: number, cells: number): Float32Array {
  const kvDim = l.kvHeads * l.headDim, keys = new Float32Array(cells * kvDim);
  check(native().infer_kv_load(l.kBytes.subarray(first * l.kRowBytes, (first + cells) * l.kRowBytes), l.kTypeId,
    keys.length, l.headDim, l.kAnchor ?? null, l.kAnchor?.length ?? 0, keys), "kv_load k");
  if (l.kPending) {
    for (let c = 0; c < cells; c++) {
      const exact = l.kPending.get(first + c);
      if (exact) keys.set(exact, c * kvDim);
    }
  }
  return keys;
}

/** copyKv's keys between two tq layers of one shape and type. */
export function copyAnchoredKeys(s: AnchoredKeys, srcCell: number, d: AnchoredKeys, dstCell: number,
  cells: number): void {
  const kb = s.kRowBytes;
  const copyCodes = () => d.kBytes.set(s.kBytes.subarray(srcCell * kb, (srcCell + cells) * kb), dstCell * kb);
  if (d.kAnchor !== undefined && s.kAnchor === d.kAnchor) {
    copyCodes();
  } else if (d.kAnchor !== undefined) {
    // Coded less another anchor, or none yet: the source's keys, exact or decoded, coded again.
    storeKeys(d, keysOf(s, srcCell, cells), dstCell, cells, d.kAnchor);
  } else if (s.kAnchor !== undefined) {
    // The target takes the source's anchor; what it held without one is coded again less it.
    copyCodes();
    for (let c = dstCell; c < dstCell + cells; c++) d.kPending?.delete(c);
    d.kAnchor = s.kAnchor;
    recodePending(d);
  } else {
    // Neither has one: the codes copied as they are, the keys pending in the target too.
    copyCodes();
    pendKeys(d, keysOf(s, srcCell, cells), dstCell, cells);
  }
}
