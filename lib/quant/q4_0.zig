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

/// The 32 stored nibbles of a block (0..15, offset 8), in value order.
inline fn unpackUnsigned(b: *align(1) const Block) simd.V32u8 {
    const packed_qs: @Vector(16, u8) = b.qs;
    // Both halves hold the 16 bytes; the upper half shifts its 16-bit lanes right by 4.
    const both: @Vector(16, u16) = @bitCast(simd.concat16(packed_qs, packed_qs));
    const shift = @Vector(16, u16){ 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4 };
    return @as(simd.V32u8, @bitCast(both >> shift)) & @as(simd.V32u8, @splat(15));
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

/// The float arithmetic of ggml_gemv_q4_0_8x8_q8_0 (arch/x86/repack.cpp), which llama.cpp runs
/// for Q4_0 matmuls on an AVX2/AVX-512 CPU (weights repacked to block_q4_0x8 at load when
/// n_out % 8 == 0): one exact integer per 32-value block, one f32 FMA chain per row,
///   acc = fma(f32(sum_i q_i * x_i), d_w * d_x, acc).
/// Written as a plain scalar loop: the reference the fast path must equal bit for bit.
pub fn dotGgmlScalar(w: []align(1) const Block, x: []align(1) const q8_0.Block) f32 {
    std.debug.assert(w.len == x.len);
    var acc: f32 = 0;
    for (w, x) |wb, xb| {
        var sumi: i32 = 0;
        for (0..16) |j| {
            sumi += (@as(i32, wb.qs[j] & 15) - 8) * xb.qs[j];
            sumi += (@as(i32, wb.qs[j] >> 4) - 8) * xb.qs[j + 16];
        }
        acc = @mulAdd(f32, @floatFromInt(sumi), @as(f32, wb.d) * @as(f32, xb.d), acc);
    }
    return acc;
}

pub fn dot(w: []align(1) const Block, x: []align(1) const q8_0.Block) f32 {
    std.debug.assert(w.len == x.len);
    return dotMulti(1, w, .{x.ptr})[0];
}

/// Dots one weight row with R activation rows, unpacking each weight block once for all R.
/// Rounds as dotGgmlScalar. Blocks go in groups of 8 so that one transposing reduction turns
/// their 8 integer partial vectors into 8 block sums (the sums are exact in any order; only
/// the FMA chain must follow the blocks one by one).
pub fn dotMulti(
    comptime R: usize,
    w: []align(1) const Block,
    xs: [R][*]align(1) const q8_0.Block,
) [R]f32 {
    var acc: [R]f32 = @splat(0);
    const group = 8;
    var i: usize = 0;
    while (i + group <= w.len) : (i += group) {
        var partial: [R][group]simd.V8i32 = undefined;
        inline for (0..group) |b| {
            const q = unpackUnsigned(&w[i + b]);
            inline for (0..R) |r| partial[r][b] = blockPartial(q, xs[r][i + b].qs);
        }
        inline for (0..R) |r| {
            const sums: [8]i32 = simd.reduceEight(partial[r]);
            inline for (0..group) |b| {
                const d = @as(f32, w[i + b].d) * @as(f32, xs[r][i + b].d);
                acc[r] = @mulAdd(f32, @floatFromInt(sums[b]), d, acc[r]);
            }
        }
    }
    while (i < w.len) : (i += 1) {
        const q = unpackUnsigned(&w[i]);
        inline for (0..R) |r| {
            const sumi = @reduce(.Add, blockPartial(q, xs[r][i].qs));
            const d = @as(f32, w[i].d) * @as(f32, xs[r][i].d);
            acc[r] = @mulAdd(f32, @floatFromInt(sumi), d, acc[r]);
        }
    }
    return acc;
}

/// (q - 8) . x in 8 lanes of partial sums, as q . x - 8 * sum(x): two unsigned x signed dots
/// (q <= 15 and 8 keep AVX2's pairs far inside i16).
inline fn blockPartial(q: simd.V32u8, x: simd.V32i8) simd.V8i32 {
    const eight: simd.V32u8 = @splat(8);
    return simd.dotU7I8(q, x) - simd.dotU7I8(eight, x);
}

const test_util = @import("test_util.zig");

fn fixBlock(b: *Block, rng: *test_util.TestRng) void {
    b.d = test_util.randomScale(rng, true);
}

test "q4_0 dot: fast matches scalar; quantized dot matches f32" {
    try test_util.checkDot(@This(), q8_0, 40, fixBlock);
}

test "q4_0 dot: bit-identical to ggml's x86 gemv order" {
    try simd.expectGgmlOrder(@This(), q8_0, 140, fixBlock);
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
