// A Hugging Face Hub on localhost for the pull tests, shaped as the real one answers: the tree
// API (/api/models/<repo>/tree/<rev>?recursive=true, paged by a Link header), the resolve URLs
// (HEAD and GET: a 302 to a CDN on another port, with x-linked-etag (the SHA-256),
// x-linked-size, x-repo-commit and an ETag), 401/403 for a gated repo without or with the wrong
// token, 404 with x-error-code RepoNotFound or EntryNotFound. The CDN honours Range and can be
// told to cut a blob's connection half way, or to serve bytes other than the advertised ones.
// Every request is recorded, with its Range and Authorization.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";

export interface FakeRepo {
  /** Path in the repo → contents. */
  readonly files: Record<string, Uint8Array>;
  /** Needs `Bearer hf_good`: 401 without a token, 403 with another. */
  readonly gated?: boolean;
}

export interface HubRequest {
  readonly server: "hub" | "cdn";
  readonly method: string;
  readonly path: string;
  readonly range: string | null;
  readonly authorization: string | null;
}

export interface FakeHub {
  readonly url: string;
  readonly requests: HubRequest[];
  /** Blobs (by SHA-256) whose next `n` CDN answers stop half way: sha → n. */
  readonly cutHalfWay: Map<string, number>;
  /** Blobs (by SHA-256) whose next `n` CDN answers go quiet half way, the connection open. */
  readonly stallHalfWay: Map<string, number>;
  /** Blobs (by SHA-256) the CDN serves with one byte changed. */
  readonly corrupt: Set<string>;
  /** Tree API entries per page (default: all on one). */
  pageSize: number;
  stop(): void;
}

export const GOOD_TOKEN = "hf_good";
export const COMMIT = "0123456789abcdef0123456789abcdef01234567";

export function sha256Of(bytes: Uint8Array): string {
  return new Bun.CryptoHasher("sha256").update(bytes).digest("hex");
}

function listen(server: Server): Promise<string> {
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () =>
    resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`)));
}

export async function startFakeHub(repos: Record<string, FakeRepo>): Promise<FakeHub> {
  const blobs = new Map<string, Uint8Array>();
  for (const repo of Object.values(repos)) {
    for (const bytes of Object.values(repo.files)) blobs.set(sha256Of(bytes), bytes);
  }
  const requests: HubRequest[] = [];
  const cutHalfWay = new Map<string, number>(), stallHalfWay = new Map<string, number>();
  const corrupt = new Set<string>();
  const record = (server: "hub" | "cdn", req: { method?: string; url?: string;
    headers: Record<string, string | string[] | undefined> }) => requests.push({
    server, method: req.method ?? "", path: req.url ?? "",
    range: (req.headers.range as string | undefined) ?? null,
    authorization: (req.headers.authorization as string | undefined) ?? null,
  });

  const cdn = createServer((req, res) => {
    record("cdn", req);
    const sha = /^\/repos\/[0-9a-f]{2}\/([0-9a-f]{64})/.exec(req.url ?? "")?.[1];
    let bytes = sha ? blobs.get(sha) : undefined;
    if (!sha || !bytes) { res.writeHead(404).end("no such blob"); return; }
    if (corrupt.has(sha)) { bytes = bytes.slice(); bytes[bytes.length >> 1] ^= 0xff; }
    let from = 0;
    const range = /^bytes=(\d+)-$/.exec(String(req.headers.range ?? ""));
    if (range) {
      from = Number(range[1]);
      if (from >= bytes.length) {
        res.writeHead(416, { "content-range": `bytes */${bytes.length}` }).end();
        return;
      }
      res.writeHead(206, { "content-length": bytes.length - from, "accept-ranges": "bytes",
        "content-range": `bytes ${from}-${bytes.length - 1}/${bytes.length}` });
    } else {
      res.writeHead(200, { "content-length": bytes.length, "accept-ranges": "bytes" });
    }
    const half = from + ((bytes.length - from) >> 1);
    const cuts = cutHalfWay.get(sha) ?? 0, stalls = stallHalfWay.get(sha) ?? 0;
    if (cuts > 0) {
      cutHalfWay.set(sha, cuts - 1);
      res.write(bytes.subarray(from, half), () => setTimeout(() => req.socket.destroy(), 20));
      return;
    }
    if (stalls > 0) {
      stallHalfWay.set(sha, stalls - 1);
      res.write(bytes.subarray(from, half));
      return;
    }
    res.end(bytes.subarray(from));
  });
  const cdnUrl = await listen(cdn);

  const hub = { url: "", requests, cutHalfWay, stallHalfWay, corrupt, pageSize: Infinity } as FakeHub & { url: string };
  const server = createServer((req, res) => {
    record("hub", req);
    const url = new URL(req.url ?? "/", "http://x");
    const auth = req.headers.authorization;
    const deny = (repo: FakeRepo | undefined, name: string): boolean => {
      if (!repo?.gated || auth === `Bearer ${GOOD_TOKEN}`) return false;
      const message = `Access to model ${name} is restricted. You must have access to it and ` +
        "be authenticated to access it. Please log in.";
      res.writeHead(auth ? 403 : 401, { "x-error-code": "GatedRepo", "x-error-message": message,
        "content-type": "text/plain" }).end(message);
      return true;
    };
    const tree = /^\/api\/models\/([^/]+\/[^/]+)\/tree\/([^/]+)$/.exec(url.pathname);
    if (tree && req.method === "GET") {
      const repo = repos[tree[1]];
      if (!repo) {
        res.writeHead(404, { "x-error-code": "RepoNotFound" }).end("Repository not found");
        return;
      }
      if (deny(repo, tree[1])) return;
      const entries = Object.entries(repo.files).map(([path, bytes]) => ({
        type: "file", oid: sha256Of(bytes).slice(0, 40), size: bytes.length, path,
        lfs: { oid: sha256Of(bytes), size: bytes.length, pointerSize: 134 },
      }));
      const from = Number(url.searchParams.get("cursor") ?? 0);
      const page = entries.slice(from, from + hub.pageSize);
      const headers: Record<string, string> = { "content-type": "application/json" };
      if (from + page.length < entries.length) {
        headers.link = `<${hub.url}${url.pathname}?recursive=true&cursor=${from + page.length}>; rel="next"`;
      }
      res.writeHead(200, headers).end(JSON.stringify(page));
      return;
    }
    const resolve = /^\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(url.pathname);
    if (resolve && (req.method === "HEAD" || req.method === "GET")) {
      const repo = repos[resolve[1]];
      if (!repo) {
        res.writeHead(404, { "x-error-code": "RepoNotFound", "x-error-message": "Repository not found" }).end();
        return;
      }
      if (deny(repo, resolve[1])) return;
      const path = decodeURIComponent(resolve[3]);
      const bytes = repo.files[path];
      if (!bytes) {
        res.writeHead(404, { "x-error-code": "EntryNotFound",
          "x-error-message": "Entry not found" }).end();
        return;
      }
      const sha = sha256Of(bytes);
      res.writeHead(302, {
        location: `${cdnUrl}/repos/${sha.slice(0, 2)}/${sha}?response-content-disposition=x&Signature=s`,
        "x-linked-etag": `"${sha}"`, "x-linked-size": String(bytes.length), etag: `"${sha}"`,
        "x-repo-commit": COMMIT, "content-length": "0",
      }).end();
      return;
    }
    res.writeHead(404).end("not found");
  });
  hub.url = await listen(server);
  hub.stop = () => {
    server.closeAllConnections?.();
    cdn.closeAllConnections?.();
    server.close();
    cdn.close();
  };
  return hub;
}
