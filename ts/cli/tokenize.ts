// `infer tokenize "text"`: the token ids of a text and what each stands for, as the prompt of
// `infer "text"` is tokenized (BOS added, control-token text read as those tokens) unless told
// otherwise. Only the GGUF's metadata is read: no weights are loaded.
import { openGguf } from "../gguf/reader.ts";
import { ensureModel } from "../models/fetch.ts";
import { tokenizerFromMetadata } from "../tokenizer/index.ts";
import { parseCommand, textArgument } from "./args.ts";

export const tokenizeUsage = `usage: infer tokenize "text" [options]
       infer tokenize -f FILE [options]      ('-': standard input)

Prints one line per token: its id and its text, JSON-quoted (a control token's name, a byte
token's byte). As a prompt is tokenized: BOS is added, and control-token text such as
<start_of_turn> becomes the control token.

options:
  -m, --model PATH|NAME  a GGUF file, a model in the cache, or org/repo[:QUANT] on the Hub
                         (default: Gemma 3 270M Q4_K_M)
  -f, --file FILE        the text from FILE ('-': standard input)
  --ids                  only the ids, as one JSON array
  --no-bos               add no BOS (nor EOS)
  --no-parse-special     read control-token text as plain text
  -h, --help             this text
`;

export async function tokenizeCommand(argv: string[]): Promise<number> {
  const { values, positionals } = parseCommand(argv, {
    options: {
      model: { type: "string", short: "m" },
      file: { type: "string", short: "f" },
      ids: { type: "boolean" },
      "no-bos": { type: "boolean" },
      "no-parse-special": { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
    positionals: { expected: "one text", min: 0, max: 1,
      hintWhenTooMany: "quote a text that has spaces: infer tokenize \"the text\"" },
  });
  if (values.help) { process.stdout.write(tokenizeUsage); return 0; }
  const text = await textArgument(positionals, values.file, "text");
  const file = openGguf(await ensureModel(values.model));
  try {
    const tokenizer = tokenizerFromMetadata(file.metadata);
    const ids = tokenizer.encode(text, { addSpecial: !values["no-bos"],
      parseSpecial: !values["no-parse-special"] });
    if (values.ids) {
      process.stdout.write(JSON.stringify(ids) + "\n");
      return 0;
    }
    const decoder = new TextDecoder();
    for (const id of ids) {
      const bytes = tokenizer.tokenBytes(id);
      const piece = bytes.length > 0 ? decoder.decode(bytes) : tokenizer.tokenText(id);
      process.stdout.write(`${id}\t${JSON.stringify(piece)}\n`);
    }
    return 0;
  } finally {
    file.close();
  }
}
