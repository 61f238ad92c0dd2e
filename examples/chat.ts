// A chat loop in the terminal: each line you type is a turn; the model keeps the conversation
// (and its KV cache) between turns. Ctrl-D leaves.
//   bun examples/chat.ts
import { createInterface } from "node:readline";
import { loadModel } from "infer";

await using model = await loadModel("gemma-3-270m-q4_k_m");
const chat = model.chat({ system: "You are a helpful assistant. Answer briefly." });
process.stdout.write("> ");
for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() !== "") {
    for await (const piece of chat.stream(line, { maxTokens: 256 })) process.stdout.write(piece.text);
    process.stdout.write("\n");
  }
  process.stdout.write("> ");
}
process.stdout.write("\n");
