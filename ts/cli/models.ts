// `infer models`: the GGUF files in the cache (INFER_CACHE, default ~/.cache/infer, under
// models/) with their size, architecture, quantization and parameter count. How --model NAME
// finds a cached model is ts/models/cache.ts's resolveModel.
import { statSync } from "node:fs";
import { join } from "node:path";
import { parameterCount, quantOf } from "../gguf/file-type.ts";
import { openGguf } from "../gguf/reader.ts";
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
        const architecture = typeof arch === "string" ? arch : "?";
        return { name, path, bytes, parameters: parameterCount(file), architecture,
          quant: quantOf(file) };
      } finally {
        file.close();
      }
    } catch (err) {
      const error = (err as Error).message;
      return { name, path, bytes, parameters: 0, architecture: "?", quant: "?", error };
    }
  });
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
