//! Q8_0 prompts with AVX-512 VNNI: tiles of sixteen repacked rows, one row per vector lane, as
//! Q4_0's prompt kernel (q4_0_x8.dotRowsMulti) runs.
//!
//! Why: Q8_0's arithmetic (q8_0.dot, ggml's AVX2 kernel, which llama.cpp's prompts use too) keeps
//! eight f32 FMA chains a row, one per four quants of a block, where Q4_0's keeps one. Row-major,
//! each (row, token, block) then costs a dot, a conversion, a scale product and an FMA of eight
//! lanes (q8_0.rowsMultiPairs puts two such pairs in a register): about 2.4 times Q4_0's vector
//! work per product, and Q8_0 prompts ran at 0.45x Q4_0's on 16 cores (bench/results/cpu.md).
//! With rows in lanes, chain c of sixteen rows is one register: per (tile, token, block) eight
//! vpdpbusd, eight conversions, eight FMAs and ONE scale product (the sixteen rows' scales times
//! the token's), with the activation word and each lane's correction read by broadcasts (load
//! ports, not vector ALUs). The integers, scale products, FMA order and final lane sum are
//! q8_0.dot's, so every result equals the single-token rows bit for bit.
//!
//! The activation tables (each token's corrections and scales, TableEntry) are made once a
//! matmul call, before its tasks run (matmul's activation_tables, beside the quantized
//! activations): at 16 threads a task holds a single tile, and making them in every task costs
//! about a fifth of the tile's dot work by instruction count.
//!
//! Tile layout, made from the q8_0_x8 groups once a call for each task's rows (matmul's
//! unpack_rows; same bytes as the rows it covers): for each block column, the tile's row scales
//! (f16), then eight chunks, chunk c holding quant word c of every row (row r at bytes 4r..4r+4)
//! with 0x80 added (w ^ 0x80 = w + 128: vpdpbusd's unsigned operand). A tile has 16 rows, or 8
//! for the last group of an odd count of groups.
const std = @import("std");
const simd = @import("simd.zig");
const q8_0 = @import("q8_0.zig");
const x8 = @import("q8_0_x8.zig");

/// Rows a tile takes (matmul makes tasks of whole tiles; see Traits.batch_row_group).
pub const tile_rows = 16;
/// Tokens per call (matmul's token group).
pub const multi_rows = 8;

/// One block column of a tile of L rows: L * 34 bytes, the size of the blocks it holds.
fn TileBlock(comptime L: usize) type {
    return extern struct {
        d: [L]f16,
        qs: [8][4 * L]u8,
    };
}
comptime {
    std.debug.assert(@sizeOf(TileBlock(16)) == 16 * @sizeOf(q8_0.Block));
    std.debug.assert(@sizeOf(TileBlock(8)) == 8 * @sizeOf(q8_0.Block));
}

/// Writes n_rows (a multiple of 8, from a group boundary) of q8_0_x8 groups at src as tiles at
/// dst: tile k (rows 16k..) where row 16k of the groups starts.
pub fn makeTiles(src: [*]const u8, n_rows: usize, n_blocks: usize, dst: [*]u8) void {
    std.debug.assert(n_rows % x8.rows == 0);
    const row_bytes = n_blocks * @sizeOf(q8_0.Block);
    const flip: simd.V32u8 = @splat(0x80);
    var o: usize = 0;
    while (o < n_rows) {
        const lanes: usize = if (n_rows - o >= 16) 16 else 8;
        const groups: [*]align(1) const x8.Group = @ptrCast(src + o * row_bytes);
        const half = n_blocks; // the second group of rows starts n_blocks groups later
        if (lanes == 16) {
            const tiles: [*]align(1) TileBlock(16) = @ptrCast(dst + o * row_bytes);
            for (0..n_blocks) |b| {
                const lo = &groups[b];
                const hi = &groups[half + b];
                tiles[b].d[0..8].* = lo.d;
                tiles[b].d[8..16].* = hi.d;
                inline for (0..8) |c| {
                    tiles[b].qs[c][0..32].* = @as(simd.V32u8, lo.qs[32 * c ..][0..32].*) ^ flip;
                    tiles[b].qs[c][32..64].* = @as(simd.V32u8, hi.qs[32 * c ..][0..32].*) ^ flip;
                }
            }
        } else {
            const tiles: [*]align(1) TileBlock(8) = @ptrCast(dst + o * row_bytes);
            for (0..n_blocks) |b| {
                tiles[b].d = groups[b].d;
                inline for (0..8) |c| tiles[b].qs[c] = @as(simd.V32u8, groups[b].qs[32 * c ..][0..32].*) ^ flip;
            }
        }
        o += lanes;
    }
}

