// The anchor of a tq3/tq4 K layer on CUDA: cpu-kv-anchor.ts's rule, decided here on the host and
// handed to the device, so that both backends code the same keys less the same anchor (the same
// bytes). Until a layer has its anchor, the keys stored are read back to the host (one download
// per store, for its first ANCHOR_ROWS_MIN cells only) and kept exact; the anchor, their mean
// (anchorMean), is then uploaded and they are coded again on the device less it. From then on a
// store is one kv_store_turbo launch with the layer's anchor, recorded into decode graphs as any.
import { InferError } from "../errors.ts";
import { ANCHOR_ROWS_MIN, anchorMean } from "./cpu-kv-anchor.ts";

/** A CUDA K layer's anchor state (CudaKvLayer's tq key half). */
export interface CudaAnchoredKeys {
  readonly cells: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly kRowBytes: number;
  /** Device address of the anchor's kvHeads · headDim f32 values (uploaded once set). */
  readonly kAnchorAddress: number;
  /** Fixed once set; undefined: not yet, keys coded as they are (kPending holds them exact). */
  kAnchor: Float32Array | undefined;
  /** While there is no anchor: the exact f32 key of each cell written so far. */
  kPending?: Map<number, Float32Array>;
}

/** What the anchor logic asks of the CUDA backend. */
export interface AnchorDevice {
  /** Codes rows of host keys into cells cell.. of the layer, less its anchor when `anchored`. */
  storeHostKeys(l: CudaAnchoredKeys, keys: Float32Array, cell: number, rows: number, anchored: boolean): void;
  /** Copies the layer's anchor (set) to its device address. */
  uploadAnchor(l: CudaAnchoredKeys): void;
  /** Copies key cells' codes between two layers of one shape and type, on the device. */
  copyCodes(s: CudaAnchoredKeys, srcCell: number, d: CudaAnchoredKeys, dstCell: number, cells: number): void;
}

/**
 * Keys of `rows` rows (read back from the device) written at cells[r] of a layer without an
 * anchor: kept exact; at ANCHOR_ROWS_MIN cells the anchor is set and every pending key is coded
 * again less it. Returns whether that happened (else the caller codes the rows as they are).
 */
export function pendCudaKeys(dev: AnchorDevice, l: CudaAnchoredKeys, keys: Float32Array, cells: number[]): boolean {
  const kvDim = l.kvHeads * l.headDim, pending = l.kPending ??= new Map();
  for (let r = 0; r < cells.length; r++) pending.set(cells[r], keys.slice(r * kvDim, (r + 1) * kvDim));
  if (pending.size < ANCHOR_ROWS_MIN) return false;
  setCudaAnchor(dev, l);
  return true;
}

/** Sets the anchor to the pending keys' mean, uploads it and codes them again less it. */
export function setCudaAnchor(dev: AnchorDevice, l: CudaAnchoredKeys): void {
  const pending = l.kPending;
  if (l.kAnchor !== undefined || !pending || pending.size === 0) return;
  l.kAnchor = anchorMean(pending, l.kvHeads * l.headDim);
  dev.uploadAnchor(l);
  recode(dev, l);
}

/** Codes the pending keys again less the anchor now set, in runs of cells, and forgets them. */
function recode(dev: AnchorDevice, l: CudaAnchoredKeys): void {
  const pending = l.kPending;
  l.kPending = undefined;
  if (!pending) return;
  const kvDim = l.kvHeads * l.headDim, cells = [...pending.keys()].sort((x, y) => x - y);
  for (let i = 0; i < cells.length;) {
    let j = i + 1;
    while (j < cells.length && cells[j] === cells[j - 1] + 1) j++;
    const keys = new Float32Array((j - i) * kvDim);
    for (let r = i; r < j; r++) keys.set(pending.get(cells[r])!, (r - i) * kvDim);
    dev.storeHostKeys(l, keys, cells[i], j - i, true);
    i = j;
  }
}

/**
 * copyKv's keys between two tq layers of one shape and type (cpu-kv-anchor.ts copyAnchoredKeys'
 * cases). Keys coded less another anchor would have to be decoded on the device first: refused.
 */
export function copyCudaAnchoredKeys(dev: AnchorDevice, s: CudaAnchoredKeys, srcCell: number, d: CudaAnchoredKeys,
  dstCell: number, cells: number): void {
  const kvDim = s.kvHeads * s.headDim;
  /** The source's keys exact (it has no anchor: every cell written is pending; unwritten: 0). */
  const exactKeys = () => {
    const keys = new Float32Array(cells * kvDim);
    for (let c = 0; c < cells; c++) {
      const key = s.kPending?.get(srcCell + c);
      if (key) keys.set(key, c * kvDim);
    }
    return keys;
  };
  if (d.kAnchor !== undefined && s.kAnchor === d.kAnchor) {
    dev.copyCodes(s, srcCell, d, dstCell, cells);
  } else if (d.kAnchor !== undefined) {
    if (s.kAnchor !== undefined) {
      throw new InferError("unsupported", "copying tq3/tq4 keys between layers of different anchors runs on the " +
        "CPU backend, not CUDA");
    }
    dev.storeHostKeys(d, exactKeys(), dstCell, cells, true);
  } else if (s.kAnchor !== undefined) {
    // The target takes the source's anchor; what it held without one is coded again less it.
    dev.copyCodes(s, srcCell, d, dstCell, cells);
    for (let c = dstCell; c < dstCell + cells; c++) d.kPending?.delete(c);
    d.kAnchor = s.kAnchor;
    dev.uploadAnchor(d);
    recode(dev, d);
  } else {
    // Neither has one: the codes copied as they are, the keys pending in the target too.
    dev.copyCodes(s, srcCell, d, dstCell, cells);
    const keys = exactKeys(), at = Array.from({ length: cells }, (_, c) => dstCell + c);
    if (!pendCudaKeys(dev, d, keys, at)) dev.storeHostKeys(d, keys, dstCell, cells, false);
  }
}
