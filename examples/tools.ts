// A tool-calling round: the model calls a function (toolChoice "required" holds its output to a
// call whose arguments follow the schema), the script runs it, sends the result back, and the
// model answers with it.
//   bun examples/tools.ts
import { loadModel, type ToolFunction } from "infer";

const tools: ToolFunction[] = [{
  name: "get_weather",
  description: "The current weather in a city.",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
}];
const weather = (city: string) => JSON.stringify({ city, celsius: 18, sky: "cloudy" });

await using model = await loadModel("gemma-3-270m-q4_k_m");
const chat = model.chat();
const call = await chat.send("What is the weather in Paris?",
  { tools, toolChoice: "required", temperature: 0, maxTokens: 64 });
const results = call.toolCalls.map((c) => {
  const args = JSON.parse(c.arguments) as { city: string };
  console.log(`call: ${c.name}(${c.arguments})`);
  return { id: c.id, content: weather(args.city) };
});
// "none": answer in words now, with the result in the conversation
const answer = await chat.send({ toolResults: results },
  { tools, toolChoice: "none", temperature: 0, maxTokens: 64 });
console.log(`answer: ${answer.text}`);
