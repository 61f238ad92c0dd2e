// How the Metal backend wraps a mapped GGUF in buffers: one no-copy buffer when the file fits the
// device's maxBufferLength, else overlapping views as ggml-metal makes them. Views of length L
// (maxBufferLength rounded down to whole pages) start every `step` bytes, step = L minus the
// largest tensor, rounded down to a page; a tensor starting in [i·step, (i+1)·step) then ends
// before i·step + step + largest ≤ i·step + L, i.e. wholly inside view i. Every view starts on a
// page boundary of the (page-aligned) mapping, as newBufferWithBytesNoCopy requires.
import { InferError } from "../errors.ts";

export interface BufferView {
  /** Byte offset of the view in the file. */
  readonly offset: number;
  readonly bytes: number;
}

/** The views covering `fileBytes` bytes whose largest tensor is `largestTensor` bytes. */
export function planBufferViews(fileBytes: number, largestTensor: number, maxBufferLength: number,
  pageSize: number): BufferView[] {
  if (fileBytes <= maxBufferLength) return [{ offset: 0, bytes: fileBytes }];
  const length = Math.floor(maxBufferLength / pageSize) * pageSize;
  const step = Math.floor((length - largestTensor) / pageSize) * pageSize;
  if (step <= 0) {
    throw new InferError("unsupported", `a tensor of ${largestTensor} bytes is too large to split the model ` +
      `into Metal buffers of at most ${maxBufferLength} bytes (the device's maxBufferLength)`);
  }
  const views: BufferView[] = [];
  for (let offset = 0; ; offset += step) {
    views.push({ offset, bytes: Math.min(length, fileBytes - offset) });
    if (offset + length >= fileBytes) return views;
  }
}

/** The view holding bytes [offset, offset + bytes) wholly, and the offset inside it. */
export function viewOf(views: readonly BufferView[], offset: number, bytes: number): { index: number; offset: number } {
  // The last view starting at or before `offset`; with the step above it holds the whole range.
  let lo = 0, hi = views.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (views[mid].offset <= offset) lo = mid;
    else hi = mid - 1;
  }
  const v = views[lo];
  if (offset < v.offset || offset + bytes > v.offset + v.bytes) {
    throw new InferError("internal", `bytes [${offset}, ${offset + bytes}) lie in no Metal buffer view`);
  }
  return { index: lo, offset: offset - v.offset };
}
