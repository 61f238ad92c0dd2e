//! Q8_0 repacked for the one-token matvec: eight weight rows interleaved, so one vector lane holds
//! one row (the layout of q4_0_x8.zig, with 8-bit quants).
//!
//! Why: row-major Q8_0 follows ggml's AVX2 arithmetic (q8_0.dot) — per block, eight integer lane
//! sums of four products each, and eight f32 FMA chains, one per lane, summed by hsum at the end
//! — and one row at a time that is a chain of one FMA per 34 bytes, whose latency capped the
//! kernel at ~49 GB/s from cache on the 2-core EPYC measured (bench/matvec.ts --mib 4; the
//! 4-bit x8 layouts reach 62–70), close to what DRAM gives there on a good hour. Here chunk c of
//! a group holds lane c's four quants of all eight rows, so one u8 x i8 dot-of-four gives lane c
//! of every row at once, and the eight lane chains are eight vector FMAs per block, each a row
//! per lane: the same integers, the same FMAs in the same order, the same hsum tree — every row
//! equals q8_0.dot bit for bit.
//!
//! A group (eight rows, one 32-value block column) is 272 bytes, the size of the eight Q8_0
//! blocks it replaces, so a matrix keeps its size and group g of rows 8k..8k+7 starts where row
//! 8k did:
//!   d:  the eight rows' f16 scales;
//!   qs: eight 32-byte chunks; chunk c holds, for row r, that row's qs[4c .. 4c+4] at bytes
//!       4r .. 4r+4.
//! Batches (prompts) with AVX-512 VNNI run on tiles of sixteen of these rows (q8_0_tiles.zig);
//! elsewhere on Q8_0 rows: lib/cpu/matmul.zig copies each tile of rows (at most
//! 128 KiB) back once a call and runs q8_0's batched kernel over it for every token, so the copy
//! costs one pass over the tile per call and prompts run as fast as the stored layout's. (A
//! batched kernel on this layout was ~25% slower: each dot needs its own broadcast activation
//! word, where the row-major kernel loads a 32-byte activation block once for two rows.)
const std = @import("std");
const simd = @import("simd.zig");
const q8_0 = @import("q8_0.zig");

pub const rows = 8;
pub const block_values = q8_0.block_values;

const layout = @import("interleave.zig").Rows(q8_0.Block);
pub const Group = layout.Group;
/// Interleaves n_out (a multiple of 8) row-major Q8_0 rows of n_blocks blocks into groups.
pub const repack = layout.repack;
/// Rows 0..n_rows (a multiple of 8) of the groups at src back to row-major Q8_0 at dst: the
/// inverse of repack, which batches run on (lib/cpu/matmul.zig, Traits.unpack_rows).
pub const unpackRows = layout.unpack;

/// Lane c (four products) of each of the group's rows for one activation block: chunk c's bytes
/// against x's quants 4c..4c+3 broadcast. With VNNI the weights are taken as w + 128 (w ^ 0x80,
/// an unsigned byte) and `correction` (-128 * the four activation quants' sum) restores the
/// signed sum; elsewhere the signed dot directly. The same integers either way.
inline fn laneSums(chunk: simd.V32i8, words: [*]align(1) const i32, comptime c: usize, correction: i32) simd.V8i32 {
    if (comptime simd.has_vnni) {
        const u: simd.V32u8 = @as(simd.V32u8, @bitCast(chunk)) ^ @as(simd.V32u8, @splat(0x80));
        return simd.dotAccU7I8Word(@splat(correction), u, words, c); // VNNI: any unsigned byte
    }
    return simd.dotAccI8I8(@splat(0), chunk, @bitCast(@as(simd.V8i32, @splat(words[c]))));
}

/// Activation blocks whose lane corrections dotRows keeps on the stack (n_in <= 32768).
const corrections_max_blocks = 1024;

/// -128 * (sum of activation quants 4c..4c+3) for each lane c of a block (VNNI's offset).
inline fn blockCorrections(x: *align(1) const q8_0.Block) [8]i32 {
    return q8_0.laneCorrection(128, x);
}

