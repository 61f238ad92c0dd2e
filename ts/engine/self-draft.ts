// Self-speculation: the model's own weights in a cheaper quantization draft for it. The draft is
// a Q4_0 copy in which every matrix is Q4_0, the LM head too (a plain `infer quantize --quant
// Q4_0` keeps the head at Q6_K, as llama-quantize does, and on a small model with a large
// vocabulary the head is most of what a pass reads). It is made once per model file, with
// infer's quantizer, and kept in the cache (<INFER_CACHE>/drafts), named by the file's path, size
// and modification time, so a changed model gets a new copy.
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, renameSync, rmSync, statSync } from "node:fs";
import { basename, join, resolve } from "node:path";
import { requantizeGguf } from "../convert/import.ts";
import { stderrProgress, type Progress } from "../convert/progress.ts";
import { cacheDir } from "../models/cache.ts";
import { ensureModel } from "../models/fetch.ts";
import { SELF_DRAFT } from "./speculation.ts";

/** Where the self-draft copy of `modelPath` is (or will be) cached. */
export function selfDraftPath(modelPath: string): string {
  const full = resolve(modelPath), st = statSync(full);
  const key = createHash("sha256").update(`${full}\0${st.size}\0${st.mtimeMs}`).digest("hex").slice(0, 12);
  const name = basename(full).replace(/\.gguf$/i, "");
  return join(cacheDir(), "drafts", `${name}.self-q4_0.${key}.gguf`);
}

/**
 * The path of the Q4_0 self-draft of `modelPath`, made now (seconds to minutes: every tensor
 * is dequantized and packed again) when the cache does not hold it yet.
 */
export function ensureSelfDraft(modelPath: string, progress?: Progress): string {
  const out = selfDraftPath(modelPath);
  if (existsSync(out)) return out;
  mkdirSync(join(cacheDir(), "drafts"), { recursive: true });
  // Written beside it and renamed: a run cut short leaves no half file under the final name.
  const partial = `${out}.${process.pid}.partial`;
  try {
    requantizeGguf({ input: modelPath, output: partial, quant: "Q4_0", pure: true,
      allowRequantize: true, progress });
    renameSync(partial, out);
  } finally {
    rmSync(partial, { force: true });
  }
  return out;
}

/**
 * A draft model option as a file: "self" is the model's own Q4_0 copy (made and cached here,
 * its progress on stderr unless `quiet`), anything else a path or a cached model's name.
 */
export async function resolveDraftModel(draftModel: string, modelPath: string,
  quiet = false): Promise<string> {
  if (draftModel !== SELF_DRAFT) return ensureModel(draftModel);
  return ensureSelfDraft(modelPath, quiet ? undefined : stderrProgress("self-draft (Q4_0 copy)"));
}
