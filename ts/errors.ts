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
 * bytes, quotes and terminal escapes escaped, C1 controls included) and cut to `max` characters,
 * so that a corrupted length cannot turn one error line into megabytes.
 */
export function quote(text: string, max = 80): string {
  const cut = text.length > max;
  const shown = JSON.stringify(cut ? text.slice(0, max) : text)
    .replace(/[\u007f-\u009f\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
  return cut ? `${shown.slice(0, -1)}…" (${text.length} characters)` : shown;
}
