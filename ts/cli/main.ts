// Command dispatch for the CLI. Every user-facing failure becomes one clear line on stderr and a
// non-zero exit; anything else is a bug and keeps its stack.
import { parseArgs } from "node:util";
import { availableParallelism } from "node:os";
import { InferError } from "../errors.ts";
import { Engine } from "../engine/engine.ts";
import { defaultSampling } from "../sample/sampler.ts";
import { importCommand } from "./import.ts";
import { perplexityCommand } from "./perplexity.ts";
import { quantizeCommand } from "./quantize.ts";
import { defaultModelPath } from "./setup.ts";

/** Subcommands, chosen when the first argument is exactly their name; anything else is a prompt. */
const commands: Record<string, (argv: string[]) => number | Promise<number>> = {
  import: importCommand,
  quantize: quantizeCommand,
  perplexity: perplexityCommand,
};

const usage = `usage: bun run infer.ts "prompt" [options]
       bun run infer.ts import <hf-folder> -o model.gguf [--quant TYPE]
       bun run infer.ts quantize <in.gguf> <out.gguf> --quant TYPE
       bun run infer.ts perplexity <model.gguf> <text-file> [options]

Streams the continuation of the prompt to stdout; timings go to stderr.

options:
  -m, --model PATH   GGUF model (default: the installed Gemma 3 270M Q4_K_M)
  -n N               tokens to generate (default 128)
  --temp T           temperature; 0 is greedy (default ${defaultSampling.temperature})
  --top-k K          keep the K most likely tokens (default ${defaultSampling.topK}; 0 = all)
  --top-p P          nucleus sampling threshold (default ${defaultSampling.topP})
  --min-p P          drop tokens under P × the best one's probability (default ${defaultSampling.minP})
  --seed S           sampler seed (default: random)
  -t, --threads N    CPU threads (default: all cores)
  -c, --ctx-size N   context length in tokens (default: min(4096, the model's))
  --ignore-eos       keep generating past end-of-sequence
  -h, --help         this text
`;

function intOption(value: string | undefined, name: string, fallback: number, min: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) throw new InferError("invalid_argument", `${name} must be an integer >= ${min}, got '${value}'`);
  return n;
}

function floatOption(value: string | undefined, name: string, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0) throw new InferError("invalid_argument", `${name} must be a number >= 0, got '${value}'`);
  return n;
}

async function run(argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      model: { type: "string", short: "m" },
      n: { type: "string", short: "n" },
      temp: { type: "string" },
      "top-k": { type: "string" },
      "top-p": { type: "string" },
      "min-p": { type: "string" },
      seed: { type: "string" },
      threads: { type: "string", short: "t" },
      "ctx-size": { type: "string", short: "c" },
      "ignore-eos": { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) { process.stdout.write(usage); return 0; }
  if (positionals.length !== 1) {
    process.stderr.write(usage);
    return 2;
  }
  const engine = Engine.open({
    modelPath: values.model ?? defaultModelPath(),
    threads: intOption(values.threads, "--threads", availableParallelism(), 1),
    contextLength: values["ctx-size"] === undefined ? undefined : intOption(values["ctx-size"], "--ctx-size", 0, 1),
  });
  try {
    const result = engine.generate(positionals[0], {
      maxTokens: intOption(values.n, "-n", 128, 0),
      ignoreEos: values["ignore-eos"] ?? false,
      sampling: {
        temperature: floatOption(values.temp, "--temp", defaultSampling.temperature),
        topK: intOption(values["top-k"], "--top-k", defaultSampling.topK, 0),
        topP: floatOption(values["top-p"], "--top-p", defaultSampling.topP),
        minP: floatOption(values["min-p"], "--min-p", defaultSampling.minP),
        seed: intOption(values.seed, "--seed", -1, 0),
      },
      onText: (text) => process.stdout.write(text),
    });
    process.stdout.write("\n");
    const rate = (n: number, ms: number) => (ms > 0 ? (n / ms) * 1000 : 0).toFixed(1);
    process.stderr.write(
      `load ${engine.loadMs.toFixed(0)} ms | prompt ${result.promptTokens.length} tokens, ` +
      `${rate(result.promptTokens.length, result.promptMs)} tok/s | generated ${result.tokens.length} tokens, ` +
      `${rate(Math.max(result.tokens.length - 1, 0), result.generateMs)} tok/s | stop: ${result.stopReason}\n`);
  } finally {
    engine.close();
  }
  return 0;
}

export async function main(argv: string[]): Promise<number> {
  try {
    const command = Object.hasOwn(commands, argv[0] ?? "") ? commands[argv[0]] : null;
    return command ? await command(argv.slice(1)) : await run(argv);
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
