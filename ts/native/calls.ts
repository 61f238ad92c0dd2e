// Native calls by named arguments (their Zig names), for code that records calls to make later
// (the CUDA backend's decode steps): a call whose one argument is a struct of lib/abi.zig gets
// it packed; the others get their arguments in their Zig parameters' order (symbols.gen.ts).
import type { FFIType } from "bun:ffi";
import { packed, type StructValues } from "./abi.ts";
import { native } from "./lib.ts";
import { parameters, structArgs, symbols } from "./symbols.gen.ts";

export type CallName = keyof typeof symbols;
type StructCall = keyof typeof structArgs;
type Params<F extends CallName> = (typeof parameters)[F];
type FfiArgs<F extends CallName> = (typeof symbols)[F]["args"];
/** Parameter I of call F as a value: boolean for a bool, else a number. */
type ParamValue<F extends CallName, I> = I extends keyof FfiArgs<F>
  ? (FfiArgs<F>[I] extends FFIType.bool ? boolean : number) : never;
/** The arguments of call F by name: its struct's fields, or its parameters. */
export type NamedArgs<F extends CallName> = F extends StructCall ? StructValues<(typeof structArgs)[F]>
  : { -readonly [I in keyof Params<F> & `${number}` as Params<F>[I] & string]: ParamValue<F, I> };

/** Makes call `fn` with `args`; its status (or result). */
export function callNamed<F extends CallName>(fn: F, args: NamedArgs<F>): number {
  const f = native()[fn] as unknown as (...a: unknown[]) => number;
  if (fn in structArgs) {
    const struct = structArgs[fn as StructCall];
    return f(packed(struct, args as StructValues<typeof struct>));
  }
  const named = args as Record<string, number | boolean>;
  return f(...(parameters[fn] as readonly string[]).map((p) => named[p]));
}
