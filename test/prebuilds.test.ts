// Method: pack the package (test/support/pack.ts) and read each native library in the tarball with
// our own ELF and Mach-O reader (test/support/symbols.ts: the foreign ones cannot be loaded here),
// demanding one library per platform and instruction-set level, built for the right machine,
// exporting exactly the C ABI's symbols (ts/native/symbols.gen.ts), and on Linux asking no glibc
// newer than 2.17. The reader itself is checked against a non-library and an absent name.
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { symbols } from "../ts/native/symbols.gen.ts";
import { packPackage } from "./support/pack.ts";
import { readLibrary } from "./support/symbols.ts";

/** What the package must carry: platform folder, file format, machine, the levels. */
const EXPECTED = [
  { dir: "linux-x64", format: "elf", machine: "x86_64", ext: "so",
    levels: ["x86_64_v2", "x86_64_v3", "x86_64_v4_vnni"] },
  { dir: "linux-arm64", format: "elf", machine: "aarch64", ext: "so",
    levels: ["aarch64", "aarch64_dotprod"] },
  { dir: "darwin-arm64", format: "macho", machine: "aarch64", ext: "dylib",
    levels: ["aarch64_dotprod"] },
] as const;

const abi = Object.keys(symbols).sort();

/** GLIBC_2.14 -> [2, 14]; compared part by part. */
function glibcNewerThan(version: string, limit: [number, number]): boolean {
  const [major, minor] = version.replace("GLIBC_", "").split(".").map(Number);
  return major > limit[0] || (major === limit[0] && minor > limit[1]);
}

test("the tarball holds a library per platform and level, and nothing else under prebuilds/", () => {
  const { files } = packPackage();
  const expected = EXPECTED.flatMap((p) => p.levels.map((l) => `prebuilds/${p.dir}/libinfer-${l}.${p.ext}`));
  expect(files.filter((f) => f.startsWith("prebuilds/"))).toEqual(expected.sort());
}, 600_000);

for (const platform of EXPECTED) {
  for (const level of platform.levels) {
    const name = `libinfer-${level}.${platform.ext}`;
    test(`${platform.dir}/${name}: ${platform.machine} ${platform.format}, exporting the C ABI`, () => {
      const bytes = readFileSync(join(packPackage().dir, "prebuilds", platform.dir, name));
      const info = readLibrary(bytes);
      expect(info.format).toBe(platform.format);
      expect(info.machine).toBe(platform.machine);
      expect(abi.length).toBeGreaterThan(50);
      expect([...info.exports].filter((s) => s.startsWith("infer_")).sort()).toEqual(abi);
      expect(info.exports.has("infer_no_such_export")).toBe(false);
      if (platform.format === "elf") {
        const needed = [...info.versionsNeeded.values()].flat();
        expect(needed.length).toBeGreaterThan(0);
        expect(needed.filter((v) => v.startsWith("GLIBC_") && glibcNewerThan(v, [2, 17]))).toEqual([]);
      } else {
        // the Metal host code: the Objective-C selectors it sends and the framework it opens
        const text = Buffer.from(bytes).toString("latin1");
        expect(text).toContain("newLibraryWithSource:options:error:");
        expect(text).toContain("/System/Library/Frameworks/Metal.framework/Metal");
      }
    }, 600_000);
  }
}

test("the reader refuses what is not a library and finds no name that is not there", () => {
  expect(() => readLibrary(new TextEncoder().encode("#!/bin/sh\necho not a library\n"))).toThrow();
  expect(glibcNewerThan("GLIBC_2.34", [2, 17])).toBe(true);
  expect(glibcNewerThan("GLIBC_2.2.5", [2, 17])).toBe(false);
});
