// Reading tool calls out of an answer while it is generated, so that a call's arguments go out
// in fragments as the model writes them (as OpenAI streams function.arguments) and no wrapper
// text (<tool_call>, <|python_tag|>, the {"name": ..., "arguments": envelope) is ever shown.
//
// The text is read a character at a time, so what it gives depends only on the text, never on
// how it was cut into pieces: the fragments of a call joined are its arguments, the same whether
// the answer was streamed or not.
//   - A call's arguments are the JSON the model wrote for them without the whitespace outside
//     its strings; a string value (arguments sent as a JSON text) is decoded, in one fragment.
//   - Until the call's name and the start of its arguments are read, the text may still turn out
//     not to be a call, and is held; if it is not one, it is shown as the text it is. Once the
//     call has begun it stays a call: an answer cut short leaves its arguments cut short, as
//     OpenAI's do when the length limit ends them.
//   - Llama 3.1's <|python_tag|> opens a JSON call, a built-in tool's `name.call(key=value, ...)`
//     (arguments {"key": value, ...}), or else code to run: the call "python" with {"code"}, as
//     llama.cpp reads them.
//   - Whitespace that only separates calls from each other or from the ends is not content.
import { BuiltinCallReader, isSpace, JsonCallReader, Step, type CallSink } from "./call-syntax.ts";
import type { ToolCall, ToolCallFormat } from "./tools.ts";

/** A piece of a call as a stream sends it: the first names it, the rest extend its arguments. */
export interface ToolCallDelta {
  /** The call's place among the answer's calls. */
  readonly index: number;
  /** The first delta of a call: its id and name (arguments ""). */
  readonly id?: string;
  readonly name?: string;
  readonly arguments: string;
}

export interface ParsedAnswer {
  readonly content: string;
  /** Calls completed with this piece. */
  readonly calls: readonly ToolCall[];
  /** Calls begun or extended with this piece, in order. */
  readonly deltas: readonly ToolCallDelta[];
}

const randomId = () => "call_" + crypto.randomUUID().replaceAll("-", "").slice(0, 24);

const HERMES_OPEN = "<tool_call>", HERMES_CLOSE = "</tool_call>";
const PYTHON_TAG = "<|python_tag|>";

/** Longest end of `text` that could be the start of `marker`. */
function partialMarker(text: string, marker: string): number {
  for (let n = Math.min(marker.length - 1, text.length); n > 0; n--) {
    if (marker.startsWith(text.slice(text.length - n))) return n;
  }
  return 0;
}

/**
 * Reads an answer as it is generated. feed() gives what may be shown now: text, calls begun or
 * extended (deltas), calls completed; end() the rest.
 */
export class ToolCallReader {
  readonly calls: ToolCall[] = [];
  content = "";
  private pending = "";
  /** The call being read, with the raw text it has taken (shown if it is not a call). */
  private call: { reader: JsonCallReader | BuiltinCallReader | null; raw: string;
    /** After <|python_tag|>: what follows is not known yet (JSON, built-in, or code). */
    tag: string | null; code: boolean; trailing: string; id: string; name: string;
    args: string; begun: boolean; } | null = null;
  /** Hermes, after a call's JSON: the </tool_call> being read. */
  private closing: string | null = null;
  /** Whitespace held until it is known whether it only separates calls. */
  private space = "";
  /** Text (not only whitespace) shown since the last call or the start. */
  private spoken = false;
  private piece: { content: string; calls: ToolCall[]; deltas: ToolCallDelta[] } =
    { content: "", calls: [], deltas: [] };

  constructor(private readonly format: ToolCallFormat) {}

  feed(text: string): ParsedAnswer {
    this.pending += text;
    this.run(false);
    return this.take();
  }

