// `infer perplexity <model> <text-file>`: perplexity as llama.cpp's llama-perplexity computes it,
// so the two figures can be compared: the text is tokenized once (BOS added as the model asks),
// cut into non-overlapping chunks of n_ctx tokens (the first token of each replaced by BOS), and
// only the second half of each chunk is scored, each token under the logits of the position
// before it, so every scored token has at least n_ctx/2 tokens of context.
//
// With --context-shift the text is instead read as one stream through a context of n_ctx tokens
// that shifts when full (ts/engine/kv-cache.ts shiftSlot: the first --keep positions kept, half of
// the rest dropped, the kept keys' RoPE turned back), as a chat or `-n -1` goes on past its context;
// --shift-policy h2o keeps the heavy hitters among the older positions instead (shiftSlotHeavy).
// llama-perplexity has no such mode. Run again with -c at least the text's length and the same
// --score-from, where nothing shifts, for the figure the shifted one is held against.
import { readFileSync } from "node:fs";
import { Engine } from "../engine/engine.ts";
import {
  rewindSlot, shiftDiscard, shiftSlotBy, SHIFT_KEEP, trackAttention, type ShiftPolicy,
} from "../engine/kv-cache.ts";
import { refuseNonFinite } from "../engine/generation.ts";
import { InferError, quote } from "../errors.ts";
import { resolveModel } from "../models/cache.ts";
import { parseCommand } from "./args.ts";
import { backendOption, cacheTypeOption, intOption, shiftPolicyOption, threadsOption } from "./options.ts";

export const perplexityUsage = `usage: infer perplexity <model.gguf> <text-file> [options]

Scores the text as llama-perplexity does (chunks of n_ctx tokens, second half of each scored).
<model.gguf> is a path or the name of a model in the cache ('infer models').

options:
  -c, --ctx-size N   tokens per chunk (default 512)
  --chunks N         score at most N chunks (default: all)
  -b, --batch-size N tokens a forward pass evaluates (and the cache stores) at most (default:
                     -c, at most 512)
  -t, --threads N    CPU threads (default: physical cores; capped to the CPUs)
  --backend B        cpu, cuda, metal or auto: a GPU when available (default: auto)
  -ctk, --cache-type-k T  KV cache keys: f16, q8_0, q4_0, tq4 or tq3 (default f16)
  -ctv, --cache-type-v T  KV cache values, as -ctk
  --context-shift    read the text as one stream through the context, shifting it when full
                     (keep the first --keep positions, drop half the rest); no chunks
  --shift-policy P   streaming (default: the most recent positions) or h2o (half of them the
                     positions with the most attention so far, the heavy hitters)
  --keep N           positions the shift keeps at the start (default ${SHIFT_KEEP})
  --score-from N     with --context-shift: score the tokens from N on (default: half of -c)
  -h, --help         this text
`;

export interface PerplexityResult {
  readonly perplexity: number;
  /** The standard error of the estimate, as llama-perplexity prints it after "+/-". */
  readonly error: number;
  readonly chunks: number;
  readonly scoredTokens: number;
  readonly textTokens: number;
}

/** log p(target | logits) with a max-shifted f64 sum, as llama-perplexity's log_softmax. */
function logSoftmax(logits: Float32Array, offset: number, vocab: number, target: number): number {
  let max = -Infinity;
  for (let i = 0; i < vocab; i++) if (logits[offset + i] > max) max = logits[offset + i];
  let sum = 0;
  for (let i = 0; i < vocab; i++) sum += Math.exp(logits[offset + i] - max);
  return logits[offset + target] - max - Math.log(sum);
}

