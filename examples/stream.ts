// Streams a completion to the terminal as it is decoded.
//   bun examples/stream.ts "The capital of France is"
import { loadModel } from "infer";

const prompt = process.argv[2] ?? "The capital of France is";
await using model = await loadModel("gemma-3-270m-q4_k_m");
const stream = model.stream(prompt, { maxTokens: 64, temperature: 0 });
for await (const piece of stream) process.stdout.write(piece.text);
const { usage, timings } = await stream.result;
console.error(`\n${usage.completionTokens} tokens, ${timings.tokensPerSecond.toFixed(1)} tok/s`);
