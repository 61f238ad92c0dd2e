// A chat loop in the terminal: each line you type is a turn; the model keeps the conversation
// (and its KV cache) between turns. Ctrl-D leaves.
//   bun examples/chat.ts
import { createInterface } from "node:readline/promises";
import { loadModel } from "infer";

await using model = await loadModel("gemma-3-270m-q4_k_m");
const chat = model.chat({ system: "You are a helpful assistant. Answer briefly." });
const rl = createInterface({ input: process.stdin, output: process.stdout });
for (;;) {
  const line = await rl.question("> ").catch(() => null); // null: Ctrl-D
  if (line === null) break;
  if (line.trim() === "") continue;
  for await (const piece of chat.stream(line, { maxTokens: 256 })) process.stdout.write(piece.text);
  process.stdout.write("\n");
}
rl.close();
