// Method: drive `infer chat` through a real terminal: tmux runs it in a pseudo-terminal (on a
// private tmux server), send-keys types as a user would (Enter, Ctrl-C, Ctrl-D) and capture-pane
// reads the screen. The model is a small random Gemma 3 (test/support/tiny-gguf.ts) whose
// end-of-turn tokens are banned by --logit-bias, so an answer runs until Ctrl-C stops it.
// Needs tmux (npm test installs it); without it the test is skipped, saying so.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const tmux = Bun.which("tmux");
if (!tmux) console.warn("chat-tty.test.ts: skipped, tmux is not installed (npm test installs it: apt-get install tmux)");

const root = join(import.meta.dir, "..");
const dir = mkdtempSync(join(tmpdir(), "infer-chat-tty-"));
const socket = `infer-test-${process.pid}`;

function tm(...args: string[]): string {
  const p = Bun.spawnSync([tmux!, "-L", socket, ...args], { stdout: "pipe", stderr: "pipe" });
  if (p.exitCode !== 0) throw new Error(`tmux ${args.join(" ")}: ${p.stderr.toString()}`);
  return p.stdout.toString();
}

const screen = (target = "chat") => tm("capture-pane", "-p", "-J", "-S", "-200", "-t", target);

// Generous waits: CI machines are shared and a loaded one is slow, not broken.
async function waitFor(what: string, ok: (text: string) => boolean, ms = 60_000, target = "chat"): Promise<string> {
  const t0 = performance.now();
  for (;;) {
    const text = screen(target);
    if (ok(text)) return text;
    if (performance.now() - t0 > ms) throw new Error(`timed out waiting for ${what}; the screen:\n${text}`);
    await Bun.sleep(100);
  }
}

/**
 * Types a line, waits until its answer is streaming (whatever the random model writes: text,
 * blank lines or replacement characters; enough of it, or so much that the line scrolled away),
 * then presses Ctrl-C.
 */
async function interruptAnswer(line: string): Promise<void> {
  tm("send-keys", "-t", "chat", line, "Enter");
  let seen = false;
  await waitFor("the answer to stream", (s) => {
    const at = s.lastIndexOf(`> ${line}`);
    if (at < 0) return seen;
    seen = true;
    return s.length - (at + line.length + 2) >= 40;
  });
  tm("send-keys", "-t", "chat", "C-c");
}

const shellQuote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;

describe.skipIf(!tmux)("infer chat in a terminal", () => {
  afterAll(() => {
    try { tm("kill-server"); } catch { /* already gone */ }
  });

  // big enough that an answer of thousands of tokens takes seconds
  const model = join(dir, "small.gguf");
  writeFileSync(model, tinyGemma3Gguf({ shape: { layers: 6, embedding: 256, feedForward: 1024, heads: 4, kvHeads: 2, headDim: 64 } }));

  test("a progress bar is drawn on the terminal while the model loads, then erased", async () => {
    const raw = join(dir, "raw.log");
    const cmd = [process.execPath, "infer.ts", "the cat", "--model", model, "-n", "2"].map(shellQuote).join(" ");
    tm("new-session", "-d", "-s", "load", "-x", "160", "-y", "20", `sleep 0.5; cd ${shellQuote(root)} && ${cmd}; sleep 60`);
    tm("pipe-pane", "-o", "-t", "load", `cat >> ${shellQuote(raw)}`);
    const s = await waitFor("the run to end", (t) => t.includes("stop: length"), 30_000, "load");
    const bytes = readFileSync(raw, "utf8");
    expect(bytes).toMatch(/loading small\.gguf \[#*\.*\] \d+\/\d+ tensors/);
    expect(bytes).toContain("\r\x1b[2K");
    expect(s).not.toContain("loading"); // erased once loaded
    tm("kill-session", "-t", "load");
  }, 120_000);

  test("streams, stops an answer on Ctrl-C, reuses the cache, /save /reset /load, leaves on Ctrl-D", async () => {    const saved = join(dir, "conversation.json");
    const cmd = [process.execPath, "infer.ts", "chat", "--model", model, "-c", "8192", "-n", "-1", "--temp", "0",
      "--logit-bias", "1-inf", "--logit-bias", "4-inf", "--logit-bias", "5-inf", "--system", "Be brief."]
      .map(shellQuote).join(" ");
    tm("new-session", "-d", "-s", "chat", "-x", "160", "-y", "50", `cd ${shellQuote(root)} && ${cmd}; echo EXITED $?; sleep 60`);

    await waitFor("the banner and prompt", (s) => s.includes("chatting with tiny-gemma3") && /^> $/m.test(s));
    await interruptAnswer("hello there");
    let s = await waitFor("the answer to stop and a new prompt", (t) => /stop: interrupted\]\n> $/m.test(t));
    const first = /prefilled (\d+) of \1 prompt tokens/.exec(s); // the first turn: everything is new
    expect(first).not.toBeNull();

    tm("send-keys", "-t", "chat", `/save ${saved}`, "Enter");
    await waitFor("the save", (t) => t.includes(`saved 3 messages to ${saved}`));
    const conversation = JSON.parse(readFileSync(saved, "utf8")).messages;
    expect(conversation.map((m: { role: string }) => m.role)).toEqual(["system", "user", "assistant"]);
    expect(conversation[1].content).toBe("hello there");
    expect(conversation[2].content.length).toBeGreaterThan(0); // the part written before Ctrl-C

    // the second turn reuses the cache: only the new turn's tokens are prefilled
    await interruptAnswer("the cat sat");
    s = await waitFor("the second answer to stop", (t) => /stop: interrupted\]\n> $/m.test(t.slice(t.lastIndexOf("prefilled"))));
    const [, prefilled, total] = /prefilled (\d+) of (\d+) prompt tokens/.exec(s.slice(s.lastIndexOf("prefilled")))!;
    // at least the whole first prompt came from the cache (a random model's answer may not
    // tokenize back to the tokens it was sampled as, so its part can be evaluated again)
    expect(Number(total) - Number(prefilled)).toBeGreaterThanOrEqual(Number(first![1]));
    expect(Number(prefilled)).toBeLessThan(Number(total));

    tm("send-keys", "-t", "chat", "/reset", "Enter");
    await waitFor("the reset", (t) => t.includes("conversation reset"));
    tm("send-keys", "-t", "chat", `/load ${saved}`, "Enter");
    await waitFor("the load", (t) => t.includes(`loaded 3 messages from ${saved}`));
    tm("send-keys", "-t", "chat", "/nonsense", "Enter");
    await waitFor("an unknown command to be reported", (t) => t.includes("unknown command /nonsense"));

    tm("send-keys", "-t", "chat", "C-d");
    await waitFor("the exit", (t) => t.includes("EXITED 0"));
    expect(existsSync(saved)).toBe(true);
  }, 300_000);
});
