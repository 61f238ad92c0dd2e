// Options shared by the commands that generate (the prompt command and chat): the model, the
// context, the sampler chain, stop strings, and how much to say on stderr. Values are checked
// here, at the boundary; each bad one is a UsageError, a single line naming the option.
import { availableParallelism } from "node:os";
import type { ParseArgsConfig } from "node:util";
import { kvTypes, type KvType } from "../backend/backend.ts";
import { SHIFT_POLICIES, type ShiftPolicy } from "../engine/kv-cache.ts";
import { backendKinds, parseBackendKind, type BackendKind } from "../backend/select.ts";
import { setting } from "../config/env.ts";
import { InferError, quote } from "../errors.ts";
import { defaultSampling, type SamplerOptions } from "../sample/sampler.ts";
import { defaultThreads } from "../native/cpu-cores.ts";
import {
  defaultDraftMax, SELF_DRAFT, speculationModes, type SpeculationMode, type SpeculationOptions,
} from "../engine/speculation.ts";
import { UsageError } from "./args.ts";
import type { GenerateOptions } from "../api/options.ts";

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
  spec: { type: "string" },
  "draft-max": { type: "string" },
  "draft-model": { type: "string" },
  "shift-policy": { type: "string" },
  threads: { type: "string", short: "t" },
  "ctx-size": { type: "string", short: "c" },
  "cache-type-k": { type: "string" },
  "cache-type-v": { type: "string" },
  backend: { type: "string" },
  gpus: { type: "string" },
  quiet: { type: "boolean", short: "q" },
  verbose: { type: "boolean", short: "v" },
  help: { type: "boolean", short: "h" },
} as const satisfies ParseArgsConfig["options"];

/** The help text for generationOptions (sampling defaults are llama.cpp's). */
export function generationHelp(defaultTokens: string): string {
  const d = defaultSampling;
  return `model and context:
  -m, --model PATH|NAME  a GGUF file, a model in the cache by name (see 'infer models'), or
                         org/repo[:QUANT] on the Hugging Face Hub, pulled on first use
                         (default: the installed Gemma 3 270M Q4_K_M)
  -c, --ctx-size N       context length in tokens (default: min(4096, the model's))
  -ctk, --cache-type-k T KV cache keys: f16, q8_0, q4_0, tq4 or tq3 (default f16; tq: CPU, CUDA)
  -ctv, --cache-type-v T KV cache values, as -ctk (q4_0 keys cost the most quality)
  -t, --threads N        CPU threads (default: physical cores; capped to the CPUs)
  --backend B            cpu, cuda, metal, or auto: Metal on Apple silicon, else CUDA when
                         available, else the CPU (default: auto)
  --gpus N               GPUs to split the model over (default 1; more not yet: docs/cuda.md)

generation (defaults are llama.cpp's):
  -n N                   tokens to generate; -1: no limit, the context shifting when full
                         (keeps its first 4 tokens, drops the older half; CPU) (${defaultTokens})
  --shift-policy P       what a shift keeps: streaming (default: the newest half) or h2o (half
                         of it the older positions that drew the most attention)
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
${speculationHelp}
output:
  -q, --quiet            no progress or statistics on stderr
  -v, --verbose          the model, settings and template on stderr before generating
  -h, --help             this text
`;
}

/** The help text for --spec and --draft-max (the prompt command, chat and serve). */
export const speculationHelp = `  --spec MODE            speculative decoding, the same output in fewer passes: ngram drafts
                         tokens by finding the last ones earlier in the prompt or the text
                         (faster where the text repeats its input); draft: a draft model's;
                         off (default: draft with --draft-model, else ngram on the CPU, off
                         on a GPU); self: --draft-model self. Drafted tokens are kept where
                         the model chooses them too
  --draft-max K          drafted tokens a step at most, 1..64 (default ${defaultDraftMax})
  --draft-model PATH     a GGUF with the model's vocabulary to draft with: a smaller model of
                         its family, or a Q4_0 copy of it ('infer quantize'); self: the
                         model's own Q4_0 copy, made once and cached
`;

