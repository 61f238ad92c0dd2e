// Command dispatch for the CLI. Every failure becomes one clear line on stderr and a non-zero exit.
import { InferError } from "../errors.ts";

const usage = `usage: bun run infer.ts "prompt" [options]

options:
  --model PATH     GGUF model (default: the installed Gemma 3 270M Q4_K_M)
  -n N             tokens to generate (default 128)
  --temp T         temperature; 0 is greedy (default 0.8)
  --seed S         sampler seed
  --threads N      CPU threads (default: all cores)
  --ignore-eos     keep generating past end-of-sequence
`;

export async function main(argv: string[]): Promise<number> {
  try {
    if (argv.length === 0 || argv.includes("-h") || argv.includes("--help")) {
      process.stdout.write(usage);
      return argv.length === 0 ? 2 : 0;
    }
    throw new InferError("unsupported", "generation is not wired up yet");
  } catch (err) {
    if (err instanceof InferError) {
      console.error(`infer: ${err.message}`);
      return 1;
    }
    throw err;
  }
}
