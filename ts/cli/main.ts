// Command dispatch for the CLI. Every user-facing failure becomes one clear line on stderr and a
// non-zero exit (2 for a mistake in the command line, 1 for the rest); anything else is a bug and
// keeps its stack.
import { readFileSync } from "node:fs";
import { loadModel } from "../api/model.ts";
import { settingsHelp } from "../config/env.ts";
import { InferError, quote } from "../errors.ts";
import { ensureModel } from "../models/fetch.ts";
import { anyObject, compileSchema, minLength, type JsonNode } from "../sample/json-schema.ts";
import { parseCommand, textArgument, UsageError } from "./args.ts";
import { chatCommand } from "./chat.ts";
import { embedCommand, embedUsage } from "./embed.ts";
import { describe, formatStats, loadProgress, verbosityOf } from "./feedback.ts";
import { chatUsage, overview, runUsage } from "./help.ts";
import { importCommand, importUsage } from "./import.ts";
import { modelsCommand, modelsUsage } from "./models.ts";
import {
  checkLogitBias, engineSettings, generationOptions, intOption, samplingFrom, samplingOptions,
  shiftPolicyOption, speculationLoad, stopStrings,
} from "./options.ts";
import type { Completion } from "../api/options.ts";
import { perplexityCommand, perplexityUsage } from "./perplexity.ts";
import { pullCommand, pullUsage } from "./pull.ts";
import { quantizeCommand, quantizeUsage } from "./quantize.ts";
import { serveCommand, serveUsage } from "./serve.ts";
import { tokenizeCommand, tokenizeUsage } from "./tokenize.ts";

/** Subcommands, chosen when the first argument is exactly their name; anything else is a prompt. */
const commands: Record<string, (argv: string[]) => number | Promise<number>> = {
  run: runCommand,
  chat: chatCommand,
  models: modelsCommand,
  pull: pullCommand,
  import: importCommand,
  quantize: quantizeCommand,
  perplexity: perplexityCommand,
  serve: serveCommand,
  tokenize: tokenizeCommand,
  embed: embedCommand,
  help: helpCommand,
};

const usages: Record<string, string> = {
  run: runUsage, chat: chatUsage, models: modelsUsage, pull: pullUsage, import: importUsage,
  quantize: quantizeUsage, perplexity: perplexityUsage, serve: serveUsage, tokenize: tokenizeUsage,
  embed: embedUsage,
};

function helpCommand(argv: string[]): number {
  const topic = argv[0];
  if (topic === undefined) { process.stdout.write(overview); return 0; }
  if (topic === "env") { process.stdout.write(settingsHelp()); return 0; }
  if (!Object.hasOwn(usages, topic)) {
    throw new UsageError(`no command ${quote(topic, 40)} (commands: ` +
      `${Object.keys(usages).join(", ")}; 'infer help env': the environment variables)`, { pointToHelp: false });
  }
  process.stdout.write(usages[topic]);
  return 0;
}

/**
 * The schema of --json or --json-schema (undefined: any JSON object; null: neither), once its
 * shortest output is known to fit -n: the grammar allows a token only while the shortest
 * completion after it fits the tokens left at one token per byte (so output cut off by -n still
 * parses), and so -n must be at least its shortest output's length in bytes. (The room the
 * prompt leaves in the context is the engine's to check.)
 */
function schemaFor(values: { json?: boolean; "json-schema"?: string },
  maxTokens: number): object | undefined | null {
  const given = values["json-schema"];
  let node: JsonNode, schema: object | undefined;
  const flag = given === undefined ? "--json" : "--json-schema";
  if (given !== undefined) {
    schema = readSchema(given);
    node = compileSchema(schema);
  } else if (values.json) node = anyObject;
  else return null;
  const shortest = minLength(node);
  if (maxTokens >= 0 && shortest > maxTokens) {
    throw new UsageError(`${flag}: the shortest valid output is ${shortest} bytes, and ` +
      `-n ${maxTokens} cannot hold it (structured output needs a token per byte of it to be ` +
      `sure to finish); use -n ${shortest} or more`, { pointToHelp: false });
  }
  return schema;
}

/** --json-schema's value: inline JSON (it starts with '{'), or @FILE (or a FILE) holding it. */
function readSchema(given: string): object {
  const inline = given.trimStart().startsWith("{");
  const path = given.startsWith("@") ? given.slice(1) : given;
  const where = inline ? "--json-schema" : `--json-schema ${quote(given)}`;
  let text: string;
  try {
    text = inline ? given : readFileSync(path, "utf8");
  } catch (err) {
    throw new InferError("io", `${where}: ${quote((err as Error).message, 160)}`);
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    // (the parser's message may quote the file: escaped and cut like any file's text)
    const error = new InferError("io", `${where}: ${quote((err as Error).message, 160)}`);
    if (inline) throw new UsageError(error.message, { pointToHelp: false });
    throw error;
  }
}

