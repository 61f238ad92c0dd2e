// Hugging Face folder → GGUF: config.json gives the architecture's plan (ts/convert/
// architectures.ts), the safetensors checkpoint is checked against it (every tensor known, every
// required one present, every shape as the config implies) before a byte is written, and then
// each tensor is read as f32, transformed where the runtime's layout differs, quantized and
// streamed out. Re-quantizing an existing GGUF (`infer quantize`) shares the packing.
import { basename, resolve } from "node:path";
import { InferError, quote } from "../errors.ts";
import { openGguf } from "../gguf/reader.ts";
import { ggmlTypes, typeName } from "../gguf/types.ts";
import { gguf, type GgufTypedValue } from "../gguf/writer.ts";
import { planConversion, type PlannedTensor } from "./architectures.ts";
import { typedMetadata } from "./gguf-metadata.ts";
import { checkOutputPath, writeGgufFile, type TensorToProduce } from "./gguf-out.ts";
import { HfConfig } from "./hf-config.ts";
import type { Progress } from "./progress.ts";
import {
  dequantize, fileType, modelShape, quantize, storageType, type QuantName,
} from "./quantize.ts";
import { SafetensorsCheckpoint } from "./safetensors.ts";
import { tokenizerMetadata } from "./tokenizer.ts";

/** ggml's quantization format version, written by llama.cpp's converter and quantizer. */
const QUANTIZATION_VERSION = 2;

export interface ImportOptions {
  readonly folder: string;
  readonly output: string;
  readonly quant: QuantName;
  readonly name?: string;
  readonly progress?: Progress;
}

export interface WriteSummary {
  readonly architecture: string;
  readonly tensors: number;
  readonly bytes: number;
  /** How many tensors ended up in each type. */
  readonly types: Readonly<Record<string, number>>;
}

export function importHuggingFace(o: ImportOptions): WriteSummary {
  checkOutputPath(o.output);
  const config = HfConfig.read(o.folder);
  const plan = planConversion(config);
  const vocab = config.int("vocab_size");
  const tokenizer = tokenizerMetadata(o.folder, vocab, plan.tokenizer);
  const checkpoint = SafetensorsCheckpoint.open(o.folder);
  try {
    const planned = checkAgainstPlan(checkpoint, plan.tensors, plan.ignored, plan.architecture);
    const metadata: [string, GgufTypedValue][] = [
      ["general.architecture", gguf.str(plan.architecture)],
      ["general.name", gguf.str(o.name ?? basename(resolve(o.folder)))],
      ["general.file_type", gguf.u32(fileType(o.quant))],
      ["general.quantization_version", gguf.u32(QUANTIZATION_VERSION)],
      ...plan.metadata,
      ...tokenizer,
    ];
    const tied = !planned.some((t) => t.name === "output.weight");
    const byKey = new Map(plan.metadata.map(([k, v]) => [k, v.value]));
    const model = modelShape(plan.architecture, (k) => byKey.get(k));
    const tensors: TensorToProduce[] = planned.map((t) => {
      const lmHead = t.name === "output.weight" || (tied && t.name === "token_embd.weight");
      const type = storageType(t.name, t.dims, o.quant, { lmHead, model });
      return {
        name: t.name, type, dims: [...t.dims],
        produce: () => {
          let data = t.stacked ? stack(t.stacked.map((s) => checkpoint.readF32(
            checkpoint.tensors.get(s)!))) : t.source === null ? new Float32Array(0)
            : checkpoint.readF32(checkpoint.tensors.get(t.source)!);
          if (t.transform) data = t.transform(data);
          return quantize(data, type, t.name);
        },
      };
    });
    const bytes = writeGgufFile(o.output, metadata, tensors, { progress: o.progress });
    return { architecture: plan.architecture, tensors: tensors.length, bytes, types: countTypes(
      tensors) };
  } finally {
    checkpoint.close();
  }
}

/** Every checkpoint tensor is used or deliberately dropped; every required one is there,
  in shape. */
function checkAgainstPlan(checkpoint: SafetensorsCheckpoint, tensors: readonly PlannedTensor[],
  ignored: (name: string) => boolean, architecture: string): PlannedTensor[] {
  const bySource = new Set(tensors.flatMap((t) => t.stacked ?? (t.source !== null ? [t.source] : [])));
  for (const name of checkpoint.tensors.keys()) {
    if (!bySource.has(name) && !ignored(name)) {
      throw new InferError("bad_model", `tensor '${name}' is not part of a ${architecture} model ` +
        "(unexpected name: a different architecture, or a config.json that does not match the weights?)");
    }
  }
  const out: PlannedTensor[] = [];
  for (const t of tensors) {
    if (t.stacked) {
      for (const s of t.stacked) {
        checkSource(checkpoint, s, t.name, t.dims.slice(0, -1).reverse(), true);
      }
      out.push(t);
      continue;
    }
    if (t.source === null) { out.push(t); continue; }
    const shape = t.sourceShape ?? [...t.dims].reverse();
    if (checkSource(checkpoint, t.source, t.name, shape, t.required)) out.push(t);
  }
  return out;
}

