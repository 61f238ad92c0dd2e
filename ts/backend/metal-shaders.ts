// The Metal kernels as source text: shaders/metal/*.metal with their local headers inlined into
// one string (what the library compiles with newLibraryWithSource: that call has no file system,
// so #include "x.h" cannot be resolved there), and what the sources declare, parsed: each
// kernel's parameters (buffer indices, address spaces, attributes) and each argument struct's
// fields. The dispatch plan (metal-plan.ts) is checked against these declarations by
// test/metal-plan.test.ts, and the Linux emulation (test/support/metal-emu.ts) generates its
// launchers from them, so all three read the kernels the same way.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { setting } from "../config/env.ts";
import { InferError } from "../errors.ts";
// The kernels' text is imported, so that `bun build --compile` embeds it in the binary and the
// backend needs no shaders directory at run time; test/metal-msl.test.ts checks that this list
// is exactly shaders/metal's files. INFER_METAL_SHADERS still points at a directory to use instead.
import actMetal from "../../shaders/metal/act.metal" with { type: "text" };
import argsHeader from "../../shaders/metal/args.h" with { type: "text" };
import attentionMetal from "../../shaders/metal/attention.metal" with { type: "text" };
import attentionDecodeMetal from "../../shaders/metal/attention_decode.metal" with { type: "text" };
import attentionPromptMetal from "../../shaders/metal/attention_prompt.metal" with { type: "text" };
import blocksHeader from "../../shaders/metal/blocks.h" with { type: "text" };
import getRowsMetal from "../../shaders/metal/get_rows.metal" with { type: "text" };
import kvHeader from "../../shaders/metal/kv.h" with { type: "text" };
import kvMetal from "../../shaders/metal/kv.metal" with { type: "text" };
import matmulMetal from "../../shaders/metal/matmul.metal" with { type: "text" };
import matvecMetal from "../../shaders/metal/matvec.metal" with { type: "text" };
import matvecRowsMetal from "../../shaders/metal/matvec_rows.metal" with { type: "text" };
import normHeader from "../../shaders/metal/norm.h" with { type: "text" };
import normMetal from "../../shaders/metal/norm.metal" with { type: "text" };
import normRopeStoreMetal from "../../shaders/metal/norm_rope_store.metal" with { type: "text" };
import quantHeader from "../../shaders/metal/quant.h" with { type: "text" };
import ropeHeader from "../../shaders/metal/rope.h" with { type: "text" };
import ropeMetal from "../../shaders/metal/rope.metal" with { type: "text" };

const embeddedShaders: Readonly<Record<string, string>> = {
  "act.metal": actMetal,
  "args.h": argsHeader,
  "attention.metal": attentionMetal,
  "attention_decode.metal": attentionDecodeMetal,
  "attention_prompt.metal": attentionPromptMetal,
  "blocks.h": blocksHeader,
  "get_rows.metal": getRowsMetal,
  "kv.h": kvHeader,
  "kv.metal": kvMetal,
  "matmul.metal": matmulMetal,
  "matvec.metal": matvecMetal,
  "matvec_rows.metal": matvecRowsMetal,
  "norm.h": normHeader,
  "norm.metal": normMetal,
  "norm_rope_store.metal": normRopeStoreMetal,
  "quant.h": quantHeader,
  "rope.h": ropeHeader,
  "rope.metal": ropeMetal,
};

/** shaders/metal, or INFER_METAL_SHADERS. */
export function metalShaderDir(): string {
  return setting("INFER_METAL_SHADERS") ?? join(import.meta.dir, "..", "..", "shaders", "metal");
}

/** The kernel files (.metal and headers) by name: INFER_METAL_SHADERS's, else the embedded ones. */
export function metalShaderFiles(): ReadonlyMap<string, string> {
  const dir = setting("INFER_METAL_SHADERS");
  if (dir === null) return new Map(Object.entries(embeddedShaders));
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch (err) {
    throw new InferError("invalid_argument", `INFER_METAL_SHADERS: cannot read ${dir}: ${(err as Error).message}`);
  }
  return new Map(names.filter((f) => /\.(metal|h)$/.test(f)).sort()
    .map((f) => [f, readFileSync(join(dir, f), "utf8")]));
}

export function metalSourceFiles(dir = metalShaderDir()): string[] {
  return readdirSync(dir).filter((f) => f.endsWith(".metal")).sort();
}

/**
 * Every .metal file in name order, each local #include inlined at its first use: of `dir` when
 * given, else of metalShaderFiles() (what the backend compiles).
 */
