//! BF16 weights (the top 16 bits of an f32). ggml's vec_dot_type for BF16 is BF16: activations
//! are rounded to bf16 (round-to-nearest-even, NaN kept quiet, as ggml_compute_fp32_to_bf16)
//! and the products are accumulated in f32.
const std = @import("std");
const simd = @import("simd.zig");

pub const block_values = 1;
pub const Block = u16;
comptime {
    std.debug.assert(@sizeOf(Block) == 2);
}

pub fn toF32(h: u16) f32 {
    return @bitCast(@as(u32, h) << 16);
}

pub fn fromF32(v: f32) u16 {
    const bits: u32 = @bitCast(v);
    if (bits & 0x7fffffff > 0x7f800000) return @truncate((bits >> 16) | 64); // quiet NaN
    const rounding = 0x7fff + ((bits >> 16) & 1);
    return @truncate((@as(u64, bits) + rounding) >> 16);
}

pub fn dequantize(src: []align(1) const Block, dst: []f32) void {
    std.debug.assert(src.len == dst.len);
    for (src, dst) |h, *d| d.* = toF32(h);
}

pub fn quantize(src: []const f32, dst: []align(1) Block) void {
    std.debug.assert(src.len == dst.len);
    for (src, dst) |v, *d| d.* = fromF32(v);
}

pub fn dotScalar(w: []align(1) const Block, x: []align(1) const Block) f32 {
    std.debug.assert(w.len == x.len);
    var sum: f64 = 0;
    for (w, x) |a, b| sum += @as(f64, toF32(a)) * @as(f64, toF32(b));
    return @floatCast(sum);
}

const lanes = 16;
const V = @Vector(lanes, f32);
const Vu = @Vector(lanes, u32);

inline fn widen(p: []align(1) const u16) V {
    const h: @Vector(lanes, u16) = p[0..lanes].*;
    return @bitCast(@as(Vu, h) << @splat(16));
}

pub fn dot(w: []align(1) const Block, x: []align(1) const Block) f32 {
    std.debug.assert(w.len == x.len);
    var acc0: V = @splat(0);
    var acc1: V = @splat(0);
    var i: usize = 0;
    while (i + 2 * lanes <= w.len) : (i += 2 * lanes) {
        acc0 = @mulAdd(V, widen(w[i..]), widen(x[i..]), acc0);
        acc1 = @mulAdd(V, widen(w[i + lanes ..]), widen(x[i + lanes ..]), acc1);
    }
    var sum = @reduce(.Add, acc0 + acc1);
    while (i < w.len) : (i += 1) sum += toF32(w[i]) * toF32(x[i]);
    return sum;
}

test "bf16 dot: fast path matches the scalar reference; rounding is nearest-even" {
    var rng = simd.TestRng.init(30);
    for ([_]usize{ 1, 7, 32, 33, 100, 1000 }) |n| {
        var wf: [1000]f32 = undefined;
        var xf: [1000]f32 = undefined;
        rng.floats(wf[0..n], 2);
        rng.floats(xf[0..n], 2);
        var w: [1000]u16 = undefined;
        var x: [1000]u16 = undefined;
        quantize(wf[0..n], w[0..n]);
        quantize(xf[0..n], x[0..n]);
        const want = dotScalar(w[0..n], x[0..n]);
        const got = dot(w[0..n], x[0..n]);
        try std.testing.expectApproxEqAbs(want, got, 1e-4 * @as(f32, @floatFromInt(n)));
    }
    try std.testing.expectEqual(@as(u16, 0x3f80), fromF32(1.0));
    // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0).
    try std.testing.expectEqual(@as(u16, 0x3f80), fromF32(1.0 + 1.0 / 256.0));
    try std.testing.expectEqual(@as(u16, 0x3f82), fromF32(1.0 + 3.0 / 256.0));
}
