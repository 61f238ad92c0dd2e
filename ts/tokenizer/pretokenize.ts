// Pre-tokenizers for byte-level BPE, per `tokenizer.ggml.pre`, reproducing llama.cpp's
// unicode_regex_split: the GPT-2 and Llama-3 patterns run as hand-written scanners (as llama.cpp
// does); any other pattern runs as a regular expression over a "collapsed" copy of the text in
// which every non-ASCII code point is replaced by one stand-in character for its category
// (\p{L} -> U+00D2, \p{N} -> U+00D1, ...; non-ASCII whitespace -> \v), exactly the trick
// llama.cpp uses to run Unicode classes through std::regex. Doing the same keeps the quirks
// (e.g. \p{S} does not cover '~' among ASCII characters).
import { InferError, quote } from "../errors.ts";
import { Cat, category, codePoints, isLetter, isNumber, isWhitespace } from "./unicode.ts";

const GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
const LLAMA3 = CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}" +
  "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2 = CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" +
  "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN35 = CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}" +
  "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// o200k (gpt-4o, gpt-oss) as llama.cpp rewrites it for std::regex: an upper-case run then a
// lower-case one (or the reverse), "letters but not a-z" by lookahead, contractions any case.
const CONTRACTIONS_ANY = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?";
const GPT4O = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" +
  CONTRACTIONS_ANY + "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" +
  CONTRACTIONS_ANY + "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const DEFAULT = ["[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2, "\\p{N}+", "[0-9][0-9][0-9]"];

export interface PreTokenizer {
  readonly name: string;
  readonly regexes: readonly string[];
  /** Whether detokenization removes spaces before punctuation (llama.cpp `clean_spaces`). */
  readonly cleanSpaces: boolean;
  /** Whether a pre-token that is already a vocabulary entry skips the merges. */
  readonly ignoreMerges: boolean;
  readonly addBos: boolean;
}

type Flags = Omit<PreTokenizer, "name">;
const flags = (regexes: string[], clean: boolean, ignoreMerges = false, addBos = false): Flags =>
  ({ regexes, cleanSpaces: clean, ignoreMerges, addBos });

// Names and flags as in llama_vocab::impl::load; pre-tokenizers that also change which special
// tokens are added (add_sep, a removed BOS) are left out rather than half supported.
const PRE: Record<string, Flags> = {};
const define = (names: string[], f: Flags) => { for (const n of names) PRE[n] = f; };
define(["default"], flags(DEFAULT, true));
define(["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
  "jina-v5-nano"], flags([LLAMA3], true, true, true));
define(["dbrx", "smaug-bpe"], flags([LLAMA3], true));
define(["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
  "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo", "jais", "exaone4"], flags([GPT2], true));
define(["trillion", "granite-docling"], flags([GPT2], false));
define(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"],
  flags([QWEN2], false));
define(["megrez", "stablelm2"], flags([QWEN2], true));
define(["qwen35"], flags([QWEN35], false));
define(["gpt-4o", "llama4", "kanana2", "talkie"], flags([GPT4O], false));
define(["starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"],
  flags(["\\p{N}", GPT2], true));
define(["command-r", "smollm"], flags(["\\p{N}", GPT2], false));

export function preTokenizer(name: string): PreTokenizer {
  const key = name === "" ? "default" : name;
  const f = Object.hasOwn(PRE, key) ? PRE[key] : undefined;
  if (f === undefined) throw new InferError("bad_model", `unknown pre-tokenizer type: ${quote(name)}`);
  return { name: key, ...f };
}

/** Split `text` into pre-tokens (as strings of code points). */
export function preSplit(pre: PreTokenizer, text: string): string[] {
  const cps = codePoints(text);
  let pieces = [cps.length];
  let collapsed: string | null = null;
  for (const re of pre.regexes) {
    if (re === GPT2) pieces = scanGpt2(cps, pieces);
    else if (re === LLAMA3) pieces = scanLlama3(cps, pieces);
    else {
      collapsed ??= collapse(cps);
      pieces = splitByRegex(collapsed, compile(re), pieces);
    }
  }
  const words: string[] = [];
  let at = 0;
  for (const n of pieces) {
    words.push(String.fromCodePoint(...cps.slice(at, at + n)));
    at += n;
  }
  return words;
}

