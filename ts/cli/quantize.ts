// `infer quantize in.gguf out.gguf --quant Q4_0`: re-packs a GGUF's matrices in another type.
import { requantizeGguf } from "../convert/import.ts";
import { stderrProgress } from "../convert/progress.ts";
import { parseQuant, QUANT_NAMES, type QuantName } from "../convert/quantize.ts";
import { quote } from "../errors.ts";
import { resolveModel } from "../models/cache.ts";
import { parseCommand, requiredOption, UsageError } from "./args.ts";

export const quantizeUsage = `usage: infer quantize <in.gguf> <out.gguf> --quant TYPE

Re-packs every matrix of a GGUF in TYPE (${QUANT_NAMES.join(", ")});
vectors and metadata are copied. <in.gguf> is a path or the name of a model in the cache
('infer models'). Tensors get the types llama-quantize gives them (a quantized LM head Q6_K;
Q4_K_M and Q4_K_S raise attn_v / ffn_down of some layers), with the same bytes; rows that do not
fill whole blocks fall back as llama.cpp does (Q4_K -> Q5_0 -> F16, Q6_K -> Q8_0; Q5_K -> Q5_0
where llama.cpp picks Q5_1). The output is checked before any work: not a folder, not the input.

A model that is quantized already (any tensor that would be re-packed is in a quantized type,
not F32, F16 or BF16) is refused, as llama-quantize refuses it: its rounding would be rounded
again. Quantize from the F16 / BF16 / F32 original instead, or pass --allow-requantize.

options:
  --quant TYPE          the type to re-pack in (required)
  --allow-requantize    re-pack tensors that are quantized already (quality suffers)
  -h, --help            this text
`;

export function quantOption(value: string): QuantName {
  if (!(QUANT_NAMES as readonly string[]).includes(value.toUpperCase())) {
    throw new UsageError(`--quant must be one of ${QUANT_NAMES.join(", ")}, got ` +
      quote(value, 40));
  }
  return parseQuant(value);
}

export function quantizeCommand(argv: string[]): number {
  const { values, positionals } = parseCommand(argv, {
    options: {
      quant: { type: "string" },
      "allow-requantize": { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
    positionals: { expected: "<in.gguf> <out.gguf>", min: 2, max: 2 },
  });
  if (values.help) { process.stdout.write(quantizeUsage); return 0; }
  const quant = quantOption(requiredOption(values.quant, `--quant TYPE (one of ${
    QUANT_NAMES.join(", ")})`));
  const input = resolveModel(positionals[0]), output = positionals[1];
  const t0 = performance.now();
  const r = requantizeGguf({
    input, output, quant, allowRequantize: values["allow-requantize"] ?? false,
    warn: (message) => process.stderr.write(`infer quantize: warning: ${message}\n`),
    progress: stderrProgress("quantize"),
  });
  const types = Object.entries(r.types).map(([t, n]) => `${n} ${t}`).join(", ");
  process.stderr.write(`wrote ${output}: ${r.tensors} tensors (${types}), ` +
    `${(r.bytes / 1e6).toFixed(1)} MB in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
  return 0;
}
