//! Builds libinfer (the C-ABI kernel library loaded by ts/native through bun:ffi) and its tests.
//!   python3 -m ziglang build -Doptimize=ReleaseFast      -> zig-out/lib/libinfer.so
//!   python3 -m ziglang build test                         -> every inline test under lib/
const std = @import("std");

// Pinned: the setup installs exactly this Zig from PyPI (`ziglang`).
const zig_version_required = "0.14.1";

pub fn build(b: *std.Build) void {
    comptime {
        const have = @import("builtin").zig_version_string;
        if (!std.mem.eql(u8, have, zig_version_required))
            @compileError("infer needs Zig " ++ zig_version_required ++ ", found " ++ have);
    }
    const target = b.standardTargetOptions(.{});
    const optimize = b.standardOptimizeOption(.{});

    const root = b.createModule(.{
        .root_source_file = b.path("lib/root.zig"),
        .target = target,
        .optimize = optimize,
        .link_libc = true,
    });
    const lib = b.addLibrary(.{ .linkage = .dynamic, .name = "infer", .root_module = root });
    b.installArtifact(lib);

    const tests = b.addTest(.{ .root_module = root });
    const run_tests = b.addRunArtifact(tests);
    b.step("test", "Run every Zig test (fast paths against scalar references)").dependOn(&run_tests.step);
}
