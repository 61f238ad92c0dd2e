// A conversation with a model through the library: the messages so far, rendered through the
// model's chat template into one prompt per turn. The engine keeps each sequence's tokens in its
// KV cache and starts the next turn from the longest prefix it still holds, so a turn evaluates
// only what is new (the end of the last answer's turn and the user's message).
import type { ChatMessage } from "../chat/template.ts";
import { parseMessages } from "../chat/conversation.ts";
import { InferError } from "../errors.ts";
import type { Model } from "./model.ts";
import type { Completion, GenerateOptions, Piece } from "./options.ts";

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

  /** Says `text` and resolves with the answer, which joins the conversation. */
  async send(text: string, options: GenerateOptions = {}): Promise<ChatReply> {
    const s = this.stream(text, options);
    const c = await s.result;
    return { ...c, messages: this.messages };
  }

  /**
   * As send(), piece by piece. The turn waits for the one before it; the answer joins the
   * conversation when it ends (stopped early too: with the text it has).
   */
  stream(text: string, options: GenerateOptions = {}): AsyncIterable<Piece> & {
    readonly result: Promise<Completion>;
  } {
    if (typeof text !== "string") {
      throw new InferError("invalid_argument", "chat: expected a string");
    }
    const user: ChatMessage = { role: "user", content: text };
    // Each turn's prompt is the conversation as the turn before it left it.
    const stream = this.turn.then(() =>
      this.model.start({ messages: [...this.messages, user] }, options));
    const result = stream.then((s) => s.result).then((c) => {
      this.history.push(user, { role: "assistant", content: c.text });
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