export function perplexity(engine: Engine, text: string, o: {
  contextLength: number; chunks?: number;
  onChunk?: (chunk: number, perplexity: number) => void }): PerplexityResult {
  const nCtx = o.contextLength, tokenizer = engine.tokenizer, model = engine.model;
  const tokens = tokenizer.encode(text, { addSpecial: true, parseSpecial: false });
  if (tokens.length < 2 * nCtx) {
    throw new InferError("invalid_argument",
      `the text has ${tokens.length} tokens; perplexity with a ` +
      `context of ${nCtx} needs at least ${2 * nCtx}`);
  }
  const chunks = Math.min(Math.floor(tokens.length / nCtx), o.chunks ?? Infinity);
  const first = Math.floor(nCtx / 2), vocab = model.info.vocabSize;
  let nll = 0, nll2 = 0, count = 0;
  for (let c = 0; c < chunks; c++) {
    const chunk = tokens.slice(c * nCtx, (c + 1) * nCtx);
    if (tokenizer.addBos && tokenizer.bos !== null) chunk[0] = tokenizer.bos;
    for (let start = 0; start < nCtx; start += model.maxBatch) {
      const n = Math.min(model.maxBatch, nCtx - start);
      model.forward(chunk.slice(start, start + n), n, start, engine.cache.layers, {
        onLogits: (firstRow, rows, logits) => {
          for (let r = 0; r < rows; r++) {
            const position = start + firstRow + r;
            if (position < first || position >= nCtx - 1) continue;
            refuseNonFinite(logits.subarray(r * vocab, (r + 1) * vocab), position);
            const v = -logSoftmax(logits, r * vocab, vocab, chunk[position + 1]);
            nll += v;
            nll2 += v * v;
            count++;
          }
        },
      });
    }
    o.onChunk?.(c + 1, Math.exp(nll / count));
  }
  const mean = nll / count, ppl = Math.exp(mean);
  const variance = nll2 / count - mean * mean;
  const error = variance > 0 ? Math.sqrt(variance / (count - 1)) * ppl : 0;
  return { perplexity: ppl, error, chunks, scoredTokens: count, textTokens: tokens.length };
}

/** Perplexity of the text as one stream through a shifting context (the file's header). */
export function streamingPerplexity(engine: Engine, text: string, o: {
  contextLength: number; scoreFrom: number; keep?: number;
  /** Which positions a shift keeps past the sinks (default "streaming"). */
  policy?: ShiftPolicy;
  /**
   * Instead of turning the kept keys, evaluate the kept tokens again at their new positions (the
   * same tokens kept, as the shift keeps them; slow): what the shift approximates, so that the
   * difference between the two is the shift's own cost, apart from the context it drops.
   */
  recompute?: boolean }): PerplexityResult & { shifts: number } {
  const tokenizer = engine.tokenizer, model = engine.model, slot = engine.slot;
  const tokens = Int32Array.from(tokenizer.encode(text, { addSpecial: true, parseSpecial: false }));
  if (tokens.length < o.scoreFrom + 2) {
    throw new InferError("invalid_argument", `the text has ${tokens.length} tokens; scoring from ` +
      `token ${o.scoreFrom} needs at least ${o.scoreFrom + 2}`);
  }
  const vocab = model.info.vocabSize, layers = engine.cache.layers;
  let nll = 0, nll2 = 0, count = 0, shifts = 0;
  const policy = o.policy ?? "streaming";
  rewindSlot(slot, 0);
  if (policy === "h2o" && (o.recompute || !trackAttention(engine.backend, slot))) {
    throw new InferError("unsupported", o.recompute ? "recompute keeps the streaming policy's positions"
      : `the ${engine.backend.name} backend cannot track attention for the h2o shift`);
  }
  for (let next = 0; next < tokens.length - 1;) {
    if (slot.length === o.contextLength) {
      if (o.recompute) {
        const keep = o.keep ?? SHIFT_KEEP, discard = shiftDiscard(slot.cache, model.info, keep, slot.length);
        if (discard < 1) throw new InferError("unsupported", `no position of a context of ${o.contextLength} can go`);
        const kept = Int32Array.from([...slot.history.subarray(0, keep),
          ...slot.history.subarray(keep + discard, slot.length)]);
        rewindSlot(slot, 0);
        for (let p = 0; p < kept.length; p += model.maxBatch) {
          const n = Math.min(model.maxBatch, kept.length - p);
          model.forward(kept.subarray(p, p + n), n, p, layers);
        }
        slot.history.set(kept);
        slot.length = slot.reach = kept.length;
        shifts++;
      } else if (shiftSlotBy(policy, engine.backend, slot, model.info, o.keep ?? SHIFT_KEEP) === 0) {
        throw new InferError("unsupported", `the ${engine.backend.name} backend cannot shift this ` +
          `model's context of ${o.contextLength} keeping ${o.keep ?? SHIFT_KEEP} positions`);
      } else shifts++;
    }
    const n = Math.min(model.maxBatch, tokens.length - 1 - next, o.contextLength - slot.length);
    const position = slot.length;
    model.forward(tokens.subarray(next, next + n), n, position, layers, {
      onLogits: (firstRow, rows, logits) => {
        for (let r = 0; r < rows; r++) {
          const target = next + firstRow + r + 1; // the token this row's logits predict
          if (target < o.scoreFrom) continue;
          refuseNonFinite(logits.subarray(r * vocab, (r + 1) * vocab), position + firstRow + r);
          const v = -logSoftmax(logits, r * vocab, vocab, tokens[target]);
          nll += v;
          nll2 += v * v;
          count++;
        }
      },
    });
    slot.history.set(tokens.subarray(next, next + n), position);
    slot.length += n;
    slot.reach = Math.max(slot.reach, slot.length);
    next += n;
  }
  const mean = nll / count, ppl = Math.exp(mean);
  const variance = nll2 / count - mean * mean;
  const error = variance > 0 ? Math.sqrt(variance / (count - 1)) * ppl : 0;
  return { perplexity: ppl, error, chunks: 1, scoredTokens: count, textTokens: tokens.length, shifts };
}