/// A token's per-block values the kernel broadcasts: each lane's correction (-128 times the sum
/// of its four activation quants: what the weights' +128 adds) and the block's scale.
pub const TableEntry = extern struct {
    corrections: [8]i32,
    scale: f32,
};

/// Bytes of one activation row's tables (n_blocks entries).
pub fn tableRowBytes(n_blocks: usize) usize {
    return n_blocks * @sizeOf(TableEntry);
}

/// The tables of one activation row of n_blocks Q8_0 blocks at x, to dst.
pub fn fillTables(x: [*]align(1) const q8_0.Block, n_blocks: usize, dst: [*]TableEntry) void {
    for (0..n_blocks) |b| {
        dst[b] = .{ .corrections = q8_0.laneCorrection(128, &x[b]), .scale = x[b].d };
    }
}

/// Token-blocks of activation tables dotTiles keeps on the stack (72 KiB): eight tokens of
/// 8,192-wide rows, two of 32,768; wider rows take one token at a time, and past 65,536 values
/// the scalar reference.
const table_capacity = 2048;

/// Dots of n_out tiled rows (matmul's tile copy, at w; row bytes w_row_bytes) with n_tok
/// activation rows (Q8_0, x_row_bytes apart): token t, row o to out[t * out_stride + o]. Makes
/// its tokens' tables itself, once a call (the MoE's tiles); matmul makes them once for all its
/// tasks and calls dotTilesWithTables.
pub fn dotTiles(n_blocks: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]const u8, x_row_bytes: usize, n_tok: usize, out: [*]f32, out_stride: usize) void {
    const per_call = @min(n_tok, table_capacity / n_blocks);
    if (per_call == 0) return dotTilesScalar(n_blocks, w, w_row_bytes, n_out, x, x_row_bytes, n_tok, out, out_stride);
    var tables: [table_capacity]TableEntry = undefined;
    var t0: usize = 0;
    while (t0 < n_tok) : (t0 += per_call) {
        const n = @min(per_call, n_tok - t0);
        for (0..n) |t| fillTables(@ptrCast(x + (t0 + t) * x_row_bytes), n_blocks, tables[t * n_blocks ..].ptr);
        dotTilesWithTables(n_blocks, w, w_row_bytes, n_out, x + t0 * x_row_bytes, x_row_bytes, @ptrCast(&tables), tableRowBytes(n_blocks), n, out + t0 * out_stride, out_stride);
    }
}

/// dotTiles with the tokens' tables made by the caller (fillTables): token t's at
/// tables + t * tables_row_bytes (a multiple of 4).
pub fn dotTilesWithTables(n_blocks: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]const u8, x_row_bytes: usize, tables: [*]const u8, tables_row_bytes: usize, n_tok: usize, out: [*]f32, out_stride: usize) void {
    var o: usize = 0;
    while (o < n_out) {
        const lanes: usize = if (n_out - o >= 16) 16 else 8;
        const tile = w + o * w_row_bytes;
        var t: usize = 0;
        // Two tokens at a time: 16 chains, the tile's 8 chunks and a few temporaries fill
        // the 32 vector registers.
        while (t + 2 <= n_tok) : (t += 2) {
            if (lanes == 16) tileTokens(16, 2, n_blocks, tile, x, x_row_bytes, t, tables, tables_row_bytes, out + o, out_stride) else tileTokens(8, 2, n_blocks, tile, x, x_row_bytes, t, tables, tables_row_bytes, out + o, out_stride);
        }
        if (t < n_tok) {
            if (lanes == 16) tileTokens(16, 1, n_blocks, tile, x, x_row_bytes, t, tables, tables_row_bytes, out + o, out_stride) else tileTokens(8, 1, n_blocks, tile, x, x_row_bytes, t, tables, tables_row_bytes, out + o, out_stride);
        }
        o += lanes;
    }
}

