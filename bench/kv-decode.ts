// Decode attention at long context through each KV cache type: one query token over `--keys`
// cached positions, the default model's global-attention shape (Gemma 3 270M: 4 query heads,
// 1 KV head, head_dim 256; its 3 full-attention layers, each its own cache, are the ones that
// read the whole context; the 15 sliding-window layers read 512 keys whatever the context).
// Types are timed in turn within each round, so a busy machine slows them alike. Prints the
// median wall time of one decode step's global-layer attention, the median CPU time it took (both
// threads; on a shared machine the steadier figure), the cache bytes it reads, and the speed
// against the first type by each.
// Every type but f16 splits a decode step's keys over the threads (lib/cpu/attention_kv.zig);
// f16 keeps llama.cpp's orders of sums and splits scores, softmaxes and output dimensions instead
// (lib/cpu/attention_f16_split.zig); --threads 1 compares the kernels alone.
//   bun bench/kv-decode.ts [--keys 4096,16384,32768] [--types f16,q8_0,q4_0,tq4,tq3] [--rounds 15]
//                          [--threads 2]
import { kvBytes, type KvType } from "../ts/backend/backend.ts";
import { packStruct } from "../ts/native/abi.ts";
import { native } from "../ts/native/lib.ts";
import { arg } from "./logits.ts";

const lib = native();
lib.infer_threads_set(Number(arg("--threads", "2")));
const keysList = arg("--keys", "4096,16384,32768").split(",").map(Number);
const types = arg("--types", "f16,q8_0,q4_0,tq4,tq3").split(",") as KvType[];
const rounds = Number(arg("--rounds", "15"));
const nHead = 4, nKv = 1, d = 256, layers = 3;
const typeIds: Record<KvType, number> = { f32: 0, f16: 1, q4_0: 2, q8_0: 8, tq3: 103, tq4: 104 };
const q = new Float32Array(nHead * d).map((_, i) => Math.sin(i));
const out = new Float32Array(nHead * d);

for (const keys of keysList) {
  // Gaussian-ish keys and values (the sum of three uniforms), one source for every layer.
  const src = new Float32Array(keys * nKv * d).map(() => Math.random() + Math.random() + Math.random() - 1.5);
  const caches = new Map<KvType, { k: Uint8Array[]; v: Uint8Array[] }>();
  for (const t of types) {
    const bytes = kvBytes(t, src.length, d), k: Uint8Array[] = [], v: Uint8Array[] = [];
    for (let l = 0; l < layers; l++) {
      k.push(new Uint8Array(bytes));
      v.push(new Uint8Array(bytes));
      lib.infer_kv_store(src, k[l], typeIds[t], src.length, d, null, 0);
      lib.infer_kv_store(src, v[l], typeIds[t], src.length, d, null, 0);
    }
    caches.set(t, { k, v });
  }
  const ms = new Map<KvType, number[]>(types.map((t) => [t, []]));
  const cpu = new Map<KvType, number[]>(types.map((t) => [t, []]));
  for (let r = 0; r < rounds; r++) {
    for (const t of types) {
      const c = caches.get(t)!;
      const shape = packStruct("AttentionShape", { k_type: typeIds[t], v_type: typeIds[t], n_tok: 1, n_head: nHead,
        n_kv_head: nKv, head_dim: d, pos0: keys - 1, kv_stride: nKv * d, window: 0, ring: 0, scale: 1 / 16 });
      const t0 = performance.now(), c0 = process.cpuUsage();
      for (let l = 0; l < layers; l++) lib.infer_attention(q, c.k[l], c.v[l], out, shape);
      ms.get(t)!.push(performance.now() - t0);
      const used = process.cpuUsage(c0);
      cpu.get(t)!.push((used.user + used.system) / 1000);
    }
  }
  const median = (xs: number[]) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const base = median(ms.get(types[0])!), baseCpu = median(cpu.get(types[0])!);
  for (const t of types) {
    const m = median(ms.get(t)!), c = median(cpu.get(t)!);
    const mb = (2 * layers * kvBytes(t, src.length, d)) / 1e6;
    console.log(`${keys} keys, ${t}: ${m.toFixed(2)} ms (${(base / m).toFixed(2)}x ${types[0]}), ` +
      `CPU ${c.toFixed(2)} ms (${(baseCpu / c).toFixed(2)}x); ${mb.toFixed(1)} MB of K and V`);
  }
}
