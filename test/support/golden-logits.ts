// Prints, as one JSON line, whether the default model's logits equal llama.cpp's (the golden
// fixture's token_by_token variant) on the fixture's short prompts, with the library variant that
// ts/native/cpu.ts picked (or INFER_CPU forced). Used by test/cpu-variants.test.ts.
import { join } from "node:path";
import { defaultModelPath } from "../../ts/models/cache.ts";
import { Engine } from "../../ts/engine/engine.ts";
import { libraryPath } from "../../ts/native/lib.ts";

const fixture = await Bun.file(join(import.meta.dir, "..", "fixtures", "gemma3-golden.json")).json();
const engine = Engine.open({ modelPath: defaultModelPath(), contextLength: 512 });
const mismatches: string[] = [];
for (const c of fixture.cases.filter((x: { n_prompt: number }) => x.n_prompt <= 40)) {
  engine.reset();
  const logits = engine.evaluate(c.prompt_tokens);
  for (const [id, l] of c.token_by_token.top_logits) {
    if (logits[id] !== Math.fround(l)) { mismatches.push(`${c.name}: token ${id}`); break; }
  }
}
console.log(JSON.stringify({ library: libraryPath(), mismatches }));
