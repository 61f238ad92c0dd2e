//! libinfer's C surface, gathered from its export files by area: every function is C-ABI, named
//! infer_<area>_<verb>, takes plain types (or, past a handful of arguments, a struct of
//! lib/abi.zig), and returns an i32 Status where it can fail (message: infer_last_error).
//! ts/native/symbols.gen.ts is generated from these files' `export fn` lines and lib/abi.zig
//! (bun ts/native/gen-symbols.ts), so the two sides cannot drift.
//!   exports/core.zig    version, last error, settings, file mappings, huge-page regions
//!   exports/cpu.zig     quant formats, matmul, threads, the f32 ops (lib/quant/, lib/cpu/)
//!   exports/altup.zig   Gemma 3n's AltUp, sparsity and row ops (lib/cpu/altup.zig)
//!   exports/cuda.zig    the CUDA backend (lib/cuda/, shaders/cuda/)
//!   exports/metal.zig   the Metal backend (lib/metal/, shaders/metal/)
const std = @import("std");

pub const core = @import("exports/core.zig");
pub const cpu = @import("exports/cpu.zig");
pub const altup = @import("exports/altup.zig");
pub const cuda = @import("exports/cuda.zig");
pub const metal = @import("exports/metal.zig");

comptime {
    _ = core;
    _ = cpu;
    _ = altup;
    _ = cuda;
    _ = metal;
}

test {
    std.testing.refAllDecls(@This());
    std.testing.refAllDecls(core);
    std.testing.refAllDecls(cpu);
    std.testing.refAllDecls(altup);
    std.testing.refAllDecls(cuda);
    std.testing.refAllDecls(metal);
    _ = @import("nonfinite_test.zig");
}
