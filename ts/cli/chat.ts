// `infer chat`: a conversation in the terminal. Lines typed are the user's turns (a line ending
// in "\" continues on the next); the answer streams to stdout and a line of statistics follows
// on stderr ("prefilled N of M prompt tokens": the cache keeps the conversation, so a turn
// evaluates only what is new). Ctrl-C stops the answer being written, not the session: it
// aborts the turn, which the engine ends at its next step, keeping what was said. /reset, /save,
// /load and /help are commands; Ctrl-D or /exit leaves. Off a terminal (stdin piped), each line
// is a turn, and the session ends with the input.
import { createInterface } from "node:readline";
import type { Chat } from "../api/chat.ts";
import { loadModel } from "../api/model.ts";
import { readConversation, writeConversation } from "../chat/conversation.ts";
import { InferError } from "../errors.ts";
import { ensureModel } from "../models/fetch.ts";
import { parseCommand } from "./args.ts";
import { describe, formatStats, loadProgress, verbosityOf } from "./feedback.ts";
import { chatUsage } from "./help.ts";
import {
  checkLogitBias, engineSettings, generationOptions, intOption, samplingFrom, samplingOptions,
  shiftPolicyOption, speculationLoad, stopStrings,
} from "./options.ts";
import type { ShiftPolicy } from "../engine/kv-cache.ts";

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
  const speculation = speculationLoad(values); // (a usage error before any download)
  const shiftPolicy = shiftPolicyOption(values["shift-policy"]);
  const modelPath = await ensureModel(values.model);
  const onProgress = loadProgress(modelPath, verbosity);
  // One conversation: one sequence, whose cache keeps it from turn to turn.
  const model = await loadModel(modelPath, { ...settings, parallel: 1, prefixCacheBytes: 0,
    ...speculation, onProgress });
  try {
    checkLogitBias(sampling, model.info.vocabSize);
    const chat = model.chat({ system: values.system });
    if (values.load) chat.replace(readConversation(values.load));
    const say = (text: string) => { if (verbosity !== "quiet") process.stderr.write(text); };
    const origin = model.info.chatTemplate;
    if (verbosity === "verbose") {
      process.stderr.write(describe(model.info, {
        template: origin === "gguf" ? "the model's own" : `${origin} (fallback)`,
        sampling: { ...sampling, logitBias: Object.fromEntries(sampling.logitBias ?? []) },
      }));
    }
    const template = origin === "gguf" ? "its chat template" : `the ${origin} chat template`;
    if (origin !== "gguf") {
      // Said once: a base model (the default one) has no template and was not tuned to chat.
      say(`${model.info.name} has no chat template of its own; using the ${origin} family's ` +
        `(a base model continues text and may not answer as a chat model would)\n`);
    }
    say(`chatting with ${model.info.name} in ${template}; /help for commands, ` +
      `Ctrl-C stops an answer, Ctrl-D leaves\n`);
    await converse(chat, { sampling, maxTokens, stop, shiftPolicy, say, verbosity });
    return 0;
  } finally {
    await model.close();
  }
}

interface Settings {
  readonly sampling: ReturnType<typeof samplingFrom>;
  readonly maxTokens: number;
  readonly stop: string[];
  readonly shiftPolicy: ShiftPolicy | undefined;
  readonly say: (text: string) => void;
  readonly verbosity: ReturnType<typeof verbosityOf>;
}

async function converse(chat: Chat, s: Settings): Promise<void> {
  const tty = process.stdin.isTTY === true;
  const prompt = () => { if (tty) process.stdout.write("> "); };
  let answering: AbortController | null = null;
  const onSigint = () => {
    if (answering) { answering.abort(); return; }
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
        if (!command(chat, line.trim(), s)) break;
        prompt();
        continue;
      }
      answering = new AbortController();
      try {
        const turn = chat.stream(line, {
          ...samplingOptions(s.sampling), maxTokens: s.maxTokens, stop: s.stop,
          signal: answering.signal, stopOnAbortSignal: true, contextShift: true,
          ...(s.shiftPolicy ? { contextShiftPolicy: s.shiftPolicy } : {}),
        });
        for await (const piece of turn) process.stdout.write(piece.text);
        const result = await turn.result;
        process.stdout.write("\n");
        s.say(`[${formatStats(result)}]\n`);
      } catch (err) {
        if (!(err instanceof InferError)) throw err;
        process.stderr.write(`infer: ${err.message}\n`);
      } finally {
        answering = null;
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
function command(chat: Chat, line: string, s: Settings): boolean {
  const [name, ...rest] = line.split(/\s+/);
  const arg = rest.join(" ");
  try {
    switch (name) {
      case "/exit": case "/quit": return false;
      case "/help": process.stdout.write(commandsHelp); return true;
      case "/reset": chat.reset(); s.say("conversation reset\n"); return true;
      case "/save":
        if (!arg) throw new InferError("invalid_argument", "/save needs a file name");
        writeConversation(arg, chat.messages);
        s.say(`saved ${chat.messages.length} messages to ${arg}\n`);
        return true;
      case "/load":
        if (!arg) throw new InferError("invalid_argument", "/load needs a file name");
        chat.replace(readConversation(arg));
        s.say(`loaded ${chat.messages.length} messages from ${arg}\n`);
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
