// Decode speed on CUDA at long context through each KV cache type (llama-bench's `-p 0 -n N -d D`
// with `-ctk/-ctv T`): one engine a type, its prompt grown to each depth in turn (chunks of 512
// rows), then N greedy tokens by the host loop (each step's logits read, as llama-bench's) timed,
// and the step's graph replayed back to back for its GPU time alone. Prints a line per type and
// depth, then one JSON line each.
//   bun bench/cuda-kv-decode.ts --file model.gguf [--depths 4096,16384,32768] [--types f16,q8_0,q4_0]
//       [--gen 32]
import type { KvType } from "../ts/backend/backend.ts";
import { Engine } from "../ts/engine/engine.ts";
import { arg } from "./logits.ts";
import { replayUs } from "./cuda-replay.ts";

const file = arg("--file", "");
if (file === "") throw new Error("usage: bun bench/cuda-kv-decode.ts --file model.gguf [--depths …] [--types …]");
const depths = arg("--depths", "4096,16384,32768").split(",").map(Number).sort((a, b) => a - b);
const types = arg("--types", "f16,q8_0,q4_0").split(",") as KvType[];
const gen = Number(arg("--gen", "32"));

function argmax(x: Float32Array): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

const rows: string[] = [];
for (const type of types) {
  const engine = Engine.open({ modelPath: file, backend: "cuda", batch: 512, cacheTypeK: type, cacheTypeV: type,
    contextLength: depths[depths.length - 1] + depths.length * (gen + 8) + 64 });
  let length = 0, logits: Float32Array = new Float32Array(0);
  for (const depth of depths) {
    // The prompt grown to `depth` tokens (a text-like cycle of ids), continuing what is cached.
    const more = Array.from({ length: depth - length }, (_, i) => 97 + (((length + i) * 11) % 26));
    const p0 = performance.now();
    logits = engine.evaluate(more);
    const prefillS = (performance.now() - p0) / 1000;
    length = depth;
    for (let i = 0; i < 4; i++, length++) logits = engine.evaluate([argmax(logits)]); // graphs captured
    const t0 = performance.now();
    for (let i = 0; i < gen; i++, length++) logits = engine.evaluate([argmax(logits)]);
    const rate = gen / ((performance.now() - t0) / 1000);
    const stepUs = replayUs(engine, 50);
    const row = { type, depth, decodeTokS: +rate.toFixed(1), stepUs: +stepUs.toFixed(1), growS: +prefillS.toFixed(2) };
    rows.push(JSON.stringify(row));
    console.log(`${type.padEnd(5)} at ${String(depth).padStart(6)} tokens: decode ${rate.toFixed(1)} tok/s ` +
      `(GPU ${stepUs.toFixed(0)} µs a step); growing the prompt to it ${prefillS.toFixed(1)} s`);
  }
  engine.close();
}
for (const r of rows) console.log(r);