/** Whether the checkpoint has `source` (refused if required), in PyTorch's `expected` shape. */
function checkSource(checkpoint: SafetensorsCheckpoint, source: string, name: string,
  expected: readonly number[], required: boolean): boolean {
  const found = checkpoint.tensors.get(source);
  if (!found) {
    if (required) throw new InferError("bad_model",
      `tensor '${source}' (for ${name}) is missing from the checkpoint`);
    return false;
  }
  if (found.shape.length !== expected.length || found.shape.some((d, i) => d !== expected[i])) {
    throw new InferError("bad_model", `tensor '${source}' has shape [${found.shape}], ` +
      `config.json implies [${expected}]`);
  }
  return true;
}

/** Experts' matrices one after another: the 3-D tensor's data. */
function stack(parts: readonly Float32Array[]): Float32Array {
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

function countTypes(tensors: readonly TensorToProduce[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const t of tensors) out[typeName(t.type)] = (out[typeName(t.type)] ?? 0) + 1;
  return out;
}

export interface RequantizeOptions {
  readonly input: string;
  readonly output: string;
  readonly quant: QuantName;
  /**
   * Re-pack tensors that are quantized already (llama-quantize's --allow-requantize); without
   * it such a model is refused, since its rounding would be rounded again.
   */
  readonly allowRequantize?: boolean;
  /** Every matrix in `quant`, the LM head too (StorageOptions.pure). */
  readonly pure?: boolean;
  /** Told what is re-quantized when allowRequantize lets it happen. */
  readonly warn?: (message: string) => void;
  readonly progress?: Progress;
}

/** GGUF → GGUF in another type: metadata kept (file type updated), tensors re-packed. */
export function requantizeGguf(o: RequantizeOptions): WriteSummary {
  checkOutputPath(o.output, [o.input]);
  const file = openGguf(o.input);
  try {
    const metadata = typedMetadata(file.bytes, o.input).map(([k, v]): [string, GgufTypedValue] =>
      k === "general.file_type" ? [k, gguf.u32(fileType(o.quant))] : [k, v]);
    if (!file.metadata.has("general.file_type")) metadata.push(["general.file_type", gguf.u32(
      fileType(o.quant))]);
    if (!file.metadata.has("general.quantization_version")) {
      metadata.push(["general.quantization_version", gguf.u32(QUANTIZATION_VERSION)]);
    }
    const tied = !file.tensors.has("output.weight");
    const architecture = String(file.metadata.get("general.architecture") ?? "unknown");
    const model = modelShape(architecture, (k) => file.metadata.get(k));
    const tensors: TensorToProduce[] = [...file.tensors.values()].map((t) => {
      // Vectors, and tensors already in the target type, are copied as they are.
      const lmHead = t.name === "output.weight" || (tied && t.name === "token_embd.weight");
      const wanted = t.dims.length < 2 ? t.type.id : storageType(t.name, t.dims, o.quant, {
        lmHead, model, pure: o.pure });
      return {
        name: t.name, type: wanted, dims: [...t.dims],
        produce: () => {
          const bytes = file.tensorBytes(t);
          if (wanted === t.type.id) return bytes;
          const values = dequantize(bytes, t.type.id, t.elementCount, t.name);
          return quantize(values, wanted, t.name);
        },
      };
    });
    // Dequantizing to F32/F16/BF16 rounds nothing again; only a quantized target does.
    const quantized = (id: number) => ggmlTypes.get(id)!.blockValues > 1;
    checkRequantize(o, [...file.tensors.values()].filter((t, i) =>
      tensors[i].type !== t.type.id && quantized(t.type.id) && quantized(tensors[i].type)));
    const bytes = writeGgufFile(o.output, metadata, tensors, { alignment: file.alignment,
      progress: o.progress });
    return { architecture, tensors: tensors.length, bytes, types: countTypes(tensors) };
  } finally {
    file.close();
  }
}

/** Tensors a quantize would re-pack from a quantized type: refused, or a warning when allowed. */
function checkRequantize(o: RequantizeOptions,
  requantized: readonly { type: { name: string } }[]): void {
  if (requantized.length === 0) return;
  const byType = new Map<string, number>();
  for (const t of requantized) byType.set(t.type.name, (byType.get(t.type.name) ?? 0) + 1);
  const types = [...byType].map(([type, n]) => `${n} in ${type}`).join(", ");
  if (o.allowRequantize) {
    o.warn?.(`re-quantizing ${requantized.length} tensors that are quantized already ` +
      `(${types}) to ${o.quant}: their rounding is rounded again`);
    return;
  }
  throw new InferError("invalid_argument", `${quote(o.input)} is quantized already ` +
    `(${requantized.length} tensors would be re-quantized: ${types}); quantize from the ` +
    "F16/BF16/F32 model, or pass --allow-requantize to accept the loss");
}
