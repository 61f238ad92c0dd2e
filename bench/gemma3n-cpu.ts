// Gemma 3n's prompt and decode speed on the CPU, on random-weight gemma3n GGUFs with the shapes
// llama.cpp's graph fixes (test/support/random-gemma3n-gguf.ts): the K-quants file that
// arch-llama-golden.test.ts compares with llama.cpp (256 wide, 30 layers) and a wider one
// (512 wide, 2048-wide FFN), where the AltUp, laurel and sparsity ops' share is smaller.
//   bun bench/gemma3n-cpu.ts [--threads 2] [--prompt 128] [--decode 32] [--runs 3]
// Prints tokens per second, the best of the runs, by the wall clock and by the process's CPU time
// (user + system: on a shared machine the steadier figure with --threads 1); results/cpu.md
// keeps the figures.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Engine } from "../ts/engine/engine.ts";
import { argmax } from "../ts/sample/sampler.ts";
import {
  gemma3nKQuants, randomGemma3nGguf, type RandomGemma3nSpec,
} from "../test/support/random-gemma3n-gguf.ts";

const { values } = parseArgs({ options: {
  threads: { type: "string", default: "2" }, prompt: { type: "string", default: "128" },
  decode: { type: "string", default: "32" }, runs: { type: "string", default: "3" },
} });
const threads = Number(values.threads), promptTokens = Number(values.prompt);
const decodeTokens = Number(values.decode), runs = Number(values.runs);

const wide: RandomGemma3nSpec = { ...gemma3nKQuants, embedding: 512, feedForward: 2048, heads: 4 };
const dir = mkdtempSync(join(tmpdir(), "infer-gemma3n-bench-"));
try {
  const files = [["256 wide, 30 layers", gemma3nKQuants], ["512 wide, FFN 2048", wide]] as const;
  for (const [name, spec] of files) {
    const path = join(dir, "model.gguf");
    writeFileSync(path, randomGemma3nGguf(spec));
    const prompt = Array.from({ length: promptTokens }, (_, i) => 6 + ((i * 37) % 256));
    let prefill = Infinity, decode = Infinity, prefillCpu = Infinity, decodeCpu = Infinity;
    const cpuMs = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };
    for (let r = 0; r < runs; r++) {
      const engine = Engine.open({ modelPath: path, contextLength: promptTokens + decodeTokens + 8,
        batch: promptTokens, kvType: "f16", threads });
      try {
        let t = performance.now(), c = cpuMs();
        let logits = engine.evaluate(prompt);
        prefill = Math.min(prefill, performance.now() - t);
        prefillCpu = Math.min(prefillCpu, cpuMs() - c);
        t = performance.now();
        c = cpuMs();
        for (let i = 0; i < decodeTokens; i++) logits = engine.evaluate([argmax(logits)]);
        decode = Math.min(decode, performance.now() - t);
        decodeCpu = Math.min(decodeCpu, cpuMs() - c);
      } finally {
        engine.close();
      }
    }
    const rate = (tokens: number, ms: number) => (tokens / ms * 1000).toFixed(1);
    console.log(`${name} (${threads} threads): prompt ${rate(promptTokens, prefill)} tok/s ` +
      `(CPU time: ${rate(promptTokens, prefillCpu)}), decode ${rate(decodeTokens, decode)} tok/s ` +
      `(CPU time: ${rate(decodeTokens, decodeCpu)})`);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