  end(): ParsedAnswer {
    this.run(true);
    const c = this.call;
    if (c !== null) {
      if (c.tag !== null && c.tag.trim() !== "") this.startCode(c.tag.trimStart());
      if (c.code) {
        this.readCode();
        this.finishCode();
      } else if (c.tag !== null) this.call = null; // a bare <|python_tag|>
      else if (c.begun) this.complete();
      else this.notACall();
    }
    this.closing = null;
    if (this.spoken || this.calls.length === 0) this.say(this.space);
    this.space = "";
    return this.take();
  }

  private take(): ParsedAnswer {
    const p = this.piece;
    this.piece = { content: "", calls: [], deltas: [] };
    return p;
  }

  private say(text: string): void {
    if (text === "") return;
    this.piece.content += text;
    this.content += text;
  }

  /** Plain text: whitespace waits to see whether it only separates calls. */
  private text(text: string): void {
    for (const c of text) {
      if (isSpace(c)) this.space += c;
      else {
        // (whitespace after a call is not content either)
        this.say((this.spoken || this.calls.length === 0 ? this.space : "") + c);
        this.space = "";
        this.spoken = true;
      }
    }
  }

  private run(final: boolean): void {
    while (this.pending !== "") {
      if (this.call !== null) {
        this.readCall();
        continue;
      }
      if (this.closing !== null) {
        this.readClose(final);
        continue;
      }
      if (!this.readText(final)) return;
    }
  }

  /** Text until a call opens; false when what is left must wait for more. */
  private readText(final: boolean): boolean {
    const f = this.format;
    if (f !== "hermes" && !this.spoken) {
      const start = this.pending.search(/\S/);
      if (start < 0) {
        this.space += this.pending;
        this.pending = "";
        return false;
      }
      this.space += this.pending.slice(0, start);
      this.pending = this.pending.slice(start);
      // (Llama writes several calls as {...}; {...})
      if (this.pending[0] === ";" && this.calls.length > 0) {
        this.pending = this.pending.slice(1);
        return true;
      }
      if (this.pending[0] === "{") {
        this.open("");
        return true;
      }
    }
    const marker = f === "hermes" ? HERMES_OPEN : f === "llama3" ? PYTHON_TAG : null;
    const at = marker === null ? -1 : this.pending.indexOf(marker);
    if (at >= 0) {
      this.text(this.pending.slice(0, at));
      this.pending = this.pending.slice(at + marker!.length);
      this.open(marker!);
      return true;
    }
    const keep = marker === null || final ? 0 : partialMarker(this.pending, marker);
    this.text(this.pending.slice(0, this.pending.length - keep));
    this.pending = this.pending.slice(this.pending.length - keep);
    return false;
  }

  private open(marker: string): void {
    this.space = ""; // whitespace before a call is not content
    const tag = marker === PYTHON_TAG;
    this.call = { reader: tag ? null : this.jsonReader(), raw: marker, tag: tag ? "" : null,
      code: false, trailing: "", id: randomId(), name: "", args: "", begun: false };
  }

  private jsonReader(): JsonCallReader {
    const sink: CallSink = {
      begin: (name) => this.begin(name),
      args: (text) => this.args(text),
      response: (text) => this.say(text),
    };
    return new JsonCallReader(sink, this.format === "generic");
  }

  private begin(name: string): void {
    const c = this.call!;
    c.begun = true;
    c.name = name;
    this.piece.deltas.push({ index: this.calls.length, id: c.id, name, arguments: "" });
  }

  private args(text: string): void {
    if (text === "") return;
    const c = this.call!;
    c.args += text;
    const last = this.piece.deltas.at(-1);
    if (last !== undefined && last.index === this.calls.length && last.id === undefined) {
      this.piece.deltas[this.piece.deltas.length - 1] = { ...last,
        arguments: last.arguments + text };
    } else this.piece.deltas.push({ index: this.calls.length, arguments: text });
  }