export function perplexityCommand(argv: string[]): number {
  const { values, positionals } = parseCommand(argv, {
    options: {
      "ctx-size": { type: "string", short: "c" },
      chunks: { type: "string" },
      "batch-size": { type: "string", short: "b" },
      threads: { type: "string", short: "t" },
      backend: { type: "string" },
      "cache-type-k": { type: "string" },
      "cache-type-v": { type: "string" },
      "context-shift": { type: "boolean" },
      "shift-policy": { type: "string" },
      keep: { type: "string" },
      "score-from": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    positionals: { expected: "<model.gguf> <text-file>", min: 2, max: 2 },
  });
  if (values.help) { process.stdout.write(perplexityUsage); return 0; }
  const contextLength = intOption(values["ctx-size"], "--ctx-size", 512, 3);
  const chunks = values.chunks === undefined ? undefined
    : intOption(values.chunks, "--chunks", 0, 1);
  const batch = intOption(values["batch-size"], "--batch-size", Math.min(contextLength, 512), 1);
  const threads = threadsOption(values.threads), backend = backendOption(values.backend);
  const cacheTypeK = cacheTypeOption(values["cache-type-k"], "--cache-type-k");
  const cacheTypeV = cacheTypeOption(values["cache-type-v"], "--cache-type-v");
  const shift = values["context-shift"] === true;
  const keep = intOption(values.keep, "--keep", SHIFT_KEEP, 0);
  const policy = shiftPolicyOption(values["shift-policy"]);
  if (!shift && values["shift-policy"] !== undefined) {
    throw new InferError("invalid_argument", "--shift-policy goes with --context-shift");
  }
  const scoreFrom = intOption(values["score-from"], "--score-from", Math.floor(contextLength / 2), 1);
  if (!shift && (values.keep !== undefined || values["score-from"] !== undefined)) {
    throw new InferError("invalid_argument", "--keep and --score-from go with --context-shift");
  }
  if (shift && keep >= contextLength - 1) {
    throw new InferError("invalid_argument", `--keep ${keep} leaves nothing of a context of ${contextLength} to drop`);
  }
  const modelPath = resolveModel(positionals[0]);
  let text: string;
  try {
    text = readFileSync(positionals[1], "utf8");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
    throw new InferError("io", `cannot read the text ${quote(positionals[1])} (${code})`);
  }
  const engine = Engine.open({
    modelPath, contextLength, batch: Math.min(contextLength, batch), threads, backend,
    cacheTypeK, cacheTypeV,
  });
  try {
    const t0 = performance.now();
    if (shift) {
      const r = streamingPerplexity(engine, text, { contextLength, scoreFrom, keep, policy });
      process.stderr.write(`one stream of ${r.textTokens} tokens through ${contextLength}, ${r.shifts} ` +
        `shifts, ${r.scoredTokens} scored, ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
      process.stdout.write(`Final estimate: PPL = ${r.perplexity.toFixed(4)} +/- ${r.error.toFixed(5)}\n`);
      return 0;
    }
    const r = perplexity(engine, text, {
      contextLength, chunks,
      onChunk: (c, ppl) => process.stderr.write(`[${c}]${ppl.toFixed(4)},`),
    });
    process.stderr.write(
      `\n${r.chunks} chunks of ${contextLength} tokens (${r.textTokens} in the text), ` +
      `${r.scoredTokens} scored, ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
    process.stdout.write(
      `Final estimate: PPL = ${r.perplexity.toFixed(4)} +/- ${r.error.toFixed(5)}\n`);
  } finally {
    engine.close();
  }
  return 0;
}