/// T tokens (from token `tok`) over one tile of L rows.
inline fn tileTokens(
    comptime L: usize,
    comptime T: usize,
    n_blocks: usize,
    tile: [*]const u8,
    x: [*]const u8,
    x_row_bytes: usize,
    tok: usize,
    tables: [*]const u8,
    tables_row_bytes: usize,
    out: [*]f32,
    out_stride: usize,
) void {
    const VF = @Vector(L, f32);
    const VI = @Vector(L, i32);
    const blocks: [*]align(1) const TileBlock(L) = @ptrCast(tile);
    var xs: [T][*]align(1) const q8_0.Block = undefined;
    var ts: [T][*]const TableEntry = undefined;
    inline for (0..T) |t| {
        xs[t] = @ptrCast(x + (tok + t) * x_row_bytes);
        ts[t] = @ptrCast(@alignCast(tables + (tok + t) * tables_row_bytes));
    }
    // acc[t][c]: lane chain c of the L rows (row r in vector lane r) for token t.
    var acc: [T][8]VF = @splat(@splat(@splat(0)));
    for (0..n_blocks) |b| {
        const tb = &blocks[b];
        var u: [8]@Vector(4 * L, u8) = undefined;
        inline for (0..8) |c| u[c] = tb.qs[c];
        const d_w: VF = @as(@Vector(L, f16), tb.d);
        inline for (0..T) |t| {
            const entry = &ts[t][b];
            const d = d_w * @as(VF, @splat(entry.scale));
            const words: [*]align(1) const i32 = @ptrCast(&xs[t][b].qs);
            inline for (0..8) |c| {
                const sums = dotWord(L, @as(VI, @splat(entry.corrections[c])), u[c], words, c);
                acc[t][c] = @mulAdd(VF, d, @floatFromInt(sums), acc[t][c]);
            }
        }
    }
    inline for (0..T) |t| {
        const a = acc[t];
        // simd.hsum's tree over each row's eight chains.
        out[(tok + t) * out_stride ..][0..L].* = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
    }
}

/// acc + vpdpbusd(u, the i32 words[word] in every lane), the word read by the instruction's
/// own broadcast ({1toL}): simd.vnniWord for L lanes.
inline fn dotWord(comptime L: usize, acc: @Vector(L, i32), u: @Vector(4 * L, u8), words: [*]align(1) const i32, comptime word: usize) @Vector(L, i32) {
    return asm (std.fmt.comptimePrint("vpdpbusd {d}(%[p]){{1to{d}}}, %[u], %[acc]", .{ 4 * word, L })
        : [acc] "=v" (-> @Vector(L, i32)),
        : [u] "v" (u),
          [p] "r" (words),
          [acc_in] "0" (acc),
        : "memory"
    );
}

/// The scalar reference of dotTiles (and its path past the tables' capacity): for each row and
/// token, q8_0.dot's arithmetic written out: lane c's integer sum of four products, the f32
/// scale product, one FMA a block into chain c, then simd.hsum's tree.
pub fn dotTilesScalar(n_blocks: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]const u8, x_row_bytes: usize, n_tok: usize, out: [*]f32, out_stride: usize) void {
    var o: usize = 0;
    while (o < n_out) {
        const lanes: usize = if (n_out - o >= 16) 16 else 8;
        const tile = w + o * w_row_bytes;
        const block_bytes = lanes * @sizeOf(q8_0.Block);
        for (0..n_tok) |t| {
            const xr: [*]align(1) const q8_0.Block = @ptrCast(x + t * x_row_bytes);
            for (0..lanes) |r| {
                var acc: [8]f32 = @splat(0);
                for (0..n_blocks) |b| {
                    const tb = tile + b * block_bytes;
                    const d_bits = std.mem.readInt(u16, tb[2 * r ..][0..2], .little);
                    const d = @as(f32, @as(f16, @bitCast(d_bits))) * @as(f32, xr[b].d);
                    for (0..8) |c| {
                        var sum: i32 = 0;
                        for (0..4) |k| {
                            const u: i32 = tb[2 * lanes + c * 4 * lanes + 4 * r + k];
                            sum += (u - 128) * @as(i32, xr[b].qs[4 * c + k]);
                        }
                        acc[c] = @mulAdd(f32, d, @floatFromInt(sum), acc[c]);
                    }
                }
                out[t * out_stride + o + r] = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
            }
        }
        o += lanes;
    }
}

