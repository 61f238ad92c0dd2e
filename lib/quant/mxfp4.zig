//! MXFP4 (OCP microscaling FP4, the format gpt-oss ships its experts in): 32 values in 17 bytes,
//! an E8M0 scale byte `e` (a power of two) and 16 bytes of 4-bit E2M1 codes, value j < 16 in
//! qs[j] & 15 and value j + 16 in qs[j] >> 4. As ggml stores it, the codes read through
//! `kvalues`, which holds twice the E2M1 values (integers: 0, ±0.5 .. ±6 doubled), and the scale
//! is taken at half its value (scaleHalf): value = kvalues[code] * 2^(e - 128). Dotted with Q8_0
//! activations (ggml's vec_dot_type for MXFP4).
const std = @import("std");
const simd = @import("simd.zig");
const q8_0 = @import("q8_0.zig");

pub const block_values = 32;
pub const Block = extern struct {
    e: u8,
    qs: [16]u8,
};
comptime {
    std.debug.assert(@sizeOf(Block) == 17);
}

/// ggml's kvalues_mxfp4: E2M1 codes (sign bit 3, then 2 exponent bits and 1 mantissa bit) as
/// twice their value.
pub const kvalues = [16]i8{ 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

/// The codes read as kvalues + 12 (0..24): unsigned bytes the u8 x i8 dot instructions take, with
/// 12 * sum(x) taken back per block (blockPartial), as Q4_0 does with its 8.
const offset = 12;
const kvalues_offset: @Vector(16, u8) = blk: {
    var t: [16]u8 = undefined;
    for (kvalues, 0..) |v, i| t[i] = @intCast(@as(i32, v) + offset);
    break :blk t;
};

/// ggml_e8m0_to_fp32_half: 2^(e - 128) as an f32, exactly (e = 0 and 1 are subnormals). Read
/// from a table in the kernels (one load, as ggml's CPU backend does), not rebuilt from bits.
pub fn scaleHalf(e: u8) f32 {
    return scale_half_table[e];
}

const scale_half_table: [256]f32 = blk: {
    var t: [256]f32 = undefined;
    for (0..256) |e| {
        const bits: u32 = if (e < 2) @as(u32, 0x00200000) << @intCast(e) else @as(u32, e - 1) << 23;
        t[e] = @bitCast(bits);
    }
    break :blk t;
};

/// The 32 codes of a block as kvalues + offset, in value order.
inline fn unpackOffset(b: *align(1) const Block) simd.V32u8 {
    const packed_qs: @Vector(16, u8) = b.qs;
    const nibbles = simd.concat16(packed_qs & @as(@Vector(16, u8), @splat(15)), packed_qs >> @splat(4));
    return simd.lookup16(kvalues_offset, nibbles);
}

pub fn dequantize(src: []align(1) const Block, dst: []f32) void {
    std.debug.assert(dst.len == src.len * block_values);
    for (src, 0..) |*b, i| {
        const d = scaleHalf(b.e);
        const out = dst[i * 32 ..][0..32];
        for (0..16) |j| {
            out[j] = @as(f32, @floatFromInt(kvalues[b.qs[j] & 15])) * d;
            out[j + 16] = @as(f32, @floatFromInt(kvalues[b.qs[j] >> 4])) * d;
        }
    }
}

/// ggml's quantize_row_mxfp4_ref: e = floor(log2(amax)) - 2 + 127 (so amax lands on ±6, the
/// largest code, or just under 2x past it), then each value takes the code nearest x / d, the
/// first in table order on a tie.
pub fn quantizeRef(src: []const f32, dst: []align(1) Block) void {
    std.debug.assert(src.len == dst.len * block_values);
    for (dst, 0..) |*b, i| {
        const x = src[i * 32 ..][0..32];
        var amax: f32 = 0;
        for (x) |v| amax = @max(amax, @abs(v));
        // ggml converts the float to uint8_t; amax below 2^-125 or at 2^128 would wrap there (C
        // leaves it undefined): such blocks clamp to the nearest scale instead.
        const e: u8 = if (amax > 0) @intFromFloat(std.math.clamp(@floor(@log2(amax)) - 2 + 127, 0, 255)) else 0;
        b.e = e;
        const d = scaleHalf(e);
        for (0..16) |j| {
            b.qs[j] = bestCode(x[j], d) | (bestCode(x[j + 16], d) << 4);
        }
    }
}

fn bestCode(x: f32, d: f32) u8 {
    var best: u8 = 0;
    var best_err = @abs(@as(f32, @floatFromInt(kvalues[0])) * d - x);
    for (1..16) |i| {
        const err = @abs(@as(f32, @floatFromInt(kvalues[i])) * d - x);
        if (err < best_err) {
            best = @intCast(i);
            best_err = err;
        }
    }
    return best;
}

fn blockSum(w: *align(1) const Block, x: *align(1) const q8_0.Block) i32 {
    var sumi: i32 = 0;
    for (0..16) |j| {
        sumi += @as(i32, kvalues[w.qs[j] & 15]) * x.qs[j];
        sumi += @as(i32, kvalues[w.qs[j] >> 4]) * x.qs[j + 16];
    }
    return sumi;
}

/// ggml_vec_dot_mxfp4_q8_0_generic: integer sum per block, scaled by d_x * d_w.
pub fn dotScalar(w: []align(1) const Block, x: []align(1) const q8_0.Block) f32 {
    std.debug.assert(w.len == x.len);
    var sum: f32 = 0;
    for (w, x) |*wb, *xb| {
        sum += (@as(f32, xb.d) * scaleHalf(wb.e)) * @as(f32, @floatFromInt(blockSum(wb, xb)));
    }
    return sum;
}

/// The float arithmetic of ggml_gemv_mxfp4_8x8_q8_0 (arch/x86/repack.cpp), which llama.cpp runs
/// for MXFP4 matmuls on an AVX2/AVX-512 CPU (weights repacked to block_mxfp4x8 when n_out % 8
/// == 0, gpt-oss's every MXFP4 tensor): one exact integer per block, one f32 FMA chain per row,
///   acc = fma(f32(sum_i kvalue_i * x_i), scaleHalf(e) * d_x, acc).
/// The scale product is exact (a power of two times an f16), so only the chain rounds.
/// Written as a plain scalar loop: the reference the fast paths must equal bit for bit.
pub fn dotGgmlScalar(w: []align(1) const Block, x: []align(1) const q8_0.Block) f32 {
    std.debug.assert(w.len == x.len);
    var acc: f32 = 0;
    for (w, x) |*wb, *xb| {
        acc = @mulAdd(f32, @floatFromInt(blockSum(wb, xb)), scaleHalf(wb.e) * @as(f32, xb.d), acc);
    }
    return acc;
}

pub fn dot(w: []align(1) const Block, x: []align(1) const q8_0.Block) f32 {
    std.debug.assert(w.len == x.len);
    return dotMulti(1, w, .{x.ptr})[0];
}

/// (kvalue . x) in 8 lanes of partial sums, as (kvalue + 12) . x - 12 * sum(x): two unsigned x
/// signed dots (codes <= 24 and 12 keep AVX2's pairs far inside i16).
inline fn blockPartial(q: simd.V32u8, x: simd.V32i8) simd.V8i32 {
    const twelve: simd.V32u8 = @splat(offset);
    return simd.dotU7I8(q, x) - simd.dotU7I8(twelve, x);
}

/// Dots one weight row with R activation rows, unpacking each weight block once for all R, in
/// dotGgmlScalar's arithmetic. Blocks go in groups of 8 so one transposing reduction turns their
/// partial vectors into 8 block sums (exact integers); the FMA chain follows the blocks in order.
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
            const q = unpackOffset(&w[i + b]);
            inline for (0..R) |r| partial[r][b] = blockPartial(q, xs[r][i + b].qs);
        }
        inline for (0..R) |r| {
            const sums: [8]i32 = simd.reduceEight(partial[r]);
            inline for (0..group) |b| {
                const d = scaleHalf(w[i + b].e) * @as(f32, xs[r][i + b].d);
                acc[r] = @mulAdd(f32, @floatFromInt(sums[b]), d, acc[r]);
            }
        }
    }
    while (i < w.len) : (i += 1) {
        const q = unpackOffset(&w[i]);
        inline for (0..R) |r| {
            const sumi = @reduce(.Add, blockPartial(q, xs[r][i].qs));
            const d = scaleHalf(w[i].e) * @as(f32, xs[r][i].d);
            acc[r] = @mulAdd(f32, @floatFromInt(sumi), d, acc[r]);
        }
    }
    return acc;
}

