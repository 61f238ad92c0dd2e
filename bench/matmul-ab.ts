// Two builds of libinfer in one process, the same prompt matmul alternated between them in blocks:
// on a shared machine whose load moves the wall clock by 2× from run to run, the two libraries
// then see the same moments. Reports each one's minimum and median wall µs per call, its median
// CPU µs per call (process.cpuUsage over each block, the pool's spinning workers included), their
// ratios, and whether both gave the same bits.
//   bun bench/matmul-ab.ts --before LIB --after LIB [--type Q8_0x8] [--threads 2] [--rows 128]
//                          [--n-in 1024] [--tokens 64] [--rounds 15] [--reps 100]
// --type: a GGUF type (Q4_0, Q8_0, Q4_K) or its repacked layout (name + "x8"), as bench/matvec.ts.
// Rows of 16 at a time make one task a tile of the Q8_0 prompt kernel (lib/quant/q8_0_tiles.zig):
// --rows 64 at 1 thread, 128 at 2 threads (4 tasks a thread) are the tasks of 16 threads' prefill.
import { dlopen } from "bun:ffi";
import { loadavg } from "node:os";
import { symbols } from "../ts/native/symbols.gen.ts";

function arg(name: string, fallback?: string): string {
  const i = process.argv.indexOf(name);
  if (i >= 0 && i + 1 < process.argv.length) return process.argv[i + 1];
  if (fallback === undefined) throw new Error(`missing ${name}`);
  return fallback;
}

const typeIds: Record<string, number> = { Q4_0: 2, Q8_0: 8, Q4_K: 12 };
const typeName = arg("--type", "Q8_0x8");
const repacked = typeName.endsWith("x8");
const typeId = typeIds[repacked ? typeName.slice(0, -2) : typeName];
if (typeId === undefined) throw new Error(`unknown type ${typeName}`);
const threads = Number(arg("--threads", "2"));
const nOut = Number(arg("--rows", "128"));
const nIn = Number(arg("--n-in", "1024"));
const tokens = Number(arg("--tokens", "64"));
const rounds = Number(arg("--rounds", "15"));
const reps = Number(arg("--reps", "100"));

const wanted = ["infer_matmul", "infer_repacked_type", "infer_repack", "infer_quantize_row",
  "infer_threads_set", "infer_quant_block_info"] as const;
const sym = Object.fromEntries(wanted.map((name) => [name, symbols[name]])) as Pick<typeof symbols, typeof wanted[number]>;
const builds = (["--before", "--after"] as const).map((flag) => ({ path: arg(flag), lib: dlopen(arg(flag), sym).symbols }));
for (const { lib } of builds) if (lib.infer_threads_set(threads) !== 0) throw new Error("threads_set failed");
const { lib } = builds[0];

const values = new Uint32Array(1), bytes = new Uint32Array(1);
if (lib.infer_quant_block_info(typeId, values, bytes) !== 0) throw new Error("block_info failed");
const rowBytes = (nIn / values[0]) * bytes[0];
let w = new Uint8Array(nOut * rowBytes);
const row = new Float32Array(nIn);
const quantized = new Uint8Array(nIn * 4);
for (let o = 0; o < nOut; o++) {
  for (let i = 0; i < nIn; i++) row[i] = Math.sin(o * 7919 + i * 104729) * 0.05;
  if (lib.infer_quantize_row(typeId, row, nIn, quantized) !== 0) throw new Error("quantize failed");
  w.set(quantized.subarray(0, rowBytes), o * rowBytes);
}
let matmulType = typeId;
if (repacked) {
  matmulType = lib.infer_repacked_type(typeId, nOut);
  if (matmulType === 0) throw new Error(`${typeName}: no repacked layout for ${nOut} rows`);
  const packed = new Uint8Array(w.length);
  if (lib.infer_repack(typeId, w, nOut, nIn, packed) !== 0) throw new Error("repack failed");
  w = packed;
}
const x = new Float32Array(tokens * nIn);
for (let i = 0; i < x.length; i++) x[i] = Math.cos(i * 0.37);
const ys = builds.map(() => new Float32Array(tokens * nOut));
const call = (k: number) => {
  if (builds[k].lib.infer_matmul(w, matmulType, nOut, nIn, x, tokens, ys[k]) !== 0) throw new Error("matmul failed");
};
for (let k = 0; k < builds.length; k++) for (let r = 0; r < 20; r++) call(k); // warm-up

const wallUs: number[][] = builds.map(() => []);
const cpuUs: number[][] = builds.map(() => []);
for (let round = 0; round < rounds; round++) {
  for (let k = 0; k < builds.length; k++) {
    const cpu0 = process.cpuUsage();
    for (let r = 0; r < reps; r++) {
      const t0 = Bun.nanoseconds();
      call(k);
      wallUs[k].push((Bun.nanoseconds() - t0) / 1000);
    }
    const cpu = process.cpuUsage(cpu0);
    cpuUs[k].push((cpu.user + cpu.system) / reps);
  }
}
const median = (a: number[]) => [...a].sort((p, q) => p - q)[a.length >> 1];
const min = (a: number[]) => Math.min(...a);
const sameBits = Buffer.from(ys[0].buffer).equals(Buffer.from(ys[1].buffer));
console.log(`${typeName}, ${nOut} x ${nIn}, ${tokens} tokens, ${threads} thread(s), ${rounds} x ${reps} calls each; ` +
  `same bits: ${sameBits}; load ${loadavg()[0].toFixed(2)}`);
for (const [k, name] of ["before", "after"].entries()) {
  console.log(`  ${name}: min ${min(wallUs[k]).toFixed(1)} µs, median ${median(wallUs[k]).toFixed(1)} µs, ` +
    `CPU ${median(cpuUs[k]).toFixed(1)} µs a call (${builds[k].path})`);
}
console.log(`  after / before: min ${(min(wallUs[1]) / min(wallUs[0])).toFixed(3)}, median ` +
  `${(median(wallUs[1]) / median(wallUs[0])).toFixed(3)}, CPU ${(median(cpuUs[1]) / median(cpuUs[0])).toFixed(3)}`);
if (!sameBits) process.exitCode = 1;