export function assembleMetalSource(dir?: string): string {
  const files = dir === undefined ? metalShaderFiles() : null;
  const read = (file: string): string => {
    if (!files) return readFileSync(join(dir!, file), "utf8");
    const text = files.get(file);
    if (text === undefined) throw new InferError("internal", `metal: no kernel file ${file}`);
    return text;
  };
  const included = new Set<string>();
  const inline = (file: string, depth: number): string => {
    if (depth > 8) throw new InferError("internal", `metal: #include nesting too deep at ${file}`);
    const text = read(file);
    return text.replace(/^#include "([\w./-]+)"[^\n]*$/gm, (_, header: string) => {
      if (included.has(header)) return `// (${header}: included above)`;
      included.add(header);
      return `// ---- ${header}\n${inline(header, depth + 1)}`;
    });
  };
  const sources = files ? [...files.keys()].filter((f) => f.endsWith(".metal")) : metalSourceFiles(dir);
  if (sources.length === 0) {
    throw new InferError("unsupported", `Metal not available: no .metal files in ${dir ?? metalShaderDir()}`);
  }
  return sources.map((f) => `// ==== ${f}\n${inline(f, 0)}`).join("\n");
}

export type AddressSpace = "device" | "constant" | "threadgroup" | "thread";

export interface KernelParam {
  readonly name: string;
  /** The element type (pointers) or the type (references and values), without qualifiers. */
  readonly type: string;
  readonly space: AddressSpace;
  readonly isConst: boolean;
  readonly pointer: boolean;
  readonly reference: boolean;
  /** buffer(n) / threadgroup(n): the binding index; null for a built-in value. */
  readonly buffer: number | null;
  readonly threadgroup: number | null;
  /** A built-in attribute such as thread_position_in_grid; null for bindings. */
  readonly builtin: string | null;
}

export interface KernelSignature {
  readonly name: string;
  readonly file: string;
  readonly params: readonly KernelParam[];
}

/** The built-in attributes the emulation provides (metal_emu.h's Ids). */
export const metalBuiltins = [
  "threadgroup_position_in_grid", "thread_position_in_threadgroup", "thread_position_in_grid",
  "threads_per_threadgroup", "threadgroups_per_grid", "thread_index_in_threadgroup",
  "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup",
  "threads_per_simdgroup",
] as const;

function stripComments(text: string): string {
  return text.replace(/\/\*[\s\S]*?\*\//g, " ").replace(/\/\/[^\n]*/g, "");
}

function parseParam(raw: string, where: string): KernelParam {
  const text = raw.replace(/\s+/g, " ").trim();
  const m = /^(.*?)\s*\[\[\s*(\w+)\s*(?:\(\s*(\d+)\s*\))?\s*\]\]$/.exec(text);
  if (!m) throw new InferError("internal", `${where}: parameter '${text}' has no [[attribute]]`);
  const [, decl, attr, index] = m;
  const nameMatch = /^(.*?)([*&]?)\s*(\w+)$/.exec(decl);
  if (!nameMatch) throw new InferError("internal", `${where}: cannot read parameter '${decl}'`);
  const [, typePart, sigil, name] = nameMatch;
  const words = typePart.replace(/[*&]/g, " ").trim().split(/\s+/);
  const spaces: AddressSpace[] = ["device", "constant", "threadgroup", "thread"];
  const space = (words.find((w) => (spaces as string[]).includes(w)) ?? "thread") as AddressSpace;
  const type = words.filter((w) => w !== "const" && !(spaces as string[]).includes(w)).join(" ");
  const pointer = sigil === "*" || typePart.includes("*");
  const reference = sigil === "&" || typePart.includes("&");
  const isBinding = attr === "buffer" || attr === "threadgroup";
  if (isBinding && index === undefined) throw new InferError("internal", `${where}: [[${attr}]] needs an index`);
  return {
    name, type, space, isConst: words.includes("const"), pointer, reference,
    buffer: attr === "buffer" ? Number(index) : null,
    threadgroup: attr === "threadgroup" ? Number(index) : null,
    builtin: isBinding ? null : attr,
  };
}

/** Splits on commas outside brackets and parentheses. */
function splitTopLevel(text: string): string[] {
  const parts: string[] = [];
  let depth = 0, start = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === "(" || c === "[" || c === "<") depth++;
    else if (c === ")" || c === "]" || c === ">") depth--;
    else if (c === "," && depth === 0) {
      parts.push(text.slice(start, i));
      start = i + 1;
    }
  }
  parts.push(text.slice(start));
  return parts.map((p) => p.trim()).filter((p) => p.length > 0);
}