/** --spec and --draft-max; undefined: the engine's default. */
export function speculationFrom(v: { spec?: string; "draft-max"?: string }):
  SpeculationOptions | undefined {
  const spec = v.spec;
  if (spec !== undefined && !(speculationModes as readonly string[]).includes(spec)) {
    const modes = [...speculationModes.filter((m) => m !== "off"), SELF_DRAFT, "off"];
    throw new UsageError(`--spec must be one of ${modes.join(", ")}, got ${quote(spec, 40)}`);
  }
  const draftMax = v["draft-max"] === undefined ? undefined
    : intOption(v["draft-max"], "--draft-max", defaultDraftMax, 1, 64);
  if (spec === undefined && draftMax === undefined) return undefined;
  return { mode: (spec ?? "ngram") as SpeculationMode, draftMax };
}

/** --spec, --draft-max and --draft-model as the library's load options. */
export function speculationLoad(v: { spec?: string; "draft-max"?: string; "draft-model"?: string }):
  { speculation?: SpeculationMode; draftMax?: number; draftModel?: string } {
  if (v["draft-model"] === "") {
    throw new UsageError("--draft-model needs a GGUF path, a cached model's name or self");
  }
  // --spec self: the model's own Q4_0 copy drafts (self-draft.ts)
  if (v.spec === SELF_DRAFT) {
    if (v["draft-model"] !== undefined && v["draft-model"] !== SELF_DRAFT) {
      throw new UsageError("--spec self drafts with the model's own Q4_0 copy: drop --draft-model");
    }
    return speculationLoad({ ...v, spec: "draft", "draft-model": SELF_DRAFT });
  }
  const o = speculationFrom(v);
  const model = v["draft-model"];
  if (o?.mode === "draft" && model === undefined) {
    throw new UsageError("--spec draft needs --draft-model PATH");
  }
  // --draft-max alone, with a draft model: that model drafts
  const mode = o && v.spec === undefined && model !== undefined ? "draft" : o?.mode;
  return { ...(o ? { speculation: mode, draftMax: o.draftMax } : {}),
    ...(model === undefined ? {} : { draftModel: model }) };
}

type Option<K extends keyof typeof generationOptions> = (typeof generationOptions)[K];
type Values = { [K in keyof typeof generationOptions]?: Option<K> extends { multiple: true }
  ? string[] : Option<K> extends { type: "boolean" } ? boolean : string };

/**
 * An integer option: `fallback` when absent, else a whole number in min..max (the top bound
 * keeps a mistyped "1e30" from reaching an allocation as a size).
 */
export function intOption(value: string | undefined, name: string, fallback: number,
  min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  const unbounded = max === Number.MAX_SAFE_INTEGER;
  if (value.trim() === "" || !Number.isInteger(n) || n < min || (!unbounded && n > max)) {
    const range = unbounded ? `>= ${min}` : `from ${min} to ${max}`;
    throw new UsageError(`${name} must be an integer ${range}, got ${quote(value, 40)}`);
  }
  if (n > max) throw new UsageError(`${name} ${quote(value, 40)} is too large (at most ${max})`);
  return n;
}

export function floatOption(value: string | undefined, name: string, fallback: number,
  min = 0): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n) || n < min) {
    throw new UsageError(`${name} must be a number >= ${min}, got ${quote(value, 40)}`);
  }
  return n;
}

/**
 * --threads: the default is one per physical core (ts/native/cpu-cores.ts). More threads than
 * logical CPUs only slow decoding down (64 threads on 2 cores decode at 5% of the speed), so a
 * larger count is capped to the logical CPUs, with a note.
 */
export function threadsOption(value: string | undefined): number {
  const cpus = availableParallelism();
  const n = intOption(value, "--threads", defaultThreads(), 1);
  if (n <= cpus) return n;
  process.stderr.write(`infer: note: --threads ${n} is more than the ${cpus} CPUs here; ` +
    `using ${cpus}\n`);
  return cpus;
}

