// Reading a command line. node:util's parseArgs does the parsing; this module checks what it
// read first (unknown options, options without their value, booleans given one, the count of
// positional arguments) so that each mistake becomes one line saying what is wrong, and main
// adds where to look ("see 'infer quantize --help'") and exits 2, instead of parseArgs's own
// text or a page of usage.
import { readFileSync } from "node:fs";
import { parseArgs, type ParseArgsConfig } from "node:util";
import { InferError, quote } from "../errors.ts";

type Options = NonNullable<ParseArgsConfig["options"]>;

/** A mistake in how a command was called: printed with a pointer to its help, exit code 2. */
export class UsageError extends InferError {
  /** Whether main should point at the command's --help after the message. */
  readonly pointToHelp: boolean;
  constructor(message: string, options: { pointToHelp?: boolean } = {}) {
    super("invalid_argument", message);
    this.pointToHelp = options.pointToHelp ?? true;
  }
}

export interface CommandLine<O extends Options> {
  readonly options: O;
  /** The positional arguments: how to name them in a message, and how many there may be. */
  readonly positionals: {
    /** e.g. "<in.gguf> <out.gguf>", or "no arguments". */
    readonly expected: string;
    readonly min: number;
    readonly max: number;
    /** Said after the count when there are too many (e.g. how to quote a prompt). */
    readonly hintWhenTooMany?: string;
  };
}

/** A value that looks like a negative number ("-1", "-.5", "-inf"), not like an option. */
const NEGATIVE_NUMBER = /^-(\d|\.\d|inf)/i;

/**
 * node:util's parseArgs reads "-1" after "-n" as an option, not a value; llama.cpp users type
 * "-n -1". Joins a value-taking option and a negative number that follows it ("--n=-1").
 */
export function joinNegativeValues(argv: readonly string[], options: Options): string[] {
  argv = llamaShortNames(argv, options);
  const takesValue = new Map<string, string>();
  for (const [name, o] of Object.entries(options)) {
    if (o.type !== "string") continue;
    takesValue.set(`--${name}`, name);
    if (o.short) takesValue.set(`-${o.short}`, name);
  }
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const name = takesValue.get(argv[i]);
    if (name !== undefined && i + 1 < argv.length && NEGATIVE_NUMBER.test(argv[i + 1])) {
      out.push(`--${name}=${argv[++i]}`);
    } else out.push(argv[i]);
  }
  return out;
}

/** llama.cpp's two-letter short options, where the command has the long one. */
const LLAMA_SHORT: Readonly<Record<string, string>> = { "-ctk": "cache-type-k", "-ctv": "cache-type-v" };

function llamaShortNames(argv: readonly string[], options: Options): readonly string[] {
  const end = argv.indexOf("--");
  return argv.map((a, i) => {
    if (end >= 0 && i > end) return a;
    const [flag, ...rest] = a.split("=");
    const long = LLAMA_SHORT[flag];
    return long !== undefined && Object.hasOwn(options, long) ? [`--${long}`, ...rest].join("=") : a;
  });
}

/** The options and positional arguments of `argv`, or a UsageError naming the first mistake. */
export function parseCommand<const O extends Options>(argv: readonly string[],
  spec: CommandLine<O>) {
  const args = joinNegativeValues(argv, spec.options);
  checkOptions(args, spec.options);
  const parsed = parseArgs({ args, options: spec.options, allowPositionals: true, strict: true });
  const help = (parsed.values as { help?: unknown }).help === true;
  const p = spec.positionals, n = parsed.positionals.length;
  if (!help && (n < p.min || n > p.max)) {
    const shown = parsed.positionals.slice(0, 3).map((a) => quote(a, 24)).join(", ");
    const count = n === 0 ? "none" : `${n} argument${n === 1 ? "" : "s"} (${shown}` +
      `${n > 3 ? ", ..." : ""})`;
    const hint = n > p.max && p.hintWhenTooMany ? `; ${p.hintWhenTooMany}` : "";
    throw new UsageError(`expected ${p.expected}, got ${count}${hint}`);
  }
  return parsed;
}

/** Unknown options, a value-taking option without its value, a boolean with one. */
function checkOptions(args: readonly string[], options: Options): void {
  const { tokens } = parseArgs({ args: [...args], options, allowPositionals: true, strict: false,
    tokens: true });
  for (const t of tokens) {
    if (t.kind !== "option") continue;
    const o = Object.hasOwn(options, t.name) ? options[t.name] : undefined;
    const name = quote(t.rawName, 40);
    if (o === undefined) {
      const arg = args[t.index];
      // "-5 degrees" is read as options -5, -d, ...: most likely a text meant as an argument
      if (/\s/.test(arg)) {
        throw new UsageError(`unknown option ${quote(arg, 40)}; an argument that starts ` +
          `with '-' goes after '--' (infer -- ${quote(arg, 20)})`);
      }
      throw new UsageError(`unknown option ${name}`);
    }
    if (o.type === "boolean") {
      if (t.value !== undefined) throw new UsageError(`option ${name} takes no value`);
      continue;
    }
    if (t.value === undefined) throw new UsageError(`option ${name} needs a value`);
    // strict: false takes the next argument whatever it is; "-n --temp 1" lacks -n's value
    if (!t.inlineValue && t.value.length > 1 && t.value.startsWith("-")
      && !NEGATIVE_NUMBER.test(t.value)) {
      throw new UsageError(`option ${name} needs a value, got the option ${quote(t.value, 40)} ` +
        `(write ${t.rawName.startsWith("--") ? t.rawName : `--${t.name}`}=VALUE for a value ` +
        "that starts with '-')");
    }
  }
}

/** A required option's value, or a UsageError naming it. */
export function requiredOption(value: string | undefined, what: string): string {
  if (value === undefined || value === "") throw new UsageError(`${what} is required`);
  return value;
}

/**
 * The text a command works on: its one positional argument ('-': standard input), or with
 * -f FILE the file's text ('-': standard input), never both. `what` names it ("prompt").
 */
export async function textArgument(positionals: readonly string[], file: string | undefined,
  what: string): Promise<string> {
  if (file === undefined) {
    if (positionals.length === 0) throw new UsageError(`expected one ${what}, got none`);
    return positionals[0] === "-" ? await Bun.stdin.text() : positionals[0];
  }
  if (positionals.length > 0) throw new UsageError(`give the ${what} as an argument or with -f, not both`);
  try {
    return file === "-" ? await Bun.stdin.text() : readFileSync(file, "utf8");
  } catch (err) {
    throw new InferError("io", `-f ${quote(file)}: ${quote((err as Error).message, 160)}`);
  }
}
