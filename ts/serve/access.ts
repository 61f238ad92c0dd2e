// Who may use the server. With an API key, /v1/* needs `Authorization: Bearer KEY`, compared in
// constant time through fixed-size digests (so neither the key's bytes nor its length show in
// the time a refusal takes). Without one, the server trusts whoever can reach it, so it must be
// sure a request does not come from a web page the user happens to have open:
// - DNS rebinding: a page at http://evil.example:8080 whose name then resolves to 127.0.0.1
//   sends `Host: evil.example:8080`; the server answers only Hosts that name it (localhost, an IP
//   address) with its own port.
// - Cross-site requests: a page may POST a "simple" request to any address without CORS; the
//   server refuses a request whose Origin is not its own (or that the browser marks cross-site
//   with Sec-Fetch-Site) unless the operator allowed that origin with --cors.
// /health and /metrics are not checked (server.ts), as they need no key either.
import { createHash, timingSafeEqual } from "node:crypto";
import { isIP } from "node:net";
import { quote } from "../errors.ts";
import { ApiError } from "./protocol.ts";

export interface AccessOptions {
  readonly apiKey: string | null;
  /** Origins whose pages may call the server (CORS); "*": any. */
  readonly corsOrigins: readonly string[];
  /** The address the server listens on (an IP or a name), to accept it in Host. */
  readonly host: string;
  readonly port: number;
}

const digest = (text: string) => createHash("sha256").update(text).digest();

export class Access {
  private readonly keyDigest: Buffer | null;
  private readonly cors: ReadonlySet<string>;
  private readonly host: string;

  constructor(private readonly o: AccessOptions) {
    this.keyDigest = o.apiKey ? digest(o.apiKey) : null;
    this.cors = new Set(o.corsOrigins.map((c) => (c === "*" ? c : c.toLowerCase())));
    this.host = o.host.toLowerCase().replace(/^\[(.*)\]$/, "$1");
  }

  /** Whether /v1/* requests need the API key. */
  get keyed(): boolean {
    return this.keyDigest !== null;
  }

  /** Throws 401 unless the request carries the API key (where one is set). */
  checkKey(req: Request): void {
    if (!this.keyDigest) return;
    const m = /^Bearer\s+(.+)$/i.exec(req.headers.get("authorization") ?? "");
    if (!m || !timingSafeEqual(digest(m[1].trim()), this.keyDigest)) {
      throw new ApiError(401, "the API key is missing or wrong", null, "invalid_api_key");
    }
  }

  /**
   * Throws 403 for a request that names another server in Host (without an API key) or that a
   * browser sends from a page of another origin not allowed by --cors.
   */
  checkOrigin(req: Request): void {
    const host = req.headers.get("host");
    // No Host: not a browser (they always send one), so neither attack applies.
    if (!this.keyDigest && host !== null && !this.namesThisServer(host)) {
      throw new ApiError(403, `the Host header ${quote(host)} does not name this server; without ` +
        `--api-key only localhost or an IP address with port ${this.o.port} is answered (set ` +
        "a key to serve other names)", null, "forbidden_host", "permission_error");
    }
    const origin = req.headers.get("origin");
    const site = req.headers.get("sec-fetch-site");
    const crossSite = site === "cross-site" || site === "same-site";
    if (origin === null ? crossSite : !this.sameOrigin(origin, host) && !this.allowed(origin)) {
      const from = origin === null ? "a cross-site page" : `origin ${quote(origin)}`;
      throw new ApiError(403, `cross-origin requests are refused (${from}); start the server ` +
        "with --cors ORIGIN to allow a web page's origin", null,
        "forbidden_origin", "permission_error");
    }
  }

  /** The CORS headers for a response to `req` (none unless its origin was allowed). */
  corsHeaders(req: Request): Record<string, string> {
    const origin = req.headers.get("origin");
    if (origin === null || !this.allowed(origin)) return {};
    return { "access-control-allow-origin": this.cors.has("*") ? "*" : origin, vary: "Origin",
      "access-control-expose-headers": "retry-after" };
  }

  /** The answer to a CORS preflight (OPTIONS with Access-Control-Request-Method), or null. */
  preflight(req: Request): Response | null {
    if (req.method !== "OPTIONS" || !req.headers.has("access-control-request-method")) return null;
    const origin = req.headers.get("origin");
    if (origin === null || !this.allowed(origin)) return null;
    const asked = req.headers.get("access-control-request-headers") ?? "";
    return new Response(null, { status: 204, headers: {
      ...this.corsHeaders(req),
      "access-control-allow-methods": "GET, POST, OPTIONS",
      // Headers are names: a list of tokens, bounded, echoed only if it is one.
      ...(/^[\w\-, ]{0,2000}$/.test(asked) && asked !== ""
        ? { "access-control-allow-headers": asked } : {}),
      "access-control-max-age": "600",
    } });
  }

  private allowed(origin: string): boolean {
    return this.cors.has("*") || this.cors.has(origin.toLowerCase());
  }

  private sameOrigin(origin: string, host: string | null): boolean {
    return host !== null && origin.toLowerCase() === `http://${host.toLowerCase()}`;
  }

  /** Whether a Host header names this server: its port, and localhost, an IP or its address. */
  private namesThisServer(host: string): boolean {
    const m = /^(\[[0-9a-f:.]+\]|[^:[\]]+)(?::(\d{1,5}))?$/i.exec(host.trim());
    if (!m) return false;
    const name = m[1].toLowerCase().replace(/^\[(.*)\]$/, "$1");
    if (Number(m[2] ?? 80) !== this.o.port) return false;
    // An IP address cannot be rebound to another host, unlike a name.
    return isIP(name) !== 0 || name === "localhost" || name.endsWith(".localhost") ||
      name === this.host;
  }
}
