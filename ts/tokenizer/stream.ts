// Detokenization: token pieces as llama.cpp's token_to_piece makes them, the whole-text
// clean-up some BPE models ask for (llama_detokenize's clean_spaces), and a streaming decoder
// that returns text as soon as it is final: partial UTF-8 sequences are held back, and with
// clean-up on, so is a tail that a later token could still change.

export interface StreamDecoder {
  /** Add one token; returns the text that became final (possibly ""). */
  push(id: number): string;
  /** End of stream: returns whatever was held back (incomplete UTF-8 becomes U+FFFD). */
  flush(): string;
}

export interface PieceSource {
  /** The bytes of token `id`; `first` says it is the first token of the text. */
  piece(id: number, first: boolean): Uint8Array;
  readonly cleanSpaces: boolean;
}

const SPACE = 0x20;
const APOS = 0x27;
const isAny = (c: number, s: string) => s.includes(String.fromCharCode(c));

/**
 * llama_detokenize's clean_spaces, three passes over the bytes: drop a space before ? ! . ,;
 * turn " ' " into "'"; drop the space before 's 'm 're 've (not 't 'd 'll).
 */
export function cleanSpaces(text: Uint8Array): Uint8Array {
  let a = Array.from(text);
  let out: number[] = [];
  for (let i = 0; i < a.length; i++) {
    if (i > 0 && a[i - 1] === SPACE && isAny(a[i], "?!.,")) out.pop();
    out.push(a[i]);
  }
  a = out;
  out = [];
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    if (i > 0 && x === APOS && i + 1 < a.length && a[i - 1] === SPACE && a[i + 1] === SPACE) {
      out.pop();
      a[i + 1] = 0; // the next space is consumed, and is no longer a space for what follows
      out.push(x);
      i++;
      continue;
    }
    out.push(x);
  }
  a = out;
  out = [];
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    if (i > 0 && a[i - 1] === SPACE && x === APOS && i + 1 < a.length) {
      const x1 = a[i + 1];
      const x2 = i + 2 < a.length ? a[i + 2] : -1;
      const two = (p: string) => x1 === p.charCodeAt(0) && x2 === p.charCodeAt(1);
      if (isAny(x1, "sm") || (x2 >= 0 && (two("re") || two("ve")))) out.pop();
    }
    out.push(x);
  }
  return Uint8Array.from(out);
}

function concat(parts: Uint8Array[]): Uint8Array {
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

export function decodeAll(src: PieceSource, ids: readonly number[]): string {
  let bytes = concat(ids.map((id, i) => src.piece(id, i === 0)));
  if (src.cleanSpaces) bytes = cleanSpaces(bytes);
  return new TextDecoder("utf-8", { ignoreBOM: true }).decode(bytes);
}

// Spaces drive every clean-up rule and a rule looks at most two bytes past its space, so a
// cut after three non-space bytes splits the text where cleaning each part alone is exact.
const CLEAN_GUARD = 3;

export class PieceStreamDecoder implements StreamDecoder {
  private readonly utf8 = new TextDecoder("utf-8", { ignoreBOM: true });
  private first = true;
  private held: number[] = [];

  constructor(private readonly src: PieceSource) {}

  push(id: number): string {
    const piece = this.src.piece(id, this.first);
    this.first = false;
    if (!this.src.cleanSpaces) return this.utf8.decode(piece, { stream: true });
    for (const b of piece) this.held.push(b);
    let cut = this.held.length;
    while (cut > 0 && this.held.slice(Math.max(0, cut - CLEAN_GUARD), cut).includes(SPACE)) cut--;
    if (cut === 0) return "";
    const ready = Uint8Array.from(this.held.slice(0, cut));
    this.held = this.held.slice(cut);
    return this.utf8.decode(cleanSpaces(ready), { stream: true });
  }

  flush(): string {
    const rest = this.held.length > 0 ? cleanSpaces(Uint8Array.from(this.held)) : undefined;
    this.held = [];
    return this.utf8.decode(rest);
  }
}
