//! Q4_K repacked for matmul: eight weight rows interleaved, so one vector lane holds one row
//! (as q4_0_x8.zig does for Q4_0; llama.cpp repacks Q4_K the same way, block_q4_Kx8). Each row
//! keeps ggml's two f32 FMA chains per superblock (q4_k.dotGgmlScalar):
//!   acc  = fma(f32(sum_j scale_j * dot_j),                 d_w * d_x,    acc)
//!   accm = fma(f32(sum_j min_j * (bsum_2j + bsum_2j+1)),   dmin_w * d_x, accm)
//! Here both chains of eight rows are one vector FMA each, and the integer sums come out with a
//! row per lane: no horizontal reductions at all.
//!
//! `Rounding.sub_block_pairs` rounds as llama.cpp's x86 batched kernel for this layout does
//! (ggml_gemm_q4_K_8x8_q8_K, which its prompts take four rows at a time): both chains take an
//! FMA every 64 values (a pair of sub-blocks) instead of one a superblock. Only embeddings ask
//! for it, to equal llama-embedding (docs/embeddings.md); a token's rows never do.
//!
//! A group (eight rows, one 256-value superblock column) is 1,152 bytes, the size of the eight
//! Q4_K blocks it replaces, so a group of rows 8k..8k+7 starts where row 8k did:
//!   d, dmin:  the eight rows' f16 scales;
//!   sm_low:   64 bytes, index 8j + r: (scale_rj & 15) | (min_rj & 15) << 4;
//!   sm_high:  32 bytes, nibble 8j + r (low nibble first): scale_rj >> 4 | (min_rj >> 4) << 2;
//!   qs:       32 chunks of 32 bytes; chunk 8c + g holds, for row r, that row's
//!             qs[32c + 4g .. 32c + 4g + 4] at bytes 4r .. 4r+4: low nibbles are values 4g..4g+3
//!             of sub-block 2c, high nibbles the same values of sub-block 2c + 1.
const std = @import("std");
const simd = @import("simd.zig");
const q4_k = @import("q4_k.zig");
const q8_k = @import("q8_k.zig");

pub const rows = 8;

pub const Group = extern struct {
    d: [rows]f16,
    dmin: [rows]f16,
    sm_low: [64]u8,
    sm_high: [32]u8,
    qs: [32 * 32]u8,
};
comptime {
    std.debug.assert(@sizeOf(Group) == rows * @sizeOf(q4_k.Block));
}

/// Interleaves n_out (a multiple of 8) row-major Q4_K rows of n_blocks superblocks.
pub fn repack(src: [*]const u8, n_out: usize, n_blocks: usize, dst: [*]u8) void {
    std.debug.assert(n_out % rows == 0);
    const row_bytes = n_blocks * @sizeOf(q4_k.Block);
    var o: usize = 0;
    while (o < n_out) : (o += rows) {
        const groups: [*]align(1) Group = @ptrCast(dst + o * row_bytes);
        for (0..n_blocks) |b| {
            const g = &groups[b];
            g.sm_high = @splat(0);
            for (0..rows) |r| {
                const row: [*]align(1) const q4_k.Block = @ptrCast(src + (o + r) * row_bytes);
                const blk = &row[b];
                g.d[r] = blk.d;
                g.dmin[r] = blk.dmin;
                const sm = q4_k.unpackScales(&blk.scales);
                for (0..8) |j| {
                    const k = 8 * j + r;
                    g.sm_low[k] = (sm.scales[j] & 15) | (sm.mins[j] & 15) << 4;
                    const high: u8 = (sm.scales[j] >> 4) | (sm.mins[j] >> 4) << 2;
                    g.sm_high[k / 2] |= high << @intCast(4 * (k % 2));
                }
                for (0..4) |c| {
                    for (0..8) |gi| {
                        @memcpy(g.qs[32 * (8 * c + gi) + 4 * r ..][0..4], blk.qs[32 * c + 4 * gi ..][0..4]);
                    }
                }
            }
        }
    }
}

/// The group's scales and mins, 8j + r: sub-block j of row r.
pub const GroupScales = struct { scales: @Vector(64, u8), mins: @Vector(64, u8) };