// --- scanners for the two patterns llama.cpp hand-codes -------------------------------------

type Span = { cps: number[]; lo: number; hi: number };
const cpAt = (s: Span, i: number) => (i >= s.lo && i < s.hi ? s.cps[i] : -1);
const letterAt = (s: Span, i: number) => i >= s.lo && i < s.hi && isLetter(s.cps[i]);
const numberAt = (s: Span, i: number) => i >= s.lo && i < s.hi && isNumber(s.cps[i]);
const spaceAt = (s: Span, i: number) => i >= s.lo && i < s.hi && isWhitespace(s.cps[i]);
const otherAt = (s: Span, i: number) =>
  i >= s.lo && i < s.hi && !isWhitespace(s.cps[i]) && !isLetter(s.cps[i]) && !isNumber(s.cps[i]);
const lower = (cp: number) => (cp >= 0x41 && cp <= 0x5a ? cp + 0x20 : cp);

/** Length of a contraction ('s 't 'm 'd 're 've 'll) at `i`, or 0. */
function contraction(s: Span, i: number, caseless: boolean): number {
  if (cpAt(s, i) !== 0x27 || i + 1 >= s.hi) return 0;
  const fold = caseless ? lower : (c: number) => c;
  const a = fold(cpAt(s, i + 1));
  if (a === 0x73 || a === 0x74 || a === 0x6d || a === 0x64) return 2; // s t m d
  if (i + 2 >= s.hi) return 0;
  const b = fold(cpAt(s, i + 2));
  if ((a === 0x72 && b === 0x65) || (a === 0x76 && b === 0x65) || (a === 0x6c && b === 0x6c)) {
    return 3; // re ve ll
  }
  return 0;
}

/** Shared tail: \s+(?!\S) | \s+ (and, for Llama 3, \s*[\r\n]+ before them). */
function whitespaceRun(s: Span, pos: number, newlines: boolean): number {
  let n = 0;
  let lastNl = -1;
  while (spaceAt(s, pos + n)) {
    const c = s.cps[pos + n];
    if (c === 0x0a || c === 0x0d) lastNl = pos + n + 1;
    n++;
  }
  if (newlines && lastNl >= 0) return lastNl;
  if (n > 1 && pos + n < s.hi) return pos + n - 1; // leave the last space to the next word
  if (n > 0) return pos + n;
  return pos + 1; // no pattern matches: the character stands alone
}

