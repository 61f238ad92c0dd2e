// The CLI's help texts: the overview (`infer --help`) and the generating commands' usage.
// import, quantize, perplexity and models keep their usage beside their code.
import { generationHelp } from "./options.ts";

export const overview = `infer: local LLM inference on GGUF models (Zig kernels, TypeScript, Bun)

usage: infer "prompt" [options]        continue a prompt, streaming to stdout (also: infer run ...)
       infer chat [options]            talk with a model turn by turn in its chat template
       infer serve [options]           an OpenAI-compatible HTTP server (/v1/chat/completions, ...)
       infer pull org/repo[:QUANT]     fetch a GGUF from the Hugging Face Hub into the cache
       infer models                    list the models in the cache ('infer models rm NAME')
       infer import <hf-folder> -o model.gguf [--quant TYPE]
                                       convert a Hugging Face model folder to GGUF
       infer quantize <in.gguf> <out.gguf> --quant TYPE
                                       re-quantize a GGUF
       infer perplexity <model.gguf> <text-file> [options]
                                       score a text as llama-perplexity does
       infer tokenize "text"           the token ids and pieces of a text
       infer embed "text"              the text's embedding vector, as JSON
       infer help [command]            this text, or a command's ('infer <command> --help')
       infer help env                  the environment variables infer reads
       infer --version                 the version

examples:
  infer "The capital of France is" -n 32 --temp 0
  infer -f story.txt -n 256 --json-schema '{"type":"object","properties":{"title":{"type":"string"}}}'
  infer serve --model qwen2.5-0.5b-instruct-q4_k_m --port 8080 --parallel 4
  infer chat -m bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M

The default model is Gemma 3 270M Q4_K_M, a small base model: it continues text; it has no
chat template of its own (chat uses Gemma's) and was not tuned to follow instructions.

From a source checkout 'infer' is 'bun run infer.ts'; 'bun run build:bin' makes the single
executable dist/infer. Models: --model takes a GGUF path, the name of a model in the cache
(INFER_CACHE, default ~/.cache/infer), or a Hugging Face Hub model, org/repo:QUANT, pulled into
the cache on first use ('infer help pull'). 'infer help env' lists every environment variable
(INFER_CACHE, INFER_BACKEND, HF_TOKEN, ...) with its default.

Exit codes: 0 done; 1 an error, said in one line (a missing or bad model file, too little
memory, ...); 2 a mistake in the command line (an unknown option, a bad value, a wrong number of
arguments), said in one line with the help to read; 130 stopped by Ctrl-C.
`;

export const runUsage = `usage: infer [run] "prompt" [options]
       infer [run] -f FILE [options]      the prompt from FILE ('-' or a prompt '-': stdin)

Streams the continuation of the prompt to stdout; statistics go to stderr. The prompt is
tokenized as llama.cpp does: BOS is added, and control-token text such as <start_of_turn> becomes
the control token. Generation ends at end-of-generation, at -n tokens, at a --stop string, or
when a --json output is complete. Ctrl-C stops it: what was generated stays printed, the
statistics follow ("stop: interrupted") and the exit code is 130.

structured output:
  --json                 the output is one JSON object
  --json-schema SCHEMA   the output is JSON valid under the JSON Schema given inline ('{...}')
                         or in a file (@FILE, or FILE): objects
                         (properties in order; required ones present), arrays (items, minItems,
                         maxItems), strings, numbers, integers, booleans, null, enum, const,
                         anyOf/oneOf, type lists and local $ref; other keywords are refused.
                         -n must be at least the shortest valid output's length in bytes
                         (a token per byte, so that output cut off by -n still parses)
  --ignore-eos           keep generating past end-of-generation
  -f, --file FILE        read the prompt from FILE ('-': standard input)

${generationHelp("default 128")}`;

export const chatUsage = `usage: infer chat [options]

A conversation in the terminal, in the model's chat template (the GGUF's tokenizer.chat_template;
for a model without one, its family's: Gemma, Llama 3 or ChatML). Each line is your turn (end a
line with \\ to continue it on the next); the answer streams as it is written. The cache keeps the
conversation, so each turn evaluates only the new tokens: the statistics after each answer say
"prefilled N of M prompt tokens". Text you type is never read as control tokens.

  --system TEXT          the system message
  --load FILE            start from a conversation saved with /save

in the chat:
  /reset                 forget the conversation (the system message stays)
  /save FILE             write the conversation as JSON: {"messages": [{"role", "content"}, ...]}
  /load FILE             replace the conversation with a saved one
  /help                  the commands
  /exit or Ctrl-D        leave
  Ctrl-C                 stop the answer being written; the session goes on

${generationHelp("default 1024 per answer")}`;
