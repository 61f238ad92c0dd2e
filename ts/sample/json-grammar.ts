// Structured output: a pushdown automaton over bytes that accepts exactly the JSON texts a
// compiled schema (json-schema.ts) allows, used as a mask over the vocabulary so that whatever
// the model samples, the output parses and validates.
//
// The state is a set of stacks (a union can be ambiguous for a while); each stack is a chain of
// immutable frames, so stepping a byte shares everything below the top and a walk over the
// vocabulary trie can branch cheaply. Per token, the mask walks the trie from the current state
// and prunes every subtree whose prefix dies. Inside a free string almost every token fits, so
// there the tokens that are plain string text (no quote, backslash or control byte, whole UTF-8)
// are allowed wholesale from a precomputed list, and only the rest are walked.
//
// Budget: given how many tokens may still be generated, a token is allowed only if the shortest
// completion after it still fits (one token per byte: every vocabulary has single-byte tokens),
// so generation cut off by -n still ends in valid JSON. A caller that checks, before it starts,
// that the schema's shortest text (minLength, in bytes) fits the tokens it may generate can then
// never meet a state where every token is masked.
//
// Nothing here recurses with the schema or the text: unions and references are flattened once
// (alternatives()), the stack is walked in loops, and the states kept at once are capped.
import type { TokenConstraint } from "./constraint.ts";
import type { Tokenizer } from "../tokenizer/index.ts";
import { alternatives, minLength, type JsonNode } from "./json-schema.ts";
import { GrammarVocab, type ByteTrie } from "./vocab-trie.ts";

const enum Kind { Value, Obj, Arr, Str, Num, Lit, Key, Done }
// Obj phases: after "{", after a key (":" next), after a value ("," or "}"), after ","
const OPEN = 0, AFTER_KEY = 1, AFTER_VALUE = 2, AFTER_COMMA = 3;
// Str phases (UTF8: `n` continuation bytes to come, the first within the range coded in `ws`)
const S_TEXT = 0, S_ESCAPE = 1, S_HEX = 2, S_UTF8 = 3;
// Num phases
const N_SIGN = 0, N_ZERO = 1, N_INT = 2, N_DOT = 3, N_FRAC = 4, N_E = 5, N_ESIGN = 6, N_EXP = 7;

/**
 * Whitespace between tokens, as llama.cpp's JSON grammars allow it: nothing, one space, or a
 * newline and up to 20 spaces or tabs of indentation. `ws` counts it: 0 none yet, 1 after the
 * space, 2 + k after the newline and k indentation bytes. -1: b cannot come next.
 */
const INDENT_MAX = 20;
function nextWs(ws: number, b: number): number {
  if (ws === 0) return b === 0x20 ? 1 : b === 0x0a ? 2 : -1;
  return ws >= 2 && ws - 2 < INDENT_MAX && (b === 0x20 || b === 0x09) ? ws + 1 : -1;
}
/** Digits allowed in the integer and fraction parts, and in the exponent. */
const DIGITS_MAX = 15, EXP_DIGITS_MAX = 3;
/** Alternatives kept at once; more only arise from pathological unions. */
const STATES_MAX = 64;

class Frame {
  constructor(
    readonly kind: Kind,
    readonly parent: Frame | null,
    /** Value: the expected node; Obj/Arr/Num: the (dereferenced) node being read. */
    readonly node: JsonNode | null,
    readonly phase = 0,
    /** Obj: next property index; Arr: items so far; Str/Num: a counter; Lit/Key: bytes matched. */
    readonly n = 0,
    /** Whitespace so far (Value/Obj/Arr, see nextWs); Str: the next continuation byte's range. */
    readonly ws = 0,
    /** Obj after a key: the value's node. */
    readonly pending: JsonNode | null = null,
    /** Lit/Key: the candidate texts still possible, and (Key) their property indices. */
    readonly lits: readonly Uint8Array[] | null = null,
    readonly ids: readonly number[] | null = null,
  ) {}

