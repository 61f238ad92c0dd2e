//! Q8_K: the activation format for K-quant weights. 256 values in 292 bytes: an f32 scale `d`,
//! 256 signed bytes, and 16 sums of 16 quants each (`bsums`, used for the weights' minimums
//! and offsets so kernels need not re-add the activations). value = q * d.
const std = @import("std");
const q8_0 = @import("q8_0.zig");
const simd = @import("simd.zig");

pub const block_values = 256;
pub const Block = extern struct {
    d: f32,
    qs: [256]i8,
    bsums: [16]i16,
};
comptime {
    std.debug.assert(@sizeOf(Block) == 292);
}

/// The block's 8 sub-blocks of 32 quants (simd.scaledDots' x), loaded once for several rows.
pub inline fn subBlocks(b: *align(1) const Block) [8]simd.V32i8 {
    var x: [8]simd.V32i8 = undefined;
    inline for (0..8) |j| x[j] = simd.load32i(b.qs[32 * j ..]);
    return x;
}

pub fn dequantize(src: []align(1) const Block, dst: []f32) void {
    std.debug.assert(dst.len == src.len * block_values);
    for (src, 0..) |*b, i| {
        for (b.qs, dst[i * 256 ..][0..256]) |q, *y| y.* = @as(f32, @floatFromInt(q)) * b.d;
    }
}

/// ggml's quantize_row_q8_K_ref (ggml-cpu runs the reference for Q8_K on x86): the value of
/// largest magnitude (first one on ties) maps to -127 exactly: iscale = -127/max,
/// q = min(127, nearest_int(iscale * x)) with round-half-even, d = 1/iscale. A block holding a
/// NaN is all zeros with d = NaN (the search for the largest value skips NaN), so that its dots
/// stay NaN, as q8_0.quantize's.
pub fn quantize(src: []const f32, dst: []align(1) Block) void {
    std.debug.assert(src.len == dst.len * block_values);
    for (dst, 0..) |*b, i| {
        const x = src[i * 256 ..][0..256];
        var amax: f32 = 0;
        var max: f32 = 0;
        var nan = false;
        for (x) |v| {
            nan = nan or v != v;
            if (@abs(v) > amax) {
                amax = @abs(v);
                max = v;
            }
        }
        if (amax == 0 or nan) {
            b.* = std.mem.zeroes(Block);
            if (nan) b.d = std.math.nan(f32);
            continue;
        }
        const iscale = -127.0 / max;
        const V = @Vector(32, f32);
        for (0..8) |c| {
            const xv: V = x[c * 32 ..][0..32].*;
            const q = @min(q8_0.roundEven(xv * @as(V, @splat(iscale))), @as(V, @splat(127)));
            b.qs[c * 32 ..][0..32].* = @as(@Vector(32, i8), @intFromFloat(q));
        }
        for (&b.bsums, 0..) |*s, g| {
            var sum: i16 = 0;
            for (b.qs[g * 16 ..][0..16]) |q| sum += q;
            s.* = sum;
        }
        b.d = 1.0 / iscale;
    }
}

test "q8_k quantize: the largest magnitude maps to -127, bsums add up" {
    var x: [256]f32 = undefined;
    for (&x, 0..) |*v, i| v.* = @as(f32, @floatFromInt(i)) * 0.01 - 1.0;
    x[100] = 4.0;
    var b: [1]Block = undefined;
    quantize(&x, &b);
    try std.testing.expectEqual(@as(i8, -127), b[0].qs[100]);
    try std.testing.expectApproxEqRel(@as(f32, -4.0 / 127.0), b[0].d, 1e-6);
    var total: i32 = 0;
    for (b[0].qs) |q| total += q;
    var bsum_total: i32 = 0;
    for (b[0].bsums) |s| bsum_total += s;
    try std.testing.expectEqual(total, bsum_total);
    var y: [256]f32 = undefined;
    dequantize(&b, &y);
    for (x, y) |a, c| try std.testing.expect(@abs(a - c) <= 4.0 / 254.0 + 1e-6);
}