/// Single-token matvec over n_out rows (a multiple of 8) starting at a group boundary: for each
/// row, q8_0.dot's eight lane chains and hsum, eight rows at a time.
pub fn dotRows(n_blocks: usize, w: [*]const u8, n_out: usize, x: [*]align(1) const q8_0.Block, out: [*]f32) void {
    var corrections: [corrections_max_blocks][8]i32 = undefined;
    const cached = n_blocks <= corrections_max_blocks;
    if (cached) for (0..n_blocks) |b| {
        corrections[b] = blockCorrections(&x[b]);
    };
    const row_bytes = n_blocks * @sizeOf(q8_0.Block);
    var o: usize = 0;
    while (o < n_out) : (o += rows) {
        const groups: [*]align(1) const Group = @ptrCast(w + o * row_bytes);
        // acc[c]: lane c's chain of the eight rows (row r in vector lane r).
        var acc: [8]simd.V8f32 = @splat(@splat(0));
        for (0..n_blocks) |b| {
            const g = &groups[b];
            const xb = &x[b];
            const words: [*]align(1) const i32 = @ptrCast(&xb.qs);
            const corr = if (cached) corrections[b] else blockCorrections(xb);
            const d_w: simd.V8f32 = @as(@Vector(rows, f16), g.d);
            const d = d_w * @as(simd.V8f32, @splat(@as(f32, xb.d)));
            inline for (0..8) |c| {
                const chunk: simd.V32i8 = @bitCast(g.qs[32 * c ..][0..32].*);
                const sums = laneSums(chunk, words, c, corr[c]);
                acc[c] = @mulAdd(simd.V8f32, d, @floatFromInt(sums), acc[c]);
            }
        }
        out[o..][0..rows].* = laneTree(acc);
    }
}

/// The eight rows' lanes summed in simd.hsum's tree, ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
inline fn laneTree(acc: [8]simd.V8f32) simd.V8f32 {
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/// The format batches are computed in (lib/cpu/matmul.zig copies a tile back with unpackRows).
pub const base_id = @import("types.zig").TypeId.q8_0;
/// With AVX-512 VNNI, batches run on tiles of sixteen rows instead (q8_0_tiles.zig says why).
pub const tiles: ?type = if (simd.has_vnni) @import("q8_0_tiles.zig") else null;

const test_util = @import("test_util.zig");

test "q8_0_x8: repack round-trips, and every row equals q8_0.dot bit for bit" {
    const alloc = std.testing.allocator;
    var rng = test_util.TestRng.init(880);
    // 1,100 blocks: wider than the corrections cache.
    for ([_]usize{ 1, 3, 33, 1100 }) |n_blocks| {
        const n_out = 16;
        const n = n_blocks * block_values;
        const w = try alloc.alloc(q8_0.Block, n_out * n_blocks);
        defer alloc.free(w);
        rng.bytes(std.mem.sliceAsBytes(w));
        for (w) |*b| b.d = test_util.randomScale(&rng, true);
        // -128 is a valid weight quant (not an activation one): keep some.
        w[0].qs[0] = -128;
        const src: [*]const u8 = @ptrCast(w.ptr);
        const packed_w = try alloc.alloc(u8, n_out * n_blocks * @sizeOf(q8_0.Block));
        defer alloc.free(packed_w);
        repack(src, n_out, n_blocks, packed_w.ptr);
        const back = try alloc.alloc(u8, packed_w.len);
        defer alloc.free(back);
        unpackRows(packed_w.ptr, n_out, n_blocks, back.ptr);
        try std.testing.expectEqualSlices(u8, std.mem.sliceAsBytes(w), back);

        const x = try alloc.alloc(q8_0.Block, n_blocks);
        defer alloc.free(x);
        const xf = try alloc.alloc(f32, n);
        defer alloc.free(xf);
        rng.floats(xf, 3);
        q8_0.quantize(xf, x);
        var out: [n_out]f32 = undefined;
        dotRows(n_blocks, packed_w.ptr, n_out, x.ptr, &out);
        for (0..n_out) |row| {
            const want: u32 = @bitCast(q8_0.dot(w[row * n_blocks ..][0..n_blocks], x));
            try std.testing.expectEqual(want, @as(u32, @bitCast(out[row])));
        }
    }
}

test {
    if (tiles) |T| std.testing.refAllDecls(T);
}
