// What the CLI says on stderr besides errors: a progress bar while a model loads (only on a
// terminal, redrawn in place and erased when done), the statistics after a generation, and with
// --verbose a description of the model and the settings. --quiet silences all of it.
import { basename } from "node:path";
import type { ModelInfo } from "../api/model.ts";
import type { Completion } from "../api/options.ts";

export type Verbosity = "quiet" | "normal" | "verbose";

export function verbosityOf(v: { quiet?: boolean; verbose?: boolean }): Verbosity {
  return v.quiet ? "quiet" : v.verbose ? "verbose" : "normal";
}

/** A load-progress callback drawing a bar on a terminal's stderr, or undefined off one. */
export function loadProgress(path: string,
  verbosity: Verbosity): ((done: number, total: number) => void) | undefined {
  if (verbosity === "quiet" || process.stderr.isTTY !== true) return undefined;
  const name = basename(path);
  let last = -1;
  return (done, total) => {
    const width = 30, filled = total === 0 ? width : Math.round((done / total) * width);
    if (filled === last && done !== total) return;
    last = filled;
    if (done >= total) {
      process.stderr.write("\r\x1b[2K"); // erase the bar: what follows starts on a clean line
      return;
    }
    const bar = "#".repeat(filled) + ".".repeat(width - filled);
    process.stderr.write(`\r\x1b[2Kloading ${name} [${bar}] ${done}/${total} tensors`);
  };
}

const rate = (n: number, ms: number) => (ms > 0 ? (n / ms) * 1000 : 0).toFixed(1);

/** One line of statistics after a generation. */
export function formatStats(c: Completion, loadMs?: number): string {
  const t = c.timings;
  const parts = [
    `prefilled ${t.promptEvaluated} of ${c.usage.promptTokens} prompt tokens, ` +
      `${rate(t.promptEvaluated, t.promptMs)} tok/s`,
    `generated ${c.tokens.length} tokens, ${t.tokensPerSecond.toFixed(1)} tok/s`,
    `stop: ${c.stopReason}`,
  ];
  const spec = c.speculation;
  if (spec && spec.drafted > 0) {
    parts.splice(2, 0, `drafts: kept ${spec.accepted} of ${spec.drafted} in ${spec.passes} passes`);
  }
  if (loadMs !== undefined) parts.unshift(`load ${loadMs.toFixed(0)} ms`);
  return parts.join(" | ");
}

/** --verbose: what is about to run. */
export function describe(info: ModelInfo, extra: Record<string, unknown> = {}): string {
  const lines = [
    `model: ${info.path}`,
    `  ${info.name} (${info.architecture}), ${info.quantization}, ` +
      `${info.layers} layers, vocabulary ${info.vocabSize}, ` +
      `trained context ${info.trainedContextLength}`,
    `  context ${info.contextLength} tokens, batch ${info.batch}, ` +
      `loaded in ${info.loadMs.toFixed(0)} ms`,
    `  backend ${info.backend}: ${info.backendReason}`,
  ];
  for (const [k, v] of Object.entries(extra)) {
    lines.push(`${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`);
  }
  return lines.join("\n") + "\n";
}
