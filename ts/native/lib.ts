// The typed facade over libinfer: the only module that touches bun:ffi. Loads the library
// lazily (the build for this CPU, see cpu.ts), turns a non-zero status into an InferError
// carrying infer_last_error(), and logs every call when INFER_TRACE_FFI=1. Once loaded, the
// library gets its settings (lib/abi.zig Settings, from ts/config/env.ts) before any other call.
//
// Where the library comes from, first found wins: INFER_LIB; in a compiled infer
// (bun build --compile, see ts/cli/build-bin.ts), the build beside the executable, then the one
// embedded in it (dlopen'ed in place, or copied to the cache first if that fails); in a source
// checkout, the repository's zig-out/lib; then the package's prebuilt libraries,
// prebuilds/<platform>-<arch>/ (ts/cli/prebuild.ts), at the best level this CPU runs.
import { dlopen, ptr, toArrayBuffer, type Pointer } from "bun:ffi";
import {
  accessSync, constants, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, statSync,
  writeFileSync,
  type Stats,
} from "node:fs";
import { basename, dirname, join } from "node:path";
import { setting } from "../config/env.ts";
import { InferError, quote, type InferErrorCode } from "../errors.ts";
import { packStruct } from "./abi.ts";
import { libraryFileName, libraryFileNames } from "./cpu.ts";
import { symbols } from "./symbols.gen.ts";

export type { Pointer };
type Library = ReturnType<typeof dlopen<typeof symbols>>["symbols"];

const statusCodes: InferErrorCode[] = [
  "internal", "invalid_argument", "io", "out_of_memory", "unsupported", "internal",
];

/** Running as a single executable made by bun build --compile (modules live in its $bunfs). */
export function isCompiled(): boolean {
  const path = import.meta.path;
  return path.startsWith("/$bunfs/") || /^[A-Za-z]:[\\/]~BUN[\\/]/.test(path);
}

/** The folder the package (or the checkout) lives in. */
const packageRoot = join(import.meta.dir, "..", "..");

/** A source checkout builds its own library (build.zig is not in the package). */
function isCheckout(root = packageRoot): boolean {
  return existsSync(join(root, "build.zig"));
}

/** The library to load (see the top of this file). */
export function libraryPath(): string {
  const override = setting("INFER_LIB");
  if (override !== null) return override;
  if (isCompiled()) {
    const name = libraryFileName();
    const beside = join(dirname(process.execPath), name);
    // embedded assets sit beside the bundled code, in the executable's own file system
    return existsSync(beside) ? beside : join(import.meta.dir, name);
  }
  return sourceOrPrebuilt(packageRoot, `${process.platform}-${process.arch}`);
}

/**
 * The checkout's zig-out/lib build for this CPU, else the best level present in
 * prebuilds/<platformArch>/; when neither exists, the path a checkout would build (native()
 * says how), or, in the package, an InferError naming the platform.
 */
export function sourceOrPrebuilt(root: string, platformArch: string, names = libraryFileNames,
): string {
  const prebuilds = join(root, "prebuilds");
  const dir = join(prebuilds, platformArch);
  if (!isCheckout(root) && !existsSync(dir)) {
    const carried = existsSync(prebuilds) ? readdirSync(prebuilds).sort().join(", ") : "none";
    throw new InferError("native_unavailable", `infer has no native library for ${platformArch} ` +
      `(its prebuilt ones: ${carried}); build libinfer from source and set INFER_LIB`);
  }
  const candidates = names();
  const built = join(root, "zig-out", "lib", candidates[0]);
  if (existsSync(built)) return built;
  const prebuilt = candidates.map((name) => join(dir, name)).find((path) => existsSync(path));
  return prebuilt ?? (isCheckout(root) ? built : join(dir, candidates[0]));
}

/** A copy of an embedded file in the cache, named by its content, written once. */
function extract(path: string): string {
  const bytes = readFileSync(path);
  const dir = join(setting("INFER_CACHE"), "lib", Bun.hash(bytes).toString(16));
  const out = join(dir, basename(path));
  if (!existsSync(out)) {
    mkdirSync(dir, { recursive: true });
    writeFileSync(`${out}.${process.pid}.partial`, bytes);
    renameSync(`${out}.${process.pid}.partial`, out);
  }
  return out;
}

