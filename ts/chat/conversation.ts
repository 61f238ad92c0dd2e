// A conversation on disk: {"messages": [{"role", "content"}, ...]}, as `infer chat` saves and
// loads it (/save, /load, --load) and the library's Chat takes it (chat.replace, messages).
import { readFileSync, writeFileSync } from "node:fs";
import { InferError } from "../errors.ts";
import type { ChatMessage } from "./template.ts";
import type { ToolCall } from "./tools.ts";

export function writeConversation(path: string, messages: readonly ChatMessage[]): void {
  try {
    writeFileSync(path, JSON.stringify({ messages }, null, 2) + "\n");
  } catch (err) {
    throw new InferError("io", `cannot write ${path}: ${(err as Error).message}`);
  }
}

/** A conversation written by writeConversation (or a bare array of messages). */
export function readConversation(path: string): ChatMessage[] {
  let data: unknown;
  try {
    data = JSON.parse(readFileSync(path, "utf8"));
  } catch (err) {
    const why = (err as Error).message;
    throw new InferError("io", `cannot read a conversation from ${path}: ${why}`);
  }
  return parseMessages(data, path);
}

/**
 * A conversation file: {"messages": [{"role": "system" | "user" | "assistant" | "tool",
 * "content"}]}, an assistant's calls as "toolCalls" [{id, name, arguments}], a tool's message
 * with the "toolCallId" it answers.
 */
export function parseMessages(data: unknown, where: string): ChatMessage[] {
  const list = Array.isArray(data) ? data : (data as { messages?: unknown } | null)?.messages;
  if (!Array.isArray(list)) {
    throw new InferError("invalid_argument", `${where}: expected { "messages": [...] }`);
  }
  return list.map((m, i): ChatMessage => {
    const role = (m as { role?: unknown })?.role, content = (m as { content?: unknown })?.content;
    const known = role === "system" || role === "user" || role === "assistant" || role === "tool";
    if (!known || typeof content !== "string") {
      throw new InferError("invalid_argument", `${where}: message ${i} needs a role (system, ` +
        "user, assistant or tool) and a string content");
    }
    if (role === "system" && i > 0) {
      throw new InferError("invalid_argument", `${where}: only message 0 may be the system's`);
    }
    const { toolCalls, toolCallId } = m as { toolCalls?: unknown; toolCallId?: unknown };
    if (role === "tool") {
      if (typeof toolCallId !== "string") {
        throw new InferError("invalid_argument", `${where}: tool message ${i} needs a toolCallId`);
      }
      return { role, content, toolCallId };
    }
    if (role === "assistant" && toolCalls !== undefined) {
      const ok = Array.isArray(toolCalls) && toolCalls.every((c) => typeof c?.id === "string" &&
        typeof c.name === "string" && typeof c.arguments === "string");
      if (!ok) {
        throw new InferError("invalid_argument",
          `${where}: message ${i}'s toolCalls must be [{ id, name, arguments }] of strings`);
      }
      return { role, content, toolCalls: (toolCalls as ToolCall[]).map((c) =>
        ({ id: c.id, name: c.name, arguments: c.arguments })) };
    }
    return { role, content };
  });
}
