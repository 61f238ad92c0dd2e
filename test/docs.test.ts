// Method: read README.md, docs/*.md and bench/results/*.md as text and hold them to the house
// rules: a README short enough to be read first, relative links that resolve, and no commit
// hashes or dated runs in the pages that explain today's design (history belongs to git; dated
// figures to bench/results/).
import { describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";

const root = resolve(import.meta.dir, "..");
const README_BYTES_MAX = 15 * 1024;

const pages = (dir: string) =>
  readdirSync(join(root, dir)).filter((f) => f.endsWith(".md")).map((f) => join(root, dir, f));
const readme = join(root, "README.md");
const docs = pages("docs");
const results = pages("bench/results");

/** The text outside fenced code blocks and inline code, where Markdown links are links. */
function prose(text: string): string {
  return text.replace(/^```[\s\S]*?^```/gm, "").replace(/`[^`\n]*`/g, "");
}

/** Targets of the relative links `[text](target)` of one page, without their #fragment. */
function relativeLinks(text: string): string[] {
  const targets = [...prose(text).matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)].map((m) => m[1]!);
  return targets
    .filter((t) => !/^[a-z][a-z0-9+.-]*:/i.test(t) && !t.startsWith("#"))
    .map((t) => decodeURIComponent(t.split("#")[0]!));
}

// A commit hash: 7 to 40 hex digits holding at least one letter and one digit (so that numbers
// such as 1048576 and words such as "defaced" pass).
const COMMIT_HASH = /\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b/;
const DATE = /\b\d{4}-\d{2}-\d{2}\b/;

describe("README and docs", () => {
  test(`README.md is at most ${README_BYTES_MAX} bytes`, () => {
    expect(statSync(readme).size).toBeLessThanOrEqual(README_BYTES_MAX);
  });

  test("every relative link in README.md, docs/ and bench/results/ resolves", () => {
    expect(docs.length).toBeGreaterThan(0);
    expect(results.length).toBeGreaterThan(0);
    const broken: string[] = [];
    for (const page of [readme, ...docs, ...results]) {
      for (const target of relativeLinks(readFileSync(page, "utf8"))) {
        if (!existsSync(resolve(dirname(page), target))) {
          broken.push(`${relative(root, page)}: ${target}`);
        }
      }
    }
    expect(broken).toEqual([]);
  });

  test("README.md and docs/ hold no commit hash and no date", () => {
    const found: string[] = [];
    for (const page of [readme, ...docs]) {
      readFileSync(page, "utf8").split("\n").forEach((line, i) => {
        for (const pattern of [COMMIT_HASH, DATE]) {
          const hit = line.match(pattern);
          if (hit) found.push(`${relative(root, page)}:${i + 1}: ${hit[0]}`);
        }
      });
    }
    expect(found).toEqual([]);
  });
});
