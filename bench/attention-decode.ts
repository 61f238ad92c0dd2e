// Decode attention over an F16 KV cache that streams from memory: one query token, the heads of a
// Qwen3-0.6B shape (16 query heads, 8 KV heads, head_dim 128) over 28 separate layers' caches of
// 1,024 cells (117 MB in all, far past the caches) — what a decode step reads. By default 1,001
// visible keys (~1,000 tokens of context); --keys 16,48,80,144 also the short contexts, each round
// after a 256 MiB pass that pushes the caches' rows out of the CPU caches (as a decode step's
// weights do). Prints the best and median time of the 28 calls, and µs a call.
//   bun bench/attention-decode.ts [--keys 1001] [--rounds 40]   (INFER_LIB=... to time another build)
import { packStruct } from "../ts/native/abi.ts";
import { native } from "../ts/native/lib.ts";
import { arg } from "./logits.ts";
const lib = native();
lib.infer_threads_set(2);
const keysList = arg("--keys", "1001").split(",").map(Number);
const rounds = Number(arg("--rounds", "40"));
const nHead = 16, nKv = 8, d = 128, cells = 1024, layers = 28;
const kvStride = nKv * d;
const ks: Uint16Array[] = [], vs: Uint16Array[] = [];
for (let l = 0; l < layers; l++) {
  const k = new Uint16Array(cells * kvStride), v = new Uint16Array(cells * kvStride);
  for (let i = 0; i < k.length; i++) { k[i] = 0x3000 + ((i + l) * 7919 % 2048); v[i] = 0x3000 + ((i + l) * 104729 % 2048); }
  ks.push(k); vs.push(v);
}
const q = new Float32Array(nHead * d).map((_, i) => Math.sin(i));
const out = new Float32Array(nHead * d);
const flush = new Uint8Array(256 << 20);
for (const keys of keysList) {
  if (!(keys >= 1 && keys <= cells)) throw new Error(`--keys: ${keys} is not in 1..${cells}`);
  const ms: number[] = [];
  for (let r = 0; r < rounds; r++) {
    if (keys < 512) for (let i = 0; i < flush.length; i += 64) flush[i]++;
    const shape = packStruct("AttentionShape", { k_type: 1, v_type: 1, n_tok: 1, n_head: nHead, n_kv_head: nKv, head_dim: d,
      pos0: keys - 1, kv_stride: kvStride, window: 0, ring: 0, scale: 0.088, order: 0 });
    const t0 = performance.now();
    for (let l = 0; l < layers; l++) lib.infer_attention(q, ks[l], vs[l], out, shape);
    ms.push(performance.now() - t0);
  }
  ms.sort((a, b) => a - b);
  const median = ms[Math.floor(rounds / 2)];
  console.log(`decode attention, 28 layers x ${keys} keys (KV ${(2 * layers * keys * kvStride * 2 / 1e6).toFixed(1)} MB): ` +
    `best ${ms[0].toFixed(2)} ms, median ${median.toFixed(2)} ms (${(1000 * median / layers).toFixed(1)} us a call); ` +
    `checksum ${out.reduce((a, b) => a + b, 0).toFixed(4)}`);
}