pub inline fn groupScales(g: *align(1) const Group) GroupScales {
    const low: @Vector(64, u8) = g.sm_low;
    const high_bytes: @Vector(32, u8) = g.sm_high;
    // Each high byte twice (nibbles 2i and 2i+1), then the nibble for the lane's parity.
    const doubled = @shuffle(u8, high_bytes, undefined, blk: {
        var m: [64]i32 = undefined;
        for (0..64) |k| m[k] = @intCast(k / 2);
        break :blk m;
    });
    const parity_shift = comptime blk: {
        var v: [64]u8 = undefined;
        for (0..64) |k| v[k] = if (k % 2 == 0) 0 else 4;
        break :blk v;
    };
    const high = (doubled >> @as(@Vector(64, u8), parity_shift)) & @as(@Vector(64, u8), @splat(15));
    const four: @Vector(64, u8) = @splat(4);
    return .{
        .scales = (low & @as(@Vector(64, u8), @splat(15))) | ((high & @as(@Vector(64, u8), @splat(3))) << four),
        .mins = (low >> four) | ((high >> @as(@Vector(64, u8), @splat(2))) << four),
    };
}

/// Lanes 8j .. 8j+7 (sub-block j of the eight rows) as i32 lanes.
inline fn subBlock(v: @Vector(64, u8), comptime j: usize) simd.V8i32 {
    const bytes: @Vector(8, u8) = @shuffle(u8, v, undefined, blk: {
        var m: [8]i32 = undefined;
        for (0..8) |r| m[r] = @intCast(8 * j + r);
        break :blk m;
    });
    return @intCast(bytes);
}

/// How a row's float sums are rounded: one FMA a superblock (the single-token kernels'), or one
/// a pair of sub-blocks (llama.cpp's batched kernel's).
pub const Rounding = enum { superblock, sub_block_pairs };

/// sum_j scale_j * dot_j for each row (lane) over sub-blocks 2c and 2c + 1 (chunk pair c).
inline fn quantSumsPair(comptime R: usize, comptime c: usize, g: *align(1) const Group, xs: [R]*align(1) const q8_k.Block, sc: *const [8]simd.V8i32) [R]simd.V8i32 {
    var sums: [R]simd.V8i32 = undefined;
    const low_mask: simd.V32u8 = @splat(15);
    // With VNNI the high nibbles are dotted where they sit, as 16 * nibble (vpdpbusd takes any
    // unsigned byte), and each sub-block's sum is shifted back once: exact, as it is 16 times an
    // integer, and a shift a sub-block where there was one a 32 weight bytes.
    const high_mask: simd.V32u8 = @splat(0xF0);
    // A single token's dots are two dependent chains a chunk pair, each as long as the dot's
    // latency times 8: split in two (even and odd chunks) they keep more dots in flight
    // (measured: 44 -> 46 GB/s a core from L2; four chains was slower, the extra adds cost).
    // Batches already have 2R chains.
    const chains = if (R == 1) 2 else 1;
    {
        var lo: [chains][R]simd.V8i32 = @splat(@splat(@splat(0)));
        var hi: [chains][R]simd.V8i32 = @splat(@splat(@splat(0)));
        inline for (0..8) |gi| {
            const chunk: simd.V32u8 = g.qs[32 * (8 * c + gi) ..][0..32].*;
            const n_lo = chunk & low_mask;
            const n_hi = if (simd.has_vnni) chunk & high_mask else (chunk >> @splat(4)) & low_mask;
            inline for (0..R) |r| {
                const words: [*]align(1) const i32 = @ptrCast(&xs[r].qs);
                const k = gi % chains;
                lo[k][r] = simd.dotAccU7I8Word(lo[k][r], n_lo, words, 16 * c + gi);
                hi[k][r] = simd.dotAccU7I8Word(hi[k][r], n_hi, words, 16 * c + 8 + gi);
            }
        }
        inline for (0..R) |r| {
            var lo_r = lo[0][r];
            var hi_r = hi[0][r];
            inline for (1..chains) |k| {
                lo_r += lo[k][r];
                hi_r += hi[k][r];
            }
            const high = if (simd.has_vnni) hi_r >> @splat(4) else hi_r;
            sums[r] = lo_r * sc[2 * c] + high * sc[2 * c + 1];
        }
    }
    return sums;
}

/// sum_j scale_j * dot_j over the whole superblock, for each row (lane).
inline fn quantSums(comptime R: usize, g: *align(1) const Group, xs: [R]*align(1) const q8_k.Block, sc: *const [8]simd.V8i32) [R]simd.V8i32 {
    var sums: [R]simd.V8i32 = @splat(@splat(0));
    inline for (0..4) |c| {
        const pair = quantSumsPair(R, c, g, xs, sc);
        inline for (0..R) |r| sums[r] += pair[r];
    }
    return sums;
}

