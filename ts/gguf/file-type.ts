// A GGUF's quantization by llama.cpp's name (Q4_K_M, F16, ...): general.file_type, the
// enum llama_ftype, or else the type most of the file's weights are stored in.
import type { GgufFile } from "./reader.ts";

/** llama.cpp's enum llama_ftype, as general.file_type stores it. */
const FILE_TYPES: Record<number, string> = {
  0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
  11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
  18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
  25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
  32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
};

export function fileTypeName(fileType: number): string {
  return FILE_TYPES[fileType] ?? `file type ${fileType}`;
}

/** The file's quantization: general.file_type, or else the type most of its weights are in. */
export function quantOf(file: GgufFile): string {
  const fileType = file.metadata.get("general.file_type");
  if (typeof fileType === "number") return fileTypeName(fileType);
  return majorityType(file.tensors.values());
}

function majorityType(tensors: Iterable<{ type: { name: string }; dims: readonly number[] }>,
): string {
  const count = new Map<string, number>();
  for (const t of tensors) {
    const n = t.dims.reduce((a, b) => a * b, 1);
    count.set(t.type.name, (count.get(t.type.name) ?? 0) + n);
  }
  return [...count.entries()].sort((a, b) => b[1] - a[1])[0]?.[0] ?? "?";
}

/** The weights' elements, all tensors together (the model's parameter count). */
export function parameterCount(file: GgufFile): number {
  let n = 0;
  for (const t of file.tensors.values()) n += t.dims.reduce((a, b) => a * b, 1);
  return n;
}
