//! The block layouts the Metal kernels read (shaders/metal/blocks.h, @cImport-ed as C, where a
//! half is its 16 bits) against the CPU's extern structs (lib/quant/*.zig): every size and every
//! field offset, so the GPU and CPU cannot disagree about a GGUF's bytes.
const std = @import("std");
const c = @cImport(@cInclude("blocks.h"));
const types = @import("../quant/types.zig");

fn expectSameLayout(comptime C: type, comptime Zig: type) !void {
    try std.testing.expectEqual(@sizeOf(Zig), @sizeOf(C));
    inline for (@typeInfo(Zig).@"struct".fields) |f| {
        try std.testing.expectEqual(@offsetOf(Zig, f.name), @offsetOf(C, f.name));
        try std.testing.expectEqual(@sizeOf(f.type), @sizeOf(@FieldType(C, f.name)));
    }
    try std.testing.expectEqual(@typeInfo(Zig).@"struct".fields.len, @typeInfo(C).@"struct".fields.len);
}

test "shaders/metal/blocks.h matches lib/quant's block structs" {
    try expectSameLayout(c.block_q4_0, types.q4_0.Block);
    try expectSameLayout(c.block_q5_0, types.q5_0.Block);
    try expectSameLayout(c.block_q8_0, types.q8_0.Block);
    try expectSameLayout(c.block_q4_k, types.q4_k.Block);
    try expectSameLayout(c.block_q5_k, types.q5_k.Block);
    try expectSameLayout(c.block_q6_k, types.q6_k.Block);
    try expectSameLayout(c.block_q8_k, types.q8_k.Block);
    try std.testing.expectEqual(32, c.QK4_0);
    try std.testing.expectEqual(256, c.QK_K);
}