  private readCall(): void {
    const c = this.call!;
    if (c.tag !== null) return this.readTag();
    if (c.code) return this.readCode();
    const chars = [...this.pending];
    for (let i = 0; i < chars.length; i++) {
      const ch = chars[i];
      c.raw += ch;
      const step = c.reader!.push(ch);
      if (step === Step.More) continue;
      const rest = chars.slice(i + 1).join("");
      this.pending = rest;
      const answered = c.reader instanceof JsonCallReader && c.reader.committed && !c.begun;
      if (step === Step.Abort && !c.begun && !answered) return this.notACall();
      this.complete();
      if (answered) this.spoken = true; // generic's answer in words
      return;
    }
    this.pending = "";
  }

  /** After <|python_tag|>: a JSON call, a built-in tool's call, or code. */
  private readTag(): void {
    const c = this.call!;
    c.tag += this.pending;
    this.pending = "";
    const text = c.tag!.trimStart();
    if (text === "") return;
    if (text[0] === "{") {
      c.raw += c.tag!.slice(0, c.tag!.length - text.length);
      c.tag = null;
      c.reader = this.jsonReader();
      this.pending = text;
      return;
    }
    const builtin = /^(\w+)\s*\.\s*call\s*\(/.exec(text);
    if (builtin) {
      c.tag = null;
      c.reader = new BuiltinCallReader({ begin: () => {}, args: (t) => this.args(t),
        response: () => {} });
      this.begin(builtin[1]);
      this.args("{");
      this.pending = text.slice(builtin[0].length);
      return;
    }
    if (/^\w*\s*(\.\s*(c(a(l(l\s*)?)?)?)?)?$/.test(text)) return; // may still be one
    this.startCode(text);
  }

  private startCode(text: string): void {
    const c = this.call!;
    c.tag = null;
    c.code = true;
    this.begin("python");
    this.args('{"code":"');
    this.pending = text;
  }

  /** Code after <|python_tag|>: the call python({"code"}), its trailing whitespace trimmed. */
  private readCode(): void {
    const c = this.call!;
    let text = c.trailing + this.pending;
    this.pending = "";
    const end = text.trimEnd().length;
    let keep = text.length - end;
    // (a high surrogate waits for its pair, so that each fragment is escaped as the whole is)
    const last = text.charCodeAt(end - 1);
    if (keep === 0 && last >= 0xd800 && last < 0xdc00) keep = 1;
    c.trailing = text.slice(text.length - keep);
    text = text.slice(0, text.length - keep);
    if (text !== "") this.args(JSON.stringify(text).slice(1, -1));
  }

  private finishCode(): void {
    const c = this.call!;
    const tail = c.trailing.trimEnd();
    if (tail !== "") this.args(JSON.stringify(tail).slice(1, -1));
    this.args('"}');
    this.complete();
  }

  /** The call is read: it joins the calls; hermes then reads its </tool_call>. */
  private complete(): void {
    const c = this.call!;
    this.call = null;
    if (c.begun) {
      const call: ToolCall = { id: c.id, name: c.name, arguments: c.args };
      this.calls.push(call);
      this.piece.calls.push(call);
      this.spoken = false;
      this.space = "";
      if (this.format === "hermes" && c.raw.startsWith(HERMES_OPEN)) this.closing = "";
    }
  }

  /** What was held as a call's beginning is text after all. */
  private notACall(): void {
    const c = this.call!;
    this.call = null;
    // (a <|python_tag|> token means a call: it is never shown)
    this.text(c.raw.startsWith(PYTHON_TAG) ? c.raw.slice(PYTHON_TAG.length) : c.raw);
  }

  /** Hermes: whitespace and </tool_call> after a call are not content. */
  private readClose(final: boolean): void {
    const text = this.closing! + this.pending;
    const trimmed = text.trimStart();
    if (trimmed.startsWith(HERMES_CLOSE)) {
      this.closing = null;
      this.pending = trimmed.slice(HERMES_CLOSE.length);
      return;
    }
    if (!final && HERMES_CLOSE.startsWith(trimmed)) {
      this.closing = text;
      this.pending = "";
      return;
    }
    // no </tool_call> (the model left it out): what follows is read as usual
    this.closing = null;
    this.pending = text;
  }
}
