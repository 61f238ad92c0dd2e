// Method: the server driven as a hostile client would drive it, each abuse followed by a check
// that /health is ok and a normal completion still works. Servers on a tiny random Gemma run
// in-process (one open, one with an API key, one with short timeouts, one whose engine stalls
// through the test-only hook); raw TCP (test/support/raw-http.ts) sends what fetch() cannot. A
// child `infer serve` process takes what needs a process of its own: its resident memory under
// 200 stalled uploads, CORS from its flags, and SIGTERM during streams.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Subprocess } from "bun";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import type { Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startServer, type InferServer, type ServeOptions } from "../ts/serve/server.ts";
import { parseReplies, parseReply, rawExchange, rawRequest, type RawReply }
  from "./support/raw-http.ts";
import { tinyGemma3Gguf } from "./support/tiny-gguf.ts";

const KEY = "a-key-of-some-length";
const noEos = { 1: -100 };
let dir: string, modelPath: string;
let open: InferServer, keyed: InferServer;
/** Connections sending their headers a byte a second, for the whole file (408 ends them). */
let slowloris: Promise<RawReply>[] = [];

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "infer-hostile-"));
  modelPath = join(dir, "tiny.gguf");
  // wider than the default tiny shape, so that a long generation lasts seconds
  writeFileSync(modelPath, tinyGemma3Gguf({ shape: { layers: 4, embedding: 256, feedForward: 1024,
    heads: 4, kvHeads: 2, headDim: 64 } }));
  const common: ServeOptions = { modelPath, port: 0, threads: 2, backend: "cpu",
    contextLength: 4096 };
  [open, keyed] = await Promise.all([startServer(common),
    startServer({ ...common, apiKey: KEY })]);
  // Slowloris: every test below runs, and checks its server is healthy, while these trickle.
  const head = `GET /health HTTP/1.1\r\nHost: 127.0.0.1:${open.port}\r\nX-Pad: ${"a".repeat(60)}`;
  slowloris = Array.from({ length: 20 }, () => rawExchange(open.port, "G", {
    waitMs: 60_000, then: (socket) => {
      let i = 1;
      const timer = setInterval(() => {
        if (socket.destroyed || i >= head.length) clearInterval(timer);
        else socket.write(head[i++]);
      }, 1_000);
    },
  }));
});

afterAll(async () => {
  await Promise.all([open?.stop(), keyed?.stop()]);
  rmSync(dir, { recursive: true, force: true });
});

type ErrorBody = { error: { message: string; type: string; param: string | null;
  code: string | null } };

/** `res` is OpenAI's error object with `status`, its message one bounded line. */
async function expectError(res: Response, status: number): Promise<ErrorBody["error"]> {
  expect(res.status).toBe(status);
  expect(res.headers.get("content-type")).toBe("application/json");
  const { error } = (await res.json()) as ErrorBody;
  expect(typeof error.message).toBe("string");
  expect(error.message.length).toBeLessThan(400);
  expect(error.message).not.toMatch(/[\n\r\u0000-\u001f]/);
  return error;
}

const post = (server: InferServer, path: string, body: string | Uint8Array,
  headers: Record<string, string> = {}) =>
  fetch(`${server.url}${path}`, { method: "POST", body,
    headers: { "content-type": "application/json", ...headers } });

/** /health is ok and a two-token completion works. */
async function expectHealthy(server: InferServer, headers: Record<string, string> = {}) {
  const h = await fetch(`${server.url}/health`);
  expect(h.status).toBe(200);
  expect(((await h.json()) as { status: string }).status).toBe("ok");
  const res = await post(server, "/v1/completions", JSON.stringify({ model: "tiny",
    prompt: "the cat", max_tokens: 2, logit_bias: noEos }), headers);
  expect(res.status).toBe(200);
  const body = (await res.json()) as { usage: { completion_tokens: number } };
  expect(body.usage.completion_tokens).toBe(2);
}

