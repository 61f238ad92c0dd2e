// Kernel micro-benchmark: single-token matvec (y = W x, one activation row) over weight matrices
// far larger than the caches, in every weight type decode streams; GB/s of weight bytes read,
// against the machine's measured read bandwidth (bench/bandwidth.ts) in the same run.
//   bun bench/matvec.ts [--threads N] [--mib 256] [--reps 20] [--types Q4_0,Q8_0]
//                       [--tokens 1]   (tokens > 1: the batched path, GB/s of weights per pass)
//                       [--n-in 4096]  (row width: 1024 or 3072 give a prefill's task tiles)
//                       [--when-fast 45 [--max-wait 600]]  (each type's passes only once a probe
//                       finds the read bandwidth at 45 GB/s or more, within max-wait seconds)
// The machine's bandwidth switches between states (~32 and ~50 GB/s on the AMD EPYC VMs) within
// seconds to minutes; with --when-fast each row also shows the bandwidth probed just before and
// after its passes, and its % is against the probe before.
// Prints a Markdown table. Best-of-reps is reported beside the median: on a shared machine the
// best pass is the one least disturbed by other processes. CPU ms is the process's CPU time per
// call (process.cpuUsage over the reps, the pool's spinning workers included), which a shared
// machine's waits do not inflate.
import { availableParallelism } from "node:os";
import { native } from "../ts/native/lib.ts";
import { measureBandwidth } from "./bandwidth.ts";

const typeIds: Record<string, number> = {
  F16: 1, BF16: 30, Q4_0: 2, Q5_0: 6, Q8_0: 8, Q4_K: 12, Q5_K: 13, Q6_K: 14, MXFP4: 39,
};

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

const threads = Number(arg("--threads", String(availableParallelism())));
const mib = Number(arg("--mib", "256"));
const reps = Number(arg("--reps", "20"));
const tokens = Number(arg("--tokens", "1"));
// A name with "x8" measures the repacked layout matmuls use (lib/quant/q4_0_x8.zig).
const types = arg("--types", "Q4_0x8,Q4_0,Q8_0,Q4_K,Q5_K,Q6_K,F16,BF16").split(",");
const nIn = Number(arg("--n-in", "4096"));
const whenFast = process.argv.includes("--when-fast") ? Number(arg("--when-fast", "45")) : null;
const maxWaitMs = Number(arg("--max-wait", "600")) * 1000;

/** A short probe of the read bandwidth (256 MiB, 3 passes, best GB/s). */
function probe(): number {
  return measureBandwidth(threads, 256, 3).bestGBs;
}

/** Probes until the bandwidth reaches whenFast GB/s or maxWaitMs passes; the last probe. */
function waitFast(): number {
  const t0 = performance.now();
  let gbs = probe();
  while (whenFast !== null && gbs < whenFast && performance.now() - t0 < maxWaitMs) {
    Bun.sleepSync(2000);
    gbs = probe();
  }
  return gbs;
}

const lib = native();
if (lib.infer_threads_set(threads) !== 0) throw new Error("threads_set failed");

function rowBytesOf(typeId: number): number {
  const values = new Uint32Array(1);
  const bytes = new Uint32Array(1);
  if (lib.infer_quant_block_info(typeId, values, bytes) !== 0) throw new Error(`block_info ${typeId} failed`);
  return (nIn / values[0]) * bytes[0];
}

/** n_out rows of random weights in `type`, made by quantizing random rows (reused in a cycle). */
function randomWeights(typeId: number, nOut: number): Uint8Array {
  const row = new Float32Array(nIn);
  const scratchRows = 64;
  let rowBytes: number;
  const samples: Uint8Array[] = [];
  for (let r = 0; r < scratchRows; r++) {
    for (let i = 0; i < nIn; i++) row[i] = Math.sin(r * 7919 + i * 104729) * 0.05;
    const probe = new Uint8Array(nIn * 4);
    if (lib.infer_quantize_row(typeId, row, nIn, probe) !== 0) throw new Error(`quantize ${typeId} failed`);
    samples.push(probe);
  }
  rowBytes = rowBytesOf(typeId);
  const w = new Uint8Array(nOut * rowBytes);
  for (let o = 0; o < nOut; o++) w.set(samples[o % scratchRows].subarray(0, rowBytes), o * rowBytes);
  return w;
}

const bandwidth = measureBandwidth(threads);
const lines: string[] = [];
lines.push(`threads ${threads}, ${tokens} token(s) per call, W ${mib} MiB of ${nIn}-wide rows, ${reps} reps; ` +
  `read bandwidth ${bandwidth.bestGBs.toFixed(1)} GB/s best (median ${bandwidth.medianGBs.toFixed(1)})`);
lines.push("");
lines.push("| type | rows | best GB/s | median GB/s | best % of bandwidth | median ms | median GMAC/s | CPU ms |" +
  (whenFast === null ? "" : " probe before / after GB/s |"));
lines.push("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (whenFast === null ? "" : " ---: |"));
for (const name of types) {
  const repacked = name.endsWith("x8");
  const typeId = typeIds[repacked ? name.slice(0, -2) : name];
  if (typeId === undefined) throw new Error(`unknown type ${name}`);
  const rowBytes = rowBytesOf(typeId);
  const nOut = Math.floor((mib * 1024 * 1024) / rowBytes / 64) * 64;
  let w = randomWeights(typeId, nOut);
  let matmulType = typeId;
  if (repacked) {
    matmulType = lib.infer_repacked_type(typeId, nOut);
    if (matmulType === 0) throw new Error(`${name}: no repacked layout`);
    const packed = new Uint8Array(w.length);
    if (lib.infer_repack(typeId, w, nOut, nIn, packed) !== 0) throw new Error("repack failed");
    w = packed;
  }
  const x = new Float32Array(tokens * nIn);
  for (let i = 0; i < x.length; i++) x[i] = Math.cos(i * 0.37);
  const y = new Float32Array(tokens * nOut);
  lib.infer_matmul(w, matmulType, nOut, nIn, x, tokens, y); // warm-up: faults the pages in
  const before = whenFast === null ? null : waitFast();
  const ms: number[] = [];
  const cpu0 = process.cpuUsage();
  for (let r = 0; r < reps; r++) {
    const t0 = performance.now();
    if (lib.infer_matmul(w, matmulType, nOut, nIn, x, tokens, y) !== 0) throw new Error("matmul failed");
    ms.push(performance.now() - t0);
  }
  const cpu = process.cpuUsage(cpu0);
  const after = before === null ? null : probe();
  ms.sort((a, b) => a - b);
  const gbs = (t: number) => w.length / (t / 1000) / 1e9;
  const best = gbs(ms[0]);
  lines.push(`| ${name} | ${nOut} | ${best.toFixed(1)} | ${gbs(ms[ms.length >> 1]).toFixed(1)} | ` +
    `${((100 * best) / (before ?? bandwidth.bestGBs)).toFixed(0)}% | ${ms[ms.length >> 1].toFixed(2)} | ` +
    `${((nOut * nIn * tokens) / (ms[ms.length >> 1] / 1000) / 1e9).toFixed(1)} | ` +
    `${((cpu.user + cpu.system) / 1000 / reps).toFixed(2)} |` +
    (before === null ? "" : ` ${before.toFixed(1)} / ${after!.toFixed(1)} |`));
}
console.log(lines.join("\n"));