export function backendOption(value: string | undefined): BackendKind {
  if (value !== undefined) {
    try {
      return parseBackendKind(value);
    } catch (err) {
      if (err instanceof InferError) {
        throw new UsageError(`--backend must be one of ${backendKinds.join(", ")}, got ` +
          quote(value, 40));
      }
      throw err;
    }
  }
  return parseBackendKind(setting("INFER_BACKEND") ?? "auto", "INFER_BACKEND");
}

/** llama.cpp's --logit-bias TOKEN_ID(+/-)BIAS, e.g. 15043+1, 15043-0.5, 15043-inf. */
export function parseLogitBias(values: readonly string[]): Map<number, number> {
  const bias = new Map<number, number>();
  for (const v of values) {
    const m = /^(\d+)\s*([+-=])\s*(inf|[0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)$/i.exec(v.trim());
    if (!m || !Number.isSafeInteger(Number(m[1]))) {
      throw new UsageError("--logit-bias must be TOKEN_ID+BIAS or TOKEN_ID-BIAS, got " +
        quote(v, 40));
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
    seed: intOption(v.seed, "--seed", -1, -1, 2 ** 32 - 1),
  };
}

/** --logit-bias names tokens by id; one past the model's vocabulary would be ignored silently. */
export function checkLogitBias(sampling: SamplerOptions, vocabSize: number): void {
  for (const id of sampling.logitBias?.keys() ?? []) {
    if (id >= vocabSize) {
      throw new UsageError(`--logit-bias: token ${id} is not in the model's vocabulary ` +
        `(ids 0 to ${vocabSize - 1})`);
    }
  }
}

/** --gpus N: GPUs to split the model over (ts/engine/gpus.ts); absent: not asked. */
export function gpusOption(value: string | undefined): number | undefined {
  return value === undefined ? undefined : intOption(value, "--gpus", 1, 1, 64);
}

export function engineSettings(v: Values): {
  threads: number; contextLength?: number; backend: BackendKind; gpus?: number; cacheTypeK?: KvType;
  cacheTypeV?: KvType } {
  return {
    gpus: gpusOption(v.gpus),
    threads: threadsOption(v.threads),
    contextLength: v["ctx-size"] === undefined ? undefined
      : intOption(v["ctx-size"], "--ctx-size", 0, 1),
    backend: backendOption(v.backend),
    cacheTypeK: cacheTypeOption(v["cache-type-k"], "--cache-type-k"),
    cacheTypeV: cacheTypeOption(v["cache-type-v"], "--cache-type-v"),
  };
}

/** --cache-type-k/--cache-type-v: llama.cpp's names of the KV cache types infer stores. */
export function cacheTypeOption(value: string | undefined, name: string): KvType | undefined {
  if (value === undefined) return undefined;
  if (!(kvTypes as readonly string[]).includes(value)) {
    throw new UsageError(`${name} must be one of ${kvTypes.join(", ")}, got ${quote(value, 40)}`);
  }
  return value as KvType;
}

/** --shift-policy: which positions the context shift keeps (ts/engine/kv-cache.ts). */
export function shiftPolicyOption(value: string | undefined): ShiftPolicy | undefined {
  if (value === undefined) return undefined;
  if (!(SHIFT_POLICIES as readonly string[]).includes(value)) {
    throw new UsageError(`--shift-policy must be one of ${SHIFT_POLICIES.join(", ")}, got ${quote(value, 40)}`);
  }
  return value as ShiftPolicy;
}

export function stopStrings(v: Values): string[] {
  const stops = v.stop ?? [];
  if (stops.some((s) => s.length === 0)) {
    throw new UsageError("--stop needs a non-empty text");
  }
  return stops;
}

/** The sampler settings checked here, as the library's generation options. */
export function samplingOptions(s: SamplerOptions): GenerateOptions {
  return {
    temperature: s.temperature, topK: s.topK, topP: s.topP, minP: s.minP, typicalP: s.typicalP,
    repeatPenalty: s.repeatPenalty, repeatLastN: s.repeatLastN,
    frequencyPenalty: s.frequencyPenalty, presencePenalty: s.presencePenalty,
    logitBias: s.logitBias, seed: s.seed,
  };
}
