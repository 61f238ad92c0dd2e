//! Q4_0 repacked for matmul: eight weight rows interleaved, so one vector lane holds one row.
//! llama.cpp repacks Q4_0 the same way on AVX2/AVX-512 CPUs (block_q4_0x8) and rounds each row
//! as one f32 FMA chain over its blocks, acc = fma(f32(sum_i q_i x_i), d_w * d_x, acc) (see
//! q4_0.dotGgmlScalar). Row-major Q4_0 can only follow that chain one scalar FMA per 32 values
//! per row; here the chain of eight rows is one vector FMA, and the integer sums come out with
//! a row per lane, so nothing is reduced across lanes.
//!
//! A group (eight rows, one 32-value block column) is 144 bytes, the size of the eight Q4_0
//! blocks it replaces, so a matrix keeps its size and group g of rows 8k..8k+7 starts where row
//! 8k did:
//!   d:  the eight rows' f16 scales;
//!   qs: four 32-byte chunks; chunk c holds, for row r, that row's qs[4c .. 4c+4] at bytes
//!       4r .. 4r+4. Low nibbles are values 4c..4c+3, high nibbles values 16+4c..16+4c+3.
//! With x's four quants 4c..4c+3 broadcast to every lane, one u8 x i8 dot-of-four gives each
//! row's contribution in its own lane.
const std = @import("std");
const simd = @import("simd.zig");
const q4_0 = @import("q4_0.zig");
const q8_0 = @import("q8_0.zig");

pub const rows = 8;
pub const block_values = q4_0.block_values;

const layout = @import("interleave.zig").Rows(q4_0.Block);
pub const Group = layout.Group;
/// Interleaves n_out (a multiple of 8) row-major Q4_0 rows of n_blocks blocks into groups.
pub const repack = layout.repack;
/// The inverse of repack, for tests.
pub const unpack = layout.unpack;

/// The group's stored nibbles (0..15): lo[c] values 4c..4c+3, hi[c] values 16+4c..16+4c+3,
/// row r in bytes 4r..4r+3 of each.
pub const Nibbles = struct { lo: [4]simd.V32u8, hi: [4]simd.V32u8 };

inline fn nibbles(g: *align(1) const Group) Nibbles {
    var chunks: [4]simd.V32u8 = undefined;
    inline for (0..4) |c| chunks[c] = g.qs[32 * c ..][0..32].*;
    return nibblesOfChunks(&chunks);
}

/// Nibbles of a group's four chunks wherever they came from (q4_0.dotRows transposes them out of
/// eight row-major rows).
pub inline fn nibblesOfChunks(chunks: *const [4]simd.V32u8) Nibbles {
    var n: Nibbles = undefined;
    const low_mask: simd.V32u8 = @splat(15);
    inline for (0..4) |c| {
        const chunk = chunks[c];
        n.lo[c] = chunk & low_mask;
        // With VNNI, 16 * the high nibble where it sits (see nibbleSums).
        n.hi[c] = if (simd.has_vnni) chunk & @as(simd.V32u8, @splat(0xF0)) else (chunk >> @splat(4)) & low_mask;
    }
    return n;
}

/// Per lane (row): sum over the block's 32 values of nibble * x, before the -8 offset.
pub inline fn nibbleSums(n: *const Nibbles, x: *align(1) const q8_0.Block) simd.V8i32 {
    const words: [*]align(1) const i32 = @ptrCast(&x.qs);
    var lo: simd.V8i32 = @splat(0);
    var hi: simd.V8i32 = @splat(0);
    inline for (0..4) |c| {
        lo = simd.dotAccU7I8Word(lo, n.lo[c], words, c);
        hi = simd.dotAccU7I8Word(hi, n.hi[c], words, 4 + c); // VNNI: any unsigned byte
    }
    // With VNNI hi is 16 times the high nibbles' sum (nibbles): exact back with one shift.
    return lo + (if (simd.has_vnni) hi >> @splat(4) else hi);
}

/// 8 * (sum of the block's activation quants): the offset term of (q - 8) . x.
inline fn offsetTerm(x: *align(1) const q8_0.Block) i32 {
    const ones: simd.V32u8 = @splat(1);
    return 8 * @reduce(.Add, simd.dotU7I8(ones, x.qs));
}

inline fn chainStep(acc: simd.V8f32, g: *align(1) const Group, sums: simd.V8i32, x: *align(1) const q8_0.Block) simd.V8f32 {
    const d_w: simd.V8f32 = @as(@Vector(rows, f16), g.d);
    const d = d_w * @as(simd.V8f32, @splat(@as(f32, x.d)));
    return @mulAdd(simd.V8f32, @floatFromInt(sums), d, acc);
}

/// Activation blocks whose offset terms dotRows keeps on the stack (n_in <= 32768).
const offset_terms_max = 1024;

