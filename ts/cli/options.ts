// Options shared by the commands that generate (the prompt command and chat): the model, the
// context, the sampler chain, stop strings, and how much to say on stderr. Values are checked
// here, at the boundary; each bad one is a single line naming the option.
import { availableParallelism } from "node:os";
import type { ParseArgsConfig } from "node:util";
import { parseBackendKind, type BackendKind } from "../backend/select.ts";
import { InferError } from "../errors.ts";
import { defaultSampling, type SamplerOptions } from "../sample/sampler.ts";

export const generationOptions = {
  model: { type: "string", short: "m" },
  n: { type: "string", short: "n" },
  temp: { type: "string" },
  "top-k": { type: "string" },
  "top-p": { type: "string" },
  "min-p": { type: "string" },
  typical: { type: "string" },
  "repeat-penalty": { type: "string" },
  "repeat-last-n": { type: "string" },
  "frequency-penalty": { type: "string" },
  "presence-penalty": { type: "string" },
  "logit-bias": { type: "string", multiple: true },
  seed: { type: "string", short: "s" },
  stop: { type: "string", multiple: true },
  threads: { type: "string", short: "t" },
  "ctx-size": { type: "string", short: "c" },
  backend: { type: "string" },
  quiet: { type: "boolean", short: "q" },
  verbose: { type: "boolean", short: "v" },
  help: { type: "boolean", short: "h" },
} as const satisfies ParseArgsConfig["options"];

/**
 * node:util's parseArgs reads "-1" after "-n" as an option, not a value; llama.cpp users type
 * "-n -1". Joins a value-taking option and a negative number that follows it ("--n=-1").
 */
export function joinNegativeValues(argv: readonly string[],
  options: ParseArgsConfig["options"]): string[] {
  const takesValue = new Map<string, string>();
  for (const [name, o] of Object.entries(options ?? {})) {
    if (o.type !== "string") continue;
    takesValue.set(`--${name}`, name);
    if (o.short) takesValue.set(`-${o.short}`, name);
  }
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const name = takesValue.get(argv[i]);
    if (name !== undefined && i + 1 < argv.length && /^-(\d|\.\d|inf)/i.test(argv[i + 1])) {
      out.push(`--${name}=${argv[++i]}`);
    } else out.push(argv[i]);
  }
  return out;
}

/** The help text for generationOptions (sampling defaults are llama.cpp's). */
export function generationHelp(defaultTokens: string): string {
  const d = defaultSampling;
  return `model and context:
  -m, --model PATH|NAME  a GGUF file, or a model in the cache by name (see 'infer models';
                         default: the installed Gemma 3 270M Q4_K_M)
  -c, --ctx-size N       context length in tokens (default: min(4096, the model's))
  -t, --threads N        CPU threads (default: all cores)
  --backend B            cpu, cuda, metal, or auto: Metal on Apple silicon, else CUDA when
                         available, else the CPU (default: auto)

generation (defaults are llama.cpp's):
  -n N                   tokens to generate; -1: until the context is full (${defaultTokens})
  --temp T               temperature; 0 is greedy (default ${d.temperature})
  --top-k K              keep the K most likely tokens; 0: all (default ${d.topK})
  --top-p P              keep the fewest tokens reaching probability P; 1: off (default ${d.topP})
  --min-p P              drop tokens under P × the top one's probability; 0: off (default ${d.minP})
  --typical P            locally typical sampling; 1: off (default ${d.typicalP})
  --repeat-penalty F     weaken the logits of tokens seen lately; 1: off (default ${d.repeatPenalty})
  --repeat-last-n N      tokens the penalties look at; 0: none, -1: all (default ${d.repeatLastN})
  --frequency-penalty F  subtract F × (times seen) from a logit (default ${d.frequencyPenalty})
  --presence-penalty F   subtract F from the logit of any token seen (default ${d.presencePenalty})
  --logit-bias ID+B      add B to token ID's logit (ID-B subtracts; ID-inf bans it); repeatable
  -s, --seed S           sampler seed: same seed and settings, same text (default: random)
  --stop TEXT            end before TEXT (never printed); repeatable

output:
  -q, --quiet            no progress or statistics on stderr
  -v, --verbose          the model, settings and template on stderr before generating
  -h, --help             this text
`;
}

type Option<K extends keyof typeof generationOptions> = (typeof generationOptions)[K];
type Values = { [K in keyof typeof generationOptions]?: Option<K> extends { multiple: true }
  ? string[] : Option<K> extends { type: "boolean" } ? boolean : string };

export function intOption(value: string | undefined, name: string, fallback: number,
  min: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) {
    throw new InferError("invalid_argument", `${name} must be an integer >= ${min}, ` +
      `got '${value}'`);
  }
  return n;
}

export function floatOption(value: string | undefined, name: string, fallback: number,
  min = 0): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n) || n < min) {
    throw new InferError("invalid_argument", `${name} must be a number >= ${min}, got '${value}'`);
  }
  return n;
}

/** llama.cpp's --logit-bias TOKEN_ID(+/-)BIAS, e.g. 15043+1, 15043-0.5, 15043-inf. */
export function parseLogitBias(values: readonly string[]): Map<number, number> {
  const bias = new Map<number, number>();
  for (const v of values) {
    const m = /^(\d+)\s*([+-=])\s*(inf|[0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)$/i.exec(v.trim());
    if (!m) {
      throw new InferError("invalid_argument",
        `--logit-bias must be TOKEN_ID+BIAS or TOKEN_ID-BIAS, got '${v}'`);
    }
    const magnitude = m[3].toLowerCase() === "inf" ? Infinity : Number(m[3]);
    bias.set(Number(m[1]), m[2] === "-" ? -magnitude : magnitude);
  }
  return bias;
}

export function samplingFrom(v: Values): SamplerOptions {
  const d = defaultSampling;
  return {
    temperature: floatOption(v.temp, "--temp", d.temperature),
    topK: intOption(v["top-k"], "--top-k", d.topK, 0),
    topP: floatOption(v["top-p"], "--top-p", d.topP),
    minP: floatOption(v["min-p"], "--min-p", d.minP),
    typicalP: floatOption(v.typical, "--typical", d.typicalP),
    repeatPenalty: floatOption(v["repeat-penalty"], "--repeat-penalty", d.repeatPenalty),
    repeatLastN: intOption(v["repeat-last-n"], "--repeat-last-n", d.repeatLastN, -1),
    frequencyPenalty: floatOption(v["frequency-penalty"], "--frequency-penalty",
      d.frequencyPenalty, -Infinity),
    presencePenalty: floatOption(v["presence-penalty"], "--presence-penalty",
      d.presencePenalty, -Infinity),
    logitBias: parseLogitBias(v["logit-bias"] ?? []),
    seed: intOption(v.seed, "--seed", -1, -1),
  };
}

export function engineSettings(v: Values): { threads: number; contextLength?: number; backend: BackendKind } {
  return {
    threads: intOption(v.threads, "--threads", availableParallelism(), 1),
    contextLength: v["ctx-size"] === undefined ? undefined
      : intOption(v["ctx-size"], "--ctx-size", 0, 1),
    backend: parseBackendKind(v.backend ?? process.env.INFER_BACKEND ?? "auto"),
  };
}

export function stopStrings(v: Values): string[] {
  const stops = v.stop ?? [];
  if (stops.some((s) => s.length === 0)) {
    throw new InferError("invalid_argument", "--stop needs a non-empty text");
  }
  return stops;
}
