// Picks the libinfer build for the running CPU. build.zig compiles one library per
// instruction-set level; this reads what the CPU offers (Linux /proc/cpuinfo, macOS on Apple
// silicon) and names the best variant it can run. INFER_CPU forces a variant by name.
import { readFileSync } from "node:fs";
import { arch, platform } from "node:process";
import { setting } from "../config/env.ts";
import { InferError } from "../errors.ts";

/** Variants by preference, best first, with the CPU features each one needs. */
const variants: Record<string, { name: string; needs: string[] }[]> = {
  x64: [
    { name: "x86_64_v4_vnni", needs: ["avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c", "bmi2"] },
    { name: "x86_64_v3", needs: ["avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm"] },
    { name: "x86_64_v2", needs: ["sse4_2", "ssse3", "popcnt", "cx16"] },
  ],
  arm64: [
    { name: "aarch64_dotprod", needs: ["asimddp"] },
    { name: "aarch64", needs: [] },
  ],
};

export function cpuFeatures(): Set<string> {
  if (platform === "darwin" && arch === "arm64") return new Set(["asimddp"]); // every Apple M chip
  if (platform !== "linux") return new Set();
  const info = readFileSync("/proc/cpuinfo", "utf8");
  const line = info.split("\n").find((l) => /^(flags|Features)\s*:/.test(l)) ?? "";
  return new Set(line.slice(line.indexOf(":") + 1).trim().split(/\s+/));
}

/** The variant names this CPU can run, best first. */
export function supportedVariants(features = cpuFeatures()): string[] {
  return (variants[arch] ?? []).filter((v) => v.needs.every((f) => features.has(f))).map((v) => v.name);
}

/** The library files this CPU can load, best first: one per level it runs (INFER_CPU: that one). */
export function libraryFileNames(): string[] {
  const ext = platform === "darwin" ? "dylib" : "so";
  const forced = setting("INFER_CPU");
  if (forced) return [`libinfer-${forced}.${ext}`];
  if (!(arch in variants)) return [`libinfer.${ext}`]; // built for the requested CPU only
  const names = supportedVariants().map((v) => `libinfer-${v}.${ext}`);
  if (names.length === 0) {
    throw new InferError("native_unavailable", `this ${arch} CPU lacks the features infer's lowest build needs`);
  }
  return names;
}

/** The best library file this CPU can load. */
export function libraryFileName(): string {
  return libraryFileNames()[0];
}