/// min_j * (bsum_2j + bsum_2j+1) over sub-blocks 2c and 2c + 1, for each row (lane).
inline fn minSumsPair(x: *align(1) const q8_k.Block, mins: *const [8]simd.V8i32, comptime c: usize) simd.V8i32 {
    var sum: simd.V8i32 = @splat(0);
    inline for (2 * c..2 * c + 2) |j| {
        const pair: i32 = @as(i32, x.bsums[2 * j]) + x.bsums[2 * j + 1];
        sum += mins[j] * @as(simd.V8i32, @splat(pair));
    }
    return sum;
}

/// minSums with AVX-512 VNNI: sum_j min_j * bsums[2j] + min_j * bsums[2j+1] (the same integer),
/// one vpdpwssd a sub-block: the row's min_j in both i16 halves of its lane, times the pair
/// (bsums[2j], bsums[2j+1]) read as one i32 word of the block (|min * bsum| <= 63 * 2032).
inline fn minSumsPairs(x: *align(1) const q8_k.Block, mins: @Vector(64, u8)) simd.V8i32 {
    const words: [*]align(1) const i32 = @ptrCast(&x.bsums);
    var sum: simd.V8i32 = @splat(0);
    inline for (0..8) |j| {
        // Bytes (min_j[r], 0, min_j[r], 0) for each row r: an i16 pair per lane.
        const pairs: @Vector(32, u8) = @shuffle(u8, mins, @as(@Vector(64, u8), @splat(0)), blk: {
            var m: [32]i32 = undefined;
            for (0..8) |r| {
                m[4 * r] = @intCast(8 * j + r);
                m[4 * r + 1] = -1;
                m[4 * r + 2] = @intCast(8 * j + r);
                m[4 * r + 3] = -1;
            }
            break :blk m;
        });
        sum = simd.dotAccI16Word(sum, @bitCast(pairs), words, j);
    }
    return sum;
}

inline fn minSums(x: *align(1) const q8_k.Block, mins: *const [8]simd.V8i32) simd.V8i32 {
    var sum: simd.V8i32 = @splat(0);
    inline for (0..8) |j| {
        const pair: i32 = @as(i32, x.bsums[2 * j]) + x.bsums[2 * j + 1];
        sum += mins[j] * @as(simd.V8i32, @splat(pair));
    }
    return sum;
}

/// n_out rows (a multiple of 8, from a group boundary) with R activation rows; result (token r,
/// row o) goes to out[r * out_stride + o].
pub fn dotRowsMultiRounded(
    comptime R: usize,
    comptime rounding: Rounding,
    n_blocks: usize,
    w: [*]const u8,
    n_out: usize,
    xs: [R][*]align(1) const q8_k.Block,
    out: [*]f32,
    out_stride: usize,
) void {
    @setEvalBranchQuota(20_000); // the unrolled sub-block and token loops
    const row_bytes = n_blocks * @sizeOf(q4_k.Block);
    var o: usize = 0;
    while (o < n_out) : (o += rows) {
        const groups: [*]align(1) const Group = @ptrCast(w + o * row_bytes);
        var acc: [R]simd.V8f32 = @splat(@splat(0));
        var acc_min: [R]simd.V8f32 = @splat(@splat(0));
        for (0..n_blocks) |b| {
            const g = &groups[b];
            const gs = groupScales(g);
            var sc: [8]simd.V8i32 = undefined;
            var mn: [8]simd.V8i32 = undefined;
            const pairs = rounding == .sub_block_pairs;
            inline for (0..8) |j| {
                sc[j] = subBlock(gs.scales, j);
                if (comptime pairs or !simd.has_vnni) mn[j] = subBlock(gs.mins, j);
            }
            var x_blocks: [R]*align(1) const q8_k.Block = undefined;
            inline for (0..R) |r| x_blocks[r] = &xs[r][b];
            const d_w: simd.V8f32 = @as(@Vector(rows, f16), g.d);
            const dmin_w: simd.V8f32 = @as(@Vector(rows, f16), g.dmin);
            if (comptime pairs) {
                inline for (0..4) |c| {
                    const sums = quantSumsPair(R, c, g, x_blocks, &sc);
                    inline for (0..R) |r| {
                        const d_x: simd.V8f32 = @splat(x_blocks[r].d);
                        acc[r] = @mulAdd(simd.V8f32, @floatFromInt(sums[r]), d_w * d_x, acc[r]);
                        const min_sum = minSumsPair(x_blocks[r], &mn, c);
                        acc_min[r] = @mulAdd(simd.V8f32, @floatFromInt(min_sum), dmin_w * d_x, acc_min[r]);
                    }
                }
                continue;
            }
            const sums = quantSums(R, g, x_blocks, &sc);
            inline for (0..R) |r| {
                const x = x_blocks[r];
                const d_x: simd.V8f32 = @splat(x.d);
                acc[r] = @mulAdd(simd.V8f32, @floatFromInt(sums[r]), d_w * d_x, acc[r]);
                const min_sum = if (comptime simd.has_vnni) minSumsPairs(x, gs.mins) else minSums(x, &mn);
                acc_min[r] = @mulAdd(simd.V8f32, @floatFromInt(min_sum), dmin_w * d_x, acc_min[r]);
            }
        }
        inline for (0..R) |r| out[r * out_stride + o ..][0..rows].* = acc[r] - acc_min[r];
    }
}

