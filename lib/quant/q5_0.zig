//! Q5_0: 32 values in 22 bytes: an f16 scale `d`, 32 high bits `qh` (bit j belongs to value j),
//! 16 bytes of low nibbles (value j < 16 in qs[j] & 15, value j + 16 in qs[j] >> 4).
//! value = ((low | high << 4) - 16) * d. Dotted with Q8_0 activations.
const std = @import("std");
const simd = @import("simd.zig");
const q8_0 = @import("q8_0.zig");

pub const block_values = 32;
pub const Block = extern struct {
    d: f16,
    qh: [4]u8,
    qs: [16]u8,
};
comptime {
    std.debug.assert(@sizeOf(Block) == 22);
}

fn highBits(b: *align(1) const Block) u32 {
    return std.mem.readInt(u32, &b.qh, .little);
}

/// The 32 quants of a block as signed values in [-16, 15], in value order.
inline fn unpack(b: *align(1) const Block) simd.V32i8 {
    // Bit j of qh -> lane j: one mask register move on AVX-512 (in unpackUnsigned).
    return @as(simd.V32i8, @bitCast(unpackUnsigned(b))) -% @as(simd.V32i8, @splat(16));
}

fn quant(b: *align(1) const Block, j: usize) i32 {
    const low: u32 = if (j < 16) b.qs[j] & 15 else b.qs[j - 16] >> 4;
    const high: u32 = (highBits(b) >> @intCast(j)) & 1;
    return @as(i32, @intCast(low | (high << 4))) - 16;
}

pub fn dequantize(src: []align(1) const Block, dst: []f32) void {
    std.debug.assert(dst.len == src.len * block_values);
    for (src, 0..) |*b, i| {
        const d: f32 = b.d;
        for (dst[i * 32 ..][0..32], 0..) |*y, j| y.* = @as(f32, @floatFromInt(quant(b, j))) * d;
    }
}

/// ggml's quantize_row_q5_0_ref: d = max/-16, q = min(31, trunc(x/d + 16.5)).
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
        const d = max / -16.0;
        const id: f32 = if (d != 0) 1.0 / d else 0;
        b.d = @floatCast(d);
        var qh: u32 = 0;
        for (0..16) |j| {
            const q0: u8 = @intFromFloat(@min(31.0, @trunc(x[j] * id + 16.5)));
            const q1: u8 = @intFromFloat(@min(31.0, @trunc(x[j + 16] * id + 16.5)));
            b.qs[j] = (q0 & 15) | ((q1 & 15) << 4);
            qh |= (@as(u32, q0 >> 4) << @intCast(j)) | (@as(u32, q1 >> 4) << @intCast(j + 16));
        }
        std.mem.writeInt(u32, &b.qh, qh, .little);
    }
}

/// ggml_vec_dot_q5_0_q8_0_generic: integer sum per block, scaled by d_w * d_x.
pub fn dotScalar(w: []align(1) const Block, x: []align(1) const q8_0.Block) f32 {
    std.debug.assert(w.len == x.len);
    var sum: f32 = 0;
    for (w, x) |*wb, xb| {
        var sumi: i32 = 0;
        for (0..32) |j| sumi += quant(wb, j) * xb.qs[j];
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

/// Single-token matvec over `n_out` rows, one row at a time (see q8_0.dotRows), in `dot`'s
/// arithmetic: the quants as unsigned 0..31 with the -16 folded into per-call lane corrections.
pub fn dotRows(n_blocks: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]align(1) const q8_0.Block, out: [*]f32) void {
    q8_0.dotRowsOffset(Block, 16, unpackUnsigned, n_blocks, w, w_row_bytes, n_out, x, out);
}

pub const multi_rows = q8_0.multi_rows;

/// Batched dotRows: see q8_0.dotRowsMultiSigned (|q| <= 16: AVX2 keeps the shifted activations).
pub fn dotRowsMulti(comptime R: usize, n_blocks: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, xs: [R][*]align(1) const q8_0.Block, out: [*]f32, out_stride: usize) bool {
    return q8_0.dotRowsMultiSigned(Block, true, unpack, R, n_blocks, w, w_row_bytes, n_out, xs, out, out_stride);
}

/// The 32 quants of a block as stored, 0..31 (the signed value plus 16).
inline fn unpackUnsigned(b: *align(1) const Block) simd.V32u8 {
    const packed_qs: @Vector(16, u8) = b.qs;
    const low = simd.concat16(packed_qs & @as(@Vector(16, u8), @splat(15)), packed_qs >> @splat(4));
    const high_mask: @Vector(32, bool) = @bitCast(highBits(b));
    return low | @select(u8, high_mask, @as(simd.V32u8, @splat(16)), @as(simd.V32u8, @splat(0)));
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

test "q5_0 dot: fast matches scalar; quantized dot matches f32" {
    try test_util.checkDot(@This(), q8_0, 50, fixBlock);
}

test "q5_0 quantizeRef round-trips within one step" {
    var rng = test_util.TestRng.init(51);
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
