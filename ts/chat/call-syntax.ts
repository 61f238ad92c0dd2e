// The syntax of one tool call, read a character at a time (tool-reader.ts drives it): a call
// written as a JSON object ({"name", "arguments" or "parameters"}, generic's {"response"}), and
// a Llama 3.1 built-in tool's Python-style call, name.call(key=value, ...). Each reader says
// when the call has begun and hands out its arguments' text as it is read.

export const isSpace = (c: string) => c === " " || c === "\n" || c === "\r" || c === "\t";
const ESCAPES: Record<string, string> = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f",
  n: "\n", r: "\r", t: "\t" };

/** A JSON string's characters read one at a time, decoded as they come (done at its quote). */
class JsonStringReader {
  value = "";
  private escape: string | null = null;
  done = false;

  /** Reads `c` (after the opening quote); false when `c` cannot be there. */
  push(c: string): boolean {
    if (this.escape !== null) {
      if (this.escape === "" && c !== "u") {
        const e = ESCAPES[c];
        if (e === undefined) return false;
        this.value += e;
        this.escape = null;
        return true;
      }
      this.escape += c;
      if (this.escape.length === 5) { // "u" and four hex digits
        const hex = this.escape.slice(1);
        if (!/^[0-9a-fA-F]{4}$/.test(hex)) return false;
        this.value += String.fromCharCode(parseInt(hex, 16));
        this.escape = null;
      }
      return true;
    }
    if (c === "\\") this.escape = "";
    else if (c === '"') this.done = true;
    else if (c < " ") return false;
    else this.value += c;
    return true;
  }
}

/** Outcome of one character given to a call's reader. */
export enum Step { More, Done, Abort }

/** What a call's reader tells the answer's reader. */
export interface CallSink {
  /** The call's name and the start of its arguments are read: it is a call. */
  begin(name: string): void;
  args(text: string): void;
  /** Generic format's {"response": "..."}: the answer in words. */
  response(text: string): void;
}

/**
 * One call written as a JSON object: {"name": ..., "<arguments key>": {...}}, with "type" and
 * the keys in any order; generic format's {"response": "..."} too.
 */
export class JsonCallReader {
  private state: "open" | "key?" | "key" | "colon" | "value" | "name" | "raw" | "after" =
    "open";
  private key = new JsonStringReader();
  private str = new JsonStringReader();
  private name: string | null = null;
  private began = false;
  private answered = false;
  /** The raw value being read: "args" streams it, "hold" keeps it until the name comes. */
  private raw: { mode: "args" | "hold" | "skip" | "string" | "response"; depth: number;
    inString: boolean; escape: boolean; scalar: boolean; text: string;
    string: JsonStringReader | null } | null = null;
  /** Arguments read before the name. */
  private held: string | null = null;

  constructor(private readonly sink: CallSink, private readonly respond: boolean) {}

  get committed(): boolean {
    return this.began || this.answered;
  }

  push(c: string): Step {
    switch (this.state) {
      case "open":
        if (isSpace(c)) return Step.More;
        if (c !== "{") return Step.Abort;
        this.state = "key?";
        return Step.More;
      case "key?":
        if (isSpace(c)) return Step.More;
        if (c === "}") return this.close();
        if (c !== '"') return Step.Abort;
        this.key = new JsonStringReader();
        this.state = "key";
        return Step.More;
      case "key":
        if (!this.key.push(c)) return Step.Abort;
        if (this.key.done) this.state = "colon";
        return Step.More;
      case "colon":
        if (isSpace(c)) return Step.More;
        if (c !== ":") return Step.Abort;
        this.state = "value";
        return Step.More;
      case "value":
        if (isSpace(c)) return Step.More;
        return this.startValue(c);
      case "name":
        if (!this.str.push(c)) return Step.Abort;
        if (this.str.done) {
          if (this.name !== null) return Step.Abort;
          this.name = this.str.value;
          this.state = "after";
          if (this.held !== null) this.begin(this.held); // the arguments came first
        }
        return Step.More;
      case "raw":
        return this.rawValue(c);
      case "after":
        if (isSpace(c)) return Step.More;
        if (c === ",") {
          this.state = "key?";
          return Step.More;
        }
        if (c === "}") return this.close();
        return Step.Abort;
    }
  }

  private begin(args: string): void {
    this.began = true;
    this.sink.begin(this.name!);
    if (args !== "") this.sink.args(args);
  }

  private close(): Step {
    return this.began || this.answered ? Step.Done : Step.Abort;
  }

  private startValue(c: string): Step {
    const key = this.key.value;
    if (key === "name") {
      if (c !== '"') return Step.Abort;
      this.str = new JsonStringReader();
      this.state = "name";
      return Step.More;
    }
    const isArgs = key === "arguments" || key === "parameters";
    let mode: "args" | "hold" | "skip" | "response" = "skip";
    if (isArgs && !this.began && this.held === null) mode = this.name !== null ? "args" : "hold";
    else if (key === "response" && this.respond && this.name === null && !this.answered) {
      if (c !== '"') return Step.Abort;
      mode = "response";
      this.answered = true;
    } else if (key !== "type" && !this.committed) return Step.Abort;
    if (mode === "args" && c !== '"') this.begin("");
    this.raw = { mode: mode === "args" && c === '"' ? "string" : mode, depth: 0,
      inString: false, escape: false, scalar: false, text: "", string: null };
    this.state = "raw";
    return this.rawStart(c);
  }

