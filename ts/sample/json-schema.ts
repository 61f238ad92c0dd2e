// JSON Schema → the grammar nodes the JSON automaton (json-grammar.ts) walks. What it accepts
// is a subset of JSON Schema that a character automaton can enforce exactly, so that every
// output validates: objects (properties in the schema's order, `required` ones present,
// optional ones may be skipped; no properties: a map whose values follow additionalProperties),
// arrays (items, minItems, maxItems), strings, numbers, integers, booleans, null, enum and const
// (any JSON values), anyOf / oneOf / type lists, and local $ref (#, #/$defs/…, #/definitions/…),
// recursion included. A keyword that constrains values in a way the automaton cannot (pattern,
// minimum, minLength, …) is refused with its path rather than silently ignored.
//
// A schema comes from a client or a file, so compiling it is bounded: the document's nesting and
// size, the schemas nested through references, and the nodes built all have a budget, and a
// recursion that reads no input on its way back (`{"$ref": "#"}`, a → b → a, a union holding a
// reference to itself) is refused by name: it would send the automaton round the loop forever.
// Recursion through an object property or an array item (a tree) reads a "{" or "[" first, and
// is fine. A schema under which no text of finite length is valid is refused too. The analyses
// of the compiled graph (shortest lengths, a union's alternatives) walk it without recursion.
import { InferError, quote } from "../errors.ts";

export type JsonNode =
  | { readonly kind: "object"; readonly props: readonly JsonProperty[];
      readonly additional: JsonNode | null }
  | { readonly kind: "array"; readonly items: JsonNode; readonly minItems: number;
      readonly maxItems: number }
  | { readonly kind: "string" }
  | { readonly kind: "number"; readonly integer: boolean }
  | { readonly kind: "literal"; readonly values: readonly Uint8Array[] }
  | { readonly kind: "union"; readonly options: readonly JsonNode[] }
  | { readonly kind: "ref"; readonly ref: string; target: JsonNode | null };

export interface JsonProperty {
  readonly name: string;
  /** The key as it is written: JSON-encoded, quotes included. */
  readonly key: Uint8Array;
  readonly node: JsonNode;
  readonly required: boolean;
}

const utf8 = new TextEncoder();
const literal = (values: readonly unknown[]): JsonNode =>
  ({ kind: "literal", values: values.map((v) => utf8.encode(JSON.stringify(v))) });

/** Any JSON value; its objects are maps of any values (what --json asks for inside the root). */
export const anyValue: JsonNode = (() => {
  const options: JsonNode[] = [];
  const any: JsonNode = { kind: "union", options };
  options.push(
    { kind: "object", props: [], additional: any },
    { kind: "array", items: any, minItems: 0, maxItems: Infinity },
    { kind: "string" }, { kind: "number", integer: false }, literal([true, false, null]));
  return any;
})();

/** --json: an object of any keys and values, as llama.cpp's json.gbnf has it. */
export const anyObject: JsonNode = { kind: "object", props: [], additional: anyValue };

const ANNOTATIONS = new Set(["$schema", "$id", "$comment", "title", "description", "default",
  "examples", "$defs", "definitions", "deprecated", "readOnly", "writeOnly"]);
const SUPPORTED: Record<string, readonly string[]> = {
  object: ["type", "properties", "required", "additionalProperties"],
  array: ["type", "items", "minItems", "maxItems"],
  string: ["type"], number: ["type"], integer: ["type"], boolean: ["type"], null: ["type"],
};

/**
 * Budgets for a schema. The document's nesting bounds every recursive walk of it (structured
 * cloning to the engine's worker, JSON.stringify of a const); schemas nested through references
 * bound the compiler's own recursion; nodes bound the automaton's work per byte. Real schemas
 * are far inside them (OpenAI's structured outputs allow 10 levels and 5,000 properties).
 */
const SCHEMA_DEPTH_MAX = 128;
const SCHEMA_VALUES_MAX = 200_000;
const SCHEMA_NODES_MAX = 10_000;

const tooLarge = (what: string): never => {
  throw new InferError("unsupported", `JSON schema: ${what}`);
};

