//! Builds libinfer (the C-ABI kernel library loaded by ts/native through bun:ffi) and its tests,
//! and bench/bandwidth.zig's memory-bandwidth probe (zig-out/lib/libbench-bandwidth.so).
//!   python3 -m ziglang build -Doptimize=ReleaseFast   -> zig-out/lib/libinfer-<variant>.so, one
//!       per instruction-set level of the host's architecture; ts/native/cpu.ts picks the best one
//!       the running CPU supports (x86-64: v2, v3 = AVX2, v4 + VNNI = AVX-512; aarch64: NEON,
//!       NEON + dot product). Every variant computes the same bits.
//!   python3 -m ziglang build test                      -> every inline test under lib/, native CPU
//!   ... test -Dtarget=aarch64-linux-musl -Dcpu=generic+dotprod -fqemu   -> the same under qemu
//!   ... -Dtarget=aarch64-macos                         -> the macOS dylibs, Metal host code included
//!       (lib/metal loads the Objective-C runtime at run time: no SDK needed to build)
const std = @import("std");

// Pinned: the setup installs exactly this Zig from PyPI (`ziglang`).
const zig_version_required = "0.14.1";

const Variant = struct {
    name: []const u8,
    model: *const std.Target.Cpu.Model,
    features: std.Target.Cpu.Feature.Set = std.Target.Cpu.Feature.Set.empty,
};

const x86_variants = [_]Variant{
    .{ .name = "x86_64_v2", .model = &std.Target.x86.cpu.x86_64_v2 },
    .{ .name = "x86_64_v3", .model = &std.Target.x86.cpu.x86_64_v3 },
    .{
        .name = "x86_64_v4_vnni",
        .model = &std.Target.x86.cpu.x86_64_v4,
        .features = std.Target.x86.featureSet(&.{.avx512vnni}),
    },
};

const aarch64_variants = [_]Variant{
    .{ .name = "aarch64", .model = &std.Target.aarch64.cpu.generic },
    .{
        .name = "aarch64_dotprod",
        .model = &std.Target.aarch64.cpu.generic,
        .features = std.Target.aarch64.featureSet(&.{.dotprod}),
    },
};

pub fn build(b: *std.Build) void {
    comptime {
        const have = @import("builtin").zig_version_string;
        if (!std.mem.eql(u8, have, zig_version_required))
            @compileError("infer needs Zig " ++ zig_version_required ++ ", found " ++ have);
    }
    const target = b.standardTargetOptions(.{});
    const optimize = b.standardOptimizeOption(.{});
    // -Dstrip: no debug information or local symbols (the package's prebuilt libraries).
    const strip = b.option(bool, "strip", "Strip debug information and local symbols");

    const variants: []const Variant = switch (target.result.cpu.arch) {
        .x86_64 => &x86_variants,
        .aarch64 => &aarch64_variants,
        else => &.{},
    };
    for (variants) |v| {
        var query = target.query;
        query.cpu_model = .{ .explicit = v.model };
        query.cpu_features_add = v.features;
        query.cpu_features_sub = std.Target.Cpu.Feature.Set.empty;
        const lib = b.addLibrary(.{
            .linkage = .dynamic,
            .name = b.fmt("infer-{s}", .{v.name}),
            .root_module = rootModule(b, b.resolveTargetQuery(query), optimize, strip),
        });
        b.installArtifact(lib);
    }
    if (variants.len == 0) { // another architecture: one library for the requested CPU
        const lib = b.addLibrary(.{
            .linkage = .dynamic,
            .name = "infer",
            .root_module = rootModule(b, target, optimize, strip),
        });
        b.installArtifact(lib);
    }

    // The memory bandwidth probe of bench/bandwidth.ts: a library of its own, not libinfer's,
    // built for this machine only (cross-compiles make libinfer alone).
    if (target.query.isNative()) {
        b.installArtifact(b.addLibrary(.{
            .linkage = .dynamic,
            .name = "bench-bandwidth",
            .root_module = benchModule(b, target, optimize),
        }));
    }

    const tests = b.addTest(.{ .root_module = rootModule(b, target, optimize, null) });
    const bench_tests = b.addTest(.{ .root_module = benchModule(b, target, optimize) });
    const test_step = b.step("test", "Run every Zig test (fast paths against scalar references)");
    test_step.dependOn(&b.addRunArtifact(tests).step);
    test_step.dependOn(&b.addRunArtifact(bench_tests).step);
}

fn benchModule(b: *std.Build, target: std.Build.ResolvedTarget, optimize: std.builtin.OptimizeMode) *std.Build.Module {
    const module = b.createModule(.{
        .root_source_file = b.path("bench/bandwidth.zig"),
        .target = target,
        .optimize = optimize,
        .link_libc = true,
    });
    module.addImport("threads", b.createModule(.{
        .root_source_file = b.path("lib/cpu/threads.zig"),
        .target = target,
        .optimize = optimize,
        .link_libc = true,
    }));
    return module;
}

fn rootModule(
    b: *std.Build,
    target: std.Build.ResolvedTarget,
    optimize: std.builtin.OptimizeMode,
    strip: ?bool,
) *std.Build.Module {
    const module = b.createModule(.{
        .root_source_file = b.path("lib/root.zig"),
        .target = target,
        .optimize = optimize,
        .link_libc = true,
        .strip = strip,
    });
    // shaders/metal/blocks.h: the Metal block layouts, checked against lib/quant by a Zig test.
    module.addIncludePath(b.path("shaders/metal"));
    return module;
}