  /** Bytes in the shortest way to finish the text from here (remaining()); -1: not yet known. */
  rest = -1;
}

const DONE = new Frame(Kind.Done, null, null);
const isWs = (b: number) => b === 0x20 || b === 0x0a || b === 0x09 || b === 0x0d;
const isDigit = (b: number) => b >= 0x30 && b <= 0x39;
const isHex = (b: number) => isDigit(b) || (b >= 0x41 && b <= 0x46) || (b >= 0x61 && b <= 0x66);
const QUOTE = 0x22, BACKSLASH = 0x5c;
// UTF-8 (RFC 3629, table 3-7): continuation bytes after a lead byte (0: not a lead byte), and
// the range the first of them must fall in (code → [lo, hi]; E0, ED, F0 and F4 narrow it).
const UTF8_RANGE = [[0x80, 0xbf], [0xa0, 0xbf], [0x80, 0x9f], [0x90, 0xbf], [0x80, 0x8f]];
const utf8Tail = (b: number) =>
  b >= 0xc2 && b <= 0xdf ? 1 : b >= 0xe0 && b <= 0xef ? 2 : b >= 0xf0 && b <= 0xf4 ? 3 : 0;
const utf8Range = (b: number) =>
  b === 0xe0 ? 1 : b === 0xed ? 2 : b === 0xf0 ? 3 : b === 0xf4 ? 4 : 0;

type ObjNode = JsonNode & { kind: "object" };
type ArrNode = JsonNode & { kind: "array" };

/** Per object node: for each i, the bytes and count of the required members from property i on. */
const requiredTails = new WeakMap<ObjNode, { bytes: number[]; count: number[]; any: number[] }>();
function tails(node: ObjNode) {
  let t = requiredTails.get(node);
  if (!t) {
    const n = node.props.length;
    const filled = (v: number) => new Array<number>(n + 1).fill(v);
    t = { bytes: filled(0), count: filled(0), any: filled(Infinity) };
    for (let i = n - 1; i >= 0; i--) {
      const p = node.props[i], member = p.key.length + 1 + minLength(p.node);
      t.bytes[i] = t.bytes[i + 1] + (p.required ? member : 0);
      t.count[i] = t.count[i + 1] + (p.required ? 1 : 0);
      t.any[i] = Math.min(t.any[i + 1], member);
    }
    requiredTails.set(node, t);
  }
  return t;
}

/** The frame a completed child returns to: its parent, or DONE at the root. */
const up = (parent: Frame | null) => parent ?? DONE;

/** Begins reading a value of `node` with byte b (each alternative of a union or reference). */
function start(node: JsonNode, parent: Frame | null, b: number, out: Frame[]): void {
  for (const n of alternatives(node)) {
    switch (n.kind) {
      case "object": if (b === 0x7b) out.push(new Frame(Kind.Obj, parent, n, OPEN)); break;
      case "array": if (b === 0x5b) out.push(new Frame(Kind.Arr, parent, n, OPEN)); break;
      case "string": if (b === QUOTE) out.push(new Frame(Kind.Str, parent, null, S_TEXT)); break;
      case "number":
        if (b === 0x2d) out.push(new Frame(Kind.Num, parent, n, N_SIGN));
        else if (b === 0x30) out.push(new Frame(Kind.Num, parent, n, N_ZERO));
        else if (isDigit(b)) out.push(new Frame(Kind.Num, parent, n, N_INT, 1));
        break;
      case "literal": literal(n.values, null, 0, parent, b, out); break;
    }
  }
}

