// `infer embed "text"`: the text's embedding (model.embed: the last hidden state pooled and
// L2-normalised, as llama.cpp's llama-embedding computes it), printed as JSON. With --lines each
// line of the text is an input of its own, embedded together in the engine's batches.
import { loadModel } from "../api/model.ts";
import { InferError } from "../errors.ts";
import { parsePooling } from "../model/pooling.ts";
import { ensureModel } from "../models/fetch.ts";
import { parseCommand, textArgument, UsageError } from "./args.ts";
import { loadProgress, verbosityOf } from "./feedback.ts";
import { engineSettings } from "./options.ts";

export const embedUsage = `usage: infer embed "text" [options]
       infer embed -f FILE [options]      ('-', or a text '-': standard input)

Prints a JSON array with one embedding (an array of numbers) per input: the model's last hidden
state, pooled over the input's tokens and L2-normalised, so that the dot product of two is
their cosine similarity. The text is tokenized as a prompt is (BOS added, control-token text
read as those tokens) and must fit the context (-c). One text is one input; with --lines each
non-empty line is one, in order.

options:
  -m, --model PATH|NAME  a GGUF file, or a model in the cache (default: Gemma 3 270M Q4_K_M)
  -f, --file FILE        the text from FILE ('-': standard input)
  --lines                one input per line (empty lines are skipped)
  --pooling P            mean, cls (the first token's vector) or last (the last token's)
                         (default: the GGUF's pooling_type; mean where it has none, as
                         llama-embedding --pooling mean)
  --no-normalize         print the pooled vectors as they are
  -c, --ctx-size N       context length in tokens, the longest input
                         (default: min(4096, the model's))
  -t, --threads N        CPU threads (default: physical cores)
  --backend B            cpu, cuda, metal, or auto (default: auto)
  -q, --quiet            no progress bar while the model loads
  -h, --help             this text
`;

export async function embedCommand(argv: string[]): Promise<number> {
  const { values, positionals } = parseCommand(argv, {
    options: {
      model: { type: "string", short: "m" },
      file: { type: "string", short: "f" },
      lines: { type: "boolean" },
      pooling: { type: "string" },
      "no-normalize": { type: "boolean" },
      "ctx-size": { type: "string", short: "c" },
      threads: { type: "string", short: "t" },
      backend: { type: "string" },
      quiet: { type: "boolean", short: "q" },
      help: { type: "boolean", short: "h" },
    },
    positionals: { expected: "one text", min: 0, max: 1,
      hintWhenTooMany: "quote a text that has spaces: infer embed \"the text\"" },
  });
  if (values.help) { process.stdout.write(embedUsage); return 0; }
  let pooling;
  try {
    pooling = values.pooling === undefined ? undefined : parsePooling(values.pooling, "--pooling");
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const settings = engineSettings(values);
  const text = await textArgument(positionals, values.file, "text");
  const inputs = values.lines ? text.split(/\r?\n/).filter((line) => line.trim() !== "") : [text];
  if (inputs.length === 0 || (inputs.length === 1 && inputs[0] === "")) {
    throw new InferError("invalid_argument", "nothing to embed: the text is empty");
  }
  const modelPath = await ensureModel(values.model);
  const model = await loadModel(modelPath, { ...settings, prefixCacheBytes: 0,
    onProgress: loadProgress(modelPath, verbosityOf(values)) });
  try {
    const vectors = await model.embed(inputs, { pooling,
      normalize: !values["no-normalize"] });
    process.stdout.write(`[${vectors.map((v) => JSON.stringify(Array.from(v))).join(",\n")}]\n`);
    return 0;
  } finally {
    await model.close();
  }
}