describe("bodies a client should not send", () => {
  test("malformed JSON, non-objects, invalid UTF-8, raw NUL: 400 invalid_json", async () => {
    const deep = "[".repeat(100_000);
    const bodies: (string | Uint8Array)[] = [
      "", "{nope", "[1]", "null", "\"text\"", "{\"model\":", deep, deep + "]".repeat(100_000),
      `{"model":"tiny","prompt":${deep}`, `{"model":"tiny","x":${"{\"a\":".repeat(50_000)}1`,
      new Uint8Array([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x3a, 0x31, 0x7d]), // {"\xff\xfe":1}
      `{"model":"tiny","prompt":"a\u0000b"}`, // a raw NUL inside a string is not JSON
      `{"model": tiny${"a".repeat(100_000)}}`,
      "{\u001b]0;title\u0007}", // the parser's message names the token: a terminal escape
    ];
    for (const body of bodies) {
      const error = await expectError(await post(open, "/v1/completions", body), 400);
      expect(error.code).toBe("invalid_json");
      await expectHealthy(open);
    }
  });

  test("wrong types for every field of both endpoints: 400 naming the field", async () => {
    const wrong: [string, unknown[]][] = [
      ["model", [1, true, [], {}, ""]],
      ["max_tokens", ["2", true, [], {}, 1.5, -1]],
      ["temperature", ["1", true, [], {}, -1]],
      ["top_p", ["1", true, [], {}, 2]],
      ["n", ["1", true, 1.5, {}, 0]],
      ["stream", ["true", 1, {}, []]],
      ["stream_options", ["x", 1, true, []]],
      ["stop", [1, true, {}, [1], [""], ["a", "b", "c", "d", "e"]]],
      ["seed", ["1", true, 1.5, {}]],
      ["presence_penalty", ["0", true, {}, []]],
      ["frequency_penalty", ["0", true, {}, []]],
      ["logit_bias", [1, "x", [], { abc: 1 }, { 1: "x" }, { 1: 1e9 }]],
      ["response_format", [1, "json", [], { type: 1 }, { type: "json_schema" },
        { type: "json_schema", json_schema: 1 },
        { type: "json_schema", json_schema: { schema: 1 } }]],
    ];
    const chatOnly: [string, unknown[]][] = [
      ["messages", [1, "hi", {}, [], [1], [{ role: 1, content: "x" }],
        [{ role: "user", content: 1 }], [{ role: "user", content: [{ type: "image_url" }] }]]],
      ["max_completion_tokens", ["2", true, {}, -1]],
    ];
    const completionOnly: [string, unknown[]][] = [
      ["prompt", [1, true, {}, [1], ["a", "b"], null]],
    ];
    const base = {
      chat: { model: "tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 2 },
      completion: { model: "tiny", prompt: "the cat", max_tokens: 2 },
    };
    for (const kind of ["chat", "completion"] as const) {
      const fields = [...wrong, ...(kind === "chat" ? chatOnly : completionOnly)];
      const path = kind === "chat" ? "/v1/chat/completions" : "/v1/completions";
      for (const [field, values] of fields) {
        for (const value of values) {
          const res = await post(open, path, JSON.stringify({ ...base[kind], [field]: value }));
          const error = await expectError(res, 400);
          // the field, or the member of it that is wrong (stream_options.include_usage)
          expect(`${field} ${JSON.stringify(value)}: ${error.param}`)
            .toMatch(new RegExp(`^${field} .*: ${field}`));
        }
        await expectHealthy(open);
      }
    }
  });

  test("deeply nested values inside fields: 400, never a crash", async () => {
    const nest = (depth: number) => "[".repeat(depth) + "]".repeat(depth);
    const cases = [
      `{"model":"tiny","prompt":"x","stop":${nest(50_000)}}`,
      `{"model":"tiny","messages":[{"role":"user","content":${nest(50_000)}}]}`,
      `{"model":"tiny","prompt":"x","logit_bias":{"1":${nest(50_000)}}}`,
      `{"model":"tiny","prompt":${nest(50_000)}}`,
    ];
    for (const body of cases) {
      const url = body.includes("messages") ? "/v1/chat/completions" : "/v1/completions";
      await expectError(await post(open, url, body), 400);
      await expectHealthy(open);
    }
  });

  test("escaped NUL and unusual Unicode in a prompt are just text", async () => {
    for (const prompt of ["a\u0000b", "\u202e\u0007\ud83d\ude00", "\uffff\ufffe"]) {
      const res = await post(open, "/v1/completions", JSON.stringify({ model: "tiny", prompt,
        max_tokens: 2, logit_bias: noEos }));
      expect(res.status).toBe(200);
    }
    await expectHealthy(open);
  });

  test("a body cut short by the client closing: a 400, not an internal error", async () => {
    const counted = async (status: number) => (await metric(open,
      `infer_requests_total{endpoint="/v1/completions",status="${status}"}`)) || 0;
    const [bad, internal] = [await counted(400), await counted(500)];
    await rawExchange(open.port, rawRequest("POST", "/v1/completions", {
      host: `127.0.0.1:${open.port}`, "content-type": "application/json",
      "content-length": 1000 }, "{\"model\":"),
    { then: (s) => setTimeout(() => s.destroy(), 100) });
    await until(async () => (await counted(400)) === bad + 1);
    expect(await counted(500)).toBe(internal);
    await expectHealthy(open);
  }, 20_000);

  test("huge bodies: 413 with the error object, declared or chunked, and the connection closes",
    async () => {
      const big = await post(open, "/v1/completions", "x".repeat((1 << 20) + 1));
      expect((await expectError(big, 413)).code).toBe("request_too_large");
      const huge = await post(open, "/v1/completions", "x".repeat(6 << 20));
      await expectError(huge, 413);
      // A declared length of a terabyte with almost nothing sent: refused at once.
      const declared = await rawExchange(open.port, rawRequest("POST", "/v1/completions",
        { host: `127.0.0.1:${open.port}`, "content-length": 1e12 }, "{}"));
      expect(declared.closed).toBe(true);
      expect(parseReply(declared.text)?.status).toBe(413);
      // Chunked, with no length announced: cut off once past the limit.
      const piece = "a".repeat(1 << 16);
      const chunked = await rawExchange(open.port, rawRequest("POST", "/v1/completions",
        { host: `127.0.0.1:${open.port}`, "transfer-encoding": "chunked" }), {
        then: (s) => { for (let i = 0; i < 40; i++) s.write(`10000\r\n${piece}\r\n`); },
      });
      const reply = parseReply(chunked.text)!;
      expect(reply.status).toBe(413);
      expect((JSON.parse(reply.body) as ErrorBody).error.code).toBe("request_too_large");
      expect(chunked.closed).toBe(true);
      await expectHealthy(open);
    });
});

describe("requests that are not quite HTTP", () => {
  test("HTTP/1.0 without Host: JSON answers, never an HTML error page", async () => {
    for (const [server, path, status] of [[open, "/health", 200], [open, "/v1/models", 200],
      [open, "/nowhere", 404], [keyed, "/v1/models", 401]] as const) {
      const r = await rawExchange(server.port, `GET ${path} HTTP/1.0\r\n\r\n`);
      const reply = parseReply(r.text)!;
      expect(reply.status).toBe(status);
      expect(reply.headers.get("content-type")).toBe("application/json");
      expect(r.text).not.toContain("<html");
      expect(r.text.length).toBeLessThan(2000);
      JSON.parse(reply.body);
    }
    await expectHealthy(open);
  });

  test("bad percent-encoding is 400, long paths are quoted short, NUL and raw bytes refused",
    async () => {
      for (const path of ["/v1/models/%E0%A4%A", "/v1/models/%FF", "/v1/models/%"]) {
        const error = await expectError(await fetch(`${open.url}${path}`), 400);
        expect(error.code).toBe("invalid_path");
      }
      const long = await expectError(await fetch(`${open.url}/${"x".repeat(8000)}`), 404);
      expect(long.message.length).toBeLessThan(200);
      const escape = await expectError(await fetch(`${open.url}/v1/models/%1B%5B31m`), 404);
      expect(escape.message).toContain("\\u001b");
      // Bytes the HTTP parser refuses, a head too large, a target that is not a path: the
      // error object, then the connection closes.
      const host = `127.0.0.1:${open.port}`;
      for (const [bytes, status, code] of [
        ["GET /a\u0000b HTTP/1.1\r\nHost: x\r\n\r\n", 400, "invalid_http"],
        ["GET / HTTP/1.1\r\nHost: x\r\nX-Bad: a\u0000b\r\n\r\n", 400, "invalid_http"],
        ["\u0016\u0003\u0001\u0002\u0000", 400, "invalid_http"],
        ["NONSENSE\r\n\r\n", 400, "invalid_http"],
        ["GET /\u00ff\u00fe HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 400,
          "invalid_http"],
        [`GET / HTTP/1.1\r\nHost: ${host}\r\nX-Pad: ${"a".repeat(20_000)}\r\n\r\n`, 431,
          "headers_too_large"],
        [`GET http://[bad HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`, 400,
          "invalid_path"],
      ] as const) {
        const r = await rawExchange(open.port, bytes);
        expect(r.closed).toBe(true);
        const reply = parseReply(r.text)!;
        expect(`${JSON.stringify(bytes.slice(0, 20))} ${reply.status}`)
          .toBe(`${JSON.stringify(bytes.slice(0, 20))} ${status}`);
        expect(reply.headers.get("content-type")).toBe("application/json");
        expect((JSON.parse(reply.body) as ErrorBody).error.code).toBe(code);
      }
      await expectHealthy(open);
    });

  test("a request pipelined behind a POST is answered after it, in order", async () => {
    const body = JSON.stringify({ model: "tiny", prompt: "the", max_tokens: 20,
      logit_bias: noEos });
    const host = `127.0.0.1:${open.port}`;
    // One write: the GET arrives while the POST is still generating.
    const r = await rawExchange(open.port, rawRequest("POST", "/v1/completions",
      { host, "content-type": "application/json", "content-length": body.length }, body) +
      rawRequest("GET", "/health", { host, connection: "close" }), { waitMs: 30_000 });
    expect(r.closed).toBe(true);
    const replies = parseReplies(r.text);
    expect(replies.map((reply) => reply.status)).toEqual([200, 200]);
    const completion = JSON.parse(replies[0].body) as { usage: { completion_tokens: number } };
    expect(completion.usage.completion_tokens).toBe(20);
    expect((JSON.parse(replies[1].body) as Health).status).toBe("ok");
    await expectHealthy(open);
  });

  test("a client that pipelines behind a long POST and goes away: the generation is cancelled",
    async () => {
      const body = JSON.stringify({ model: "tiny", prompt: "the", max_tokens: 4000,
        logit_bias: noEos });
      const host = `127.0.0.1:${open.port}`;
      const cancelled = await metric(open, "infer_requests_cancelled_total");
      let client: Socket | null = null;
      const r = rawExchange(open.port, rawRequest("POST", "/v1/completions",
        { host, "content-type": "application/json", "content-length": body.length }, body) +
        rawRequest("GET", "/health", { host }), { waitMs: 30_000, then: (s) => (client = s) });
      await until(async () => (await health(open)).running === 1);
      client!.destroy();
      expect((await r).text).toBe(""); // neither answered: the first is not done
      await until(async () => (await health(open)).running === 0);
      expect(await metric(open, "infer_requests_cancelled_total")).toBe(cancelled + 1);
      await expectHealthy(open);
    });
});

describe("who may call", () => {
  const get = (server: InferServer, headers: Record<string, string>, path = "/v1/models") =>
    rawExchange(server.port, rawRequest("GET", path, { connection: "close", ...headers }))
      .then((r) => parseReply(r.text)!);

  test("without an API key, only Hosts that name this server", async () => {
    const port = open.port;
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, `[::1]:${port}`,
      `LOCALHOST:${port}`, `app.localhost:${port}`, `10.1.2.3:${port}`]) {
      expect(`${host} ${(await get(open, { host })).status}`).toBe(`${host} 200`);
    }
    for (const host of [`evil.example:${port}`, "evil.example", `127.0.0.1:${port + 1}`,
      "127.0.0.1", `localhost.evil.example:${port}`, "", "a".repeat(5000)]) {
      const reply = await get(open, { host });
      expect(`${host.slice(0, 40)} ${reply.status}`).toBe(`${host.slice(0, 40)} 403`);
      expect((JSON.parse(reply.body) as ErrorBody).error.code).toBe("forbidden_host");
    }
    // With a key, the key is what counts: a proxy's Host is fine.
    const proxied = await get(keyed, { host: "api.example", authorization: `Bearer ${KEY}` });
    expect(proxied.status).toBe(200);
    await expectHealthy(open);
  });

  test("cross-site browser requests are refused and get no CORS headers", async () => {
    const host = `127.0.0.1:${open.port}`;
    const before = await metric(open, "infer_tokens_generated_total");
    for (const headers of [{ origin: "http://evil.example" }, { origin: "null" },
      { origin: `http://localhost:${open.port + 1}` }, { "sec-fetch-site": "cross-site" },
      { "sec-fetch-site": "same-site" }] as Record<string, string>[]) {
      const body = JSON.stringify({ model: "tiny", prompt: "x", max_tokens: 4 });
      const res = await post(open, "/v1/completions", body, { ...headers, host,
        "content-type": "text/plain" });
      expect((await expectError(res, 403)).code).toBe("forbidden_origin");
      expect(res.headers.get("access-control-allow-origin")).toBeNull();
    }
    expect(await metric(open, "infer_tokens_generated_total")).toBe(before); // nothing ran
    const preflight = await fetch(`${open.url}/v1/completions`, { method: "OPTIONS", headers: {
      origin: "http://evil.example", "access-control-request-method": "POST" } });
    expect(preflight.status).toBe(403);
    expect(preflight.headers.get("access-control-allow-origin")).toBeNull();
    // The server's own origin (a page it served) and navigations are fine.
    const same = await get(open, { host, origin: `http://${host}`,
      "sec-fetch-site": "same-origin" });
    expect(same.status).toBe(200);
    expect((await get(open, { host, "sec-fetch-site": "none" })).status).toBe(200);
    await expectHealthy(open);
  });

  test("API keys: right key only; wrong, shorter, longer, odd bytes and missing ones are 401",
    async () => {
      const host = `127.0.0.1:${keyed.port}`;
      const ok = await get(keyed, { host, authorization: `Bearer ${KEY}` });
      expect(ok.status).toBe(200);
      expect((await get(keyed, { host, authorization: `bearer   ${KEY}  ` })).status).toBe(200);
      for (const authorization of [`Bearer ${KEY.replace("a", "b")}`, `Bearer ${KEY.slice(1)}`,
        `Bearer ${KEY}x`, "Bearer", `Basic ${KEY}`, `Bearer ${"k".repeat(6000)}`,
        "Bearer \u00ff\u00fe", undefined]) {
        const headers: Record<string, string> = { host };
        if (authorization !== undefined) headers.authorization = authorization;
        const reply = await get(keyed, headers);
        expect(reply.status).toBe(401);
        expect((JSON.parse(reply.body) as ErrorBody).error.code).toBe("invalid_api_key");
      }
      // /health and /metrics need no key
      expect((await get(keyed, { host }, "/health")).status).toBe(200);
      await expectHealthy(keyed, { authorization: `Bearer ${KEY}` });
    });
});