/** Matches byte b at position `at` of the candidate texts (Lit, or Key with property ids). */
function literal(lits: readonly Uint8Array[], ids: readonly number[] | null, at: number,
  parent: Frame | null, b: number, out: Frame[]): void {
  let longer: Uint8Array[] | null = null, longerIds: number[] | null = null;
  for (let i = 0; i < lits.length; i++) {
    const c = lits[i];
    if (c[at] !== b) continue;
    if (c.length === at + 1) {
      if (ids === null) out.push(up(parent));
      else { // a key is complete: the object continues after it, expecting ":"
        const obj = parent!, node = obj.node as ObjNode, j = ids[i];
        out.push(new Frame(Kind.Obj, obj.parent, node, AFTER_KEY, j + 1, 0, node.props[j].node));
      }
    } else {
      (longer ??= []).push(c);
      if (ids) (longerIds ??= []).push(ids[i]);
    }
  }
  if (longer) {
    const kind = ids ? Kind.Key : Kind.Lit;
    out.push(new Frame(kind, parent, null, 0, at + 1, 0, null, longer, longerIds));
  }
}

function step(f: Frame, b: number, out: Frame[]): void {
  switch (f.kind) {
    case Kind.Value:
      if (isWs(b)) {
        const ws = nextWs(f.ws, b);
        if (ws >= 0) out.push(new Frame(Kind.Value, f.parent, f.node, 0, 0, ws));
      }
      else start(f.node!, f.parent, b, out);
      return;
    case Kind.Obj: return stepObject(f, b, out);
    case Kind.Arr: return stepArray(f, b, out);
    case Kind.Str: return stepString(f, b, out);
    case Kind.Num: return stepNumber(f, b, out);
    case Kind.Lit: return literal(f.lits!, null, f.n, f.parent, b, out);
    case Kind.Key: return literal(f.lits!, f.ids, f.n, f.parent, b, out);
    case Kind.Done: return;
  }
}

function stepObject(f: Frame, b: number, out: Frame[]): void {
  const node = f.node as ObjNode, props = node.props;
  if (isWs(b)) {
    const ws = nextWs(f.ws, b);
    if (ws >= 0) out.push(new Frame(Kind.Obj, f.parent, node, f.phase, f.n, ws, f.pending));
    return;
  }
  const closable = tails(node).count[f.n] === 0;
  switch (f.phase) {
    case OPEN:
    case AFTER_COMMA:
      if (b === QUOTE) {
        if (props.length > 0) {
          // the next key: any property from n up to and including the first required one
          const lits: Uint8Array[] = [], ids: number[] = [];
          for (let j = f.n; j < props.length; j++) {
            lits.push(props[j].key.subarray(1));
            ids.push(j);
            if (props[j].required) break;
          }
          if (lits.length > 0) out.push(new Frame(Kind.Key, f, null, 0, 0, 0, null, lits, ids));
        } else if (node.additional) {
          const after = new Frame(Kind.Obj, f.parent, node, AFTER_KEY, f.n, 0, node.additional);
          out.push(new Frame(Kind.Str, after, null, S_TEXT));
        }
      } else if (b === 0x7d && f.phase === OPEN && closable) out.push(up(f.parent));
      return;
    case AFTER_KEY:
      if (b === 0x3a) {
        const after = new Frame(Kind.Obj, f.parent, node, AFTER_VALUE, f.n);
        out.push(new Frame(Kind.Value, after, f.pending));
      }
      return;
    case AFTER_VALUE:
      if (b === 0x2c && (props.length > 0 ? f.n < props.length : node.additional !== null)) {
        out.push(new Frame(Kind.Obj, f.parent, node, AFTER_COMMA, f.n));
      } else if (b === 0x7d && closable) out.push(up(f.parent));
      return;
  }
}

function stepArray(f: Frame, b: number, out: Frame[]): void {
  const node = f.node as ArrNode;
  if (isWs(b)) {
    const ws = nextWs(f.ws, b);
    if (ws >= 0) out.push(new Frame(Kind.Arr, f.parent, node, f.phase, f.n, ws));
    return;
  }
  const afterItem = (n: number) => new Frame(Kind.Arr, f.parent, node, AFTER_VALUE, n);
  if (b === 0x5d) {
    if (f.n >= node.minItems) out.push(up(f.parent));
  } else if (f.phase === OPEN) {
    if (node.maxItems >= 1) start(node.items, afterItem(1), b, out);
  } else if (b === 0x2c && f.n < node.maxItems) {
    out.push(new Frame(Kind.Value, afterItem(f.n + 1), node.items));
  }
}

