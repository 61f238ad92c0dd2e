// `infer import <hf-folder> -o model.gguf --quant Q8_0`: a Hugging Face folder (config.json,
// safetensors, tokenizer.json) to a GGUF, quantized as it is packed.
import { parseArgs } from "node:util";
import { importHuggingFace } from "../convert/import.ts";
import { stderrProgress } from "../convert/progress.ts";
import { parseQuant, QUANT_NAMES } from "../convert/quantize.ts";

export const importUsage = `usage: infer import <hf-folder> -o model.gguf [--quant TYPE]

Converts a Hugging Face model folder (config.json, *.safetensors, tokenizer.json or a
SentencePiece tokenizer.model) to GGUF.
Architectures: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM.

options:
  -o, --output PATH  the GGUF to write (required)
  --quant TYPE       ${QUANT_NAMES.join(", ")} (default F16); vectors stay F32,
                     a quantized LM head Q6_K; Q4_K_M / Q4_K_S are llama-quantize's mixes
  --name NAME        general.name (default: the folder's name)
  -h, --help         this text
`;

export function importCommand(argv: string[]): number {
  const { values, positionals } = parseArgs({
    args: argv, allowPositionals: true,
    options: {
      output: { type: "string", short: "o" },
      quant: { type: "string" },
      name: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) { process.stdout.write(importUsage); return 0; }
  if (positionals.length !== 1 || !values.output) { process.stderr.write(importUsage); return 2; }
  const quant = parseQuant(values.quant ?? "F16");
  const t0 = performance.now();
  const r = importHuggingFace({
    folder: positionals[0], output: values.output, quant, name: values.name,
    progress: stderrProgress("import"),
  });
  const types = Object.entries(r.types).map(([t, n]) => `${n} ${t}`).join(", ");
  process.stderr.write(
    `wrote ${values.output}: ${r.architecture}, ${r.tensors} tensors (${types}), ` +
    `${(r.bytes / 1e6).toFixed(1)} MB in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
  return 0;
}

