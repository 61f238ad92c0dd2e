// Generates ts/native/symbols.gen.ts from the Zig side of the C ABI, so the two sides cannot
// drift: the bun:ffi dlopen table from the `export fn` declarations of the export files, each
// call's parameter names, and the layout of every `extern struct` of lib/abi.zig (C rules: each
// field at its natural alignment), checked against the size the Zig file asserts.
//   bun ts/native/gen-symbols.ts          write the file
//   bun ts/native/gen-symbols.ts --check  exit 1 if the committed file is stale
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const root = join(import.meta.dir, "..", "..");
/** The files that hold the library's `export fn`s, in the order the table lists them. */
export const exportFiles = ["core", "cpu", "altup", "cuda", "metal"].map((area) => `lib/exports/${area}.zig`);
export const abiFile = "lib/abi.zig";
const outPath = join(import.meta.dir, "symbols.gen.ts");

function ffiType(zigType: string, isReturn: boolean): string {
  const t = zigType.trim();
  if (t === "[*:0]const u8" && isReturn) return "FFIType.cstring";
  if (t.startsWith("*") || t.startsWith("[*") || t.startsWith("?*") || t.startsWith("?[*")) {
    return "FFIType.ptr";
  }
  const scalars: Record<string, string> = {
    void: "FFIType.void", bool: "FFIType.bool",
    u8: "FFIType.u8", i8: "FFIType.i8", u16: "FFIType.u16", i16: "FFIType.i16",
    u32: "FFIType.u32", i32: "FFIType.i32", u64: "FFIType.u64", i64: "FFIType.i64",
    usize: "FFIType.u64", isize: "FFIType.i64", f32: "FFIType.f32", f64: "FFIType.f64",
  };
  const mapped = scalars[t];
  if (!mapped) throw new Error(`gen-symbols: no FFI mapping for Zig type '${t}'`);
  return mapped;
}

/** Bytes (and alignment) of the scalar field types an ABI struct may hold. */
const scalarBytes: Record<string, number> = {
  bool: 1, u8: 1, i8: 1, u16: 2, i16: 2, u32: 4, i32: 4, f32: 4, u64: 8, i64: 8, f64: 8,
};

interface Field { name: string; type: string; length: number | null; offset: number; value: string | null }

/** The extern structs of `source`, laid out as C lays them out. */
function structLayouts(source: string): string[] {
  const constants = new Map<string, number>();
  for (const m of source.matchAll(/const (\w+)(?:: \w+)? = (\d+);/g)) constants.set(m[1], Number(m[2]));
  const out: string[] = [];
  for (const m of source.matchAll(/pub const (\w+) = extern struct \{\n([\s\S]*?)\n\};/g)) {
    const [, name, body] = m;
    const fields: Field[] = [];
    let offset = 0, align = 1;
    for (const f of body.matchAll(/^ {4}(\w+): ([^=,]+?)(?: = ([^,]+))?,$/gm)) {
      const [, field, zigType, init] = f;
      const array = /^\[(\w+)\](\w+)$/.exec(zigType.trim());
      const type = array ? array[2] : zigType.trim();
      const bytes = scalarBytes[type];
      if (bytes === undefined) throw new Error(`gen-symbols: ${name}.${field}: no layout for Zig type '${zigType}'`);
      let length: number | null = null;
      if (array) {
        length = /^\d+$/.test(array[1]) ? Number(array[1]) : constants.get(array[1]) ?? NaN;
        if (!Number.isInteger(length)) throw new Error(`gen-symbols: ${name}.${field}: unknown length '${array[1]}'`);
      }
      offset = Math.ceil(offset / bytes) * bytes;
      align = Math.max(align, bytes);
      const value = init === undefined || array ? null : init.trim();
      if (value !== null && !/^(true|false|-?\d+(\.\d+)?)$/.test(value)) {
        throw new Error(`gen-symbols: ${name}.${field}: default '${value}' is not a literal`);
      }
      fields.push({ name: field, type, length, offset, value });
      offset += bytes * (length ?? 1);
    }
    const size = Math.ceil(offset / align) * align;
    const asserted = new RegExp(`@sizeOf\\(${name}\\) == (\\d+)`).exec(source);
    if (!asserted) throw new Error(`gen-symbols: ${abiFile} asserts no size for ${name}`);
    if (Number(asserted[1]) !== size) {
      throw new Error(`gen-symbols: ${name} lays out in ${size} bytes, ${abiFile} asserts ${asserted[1]}`);
    }
    out.push(`  ${name}: {`, `    size: ${size},`, "    fields: {");
    for (const f of fields) {
      const parts = [`type: "${f.type}"`, `offset: ${f.offset}`];
      if (f.length !== null) parts.push(`length: ${f.length}`);
      if (f.value !== null) parts.push(`value: ${f.value}`);
      out.push(`      ${f.name}: { ${parts.join(", ")} },`);
    }
    out.push("    },", "  },");
  }
  return out;
}

/** symbols.gen.ts from the export files' sources (in exportFiles' order) and lib/abi.zig's. */
export function generate(exportSources: readonly string[], abiSource: string): string {
  const decl = /export fn (\w+)\(([^)]*)\)\s*([^{]+?)\s*\{/g;
  const lines: string[] = [], names: string[] = [], takes: string[] = [];
  for (const source of exportSources) {
    for (const m of source.matchAll(decl)) {
      const [, name, params] = m;
      const ret = m[3];
      const list = params.split(",").map((p) => p.trim()).filter((p) => p.length > 0);
      const args = list.map((p) => ffiType(p.slice(p.indexOf(":") + 1), false));
      lines.push(`  ${name}: { args: [${args.join(", ")}], returns: ${ffiType(ret, true)} },`);
      names.push(`  ${name}: [${list.map((p) => `"${p.slice(0, p.indexOf(":")).trim()}"`).join(", ")}],`);
      const only = list.length === 1 ? list[0].slice(list[0].indexOf(":") + 1).trim() : "";
      const struct = /^\*const abi\.(\w+)$/.exec(only);
      if (struct) takes.push(`  ${name}: "${struct[1]}",`);
    }
  }
  return [
    `// GENERATED by ts/native/gen-symbols.ts from ${[...exportFiles, abiFile].join(", ")}. Do not edit.`,
    'import { FFIType } from "bun:ffi";',
    "",
    "export const symbols = {",
    ...lines,
    "} as const;",
    "",
    "/** Each call's parameter names, in order. */",
    "export const parameters = {",
    ...names,
    "} as const;",
    "",
    "/** The calls whose one argument is a struct of lib/abi.zig, and which. */",
    "export const structArgs = {",
    ...takes,
    "} as const;",
    "",
    "/**",
    " * The extern structs of lib/abi.zig: size in bytes, and each field's type, offset, length (byte",
    " * arrays) and default value (`value`; fields without one must be given).",
    " */",
    "export const structs = {",
    ...structLayouts(abiSource),
    "} as const;",
    "",
  ].join("\n");
}

/** The generated text for the files in this checkout. */
export function generateFromTree(): string {
  return generate(exportFiles.map((f) => readFileSync(join(root, f), "utf8")),
    readFileSync(join(root, abiFile), "utf8"));
}

if (import.meta.main) {
  const text = generateFromTree();
  if (process.argv.includes("--check")) {
    const current = readFileSync(outPath, "utf8");
    if (current !== text) {
      console.error("ts/native/symbols.gen.ts is stale: run bun ts/native/gen-symbols.ts");
      process.exit(1);
    }
  } else {
    writeFileSync(outPath, text);
  }
}
