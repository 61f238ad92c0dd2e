// `bun run bench/kv-share.ts`: the memory of 8 sequences sharing a 1,000-token prompt (issue 47),
// with the prefix cache's blocks copied into every slot (share off, as before) and held by
// reference (ts/backend/cpu-kv-share.ts). Each configuration runs in a child process of its own:
// the scheduler's slots are allocated, the 8 sequences (one prompt, --gen tokens each, greedy) run
// together, and the child reports what they added:
//   - Pss (/proc/self/smaps_rollup): the process's memory, each page shared between k mappings
//     counted 1/k in each, so a page held by 8 slots and the cache counts once;
//   - RSS (VmRSS): counts a shared page once per mapping of it, so it cannot show the sharing;
//   - the private bytes of the slots' full-attention layers (pages present and not shared, from
//     /proc/self/pagemap), the prefix cache's bytes (the prompt, once), and the ring layers'.
// Models: the default (Gemma 3 270M: 3 of its 18 layers are full attention, the other 15 rings of
// 768 cells that are never shared) and a random-weight Qwen3-0.6B shape (28 full layers, 8 KV heads
// of 128: 112 KiB of f16 K and V per token; bench/random-model.ts writes it once).
//   bun run bench/kv-share.ts [--prefix 1000] [--sequences 8] [--gen 16] [--models default,qwen3-0.6b]
import { closeSync, openSync, readFileSync, readSync } from "node:fs";
import { join } from "node:path";
import type { KvLayer } from "../ts/backend/backend.ts";
import type { CpuKvRows } from "../ts/backend/cpu-kv-share.ts";
import { Engine } from "../ts/engine/engine.ts";
import type { Slot } from "../ts/engine/kv-cache.ts";
import { BatchScheduler } from "../ts/engine/scheduler.ts";
import { defaultModelPath } from "../ts/models/cache.ts";
import { ensureRandomModel, findShape } from "./random-model.ts";

function option(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i < 0 ? fallback : process.argv[i + 1];
}
const prefix = Number(option("--prefix", "1000")), sequences = Number(option("--sequences", "8"));
const gen = Number(option("--gen", "16"));
const MiB = 1 << 20;

function kB(text: string, field: string): number {
  return Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(text)![1]) * 1024;
}

function memory(): { pss: number; rss: number } {
  return { pss: kB(readFileSync("/proc/self/smaps_rollup", "utf8"), "Pss"),
    rss: kB(readFileSync("/proc/self/status", "utf8"), "VmRSS") };
}

/** Bytes of pages present and private (not a file's or shared memory's page) in the range. */
function privateBytes(address: number, length: number): number {
  const page = 4096, first = Math.floor(address / page), last = Math.ceil((address + length) / page);
  const entries = new BigUint64Array(last - first), fd = openSync("/proc/self/pagemap", "r");
  try {
    readSync(fd, new Uint8Array(entries.buffer), 0, entries.byteLength, first * 8);
  } finally {
    closeSync(fd);
  }
  let pages = 0;
  for (const e of entries) if ((e >> 63n) & 1n && !((e >> 61n) & 1n)) pages++;
  return pages * page;
}

function layerPrivate(layer: KvLayer): number {
  const l = layer as CpuKvRows;
  return privateBytes(l.k as number, l.cells * l.kRowBytes) + privateBytes(l.v as number, l.cells * l.vRowBytes);
}

function child(modelPath: string, share: boolean): void {
  const text = readFileSync(join(import.meta.dir, "..", "test", "fixtures", "alice-chapter1.txt"), "utf8");
  const engine = Engine.open({ modelPath, contextLength: prefix + gen + 64, batch: 64 });
  const prompt = engine.tokenizer.encode(text, { addSpecial: true, parseSpecial: false }).slice(0, prefix);
  const scheduler = new BatchScheduler(engine, { slots: sequences, prefixCache: { share, bytesMax: 512 * MiB } });
  const slots = (scheduler as unknown as { slots: Slot[] }).slots;
  Bun.gc(true);
  const before = memory();
  let done = 0;
  for (let i = 0; i < sequences; i++) {
    scheduler.submit({ prompt, options: { maxTokens: gen, sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 },
      ignoreEos: true }, onDone: () => done++, onError: (e) => { throw e; } });
  }
  while (scheduler.busy) scheduler.step();
  Bun.gc(true);
  const after = memory(), stats = scheduler.stats();
  let full = 0, ring = 0;
  for (const s of slots) {
    for (const l of s.cache.layers) {
      if (l.ring) ring += (l as CpuKvRows).kBytes.length + (l as CpuKvRows).vBytes.length;
      else full += layerPrivate(l);
    }
  }
  console.log(JSON.stringify({ done, pss: after.pss - before.pss, rss: after.rss - before.rss,
    fullPrivate: full, ring, pool: stats.prefix!.bytes, sharedRows: stats.prefix!.sharedRows }));
  engine.close();
}

const childAt = process.argv.indexOf("--child");
if (childAt >= 0) child(process.argv[childAt + 1], process.argv[childAt + 2] === "share");
else {
  const rows: string[] = [];
  for (const key of option("--models", "default,qwen3-0.6b").split(",")) {
    const path = key === "default" ? defaultModelPath() : ensureRandomModel(findShape(key)!, "Q4_0");
    const label = key === "default" ? "Gemma 3 270M Q4_K_M" : `${findShape(key)!.label} Q4_0 (random)`;
    for (const share of [false, true]) {
      const p = Bun.spawnSync(["bun", import.meta.path, "--prefix", `${prefix}`, "--sequences", `${sequences}`,
        "--gen", `${gen}`, "--child", path, share ? "share" : "copy"], { stderr: "inherit" });
      const line = p.stdout.toString().trim().split("\n").at(-1)!;
      const r = JSON.parse(line);
      const mb = (x: number) => (x / MiB).toFixed(1);
      rows.push(`| ${label} | ${share ? "by reference" : "copied"} | ${r.done} | ${mb(r.pss)} | ${mb(r.rss)} | ` +
        `${mb(r.fullPrivate)} | ${mb(r.pool)} | ${mb(r.ring)} |`);
      console.error(rows.at(-1));
    }
  }
  console.log(`${sequences} sequences, one ${prefix}-token prompt, ${gen} tokens each (MiB added by the run)\n`);
  console.log("| model | prefix blocks | done | Pss | RSS | full layers, private | prefix cache | ring layers |");
  console.log("|---|---|---:|---:|---:|---:|---:|---:|");
  for (const r of rows) console.log(r);
}
