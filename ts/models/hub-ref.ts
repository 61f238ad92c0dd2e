// A model on the Hugging Face Hub as it is asked for: `org/repo` or `org/repo:QUANT` (a file
// of the repo picked by its quantization, as llama.cpp's -hf picks it), or
// `org/repo/path/file.gguf` (that file); `hf.co/` or `huggingface.co/` in front is allowed, as
// Ollama takes them. Picking is by name alone, so the same rule finds a file in the repo's
// listing and, offline, in the cache.
import { InferError, quote } from "../errors.ts";
import { SPLIT_PART_NAME } from "../gguf/reader.ts";

export interface HubRef {
  /** `org/repo`. */
  readonly repo: string;
  /** The quantization asked for (`Q4_K_M`), or null: the repo's default pick. */
  readonly quant: string | null;
  /** A file's path in the repo, when one was named. */
  readonly file: string | null;
}

/** The quantization taken when none is asked for, then the next choices (llama.cpp's order). */
export const DEFAULT_QUANTS = ["Q4_K_M", "Q4_0", "Q8_0"] as const;

const PART = "[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?";
const REPO_WITH_QUANT = new RegExp(`^(${PART}/${PART})(?::([A-Za-z0-9._-]+))?$`);
const REPO_WITH_FILE = new RegExp(`^(${PART}/${PART})/(.+\\.gguf)$`, "i");

/** The Hub reference `text` stands for, or null when it is not one. */
export function parseHubRef(text: string): HubRef | null {
  const bare = text.replace(/^(?:https?:\/\/)?(?:hf\.co|huggingface\.co)\//, "");
  const quanted = REPO_WITH_QUANT.exec(bare);
  // `dir/model.gguf` is a path, never a repo
  if (quanted && !quanted[1].includes("..") && !/\.gguf$/i.test(quanted[1])) {
    return { repo: quanted[1], quant: quanted[2] ?? null, file: null };
  }
  const filed = REPO_WITH_FILE.exec(bare);
  if (filed && !filed[1].includes("..") &&
    filed[2].split("/").every((p) => p !== "" && p !== "." && p !== "..")) {
    return { repo: filed[1], quant: null, file: filed[2] };
  }
  return null;
}

export function hubRefText(ref: HubRef): string {
  return ref.file ? `${ref.repo}/${ref.file}` : ref.quant ? `${ref.repo}:${ref.quant}` : ref.repo;
}

function baseName(path: string): string {
  return path.slice(path.lastIndexOf("/") + 1);
}

/** Whether `path` is a model file a quantization can pick: a GGUF, a split's first part, no
 * vision projector (mmproj). */
export function isModelCandidate(path: string): boolean {
  const name = baseName(path).toLowerCase();
  if (!name.endsWith(".gguf") || name.includes("mmproj")) return false;
  const split = SPLIT_PART_NAME.exec(name);
  return !split || Number(split[2]) === 1;
}

/** Whether file `path`'s name carries `quant` as a whole word (Q4_K does not match Q4_K_M). */
export function nameHasQuant(path: string, quant: string): boolean {
  const name = baseName(path).toLowerCase(), tag = quant.toLowerCase();
  for (let at = name.indexOf(tag); at >= 0; at = name.indexOf(tag, at + 1)) {
    const before = at === 0 ? "" : name[at - 1], after = name[at + tag.length] ?? "";
    if ((before === "" || "-_.".includes(before)) && (after === "" || ".-".includes(after))) {
      return true;
    }
  }
  return false;
}

const QUANT_IN_NAME =
  /[-_.]((?:UD-)?(?:I?Q\d[A-Z0-9_]*?|TQ\d_\d|BF16|F16|F32))(?:-\d{5}-of-\d{5})?\.gguf$/i;

/** The quantization a file's name carries (`x-Q4_K_M.gguf` → Q4_K_M), or null. */
export function quantInName(path: string): string | null {
  return QUANT_IN_NAME.exec(baseName(path))?.[1].toUpperCase() ?? null;
}

/**
 * The file of `files` (paths in a repo) that `ref` picks: the first, in path order, whose name
 * carries ref.quant; without one, the first of DEFAULT_QUANTS present, else the first model
 * file. `chosen` says why when no quantization was asked for. Throws, listing what there is,
 * when nothing fits.
 */
export function pickHubFile(ref: HubRef, files: readonly string[],
): { file: string; chosen: string } {
  const candidates = files.filter(isModelCandidate).sort();
  if (candidates.length === 0) {
    throw new InferError("invalid_argument", `${ref.repo} has no GGUF file`);
  }
  if (ref.quant !== null) {
    const file = candidates.find((f) => nameHasQuant(f, ref.quant!));
    if (file) return { file, chosen: "" };
    const quants = [...new Set(candidates.map((f) => quantInName(f) ?? baseName(f)))].sort();
    throw new InferError("invalid_argument", `${ref.repo} has no ${quote(ref.quant, 40)} file; ` +
      `it has ${quants.slice(0, 24).join(", ")}${quants.length > 24 ? ", ..." : ""}`);
  }
  for (const quant of DEFAULT_QUANTS) {
    const file = candidates.find((f) => nameHasQuant(f, quant));
    if (file) return { file, chosen: `no quantization asked for: took ${quant} (${file})` };
  }
  return { file: candidates[0], chosen: `no quantization asked for and no ` +
    `${DEFAULT_QUANTS.join(", ")}: took ${candidates[0]}` };
}
