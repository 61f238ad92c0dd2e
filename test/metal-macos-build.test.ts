// Method: cross-compile the macOS library (aarch64-macos, every CPU variant) with the pinned Zig,
// exactly as a Mac builds it, and demand success with no warnings; then check that the dylibs
// are arm64 Mach-O, export the Metal entry points and carry the Metal host code (its Objective-C
// selectors), while the Linux libraries carry only the "not available" stubs. This is what the
// Linux CI can prove of lib/metal: it compiles for its target; it has not run on Apple hardware.
import { expect, test } from "bun:test";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const root = join(import.meta.dir, "..");

test("the aarch64-macos library cross-compiles with no warnings and carries the Metal host code", () => {
  const prefix = mkdtempSync(join(tmpdir(), "infer-macos-"));
  try {
    const proc = Bun.spawnSync(["python3", "-m", "ziglang", "build", "-Dtarget=aarch64-macos", "-Doptimize=ReleaseFast",
      "--prefix", prefix], { cwd: root, stdout: "pipe", stderr: "pipe" });
    const output = proc.stdout.toString() + proc.stderr.toString();
    if (proc.exitCode !== 0) console.error(output);
    expect(proc.exitCode).toBe(0);
    expect(output).not.toMatch(/warning/i);
    const libs = readdirSync(join(prefix, "lib")).sort();
    expect(libs).toEqual(["libinfer-aarch64.dylib", "libinfer-aarch64_dotprod.dylib"]);
    for (const name of libs) {
      const bytes = readFileSync(join(prefix, "lib", name));
      const view = new DataView(bytes.buffer, bytes.byteOffset);
      expect(view.getUint32(0, true)).toBe(0xfeedfacf); // MH_MAGIC_64
      expect(view.getUint32(4, true)).toBe(0x0100000c); // CPU_TYPE_ARM64
      const text = bytes.toString("latin1");
      for (const symbol of ["_infer_metal_init", "_infer_metal_encode", "_infer_metal_flush", "_infer_matmul"]) {
        expect(text).toContain(symbol);
      }
      for (const selector of ["newLibraryWithSource:options:error:", "newBufferWithBytesNoCopy:length:options:deallocator:",
        "dispatchThreadgroups:threadsPerThreadgroup:", "/System/Library/Frameworks/Metal.framework/Metal",
        // device discovery: CoreGraphics loaded first, MTLCopyAllDevices as the fallback
        "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics", "MTLCopyAllDevices", "objectAtIndex:",
        // the step's command buffer and encoder retained across calls; the limits for buffer views
        "retain", "maxBufferLength", "_infer_metal_device_limits"]) {
        expect(text).toContain(selector);
      }
    }
  } finally {
    rmSync(prefix, { recursive: true, force: true });
  }
}, 300_000);

// Each exported call pushes and pops its own autorelease pool (a pool pushed in one FFI call and
// popped in another is unbalanced whenever an error path or another thread comes between):
// checked on the source the cross-compile above built, function by function.
test("every Metal entry point that messages Objective-C pushes and pops its own autorelease pool", () => {
  const source = readFileSync(join(root, "lib", "metal", "metal.zig"), "utf8");
  const fns = [...source.matchAll(/^pub fn (\w+)\([\s\S]*?^}$/gm)];
  expect(fns.map((m) => m[1])).toEqual(["init", "deviceName", "deviceLimits", "bufferNew", "bufferWrap", "bufferFree",
    "encode", "barrier", "flush"]);
  for (const [body, name] of fns) {
    const pushes = body.match(/const pool = (?:s\.)?rt\.objc_autoreleasePoolPush\(\);\n\s*defer (?:s\.)?rt\.objc_autoreleasePoolPop\(pool\);/g);
    expect(pushes?.length ?? 0, name).toBe(1);
    expect(body.match(/objc_autoreleasePool(Push|Pop)/g)?.length, name).toBe(2);
  }
  expect(source).not.toMatch(/pool:\s*\?\*anyopaque/);
});

test("the Linux libraries carry no Metal host code, only the stubs", () => {
  const dir = join(root, "zig-out", "lib");
  const libs = existsSync(dir) ? readdirSync(dir).filter((f) => /^libinfer.*\.so$/.test(f)) : [];
  expect(libs.length).toBeGreaterThan(0);
  for (const name of libs) {
    const text = readFileSync(join(dir, name)).toString("latin1");
    expect(text).toContain("infer_metal_init");
    expect(text).not.toContain("newLibraryWithSource");
  }
});
