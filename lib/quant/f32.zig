//! F32 weights: dotted with f32 activations (ggml's vec_dot_type for F32 is F32).
const std = @import("std");
const simd = @import("simd.zig");

pub const block_values = 1;
pub const Block = f32;

pub fn dequantize(src: []align(1) const Block, dst: []f32) void {
    std.debug.assert(src.len == dst.len);
    for (src, dst) |v, *d| d.* = v;
}

pub fn quantize(src: []const f32, dst: []align(1) Block) void {
    std.debug.assert(src.len == dst.len);
    for (src, dst) |v, *d| d.* = v;
}

pub fn dotScalar(w: []align(1) const Block, x: []align(1) const Block) f32 {
    std.debug.assert(w.len == x.len);
    var sum: f64 = 0;
    for (w, x) |a, b| sum += @as(f64, a) * @as(f64, b);
    return @floatCast(sum);
}

const lanes = 16;
const V = @Vector(lanes, f32);

pub fn dot(w: []align(1) const Block, x: []align(1) const Block) f32 {
    std.debug.assert(w.len == x.len);
    var acc0: V = @splat(0);
    var acc1: V = @splat(0);
    var i: usize = 0;
    while (i + 2 * lanes <= w.len) : (i += 2 * lanes) {
        acc0 = @mulAdd(V, w[i..][0..lanes].*, x[i..][0..lanes].*, acc0);
        acc1 = @mulAdd(V, w[i + lanes ..][0..lanes].*, x[i + lanes ..][0..lanes].*, acc1);
    }
    var sum = @reduce(.Add, acc0 + acc1);
    while (i < w.len) : (i += 1) sum += w[i] * x[i];
    return sum;
}

test "f32 dot: fast path matches the scalar reference" {
    var rng = simd.TestRng.init(32);
    for ([_]usize{ 1, 7, 32, 33, 100, 1000 }) |n| {
        var w: [1000]f32 = undefined;
        var x: [1000]f32 = undefined;
        rng.floats(w[0..n], 2);
        rng.floats(x[0..n], 2);
        const want = dotScalar(w[0..n], x[0..n]);
        const tolerance = 1e-4 * @as(f32, @floatFromInt(n));
        try std.testing.expectApproxEqAbs(want, dot(w[0..n], x[0..n]), tolerance);
    }
}
