// Command dispatch for the CLI. Every user-facing failure becomes one clear line on stderr and a
// non-zero exit (2 for a mistake in the command line, 1 for the rest); anything else is a bug and
// keeps its stack.
import { readFileSync } from "node:fs";
import { settingsHelp } from "../config/env.ts";
import { Engine, type TokenConstraint } from "../engine/engine.ts";
import type { GenerateResult } from "../engine/generation.ts";
import { InferError, quote } from "../errors.ts";
import { JsonGrammar } from "../sample/json-grammar.ts";
import { anyObject, compileSchema, minLength, type JsonNode } from "../sample/json-schema.ts";
import { parseCommand, UsageError } from "./args.ts";
import { chatCommand } from "./chat.ts";
import { describe, formatStats, loadProgress, verbosityOf } from "./feedback.ts";
import { chatUsage, overview, runUsage } from "./help.ts";
import { importCommand, importUsage } from "./import.ts";
import { modelsCommand, modelsUsage, resolveModel } from "./models.ts";
import {
  checkLogitBias, engineSettings, generationOptions, intOption, samplingFrom, stopStrings,
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
  if (topic === "env") { process.stdout.write(settingsHelp()); return 0; }
  if (!Object.hasOwn(usages, topic)) {
    throw new UsageError(`no command ${quote(topic, 40)} (commands: ` +
      `${Object.keys(usages).join(", ")}; 'infer help env': the environment variables)`, { pointToHelp: false });
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
    throw new UsageError(`${flag}: the shortest valid output is ${shortest} bytes, and ` +
      `-n ${run.maxTokens} cannot hold it (structured output needs a token per byte of it to be ` +
      `sure to finish); use -n ${shortest} or more`, { pointToHelp: false });
  }
  const prompt = engine.tokenizer.encode(run.prompt, { addSpecial: true, parseSpecial: true });
  const room = engine.contextLength - prompt.length;
  if (shortest > room) {
    throw new UsageError(`${flag}: the shortest valid output is ${shortest} bytes, and the ` +
      `context has room for ${Math.max(0, room)} tokens after the prompt (structured output ` +
      `needs a token per byte of it); raise --ctx-size`, { pointToHelp: false });
  }
  return new JsonGrammar(engine.tokenizer, node);
}

async function runCommand(argv: string[]): Promise<number> {
  const { values, positionals } = parseCommand(argv, {
    options: {
      ...generationOptions,
      "ignore-eos": { type: "boolean" },
      json: { type: "boolean" },
      "json-schema": { type: "string" },
    },
    positionals: { expected: "one prompt", min: 1, max: 1,
      hintWhenTooMany: "quote a prompt that has spaces: infer \"the prompt\"" },
  });
  if (values.help) { process.stdout.write(runUsage); return 0; }
  const verbosity = verbosityOf(values);
  const sampling = samplingFrom(values);
  const maxTokens = intOption(values.n, "-n", 128, -1);
  const stop = stopStrings(values);
  const settings = engineSettings(values);
  const modelPath = resolveModel(values.model ?? defaultModelPath());
  const onProgress = loadProgress(modelPath, verbosity);
  const engine = Engine.open({ modelPath, ...settings, onProgress });
  try {
    checkLogitBias(sampling, engine.model.info.vocabSize);
    const constraint = constraintFor(values, engine, { prompt: positionals[0], maxTokens });
    if (verbosity === "verbose") {
      process.stderr.write(describe(engine, modelPath, {
        sampling: { ...sampling, logitBias: Object.fromEntries(sampling.logitBias ?? []) },
        "max tokens": maxTokens, stop,
        constraint: values["json-schema"] ?? (values.json ? "JSON object" : "none"),
      }));
    }
    const { result, interrupted } = await untilInterrupted((shouldStop) =>
      engine.generateAsync(positionals[0], {
        maxTokens, sampling, stop, constraint, ignoreEos: values["ignore-eos"] ?? false,
        onText: (text) => process.stdout.write(text), shouldStop,
      }));
    process.stdout.write("\n");
    if (verbosity !== "quiet") process.stderr.write(formatStats(result, engine.loadMs) + "\n");
    return interrupted ? 130 : 0; // 128 + SIGINT, as a shell reports a command Ctrl-C ended
  } finally {
    engine.close();
  }
}

/**
 * Runs a generation with Ctrl-C (SIGINT) asking it to stop: the handler only sets the flag the
 * generation reads between tokens, so what was generated is kept and reported. A second Ctrl-C
 * (a prompt still being evaluated, which is not interrupted) exits at once.
 */
async function untilInterrupted(generate: (shouldStop: () => boolean) => Promise<GenerateResult>,
): Promise<{ result: GenerateResult; interrupted: boolean }> {
  let interrupted = false;
  const onSigint = () => {
    if (interrupted) process.exit(130);
    interrupted = true;
  };
  process.on("SIGINT", onSigint);
  try {
    const result = await generate(() => interrupted);
    return { result, interrupted };
  } finally {
    process.off("SIGINT", onSigint);
  }
}

export async function main(argv: string[]): Promise<number> {
  const name = argv.length > 0 && Object.hasOwn(commands, argv[0]) ? argv[0] : null;
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
      console.error(`${where}: ${err.message}`);
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
