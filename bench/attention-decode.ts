// Decode attention over an F16 KV cache that streams from memory: one query token, the heads of a
// Qwen3-0.6B shape (16 query heads, 8 KV heads, head_dim 128) over 28 separate layers' caches of
// 1,024 cells (117 MB in all, far past the caches), 1,001 visible keys — what a decode step at
// ~1,000 tokens of context reads. Prints the best and median time of the 28 calls.
//   bun bench/attention-decode.ts      (INFER_LIB=... to time another build)
import { native } from "../ts/native/lib.ts";
const lib = native();
lib.infer_threads_set(2);
const nHead = 16, nKv = 8, d = 128, pos0 = 1000, cells = 1024, layers = 28;
const kvStride = nKv * d;
const ks: Uint16Array[] = [], vs: Uint16Array[] = [];
for (let l = 0; l < layers; l++) {
  const k = new Uint16Array(cells * kvStride), v = new Uint16Array(cells * kvStride);
  for (let i = 0; i < k.length; i++) { k[i] = 0x3000 + ((i + l) * 7919 % 2048); v[i] = 0x3000 + ((i + l) * 104729 % 2048); }
  ks.push(k); vs.push(v);
}
const q = new Float32Array(nHead * d).map((_, i) => Math.sin(i));
const out = new Float32Array(nHead * d);
const ms: number[] = [];
for (let r = 0; r < 40; r++) {
  const t0 = performance.now();
  for (let l = 0; l < layers; l++) lib.infer_attention(q, ks[l], vs[l], 1, out, 1, nHead, nKv, d, pos0, kvStride, 0, 0, 0.088);
  ms.push(performance.now() - t0);
}
ms.sort((a, b) => a - b);
console.log(`decode attention, 28 layers x 1001 keys (KV ${(2 * layers * cells * kvStride * 2 / 1e6).toFixed(0)} MB): best ${ms[0].toFixed(2)} ms, median ${ms[20].toFixed(2)} ms; checksum ${out.reduce((a, b) => a + b, 0).toFixed(4)}`);
