// JSON Schema → the grammar nodes the JSON automaton (json-grammar.ts) walks. What it accepts
// is a subset of JSON Schema that a character automaton can enforce exactly, so that every
// output validates: objects (properties in the schema's order, `required` ones present,
// optional ones may be skipped; no properties: a map whose values follow additionalProperties),
// arrays (items, minItems, maxItems), strings, numbers, integers, booleans, null, enum and const
// (any JSON values), anyOf / oneOf / type lists, and local $ref (#, #/$defs/…, #/definitions/…),
// recursion included. A keyword that constrains values in a way the automaton cannot (pattern,
// minimum, minLength, …) is refused with its path rather than silently ignored.
import { InferError } from "../errors.ts";

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

export function compileSchema(schema: unknown): JsonNode {
  const refs = new Map<string, JsonNode & { kind: "ref" }>();
  const fail = (path: string, what: string): never => {
    throw new InferError("unsupported", `JSON schema at ${path}: ${what}`);
  };

  function resolve(ref: string, path: string): unknown {
    if (ref === "#") return schema;
    const m = /^#\/(\$defs|definitions)\/(.+)$/.exec(ref);
    if (!m) {
      fail(path, `only local references (#, #/$defs/NAME, #/definitions/NAME) are supported, ` +
        `not '${ref}'`);
    }
    const name = m![2].replaceAll("~1", "/").replaceAll("~0", "~");
    const defs = (schema as Record<string, unknown>)[m![1]] as Record<string, unknown> | undefined;
    if (!defs || !Object.hasOwn(defs, name)) fail(path, `'${ref}' is not defined`);
    return defs![name];
  }

  function compile(s: unknown, path: string): JsonNode {
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
        node.target = compile(resolve(o.$ref, path), o.$ref);
      }
      return node;
    }
    if ("const" in o) return literal([o.const]);
    if ("enum" in o) {
      if (!Array.isArray(o.enum) || o.enum.length === 0) fail(path, "'enum' needs values");
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
        fail(path, `unknown type '${String(t)}'`);
      }
    }
    check(o, types.flatMap((t) => SUPPORTED[t as string]), path);
    const nodes = types.map((t) => typed(o, t as string, path));
    return nodes.length === 1 ? nodes[0] : { kind: "union", options: nodes };
  }

  function check(o: Record<string, unknown>, allowed: readonly string[], path: string): void {
    for (const k of Object.keys(o)) {
      if (!ANNOTATIONS.has(k) && !allowed.includes(k)) {
        fail(path, `the keyword '${k}' is not supported`);
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
        const count = (k: string, fallback: number) => {
          const v = o[k];
          if (v === undefined) return fallback;
          if (typeof v !== "number" || !Number.isInteger(v) || v < 0) {
            fail(path, `'${k}' must be an integer >= 0`);
          }
          return v as number;
        };
        const minItems = count("minItems", 0), maxItems = count("maxItems", Infinity);
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
    for (const r of required) {
      if (!Object.hasOwn(properties, r as string)) {
        fail(path, `required property '${r}' is not in 'properties'`);
      }
    }
    const props = Object.entries(properties).map(([name, sub]) => ({
      name, key: utf8.encode(JSON.stringify(name)), required: required.includes(name),
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

  return compile(schema, "#");
}

/** The node behind any chain of references. */
export function deref(node: JsonNode): JsonNode {
  while (node.kind === "ref") node = node.target!;
  return node;
}

const minLengths = new WeakMap<JsonNode, number>();

/** Bytes in the shortest JSON text the node accepts (Infinity if none is finite). */
export function minLength(node: JsonNode): number {
  const known = minLengths.get(node);
  if (known !== undefined) return known;
  minLengths.set(node, Infinity); // a cycle back here adds nothing shorter
  let n: number;
  switch (node.kind) {
    case "ref": n = minLength(node.target!); break;
    case "string": n = 2; break;
    case "number": n = 1; break;
    case "literal": n = Math.min(...node.values.map((v) => v.length)); break;
    case "union": n = Math.min(...node.options.map(minLength)); break;
    case "array": // "[" items with commas between "]"
      n = 2 + (node.minItems > 0 ? node.minItems * (minLength(node.items) + 1) - 1 : 0);
      break;
    case "object": {
      const req = node.props.filter((p) => p.required);
      const members = req.reduce((a, p) => a + p.key.length + 1 + minLength(p.node), 0);
      n = 2 + members + Math.max(0, req.length - 1);
      break;
    }
  }
  minLengths.set(node, n);
  return n;
}