/// Activation blocks whose per-call terms dotRows keeps on the stack (n_in <= 32768).
const rows_terms_max = 1024;

/// Single-token matvec over n_out rows, w_row_bytes apart, eight adjacent rows at a time
/// (rowsEight), the rest two and one (rowsChains), in dotGgmlScalar's arithmetic. What depends on
/// the activations only is computed once a call, not once a row: each block's 12 * sum(x) and
/// its scale as f32.
pub fn dotRows(n_blocks: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]align(1) const q8_0.Block, out: [*]f32) void {
    if (n_blocks > rows_terms_max) {
        for (0..n_out) |o| {
            const row: [*]align(1) const Block = @ptrCast(w + o * w_row_bytes);
            out[o] = dot(row[0..n_blocks], x[0..n_blocks]);
        }
        return;
    }
    var terms: [rows_terms_max]i32 align(32) = undefined;
    var dx: [rows_terms_max]f32 = undefined;
    const twelve: simd.V32u8 = @splat(offset);
    for (0..n_blocks) |b| {
        terms[b] = @reduce(.Add, simd.dotU7I8(twelve, x[b].qs));
        dx[b] = x[b].d;
    }
    var o: usize = 0;
    const next_in_l1 = simd.nextRowsInL1(8, w_row_bytes);
    while (o + 8 <= n_out) : (o += 8) {
        const w8 = w + o * w_row_bytes;
        out[o..][0..8].* = if (next_in_l1)
            rowsEight(true, n_blocks, w8, w_row_bytes, x, &terms, &dx)
        else
            rowsEight(false, n_blocks, w8, w_row_bytes, x, &terms, &dx);
    }
    while (o + 2 <= n_out) : (o += 2) {
        const two = rowsChains(2, n_blocks, w + o * w_row_bytes, w_row_bytes, x, &terms, &dx);
        out[o] = two[0];
        out[o + 1] = two[1];
    }
    if (o < n_out) out[o] = rowsChains(1, n_blocks, w + o * w_row_bytes, w_row_bytes, x, &terms, &dx)[0];
}