function scanSegments(cps: number[], pieces: number[],
                      step: (s: Span, pos: number) => number): number[] {
  const out: number[] = [];
  let lo = 0;
  for (const n of pieces) {
    const s: Span = { cps, lo, hi: lo + n };
    for (let pos = lo; pos < s.hi;) {
      const end = step(s, pos);
      out.push(end - pos);
      pos = end;
    }
    lo += n;
  }
  return out;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
function scanGpt2(cps: number[], pieces: number[]): number[] {
  return scanSegments(cps, pieces, (s, pos) => {
    const c = contraction(s, pos, false);
    if (c > 0) return pos + c;
    const q = cpAt(s, pos) === 0x20 ? pos + 1 : pos;
    for (const cls of [letterAt, numberAt, otherAt]) {
      if (cls(s, q)) {
        let e = q;
        while (cls(s, e)) e++;
        return e;
      }
    }
    return whitespaceRun(s, pos, false);
  });
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*
// |\s*[\r\n]+|\s+(?!\S)|\s+
function scanLlama3(cps: number[], pieces: number[]): number[] {
  return scanSegments(cps, pieces, (s, pos) => {
    const c = contraction(s, pos, true);
    if (c > 0) return pos + c;
    const cp = cpAt(s, pos);
    if (cp !== 0x0d && cp !== 0x0a && !numberAt(s, pos) &&
        (letterAt(s, pos) || letterAt(s, pos + 1))) {
      let e = pos + 1;
      while (letterAt(s, e)) e++;
      return e;
    }
    if (numberAt(s, pos)) {
      let e = pos;
      while (e - pos < 3 && numberAt(s, e)) e++;
      return e;
    }
    const q = cp === 0x20 ? pos + 1 : pos;
    if (otherAt(s, q)) {
      let e = q;
      while (otherAt(s, e)) e++;
      while (cpAt(s, e) === 0x0d || cpAt(s, e) === 0x0a) e++;
      return e;
    }
    return whitespaceRun(s, pos, true);
  });
}

// --- general patterns over collapsed text ---------------------------------------------------

const CAT_CHAR: Partial<Record<Cat, string>> = {
  [Cat.number]: "\u00d1", [Cat.letter]: "\u00d2", [Cat.punctuation]: "\u00d3",
  [Cat.mark]: "\u00d4", [Cat.symbol]: "\u00d5",
};
const OTHER_CHAR = "\u00d0";

// What each class becomes inside brackets: its stand-in plus the ASCII members llama.cpp lists.
const CLASS_BODY: Record<string, string> = {
  "\\p{N}": "\u00d10-9",
  "\\p{L}": "\u00d2A-Za-z", "\\p{Lu}": "\u00d2A-Za-z", "\\p{Ll}": "\u00d2A-Za-z",
  "\\p{Lt}": "\u00d2A-Za-z", "\\p{Lm}": "\u00d2A-Za-z", "\\p{Lo}": "\u00d2A-Za-z",
  "\\p{P}": "\u00d3!-#%-*,-/:-;?-@\\[-\\]_\\{\\}",
  "\\p{M}": "\u00d4",
  "\\p{S}": "\u00d5\\$\\+<->\\^`\\|",
};

function collapse(cps: number[]): string {
  let s = "";
  for (const cp of cps) {
    if (cp < 0x80) s += String.fromCharCode(cp);
    else if (isWhitespace(cp)) s += "\x0b";
    else s += CAT_CHAR[category(cp)] ?? OTHER_CHAR;
  }
  return s;
}

const compiled = new Map<string, RegExp>();

function compile(pattern: string): RegExp {
  let re = compiled.get(pattern);
  if (re) return re;
  let out = "";
  let inside = false;
  for (let i = 0; i < pattern.length; i++) {
    const ch = pattern[i];
    if (ch === "[" && (i === 0 || pattern[i - 1] !== "\\")) {
      out += ch;
      inside = true;
      continue;
    }
    if (inside && ch === "]" && pattern[i - 1] !== "\\") {
      out += ch;
      inside = false;
      continue;
    }
    if (ch === "\\" && pattern.startsWith("\\p{", i)) {
      const close = pattern.indexOf("}", i + 3);
      const body = close >= 0 ? CLASS_BODY[pattern.slice(i, close + 1)] : undefined;
      if (body !== undefined) {
        out += inside ? body : `[${body}]`;
        i = close;
        continue;
      }
    }
    out += ch;
  }
  re = new RegExp(out, "g");
  compiled.set(pattern, re);
  return re;
}

function splitByRegex(text: string, re: RegExp, pieces: number[]): number[] {
  const out: number[] = [];
  let lo = 0;
  for (const n of pieces) {
    const seg = text.slice(lo, lo + n);
    let last = 0;
    re.lastIndex = 0;
    for (let m = re.exec(seg); m !== null; m = re.exec(seg)) {
      if (m[0].length === 0) {
        re.lastIndex++;
        continue;
      }
      if (m.index > last) out.push(m.index - last);
      out.push(m[0].length);
      last = m.index + m[0].length;
    }
    if (last < n) out.push(n - last);
    lo += n;
  }
  return out;
}
