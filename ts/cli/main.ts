// Command dispatch for the CLI. Every user-facing failure becomes one clear line on stderr and a
// non-zero exit; anything else is a bug and keeps its stack.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { Engine, type TokenConstraint } from "../engine/engine.ts";
import { InferError, quote } from "../errors.ts";
import { JsonGrammar } from "../sample/json-grammar.ts";
import { anyObject, compileSchema, minLength, type JsonNode } from "../sample/json-schema.ts";
import { chatCommand } from "./chat.ts";
import { describe, formatStats, loadProgress, verbosityOf } from "./feedback.ts";
import { chatUsage, overview, runUsage } from "./help.ts";
import { importCommand, importUsage } from "./import.ts";
import { modelsCommand, modelsUsage, resolveModel } from "./models.ts";
import {
  engineSettings, generationOptions, intOption, joinNegativeValues, samplingFrom, stopStrings,
} from "./options.ts";
import { perplexityCommand, perplexityUsage } from "./perplexity.ts";
import { quantizeCommand, quantizeUsage } from "./quantize.ts";
import { serveCommand, serveUsage } from "./serve.ts";
import { defaultModelPath } from "./setup.ts";

/** Subcommands, chosen when the first argument is exactly their name; anything else is a prompt. */
const commands: Record<string, (argv: string[]) => number | Promise<number>> = {
  run: runCommand,
  chat: chatCommand,
  models: modelsCommand,
  import: importCommand,
  quantize: quantizeCommand,
  perplexity: perplexityCommand,
  serve: serveCommand,
  help: helpCommand,
};

const usages: Record<string, string> = {
  run: runUsage, chat: chatUsage, models: modelsUsage, import: importUsage, quantize: quantizeUsage,
  perplexity: perplexityUsage, serve: serveUsage,
};

function helpCommand(argv: string[]): number {
  const topic = argv[0];
  if (topic === undefined) { process.stdout.write(overview); return 0; }
  if (!Object.hasOwn(usages, topic)) {
    process.stderr.write(`infer: no command '${topic}'\n${overview}`);
    return 2;
  }
  process.stdout.write(usages[topic]);
  return 0;
}

/**
 * The grammar of --json or --json-schema, once its shortest output is known to fit: the grammar
 * allows a token only while the shortest completion after it fits the tokens left at one token
 * per byte (so output cut off by -n still parses), and so it needs -n (and the room the prompt
 * leaves in the context) to be at least its shortest output's length in bytes.
 */
function constraintFor(values: { json?: boolean; "json-schema"?: string }, engine: Engine,
  run: { prompt: string; maxTokens: number }): TokenConstraint | undefined {
  const path = values["json-schema"];
  let node: JsonNode;
  const flag = path === undefined ? "--json" : `--json-schema ${quote(path)}`;
  if (path !== undefined) {
    let schema: unknown;
    try {
      schema = JSON.parse(readFileSync(path, "utf8"));
    } catch (err) {
      // (the parser's message may quote the file: escaped and cut like any file's text)
      throw new InferError("io", `${flag}: ${quote((err as Error).message, 160)}`);
    }
    node = compileSchema(schema);
  } else if (values.json) node = anyObject;
  else return undefined;
  const shortest = minLength(node);
  if (run.maxTokens >= 0 && shortest > run.maxTokens) {
    throw new InferError("invalid_argument", `${flag}: the shortest valid output is ${shortest} ` +
      `bytes, and -n ${run.maxTokens} cannot hold it (structured output needs a token per byte ` +
      `of it to be sure to finish); use -n ${shortest} or more`);
  }
  const prompt = engine.tokenizer.encode(run.prompt, { addSpecial: true, parseSpecial: true });
  const room = engine.contextLength - prompt.length;
  if (shortest > room) {
    throw new InferError("invalid_argument", `${flag}: the shortest valid output is ${shortest} ` +
      `bytes, and the context has room for ${Math.max(0, room)} tokens after the prompt ` +
      `(structured output needs a token per byte of it); raise --ctx-size`);
  }
  return new JsonGrammar(engine.tokenizer, node);
}

async function runCommand(argv: string[]): Promise<number> {
  const options = {
    ...generationOptions,
    "ignore-eos": { type: "boolean" },
    json: { type: "boolean" },
    "json-schema": { type: "string" },
  } as const;
  const args = joinNegativeValues(argv, options);
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options });
  if (values.help) { process.stdout.write(runUsage); return 0; }
  if (positionals.length !== 1) {
    process.stderr.write(runUsage);
    return 2;
  }
  const verbosity = verbosityOf(values);
  const sampling = samplingFrom(values);
  const maxTokens = intOption(values.n, "-n", 128, -1);
  const stop = stopStrings(values);
  const modelPath = resolveModel(values.model ?? defaultModelPath());
  const onProgress = loadProgress(modelPath, verbosity);
  const engine = Engine.open({ modelPath, ...engineSettings(values), onProgress });
  try {
    const constraint = constraintFor(values, engine, { prompt: positionals[0], maxTokens });
    if (verbosity === "verbose") {
      process.stderr.write(describe(engine, modelPath, {
        sampling: { ...sampling, logitBias: Object.fromEntries(sampling.logitBias ?? []) },
        "max tokens": maxTokens, stop,
        constraint: values["json-schema"] ?? (values.json ? "JSON object" : "none"),
      }));
    }
    const result = engine.generate(positionals[0], {
      maxTokens, sampling, stop, constraint, ignoreEos: values["ignore-eos"] ?? false,
      onText: (text) => process.stdout.write(text),
    });
    process.stdout.write("\n");
    if (verbosity !== "quiet") process.stderr.write(formatStats(result, engine.loadMs) + "\n");
  } finally {
    engine.close();
  }
  return 0;
}

export async function main(argv: string[]): Promise<number> {
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
    const command = Object.hasOwn(commands, argv[0]) ? commands[argv[0]] : null;
    return command ? await command(argv.slice(1)) : await runCommand(argv);
  } catch (err) {
    if (err instanceof InferError) {
      console.error(`infer: ${err.message}`);
      return 1;
    }
    if (err instanceof TypeError && (err as { code?: string }).code?.startsWith("ERR_PARSE_ARGS")) {
      console.error(`infer: ${err.message}`);
      return 2;
    }
    throw err;
  }
}
