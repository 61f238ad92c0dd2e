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
