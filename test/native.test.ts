// Method: load the real library and exercise the status/error path and file mapping.
import { expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { settings } from "../ts/config/env.ts";
import { InferError } from "../ts/errors.ts";
import { allocPages, mapFile, native, sourceOrPrebuilt } from "../ts/native/lib.ts";
import { structDefaults } from "../ts/native/abi.ts";
import { generateFromTree } from "../ts/native/gen-symbols.ts";

test("library loads and reports its version", () => {
  expect(native().infer_version()).toBeGreaterThan(0);
});

test("symbols.gen.ts is up to date with the export files and lib/abi.zig", async () => {
  const committed = await Bun.file(join(import.meta.dir, "..", "ts", "native", "symbols.gen.ts")).text();
  expect(committed).toBe(generateFromTree());
});

test("the library's settings default to what the environment's absence means (ts/config/env.ts)", () => {
  // lib/abi.zig Settings holds until infer_configure: the Zig tests run with these defaults.
  expect(structDefaults("Settings")).toEqual({
    huge_pages: settings.INFER_HUGE_PAGES.default,
    cuda_pdl: settings.INFER_CUDA_PDL.default,
    cublas_path_len: 0,
    cuda_cublas_min_tokens: settings.INFER_CUDA_CUBLAS.default,
    cuda_batch_mma_min: settings.INFER_CUDA_BATCH_MMA.default,
  });
});

test("mapFile gives a view of the bytes", () => {
  const dir = mkdtempSync(join(tmpdir(), "infer-"));
  const path = join(dir, "x.bin");
  writeFileSync(path, "hello mapped world");
  const m = mapFile(path);
  expect(new TextDecoder().decode(m.bytes)).toBe("hello mapped world");
  m.close();
});

test("allocPages gives zeroed, writable memory aligned to a huge page; 0 bytes is an error", () => {
  const region = allocPages(3 << 20);
  expect((region.address as number) % (2 << 20)).toBe(0);
  expect(region.bytes.length).toBe(3 << 20);
  expect(region.bytes.every((b) => b === 0)).toBe(true);
  region.bytes.fill(7);
  expect(region.bytes[(3 << 20) - 1]).toBe(7);
  region.free();
  region.free(); // once only, however often it is called
  expect(() => allocPages(0)).toThrow(InferError);
});

test("a missing file is an InferError naming the path", () => {
  try {
    mapFile("/nonexistent/model.gguf");
    throw new Error("expected a throw");
  } catch (err) {
    expect(err).toBeInstanceOf(InferError);
    expect((err as InferError).code).toBe("io");
    expect((err as Error).message).toContain("/nonexistent/model.gguf");
  }
});

/** A folder laid out as `files` (relative paths), for the library search below. */
function layout(files: string[]): string {
  const root = mkdtempSync(join(tmpdir(), "infer-layout-"));
  for (const file of files) {
    mkdirSync(join(root, file, ".."), { recursive: true });
    writeFileSync(join(root, file), "");
  }
  return root;
}

test("the library search: the checkout's build, then the best prebuilt level present", () => {
  const levels = () => ["libinfer-v4.so", "libinfer-v3.so", "libinfer-v2.so"];
  const cases: [string[], string | RegExp][] = [
    // a checkout: its own build wins over prebuilds; unbuilt, the prebuilds serve
    [["build.zig", "zig-out/lib/libinfer-v4.so", "prebuilds/linux-x64/libinfer-v4.so"],
      "zig-out/lib/libinfer-v4.so"],
    [["build.zig", "prebuilds/linux-x64/libinfer-v3.so"], "prebuilds/linux-x64/libinfer-v3.so"],
    [["build.zig"], "zig-out/lib/libinfer-v4.so"], // native() then says to run the setup
    // the package: the best level it carries that this CPU runs
    [["prebuilds/linux-x64/libinfer-v2.so", "prebuilds/linux-x64/libinfer-v3.so"],
      "prebuilds/linux-x64/libinfer-v3.so"],
    [["prebuilds/linux-x64/libinfer-v2.so"], "prebuilds/linux-x64/libinfer-v2.so"],
    [["prebuilds/linux-x64/libinfer-v5.so"], "prebuilds/linux-x64/libinfer-v4.so"], // missing
    // no folder for the platform: an error naming it and what the package carries
    [["prebuilds/darwin-arm64/libinfer-v4.so"],
      /no native library for linux-x64 \(its prebuilt ones: darwin-arm64\)/],
  ];
  for (const [files, expected] of cases) {
    const root = layout(files);
    try {
      if (typeof expected === "string") {
        expect(sourceOrPrebuilt(root, "linux-x64", levels)).toBe(join(root, expected));
      } else {
        let error: unknown;
        try { sourceOrPrebuilt(root, "linux-x64", levels); } catch (err) { error = err; }
        expect(error).toBeInstanceOf(InferError);
        expect((error as InferError).code).toBe("native_unavailable");
        expect((error as Error).message).toMatch(expected);
      }
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  }
});
