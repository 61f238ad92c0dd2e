// ggml tensor types as stored in GGUF: id, name, and block geometry (values per block, bytes per
// block), from ggml's ggml-common.h. The reader knows every type so that a file with a type we do
// not compute still parses and is rejected later with a precise "unsupported" message.
export interface GgmlTypeInfo {
  readonly id: number;
  readonly name: string;
  readonly blockValues: number;
  readonly blockBytes: number;
}

const table: [number, string, number, number][] = [
  [0, "F32", 1, 4], [1, "F16", 1, 2], [2, "Q4_0", 32, 18], [3, "Q4_1", 32, 20],
  [6, "Q5_0", 32, 22], [7, "Q5_1", 32, 24], [8, "Q8_0", 32, 34], [9, "Q8_1", 32, 36],
  [10, "Q2_K", 256, 84], [11, "Q3_K", 256, 110], [12, "Q4_K", 256, 144], [13, "Q5_K", 256, 176],
  [14, "Q6_K", 256, 210], [15, "Q8_K", 256, 292], [16, "IQ2_XXS", 256, 66], [17, "IQ2_XS", 256, 74],
  [18, "IQ3_XXS", 256, 98], [19, "IQ1_S", 256, 50], [20, "IQ4_NL", 32, 18], [21, "IQ3_S", 256, 110],
  [22, "IQ2_S", 256, 82], [23, "IQ4_XS", 256, 136], [24, "I8", 1, 1], [25, "I16", 1, 2],
  [26, "I32", 1, 4], [27, "I64", 1, 8], [28, "F64", 1, 8], [29, "IQ1_M", 256, 56],
  [30, "BF16", 1, 2], [34, "TQ1_0", 256, 54], [35, "TQ2_0", 256, 66], [39, "MXFP4", 32, 17],
];

export const ggmlTypes: ReadonlyMap<number, GgmlTypeInfo> = new Map(
  table.map(([id, name, blockValues, blockBytes]) => [id, { id, name, blockValues, blockBytes }]),
);

export const GgmlType = {
  F32: 0, F16: 1, Q4_0: 2, Q5_0: 6, Q8_0: 8, Q4_K: 12, Q5_K: 13, Q6_K: 14, Q8_K: 15, BF16: 30, Q4_1: 3,
  MXFP4: 39,
} as const;

export function typeName(id: number): string {
  return ggmlTypes.get(id)?.name ?? `unknown type ${id}`;
}

/** Bytes of a row of `n` values; n must be a multiple of the block size. */
export function rowBytes(type: GgmlTypeInfo, n: number): number {
  return (n / type.blockValues) * type.blockBytes;
}