/// Eight adjacent rows as q4_0.rowsEight takes them: each block's 16 code bytes of rows r and
/// r + 4 make one 32-byte vector, and two rounds of dword interleaving give chunk c = bytes
/// 4c..4c+3 of every row, a row per lane; the codes then go through the table, and one dot per
/// chunk and nibble half (with the activation word broadcast) gives all eight rows' block sums,
/// which one vector FMA chain takes: dotGgmlScalar's arithmetic in each lane.
inline fn rowsEight(
    comptime next_in_l1: bool,
    n_blocks: usize,
    w: [*]const u8,
    w_row_bytes: usize,
    x: [*]align(1) const q8_0.Block,
    terms: *const [rows_terms_max]i32,
    dx: *const [rows_terms_max]f32,
) [8]f32 {
    var rows: [8][*]align(1) const Block = undefined;
    inline for (0..8) |r| rows[r] = @ptrCast(w + r * w_row_bytes);
    var acc: simd.V8f32 = @splat(0);
    const low_mask: simd.V32u8 = @splat(15);
    for (0..n_blocks) |b| {
        var scales: simd.V8f32 = undefined;
        inline for (0..8) |r| scales[r] = scaleHalf(rows[r][b].e);
        simd.prefetchNextRows(8, @sizeOf(Block), next_in_l1, w, w_row_bytes, b);
        var pairs: [4]@Vector(8, u32) = undefined;
        inline for (0..4) |k| {
            const a: @Vector(4, u32) = @bitCast(rows[k][b].qs);
            const c: @Vector(4, u32) = @bitCast(rows[k + 4][b].qs);
            pairs[k] = @shuffle(u32, a, c, [8]i32{ 0, 1, 2, 3, -1, -2, -3, -4 });
        }
        const lo_mask = [8]i32{ 0, -1, 1, -2, 4, -5, 5, -6 };
        const hi_mask = [8]i32{ 2, -3, 3, -4, 6, -7, 7, -8 };
        const t0 = @shuffle(u32, pairs[0], pairs[1], lo_mask);
        const t1 = @shuffle(u32, pairs[0], pairs[1], hi_mask);
        const t2 = @shuffle(u32, pairs[2], pairs[3], lo_mask);
        const t3 = @shuffle(u32, pairs[2], pairs[3], hi_mask);
        const even = [8]i32{ 0, 1, -1, -2, 4, 5, -5, -6 };
        const odd = [8]i32{ 2, 3, -3, -4, 6, 7, -7, -8 };
        const chunks = [4]simd.V32u8{
            @bitCast(@shuffle(u32, t0, t2, even)), @bitCast(@shuffle(u32, t0, t2, odd)),
            @bitCast(@shuffle(u32, t1, t3, even)), @bitCast(@shuffle(u32, t1, t3, odd)),
        };
        const words: [*]align(1) const i32 = @ptrCast(&x[b].qs);
        var lo: simd.V8i32 = @splat(0);
        var hi: simd.V8i32 = @splat(0);
        inline for (0..4) |c| {
            lo = simd.dotAccU7I8Word(lo, simd.lookup16(kvalues_offset, chunks[c] & low_mask), words, c);
            hi = simd.dotAccU7I8Word(hi, simd.lookup16(kvalues_offset, (chunks[c] >> @splat(4)) & low_mask), words, 4 + c);
        }
        const sums = lo + hi - @as(simd.V8i32, @splat(terms[b]));
        acc = @mulAdd(simd.V8f32, @floatFromInt(sums), scales * @as(simd.V8f32, @splat(dx[b])), acc);
    }
    return acc;
}

