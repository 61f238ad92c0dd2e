// What a shared library exports, read from the file itself (no tool of the host's: the macOS and
// arm64 libraries are foreign here). ELF (the System V gABI): the defined, global or weak,
// default-visibility entries of .dynsym, and the versions .gnu.version_r asks of each library
// (GLIBC_2.17 ...). Mach-O (<mach-o/loader.h>): the export trie dyld reads, found through
// LC_DYLD_INFO(_ONLY) or LC_DYLD_EXPORTS_TRIE, names with their leading underscore removed.

export interface LibraryInfo {
  readonly format: "elf" | "macho";
  /** ELF e_machine name or Mach-O cpu type: x86_64 or aarch64. */
  readonly machine: string;
  readonly exports: Set<string>;
  /** ELF: the symbol versions required, by library (libc.so.6: [GLIBC_2.2.5, ...]). */
  readonly versionsNeeded: Map<string, string[]>;
}

function cString(bytes: Uint8Array, at: number): string {
  let end = at;
  while (end < bytes.length && bytes[end] !== 0) end++;
  return new TextDecoder().decode(bytes.subarray(at, end));
}

function check(cond: boolean, message: string): asserts cond {
  if (!cond) throw new Error(`library reader: ${message}`);
}

const SHT_DYNSYM = 11, SHT_GNU_VERNEED = 0x6ffffffe;

function readElf(bytes: Uint8Array): LibraryInfo {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  check(bytes[4] === 2 && bytes[5] === 1, "only 64-bit little-endian ELF is read");
  const machines: Record<number, string> = { 62: "x86_64", 183: "aarch64" };
  const machine = machines[view.getUint16(18, true)] ?? `e_machine ${view.getUint16(18, true)}`;
  const shoff = Number(view.getBigUint64(40, true));
  const shentsize = view.getUint16(58, true), shnum = view.getUint16(60, true);
  check(shoff > 0 && shoff + shnum * shentsize <= bytes.length, "section headers out of the file");
  const sections = Array.from({ length: shnum }, (_, i) => {
    const at = shoff + i * shentsize;
    return {
      type: view.getUint32(at + 4, true), offset: Number(view.getBigUint64(at + 24, true)),
      size: Number(view.getBigUint64(at + 32, true)), link: view.getUint32(at + 40, true),
      info: view.getUint32(at + 44, true), entsize: Number(view.getBigUint64(at + 56, true)),
    };
  });
  const exports = new Set<string>();
  const dynsym = sections.find((s) => s.type === SHT_DYNSYM);
  check(dynsym !== undefined, "no .dynsym section");
  const dynstr = sections[dynsym.link];
  for (let at = dynsym.offset + dynsym.entsize; at < dynsym.offset + dynsym.size; at += dynsym.entsize) {
    const name = view.getUint32(at, true), info = bytes[at + 4], other = bytes[at + 5];
    const shndx = view.getUint16(at + 6, true);
    const bind = info >> 4, visibility = other & 3;
    if (shndx !== 0 && (bind === 1 || bind === 2) && visibility === 0) {
      exports.add(cString(bytes, dynstr.offset + name));
    }
  }
  const versionsNeeded = new Map<string, string[]>();
  const verneed = sections.find((s) => s.type === SHT_GNU_VERNEED);
  if (verneed) {
    const strings = sections[verneed.link].offset;
    let entry = verneed.offset;
    for (let i = 0; i < verneed.info; i++) {
      const count = view.getUint16(entry + 2, true);
      const file = cString(bytes, strings + view.getUint32(entry + 4, true));
      const names: string[] = [];
      let aux = entry + view.getUint32(entry + 8, true);
      for (let j = 0; j < count; j++) {
        names.push(cString(bytes, strings + view.getUint32(aux + 8, true)));
        aux += view.getUint32(aux + 12, true);
      }
      versionsNeeded.set(file, names);
      entry += view.getUint32(entry + 12, true);
    }
  }
  return { format: "elf", machine, exports, versionsNeeded };
}

const LC_DYLD_INFO = 0x22, LC_DYLD_INFO_ONLY = 0x80000022, LC_DYLD_EXPORTS_TRIE = 0x80000033;

function uleb(bytes: Uint8Array, at: number): [value: number, next: number] {
  let value = 0, scale = 1, byte: number;
  do {
    check(at < bytes.length, "ULEB128 past the end");
    byte = bytes[at++];
    value += (byte & 0x7f) * scale;
    scale *= 128;
  } while (byte & 0x80);
  return [value, at];
}

/** Every terminal of the export trie, depth first, its edges' labels joined. */
function trieNames(trie: Uint8Array): Set<string> {
  const names = new Set<string>();
  const seen = new Set<number>();
  const walk = (node: number, prefix: string) => {
    check(node < trie.length && !seen.has(node), `export trie node at ${node} is out of place`);
    seen.add(node);
    const [terminalBytes, afterSize] = uleb(trie, node);
    if (terminalBytes > 0) names.add(prefix);
    let at = afterSize + terminalBytes;
    const children = trie[at++];
    for (let i = 0; i < children; i++) {
      const label = cString(trie, at);
      at += new TextEncoder().encode(label).length + 1;
      const [child, next] = uleb(trie, at);
      at = next;
      walk(child, prefix + label);
    }
  };
  walk(0, "");
  return names;
}

function readMachO(bytes: Uint8Array): LibraryInfo {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const cpus: Record<number, string> = { 0x0100000c: "aarch64", 0x01000007: "x86_64" };
  const machine = cpus[view.getUint32(4, true)] ?? `cputype ${view.getUint32(4, true)}`;
  check(view.getUint32(12, true) === 6, "not a dylib (MH_DYLIB)");
  const commands = view.getUint32(16, true);
  let at = 32, trie: Uint8Array | null = null;
  for (let i = 0; i < commands; i++) {
    const cmd = view.getUint32(at, true), size = view.getUint32(at + 4, true);
    if (cmd === LC_DYLD_INFO || cmd === LC_DYLD_INFO_ONLY) {
      const offset = view.getUint32(at + 40, true), length = view.getUint32(at + 44, true);
      if (length > 0) trie = bytes.subarray(offset, offset + length);
    } else if (cmd === LC_DYLD_EXPORTS_TRIE) {
      const offset = view.getUint32(at + 8, true), length = view.getUint32(at + 12, true);
      trie = bytes.subarray(offset, offset + length);
    }
    at += size;
  }
  check(trie !== null, "no export trie (LC_DYLD_INFO or LC_DYLD_EXPORTS_TRIE)");
  const exports = new Set([...trieNames(trie)].map((n) => n.replace(/^_/, "")));
  return { format: "macho", machine, exports, versionsNeeded: new Map() };
}

export function readLibrary(bytes: Uint8Array): LibraryInfo {
  const magic = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength).getUint32(0, false);
  if (magic === 0x7f454c46) return readElf(bytes); // "\x7fELF"
  if (magic === 0xcffaedfe) return readMachO(bytes); // MH_MAGIC_64, little-endian
  throw new Error("library reader: neither ELF nor 64-bit Mach-O");
}