/**
 * Checks the nesting and size of a schema document, walking it without recursion: what must
 * pass before anything recursive (structured cloning, JSON.stringify, a template's tojson)
 * touches a value a client sent.
 */
export function checkJsonDocument(schema: unknown): void {
  const stack: unknown[] = [schema], depths: number[] = [1];
  for (let values = 0; stack.length > 0; values++) {
    if (values >= SCHEMA_VALUES_MAX) {
      tooLarge(`the document holds more than ${SCHEMA_VALUES_MAX} values`);
    }
    const v = stack.pop(), depth = depths.pop()!;
    if (typeof v !== "object" || v === null) continue;
    if (depth > SCHEMA_DEPTH_MAX) {
      tooLarge(`the document nests deeper than ${SCHEMA_DEPTH_MAX} levels`);
    }
    for (const x of Array.isArray(v) ? v : Object.values(v)) {
      stack.push(x);
      depths.push(depth + 1);
    }
  }
}

/** A value as a message may show it: strings quoted, anything else by its JSON type. */
function shown(v: unknown): string {
  if (typeof v === "string") return quote(v);
  if (typeof v === "number" || typeof v === "boolean" || v === null) return String(v);
  return Array.isArray(v) ? "an array" : "an object";
}

export function compileSchema(schema: unknown): JsonNode {
  checkJsonDocument(schema);
  const refs = new Map<string, JsonNode & { kind: "ref" }>();
  /** Where each reference was first met, for messages. */
  const refPaths = new Map<JsonNode, string>();
  let nodes = 0, depth = 0;
  const fail = (path: string, what: string): never => {
    throw new InferError("unsupported", `JSON schema at ${quote(path)}: ${what}`);
  };
  const count = (n: number, path: string) => {
    nodes += n;
    if (nodes > SCHEMA_NODES_MAX) {
      fail(path, `the schema is too large (more than ${SCHEMA_NODES_MAX} schemas, properties ` +
        "and enum values)");
    }
  };

  function resolve(ref: string, path: string): unknown {
    if (ref === "#") return schema;
    const m = /^#\/(\$defs|definitions)\/(.+)$/.exec(ref);
    if (!m) {
      fail(path, "only local references (#, #/$defs/NAME, #/definitions/NAME) are supported, " +
        `not ${quote(ref)}`);
    }
    const name = m![2].replaceAll("~1", "/").replaceAll("~0", "~");
    const defs = (schema as Record<string, unknown>)[m![1]];
    if (typeof defs !== "object" || defs === null || !Object.hasOwn(defs, name)) {
      fail(path, `${quote(ref)} is not defined`);
    }
    return (defs as Record<string, unknown>)[name];
  }

  function compile(s: unknown, path: string): JsonNode {
    if (++depth > SCHEMA_DEPTH_MAX) {
      fail(path, `schemas nest deeper than ${SCHEMA_DEPTH_MAX} levels (references followed)`);
    }
    count(1, path);
    try {
      return compileOne(s, path);
    } finally {
      depth--;
    }
  }

  function compileOne(s: unknown, path: string): JsonNode {
    if (s === true) return anyValue;
    if (s === false) fail(path, "'false' accepts nothing");
    if (typeof s !== "object" || s === null || Array.isArray(s)) {
      fail(path, "a schema must be an object or a boolean");
    }
    const o = s as Record<string, unknown>;
    if (typeof o.$ref === "string") {
      let node = refs.get(o.$ref);
      if (!node) {
        node = { kind: "ref", ref: o.$ref, target: null };
        refs.set(o.$ref, node);
        refPaths.set(node, path);
        node.target = compile(resolve(o.$ref, path), o.$ref);
      }
      return node;
    }
    if ("const" in o) return literal([o.const]);
    if ("enum" in o) {
      if (!Array.isArray(o.enum) || o.enum.length === 0) fail(path, "'enum' needs values");
      count((o.enum as unknown[]).length, path);
      return literal(o.enum as unknown[]);
    }
    for (const k of ["anyOf", "oneOf"] as const) {
      if (k in o) {
        const list = o[k];
        if (!Array.isArray(list) || list.length === 0) fail(path, `'${k}' needs options`);
        // oneOf is read as anyOf: the options infer is given are expected not to overlap.
        const options = (list as unknown[]).map((x, i) => compile(x, `${path}/${k}/${i}`));
        return { kind: "union", options };
      }
    }
    if (Array.isArray(o.allOf) && o.allOf.length === 1) {
      return compile(o.allOf[0], `${path}/allOf/0`);
    }
    let type = o.type;
    if (type === undefined) {
      if ("properties" in o || "required" in o || "additionalProperties" in o) type = "object";
      else if ("items" in o || "minItems" in o || "maxItems" in o) type = "array";
      else {
        check(o, [], path);
        return anyValue;
      }
    }
    const types = Array.isArray(type) ? type : [type];
    for (const t of types) {
      if (typeof t !== "string" || !Object.hasOwn(SUPPORTED, t)) {
        fail(path, `unknown type ${shown(t)}`);
      }
    }
    check(o, types.flatMap((t) => SUPPORTED[t as string]), path);
    const options = types.map((t) => typed(o, t as string, path));
    return options.length === 1 ? options[0] : { kind: "union", options };
  }

  function check(o: Record<string, unknown>, allowed: readonly string[], path: string): void {
    for (const k of Object.keys(o)) {
      if (!ANNOTATIONS.has(k) && !allowed.includes(k)) {
        fail(path, `the keyword ${quote(k)} is not supported`);
      }
    }
  }

  function typed(o: Record<string, unknown>, t: string, path: string): JsonNode {
    switch (t) {
      case "string": return { kind: "string" };
      case "number": return { kind: "number", integer: false };
      case "integer": return { kind: "number", integer: true };
      case "boolean": return literal([true, false]);
      case "null": return literal([null]);
      case "array": {
        const bound = (k: string, fallback: number) => {
          const v = o[k];
          if (v === undefined) return fallback;
          if (typeof v !== "number" || !Number.isInteger(v) || v < 0) {
            fail(path, `'${k}' must be an integer >= 0`);
          }
          return v as number;
        };
        const minItems = bound("minItems", 0), maxItems = bound("maxItems", Infinity);
        if (maxItems < minItems) fail(path, "maxItems is below minItems");
        const items = "items" in o ? compile(o.items, `${path}/items`) : anyValue;
        return { kind: "array", items, minItems, maxItems };
      }
      default: return object(o, path);
    }
  }

  function object(o: Record<string, unknown>, path: string): JsonNode {
    const properties = (o.properties ?? {}) as Record<string, unknown>;
    if (typeof properties !== "object" || Array.isArray(properties)) {
      fail(path, "'properties' must be an object");
    }
    const required = (o.required ?? []) as unknown[];
    if (!Array.isArray(required) || required.some((r) => typeof r !== "string")) {
      fail(path, "'required' must be an array of names");
    }
    const names = new Set(required as string[]);
    for (const r of names) {
      if (!Object.hasOwn(properties, r)) {
        fail(path, `required property ${quote(r)} is not in 'properties'`);
      }
    }
    const entries = Object.entries(properties);
    count(entries.length, path);
    const props = entries.map(([name, sub]) => ({
      name, key: utf8.encode(JSON.stringify(name)), required: names.has(name),
      node: compile(sub, `${path}/properties/${name}`),
    }));
    const extra = o.additionalProperties;
    // With properties, only they are written (valid whatever additionalProperties says);
    // without, the object is a map of additionalProperties (absent or true: any values).
    const additional = props.length > 0 || extra === false ? null
      : extra === undefined || extra === true ? anyValue
        : compile(extra, `${path}/additionalProperties`);
    return { kind: "object", props, additional };
  }

  const root = compile(schema, "#");
  const cycle = emptyCycle(root);
  if (cycle) {
    const names = cycle.filter((n) => n.kind === "ref").map((n) => (n as { ref: string }).ref);
    const first = cycle.find((n) => n.kind === "ref")!;
    fail(refPaths.get(first) ?? "#", `the reference ${quote(names[0])} leads back to itself ` +
      `before any object or array (${quote([...names, names[0]].join(" → "))}), so it would ` +
      "never produce a value; recursion must go through an object property or an array item");
  }
  if (minLength(root) === Infinity) {
    fail("#", "no JSON text of finite length is valid under it (every way through it recurses " +
      "through a required property or minItems)");
  }
  return root;
}

