// A SentencePiece tokenizer.model read without a protobuf library: the file is one ModelProto
// message (sentencepiece_model.proto), of which the converter needs the pieces (field 1: text,
// score, type) and the normaliser's add_dummy_prefix (field 3.3). The wire format: each field is
// a varint key (number << 3 | wire type) followed by a varint (0), 8 bytes (1), a varint length
// and that many bytes (2), or 4 bytes (5). Unknown fields are skipped; every length is checked
// against the bytes left, so a truncated or foreign file fails with the offset where it broke.
import { readFileSync } from "node:fs";
import { InferError } from "../errors.ts";

/** sentencepiece_model.proto's SentencePiece.Type, numerically equal to GGUF's token types. */
export const PieceType = { normal: 1, unknown: 2, control: 3, userDefined: 4, unused: 5,
  byte: 6 } as const;

export interface Piece {
  readonly text: string;
  readonly score: number;
  readonly type: number;
}

export interface SentencePieceModel {
  readonly pieces: readonly Piece[];
  /** NormalizerSpec.add_dummy_prefix (proto default true): prepend "▁" to the input. */
  readonly addDummyPrefix: boolean;
}

const WIRE = { varint: 0, fixed64: 1, bytes: 2, fixed32: 5 } as const;

class Reader {
  pos: number;
  constructor(readonly bytes: Uint8Array, readonly path: string, start = 0,
    readonly end = bytes.length) {
    this.pos = start;
  }

  fail(what: string): never {
    throw new InferError("bad_model", `${this.path}: not a SentencePiece model (${what} at byte ` +
      `${this.pos})`);
  }

  done(): boolean {
    return this.pos >= this.end;
  }

  varint(): number {
    let value = 0;
    for (let shift = 0; shift < 64; shift += 7) {
      if (this.pos >= this.end) this.fail("truncated varint");
      const b = this.bytes[this.pos++];
      // Values past 2^53 only occur in fields skipped here; keep the low bits exact enough.
      value += (b & 0x7f) * 2 ** shift;
      if ((b & 0x80) === 0) return value;
    }
    return this.fail("varint longer than 10 bytes");
  }

  /** The next field's number and wire type. */
  key(): { field: number; wire: number } {
    const k = this.varint();
    return { field: Math.floor(k / 8), wire: k % 8 };
  }

  /** A length-delimited field's extent, as a sub-reader. */
  sub(): Reader {
    const n = this.varint();
    if (n > this.end - this.pos) this.fail(`field of ${n} bytes past the end`);
    const r = new Reader(this.bytes, this.path, this.pos, this.pos + n);
    this.pos += n;
    return r;
  }

  float32(): number {
    if (this.end - this.pos < 4) this.fail("truncated float");
    const at = this.bytes.byteOffset + this.pos;
    const v = new DataView(this.bytes.buffer, at, 4).getFloat32(0, true);
    this.pos += 4;
    return v;
  }

  skip(wire: number): void {
    if (wire === WIRE.varint) this.varint();
    else if (wire === WIRE.bytes) this.sub();
    else if (wire === WIRE.fixed64 || wire === WIRE.fixed32) {
      const n = wire === WIRE.fixed64 ? 8 : 4;
      if (this.end - this.pos < n) this.fail("truncated fixed-size field");
      this.pos += n;
    } else this.fail(`wire type ${wire}`);
  }
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

function readPiece(r: Reader): Piece {
  let text: string | null = null, score = 0, type: number = PieceType.normal;
  while (!r.done()) {
    const { field, wire } = r.key();
    if (field === 1 && wire === WIRE.bytes) {
      const s = r.sub();
      try {
        text = utf8.decode(s.bytes.subarray(s.pos, s.end));
      } catch {
        r.fail("a piece that is not UTF-8");
      }
    } else if (field === 2 && wire === WIRE.fixed32) score = r.float32();
    else if (field === 3 && wire === WIRE.varint) type = r.varint();
    else r.skip(wire);
  }
  if (text === null) r.fail("a piece without text");
  if (type < PieceType.normal || type > PieceType.byte) r.fail(`piece type ${type}`);
  return { text, score, type };
}

function readAddDummyPrefix(r: Reader): boolean {
  let add = true;
  while (!r.done()) {
    const { field, wire } = r.key();
    if (field === 3 && wire === WIRE.varint) add = r.varint() !== 0;
    else r.skip(wire);
  }
  return add;
}

export function readSentencePieceModel(path: string): SentencePieceModel {
  let bytes: Uint8Array;
  try {
    bytes = readFileSync(path);
  } catch (err) {
    throw new InferError("io", `cannot read ${path}: ${(err as Error).message}`);
  }
  const r = new Reader(bytes, path);
  const pieces: Piece[] = [];
  let addDummyPrefix = true;
  while (!r.done()) {
    const { field, wire } = r.key();
    if (field === 1 && wire === WIRE.bytes) pieces.push(readPiece(r.sub()));
    else if (field === 3 && wire === WIRE.bytes) addDummyPrefix = readAddDummyPrefix(r.sub());
    else r.skip(wire);
  }
  if (pieces.length === 0) r.fail("no pieces");
  return { pieces, addDummyPrefix };
}