const ESCAPABLE = new Set(Array.from('"\\/bfnrt', (c) => c.charCodeAt(0)));

function stepString(f: Frame, b: number, out: Frame[]): void {
  const next = (phase: number, n = 0, range = 0) =>
    out.push(new Frame(Kind.Str, f.parent, null, phase, n, range));
  switch (f.phase) {
    case S_TEXT:
      if (b === QUOTE) out.push(up(f.parent));
      else if (b === BACKSLASH) next(S_ESCAPE);
      else if (b < 0x20) return;
      else if (b < 0x80) out.push(f); // plain text leaves the state as it is
      else if (utf8Tail(b) > 0) next(S_UTF8, utf8Tail(b), utf8Range(b));
      return;
    case S_ESCAPE:
      if (b === 0x75) next(S_HEX, 0);
      else if (ESCAPABLE.has(b)) next(S_TEXT);
      return;
    case S_HEX:
      if (isHex(b)) next(f.n === 3 ? S_TEXT : S_HEX, f.n + 1);
      return;
    case S_UTF8: {
      const [lo, hi] = UTF8_RANGE[f.ws];
      if (b >= lo && b <= hi) next(f.n === 1 ? S_TEXT : S_UTF8, f.n - 1);
      return;
    }
  }
}

const numberEnds = (phase: number) =>
  phase === N_ZERO || phase === N_INT || phase === N_FRAC || phase === N_EXP;

function stepNumber(f: Frame, b: number, out: Frame[]): void {
  const integer = (f.node as JsonNode & { kind: "number" }).integer;
  const next = (phase: number, n = 0) => out.push(new Frame(Kind.Num, f.parent, f.node, phase, n));
  const digit = isDigit(b), dot = b === 0x2e && !integer;
  const exp = (b === 0x65 || b === 0x45) && !integer;
  switch (f.phase) {
    case N_SIGN: if (b === 0x30) next(N_ZERO); else if (digit) next(N_INT, 1); return;
    case N_DOT: if (digit) next(N_FRAC, 1); return;
    case N_E: if (b === 0x2b || b === 0x2d) next(N_ESIGN); else if (digit) next(N_EXP, 1); return;
    case N_ESIGN: if (digit) next(N_EXP, 1); return;
    case N_ZERO:
      if (dot) next(N_DOT);
      else if (exp) next(N_E);
      else if (!digit) step(up(f.parent), b, out);
      return;
    case N_INT:
    case N_FRAC:
      if (digit) { if (f.n < DIGITS_MAX) next(f.phase, f.n + 1); }
      else if (dot && f.phase === N_INT) next(N_DOT);
      else if (exp) next(N_E);
      else step(up(f.parent), b, out); // the number ended; b belongs to what holds it
      return;
    case N_EXP:
      if (digit) { if (f.n < EXP_DIGITS_MAX) next(N_EXP, f.n + 1); }
      else step(up(f.parent), b, out);
      return;
  }
}

/** The frame whose part of the text comes after f's own (a key's object is in the key's part). */
const outer = (f: Frame) => (f.kind === Kind.Key ? f.parent!.parent : f.parent);

/**
 * Bytes in the shortest way to finish the text from this stack. Frames are immutable and share
 * their parents, so each frame's total is kept on it: a deep stack is summed once, not per call.
 */
function remaining(top: Frame): number {
  const chain: Frame[] = [];
  let f: Frame | null = top;
  for (; f !== null && f.rest < 0; f = outer(f)) chain.push(f);
  let total = f === null ? 0 : f.rest;
  for (let i = chain.length - 1; i >= 0; i--) {
    total += ownRemaining(chain[i]);
    chain[i].rest = total;
  }
  return total;
}

