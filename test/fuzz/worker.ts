// A fuzz child: runs cases [from, to) of a seed in turn, each through the real loader
// (Engine.open) and one generated token, and reports each outcome as a JSON line on stdout,
// announcing a case before it runs so that the parent knows which one a crash or a hang hit.
//   bun test/fuzz/worker.ts --seed S --from A --to B --dir DIR
import { rmSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { chatTemplateFor } from "../../ts/chat/template.ts";
import { Engine } from "../../ts/engine/engine.ts";
import { InferError } from "../../ts/errors.ts";
import { defaultSampling } from "../../ts/sample/sampler.ts";
import { fuzzCase } from "./mutate.ts";

/** Longest message that still counts as one bounded line. */
export const MESSAGE_BYTES_MAX = 400;

/** One line, no control bytes, at most MESSAGE_BYTES_MAX bytes. */
export function isBoundedLine(message: string): boolean {
  return Buffer.byteLength(message) <= MESSAGE_BYTES_MAX &&
    !/[\u0000-\u001f\u007f-\u009f\u2028\u2029]/.test(message);
}

export type Outcome =
  | { i: number; outcome: "ok" }
  | { i: number; outcome: "error"; code: string; message: string }
  | { i: number; outcome: "stack"; message: string; stack: string };

function failure(i: number, err: unknown): Outcome {
  if (err instanceof InferError) {
    return { i, outcome: "error", code: err.code, message: err.message };
  }
  const e = err as Error;
  return { i, outcome: "stack", message: String(e?.message ?? e).slice(0, 2000),
    stack: String(e?.stack ?? "").slice(0, 4000) };
}

/**
 * The file's chat template (what a chat request renders) for one message: null where it
 * renders, or refuses in one bounded line (many files have none: that is not this case's end).
 */
function templateFailure(engine: Engine, i: number): Outcome | null {
  try {
    chatTemplateFor(engine.file.metadata, engine.tokenizer)
      .render([{ role: "user", content: "hi" }]);
    return null;
  } catch (err) {
    const r = failure(i, err);
    return r.outcome === "error" && isBoundedLine(r.message) ? null : r;
  }
}

/**
 * Runs one case's file through the loader, one token and its chat template; never throws. A
 * case that generates its token is "ok" unless its template fails other than cleanly.
 */
export function runCase(path: string, i: number, runSeed: number): Outcome {
  const c = fuzzCase(runSeed, i);
  writeFileSync(path, c.bytes);
  let engine: Engine | null = null;
  try {
    engine = Engine.open({ modelPath: path, threads: 1, backend: "cpu",
      contextLength: c.contextLength });
    engine.generate(c.prompt, { maxTokens: 1,
      sampling: { ...defaultSampling, temperature: c.greedy ? 0 : 0.8, seed: i } });
    return templateFailure(engine, i) ?? { i, outcome: "ok" };
  } catch (err) {
    return failure(i, err);
  } finally {
    try {
      engine?.close();
    } catch { /* a close that fails is reported by the case that follows */ }
  }
}

if (import.meta.main) {
  const { values } = parseArgs({ options: {
    seed: { type: "string" }, from: { type: "string" }, to: { type: "string" },
    dir: { type: "string" },
  } });
  const seed = Number(values.seed), from = Number(values.from), to = Number(values.to);
  const path = join(values.dir!, `case-${process.pid}.gguf`);
  // Written synchronously: a case that kills the process must have been announced.
  const out = (o: object) => writeSync(1, `${JSON.stringify(o)}\n`);
  for (let i = from; i < to; i++) {
    out({ start: i });
    out(runCase(path, i, seed));
    if (i % 64 === 63) Bun.gc(false); // mapped files and arenas go with their last reference
  }
  rmSync(path, { force: true });
}
