// infer as a library:
//   import { loadModel } from "infer";
//   await using model = await loadModel("gemma-3-270m-q4_k_m");
//   const r = await model.complete("The capital of France is", { maxTokens: 16, temperature: 0 });
// The engine runs on a thread of its own; every call returns at once and resolves (or streams)
// as tokens are decoded. Errors are InferErrors whose `code` is the one the CLI and server use.
export { loadModel, Model, type LoadOptions, type ModelInfo, type TokenizeOptions } from "./model.ts";
export { Chat, type ChatInput, type ChatOptions, type ChatReply, type ToolResult } from "./chat.ts";
export { CompletionStream } from "./stream.ts";
export type { EmbedOptions } from "./embed.ts";
export type { Pooling } from "../model/pooling.ts";
export type {
  Completion, FinishReason, GenerateOptions, Piece, Timings, Usage,
} from "./options.ts";
export type { ChatMessage } from "../chat/template.ts";
export type { ToolCall, ToolChoice, ToolFunction } from "../chat/tools.ts";
export type { BackendKind } from "../backend/select.ts";
export { InferError, type InferErrorCode } from "../errors.ts";
