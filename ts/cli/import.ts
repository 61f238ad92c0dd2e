// `infer import <hf-folder> -o model.gguf --quant Q8_0`: a Hugging Face folder (config.json,
// safetensors, tokenizer.json) to a GGUF, quantized as it is packed.
import { importHuggingFace } from "../convert/import.ts";
import { stderrProgress } from "../convert/progress.ts";
import { QUANT_NAMES } from "../convert/quantize.ts";
import { parseCommand, requiredOption } from "./args.ts";
import { quantOption } from "./quantize.ts";

export const importUsage = `usage: infer import <hf-folder> -o model.gguf [--quant TYPE]

Converts a Hugging Face model folder (config.json, *.safetensors, tokenizer.json or a
SentencePiece tokenizer.model) to GGUF.
Architectures: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM.
A config whose arithmetic the GGUF runtimes would not reproduce is refused by name rather than
converted wrongly: sliding-window attention outside Gemma 3 (Qwen 2/3 use_sliding_window with
layers at or past max_window_layers, Mistral's sliding_window), RoPE scaling other than linear
and llama3, partial rotary embeddings, activations other than SiLU (GELU-tanh for Gemma 3),
attention or MLP biases the architecture does not have, logit soft-capping, and checkpoints
quantized by another tool (quantization_config).

options:
  -o, --output PATH  the GGUF to write (required; checked before any work: not a folder, not
                     an existing non-file, in a folder that exists)
  --quant TYPE       ${QUANT_NAMES.join(", ")} (default F16); vectors stay F32,
                     a quantized LM head Q6_K; Q4_K_M / Q4_K_S are llama-quantize's mixes
  --name NAME        general.name (default: the folder's name)
  -h, --help         this text
`;

export function importCommand(argv: string[]): number {
  const { values, positionals } = parseCommand(argv, {
    options: {
      output: { type: "string", short: "o" },
      quant: { type: "string" },
      name: { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    positionals: { expected: "<hf-folder>", min: 1, max: 1 },
  });
  if (values.help) { process.stdout.write(importUsage); return 0; }
  const output = requiredOption(values.output, "-o, --output PATH (the GGUF to write)");
  const quant = quantOption(values.quant ?? "F16");
  const t0 = performance.now();
  const r = importHuggingFace({
    folder: positionals[0], output, quant, name: values.name,
    progress: stderrProgress("import"),
  });
  const types = Object.entries(r.types).map(([t, n]) => `${n} ${t}`).join(", ");
  process.stderr.write(
    `wrote ${output}: ${r.architecture}, ${r.tensors} tensors (${types}), ` +
    `${(r.bytes / 1e6).toFixed(1)} MB in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
  return 0;
}
