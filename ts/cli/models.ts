// `infer models`: the GGUF files in the cache (INFER_CACHE, default ~/.cache/infer, under
// models/) with their size, architecture, quantization and parameter count; and --model NAME,
// which finds a cached model by file name, by name without .gguf, or by a unique part of it.
import { existsSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { InferError, quote } from "../errors.ts";
import { openGguf, type GgufFile } from "../gguf/reader.ts";
import { parseCommand } from "./args.ts";
import { cacheDir } from "./setup.ts";

export const modelsUsage = `usage: infer models [--json]

Lists the models in ${"$"}INFER_CACHE/models (default ~/.cache/infer/models): file name, size,
architecture, quantization and parameters. Any of these names (or a unique part of one) can be
given to --model instead of a path.

options:
  --json      one JSON object per model, one per line
  -h, --help  this text
`;

/** llama.cpp's enum llama_ftype, as general.file_type stores it. */
const FILE_TYPES: Record<number, string> = {
  0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
  11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
  18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
  25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
  32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
};

export function fileTypeName(fileType: number): string {
  return FILE_TYPES[fileType] ?? `file type ${fileType}`;
}

export function modelsDir(): string {
  return join(cacheDir(), "models");
}

export interface ModelEntry {
  readonly name: string;
  readonly path: string;
  readonly bytes: number;
  readonly architecture: string;
  readonly quant: string;
  readonly parameters: number;
  readonly error?: string;
}

function cachedFiles(): string[] {
  const dir = modelsDir();
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((f) => f.endsWith(".gguf") && statSync(join(dir, f)).isFile())
    .sort();
}

export function listModels(): ModelEntry[] {
  return cachedFiles().map((name) => {
    const path = join(modelsDir(), name), bytes = statSync(path).size;
    try {
      const file = openGguf(path);
      try {
        const arch = file.metadata.get("general.architecture");
        let parameters = 0;
        for (const t of file.tensors.values()) parameters += t.dims.reduce((a, b) => a * b, 1);
        const architecture = typeof arch === "string" ? arch : "?";
        return { name, path, bytes, parameters, architecture, quant: quantOf(file) };
      } finally {
        file.close();
      }
    } catch (err) {
      const error = (err as Error).message;
      return { name, path, bytes, parameters: 0, architecture: "?", quant: "?", error };
    }
  });
}

/** The file's quantization: general.file_type, or else the type most of its weights are in. */
export function quantOf(file: GgufFile): string {
  const fileType = file.metadata.get("general.file_type");
  if (typeof fileType === "number") return fileTypeName(fileType);
  return majorityType(file.tensors.values());
}

function majorityType(tensors: Iterable<{ type: { name: string }; dims: readonly number[] }>,
): string {
  const count = new Map<string, number>();
  for (const t of tensors) {
    const n = t.dims.reduce((a, b) => a * b, 1);
    count.set(t.type.name, (count.get(t.type.name) ?? 0) + n);
  }
  return [...count.entries()].sort((a, b) => b[1] - a[1])[0]?.[0] ?? "?";
}

/**
 * A path as given, or the cached model a name picks out (exactly, without .gguf, or uniquely).
 * A folder is refused here, with what to give instead: mapping one fails obscurely.
 */
export function resolveModel(nameOrPath: string): string {
  const files = cachedFiles();
  const exact = files.find((f) => f === nameOrPath || f === `${nameOrPath}.gguf`);
  const exists = existsSync(nameOrPath);
  if (exists && statSync(nameOrPath).isDirectory()) {
    if (exact && !nameOrPath.includes("/")) return join(modelsDir(), exact);
    throw new InferError("invalid_argument", `${quote(nameOrPath)} is a folder; give a GGUF ` +
      "file or the name of a cached model ('infer models' lists them; 'infer import' " +
      "converts a Hugging Face folder)");
  }
  if (exists || nameOrPath.includes("/")) return nameOrPath;
  if (exact) return join(modelsDir(), exact);
  const needle = nameOrPath.toLowerCase();
  const partial = files.filter((f) => f.toLowerCase().includes(needle));
  if (partial.length === 1) return join(modelsDir(), partial[0]);
  // the first few names, so that a large cache still makes one line
  const listed = (names: string[]) => names.slice(0, 6).join(", ") +
    (names.length > 6 ? `, and ${names.length - 6} more` : "");
  if (partial.length > 1) {
    throw new InferError("invalid_argument",
      `'${nameOrPath}' matches several cached models: ${listed(partial)}`);
  }
  if (nameOrPath.endsWith(".gguf")) return nameOrPath; // a missing path: the engine says so
  throw new InferError("io", `no model file '${nameOrPath}' and no cached model by that ` +
    `name in ${modelsDir()}` + (files.length > 0 ? ` (cached: ${listed(files)})` : ""));
}

function size(bytes: number): string {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0, v = bytes;
  while (v >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  return `${v.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

function count(n: number): string {
  return n >= 1e9 ? `${(n / 1e9).toFixed(1)}B` : n >= 1e6 ? `${(n / 1e6).toFixed(0)}M` : `${n}`;
}

export function modelsCommand(argv: string[]): number {
  const { values } = parseCommand(argv, {
    options: { json: { type: "boolean" }, help: { type: "boolean", short: "h" } },
    positionals: { expected: "no arguments", min: 0, max: 0 },
  });
  if (values.help) { process.stdout.write(modelsUsage); return 0; }
  const models = listModels();
  if (values.json) {
    for (const m of models) process.stdout.write(JSON.stringify(m) + "\n");
    return 0;
  }
  if (models.length === 0) {
    process.stderr.write(`no models in ${modelsDir()} (npm install puts the default one there)\n`);
    return 0;
  }
  const rows = [["NAME", "SIZE", "ARCH", "QUANT", "PARAMS"],
    ...models.map((m) => m.error
      ? [m.name, size(m.bytes), "?", "?", `unreadable: ${m.error}`]
      : [m.name, size(m.bytes), m.architecture, m.quant, count(m.parameters)])];
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  for (const r of rows) {
    process.stdout.write(r.map((cell, c) => cell.padEnd(widths[c])).join("  ").trimEnd() + "\n");
  }
  return 0;
}