inline fn rowsChains(
    comptime RR: usize,
    n_blocks: usize,
    w: [*]const u8,
    w_row_bytes: usize,
    x: [*]align(1) const q8_0.Block,
    terms: *const [rows_terms_max]i32,
    dx: *const [rows_terms_max]f32,
) [RR]f32 {
    var rows: [RR][*]align(1) const Block = undefined;
    inline for (0..RR) |r| rows[r] = @ptrCast(w + r * w_row_bytes);
    var acc: [RR]f32 = @splat(0);
    const full = n_blocks - n_blocks % 8;
    var i: usize = 0;
    while (i < full) : (i += 8) {
        const offsets: simd.V8i32 = terms[i..][0..8].*;
        var sums: [RR][8]i32 = undefined;
        inline for (0..RR) |r| {
            var partial: [8]simd.V8i32 = undefined;
            inline for (0..8) |b| partial[b] = simd.dotU7I8(unpackOffset(&rows[r][i + b]), x[i + b].qs);
            sums[r] = simd.reduceEight(partial) - offsets;
        }
        inline for (0..8) |b| {
            inline for (0..RR) |r| {
                acc[r] = @mulAdd(f32, @floatFromInt(sums[r][b]), scaleHalf(rows[r][i + b].e) * dx[i + b], acc[r]);
            }
        }
    }
    while (i < n_blocks) : (i += 1) {
        inline for (0..RR) |r| {
            const sumi = @reduce(.Add, simd.dotU7I8(unpackOffset(&rows[r][i]), x[i].qs)) - terms[i];
            acc[r] = @mulAdd(f32, @floatFromInt(sumi), scaleHalf(rows[r][i].e) * dx[i], acc[r]);
        }
    }
    return acc;
}

const test_util = @import("test_util.zig");

/// Scales 2^-13 .. 2^-3 (half-scale): finite, moderate values like a real checkpoint's.
fn fixBlock(b: *Block, rng: *test_util.TestRng) void {
    b.e = @intCast(115 + rng.next() % 11);
}

test "mxfp4 scaleHalf is ggml_e8m0_to_fp32_half: 2^(e-128), subnormal at 0 and 1" {
    try std.testing.expectEqual(@as(f32, 1.0), scaleHalf(128));
    try std.testing.expectEqual(@as(f32, 0.5), scaleHalf(127));
    try std.testing.expectEqual(std.math.ldexp(@as(f32, 1), -128), scaleHalf(0));
    try std.testing.expectEqual(std.math.ldexp(@as(f32, 1), -127), scaleHalf(1));
    try std.testing.expectEqual(std.math.ldexp(@as(f32, 1), -126), scaleHalf(2));
    try std.testing.expectEqual(std.math.ldexp(@as(f32, 1), 127), scaleHalf(255));
    for (0..256) |e| {
        const want = std.math.ldexp(@as(f64, 1), @as(i32, @intCast(e)) - 128);
        try std.testing.expectEqual(want, @as(f64, scaleHalf(@intCast(e))));
    }
}