/** Bytes to finish the frame's own part (for a key: its object's too). */
function ownRemaining(frame: Frame): number {
  switch (frame.kind) {
    case Kind.Value: return minLength(frame.node!);
    case Kind.Str: return stringRemaining(frame);
    case Kind.Num: return numberEnds(frame.phase) ? 0 : 1;
    case Kind.Lit: {
      let best = Infinity;
      for (const c of frame.lits!) best = Math.min(best, c.length - frame.n);
      return best;
    }
    case Kind.Key: { // per candidate: the key, ":", its value and the rest of the object
      const node = frame.parent!.node as ObjNode, t = tails(node);
      let best = Infinity;
      frame.lits!.forEach((c, i) => {
        const j = frame.ids![i];
        const value = 1 + minLength(node.props[j].node); // ":" and the value
        best = Math.min(best, c.length - frame.n + value + t.bytes[j + 1] + t.count[j + 1] + 1);
      });
      return best;
    }
    case Kind.Obj: return objectRemaining(frame);
    case Kind.Arr: {
      const node = frame.node as ArrNode, need = Math.max(0, node.minItems - frame.n);
      const items = need * (minLength(node.items) + 1); // each with its comma (or "[")
      return frame.phase === OPEN ? (need === 0 ? 1 : items) : items + 1;
    }
    case Kind.Done: return 0;
  }
}

function stringRemaining(f: Frame): number {
  switch (f.phase) {
    case S_TEXT: return 1;
    case S_ESCAPE: return 2;
    case S_HEX: return 4 - f.n + 1;
    default: return f.n + 1; // UTF-8 continuation bytes, then the quote
  }
}

function objectRemaining(f: Frame): number {
  const node = f.node as ObjNode;
  if (node.props.length === 0) {
    const member = 2 + 1 + (node.additional ? minLength(node.additional) : Infinity);
    if (f.phase === AFTER_KEY) return 1 + minLength(f.pending!) + 1;
    return f.phase === AFTER_COMMA ? member + 1 : 1;
  }
  const t = tails(node), i = f.n;
  switch (f.phase) {
    case AFTER_KEY: return 1 + minLength(f.pending!) + t.bytes[i] + t.count[i] + 1;
    case AFTER_VALUE: return t.bytes[i] + t.count[i] + 1;
    default: // OPEN, AFTER_COMMA: members (comma-separated) then "}"
      if (t.count[i] > 0) return t.bytes[i] + t.count[i] - 1 + 1;
      return f.phase === OPEN ? 1 : t.any[i] + 1;
  }
}

/** A text can end here: complete, or a number at the top level (which could still go on). */
const canEnd = (f: Frame) =>
  f.kind === Kind.Done || (f.kind === Kind.Num && f.parent === null && numberEnds(f.phase));

/** A free string's text, where plain tokens leave the state as it is. */
const inText = (f: Frame) => f.kind === Kind.Str && f.phase === S_TEXT;

/**
 * Whether `bytes` is plain text inside a JSON string (no quote, backslash or control byte; whole
 * UTF-8 characters), so that it leaves a string's state as it found it.
 */
export function isPlainText(bytes: Uint8Array): boolean {
  let i = 0;
  while (i < bytes.length) {
    const b = bytes[i];
    if (b < 0x80) {
      if (b < 0x20 || b === QUOTE || b === BACKSLASH) return false;
      i++;
      continue;
    }
    const n = utf8Tail(b);
    if (n === 0 || i + n >= bytes.length) return false; // a character cut short
    const [lo, hi] = UTF8_RANGE[utf8Range(b)];
    if (bytes[i + 1] < lo || bytes[i + 1] > hi) return false;
    for (let k = 2; k <= n; k++) if (bytes[i + k] < 0x80 || bytes[i + k] > 0xbf) return false;
    i += n + 1;
  }
  return true;
}

export class JsonGrammar implements TokenConstraint {
  private states: Frame[];
  private readonly vocab: GrammarVocab;
  private readonly allowed: Uint8Array;
  private readonly full: ByteTrie;
  private readonly special: ByteTrie;
  private readonly plain: Uint8Array;
  private stack: Frame[][] = [];

