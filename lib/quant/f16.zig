//! F16 weights (IEEE binary16), dotted with f32 activations; products accumulate in f32.
//! A departure from ggml's CPU backend, whose vec_dot_type for F16 is F16 (activations rounded to
//! f16 before every matmul): that rounding (2^-11 per value) alone moved an imported model's
//! logits by 0.9e-3 to 1.7e-3 against transformers, over the 1e-3 an F16 import must meet, while
//! f32 activations leave only the weights' own rounding. ggml's Metal backend (mul_mv_f16_f32)
//! keeps activations in f32 too, and reading them costs nothing next to the weights.
const std = @import("std");
const simd = @import("simd.zig");

pub const block_values = 1;
pub const Block = f16;
comptime {
    std.debug.assert(@sizeOf(Block) == 2);
}

pub fn toF32(h: f16) f32 {
    return @floatCast(h);
}

/// Round-to-nearest-even, overflow to infinity: Zig's @floatCast is IEEE conversion.
pub fn fromF32(v: f32) f16 {
    return @floatCast(v);
}

pub fn dequantize(src: []align(1) const Block, dst: []f32) void {
    std.debug.assert(src.len == dst.len);
    for (src, dst) |h, *d| d.* = @floatCast(h);
}

/// f32 -> f16 with IEEE rounding: how weights are packed (the converter, tests).
pub fn quantize(src: []const f32, dst: []align(1) Block) void {
    std.debug.assert(src.len == dst.len);
    for (src, dst) |v, *d| d.* = @floatCast(v);
}

pub fn dotScalar(w: []align(1) const Block, x: []align(1) const f32) f32 {
    std.debug.assert(w.len == x.len);
    var sum: f64 = 0;
    for (w, x) |a, b| sum += @as(f64, @floatCast(a)) * @as(f64, b);
    return @floatCast(sum);
}

const lanes = 16;
const V = @Vector(lanes, f32);
const Vh = @Vector(lanes, f16);

pub fn dot(w: []align(1) const Block, x: []align(1) const f32) f32 {
    std.debug.assert(w.len == x.len);
    var acc0: V = @splat(0);
    var acc1: V = @splat(0);
    var i: usize = 0;
    while (i + 2 * lanes <= w.len) : (i += 2 * lanes) {
        const w0: V = @floatCast(@as(Vh, w[i..][0..lanes].*));
        const x0: V = x[i..][0..lanes].*;
        const w1: V = @floatCast(@as(Vh, w[i + lanes ..][0..lanes].*));
        const x1: V = x[i + lanes ..][0..lanes].*;
        acc0 = @mulAdd(V, w0, x0, acc0);
        acc1 = @mulAdd(V, w1, x1, acc1);
    }
    var sum = @reduce(.Add, acc0 + acc1);
    while (i < w.len) : (i += 1) sum += @as(f32, @floatCast(w[i])) * x[i];
    return sum;
}

test "f16 dot: fast path matches the scalar reference" {
    var rng = simd.TestRng.init(16);
    for ([_]usize{ 1, 7, 32, 33, 100, 1000 }) |n| {
        var wf: [1000]f32 = undefined;
        var xf: [1000]f32 = undefined;
        rng.floats(wf[0..n], 2);
        rng.floats(xf[0..n], 2);
        var w: [1000]f16 = undefined;
        quantize(wf[0..n], w[0..n]);
        const want = dotScalar(w[0..n], xf[0..n]);
        const got = dot(w[0..n], xf[0..n]);
        try std.testing.expectApproxEqAbs(want, got, 1e-4 * @as(f32, @floatFromInt(n)));
    }
    try std.testing.expectEqual(@as(u16, 0x3c00), @as(u16, @bitCast(fromF32(1.0))));
    // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: rounds to even (1.0).
    try std.testing.expectEqual(@as(f16, 1.0), fromF32(1.0 + 1.0 / 2048.0));
}