describe("slow and stalled clients", () => {
  let short: InferServer;
  beforeAll(async () => {
    short = await startServer({ modelPath, port: 0, threads: 2, backend: "cpu",
      bodyTimeoutMs: 1_000, idleTimeoutSeconds: 2 });
  });
  afterAll(() => short?.stop());

  test("a stalled or trickled body gets 408 at the body deadline and the connection closes",
    async () => {
      const head = (length: number) => rawRequest("POST", "/v1/completions", {
        host: `127.0.0.1:${short.port}`, "content-type": "application/json",
        "content-length": length });
      const stalled = rawExchange(short.port, head(100) + "{\"model\":", { waitMs: 10_000 });
      const trickled = rawExchange(short.port, head(10_000), { waitMs: 10_000, then: (s) => {
        const timer = setInterval(() => (s.destroyed ? clearInterval(timer) : s.write(" ")), 50);
      } });
      for (const r of await Promise.all([stalled, trickled])) {
        expect(r.closed).toBe(true);
        const reply = parseReply(r.text)!;
        expect(reply.status).toBe(408);
        expect((JSON.parse(reply.body) as ErrorBody).error.code).toBe("request_timeout");
        expect(r.ms).toBeGreaterThan(900);
        expect(r.ms).toBeLessThan(6_000);
      }
      expect(await metric(short, "infer_request_body_bytes_in_flight")).toBe(0);
      await expectHealthy(short);
    });

  test("a connection kept alive after a generation is closed once idle", async () => {
    // Nothing times out while a request is answered (a generation may say nothing for a long
    // while); once it is answered, streamed or not, the connection's idle timeout runs.
    for (const stream of [false, true]) {
      const body = JSON.stringify({ model: "tiny", prompt: "the", max_tokens: 3, stream });
      const r = await rawExchange(short.port, rawRequest("POST", "/v1/completions", {
        host: `127.0.0.1:${short.port}`, "content-type": "application/json",
        "content-length": body.length }, body), { waitMs: 20_000 });
      expect(r.text).toMatch(/^HTTP\/1\.1 200/);
      expect(r.text).toContain(stream ? "[DONE]" : "completion_tokens");
      // Closed by the server once idle (it would stay open for good with no idle timeout), not
      // announced as the answer's last (no bound below: the server closes a little after the
      // timeout it announces, so that a client that heeds it closes first).
      expect(r.text.toLowerCase()).not.toContain("connection: close");
      expect(r.closed).toBe(true);
    }
  }, 45_000);
});