  /**
   * `wrap`: fixed text before and after the JSON value (a tool call's <tool_call> markers); its
   * bytes are matched like a literal's, so a token that spells a marker whole is allowed too.
   */
  constructor(tokenizer: Tokenizer, root: JsonNode,
    wrap: { readonly prefix: string; readonly suffix: string } = { prefix: "", suffix: "" }) {
    this.vocab = GrammarVocab.for(tokenizer);
    const bytes = (text: string) => new TextEncoder().encode(text);
    // The chain a value completes into: the suffix's literal, then the end.
    const after = wrap.suffix === "" ? null
      : new Frame(Kind.Lit, null, null, 0, 0, 0, null, [bytes(wrap.suffix)]);
    const value = new Frame(Kind.Value, after, root);
    this.states = [wrap.prefix === "" ? value
      : new Frame(Kind.Lit, value, null, 0, 0, 0, null, [bytes(wrap.prefix)])];
    this.allowed = new Uint8Array(this.vocab.size);
    this.full = this.vocab.trie("all", () => true);
    this.plain = this.vocab.bitmap("plain-text", isPlainText);
    const plain = this.plain;
    this.special = this.vocab.trie("not-plain-text", (_, id) => plain[id] === 0);
  }

  get done(): boolean {
    return this.states.every((s) => s.kind === Kind.Done);
  }

  /** The JSON text so far could end here. */
  get complete(): boolean {
    return this.states.some(canEnd);
  }

  /** Feeds bytes; returns false (state unchanged) if they cannot continue the text. */
  advance(bytes: Uint8Array): boolean {
    let states = this.states;
    for (const b of bytes) {
      states = stepAll(states, b);
      if (states.length === 0) return false;
    }
    this.states = states;
    return true;
  }

  accept(token: number): void {
    if (this.vocab.eog.includes(token)) return;
    if (!this.advance(this.vocab.bytes[token])) {
      throw new Error(`grammar: token ${token} does not continue the JSON text`);
    }
  }

  mask(logits: Float32Array, budget: number): void {
    const allowed = this.allowed;
    allowed.fill(0);
    const fits = (states: Frame[]) => minRemaining(states) <= budget - 1;
    const text = this.states.filter(inText);
    let trie = this.full;
    if (text.length > 0) {
      // plain tokens keep every string state as it is (and may or may not suit the others)
      if (fits(text)) allowed.set(this.plain);
      trie = this.special;
    }
    this.walk(trie, fits);
    const eog = this.vocab.eog;
    if (this.complete) for (let i = 0; i < eog.length; i++) allowed[eog[i]] = 1;
    for (let i = 0; i < logits.length; i++) if (!allowed[i]) logits[i] = -Infinity;
  }

  /** Marks every token of the trie that can follow, pruning dead prefixes. */
  private walk(trie: ByteTrie, fits: (states: Frame[]) => boolean): void {
    const stack = this.stack;
    for (let node = 0; node < trie.size;) {
      const d = trie.depth[node];
      const next = stepAll(d === 0 ? this.states : stack[d - 1], trie.byte[node]);
      if (next.length === 0) { node = trie.end[node]; continue; }
      stack[d] = next;
      const from = trie.first[node], to = trie.first[node + 1];
      if (to > from && fits(next)) for (let k = from; k < to; k++) this.allowed[trie.ids[k]] = 1;
      node++;
    }
  }
}

function stepAll(states: readonly Frame[], b: number): Frame[] {
  const out: Frame[] = [];
  for (const s of states) {
    step(s, b, out);
    if (out.length >= STATES_MAX) break;
  }
  // A union of many options can start many at once; the first ones are kept (each is a valid
  // reading of the text, so what is allowed stays valid).
  if (out.length > STATES_MAX) out.length = STATES_MAX;
  return out;
}

function minRemaining(states: readonly Frame[]): number {
  let best = Infinity;
  for (const s of states) best = Math.min(best, remaining(s));
  return best;
}
