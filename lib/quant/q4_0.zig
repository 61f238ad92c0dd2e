//! Q4_0: 32 values in 18 bytes: an f16 scale `d` and 16 bytes of nibbles.
//! Value j < 16 = ((qs[j] & 15) - 8) * d; value j + 16 = ((qs[j] >> 4) - 8) * d.
//! Dotted with Q8_0 activations (ggml's vec_dot_type for Q4_0).
const std = @import("std");
const simd = @import("simd.zig");
const q4_0_x8 = @import("q4_0_x8.zig");
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

/// Activation blocks whose per-call terms dotRows keeps on the stack (n_in <= 32768).
const rows_terms_max = 1024;

/// Single-token matvec over n_out rows, w_row_bytes apart, two adjacent rows at a time (rowsChains),
/// in dotGgmlScalar's arithmetic. What depends on the activations only is computed once a call,
/// not once a row: each block's offset term 8 * sum(x) and its scale as f32. A row's block sums
/// come eight at a time from one transposing reduction of single unsigned dots.
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
    const eight: simd.V32u8 = @splat(8);
    for (0..n_blocks) |b| {
        terms[b] = @reduce(.Add, simd.dotU7I8(eight, x[b].qs));
        dx[b] = x[b].d;
    }
    var o: usize = 0;
    // The next eight rows are prefetched while these are computed (simd.prefetchNextRows).
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

/// Eight adjacent rows as q4_0_x8 computes a group, its chunks transposed out of the rows as they
/// stand: each block's 16 quant bytes of rows r and r + 4 make one 32-byte vector, and two rounds
/// of dword interleaving give chunk c = bytes 4c..4c+3 of every row, a row per lane. Then one
/// dot a chunk and nibble half for all eight rows (with the activation word broadcast), and one
/// vector FMA chain, where a row at a time took a dot and a transposing reduction a row-block.
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
    for (0..n_blocks) |b| {
        var d: @Vector(8, f16) = undefined;
        var pairs: [4]@Vector(8, u32) = undefined;
        inline for (0..8) |r| d[r] = rows[r][b].d;
        simd.prefetchNextRows(8, @sizeOf(Block), next_in_l1, w, w_row_bytes, b);
        inline for (0..4) |k| {
            const a: @Vector(4, u32) = @bitCast(rows[k][b].qs);
            const c: @Vector(4, u32) = @bitCast(rows[k + 4][b].qs);
            pairs[k] = @shuffle(u32, a, c, [8]i32{ 0, 1, 2, 3, -1, -2, -3, -4 });
        }
        // [r0.w0 r1.w0 r0.w1 r1.w1 | r4.w0 r5.w0 r4.w1 r5.w1] and the like (w: a row's dword).
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
        const n = q4_0_x8.nibblesOfChunks(&chunks);
        const sums = q4_0_x8.nibbleSums(&n, &x[b]) - @as(simd.V8i32, @splat(terms[b]));
        const scales = @as(simd.V8f32, d) * @as(simd.V8f32, @splat(dx[b]));
        acc = @mulAdd(simd.V8f32, @floatFromInt(sums), scales, acc);
    }
    return acc;
}

/// The FMA chains of RR adjacent rows side by side: each is 32 dependent multiply-adds a
/// 1,024-wide row, so one row at a time waits on its own chain.
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
            inline for (0..8) |b| partial[b] = simd.dotU7I8(unpackUnsigned(&rows[r][i + b]), x[i + b].qs);
            sums[r] = simd.reduceEight(partial) - offsets;
        }
        inline for (0..8) |b| {
            inline for (0..RR) |r| {
                acc[r] = @mulAdd(f32, @floatFromInt(sums[r][b]), @as(f32, rows[r][i + b].d) * dx[i + b], acc[r]);
            }
        }
    }
    while (i < n_blocks) : (i += 1) {
        inline for (0..RR) |r| {
            const sumi = @reduce(.Add, simd.dotU7I8(unpackUnsigned(&rows[r][i]), x[i].qs)) - terms[i];
            acc[r] = @mulAdd(f32, @floatFromInt(sumi), @as(f32, rows[r][i].d) * dx[i], acc[r]);
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

test "q4_0 dotRows equals dotGgmlScalar bit for bit, odd block counts and a row stride" {
    var rng = test_util.TestRng.init(4242);
    for ([_]usize{ 1, 7, 8, 13, 40 }) |n_blocks| {
        const n_out = 13; // eight rows together, then two, then one
        const stride = n_blocks + 1; // blocks a row apart: rows not packed back to back
        var w: [n_out * 41]Block = undefined;
        var x: [40]q8_0.Block = undefined;
        for (w[0 .. n_out * stride]) |*b| {
            rng.bytes(&b.qs);
            fixBlock(b, &rng);
        }
        for (x[0..n_blocks]) |*b| {
            rng.bytes(std.mem.asBytes(&b.qs));
            b.d = test_util.randomScale(&rng, true);
        }
        var out: [n_out]f32 = undefined;
        dotRows(n_blocks, @ptrCast(&w), stride * @sizeOf(Block), n_out, &x, &out);
        for (0..n_out) |o| {
            const want = dotGgmlScalar(w[o * stride ..][0..n_blocks], x[0..n_blocks]);
            try std.testing.expectEqual(@as(u32, @bitCast(want)), @as(u32, @bitCast(out[o])));
        }
    }
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