let loaded: Library | null = null;

export function native(): Library {
  if (loaded) return loaded;
  const path = libraryPath();
  if (!existsSync(path)) {
    const where = setting("INFER_LIB") !== null ? `native library not found at ${path} (INFER_LIB)`
      : isCompiled()
        ? `${basename(path)} is neither beside ${process.execPath} nor embedded in it ` +
          `(rebuild with 'bun run build:bin', or set INFER_LIB)`
        : isCheckout()
          ? `native library not found at ${path}: run 'bun run setup' (or set INFER_LIB)`
          : `no prebuilt native library for ${process.platform}-${process.arch} fits this CPU ` +
            `(${path} is missing); build libinfer from source and set INFER_LIB`;
    throw new InferError("native_unavailable", where);
  }
  let lib: Library;
  try {
    lib = dlopen(path, symbols).symbols;
  } catch (err) {
    let message = (err as Error).message;
    try {
      if (!isCompiled() || setting("INFER_LIB") !== null) throw err;
      lib = dlopen(extract(path), symbols).symbols; // a runtime that cannot dlopen from $bunfs
    } catch (again) {
      if (again !== err) message += `; from the cache: ${(again as Error).message}`;
      throw new InferError("native_unavailable", `cannot load ${path}: ${message}`);
    }
  }
  configure(lib, path);
  loaded = setting("INFER_TRACE_FFI") ? traced(lib) : lib;
  return loaded;
}

/** Gives a just-loaded library its settings (lib/abi.zig Settings) from the environment. */
function configure(lib: Library, path: string): void {
  const cublas = Buffer.from(setting("INFER_CUBLAS") ?? "", "utf8");
  const settings = packStruct("Settings", {
    huge_pages: setting("INFER_HUGE_PAGES"),
    cuda_pdl: setting("INFER_CUDA_PDL"),
    cuda_cublas_min_tokens: setting("INFER_CUDA_CUBLAS"),
    cuda_batch_mma_min: setting("INFER_CUDA_BATCH_MMA"),
    cublas_path_len: cublas.length,
    cublas_path: cublas,
  });
  if (lib.infer_configure(settings) !== 0) {
    throw new InferError("invalid_argument", `${path}: ${String(lib.infer_last_error())}`);
  }
}

function traced(lib: Library): Library {
  const wrapped: Record<string, unknown> = {};
  for (const [name, fn] of Object.entries(lib)) {
    wrapped[name] = (...args: unknown[]) => {
      const t0 = performance.now();
      const result = (fn as (...a: unknown[]) => unknown)(...args);
      const ms = (performance.now() - t0).toFixed(3);
      console.error(`[ffi] ${name}(${args.map(String).join(", ")}) -> ${String(result)} ${ms}ms`);
      return result;
    };
  }
  return wrapped as Library;
}

/** Throws the library's last error when `status` is not ok. */
export function check(status: number, what: string): void {
  if (status === 0) return;
  const message = String(native().infer_last_error());
  throw new InferError(statusCodes[status] ?? "internal", `${what}: ${message}`);
}

/**
 * JavaScriptCore's ArrayBuffers stop at 4 GiB (an 8 GB GGUF failed with "Out of memory"), files
 * do not: views of a mapping are at most this long.
 */
export const VIEW_BYTES_MAX = 2 ** 32 - 2 ** 16;

/** A read-only mapping of a file, owned by the library; views of it, never copies. */
export interface MappedFile {
  /** The file's first min(length, VIEW_BYTES_MAX) bytes: what headers are parsed from. */
  readonly bytes: Uint8Array;
  /** The file's size. */
  readonly length: number;
  readonly base: number;
  /** A view of `length` bytes at `offset` (a tensor's data; at most VIEW_BYTES_MAX). */
  view(offset: number, length: number): Uint8Array;
  /** Drops the whole pages of bytes [offset, offset + length) from the process's memory (their
   * bytes copied elsewhere); a later read faults them back in from the file. */
  release(offset: number, length: number): void;
  close(): void;
}

