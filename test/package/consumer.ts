// A project's script after `bun add infer`: every call of the library API issue 43 names, against
// the default model, each result checked; test/package.test.ts runs it where the packed tarball is
// installed, and type-checks it there with the package's declarations (tsc --noEmit). Prints one
// JSON line of what it saw; exits 1 at the first check that fails.
import { InferError, loadModel, type Completion } from "infer";

function check(cond: unknown, what: string): asserts cond {
  if (!cond) {
    console.error(`consumer: ${what}`);
    process.exit(1);
  }
}

let progressCalls = 0;
await using model = await loadModel("gemma-3-270m-q4_k_m", {
  backend: "auto", threads: 2, contextLength: 512, onProgress: () => { progressCalls++; },
});

const { architecture, parameters, quantization, contextLength, backend } = model.info;
check(architecture === "gemma3", `info.architecture is ${architecture}`);
check(parameters > 200e6 && parameters < 300e6, `info.parameters is ${parameters}`);
check(quantization === "Q4_K_M", `info.quantization is ${quantization}`);
check(contextLength === 512, `info.contextLength is ${contextLength}`);
check(["cpu", "cuda", "metal"].includes(backend), `info.backend is ${backend}`);

const prompt = "The capital of France is";
const greedy = { maxTokens: 12, temperature: 0 } as const;
const r: Completion = await model.complete(prompt, {
  ...greedy, stop: ["\n\n"], seed: 1, topK: 40, topP: 0.95, minP: 0.05, repeatPenalty: 1,
});
check(r.text.length > 0 && r.tokens.length > 0, "complete gave no text");
check(["stop", "length"].includes(r.finishReason), `finishReason ${r.finishReason}`);
check(r.usage.promptTokens > 0 && r.usage.completionTokens === r.tokens.length, "usage");

let streamed = "";
for await (const piece of model.stream(prompt, greedy)) streamed += piece.text;
const plain = await model.complete(prompt, greedy);
check(streamed === plain.text, `stream ${JSON.stringify(streamed)} != complete ${JSON.stringify(plain.text)}`);

const json = await model.complete("A person as JSON:", {
  maxTokens: 64, temperature: 0,
  jsonSchema: { type: "object", properties: { name: { type: "string" } }, required: ["name"] },
});
check(typeof JSON.parse(json.text).name === "string", `jsonSchema gave ${json.text}`);

// Several calls in flight on one model at once, each as it is alone.
const together = await Promise.all([model.complete(prompt, greedy), model.complete(prompt, greedy)]);
check(together.every((c) => c.text === plain.text), "concurrent completions differ from one alone");

const controller = new AbortController();
let pieces = 0, aborted = false;
try {
  for await (const _ of model.stream(prompt, { maxTokens: 200, temperature: 0, signal: controller.signal })) {
    if (++pieces === 2) controller.abort();
  }
} catch {
  aborted = true;
}
check(aborted && pieces < 10, `abort: ${pieces} pieces, rejected ${aborted}`);

const chat = model.chat({ system: "You answer in one short sentence." });
const reply = await chat.send("Hi", { maxTokens: 24, temperature: 0 });
check(reply.text.length > 0, "chat.send gave no text");
let second = "";
for await (const p of chat.stream("And then?", { maxTokens: 24, temperature: 0 })) second += p.text;
check(second.length > 0, "chat.stream gave no text");

const ids = model.tokenize("Hello, world");
check(ids.length > 0 && ids.every((id) => Number.isInteger(id)), "tokenize");
check(model.detokenize(ids) === "Hello, world", `detokenize gave ${model.detokenize(ids)}`);

const one: Float32Array = await model.embed("Hello, world");
const both: Float32Array[] = await model.embed(["Hello, world", "Quarterly tax filings"],
  { pooling: "mean" });
const same = both[0]!, far = both[1]!;
const dot = (a: Float32Array, b: Float32Array) => a.reduce((sum, v, i) => sum + v * b[i]!, 0);
check(one.length === model.info.embeddingLength && Math.abs(dot(one, one) - 1) < 1e-4,
  `embed gave ${one.length} values of norm² ${dot(one, one)}`);
check(dot(one, same) > 0.9999 && dot(one, far) < dot(one, same), "embed of texts in one call");

let code = "";
try {
  await loadModel("/nonexistent/model.gguf");
} catch (err) {
  check(err instanceof InferError, `a missing file threw ${String(err)}`);
  code = err.code;
}
check(code === "io", `a missing file's code is ${code}`);

const other = await loadModel("gemma-3-270m-q4_k_m", { contextLength: 256 });
await other.close();

console.log(JSON.stringify({
  info: { architecture, parameters, quantization, contextLength, backend }, progressCalls,
  text: r.text, streamed, json: json.text, reply: reply.text, second, ids: ids.length, code,
  embedding: one.length,
}));
