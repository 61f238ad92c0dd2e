// `infer pull`: a model from the Hugging Face Hub into the cache (ts/models/hub.ts), as
// `ollama pull` and `llama-cli -hf` do; what is cached already is checked against the Hub and
// not fetched again. The cached file's path goes to stdout, progress and notes to stderr.
import { relative } from "node:path";
import { modelsDir } from "../models/cache.ts";
import { pullModel } from "../models/hub.ts";
import { parseHubRef } from "../models/hub-ref.ts";
import { parseCommand, UsageError } from "./args.ts";
import { quote } from "../errors.ts";

export const pullUsage = `usage: infer pull org/repo[:QUANT] | org/repo/path/file.gguf

Fetches a GGUF from the Hugging Face Hub into ${"$"}INFER_CACHE/models/<org>/<repo>/ (default
~/.cache/infer/models) and prints its path. :QUANT picks the repo's file of that quantization
(Q4_K_M, Q8_0, ... as in the file names, any case); without it Q4_K_M is taken if the repo has
it (then Q4_0, Q8_0, else the first GGUF), and the choice is said. A split model
(-00001-of-0000N.gguf) comes whole. An interrupted download resumes where it stopped; each file
is checked against the SHA-256 the Hub publishes before it lands in the cache.

Then -m org/repo:QUANT (run, chat, serve, tokenize, loadModel) uses the cached file without the
network, and pulls it first where it is not cached. 'infer models' lists the cache; 'infer
models rm NAME' removes a model.

environment:
  HF_TOKEN     an access token, for gated and private repositories
  HF_ENDPOINT  the Hub's address (default https://huggingface.co; a mirror)

options:
  --revision R  a branch, tag or commit of the repo (default main)
  -h, --help    this text

examples:
  infer pull bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M
  infer chat -m bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M
`;

export async function pullCommand(argv: string[]): Promise<number> {
  const { values, positionals } = parseCommand(argv, {
    options: { revision: { type: "string" }, help: { type: "boolean", short: "h" } },
    positionals: { expected: "one model (org/repo[:QUANT])", min: 0, max: 1 },
  });
  if (values.help) { process.stdout.write(pullUsage); return 0; }
  if (positionals.length === 0) throw new UsageError("give the model to pull: org/repo[:QUANT]");
  const ref = parseHubRef(positionals[0]);
  if (ref === null) {
    throw new UsageError(`${quote(positionals[0], 80)} is not a Hub model: give org/repo, ` +
      "org/repo:QUANT or org/repo/path/file.gguf");
  }
  const path = await pullModel(ref, { revision: values.revision });
  process.stderr.write(`pulled ${relative(modelsDir(), path)}\n`);
  process.stdout.write(`${path}\n`);
  return 0;
}