pub fn dotRowsMulti(comptime R: usize, n_blocks: usize, w: [*]const u8, n_out: usize,
    xs: [R][*]align(1) const q8_k.Block, out: [*]f32, out_stride: usize) void {
    dotRowsMultiRounded(R, .superblock, n_blocks, w, n_out, xs, out, out_stride);
}

pub fn dotRows(n_blocks: usize, w: [*]const u8, n_out: usize, x: [*]align(1) const q8_k.Block, out: [*]f32) void {
    dotRowsMulti(1, n_blocks, w, n_out, .{x}, out, 0);
}

/// The same layout and bytes, rounded as llama.cpp's batched kernel (Rounding.sub_block_pairs):
/// the type table lists it as a layout of its own (q4_k_x8_pairs).
pub const sub_block_pairs = struct {
    pub const rows = 8;
    pub fn dotRows(n_blocks: usize, w: [*]const u8, n_out: usize, x: [*]align(1) const q8_k.Block, out: [*]f32) void {
        dotRowsMultiRounded(1, .sub_block_pairs, n_blocks, w, n_out, .{x}, out, 0);
    }
    pub fn dotRowsMulti(comptime R: usize, n_blocks: usize, w: [*]const u8, n_out: usize,
        xs: [R][*]align(1) const q8_k.Block, out: [*]f32, out_stride: usize) void {
        dotRowsMultiRounded(R, .sub_block_pairs, n_blocks, w, n_out, xs, out, out_stride);
    }
};

const test_util = @import("test_util.zig");

test "q4_k_x8: every row equals q4_k.dotGgmlScalar bit for bit, single and batched" {
    const alloc = std.testing.allocator;
    var rng = test_util.TestRng.init(1808);
    for ([_]usize{ 1, 3 }) |n_blocks| {
        const n_out = 16;
        const n = n_blocks * 256;
        const wf = try alloc.alloc(f32, n);
        defer alloc.free(wf);
        const w = try alloc.alloc(q4_k.Block, n_out * n_blocks);
        defer alloc.free(w);
        for (0..n_out) |o| {
            rng.floats(wf, 1);
            q4_k.quantizeRef(wf, w[o * n_blocks ..][0..n_blocks]);
        }
        // Random scale bytes too, so every 6-bit scale and min value is exercised.
        for (w) |*blk| rng.bytes(&blk.scales);
        const packed_w = try alloc.alloc(u8, n_out * n_blocks * @sizeOf(q4_k.Block));
        defer alloc.free(packed_w);
        repack(@ptrCast(w.ptr), n_out, n_blocks, packed_w.ptr);

        const R = 3;
        var xs: [R][]q8_k.Block = undefined;
        var x_ptrs: [R][*]align(1) const q8_k.Block = undefined;
        for (0..R) |r| {
            xs[r] = try alloc.alloc(q8_k.Block, n_blocks);
            rng.floats(wf, 3);
            q8_k.quantize(wf, xs[r]);
            x_ptrs[r] = xs[r].ptr;
        }
        defer for (xs) |x| alloc.free(x);
        var single: [n_out]f32 = undefined;
        dotRows(n_blocks, packed_w.ptr, n_out, xs[0].ptr, &single);
        var multi: [R * n_out]f32 = undefined;
        dotRowsMulti(R, n_blocks, packed_w.ptr, n_out, x_ptrs, &multi, n_out);
        for (0..n_out) |row| {
            const wr = w[row * n_blocks ..][0..n_blocks];
            try std.testing.expectEqual(@as(u32, @bitCast(q4_k.dotGgmlScalar(wr, xs[0]))), @as(u32, @bitCast(single[row])));
            for (0..R) |r| {
                const want: u32 = @bitCast(q4_k.dotGgmlScalar(wr, xs[r]));
                try std.testing.expectEqual(want, @as(u32, @bitCast(multi[r * n_out + row])));
            }
        }
    }
}