const test_util = @import("test_util.zig");

test "q8_0 tiles: the VNNI kernel, its tables made by itself or by the caller, equals the scalar reference and q8_0.dot, bit for bit" {
    if (comptime !simd.has_vnni) return error.SkipZigTest;
    const alloc = std.testing.allocator;
    var rng = test_util.TestRng.init(1616);
    // Odd widths and row counts of 8 past a tile of 16; tokens in and past a call's pairs.
    for ([_]usize{ 1, 3, 7, 33 }) |n_blocks| {
        for ([_]usize{ 8, 24, 40, 48 }) |n_out| {
            const row_bytes = n_blocks * @sizeOf(q8_0.Block);
            const w = try alloc.alloc(q8_0.Block, n_out * n_blocks);
            defer alloc.free(w);
            const wf = try alloc.alloc(f32, n_blocks * 32);
            defer alloc.free(wf);
            for (0..n_out) |o| {
                rng.floats(wf, 1);
                q8_0.quantizeRef(wf, w[o * n_blocks ..][0..n_blocks]);
            }
            w[0].qs[0] = -128; // a valid weight quant (not an activation one)
            w[n_blocks].qs[5] = -128;
            const grouped = try alloc.alloc(u8, n_out * row_bytes);
            defer alloc.free(grouped);
            x8.repack(@ptrCast(w.ptr), n_out, n_blocks, grouped.ptr);
            const tiles = try alloc.alloc(u8, n_out * row_bytes);
            defer alloc.free(tiles);
            makeTiles(grouped.ptr, n_out, n_blocks, tiles.ptr);
            for ([_]usize{ 1, 2, 5, 8 }) |n_tok| {
                const x = try alloc.alloc(q8_0.Block, n_tok * n_blocks);
                defer alloc.free(x);
                for (0..n_tok) |t| {
                    rng.floats(wf, 3);
                    q8_0.quantize(wf, x[t * n_blocks ..][0..n_blocks]);
                }
                const stride = n_out + 3; // results land at their stride, nothing between
                const got = try alloc.alloc(f32, n_tok * stride);
                defer alloc.free(got);
                const want = try alloc.alloc(f32, n_tok * stride);
                defer alloc.free(want);
                @memset(got, 0);
                @memset(want, 0);
                dotTiles(n_blocks, tiles.ptr, row_bytes, n_out, @ptrCast(x.ptr), row_bytes, n_tok, got.ptr, stride);
                dotTilesScalar(n_blocks, tiles.ptr, row_bytes, n_out, @ptrCast(x.ptr), row_bytes, n_tok, want.ptr, stride);
                try std.testing.expectEqualSlices(u32, std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(want)), std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(got)));
                // The tables made by the caller (matmul's, once a call): the same bits.
                const tables = try alloc.alloc(TableEntry, n_tok * n_blocks);
                defer alloc.free(tables);
                for (0..n_tok) |t| fillTables(x[t * n_blocks ..].ptr, n_blocks, tables[t * n_blocks ..].ptr);
                @memset(got, 0);
                dotTilesWithTables(n_blocks, tiles.ptr, row_bytes, n_out, @ptrCast(x.ptr), row_bytes, @ptrCast(tables.ptr), tableRowBytes(n_blocks), n_tok, got.ptr, stride);
                try std.testing.expectEqualSlices(u32, std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(want)), std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(got)));
                for (0..n_tok) |t| {
                    for (0..n_out) |o| {
                        const d = q8_0.dot(w[o * n_blocks ..][0..n_blocks], x[t * n_blocks ..][0..n_blocks]);
                        try std.testing.expectEqual(@as(u32, @bitCast(d)), @as(u32, @bitCast(got[t * stride + o])));
                    }
                }
            }
        }
    }
}
