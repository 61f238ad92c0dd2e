// `infer models`: the GGUF files in the cache (INFER_CACHE, default ~/.cache/infer, under
// models/) with their size, architecture, quantization and parameter count. How --model NAME
// finds a cached model is ts/models/cache.ts's resolveModel.
import { statSync } from "node:fs";
import { join } from "node:path";
import { openGguf, type GgufFile } from "../gguf/reader.ts";
import { cachedModelFiles, modelsDir } from "../models/cache.ts";
import { parseCommand } from "./args.ts";

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

export interface ModelEntry {
  readonly name: string;
  readonly path: string;
  readonly bytes: number;
  readonly architecture: string;
  readonly quant: string;
  readonly parameters: number;
  readonly error?: string;
}

export function listModels(): ModelEntry[] {
  return cachedModelFiles().map((name) => {
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
    process.stderr.write(`no models in ${modelsDir()} (the default one is fetched when first asked for)\n`);
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
