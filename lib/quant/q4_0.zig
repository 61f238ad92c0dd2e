//! Q4_0: 32 values in 18 bytes: an f16 scale `d` and 16 bytes of nibbles.
//! Value j < 16 = ((qs[j] & 15) - 8) * d; value j + 16 = ((qs[j] >> 4) - 8) * d.
//! Dotted with Q8_0 activations (ggml's vec_dot_type for Q4_0).
const std = @import("std");
const simd = @import("simd.zig");
const q8_0 = @import("q8_0.zig");

pub const block_values = 32;
pub const Block = extern struct {
    d: f16,
    qs: [16]u8,
};
comptime {
    std.debug.assert(@sizeOf(Block) == 18);
}

/// The 32 quants of a block as signed values in [-8, 7], in value order.
inline fn unpack(b: *align(1) const Block) simd.V32i8 {
    const packed_qs: @Vector(16, u8) = b.qs;
    const q = simd.concat16(packed_qs & @as(@Vector(16, u8), @splat(15)), packed_qs >> @splat(4));
    return @as(simd.V32i8, @bitCast(q)) -% @as(simd.V32i8, @splat(8));
}

pub fn dequantize(src: []align(1) const Block, dst: []f32) void {
    std.debug.assert(dst.len == src.len * block_values);
    for (src, 0..) |*b, i| {
        const d: f32 = b.d;
        const out = dst[i * 32 ..][0..32];
        for (0..16) |j| {
            out[j] = @as(f32, @floatFromInt(@as(i32, b.qs[j] & 15) - 8)) * d;
            out[j + 16] = @as(f32, @floatFromInt(@as(i32, b.qs[j] >> 4) - 8)) * d;
        }
    }
}

/// ggml's quantize_row_q4_0_ref: d = max/-8 (max = the value of largest magnitude),
/// q = min(15, trunc(x/d + 8.5)).
pub fn quantizeRef(src: []const f32, dst: []align(1) Block) void {
    std.debug.assert(src.len == dst.len * block_values);
    for (dst, 0..) |*b, i| {
        const x = src[i * 32 ..][0..32];
        var amax: f32 = 0;
        var max: f32 = 0;
        for (x) |v| if (@abs(v) > amax) {
            amax = @abs(v);
            max = v;
        };
        const d = max / -8.0;
        const id: f32 = if (d != 0) 1.0 / d else 0;
        b.d = @floatCast(d);
        for (0..16) |j| {
            const q0: u8 = @intFromFloat(@min(15.0, @trunc(x[j] * id + 8.5)));
            const q1: u8 = @intFromFloat(@min(15.0, @trunc(x[j + 16] * id + 8.5)));
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// ggml_vec_dot_q4_0_q8_0_generic: integer sum per block, scaled by d_w * d_x.
pub fn dotScalar(w: []align(1) const Block, x: []align(1) const q8_0.Block) f32 {
    std.debug.assert(w.len == x.len);
    var sum: f32 = 0;
    for (w, x) |wb, xb| {
        var sumi: i32 = 0;
        for (0..16) |j| {
            sumi += (@as(i32, wb.qs[j] & 15) - 8) * xb.qs[j];
            sumi += (@as(i32, wb.qs[j] >> 4) - 8) * xb.qs[j + 16];
        }
        sum += @as(f32, @floatFromInt(sumi)) * (@as(f32, wb.d) * @as(f32, xb.d));
    }
    return sum;
}

pub fn dot(w: []align(1) const Block, x: []align(1) const q8_0.Block) f32 {
    std.debug.assert(w.len == x.len);
    // One accumulator, block by block, as ggml's AVX2 kernel: the rounding then equals
    // llama.cpp's and the multi-row path's, so a batch gives exactly what single tokens give.
    var acc: simd.V8f32 = @splat(0);
    for (w, x) |*wb, *xb| acc = blockDot(acc, wb, xb);
    return simd.hsum(acc);
}

inline fn blockDot(
    acc: simd.V8f32,
    w: *align(1) const Block,
    x: *align(1) const q8_0.Block,
) simd.V8f32 {
    const sumi = simd.dotAccI8I8(@splat(0), unpack(w), x.qs);
    const d: simd.V8f32 = @splat(@as(f32, w.d) * @as(f32, x.d));
    return @mulAdd(simd.V8f32, d, @floatFromInt(sumi), acc);
}

pub fn dotMulti(
    comptime R: usize,
    w: []align(1) const Block,
    xs: [R][*]align(1) const q8_0.Block,
) [R]f32 {
    return q8_0.dotMultiSigned(Block, unpack, R, w, xs);
}

const test_util = @import("test_util.zig");

fn fixBlock(b: *Block, rng: *test_util.TestRng) void {
    b.d = test_util.randomScale(rng, true);
}

test "q4_0 dot: fast matches scalar; quantized dot matches f32" {
    try test_util.checkDot(@This(), q8_0, 40, fixBlock);
}

test "q4_0 quantizeRef round-trips within one step" {
    var rng = test_util.TestRng.init(41);
    var x: [64]f32 = undefined;
    rng.floats(&x, 1);
    var b: [2]Block = undefined;
    quantizeRef(&x, &b);
    var y: [64]f32 = undefined;
    dequantize(&b, &y);
    for (x, y, 0..) |a, c, i| {
        try std.testing.expect(@abs(a - c) <= @abs(@as(f32, b[i / 32].d)) * 1.01);
    }
}
