// A conversation with a model: the messages so far, rendered through the chat template into one
// prompt per turn. The engine keeps the previous turn's tokens in its cache, so each turn
// evaluates only what is new (the end of the last answer's turn and the user's message).
import { readFileSync, writeFileSync } from "node:fs";
import type { Engine, GenerateResult } from "../engine/engine.ts";
import { InferError } from "../errors.ts";
import type { SamplerOptions } from "../sample/sampler.ts";
import { chatTemplateFor, turnTokens, type ChatMessage, type ChatTemplate } from "./template.ts";

export interface TurnOptions {
  readonly sampling: SamplerOptions;
  /** Tokens per answer at most; negative: until the context is full. */
  readonly maxTokens: number;
  readonly stop?: readonly string[];
  readonly onText?: (text: string) => void;
  /** Polled between tokens: true ends the answer where it is (Ctrl-C). */
  readonly shouldStop?: () => boolean;
}

export interface Turn extends GenerateResult {
  /** The answer as it is kept in the conversation. */
  readonly reply: string;
}

export class ChatSession {
  readonly template: ChatTemplate;
  /** Control tokens that end an answer (the template's turn markers). */
  readonly stopTokens: number[];
  private history: ChatMessage[] = [];

  constructor(readonly engine: Engine, private system: string | null = null,
    template?: ChatTemplate) {
    this.template = template ?? chatTemplateFor(engine.file.metadata, engine.tokenizer);
    this.stopTokens = turnTokens(this.template, engine.tokenizer);
  }

  /** The conversation, the system message (if any) first. */
  get messages(): ChatMessage[] {
    if (this.system === null) return [...this.history];
    return [{ role: "system", content: this.system }, ...this.history];
  }

  /** The prompt tokens the next turn would start from, after `user` is said. */
  promptFor(user: string): number[] {
    const messages: ChatMessage[] = [...this.messages, { role: "user", content: user }];
    return this.template.encode(this.engine.tokenizer, messages);
  }

  /** Says `user`, streams the answer, and keeps both in the conversation. */
  async send(user: string, options: TurnOptions): Promise<Turn> {
    const prompt = this.promptFor(user); // throws before anything changes if the template refuses
    if (prompt.length >= this.engine.contextLength) {
      throw new InferError("context_overflow", `the conversation (${prompt.length} tokens) no ` +
        `longer fits the context of ${this.engine.contextLength}: /reset, or raise --ctx-size`);
    }
    const result = await this.engine.generateAsync(prompt, {
      maxTokens: options.maxTokens, sampling: options.sampling, stop: options.stop,
      stopTokens: this.stopTokens, onText: options.onText, shouldStop: options.shouldStop,
    });
    this.history.push({ role: "user", content: user }, { role: "assistant", content: result.text });
    return { ...result, reply: result.text };
  }

  /** Forgets the conversation (the system message stays). */
  reset(): void {
    this.history = [];
  }

  save(path: string): void {
    try {
      writeFileSync(path, JSON.stringify({ messages: this.messages }, null, 2) + "\n");
    } catch (err) {
      throw new InferError("io", `cannot write ${path}: ${(err as Error).message}`);
    }
  }

  /** Replaces the conversation with one saved by save() (a system message in it replaces ours). */
  load(path: string): void {
    let data: unknown;
    try {
      data = JSON.parse(readFileSync(path, "utf8"));
    } catch (err) {
      const why = (err as Error).message;
      throw new InferError("io", `cannot read a conversation from ${path}: ${why}`);
    }
    const messages = parseMessages(data, path);
    const system = messages[0]?.role === "system" ? messages[0].content : null;
    const rest = system === null ? messages : messages.slice(1);
    const head: ChatMessage[] = system === null ? [] : [{ role: "system", content: system }];
    this.template.render([...head, ...rest]); // the template's own checks (roles alternate, …)
    this.system = system ?? this.system;
    this.history = rest;
  }
}

/** A conversation file: {"messages": [{"role": "system" | "user" | "assistant", "content"}]}. */
export function parseMessages(data: unknown, where: string): ChatMessage[] {
  const list = Array.isArray(data) ? data : (data as { messages?: unknown } | null)?.messages;
  if (!Array.isArray(list)) {
    throw new InferError("invalid_argument", `${where}: expected { "messages": [...] }`);
  }
  return list.map((m, i) => {
    const role = (m as { role?: unknown })?.role, content = (m as { content?: unknown })?.content;
    const known = role === "system" || role === "user" || role === "assistant";
    if (!known || typeof content !== "string") {
      throw new InferError("invalid_argument",
        `${where}: message ${i} needs a role (system, user or assistant) and a string content`);
    }
    if (role === "system" && i > 0) {
      throw new InferError("invalid_argument", `${where}: only message 0 may be the system's`);
    }
    return { role, content };
  });
}
