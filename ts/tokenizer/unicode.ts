// Unicode helpers shared by the tokenizers: code point classes as llama.cpp's unicode.cpp sees
// them (one category per code point, White_Space as whitespace), UTF-8 byte lengths, and GPT-2's
// byte-to-unicode table used by byte-level BPE. Categories come from the JS engine's Unicode
// tables; llama.cpp ships its own (generated from a Python `unicodedata`), so code points whose
// category changed between Unicode versions may be classed differently.

/** General category of a code point, collapsed to its major class (llama.cpp's flags). */
export const Cat = {
  undefined: 0, // Cn (unassigned)
  number: 1, // \p{N}
  letter: 2, // \p{L}
  separator: 3, // \p{Z}
  mark: 4, // \p{M}
  punctuation: 5, // \p{P}
  symbol: 6, // \p{S}
  control: 7, // Cc, Cf, Co, Cs
} as const;
export type Cat = (typeof Cat)[keyof typeof Cat];

const reLetter = /^\p{L}$/u;
const reNumber = /^\p{N}$/u;
const reSeparator = /^\p{Z}$/u;
const reMark = /^\p{M}$/u;
const rePunct = /^\p{P}$/u;
const reSymbol = /^\p{S}$/u;
const reUnassigned = /^\p{Cn}$/u;
const reWhite = /^\p{White_Space}$/u;

const CAT_MASK = 0x0f;
const WHITE_BIT = 0x10;
const UNKNOWN = 0xff;

// One byte per code point: category in the low nibble, White_Space in bit 4. Filled lazily.
let classTable: Uint8Array | null = null;

function classify(cp: number): number {
  if (cp >= 0xd800 && cp <= 0xdfff) return Cat.control; // lone surrogates never reach here
  const s = String.fromCodePoint(cp);
  let cat: Cat;
  if (reLetter.test(s)) cat = Cat.letter;
  else if (reNumber.test(s)) cat = Cat.number;
  else if (reSeparator.test(s)) cat = Cat.separator;
  else if (reMark.test(s)) cat = Cat.mark;
  else if (rePunct.test(s)) cat = Cat.punctuation;
  else if (reSymbol.test(s)) cat = Cat.symbol;
  else if (reUnassigned.test(s)) cat = Cat.undefined;
  else cat = Cat.control;
  return cat | (reWhite.test(s) ? WHITE_BIT : 0);
}

function cpClass(cp: number): number {
  if (classTable === null) classTable = new Uint8Array(0x110000).fill(UNKNOWN);
  let c = classTable[cp];
  if (c === UNKNOWN) {
    c = classify(cp);
    classTable[cp] = c;
  }
  return c;
}

export function category(cp: number): Cat {
  return (cpClass(cp) & CAT_MASK) as Cat;
}

export function isWhitespace(cp: number): boolean {
  return (cpClass(cp) & WHITE_BIT) !== 0;
}

export function isLetter(cp: number): boolean {
  return (cpClass(cp) & CAT_MASK) === Cat.letter;
}

export function isNumber(cp: number): boolean {
  return (cpClass(cp) & CAT_MASK) === Cat.number;
}

/** Code points of a string (a lone surrogate becomes U+FFFD, as UTF-8 encoding would make it). */
export function codePoints(text: string): number[] {
  const out: number[] = [];
  for (const ch of text) {
    const cp = ch.codePointAt(0)!;
    out.push(cp >= 0xd800 && cp <= 0xdfff ? 0xfffd : cp);
  }
  return out;
}

export function utf8Length(text: string): number {
  let n = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < text.length) {
      const d = text.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        n += 4;
        i++;
      } else n += 3;
    } else n += 3;
  }
  return n;
}

const encoder = new TextEncoder();
export function utf8Bytes(text: string): Uint8Array {
  return encoder.encode(text);
}

// GPT-2's reversible byte <-> unicode mapping: printable Latin-1 bytes map to themselves, the
// other 68 bytes to U+0100.. in byte order, so every byte is a visible, non-space character.
let byteToChar: string[] | null = null;
let charToByte: Map<number, number> | null = null;

function buildByteMaps(): void {
  const direct = (b: number) =>
    (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const b2c: string[] = new Array(256);
  const c2b = new Map<number, number>();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const cp = direct(b) ? b : 256 + n++;
    b2c[b] = String.fromCharCode(cp);
    c2b.set(cp, b);
  }
  byteToChar = b2c;
  charToByte = c2b;
}

export function gpt2ByteToChar(): readonly string[] {
  if (byteToChar === null) buildByteMaps();
  return byteToChar!;
}

export function gpt2CharToByte(): ReadonlyMap<number, number> {
  if (charToByte === null) buildByteMaps();
  return charToByte!;
}
