// Method: pull small generated GGUFs from a Hub served on localhost (test/support/fake-hub.ts:
// tree API, resolve URLs that redirect to a CDN on another port, x-linked-etag/size headers)
// into a temporary INFER_CACHE through the real code, and demand the exact bytes and a source
// record; a connection cut half way resumed by Range; a wrong checksum, 404, 401/403 and a full
// disk as one clear line with nothing left that looks like a model.
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, test } from "bun:test";
import {
  existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { withSettings } from "../ts/config/env.ts";
import { InferError } from "../ts/errors.ts";
import { openGguf } from "../ts/gguf/reader.ts";
import {
  cachedHubFile, cachedModelFiles, readSource, removeCachedModel, resolveModel,
} from "../ts/models/cache.ts";
import { partialPathOf } from "../ts/models/download.ts";
import { ensureModel } from "../ts/models/fetch.ts";
import { pullModel, type PullOptions } from "../ts/models/hub.ts";
import { parseHubRef, pickHubFile, quantInName } from "../ts/models/hub-ref.ts";
import { COMMIT, GOOD_TOKEN, sha256Of, startFakeHub, type FakeHub } from "./support/fake-hub.ts";
import { splitGguf } from "./support/split-gguf.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const q4 = new Uint8Array(tinyGemma3Gguf({ seed: 1 })), q8 = new Uint8Array(tinyGemma3Gguf({ seed: 2 }));
const work = mkdtempSync(join(tmpdir(), "infer-hub-src-"));
writeFileSync(join(work, "whole.gguf"), tinyGemma3Gguf({ seed: 3 }));
const parts = splitGguf(join(work, "whole.gguf"), join(work, "tiny-Q4_K_M"), 3)
  .map((p) => new Uint8Array(readFileSync(p)));

let hub: FakeHub;
beforeAll(async () => {
  hub = await startFakeHub({
    "acme/tiny-GGUF": { files: {
      "README.md": new TextEncoder().encode("# tiny\n"),
      "tiny-Q4_K_M.gguf": q4, "tiny-Q8_0.gguf": q8, "mmproj-tiny-f16.gguf": q8,
    } },
    "acme/split-GGUF": { files: Object.fromEntries(parts.map((p, i) =>
      [`Q4_K_M/tiny-Q4_K_M-0000${i + 1}-of-00003.gguf`, p])) },
    "acme/gated-GGUF": { gated: true, files: { "g-Q4_K_M.gguf": q4 } },
  });
});
afterAll(() => {
  hub.stop();
  rmSync(work, { recursive: true, force: true });
});

let cache = "";
const saved = process.env.INFER_CACHE;
beforeEach(() => {
  cache = mkdtempSync(join(tmpdir(), "infer-hub-"));
  process.env.INFER_CACHE = cache;
  hub.requests.length = 0;
  hub.cutHalfWay.clear();
  hub.stallHalfWay.clear();
  hub.corrupt.clear();
  hub.pageSize = Infinity;
});
afterEach(() => {
  if (saved === undefined) delete process.env.INFER_CACHE;
  else process.env.INFER_CACHE = saved;
  rmSync(cache, { recursive: true, force: true });
});

const quiet = (o: PullOptions = {}): PullOptions =>
  ({ endpoint: hub.url, token: null, onProgress: () => {}, onNote: () => {}, ...o });

async function rejection(promise: Promise<unknown>): Promise<InferError> {
  try {
    await promise;
  } catch (err) {
    expect(err).toBeInstanceOf(InferError);
    expect((err as Error).message).not.toContain("\n");
    return err as InferError;
  }
  throw new Error("expected a rejection");
}

/** Every file under the cache's models/, relative. */
const filesInCache = () => existsSync(join(cache, "models"))
  ? (readdirSync(join(cache, "models"), { recursive: true }) as string[])
    .filter((f) => statSync(join(cache, "models", f)).isFile()).sort() : [];

describe("Hub references and picking a file", () => {
  test("parseHubRef takes org/repo, :QUANT, a file path and hf.co/; not paths or names", () => {
    expect(parseHubRef("acme/tiny-GGUF")).toEqual({ repo: "acme/tiny-GGUF", quant: null, file: null });
    expect(parseHubRef("hf.co/acme/tiny-GGUF:q8_0")).toEqual({ repo: "acme/tiny-GGUF", quant: "q8_0", file: null });
    expect(parseHubRef("acme/x/sub/m-Q4_K_M.gguf")).toEqual({ repo: "acme/x", quant: null, file: "sub/m-Q4_K_M.gguf" });
    for (const no of ["gemma-3-270m-q4_k_m", "./a/b", "/abs/m.gguf", "a/b/c", "../a/b", "a/../b.gguf",
      "a/b:c:d", "dir/m.gguf"]) {
      expect(parseHubRef(no)).toBeNull();
    }
  });

  test("a quantization matches as a whole word, split sets by their first part, no mmproj", () => {
    const files = ["README.md", "m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "m-IQ4_XS.gguf", "mmproj-m-Q8_0.gguf",
      "Q8_0/m-Q8_0-00002-of-00002.gguf", "Q8_0/m-Q8_0-00001-of-00002.gguf", "m.Q5_K_M.gguf"];
    const pick = (quant: string | null) => pickHubFile({ repo: "o/r", quant, file: null }, files);
    expect(pick("q4_k_m").file).toBe("m-Q4_K_M.gguf");
    expect(pick("Q5_K_M").file).toBe("m.Q5_K_M.gguf");
    expect(pick("Q8_0").file).toBe("Q8_0/m-Q8_0-00001-of-00002.gguf");
    expect(pick("XS").file).toBe("m-IQ4_XS.gguf");
    expect(pick(null)).toEqual({ file: "m-Q4_K_M.gguf", chosen: "no quantization asked for: took Q4_K_M (m-Q4_K_M.gguf)" });
    expect(() => pick("Q4_K")).toThrow("o/r has no \"Q4_K\" file; it has IQ4_XS, Q4_K_M, Q4_K_S, Q5_K_M, Q8_0");
    expect(pickHubFile({ repo: "o/r", quant: null, file: null }, ["a-F16.gguf", "a-Q6_K.gguf"]).chosen)
      .toBe("no quantization asked for and no Q4_K_M, Q4_0, Q8_0: took a-F16.gguf");
    expect(quantInName("x-UD-Q4_K_XL-00001-of-00002.gguf")).toBe("UD-Q4_K_XL");
  });
});

describe("pulling", () => {
  test("org/repo:QUANT lands the file whole, with its source, and is found offline after", async () => {
    const progress: [number, number][] = [];
    const path = await pullModel("acme/tiny-GGUF:q8_0", quiet({
      onProgress: (r, t) => progress.push([r, t]) }));
    expect(path).toBe(join(cache, "models", "acme/tiny-GGUF/tiny-Q8_0.gguf"));
    expect(new Uint8Array(readFileSync(path))).toEqual(q8);
    expect(filesInCache()).toEqual(["acme/tiny-GGUF/tiny-Q8_0.gguf", "acme/tiny-GGUF/tiny-Q8_0.gguf.source.json"]);
    expect(readSource(path)).toEqual({ endpoint: hub.url, repo: "acme/tiny-GGUF", revision: "main",
      commit: COMMIT, path: "tiny-Q8_0.gguf", sha256: sha256Of(q8), bytes: q8.length });
    expect(progress.at(-1)).toEqual([q8.length, q8.length]);
    expect(progress.every(([r], i) => i === 0 || r >= progress[i - 1][0])).toBe(true);
    // the CDN never sees the token; the Hub's HEAD is not followed to it
    expect(hub.requests.filter((r) => r.server === "cdn").map((r) => r.method)).toEqual(["GET"]);

    const before = hub.requests.length;
    expect(resolveModel("acme/tiny-GGUF:Q8_0")).toBe(path);
    expect(await ensureModel("acme/tiny-GGUF:Q8_0")).toBe(path);
    expect(await ensureModel("acme/tiny-GGUF/tiny-Q8_0.gguf")).toBe(path);
    expect(resolveModel("Q8_0")).toBe(path); // a unique part of a cached name
    expect(hub.requests.length).toBe(before);
    // pulled again: the Hub is asked, the file is not fetched again
    const notes: string[] = [];
    expect(await pullModel("acme/tiny-GGUF:Q8_0", quiet({ onNote: (l) => notes.push(l) }))).toBe(path);
    expect(notes).toEqual(["acme/tiny-GGUF/tiny-Q8_0.gguf: the cached copy is the Hub's (main)"]);
    expect(hub.requests.filter((r) => r.server === "cdn").length).toBe(1);
    expect(() => resolveModel("acme/tiny-GGUF:Q4_K_M")).toThrow("'infer pull acme/tiny-GGUF:Q4_K_M' fetches it");
  });

  test("no quantization takes Q4_K_M and says so; the listing is read across pages", async () => {
    hub.pageSize = 1;
    const notes: string[] = [];
    const path = await pullModel("acme/tiny-GGUF", quiet({ onNote: (l) => notes.push(l) }));
    expect(path.endsWith("acme/tiny-GGUF/tiny-Q4_K_M.gguf")).toBe(true);
    expect(notes).toEqual(["acme/tiny-GGUF: no quantization asked for: took Q4_K_M (tiny-Q4_K_M.gguf)"]);
    expect(hub.requests.filter((r) => r.path.startsWith("/api/models/")).length).toBe(4);
    expect(await rejection(pullModel("acme/tiny-GGUF:Q2_K", quiet()))).toMatchObject({
      code: "invalid_argument", message: "acme/tiny-GGUF has no \"Q2_K\" file; it has Q4_K_M, Q8_0" });
  });

  test("a connection cut half way is resumed by Range within the same pull", async () => {
    hub.cutHalfWay.set(sha256Of(q4), 1);
    const path = await pullModel("acme/tiny-GGUF/tiny-Q4_K_M.gguf", quiet());
    expect(new Uint8Array(readFileSync(path))).toEqual(q4);
    const gets = hub.requests.filter((r) => r.server === "cdn");
    expect(gets.length).toBe(2);
    expect(gets[0].range).toBeNull();
    const from = Number(/^bytes=(\d+)-$/.exec(gets[1].range ?? "")?.[1]);
    expect(from).toBeGreaterThan(0);
    expect(from).toBeLessThan(q4.length);
  });

  test("a connection that goes quiet half way is cut and resumed", async () => {
    hub.stallHalfWay.set(sha256Of(q8), 1);
    const path = await pullModel("acme/tiny-GGUF:Q8_0", quiet({ stallMs: 300 }));
    expect(new Uint8Array(readFileSync(path))).toEqual(q8);
    const ranges = hub.requests.filter((r) => r.server === "cdn").map((r) => r.range);
    expect(ranges.length).toBe(2);
    expect(ranges[0]).toBeNull();
    expect(ranges[1]).toMatch(/^bytes=[1-9]\d*-$/);
  });

  test("a pull that keeps breaking keeps its .partial, which is no model; the next one resumes it", async () => {
    hub.cutHalfWay.set(sha256Of(q4), 4);
    const err = await rejection(pullModel("acme/tiny-GGUF:Q4_K_M", quiet()));
    expect(err.message).toMatch(/^download of acme\/tiny-GGUF\/tiny-Q4_K_M\.gguf broke off at \d+ of \d+ bytes.*; the same command resumes it$/);
    const target = join(cache, "models", "acme/tiny-GGUF/tiny-Q4_K_M.gguf");
    const kept = statSync(partialPathOf(target)).size;
    expect(kept).toBeGreaterThan(0);
    expect(cachedModelFiles()).toEqual([]);
    expect(cachedHubFile({ repo: "acme/tiny-GGUF", quant: "Q4_K_M", file: null })).toBeNull();

    hub.requests.length = 0;
    const path = await pullModel("acme/tiny-GGUF:Q4_K_M", quiet());
    expect(new Uint8Array(readFileSync(path))).toEqual(q4);
    expect(hub.requests.filter((r) => r.server === "cdn").map((r) => r.range)).toEqual([`bytes=${kept}-`]);
    expect(existsSync(partialPathOf(target))).toBe(false);
  });

  test("a checksum mismatch keeps nothing", async () => {
    hub.corrupt.add(sha256Of(q8));
    const err = await rejection(pullModel("acme/tiny-GGUF:Q8_0", quiet()));
    expect(err.message).toStartWith(`acme/tiny-GGUF/tiny-Q8_0.gguf from ${hub.url} has SHA-256 `);
    expect(err.message).toEndWith(`expected ${sha256Of(q8)}; nothing was kept`);
    expect(filesInCache()).toEqual([]);
  });

  test("a missing repo or file is a 404 said in one line; the engine's path error stays for paths", async () => {
    expect((await rejection(pullModel("acme/nope:Q4_K_M", quiet()))).message)
      .toBe(`no model repository acme/nope on ${hub.url}`);
    expect((await rejection(pullModel("acme/tiny-GGUF/nope.gguf", quiet()))).message)
      .toBe("acme/tiny-GGUF has no file \"nope.gguf\" at \"main\"");
    expect((await rejection(pullModel("acme/tiny-GGUF/tiny-Q4_K_M-00002-of-00003.gguf", quiet()))).message)
      .toBe("acme/tiny-GGUF/tiny-Q4_K_M-00002-of-00003.gguf is one part of a split model: give its first part, tiny-Q4_K_M-00001-of-00003.gguf");
    const unreachable = await rejection(pullModel("acme/tiny-GGUF",
      quiet({ endpoint: "http://127.0.0.1:9" })));
    expect(unreachable.message).toStartWith("cannot reach the Hub at http://127.0.0.1:9: ");
    // a missing relative path of three parts reads as a Hub file too: both readings are told
    const pathLike = await withSettings({ HF_ENDPOINT: hub.url }, () =>
      rejection(ensureModel("models/sub/m.gguf", { onProgress: () => {} })));
    expect(pathLike.message).toBe(`no model file "models/sub/m.gguf" here, nor on the Hub: ` +
      `no model repository models/sub on ${hub.url}`);
    expect(filesInCache()).toEqual([]);
  });

  test("a gated repo: 401 without a token, 403 with a wrong one, pulled with HF_TOKEN", async () => {
    const none = await rejection(pullModel("acme/gated-GGUF:Q4_K_M", quiet()));
    expect(none.message).toStartWith("acme/gated-GGUF needs a token: it is gated or private (or " +
      "does not exist); set HF_TOKEN to an access token that can read it (the Hub says: \"Access to model");
    const wrong = await rejection(pullModel("acme/gated-GGUF:Q4_K_M", quiet({ token: "hf_bad" })));
    expect(wrong.message).toStartWith(`acme/gated-GGUF is gated and this token's account has no access yet`);
    hub.requests.length = 0;
    const path = await withSettings({ HF_TOKEN: GOOD_TOKEN, HF_ENDPOINT: hub.url }, () =>
      pullModel("acme/gated-GGUF:Q4_K_M", { onProgress: () => {}, onNote: () => {} }));
    expect(new Uint8Array(readFileSync(path))).toEqual(q4);
    for (const r of hub.requests) {
      expect(r.authorization).toBe(r.server === "hub" ? `Bearer ${GOOD_TOKEN}` : null);
    }
  });

  test("without HF_TOKEN the token file is read, as huggingface_hub reads it", async () => {
    const home = join(cache, "hf-home");
    mkdirSync(home, { recursive: true });
    writeFileSync(join(home, "token"), GOOD_TOKEN + "\n");
    const path = await withSettings({ HF_TOKEN: "", HF_HOME: home, HF_ENDPOINT: hub.url }, () =>
      pullModel("acme/gated-GGUF:Q4_K_M", { onProgress: () => {}, onNote: () => {} }));
    expect(new Uint8Array(readFileSync(path))).toEqual(q4);
    const elsewhere = join(cache, "my-token");
    writeFileSync(elsewhere, "hf_bad");
    const wrong = await withSettings({ HF_TOKEN: "", HF_HOME: home, HF_TOKEN_PATH: elsewhere,
      HF_ENDPOINT: hub.url }, () => rejection(pullModel("acme/gated-GGUF/gated-Q8_0.gguf",
      { onProgress: () => {}, onNote: () => {} })));
    expect(wrong.message).toContain("token's account has no access");
  });

  test("a split model comes whole, is listed once, opens as one and is removed whole", async () => {
    const path = await pullModel("acme/split-GGUF:Q4_K_M", quiet());
    expect(path).toBe(join(cache, "models", "acme/split-GGUF/Q4_K_M/tiny-Q4_K_M-00001-of-00003.gguf"));
    expect(cachedModelFiles()).toEqual(["acme/split-GGUF/Q4_K_M/tiny-Q4_K_M-00001-of-00003.gguf"]);
    const file = openGguf(path), whole = openGguf(join(work, "whole.gguf"));
    try {
      expect(file.parts.length).toBe(3);
      expect(file.tensors.size).toBe(whole.tensors.size);
    } finally {
      file.close();
      whole.close();
    }
    expect(removeCachedModel("acme/split-GGUF:Q4_K_M").length).toBe(6); // 3 parts, 3 records
    expect(filesInCache()).toEqual([]);
    expect(readdirSync(join(cache, "models"))).toEqual([]); // its folders went with it
  });

  test.skipIf(!existsSync("/dev/full"))("a full disk is one line and leaves no partial file", async () => {
    // the partial is the device that always answers ENOSPC: the real write path meets a full disk
    const target = join(cache, "models", "acme/tiny-GGUF/tiny-Q8_0.gguf");
    mkdirSync(join(cache, "models", "acme/tiny-GGUF"), { recursive: true });
    symlinkSync("/dev/full", partialPathOf(target));
    const err = await rejection(pullModel("acme/tiny-GGUF:Q8_0", quiet()));
    expect(err.message).toBe(`no space left on device while writing ${target} (0 bytes written; ` +
      "the partial download was removed)");
    expect(filesInCache()).toEqual([]);
  });
});

describe("the CLI and the library", () => {
  const root = join(import.meta.dir, "..");
  // async: the Hub answers from this process, which a synchronous spawn would block
  async function infer(env: Record<string, string>, ...args: string[]) {
    const p = Bun.spawn([process.execPath, "infer.ts", ...args], { cwd: root, stdout: "pipe",
      stderr: "pipe", env: { ...process.env, INFER_CACHE: cache, HF_TOKEN: "", HF_HOME: cache, ...env } });
    const [stdout, stderr, code] = await Promise.all([new Response(p.stdout).text(),
      new Response(p.stderr).text(), p.exited]);
    return { code, stdout, stderr };
  }
  const greedy = ["-n", "6", "--temp", "0", "--ignore-eos", "-q", "the cat"];

  test("pull, run offline, models with its source, rm; -m pulls what is not cached", async () => {
    const online = { HF_ENDPOINT: hub.url }, offline = { HF_ENDPOINT: "http://127.0.0.1:9" };
    const pulled = await infer(online, "pull", "acme/tiny-GGUF:Q8_0");
    expect(pulled.code).toBe(0);
    const path = join(cache, "models", "acme/tiny-GGUF/tiny-Q8_0.gguf");
    expect(pulled.stdout).toBe(`${path}\n`);
    // off a terminal: a line per tenth, then what landed
    expect(pulled.stderr).toStartWith("fetching acme/tiny-GGUF/tiny-Q8_0.gguf: 0.0 / 0.");
    expect(pulled.stderr).toContain("MB (100%)\npulled acme/tiny-GGUF/tiny-Q8_0.gguf\n");

    const byRef = await infer(offline, "run", "-m", "acme/tiny-GGUF:Q8_0", ...greedy);
    expect(byRef.code).toBe(0);
    expect(byRef.stdout).toBe((await infer(offline, "run", "-m", path, ...greedy)).stdout);

    const listed = await infer(offline, "models");
    expect(listed.stdout).toMatch(new RegExp(`^NAME +SIZE +ARCH +QUANT +PARAMS +SOURCE\n` +
      `acme/tiny-GGUF/tiny-Q8_0\\.gguf +[\\d.]+ KB +gemma3 +\\S+ +\\S+ +${hub.url}/acme/tiny-GGUF@0123456\n$`));

    const unpulled = await infer(offline, "run", "-m", "acme/tiny-GGUF:Q4_K_M", ...greedy);
    expect(unpulled.code).toBe(1);
    expect(unpulled.stderr).toMatch(/^infer run: cannot reach the Hub at http:\/\/127\.0\.0\.1:9: .* \(HF_ENDPOINT names another\)\n$/);
    const pulledOnUse = await infer(online, "run", "-m", "acme/tiny-GGUF:Q4_K_M", ...greedy);
    expect(pulledOnUse.code).toBe(0);
    expect(pulledOnUse.stderr).toContain("fetching acme/tiny-GGUF/tiny-Q4_K_M.gguf: ");

    const gated = await infer(online, "pull", "acme/gated-GGUF");
    expect(gated.code).toBe(1);
    expect(gated.stderr).toStartWith("infer pull: acme/gated-GGUF needs a token: it is gated or private");
    expect(gated.stderr.split("\n").length).toBe(2);

    expect((await infer(offline, "models", "rm", "acme/tiny-GGUF:Q8_0")).code).toBe(0);
    expect(cachedModelFiles()).toEqual(["acme/tiny-GGUF/tiny-Q4_K_M.gguf"]);
    const missing = await infer(offline, "models", "rm", "acme/tiny-GGUF:Q8_0");
    expect(missing.code).toBe(1);
    expect(missing.stderr).toBe("infer models: no cached model \"acme/tiny-GGUF:Q8_0\" ('infer models' lists them by name)\n");
  }, 60_000);

  test("loadModel pulls a Hub model and reports the download to onDownloadProgress", async () => {
    const { loadModel } = await import("../ts/api/index.ts");
    const savedEndpoint = process.env.HF_ENDPOINT;
    process.env.HF_ENDPOINT = hub.url;
    try {
      const seen: [number, number][] = [];
      await using model = await loadModel("acme/split-GGUF:Q4_K_M", { threads: 2, contextLength: 64,
        onDownloadProgress: (r, t) => seen.push([r, t]) });
      const total = parts.reduce((sum, p) => sum + p.length, 0);
      expect(seen.at(-1)).toEqual([total, total]);
      expect(model.info.path.endsWith("tiny-Q4_K_M-00001-of-00003.gguf")).toBe(true);
      const split = await model.complete([2, 270, 271], { maxTokens: 6, temperature: 0, ignoreEos: true });
      await using whole = await loadModel(join(work, "whole.gguf"), { threads: 2, contextLength: 64 });
      const reference = await whole.complete([2, 270, 271], { maxTokens: 6, temperature: 0, ignoreEos: true });
      expect(split.tokens).toEqual(reference.tokens);
    } finally {
      if (savedEndpoint === undefined) delete process.env.HF_ENDPOINT;
      else process.env.HF_ENDPOINT = savedEndpoint;
    }
  }, 60_000);
});
