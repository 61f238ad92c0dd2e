// The one error type users see. `code` is stable for programs; `message` is for people.
export type InferErrorCode =
  | "invalid_argument" | "io" | "out_of_memory" | "unsupported" | "internal"
  | "bad_gguf" | "bad_model" | "context_overflow" | "bad_request" | "native_unavailable";

export class InferError extends Error {
  readonly code: InferErrorCode;
  constructor(code: InferErrorCode, message: string) {
    super(message);
    this.name = "InferError";
    this.code = code;
  }
}

/** Assertion for invariants (programming errors), typed so TypeScript narrows after it. */
export function assert(cond: unknown, message: string): asserts cond {
  if (!cond) throw new Error(`assertion failed: ${message}`);
}

/**
 * A string that came from a file or a client, fit to put in a message: JSON-quoted (control
 * bytes, quotes and terminal escapes escaped, C1 controls included) and cut to `max` characters
 * as shown, escapes counted (a string of control bytes would otherwise show six characters for
 * each), so that a corrupted length cannot turn one error line into megabytes.
 */
export function quote(text: string, max = 80): string {
  const escaped = JSON.stringify(text.length > max ? text.slice(0, max) : text).slice(1, -1)
    .replace(/[\u007f-\u009f\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
  // Whole escapes and surrogate pairs only: \uXXXX, \n and the like, or one code point.
  const pieces = escaped.match(/\\u[0-9a-f]{4}|\\.|[\ud800-\udbff][\udc00-\udfff]|[^]/g) ?? [];
  let shown = "", chars = 0;
  for (const piece of pieces) {
    if (shown.length + piece.length > max) break;
    shown += piece;
    chars += piece.startsWith("\\") ? 1 : piece.length;
  }
  return chars < text.length ? `"${shown}…" (${text.length} characters)` : `"${shown}"`;
}