  private rawStart(c: string): Step {
    const r = this.raw!;
    if (c === '"') {
      r.string = new JsonStringReader();
      return Step.More;
    }
    if (c === "{" || c === "[") {
      r.depth = 1;
      this.out(c);
      return Step.More;
    }
    if (c === "}" || c === "]" || c === "," || c === ":") return Step.Abort;
    r.scalar = true;
    this.out(c);
    return Step.More;
  }

  /** Arguments text: streamed once the call has begun, else held until its name is read. */
  private out(text: string): void {
    const r = this.raw!;
    if (r.mode === "args") this.sink.args(text);
    else if (r.mode === "hold") r.text += text;
  }

  private rawValue(c: string): Step {
    const r = this.raw!;
    if (r.string !== null && r.depth === 0) { // a string value
      if (!r.string.push(c)) return Step.Abort;
      if (r.mode === "response" && !r.string.done) {
        // decoded as it comes; an escape still being read is not shown yet
        const shown = r.text.length;
        if (r.string.value.length > shown) {
          this.sink.response(r.string.value.slice(shown));
          r.text = r.string.value;
        }
      }
      if (!r.string.done) return Step.More;
      if (r.mode === "string") this.begin(r.string.value);
      return this.endValue();
    }
    if (r.scalar) {
      if (isSpace(c) || c === "," || c === "}") {
        const step = this.endValue();
        return step === Step.More ? this.push(c) : step;
      }
      this.out(c);
      return Step.More;
    }
    if (r.inString) {
      this.out(c);
      if (r.escape) r.escape = false;
      else if (c === "\\") r.escape = true;
      else if (c === '"') r.inString = false;
      else if (c < " ") return Step.Abort;
      return Step.More;
    }
    if (isSpace(c)) return Step.More; // not part of the arguments' text
    this.out(c);
    if (c === '"') r.inString = true;
    else if (c === "{" || c === "[") r.depth++;
    else if (c === "}" || c === "]") {
      if (--r.depth === 0) return this.endValue();
    }
    return Step.More;
  }

  private endValue(): Step {
    const r = this.raw!;
    this.raw = null;
    this.state = "after";
    if (r.mode === "hold") {
      // (a string value is the arguments' JSON text, decoded)
      const text = r.string !== null ? r.string.value : r.text;
      if (this.name !== null) this.begin(text);
      else this.held = text;
    }
    return Step.More;
  }
}

/**
 * A Llama 3.1 built-in tool's call, `name.call(key=value, ...)`, after <|python_tag|>; values
 * are JSON or Python literals ("..." or '...', numbers, True/False/None). Each argument goes
 * out once read.
 */
export class BuiltinCallReader {
  private state: "key?" | "key" | "eq" | "value" | "after" = "key?";
  private key = "";
  private value = "";
  private quote: string | null = null;
  private escape = false;
  private count = 0;

  constructor(private readonly sink: CallSink) {}

  push(c: string): Step {
    switch (this.state) {
      case "key?":
        if (isSpace(c)) return Step.More;
        if (c === ")" && this.count === 0) return this.close();
        if (!/\w/.test(c)) return Step.Abort;
        this.key = c;
        this.state = "key";
        return Step.More;
      case "key":
        if (/\w/.test(c)) {
          this.key += c;
          return Step.More;
        }
        this.state = "eq";
        return this.push(c);
      case "eq":
        if (isSpace(c)) return Step.More;
        if (c !== "=") return Step.Abort;
        this.state = "value";
        this.value = "";
        return Step.More;
      case "value":
        return this.readValue(c);
      case "after":
        if (isSpace(c)) return Step.More;
        if (c === ",") {
          this.state = "key?";
          return Step.More;
        }
        if (c === ")") return this.close();
        return Step.Abort;
    }
  }

  private readValue(c: string): Step {
    if (this.quote !== null) {
      this.value += c;
      if (this.escape) this.escape = false;
      else if (c === "\\") this.escape = true;
      else if (c === this.quote) return this.take(pythonString(this.value));
      return Step.More;
    }
    if (this.value === "") {
      if (isSpace(c)) return Step.More;
      if (c === '"' || c === "'") {
        this.quote = c;
        this.value = c;
        return Step.More;
      }
    }
    if (c === "," || c === ")" || isSpace(c)) {
      if (this.value === "") return Step.Abort;
      const step = this.take(pythonScalar(this.value));
      return step === Step.More ? this.push(c) : step;
    }
    this.value += c;
    return Step.More;
  }

  private take(value: unknown): Step {
    if (value === undefined) return Step.Abort;
    this.sink.args((this.count++ === 0 ? "" : ",") + JSON.stringify(this.key) + ":" +
      JSON.stringify(value));
    this.quote = null;
    this.state = "after";
    return Step.More;
  }

  private close(): Step {
    this.sink.args("}");
    return Step.Done;
  }
}

/** A quoted Python or JSON string literal's value, or undefined. */
function pythonString(literal: string): string | undefined {
  const body = literal.slice(1, -1);
  if (literal[0] === '"') {
    try {
      return JSON.parse(literal) as string;
    } catch { /* a Python escape JSON lacks */ }
  }
  let out = "";
  for (let i = 0; i < body.length; i++) {
    const c = body[i];
    if (c !== "\\") {
      out += c;
      continue;
    }
    const e = body[++i];
    out += e === "n" ? "\n" : e === "t" ? "\t" : e === "r" ? "\r" : e;
  }
  return out;
}

function pythonScalar(text: string): unknown {
  if (text === "True" || text === "true") return true;
  if (text === "False" || text === "false") return false;
  if (text === "None" || text === "null") return null;
  const n = Number(text);
  return Number.isFinite(n) && /^-?[\d.eE+-]+$/.test(text) ? n : undefined;
}
