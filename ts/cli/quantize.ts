// `infer quantize in.gguf out.gguf --quant Q4_0`: re-packs a GGUF's matrices in another type.
import { parseArgs } from "node:util";
import { requantizeGguf } from "../convert/import.ts";
import { stderrProgress } from "../convert/progress.ts";
import { parseQuant, QUANT_NAMES } from "../convert/quantize.ts";

export const quantizeUsage = `usage: infer quantize <in.gguf> <out.gguf> --quant TYPE

Re-packs every matrix of a GGUF in TYPE (${QUANT_NAMES.join(", ")}); vectors and metadata are
copied. Tensors get the types llama-quantize gives them (a quantized LM head Q6_K; Q4_K_M and
Q4_K_S raise attn_v / ffn_down of some layers), with the same bytes; rows that do not fill whole
blocks fall back as llama.cpp does (Q4_K -> Q5_0 -> F16, Q6_K -> Q8_0; Q5_K -> Q5_0 where
llama.cpp picks Q5_1).
`;

export function quantizeCommand(argv: string[]): number {
  const { values, positionals } = parseArgs({
    args: argv, allowPositionals: true,
    options: { quant: { type: "string" }, help: { type: "boolean", short: "h" } },
  });
  if (values.help) { process.stdout.write(quantizeUsage); return 0; }
  if (positionals.length !== 2 || !values.quant) { process.stderr.write(quantizeUsage); return 2; }
  const quant = parseQuant(values.quant);
  const t0 = performance.now();
  const r = requantizeGguf({ input: positionals[0], output: positionals[1], quant,
    progress: stderrProgress("quantize") });
  const types = Object.entries(r.types).map(([t, n]) => `${n} ${t}`).join(", ");
  process.stderr.write(`wrote ${positionals[1]}: ${r.tensors} tensors (${types}), ` +
    `${(r.bytes / 1e6).toFixed(1)} MB in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
  return 0;
}