test "mxfp4 unpackOffset reads every code through kvalues (the table lookup on every path)" {
    var b: Block = .{ .e = 127, .qs = undefined };
    for (0..16) |j| b.qs[j] = @intCast(j | ((15 - j) << 4));
    const got: [32]u8 = unpackOffset(&b);
    for (0..16) |j| {
        try std.testing.expectEqual(@as(i32, kvalues[j]) + offset, @as(i32, got[j]));
        try std.testing.expectEqual(@as(i32, kvalues[15 - j]) + offset, @as(i32, got[j + 16]));
    }
}

test "mxfp4 dot: fast matches scalar; quantized dot matches f32" {
    try test_util.checkDot(@This(), q8_0, 390, fixBlock);
}

test "mxfp4 dot and dotMulti: bit-identical to ggml's x86 gemv order" {
    try simd.expectGgmlOrder(@This(), q8_0, 391, fixBlock);
}

test "mxfp4 dotRows equals dotGgmlScalar bit for bit, odd block and row counts, a row stride" {
    try test_util.checkDotRows(@This(), q8_0, 392, fixBlock);
    var rng = test_util.TestRng.init(393);
    for ([_]usize{ 1, 7, 8, 13, 90 }) |n_blocks| {
        const n_out = 19; // eight rows together twice, then two, then one
        const stride = n_blocks + 1;
        var w: [n_out * 91]Block = undefined;
        var x: [90]q8_0.Block = undefined;
        test_util.randomBlocks(Block, &rng, w[0 .. n_out * stride], fixBlock);
        var xf: [90 * 32]f32 = undefined;
        rng.floats(xf[0 .. n_blocks * 32], 3);
        q8_0.quantize(xf[0 .. n_blocks * 32], x[0..n_blocks]);
        var out: [n_out]f32 = undefined;
        dotRows(n_blocks, @ptrCast(&w), stride * @sizeOf(Block), n_out, &x, &out);
        for (0..n_out) |o| {
            const want = dotGgmlScalar(w[o * stride ..][0..n_blocks], x[0..n_blocks]);
            try std.testing.expectEqual(@as(u32, @bitCast(want)), @as(u32, @bitCast(out[o])));
        }
    }
}

test "mxfp4 quantizeRef: amax on the top code, codes nearest, ties to the first, zeros" {
    var x: [64]f32 = @splat(0);
    // Block 0: amax 6 -> e = floor(log2 6) - 2 + 127 = 127, d = 0.5: codes are the E2M1 values.
    const vals = [_]f32{ 6, -6, 0.5, -0.5, 1.5, 3, 0.25, 0.75, 5, -0.1, 2.5 };
    for (vals, 0..) |v, i| x[i] = v;
    var b: [2]Block = undefined;
    quantizeRef(&x, &b);
    try std.testing.expectEqual(@as(u8, 127), b[0].e);
    try std.testing.expectEqual(@as(u8, 0), b[1].e); // an all-zero block
    var y: [64]f32 = undefined;
    dequantize(&b, &y);
    // d = 0.5: the codes are the E2M1 values. Ties (0.25 between 0 and 0.5, 0.75 between 0.5
    // and 1, 5 between 4 and 6, 2.5 between 2 and 3) go to the first code in table order.
    const want = [_]f32{ 6, -6, 0.5, -0.5, 1.5, 3, 0, 0.5, 4, 0, 2 };
    try std.testing.expectEqualSlices(f32, &want, y[0..11]);
    try std.testing.expectEqual(@as(u8, 0), b[0].qs[9] & 15); // -0.1 -> +0 (code 0, not 8)
    for (y[32..]) |v| try std.testing.expectEqual(@as(f32, 0), v);
}

test "mxfp4 quantizeRef round-trips within one step of the code grid" {
    var rng = test_util.TestRng.init(394);
    var x: [256]f32 = undefined;
    rng.floats(&x, 5);
    var b: [8]Block = undefined;
    quantizeRef(&x, &b);
    var y: [256]f32 = undefined;
    dequantize(&b, &y);
    for (x, y, 0..) |a, c, i| {
        // The widest gap between adjacent codes is 2 (4 -> 6 in E2M1) doubled = 4 halves of d.
        try std.testing.expect(@abs(a - c) <= 2 * scaleHalf(b[i / 32].e) * 1.0001);
    }
}