type Concrete = Exclude<JsonNode, { kind: "union" | "ref" }>;

/** alternatives(), computed once per node. */
const flattened = new WeakMap<JsonNode, readonly Concrete[]>();

/**
 * The object, array, string, number and literal nodes that `node` may begin as, each once, in
 * the schema's order. Walked without recursion, each node at most once, so a reference chain
 * or a union of unions costs its size and nothing more (a cycle would add nothing).
 */
export function alternatives(node: JsonNode): readonly Concrete[] {
  let list = flattened.get(node);
  if (list) return list;
  const out: Concrete[] = [], seen = new Set<JsonNode>(), todo = [node];
  while (todo.length > 0) {
    const n = todo.pop()!;
    if (seen.has(n)) continue;
    seen.add(n);
    if (n.kind === "ref") todo.push(n.target!);
    else if (n.kind === "union") {
      for (let i = n.options.length - 1; i >= 0; i--) todo.push(n.options[i]);
    } else out.push(n);
  }
  list = out;
  flattened.set(node, list);
  return list;
}

/** The nodes reached from `n` without reading a byte: a reference's target, a union's options. */
function emptySteps(n: JsonNode): readonly JsonNode[] {
  return n.kind === "ref" ? [n.target!] : n.kind === "union" ? n.options : [];
}