describe("the watchdog", () => {
  test("/health and /metrics report a step that hangs; the real slot count from the start",
    async () => {
      const stalling = await startServer({ modelPath, port: 0, threads: 2, backend: "cpu",
        parallel: 2, stepTimeoutMs: 300, stallForTests: { atStep: 3, ms: 2_500 } });
      try {
        expect(await health(stalling)).toMatchObject({ status: "ok", slots: 2, slots_busy: 0 });
        expect(await metric(stalling, "infer_slots")).toBe(2);
        const first = post(stalling, "/v1/completions", JSON.stringify({ model: "tiny",
          prompt: "the cat", max_tokens: 8, logit_bias: noEos }));
        let stalled: Response | null = null;
        await until(async () => {
          stalled = await fetch(`${stalling.url}/health`);
          return stalled.status === 503;
        });
        const h = (await stalled!.json()) as { status: string; reason: string };
        expect(h.status).toBe("stalled");
        expect(h.reason).toMatch(/one step for \d+\.\d s \(the step timeout is 0\.3 s\)/);
        expect(await metric(stalling, "infer_engine_stalled")).toBe(1);
        expect(await metric(stalling, "infer_engine_busy_seconds")).toBeGreaterThan(0.3);
        // New work is refused at once rather than queued behind a stuck engine.
        const refused = await post(stalling, "/v1/completions", JSON.stringify({ model: "tiny",
          prompt: "x", max_tokens: 2 }));
        expect((await expectError(refused, 503)).code).toBe("engine_unavailable");
        // The step ends: the first request completes, and all is well again.
        const done = (await (await first).json()) as { usage: { completion_tokens: number } };
        expect(done.usage.completion_tokens).toBe(8);
        expect(await metric(stalling, "infer_engine_stalled")).toBe(0);
        await expectHealthy(stalling);
      } finally {
        await stalling.stop();
      }
    });
});

