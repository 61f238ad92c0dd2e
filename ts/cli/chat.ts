// `infer chat`: a conversation in the terminal. Lines typed are the user's turns (a line ending
// in "\" continues on the next); the answer streams to stdout and a line of statistics follows
// on stderr ("prefilled N of M prompt tokens": the cache keeps the conversation, so a turn
// evaluates only what is new). Ctrl-C stops the answer being written, not the session: the
// handler only sets a flag, which the generation loop reads between tokens. /reset, /save,
// /load and /help are commands; Ctrl-D or /exit leaves. Off a terminal (stdin piped), each line
// is a turn, and the session ends with the input.
import { createInterface } from "node:readline";
import { ChatSession } from "../chat/session.ts";
import { Engine } from "../engine/engine.ts";
import { InferError } from "../errors.ts";
import { ensureModel } from "../models/fetch.ts";
import { parseCommand } from "./args.ts";
import { describe, formatStats, loadProgress, verbosityOf } from "./feedback.ts";
import { chatUsage } from "./help.ts";
import {
  checkLogitBias, engineSettings, generationOptions, intOption, samplingFrom, stopStrings,
} from "./options.ts";

const commandsHelp = `/reset        forget the conversation (the system message stays)
/save FILE    write the conversation to FILE (JSON)
/load FILE    replace the conversation with one saved before
/help         this list
/exit         leave (or Ctrl-D); Ctrl-C stops an answer
`;

export async function chatCommand(argv: string[]): Promise<number> {
  const { values } = parseCommand(argv, {
    options: { ...generationOptions, system: { type: "string" }, load: { type: "string" } },
    positionals: { expected: "no arguments (the conversation is typed in the chat)", min: 0,
      max: 0 },
  });
  if (values.help) { process.stdout.write(chatUsage); return 0; }
  const verbosity = verbosityOf(values);
  const sampling = samplingFrom(values);
  const maxTokens = intOption(values.n, "-n", 1024, -1);
  const stop = stopStrings(values);
  const settings = engineSettings(values);
  const modelPath = await ensureModel(values.model);
  const onProgress = loadProgress(modelPath, verbosity);
  const engine = Engine.open({ modelPath, ...settings, onProgress });
  try {
    checkLogitBias(sampling, engine.model.info.vocabSize);
    const session = new ChatSession(engine, values.system ?? null);
    if (values.load) session.load(values.load);
    const say = (text: string) => { if (verbosity !== "quiet") process.stderr.write(text); };
    const origin = session.template.origin;
    if (verbosity === "verbose") {
      process.stderr.write(describe(engine, modelPath, {
        template: origin === "gguf" ? "the model's own" : `${origin} (fallback)`,
        sampling: { ...sampling, logitBias: Object.fromEntries(sampling.logitBias ?? []) },
      }));
    }
    const template = origin === "gguf" ? "its chat template" : `the ${origin} chat template`;
    say(`chatting with ${engine.model.info.name} in ${template}; /help for commands, ` +
      `Ctrl-C stops an answer, Ctrl-D leaves\n`);
    await converse(session, { sampling, maxTokens, stop, say, verbosity });
    return 0;
  } finally {
    engine.close();
  }
}

interface Settings {
  readonly sampling: ReturnType<typeof samplingFrom>;
  readonly maxTokens: number;
  readonly stop: string[];
  readonly say: (text: string) => void;
  readonly verbosity: ReturnType<typeof verbosityOf>;
}

async function converse(session: ChatSession, s: Settings): Promise<void> {
  const tty = process.stdin.isTTY === true;
  const prompt = () => { if (tty) process.stdout.write("> "); };
  let answering = false, interrupted = false;
  const onSigint = () => {
    if (answering) { interrupted = true; return; }
    // at the prompt the terminal has dropped the line being typed; start a fresh one
    process.stdout.write("\n");
    s.say("(Ctrl-D or /exit leaves)\n");
    prompt();
  };
  process.on("SIGINT", onSigint);
  const rl = createInterface({ input: process.stdin, terminal: false });
  try {
    prompt();
    let pending = "";
    for await (const raw of rl) {
      if (raw.endsWith("\\")) { pending += raw.slice(0, -1) + "\n"; continue; }
      const line = pending + raw;
      pending = "";
      if (line.trim() === "") { prompt(); continue; }
      if (line.startsWith("/")) {
        if (!command(session, line.trim(), s)) break;
        prompt();
        continue;
      }
      answering = true;
      interrupted = false;
      try {
        const turn = await session.send(line, {
          sampling: s.sampling, maxTokens: s.maxTokens, stop: s.stop,
          onText: (t) => process.stdout.write(t), shouldStop: () => interrupted,
        });
        process.stdout.write("\n");
        s.say(`[${formatStats(turn)}]\n`);
      } catch (err) {
        if (!(err instanceof InferError)) throw err;
        process.stderr.write(`infer: ${err.message}\n`);
      } finally {
        answering = false;
      }
      prompt();
    }
    if (tty) process.stdout.write("\n");
  } finally {
    process.off("SIGINT", onSigint);
    rl.close();
  }
}

/** Runs a /command; false to leave the session. */
function command(session: ChatSession, line: string, s: Settings): boolean {
  const [name, ...rest] = line.split(/\s+/);
  const arg = rest.join(" ");
  try {
    switch (name) {
      case "/exit": case "/quit": return false;
      case "/help": process.stdout.write(commandsHelp); return true;
      case "/reset": session.reset(); s.say("conversation reset\n"); return true;
      case "/save":
        if (!arg) throw new InferError("invalid_argument", "/save needs a file name");
        session.save(arg);
        s.say(`saved ${session.messages.length} messages to ${arg}\n`);
        return true;
      case "/load":
        if (!arg) throw new InferError("invalid_argument", "/load needs a file name");
        session.load(arg);
        s.say(`loaded ${session.messages.length} messages from ${arg}\n`);
        return true;
      default:
        throw new InferError("invalid_argument", `unknown command ${name} (/help lists them)`);
    }
  } catch (err) {
    if (!(err instanceof InferError)) throw err;
    process.stderr.write(`infer: ${err.message}\n`);
    return true;
  }
}