/// llama.cpp's ggml_gemm_q4_K_8x8_q8_K for one row, written plainly: per superblock, per pair of
/// sub-blocks, acc += f32(sum of scale * dot) * (d_w * d_x) and accm += f32(sum of min * bsums)
/// * (dmin_w * d_x), each an FMA; then acc - accm.
fn dotGemmScalar(w: []align(1) const q4_k.Block, x: []align(1) const q8_k.Block) f32 {
    var acc: f32 = 0;
    var acc_min: f32 = 0;
    for (w, x) |wb, xb| {
        const sm = q4_k.unpackScales(&wb.scales);
        const d_x = xb.d;
        const d_w: f32 = wb.d;
        const dmin_w: f32 = wb.dmin;
        for (0..4) |c| {
            var sum: i32 = 0;
            var min_sum: i32 = 0;
            for (0..2) |h| {
                const j = 2 * c + h;
                var dot: i32 = 0;
                for (0..32) |i| {
                    const byte = wb.qs[32 * c + i];
                    const q: i32 = if (h == 0) byte & 15 else byte >> 4;
                    dot += q * @as(i32, xb.qs[32 * j + i]);
                }
                sum += @as(i32, sm.scales[j]) * dot;
                min_sum += @as(i32, sm.mins[j]) * (@as(i32, xb.bsums[2 * j]) + xb.bsums[2 * j + 1]);
            }
            acc = @mulAdd(f32, @floatFromInt(sum), d_w * d_x, acc);
            acc_min = @mulAdd(f32, @floatFromInt(min_sum), dmin_w * d_x, acc_min);
        }
    }
    return acc - acc_min;
}

test "q4_k_x8 sub_block_pairs: every row equals llama.cpp's batched rounding, single and batched" {
    const alloc = std.testing.allocator;
    var rng = test_util.TestRng.init(4812);
    const n_blocks = 4;
    const n_out = 16;
    const n = n_blocks * 256;
    const wf = try alloc.alloc(f32, n);
    defer alloc.free(wf);
    const w = try alloc.alloc(q4_k.Block, n_out * n_blocks);
    defer alloc.free(w);
    for (0..n_out) |o| {
        rng.floats(wf, 1);
        q4_k.quantizeRef(wf, w[o * n_blocks ..][0..n_blocks]);
    }
    for (w) |*blk| rng.bytes(&blk.scales);
    const packed_w = try alloc.alloc(u8, n_out * n_blocks * @sizeOf(q4_k.Block));
    defer alloc.free(packed_w);
    repack(@ptrCast(w.ptr), n_out, n_blocks, packed_w.ptr);
    const R = 4;
    var xs: [R][]q8_k.Block = undefined;
    var x_ptrs: [R][*]align(1) const q8_k.Block = undefined;
    for (0..R) |r| {
        xs[r] = try alloc.alloc(q8_k.Block, n_blocks);
        rng.floats(wf, 3);
        q8_k.quantize(wf, xs[r]);
        x_ptrs[r] = xs[r].ptr;
    }
    defer for (xs) |x| alloc.free(x);
    var single: [n_out]f32 = undefined;
    sub_block_pairs.dotRows(n_blocks, packed_w.ptr, n_out, xs[0].ptr, &single);
    var multi: [R * n_out]f32 = undefined;
    sub_block_pairs.dotRowsMulti(R, n_blocks, packed_w.ptr, n_out, x_ptrs, &multi, n_out);
    var differs: usize = 0;
    for (0..n_out) |row| {
        const wr = w[row * n_blocks ..][0..n_blocks];
        try std.testing.expectEqual(@as(u32, @bitCast(dotGemmScalar(wr, xs[0]))), @as(u32, @bitCast(single[row])));
        for (0..R) |r| {
            const want: u32 = @bitCast(dotGemmScalar(wr, xs[r]));
            try std.testing.expectEqual(want, @as(u32, @bitCast(multi[r * n_out + row])));
            if (want != @as(u32, @bitCast(q4_k.dotGgmlScalar(wr, xs[r])))) differs += 1;
        }
    }
    // The two roundings do differ (else the layout would be pointless).
    try std.testing.expect(differs > 0);
}