type Health = { status: string; running: number; queue_depth: number; slots: number };

async function health(server: InferServer | string): Promise<Health> {
  const url = typeof server === "string" ? server : server.url;
  return (await (await fetch(`${url}/health`)).json()) as Health;
}

async function metric(server: InferServer | string, name: string): Promise<number> {
  const url = typeof server === "string" ? server : server.url;
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  return Number(line?.slice(name.length + 1));
}

/** Polls `check` every 10 ms until it holds (at most `ms`). */
async function until(check: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const end = performance.now() + ms;
  while (!(await check())) {
    if (performance.now() > end) throw new Error("timed out waiting for the server");
    await Bun.sleep(10);
  }
}

describe("a child `infer serve` process", () => {
  let child: Subprocess<"ignore", "ignore", "pipe">;
  let url = "", port = 0, stderr = "";

  beforeAll(async () => {
    child = Bun.spawn([process.execPath, "run", "infer.ts", "serve", "-m", modelPath, "--port", "0",
      "--parallel", "3", "--queue", "4", "-c", "8192", "-t", "2", "--backend", "cpu",
      "--body-timeout", "2", "--shutdown-timeout", "3", "--cors", "http://app.example"], {
      cwd: join(import.meta.dir, ".."), stdout: "ignore", stderr: "pipe", stdin: "ignore" });
    void (async () => {
      for await (const piece of child.stderr.pipeThrough(new TextDecoderStream())) stderr += piece;
    })();
    await until(async () => /at (http:\S+)\/v1/.test(stderr), 30_000);
    url = /at (http:\S+)\/v1/.exec(stderr)![1];
    port = Number(new URL(url).port);
  }, 40_000);
  afterAll(() => { child?.kill("SIGKILL"); });

  test("--cors: that origin's preflight and requests get CORS headers, others 403", async () => {
    const preflight = await fetch(`${url}/v1/chat/completions`, { method: "OPTIONS", headers: {
      origin: "http://app.example", "access-control-request-method": "POST",
      "access-control-request-headers": "authorization, content-type, x-stainless-os" } });
    expect(preflight.status).toBe(204);
    expect(preflight.headers.get("access-control-allow-origin")).toBe("http://app.example");
    expect(preflight.headers.get("access-control-allow-methods")).toContain("POST");
    expect(preflight.headers.get("access-control-allow-headers")).toContain("x-stainless-os");
    const res = await fetch(`${url}/v1/completions`, { method: "POST", headers: {
      origin: "http://app.example", "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", prompt: "the", max_tokens: 2 }) });
    expect(res.status).toBe(200);
    expect(res.headers.get("access-control-allow-origin")).toBe("http://app.example");
    const other = await fetch(`${url}/v1/models`, { headers: { origin: "http://other.example" } });
    expect(other.status).toBe(403);
    expect(other.headers.get("access-control-allow-origin")).toBeNull();
  });

  test("200 uploads of 1 MB that stall: memory stays bounded, each gets 408 or 503 and closes",
    async () => {
      Bun.gc(true);
      const rssBefore = await metric(url, "infer_resident_memory_bytes");
      const payload = Buffer.alloc(1_000_000, 0x20); // JSON whitespace
      const head = rawRequest("POST", "/v1/completions", { host: `127.0.0.1:${port}`,
        "content-type": "application/json", "content-length": payload.length + 1 });
      let settled = false, rssPeak = 0, inFlightPeak = 0;
      const uploads = Promise.all(Array.from({ length: 200 }, () => rawExchange(port, head, {
        waitMs: 20_000, then: (socket) => socket.write(payload) })))
        .finally(() => { settled = true; });
      while (!settled) {
        rssPeak = Math.max(rssPeak, await metric(url, "infer_resident_memory_bytes"));
        inFlightPeak = Math.max(inFlightPeak,
          await metric(url, "infer_request_body_bytes_in_flight"));
        await Bun.sleep(100);
      }
      const statuses = new Map<number, number>();
      for (const r of await uploads) {
        expect(r.closed).toBe(true);
        const reply = parseReply(r.text);
        statuses.set(reply?.status ?? 0, (statuses.get(reply?.status ?? 0) ?? 0) + 1);
        const code = reply && (JSON.parse(reply.body) as ErrorBody).error.code;
        if (reply) expect(code).toMatch(/^(request_timeout|server_busy)$/);
      }
      console.log(`stalled uploads: ${JSON.stringify([...statuses])}, resident memory ` +
        `${(rssBefore / 2 ** 20).toFixed(0)} MiB, at most ${(rssPeak / 2 ** 20).toFixed(0)} MiB; ` +
        `bodies in flight at most ${(inFlightPeak / 2 ** 20).toFixed(1)} MiB`);
      expect([...statuses.keys()].every((s) => s === 408 || s === 503)).toBe(true);
      expect(statuses.get(408)).toBeGreaterThan(0);
      expect(inFlightPeak).toBeLessThanOrEqual(16 << 20);
      expect(rssPeak - rssBefore).toBeLessThan(64 << 20);
      expect(await metric(url, "infer_request_body_bytes_in_flight")).toBe(0);
      expect(await health(url)).toMatchObject({ status: "ok" });
    }, 30_000);

  test("SIGTERM: waiting requests get 503, running ones finish or end at the deadline with a " +
    "final chunk and [DONE], and the process exits 0", async () => {
    const body = (maxTokens: number, stream: boolean) => JSON.stringify({ model: "tiny",
      // speculation off: the tiny model's loops would draft 8,000 tokens within the deadline
      prompt: "the", max_tokens: maxTokens, logit_bias: noEos, spec: "off", stream,
      ...(stream ? { stream_options: { include_usage: true } } : {}) });
    const send = (maxTokens: number, stream: boolean) => fetch(`${url}/v1/completions`, {
      method: "POST", headers: { "content-type": "application/json" },
      body: body(maxTokens, stream) });
    const events = async (res: Promise<Response>) => {
      const text = await (await res).text();
      return text.split("\n\n").filter(Boolean).map((e) => e.replace(/^data: /, ""));
    };
    const longStream = events(send(8000, true));
    const longPlain = send(8000, false);
    await until(async () => (await health(url)).running === 2);
    const shortStream = events(send(200, true));
    await until(async () => (await health(url)).running === 3);
    const waiting = send(4, false);
    await until(async () => (await health(url)).queue_depth === 1);
    const signalled = performance.now();
    child.kill("SIGTERM");

    expect((await expectError(await waiting, 503)).code).toBe("server_shutting_down");
    await Bun.sleep(200);
    expect(await fetch(`${url}/health`).then(() => "answered", () => "refused")).toBe("refused");

    const short = await shortStream;
    expect(short.at(-1)).toBe("[DONE]");
    const shortUsage = JSON.parse(short.at(-2)!).usage;
    expect(shortUsage.completion_tokens).toBe(200); // it finished within the deadline

    const long = await longStream;
    expect(long.at(-1)).toBe("[DONE]");
    const chunks = long.slice(0, -1).map((e) => JSON.parse(e));
    expect(chunks.some((c) => "error" in c)).toBe(false);
    const last = chunks.filter((c) => c.choices.length > 0).at(-1);
    expect(last.choices[0].finish_reason).toBe("length");
    const usage = chunks.at(-1).usage;
    expect(usage.completion_tokens).toBeGreaterThan(0);
    expect(usage.completion_tokens).toBeLessThan(8000); // ended at the deadline

    const plain = await longPlain;
    expect(plain.status).toBe(200);
    const answer = (await plain.json()) as { choices: { finish_reason: string; text: string }[];
      usage: { completion_tokens: number } };
    expect(answer.choices[0].finish_reason).toBe("length");
    expect(answer.usage.completion_tokens).toBeLessThan(8000);
    expect(answer.choices[0].text.length).toBeGreaterThan(0);

    expect(await child.exited).toBe(0);
    const seconds = (performance.now() - signalled) / 1000;
    console.log(`SIGTERM to exit: ${seconds.toFixed(1)} s (shutdown timeout 3 s)`);
    expect(seconds).toBeGreaterThan(2.5); // the deadline was waited for
    expect(seconds).toBeLessThan(15);
    expect(stderr).toContain("infer: stopping");
    expect(stderr).toContain("infer: stopped");
    expect(stderr).not.toMatch(/^\s+at /m); // no stack trace
  }, 30_000);
});

test("slowloris connections held nothing up, and the server closed every one", async () => {
  for (const r of await Promise.all(slowloris)) {
    expect(r.closed).toBe(true);
    expect(r.ms).toBeLessThan(30_000);
    const reply = parseReply(r.text)!;
    expect(reply.status).toBe(408);
    expect((JSON.parse(reply.body) as ErrorBody).error.code).toBe("request_timeout");
  }
  await expectHealthy(open);
}, 60_000);
