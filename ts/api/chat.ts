// A conversation with a model through the library: the messages so far, rendered through the
// model's chat template into one prompt per turn. The engine keeps each sequence's tokens in its
// KV cache and starts the next turn from the longest prefix it still holds, so a turn evaluates
// only what is new (the end of the last answer's turn and the user's message).
//
// Tools: an answer's calls join the conversation with it (message.toolCalls); the caller runs
// them and sends their results with send({ toolResults: [{ id, content }] }), which the model
// then answers.
import type { ChatMessage } from "../chat/template.ts";
import { parseMessages } from "../chat/conversation.ts";
import { InferError } from "../errors.ts";
import type { Model } from "./model.ts";
import type { Completion, GenerateOptions, Piece } from "./options.ts";
import type { CompletionStream } from "./stream.ts";

/** A tool's result: the id of the call it answers, and what the tool returned, as text. */
export interface ToolResult {
  readonly id: string;
  readonly content: string;
}

/** What a turn says: the user's text, or the results of the calls the last answer made. */
export type ChatInput = string | { readonly toolResults: readonly ToolResult[] };

function inputMessages(input: ChatInput): ChatMessage[] {
  if (typeof input === "string") return [{ role: "user", content: input }];
  const results = (input as { toolResults?: unknown } | null)?.toolResults;
  if (!Array.isArray(results) || results.length === 0) {
    throw new InferError("invalid_argument",
      "chat: expected a string or { toolResults: [{ id, content }] }");
  }
  return results.map((r: ToolResult, i) => {
    if (typeof r?.id !== "string" || typeof r.content !== "string") {
      throw new InferError("invalid_argument",
        `chat: tool result ${i} needs an id and a string content`);
    }
    return { role: "tool", content: r.content, toolCallId: r.id };
  });
}

export interface ChatOptions {
  /** The system message, first in every prompt. */
  readonly system?: string;
  /** A conversation to continue (a system message first replaces `system`). */
  readonly messages?: readonly ChatMessage[];
}

export interface ChatReply extends Completion {
  /** The conversation after this turn. */
  readonly messages: readonly ChatMessage[];
}

export class Chat {
  private system: string | null;
  private history: ChatMessage[] = [];
  /** Turns run one after another: the next starts from the conversation the last one left. */
  private turn: Promise<unknown> = Promise.resolve();

  /** @internal model.chat() makes chats. */
  constructor(private readonly model: Model, options: ChatOptions) {
    this.system = options.system ?? null;
    if (options.messages !== undefined) this.replace(options.messages);
  }

  /** The conversation, the system message (if any) first. */
  get messages(): ChatMessage[] {
    const head: ChatMessage[] = this.system === null ? []
      : [{ role: "system", content: this.system }];
    return [...head, ...this.history];
  }

  /**
   * Says `input` (the user's text, or tool results) and resolves with the answer, which joins
   * the conversation.
   */
  async send(input: ChatInput, options: GenerateOptions = {}): Promise<ChatReply> {
    const s = this.stream(input, options);
    const c = await s.result;
    return { ...c, messages: this.messages };
  }

  /**
   * As send(), piece by piece. The turn waits for the one before it; the answer joins the
   * conversation when it ends (stopped early too: with the text it has).
   */
  stream(input: ChatInput, options: GenerateOptions = {}): AsyncIterable<Piece> & {
    readonly result: Promise<Completion>;
  } {
    const said = inputMessages(input);
    // Each turn's prompt is the conversation as the turn before it left it.
    const stream = this.turn.then(() => this.startFitting(said, options));
    const result = stream.then((s) => s.result).then((c) => {
      this.history.push(...said, c.toolCalls.length > 0
        ? { role: "assistant", content: c.text, toolCalls: c.toolCalls }
        : { role: "assistant", content: c.text });
      return c;
    });
    result.catch(() => {});
    this.turn = result.catch(() => {});
    return {
      result,
      async *[Symbol.asyncIterator]() {
        yield* await stream;
      },
    };
  }

  /**
   * Starts the turn. With options.contextShift, a conversation grown past the context forgets
   * its oldest turns (the system message stays) until the prompt fits, as llama.cpp's server
   * truncates a prompt; the answer itself may then shift the context as it grows.
   */
  private async startFitting(said: ChatMessage[], options: GenerateOptions): Promise<CompletionStream> {
    for (;;) {
      const s = this.model.start({ messages: [...this.messages, ...said] }, options);
      if (!options.contextShift) return s;
      try {
        await s.started;
        return s;
      } catch (err) {
        const full = err instanceof InferError && err.code === "context_overflow";
        if (!full || this.history.length === 0) throw err;
        this.forgetOldestTurn();
      }
    }
  }

  /** Drops the first message and what follows it up to the next message of the user. */
  private forgetOldestTurn(): void {
    let n = 1;
    while (n < this.history.length && this.history[n].role !== "user") n++;
    this.history.splice(0, n);
  }

  /** Forgets the conversation (the system message stays). */
  reset(): void {
    this.history = [];
  }

  /** Replaces the conversation (as saved from `messages`); the template checks it first. */
  replace(messages: readonly ChatMessage[]): void {
    const list = parseMessages({ messages }, "messages");
    const system = list[0]?.role === "system" ? list[0].content : null;
    const rest = system === null ? list : list.slice(1);
    const head: ChatMessage[] = (system ?? this.system) === null ? []
      : [{ role: "system", content: (system ?? this.system)! }];
    this.model.template().render([...head, ...rest]); // roles that alternate, and the like
    this.system = system ?? this.system;
    this.history = rest;
  }
}