/// Single-token matvec over n_out rows (a multiple of 8) starting at a group boundary.
pub fn dotRows(n_blocks: usize, w: [*]const u8, n_out: usize, x: [*]align(1) const q8_0.Block, out: [*]f32) void {
    var terms: [offset_terms_max]i32 = undefined;
    const cached = n_blocks <= offset_terms_max;
    if (cached) for (0..n_blocks) |b| {
        terms[b] = offsetTerm(&x[b]);
    };
    const row_bytes = n_blocks * @sizeOf(q4_0.Block);
    var o: usize = 0;
    while (o < n_out) : (o += rows) {
        const groups: [*]align(1) const Group = @ptrCast(w + o * row_bytes);
        var acc: simd.V8f32 = @splat(0);
        for (0..n_blocks) |b| {
            const n = nibbles(&groups[b]);
            const term = if (cached) terms[b] else offsetTerm(&x[b]);
            const sums = nibbleSums(&n, &x[b]) - @as(simd.V8i32, @splat(term));
            acc = chainStep(acc, &groups[b], sums, &x[b]);
        }
        out[o..][0..rows].* = acc;
    }
}

/// n_out rows (a multiple of 8, from a group boundary) with R activation rows: each group's
/// nibbles are unpacked once for all R. Result (token r, row o) goes to out[r * out_stride + o].
pub fn dotRowsMulti(
    comptime R: usize,
    n_blocks: usize,
    w: [*]const u8,
    n_out: usize,
    xs: [R][*]align(1) const q8_0.Block,
    out: [*]f32,
    out_stride: usize,
) void {
    if (n_blocks > offset_terms_max) {
        var o: usize = 0;
        while (o < n_out) : (o += rows) {
            for (0..R) |r| dotRows(n_blocks, w + o * n_blocks * @sizeOf(q4_0.Block), rows, xs[r], out + r * out_stride + o);
        }
        return;
    }
    // The offset terms depend on the tokens only: once per call, not once per group.
    var terms: [R][offset_terms_max]i32 = undefined;
    inline for (0..R) |r| {
        for (0..n_blocks) |b| terms[r][b] = offsetTerm(&xs[r][b]);
    }
    const row_bytes = n_blocks * @sizeOf(q4_0.Block);
    var o: usize = 0;
    while (o < n_out) : (o += rows) {
        const groups: [*]align(1) const Group = @ptrCast(w + o * row_bytes);
        var acc: [R]simd.V8f32 = @splat(@splat(0));
        for (0..n_blocks) |b| {
            const n = nibbles(&groups[b]);
            inline for (0..R) |r| {
                const x = &xs[r][b];
                const sums = nibbleSums(&n, x) - @as(simd.V8i32, @splat(terms[r][b]));
                acc[r] = chainStep(acc[r], &groups[b], sums, x);
            }
        }
        inline for (0..R) |r| out[r * out_stride + o ..][0..rows].* = acc[r];
    }
}

const test_util = @import("test_util.zig");

test "q4_0_x8: repack round-trips, and every row equals q4_0.dotGgmlScalar bit for bit" {
    const alloc = std.testing.allocator;
    var rng = test_util.TestRng.init(808);
    for ([_]usize{ 1, 3, 33 }) |n_blocks| {
        const n_out = 16;
        const n = n_blocks * block_values;
        const w = try alloc.alloc(q4_0.Block, n_out * n_blocks);
        defer alloc.free(w);
        rng.bytes(std.mem.sliceAsBytes(w));
        for (w) |*b| b.d = test_util.randomScale(&rng, true);
        const src: [*]const u8 = @ptrCast(w.ptr);
        const packed_w = try alloc.alloc(u8, n_out * n_blocks * @sizeOf(q4_0.Block));
        defer alloc.free(packed_w);
        repack(src, n_out, n_blocks, packed_w.ptr);
        const back = try alloc.alloc(u8, packed_w.len);
        defer alloc.free(back);
        unpack(packed_w.ptr, n_out, n_blocks, back.ptr);
        try std.testing.expectEqualSlices(u8, std.mem.sliceAsBytes(w), back);

        const R = 3;
        var xs: [R][]q8_0.Block = undefined;
        var x_ptrs: [R][*]align(1) const q8_0.Block = undefined;
        const xf = try alloc.alloc(f32, n);
        defer alloc.free(xf);
        for (0..R) |r| {
            xs[r] = try alloc.alloc(q8_0.Block, n_blocks);
            rng.floats(xf, 3);
            q8_0.quantize(xf, xs[r]);
            x_ptrs[r] = xs[r].ptr;
        }
        defer for (xs) |x| alloc.free(x);
        var single: [n_out]f32 = undefined;
        dotRows(n_blocks, packed_w.ptr, n_out, xs[0].ptr, &single);
        var multi: [R * n_out]f32 = undefined;
        dotRowsMulti(R, n_blocks, packed_w.ptr, n_out, x_ptrs, &multi, n_out);
        for (0..n_out) |row| {
            const wr = w[row * n_blocks ..][0..n_blocks];
            const want: u32 = @bitCast(q4_0.dotGgmlScalar(wr, xs[0]));
            try std.testing.expectEqual(want, @as(u32, @bitCast(single[row])));
            for (0..R) |r| {
                const want_r: u32 = @bitCast(q4_0.dotGgmlScalar(wr, xs[r]));
                try std.testing.expectEqual(want_r, @as(u32, @bitCast(multi[r * n_out + row])));
            }
        }
    }
}
