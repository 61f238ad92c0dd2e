// One file out of a zip archive (a Python wheel is one), read through the central directory as
// PKWARE's APPNOTE.TXT lays it out: the end record names the directory, each directory entry
// names a local header, and the data follows that header, stored or deflated, with its CRC-32
// in the directory entry. Zip64 is refused: a wheel's chunk of a model is tens of megabytes.
// Every offset is checked against the archive.
import { crc32, inflateRawSync } from "node:zlib";
import { InferError } from "../errors.ts";

const END_SIGNATURE = 0x06054b50, ENTRY_SIGNATURE = 0x02014b50, LOCAL_SIGNATURE = 0x04034b50;
const END_BYTES = 22, ENTRY_BYTES = 46, LOCAL_BYTES = 30;
const COMMENT_BYTES_MAX = 0xffff;

function fail(what: string, message: string): never {
  throw new InferError("io", `${what}: ${message}`);
}

/** The end-of-central-directory record: the last one, within the comment's reach of the end. */
function endRecord(zip: DataView, what: string): { entries: number; offset: number } {
  const lowest = Math.max(0, zip.byteLength - END_BYTES - COMMENT_BYTES_MAX);
  for (let at = zip.byteLength - END_BYTES; at >= lowest; at--) {
    if (zip.getUint32(at, true) !== END_SIGNATURE) continue;
    const entries = zip.getUint16(at + 10, true), size = zip.getUint32(at + 12, true);
    const offset = zip.getUint32(at + 16, true);
    if (entries === 0xffff || offset === 0xffffffff) fail(what, "a zip64 archive (not supported)");
    if (offset + size > at) fail(what, "the zip's central directory lies outside the file");
    return { entries, offset };
  }
  return fail(what, "not a zip archive (no end-of-central-directory record)");
}

/** The bytes of the file `name` in the zip archive `bytes`; `what` names the archive in errors. */
export function zipEntry(bytes: Uint8Array, name: string, what: string): Uint8Array {
  const zip = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const { entries, offset } = endRecord(zip, what);
  const decoder = new TextDecoder();
  let at = offset;
  for (let i = 0; i < entries; i++) {
    if (at + ENTRY_BYTES > zip.byteLength || zip.getUint32(at, true) !== ENTRY_SIGNATURE) {
      fail(what, `central directory entry ${i} is damaged`);
    }
    const method = zip.getUint16(at + 10, true), crc = zip.getUint32(at + 16, true);
    const packedBytes = zip.getUint32(at + 20, true), plainBytes = zip.getUint32(at + 24, true);
    const nameBytes = zip.getUint16(at + 28, true);
    const extraBytes = zip.getUint16(at + 30, true), commentBytes = zip.getUint16(at + 32, true);
    const local = zip.getUint32(at + 42, true);
    const entryName = decoder.decode(bytes.subarray(at + ENTRY_BYTES, at + ENTRY_BYTES + nameBytes));
    at += ENTRY_BYTES + nameBytes + extraBytes + commentBytes;
    if (entryName !== name) continue;
    if (local + LOCAL_BYTES > zip.byteLength || zip.getUint32(local, true) !== LOCAL_SIGNATURE) {
      fail(what, `the local header of ${name} is damaged`);
    }
    const start = local + LOCAL_BYTES + zip.getUint16(local + 26, true) + zip.getUint16(local + 28, true);
    if (start + packedBytes > zip.byteLength) fail(what, `${name} runs past the end of the archive`);
    const packed = bytes.subarray(start, start + packedBytes);
    let plain: Uint8Array;
    if (method === 0) plain = packed;
    else if (method === 8) {
      try {
        plain = inflateRawSync(packed);
      } catch (err) {
        return fail(what, `${name} does not inflate: ${(err as Error).message}`);
      }
    } else return fail(what, `${name} is compressed by method ${method} (only stored and deflate)`);
    if (plain.length !== plainBytes) {
      fail(what, `${name} holds ${plain.length} bytes, its directory entry says ${plainBytes}`);
    }
    if (crc32(plain) !== crc) fail(what, `${name} is damaged (its CRC-32 does not match)`);
    return plain;
  }
  return fail(what, `no ${name} in the archive`);
}
