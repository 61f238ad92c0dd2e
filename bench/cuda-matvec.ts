// One-token matvecs on the GPU with a decode step's weights: for each kind of matrix (q, k, v, o,
// gate, up, down, the LM head), the matrices of `--layers` layers (default: all) of a
// random-weight model (bench/random-model.ts) multiplied by one activation row in turn, captured
// as one CUDA graph and replayed; µs a matvec and the weights' bytes a second, as a share of
// HBM_READ_GBS (a read-only pass over an H200's memory, issue 7), and a device-to-device copy's
// traffic (read + written) measured in the same run. A kind's matrices must outgrow L2 (50 MB on
// an H200), as a decode step's do, to be read from HBM: with fewer layers, k and v do not.
//   bun bench/cuda-matvec.ts [--model llama-3.1-8b] [--quant Q4_0] [--layers N] [--times 50]
// Variants by environment, e.g. INFER_CUDA_REPACK=0 (the GGUF layout).
import type { Activation, Weight } from "../ts/backend/backend.ts";
import { CudaBackend } from "../ts/backend/cuda.ts";
import { openGguf } from "../ts/gguf/reader.ts";
import { cudaCaptureEnd } from "../ts/native/cuda.ts";
import { check, native } from "../ts/native/lib.ts";
import { ensureRandomModel, findShape, type RandomQuant } from "./random-model.ts";

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

const shape = findShape(arg("--model", "llama-3.1-8b"));
if (!shape) throw new Error("unknown model");
const quant = arg("--quant", "Q4_0") as RandomQuant;
const layers = Math.min(Number(arg("--layers", String(shape.layers))), shape.layers);
/** GB/s of a read-only pass over an H200's HBM (issue 7's figure). */
const HBM_READ_GBS = 4380;
const times = Number(arg("--times", "50"));
const lib = native();
const file = openGguf(ensureRandomModel(shape, quant));
const backend = CudaBackend.open({ graphs: false });

/** Median µs of `times` replays of `exec`, over 5 rounds. */
function replay(exec: number): number {
  const runs: number[] = [];
  for (let r = 0; r < 6; r++) {
    check(lib.infer_cuda_sync(), "sync");
    const t0 = performance.now();
    for (let i = 0; i < times; i++) check(lib.infer_cuda_graph_launch(exec), "graph launch");
    check(lib.infer_cuda_sync(), "sync");
    if (r > 0) runs.push(((performance.now() - t0) * 1000) / times);
  }
  return runs.sort((a, b) => a - b)[runs.length >> 1];
}

/** Captures `body` (launches on the backend's stream) as a graph. */
function capture(body: () => void): number {
  body(); // eager first: allocations and cached activations settle outside the capture
  check(lib.infer_cuda_sync(), "sync");
  check(lib.infer_cuda_capture_begin(), "capture");
  body();
  return cudaCaptureEnd();
}

// The copy: 1 GiB device to device (GB/s of bytes read and written).
const copyFloats = 1 << 28;
const src = backend.activation("copy src", 1, copyFloats) as Activation & { address: number };
const dst = backend.activation("copy dst", 1, copyFloats) as Activation & { address: number };
const copyExec = capture(() => check(lib.infer_cuda_copy(dst.address, src.address, copyFloats * 4), "copy"));
const copyGBs = (2 * copyFloats * 4) / (replay(copyExec) / 1e6) / 1e9;

const kinds = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];
const rows: string[] = [];
const measure = (label: string, names: string[]) => {
  const infos = names.map((n) => file.tensors.get(n)).filter((t) => t !== undefined);
  if (infos.length === 0) return;
  const weights: Weight[] = infos.map((t) => backend.weight(file, t));
  const [nIn, nOut] = infos[0].dims;
  const x = backend.activation(`x ${label}`, 1, nIn);
  backend.write(x, Float32Array.from({ length: nIn }, (_, i) => Math.sin(i * 0.37)));
  const y = backend.activation(`y ${label}`, 1, nOut);
  const exec = capture(() => { for (const w of weights) backend.matmul(w, x, 1, y); });
  const us = replay(exec) / weights.length;
  const bytes = infos[0].byteLength;
  const gbs = bytes / (us / 1e6) / 1e9;
  rows.push(`| ${label} | ${nOut} × ${nIn} | ${infos[0].type.name} | ${(bytes / 1e6).toFixed(1)} | ${weights.length} | ` +
    `${us.toFixed(2)} | ${gbs.toFixed(0)} | ${((100 * gbs) / HBM_READ_GBS).toFixed(0)}% |`);
};
for (const kind of kinds) measure(kind, Array.from({ length: layers }, (_, l) => `blk.${l}.${kind}.weight`));
measure("LM head", [file.tensors.has("output.weight") ? "output.weight" : "token_embd.weight"]);

console.log(`${shape.label} ${quant}: one-token matvecs, ${layers} layers' matrices of a kind in one graph, ` +
  `replayed ${times}x (median of 5); a device-to-device copy moves ${copyGBs.toFixed(0)} GB/s (read + written)`);
console.log(`| matrix | rows × cols | type | MB | in the graph | µs a matvec | GB/s | % of ${HBM_READ_GBS} GB/s |\n` +
  "|---|---|---|---:|---:|---:|---:|---:|");
for (const r of rows) console.log(r);
backend.dispose();
file.close();