async function runCommand(argv: string[]): Promise<number> {
  const { values, positionals } = parseCommand(argv, {
    options: {
      ...generationOptions,
      "ignore-eos": { type: "boolean" },
      json: { type: "boolean" },
      "json-schema": { type: "string" },
      file: { type: "string", short: "f" },
    },
    positionals: { expected: "one prompt", min: 0, max: 1,
      hintWhenTooMany: "quote a prompt that has spaces: infer \"the prompt\"" },
  });
  if (values.help) { process.stdout.write(runUsage); return 0; }
  const prompt = await textArgument(positionals, values.file, "prompt");
  const verbosity = verbosityOf(values);
  const sampling = samplingFrom(values);
  const maxTokens = intOption(values.n, "-n", 128, -1);
  const stop = stopStrings(values);
  const settings = engineSettings(values);
  const schema = schemaFor(values, maxTokens);
  const speculation = speculationLoad(values); // (a usage error before any download)
  const shiftPolicy = shiftPolicyOption(values["shift-policy"]);
  if (shiftPolicy !== undefined && maxTokens >= 0) throw new UsageError("--shift-policy goes with -n -1");
  const modelPath = await ensureModel(values.model);
  const onProgress = loadProgress(modelPath, verbosity);
  // One generation: one sequence, and no prefix cache to fill for later ones.
  const model = await loadModel(modelPath, { ...settings, parallel: 1, prefixCacheBytes: 0,
    ...speculation, onProgress });
  try {
    checkLogitBias(sampling, model.info.vocabSize);
    if (verbosity === "verbose") {
      process.stderr.write(describe(model.info, {
        sampling: { ...sampling, logitBias: Object.fromEntries(sampling.logitBias ?? []) },
        "max tokens": maxTokens, stop,
        constraint: values["json-schema"] ?? (values.json ? "JSON object" : "none"),
      }));
    }
    const { result, interrupted } = await untilInterrupted(async (signal) => {
      const stream = model.stream(prompt, {
        ...samplingOptions(sampling), maxTokens, stop, ignoreEos: values["ignore-eos"] ?? false,
        contextShift: maxTokens < 0, // -n -1 goes on past the context, as llama.cpp's
        ...(shiftPolicy ? { contextShiftPolicy: shiftPolicy } : {}),
        ...(schema === null ? {} : schema === undefined ? { json: true } : { jsonSchema: schema }),
        signal, stopOnAbortSignal: true,
      });
      for await (const piece of stream) process.stdout.write(piece.text);
      return stream.result;
    });
    process.stdout.write("\n");
    if (verbosity !== "quiet") process.stderr.write(formatStats(result, model.info.loadMs) + "\n");
    return interrupted ? 130 : 0; // 128 + SIGINT, as a shell reports a command Ctrl-C ended
  } finally {
    await model.close();
  }
}

/**
 * Runs a generation with Ctrl-C (SIGINT) aborting it: the engine ends it at its next step, and
 * what was generated is kept and reported. A second Ctrl-C (a prompt still being evaluated,
 * which is not interrupted) exits at once.
 */
async function untilInterrupted(generate: (signal: AbortSignal) => Promise<Completion>,
): Promise<{ result: Completion; interrupted: boolean }> {
  const abort = new AbortController();
  const onSigint = () => {
    if (abort.signal.aborted) process.exit(130);
    abort.abort();
  };
  process.on("SIGINT", onSigint);
  try {
    const result = await generate(abort.signal);
    return { result, interrupted: abort.signal.aborted };
  } finally {
    process.off("SIGINT", onSigint);
  }
}

/**
 * A reader that goes away (`infer ... | head`) ends the command quietly, as SIGPIPE ends a C
 * program: 128 + SIGPIPE, with nothing on stderr.
 */
function exitOnClosedPipe(err: { code?: string }): void {
  if (err.code === "EPIPE") process.exit(141);
  throw err;
}

export async function main(argv: string[]): Promise<number> {
  const name = argv.length > 0 && Object.hasOwn(commands, argv[0]) ? argv[0] : null;
  process.stdout.on("error", exitOnClosedPipe);
  try {
    if (argv.length === 0) {
      process.stderr.write(overview);
      return 2;
    }
    if (argv[0] === "--help" || argv[0] === "-h") return helpCommand(argv.slice(1));
    if (argv[0] === "--version") {
      process.stdout.write(`infer ${(await import("../../package.json")).version}\n`);
      return 0;
    }
    return name !== null ? await commands[name](argv.slice(1)) : await runCommand(argv);
  } catch (err) {
    const where = name === null ? "infer" : `infer ${name}`;
    if (err instanceof UsageError) {
      const help = err.pointToHelp ? ` (see 'infer ${name ?? "run"} --help')` : "";
      console.error(`${where}: ${err.message}${help}`);
      return 2;
    }
    if (err instanceof InferError) {
      const hint = err.code === "context_overflow" && !err.message.includes("--ctx-size")
        ? " (raise --ctx-size)" : "";
      console.error(`${where}: ${err.message}${hint}`);
      return 1;
    }
    if (err instanceof TypeError && (err as { code?: string }).code?.startsWith("ERR_PARSE_ARGS")) {
      // parseCommand checks first; this is parseArgs's own text for a case it did not foresee
      console.error(`${where}: ${quote(err.message, 200)} (see 'infer ${name ?? "run"} --help')`);
      return 2;
    }
    throw err;
  }
}
