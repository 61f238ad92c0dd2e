// Method: load the real library and exercise the status/error path and file mapping.
import { expect, test } from "bun:test";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { settings } from "../ts/config/env.ts";
import { InferError } from "../ts/errors.ts";
import { allocPages, mapFile, native } from "../ts/native/lib.ts";
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