/**
 * A cycle of references and unions reachable from `root` (depth first, without recursion), as
 * the nodes along it, or null. Objects and arrays end a path: they read a byte first.
 */
function emptyCycle(root: JsonNode): JsonNode[] | null {
  const done = new Set<JsonNode>(), onPath = new Set<JsonNode>();
  const all: JsonNode[] = [root], seen = new Set<JsonNode>([root]);
  // Every node of the graph, so that cycles behind an object or array are found too.
  for (let i = 0; i < all.length; i++) {
    for (const c of children(all[i])) if (!seen.has(c)) { seen.add(c); all.push(c); }
  }
  for (const start of all) {
    if (done.has(start) || (start.kind !== "ref" && start.kind !== "union")) continue;
    const path: JsonNode[] = [start], next: number[] = [0];
    onPath.add(start);
    while (path.length > 0) {
      const top = path[path.length - 1], steps = emptySteps(top);
      const i = next[next.length - 1]++;
      if (i >= steps.length) {
        path.pop();
        next.pop();
        onPath.delete(top);
        done.add(top);
        continue;
      }
      const c = steps[i];
      if (onPath.has(c)) return path.slice(path.indexOf(c));
      if (!done.has(c) && (c.kind === "ref" || c.kind === "union")) {
        path.push(c);
        next.push(0);
        onPath.add(c);
      }
    }
  }
  return null;
}

/** Every node `n` points at. */
function children(n: JsonNode): readonly JsonNode[] {
  switch (n.kind) {
    case "ref": return [n.target!];
    case "union": return n.options;
    case "array": return [n.items];
    case "object": {
      const out = n.props.map((p) => p.node);
      if (n.additional) out.push(n.additional);
      return out;
    }
    default: return [];
  }
}

const minLengths = new WeakMap<JsonNode, number>();

/** Bytes in the shortest JSON text the node accepts (Infinity if none is finite). */
export function minLength(node: JsonNode): number {
  let n = minLengths.get(node);
  if (n === undefined) {
    computeMinLengths(node);
    n = minLengths.get(node)!;
  }
  return n;
}

/**
 * A node's shortest length as a function of its children's: a constant plus weighted children
 * (objects: their required members; arrays: minItems items), or (union, reference) the least
 * of its children.
 */
