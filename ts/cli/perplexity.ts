// `infer perplexity <model> <text-file>`: perplexity as llama.cpp's llama-perplexity computes it,
// so the two figures can be compared: the text is tokenized once (BOS added as the model asks),
// cut into non-overlapping chunks of n_ctx tokens (the first token of each replaced by BOS), and
// only the second half of each chunk is scored, each token under the logits of the position
// before it, so every scored token has at least n_ctx/2 tokens of context.
import { readFileSync } from "node:fs";
import { Engine } from "../engine/engine.ts";
import { refuseNonFinite } from "../engine/generation.ts";
import { InferError, quote } from "../errors.ts";
import { resolveModel } from "../models/cache.ts";
import { parseCommand } from "./args.ts";
import { backendOption, cacheTypeOption, intOption, threadsOption } from "./options.ts";

export const perplexityUsage = `usage: infer perplexity <model.gguf> <text-file> [options]

Scores the text as llama-perplexity does (chunks of n_ctx tokens, second half of each scored).
<model.gguf> is a path or the name of a model in the cache ('infer models').

options:
  -c, --ctx-size N   tokens per chunk (default 512)
  --chunks N         score at most N chunks (default: all)
  -t, --threads N    CPU threads (default: all cores; more than the cores are capped)
  --backend B        cpu, cuda, metal or auto: a GPU when available (default: auto)
  -ctk, --cache-type-k T  KV cache keys: f16, q8_0, q4_0, tq4 or tq3 (default f16)
  -ctv, --cache-type-v T  KV cache values, as -ctk
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

export function perplexityCommand(argv: string[]): number {
  const { values, positionals } = parseCommand(argv, {
    options: {
      "ctx-size": { type: "string", short: "c" },
      chunks: { type: "string" },
      threads: { type: "string", short: "t" },
      backend: { type: "string" },
      "cache-type-k": { type: "string" },
      "cache-type-v": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    positionals: { expected: "<model.gguf> <text-file>", min: 2, max: 2 },
  });
  if (values.help) { process.stdout.write(perplexityUsage); return 0; }
  const contextLength = intOption(values["ctx-size"], "--ctx-size", 512, 3);
  const chunks = values.chunks === undefined ? undefined
    : intOption(values.chunks, "--chunks", 0, 1);
  const threads = threadsOption(values.threads), backend = backendOption(values.backend);
  const cacheTypeK = cacheTypeOption(values["cache-type-k"], "--cache-type-k");
  const cacheTypeV = cacheTypeOption(values["cache-type-v"], "--cache-type-v");
  const modelPath = resolveModel(positionals[0]);
  let text: string;
  try {
    text = readFileSync(positionals[1], "utf8");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
    throw new InferError("io", `cannot read the text ${quote(positionals[1])} (${code})`);
  }
  const engine = Engine.open({
    modelPath, contextLength, batch: Math.min(contextLength, 512), threads, backend,
    cacheTypeK, cacheTypeV,
  });
  try {
    const t0 = performance.now();
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
