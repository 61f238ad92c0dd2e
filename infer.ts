#!/usr/bin/env bun
// CLI entry: `bun run infer.ts [command] [options]`. No logic lives here.
import { main } from "./ts/cli/main.ts";

process.exitCode = await main(process.argv.slice(2));