function lengthTerms(n: JsonNode): { least: boolean; constant: number; deps: readonly JsonNode[];
  weight: number } {
  switch (n.kind) {
    case "ref": return { least: true, constant: 0, deps: [n.target!], weight: 1 };
    case "union": return { least: true, constant: 0, deps: n.options, weight: 1 };
    case "string": return { least: false, constant: 2, deps: [], weight: 1 };
    case "number": return { least: false, constant: 1, deps: [], weight: 1 };
    case "literal": {
      let shortest = Infinity;
      for (const v of n.values) shortest = Math.min(shortest, v.length);
      return { least: false, constant: shortest, deps: [], weight: 1 };
    }
    case "array": // "[" items with commas between "]"
      return n.minItems === 0 ? { least: false, constant: 2, deps: [], weight: 1 }
        : { least: false, constant: 1 + n.minItems, deps: [n.items], weight: n.minItems };
    case "object": { // "{" "key":value members with commas between "}"
      const req = n.props.filter((p) => p.required);
      const keys = req.reduce((a, p) => a + p.key.length + 1, 0);
      return { least: false, constant: 2 + keys + Math.max(0, req.length - 1),
        deps: req.map((p) => p.node), weight: 1 };
    }
  }
}

/**
 * Shortest lengths of every node reachable from `root`, by Knuth's generalisation of
 * Dijkstra's algorithm to grammars (1977): every node's length is at least each of its
 * children's, so nodes are settled in increasing order of length, each once. Cycles settle
 * correctly (a node only on infinite paths stays Infinity), and nothing recurses.
 */
function computeMinLengths(root: JsonNode): void {
  const nodes: JsonNode[] = [], index = new Map<JsonNode, number>();
  for (const todo = [root]; todo.length > 0;) {
    const n = todo.pop()!;
    if (index.has(n) || minLengths.has(n)) continue;
    index.set(n, nodes.length);
    nodes.push(n);
    for (const c of children(n)) todo.push(c);
  }
  const count = nodes.length;
  const terms = nodes.map(lengthTerms);
  const value = new Float64Array(count).fill(Infinity); // least: the best so far; else the sum
  const waiting = new Int32Array(count); // sums: children not settled yet
  const settled = new Uint8Array(count);
  const parents: number[][] = nodes.map(() => []);
  const heap = new MinHeap();
  terms.forEach((t, i) => {
    let v = t.least ? Infinity : t.constant;
    for (const d of t.deps) {
      const known = minLengths.get(d);
      if (known === undefined) {
        parents[index.get(d)!].push(i);
        waiting[i]++;
      } else v = t.least ? Math.min(v, known) : v + t.weight * known;
    }
    value[i] = v;
    if (t.least ? v < Infinity : waiting[i] === 0) heap.push(v, i);
  });
  while (heap.size > 0) {
    const [v, i] = heap.pop();
    if (settled[i]) continue;
    settled[i] = 1;
    value[i] = v;
    for (const p of parents[i]) {
      if (settled[p]) continue;
      const t = terms[p];
      if (t.least) {
        if (v < value[p]) heap.push(value[p] = v, p);
      } else {
        value[p] += t.weight * v;
        if (--waiting[p] === 0) heap.push(value[p], p);
      }
    }
  }
  nodes.forEach((n, i) => minLengths.set(n, settled[i] ? value[i] : Infinity));
}

/** A binary heap of (key, index) pairs, least key first. */
class MinHeap {
  private readonly keys: number[] = [];
  private readonly ids: number[] = [];

  get size(): number { return this.keys.length; }

  push(key: number, id: number): void {
    const k = this.keys, d = this.ids;
    let i = k.length;
    k.push(key);
    d.push(id);
    while (i > 0) {
      const up = (i - 1) >> 1;
      if (k[up] <= key) break;
      k[i] = k[up];
      d[i] = d[up];
      i = up;
    }
    k[i] = key;
    d[i] = id;
  }

  pop(): [number, number] {
    const k = this.keys, d = this.ids, top: [number, number] = [k[0], d[0]];
    const key = k.pop()!, id = d.pop()!;
    const n = k.length;
    if (n > 0) {
      let i = 0;
      for (;;) {
        let c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && k[c + 1] < k[c]) c++;
        if (k[c] >= key) break;
        k[i] = k[c];
        d[i] = d[c];
        i = c;
      }
      k[i] = key;
      d[i] = id;
    }
    return top;
  }
}