/** Why a file could not be opened or read, in words, from a node:fs error. */
export function fileErrorReason(err: unknown): string {
  const code = (err as NodeJS.ErrnoException).code;
  const reasons: Record<string, string> = {
    ENOENT: "no such file", EACCES: "permission denied", EPERM: "permission denied",
    EISDIR: "it is a folder", ENOTDIR: "a part of the path is not a folder",
    ELOOP: "too many symbolic links", ENAMETOOLONG: "the name is too long",
  };
  return (code !== undefined ? reasons[code] ?? code : undefined) ?? quote(String(err));
}

/**
 * What mapping needs, checked first so that each failure is said plainly: a regular file (a
 * folder cannot be mapped, and opening a FIFO would wait for a writer), readable, not empty.
 */
function checkMappable(path: string): void {
  const shown = quote(path);
  let stat: Stats;
  try {
    stat = statSync(path);
  } catch (err) {
    throw new InferError("io", `cannot open ${shown}: ${fileErrorReason(err)}`);
  }
  if (stat.isDirectory()) {
    throw new InferError("invalid_argument", `${shown} is a folder, not a file`);
  }
  if (!stat.isFile()) throw new InferError("invalid_argument", `${shown} is not a regular file`);
  if (stat.size === 0) throw new InferError("invalid_argument", `${shown} is empty (0 bytes)`);
  try {
    accessSync(path, constants.R_OK);
  } catch (err) {
    throw new InferError("io", `cannot read ${shown}: ${fileErrorReason(err)}`);
  }
}

export function mapFile(path: string): MappedFile {
  checkMappable(path);
  const lib = native();
  const pathBytes = Buffer.from(path, "utf8");
  const out = new BigUint64Array(3);
  const handleOut = out.subarray(0, 1), baseOut = out.subarray(1, 2), lenOut = out.subarray(2, 3);
  check(lib.infer_file_open(pathBytes, pathBytes.length, handleOut, baseOut, lenOut), "map file");
  const handle = Number(out[0]), base = Number(out[1]), length = Number(out[2]);
  const bytes = new Uint8Array(toArrayBuffer(base as Pointer, 0, Math.min(length, VIEW_BYTES_MAX)));
  let open = true;
  return {
    bytes,
    length,
    base,
    view(offset, count) {
      if (offset < 0 || count < 0 || offset + count > length || count > VIEW_BYTES_MAX) {
        throw new InferError("invalid_argument", `${path}: no view of ${count} bytes at ${offset}`);
      }
      if (offset + count <= bytes.length) return bytes.subarray(offset, offset + count);
      return new Uint8Array(toArrayBuffer((base + offset) as Pointer, 0, count));
    },
    release(offset, count) {
      if (open) check(lib.infer_file_release(handle as Pointer, offset, count), `${path}: release`);
    },
    close() {
      if (!open) return;
      open = false;
      lib.infer_file_close(handle as Pointer);
    },
  };
}

/**
 * Zeroed memory owned by the library, in huge pages where the system allows (lib/pages.zig):
 * for what the kernels stream through every token. Lives until free() (or the process's end).
 */
export interface PageRegion {
  readonly bytes: Uint8Array;
  readonly address: Pointer;
  free(): void;
}

export function allocPages(byteLength: number): PageRegion {
  const lib = native();
  const out = new BigUint64Array(1);
  check(lib.infer_pages_alloc(byteLength, out), "allocate");
  const address = Number(out[0]) as Pointer;
  let live = true;
  return {
    bytes: new Uint8Array(toArrayBuffer(address, 0, byteLength)),
    address,
    free() {
      if (!live) return;
      live = false;
      lib.infer_pages_free(address as number, byteLength);
    },
  };
}

export function addressOf(view: Uint8Array | Float32Array | Int32Array | Uint16Array): Pointer {
  return ptr(view);
}

/** The address `bytes` past `base` (native addresses are plain numbers under a brand). */
export function offsetAddress(base: Pointer | number, bytes: number): Pointer {
  return ((base as number) + bytes) as Pointer;
}
