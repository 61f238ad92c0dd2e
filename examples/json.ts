// JSON output that always parses and follows a schema: the schema becomes a grammar that masks
// every token that could not continue valid output.
//   bun examples/json.ts
import { loadModel } from "infer";

const schema = {
  type: "object",
  properties: {
    city: { type: "string" },
    country: { type: "string" },
    population: { type: "integer" },
    capital: { type: "boolean" },
  },
  required: ["city", "country", "population", "capital"],
};

await using model = await loadModel("gemma-3-270m-q4_k_m");
const r = await model.complete("Facts about Paris as JSON:\n", {
  jsonSchema: schema, maxTokens: 128, temperature: 0,
});
const facts = JSON.parse(r.text) as { city: string; country: string; population: number; capital: boolean };
console.log(JSON.stringify(facts));
