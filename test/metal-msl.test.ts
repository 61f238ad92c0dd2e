// Method: the rules of the Metal Shading Language that the C++ emulation (metal-kernels) cannot
// see, checked over every kernel of shaders/metal, because the library compiles all kernels as
// one source and a single rejected kernel loses the backend:
// 1. built-in attributes: the position and size attributes of a kernel are uint/ushort scalars
//    or vectors of one component count (MSL 5.2.3.6; a scalar group position beside a uint3
//    group size is rejected), index attributes are scalars (builtinAttributeErrors);
// 2. address spaces: the assembled source, compiled syntax-only by clang as C++ for OpenCL 2021
//    with the generic address space switched off and MSL's four address spaces mapped onto
//    OpenCL's (shaders/metal/compat/opencl/metal_stdlib), so that an implicit conversion between
//    device, threadgroup, constant and thread pointers is an error, as it is in MSL. Skipped, with
//    the reason, where clang is not installed (Debian: apt-get install clang); a clean result is
//    cached per content hash. Each check is also shown to reject a planted violation.
import { describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  assembleMetalSource, builtinAttributeErrors, metalKernels, metalShaderDir, metalShaderFiles, parseKernels,
} from "../ts/backend/metal-shaders.ts";

test("the kernels built in (imported as text, embedded by build:bin) are exactly shaders/metal's files", () => {
  const dir = metalShaderDir();
  const onDisk = readdirSync(dir).filter((f) => /\.(metal|h)$/.test(f)).sort();
  const embedded = metalShaderFiles();
  expect([...embedded.keys()]).toEqual(onDisk);
  for (const f of onDisk) expect(embedded.get(f)).toBe(readFileSync(join(dir, f), "utf8"));
  expect(assembleMetalSource()).toBe(assembleMetalSource(dir));
});

describe("built-in attributes agree in width", () => {
  test("every kernel of shaders/metal", () => {
    const kernels = [...metalKernels().values()];
    expect(kernels.length).toBeGreaterThan(30);
    expect(kernels.flatMap(builtinAttributeErrors)).toEqual([]);
  });

  test("a scalar group position beside a uint3 group size, and a vector index, are rejected", () => {
    const [mixed] = parseKernels(`kernel void k(device float* x [[buffer(0)]],
      uint row [[threadgroup_position_in_grid]], uint3 size [[threads_per_threadgroup]]) {}`);
    expect(builtinAttributeErrors(mixed)).toEqual([expect.stringContaining("mix component counts")]);
    const [vectorIndex] = parseKernels(`kernel void k(uint2 lane [[thread_index_in_simdgroup]]) {}`);
    expect(builtinAttributeErrors(vectorIndex)).toEqual([expect.stringContaining("must be a scalar")]);
    const [fine] = parseKernels(`kernel void k(uint3 tg [[threadgroup_position_in_grid]],
      ushort3 tid [[thread_position_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {}`);
    expect(builtinAttributeErrors(fine)).toEqual([]);
  });
});

const clang = Bun.which("clang");
const openclCompat = join(metalShaderDir(), "compat", "opencl");
const CLANG_FLAGS = ["-x", "clcpp", "-cl-std=clc++2021", "-cl-no-stdinc",
  "-Xclang", "-cl-ext=-__opencl_c_generic_address_space,-__opencl_c_pipes,-__opencl_c_device_enqueue",
  "-Werror", "-Wno-unknown-attributes", "-fsyntax-only"];

/** The kernels as C++ for OpenCL; `[[threadgroup(n)]]` renamed as for the emulator (the macro). */
function openclSource(source: string): string {
  return source.replace(/\[\[\s*threadgroup\s*\(/g, "[[threadgroup_binding(");
}

/** clang's diagnostics for `source`, or "" when it compiles; cached per content when clean. */
function addressSpaceCheck(source: string): string {
  const text = openclSource(source);
  const compat = readFileSync(join(openclCompat, "metal_stdlib"), "utf8");
  const hash = Bun.hash(text + compat + CLANG_FLAGS.join(" ")).toString(16);
  const dir = join(tmpdir(), "infer-metal-msl");
  const stamp = join(dir, `${hash}.ok`);
  if (existsSync(stamp)) return "";
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${hash}-${process.pid}.clcpp`);
  writeFileSync(file, text);
  const proc = Bun.spawnSync([clang!, ...CLANG_FLAGS, "-I", openclCompat, "-I", metalShaderDir(), file],
    { stdout: "pipe", stderr: "pipe" });
  rmSync(file, { force: true });
  const output = proc.stderr.toString() + proc.stdout.toString();
  if (proc.exitCode === 0 && output.trim() === "") writeFileSync(stamp, "");
  return proc.exitCode === 0 ? output.trim() : output.trim() || `clang exited ${proc.exitCode}`;
}

describe("address spaces (clang, C++ for OpenCL without a generic address space)", () => {
  if (!clang) console.log("  skipped: clang is not installed (apt-get install clang); the MSL address-space check needs it");

  test.skipIf(!clang)("the assembled kernels convert no pointer between address spaces", () => {
    expect(addressSpaceCheck(assembleMetalSource())).toBe("");
  });

  test.skipIf(!clang)("a threadgroup pointer assigned to a device pointer is rejected", () => {
    const source = assembleMetalSource().replace("float total = 0.0f;",
      "float total = 0.0f; device const float* wrong = partial; (void)wrong;");
    expect(source).toContain("wrong = partial");
    expect(addressSpaceCheck(source)).toMatch(/error: cannot initialize .*__global.*__local/);
  });

  test.skipIf(!clang)("a device pointer passed where a thread pointer is declared is rejected", () => {
    const source = assembleMetalSource() + `
inline void takes_thread(thread float* p) { p[0] = 0.0f; }
kernel void planted(device float* x [[buffer(0)]]) { takes_thread(x); }
`;
    expect(addressSpaceCheck(source)).toMatch(/error: no matching function for call to 'takes_thread'/);
  });

  test.skipIf(!clang)("a simdgroup_load from thread memory (MSL has device and threadgroup only) is rejected", () => {
    const source = assembleMetalSource() + `
kernel void planted(device float* x [[buffer(0)]]) {
    float v[64];
    simdgroup_float8x8 m;
    simdgroup_load(m, v, 8);
    simdgroup_store(m, x, 8);
}
`;
    expect(addressSpaceCheck(source)).toMatch(/error: no matching function for call to 'simdgroup_load'/);
  });
});