/** The kernels (`kernel void name(...)`) of one source text. */
export function parseKernels(source: string, file = "<source>"): KernelSignature[] {
  const text = stripComments(source);
  const out: KernelSignature[] = [];
  const re = /\bkernel\s+void\s+(\w+)\s*\(/g;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    let depth = 1, i = re.lastIndex;
    for (; i < text.length && depth > 0; i++) {
      if (text[i] === "(") depth++;
      else if (text[i] === ")") depth--;
    }
    const params = splitTopLevel(text.slice(re.lastIndex, i - 1)).map((p) => parseParam(p, `${file}: ${m![1]}`));
    out.push({ name: m[1], file, params });
  }
  return out;
}

/** Every kernel of shaders/metal, by name (names are unique across files). */
export function metalKernels(dir = metalShaderDir()): Map<string, KernelSignature> {
  const kernels = new Map<string, KernelSignature>();
  for (const file of metalSourceFiles(dir)) {
    for (const k of parseKernels(readFileSync(join(dir, file), "utf8"), file)) {
      if (kernels.has(k.name)) throw new InferError("internal", `metal: kernel ${k.name} is defined twice`);
      kernels.set(k.name, k);
    }
  }
  return kernels;
}

export interface StructField { readonly name: string; readonly type: string }

/** `typedef struct { fields } Name;` declarations of a header, with their fields in order. */
export function parseStructs(header: string): Map<string, StructField[]> {
  const text = stripComments(header);
  const out = new Map<string, StructField[]>();
  const re = /typedef\s+struct\s*\{([^}]*)\}\s*(\w+)\s*;/g;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    const fields = m[1].split(";").map((f) => f.trim()).filter((f) => f.length > 0).map((f) => {
      const fm = /^(.*\S)\s+(\w+)(\[[^\]]*\])?$/.exec(f.replace(/\s+/g, " "));
      if (!fm) throw new InferError("internal", `metal: cannot read field '${f}' of ${m![2]}`);
      return { name: fm[2], type: fm[1] + (fm[3] ?? "") };
    });
    out.set(m[2], fields);
  }
  return out;
}

/** The integer `#define NAME value` constants of a header. */
export function parseDefines(header: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const m of stripComments(header).matchAll(/^#define\s+(\w+)\s+(\d+)\s*$/gm)) out.set(m[1], Number(m[2]));
  return out;
}

export function metalArgStructs(dir = metalShaderDir()): Map<string, StructField[]> {
  return parseStructs(readFileSync(join(dir, "args.h"), "utf8"));
}

export function metalArgDefines(dir = metalShaderDir()): Map<string, number> {
  return parseDefines(readFileSync(join(dir, "args.h"), "utf8"));
}

/** The built-ins MSL requires to have one component count within a kernel (MSL spec 5.2.3.6). */
const gridBuiltins = new Set([
  "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
  "threads_per_threadgroup", "threadgroups_per_grid", "threads_per_grid", "dispatch_threads_per_threadgroup",
]);

/** uint/ushort (1) or uint2/uint3/ushort2/ushort3 (2, 3); null for anything else. */
function builtinWidth(type: string): number | null {
  const m = /^u(?:int|short)([23])?$/.exec(type);
  return m ? Number(m[1] ?? 1) : null;
}

/**
 * The rules on built-in attributes that the Metal compiler enforces and the C++ emulation cannot
 * see, as one line per violation: position and size attributes (gridBuiltins) are uint/ushort
 * scalars or vectors of ONE component count per kernel; index and count attributes are scalars.
 * One rejected kernel fails the whole library, so every kernel is checked.
 */
export function builtinAttributeErrors(k: KernelSignature): string[] {
  const errors: string[] = [];
  const grid = k.params.filter((p) => p.builtin !== null && gridBuiltins.has(p.builtin));
  for (const p of k.params) {
    if (p.builtin === null) continue;
    const width = builtinWidth(p.type);
    if (width === null || p.pointer || p.reference) {
      errors.push(`${k.file}: ${k.name}: [[${p.builtin}]] ${p.name} is '${p.type}', not a uint/ushort scalar or vector`);
    } else if (!gridBuiltins.has(p.builtin) && width !== 1) {
      errors.push(`${k.file}: ${k.name}: [[${p.builtin}]] ${p.name} must be a scalar, is '${p.type}'`);
    }
  }
  const widths = new Set(grid.map((p) => builtinWidth(p.type)));
  if (widths.size > 1) {
    errors.push(`${k.file}: ${k.name}: position/size attributes mix component counts (` +
      `${grid.map((p) => `${p.type} [[${p.builtin}]]`).join(", ")}); MSL requires one`);
  }
  return errors;
}
