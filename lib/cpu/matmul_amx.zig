//! Prompt matmuls on AMX tiles (amx.zig) for the repacked Q4_0 and Q4_K layouts, with the bits of
//! the single-token kernels: every (weight row, token) pair still sums as q4_0_x8.dotRows or
//! q4_k_x8.dotRows does, so a prompt gives exactly the logits of its tokens one at a time.
//!
//! That works because those kernels' arithmetic is an exact integer per block followed by f32
//! FMAs in a fixed order. The tiles compute the integers (a tile of C is 16 tokens x 16 weight
//! rows of i32), and an AVX-512 epilogue applies the scales in the single-token order:
//! - Q4_0: per 32-value block, C = sum (q - 8) * x (tdpbssd over K = 32), then per pair
//!   acc = fma(f32(C), d_w * d_x, acc), as q4_0_x8.chainStep.
//! - Q4_K: per 256-value superblock, sum_j scale_j * dot_j, with the 6-bit scale split as
//!   8 * (scale >> 3) + (scale & 7) and each part folded into the weight bytes (at most 7 * 15):
//!   C_hi = sum (s_hi * q) * x and C_lo = sum (s_lo * q) * x over K = 256, sum = 8 * C_hi + C_lo;
//!   the mins term sum_j min_j * (bsums of sub-block j) is sum min_j * x as a third product, the
//!   same integer. Then acc = fma(f32(sum), d_w * d_x, acc), acc_min likewise with dmin, and
//!   acc - acc_min, as q4_k_x8.dotRowsMultiRounded(.superblock).
//! Q8_0's single-token arithmetic keeps eight f32 chains a block, one per four quants
//! (q8_0_x8.zig), which a tile could give only at K = 4, no faster than VNNI: it stays there.
//!
//! Each task converts its rows once a call from the repacked layout into B tiles (i8, the
//! "VNNI" order: B[k][4n + i] = W[n][4k + i]) in a thread-local buffer, then runs every full tile
//! of 16 tokens over them; tokens past the last full tile take the VNNI kernels (same bits).
//! The packing and the kernels are generic over the tile implementation: tests run them on
//! amx.Emulated against the scalar references on any CPU, and on amx.Hardware where there is AMX.
const std = @import("std");
const amx = @import("amx.zig");
const q4_0 = @import("../quant/q4_0.zig");
const q4_0_x8 = @import("../quant/q4_0_x8.zig");
const q4_k = @import("../quant/q4_k.zig");
const q4_k_x8 = @import("../quant/q4_k_x8.zig");
const q8_0 = @import("../quant/q8_0.zig");
const q8_k = @import("../quant/q8_k.zig");

/// Weight rows (N) and tokens (M) of a C tile.
pub const tile_rows = 16;
pub const tile_tokens = 16;

const V16f = @Vector(16, f32);
const V16i = @Vector(16, i32);
const V32u8 = @Vector(32, u8);

pub const Format = enum {
    q4_0,
    q4_k,

    pub fn blockValues(f: Format) usize {
        return switch (f) {
            .q4_0 => q4_0.block_values,
            .q4_k => q4_k.block_values,
        };
    }

    /// Bytes of one 16-row tile's packing of n_blocks blocks: B tiles, then f32 scales.
    pub fn packedBytes(f: Format, n_blocks: usize) usize {
        const per_block: usize = switch (f) {
            .q4_0 => q4_0_block_bytes + tile_rows * 4,
            .q4_k => q4_k_block_bytes + 2 * tile_rows * 4,
        };
        return n_blocks * per_block;
    }
};

/// A Q4_0 block's B tile: 8 quads (K = 32) x 16 rows x 4 bytes.
const q4_0_block_bytes = 8 * 64;
/// A Q4_K superblock's B tiles: (hi, lo, min) x 4 chunks of K = 64 (16 quads x 64 bytes).
const q4_k_block_bytes = 3 * 4 * 1024;

// ---- packing: the repacked layouts (eight rows a group) into B tiles of sixteen rows ----------

/// Rows 0..8 * n_groups (n_groups 1 or 2) of q4_0_x8 groups at w (rows row_bytes apart) into one
/// tile's packing: per block the B tile of q - 8, then per block the 16 rows' d as f32; the rows
/// past 8 * n_groups are zero.
pub fn packQ4_0(w: [*]const u8, row_bytes: usize, n_groups: usize, n_blocks: usize, dst: [*]align(64) u8) void {
    std.debug.assert(n_groups == 1 or n_groups == 2);
    const d_out: [*]f32 = @ptrCast(@alignCast(dst + n_blocks * q4_0_block_bytes));
    const low: V32u8 = @splat(15);
    const eight: V32u8 = @splat(8);
    for (0..n_blocks) |b| {
        const tile = dst + b * q4_0_block_bytes;
        for (0..2) |h| {
            if (h >= n_groups) {
                for (0..8) |k| tile[64 * k + 32 * h ..][0..32].* = @splat(0);
                for (0..8) |r| d_out[16 * b + 8 * h + r] = 0;
                continue;
            }
            const groups: [*]align(1) const q4_0_x8.Group = @ptrCast(w + 8 * h * row_bytes);
            const g = &groups[b];
            // Chunk c: row r's quants 4c..4c+3 (low nibbles) and 16+4c.. (high) at bytes 4r..
            inline for (0..4) |c| {
                const chunk: V32u8 = g.qs[32 * c ..][0..32].*;
                tile[64 * c + 32 * h ..][0..32].* = (chunk & low) -% eight;
                tile[64 * (4 + c) + 32 * h ..][0..32].* = (chunk >> @splat(4)) -% eight;
            }
            for (0..8) |r| d_out[16 * b + 8 * h + r] = g.d[r];
        }
    }
}

/// Byte 4r + i of the result: byte 8j + r of v (sub-block j of row r, for each of its 4 quants).
inline fn perRow(v: @Vector(64, u8), comptime j: usize) V32u8 {
    return @shuffle(u8, v, undefined, blk: {
        var m: [32]i32 = undefined;
        for (0..32) |k| m[k] = @intCast(8 * j + k / 4);
        break :blk m;
    });
}

/// As packQ4_0 for q4_k_x8 groups: per superblock the hi, lo and min B tiles (K = 64 each, four
/// a part), then per superblock the 16 rows' d and dmin as f32.
pub fn packQ4_K(w: [*]const u8, row_bytes: usize, n_groups: usize, n_blocks: usize, dst: [*]align(64) u8) void {
    @setEvalBranchQuota(10_000);
    std.debug.assert(n_groups == 1 or n_groups == 2);
    const scales: [*]f32 = @ptrCast(@alignCast(dst + n_blocks * q4_k_block_bytes));
    const low: V32u8 = @splat(15);
    const seven: V32u8 = @splat(7);
    for (0..n_blocks) |b| {
        const tiles = dst + b * q4_k_block_bytes;
        for (0..2) |h| {
            if (h >= n_groups) {
                for (0..q4_k_block_bytes / 64) |k| tiles[64 * k + 32 * h ..][0..32].* = @splat(0);
                for (0..8) |r| {
                    scales[32 * b + 8 * h + r] = 0;
                    scales[32 * b + 16 + 8 * h + r] = 0;
                }
                continue;
            }
            const groups: [*]align(1) const q4_k_x8.Group = @ptrCast(w + 8 * h * row_bytes);
            const g = &groups[b];
            const gs = q4_k_x8.groupScales(g);
            // Value 64q + 4k + i of a row: sub-block j = 2q + k / 8, in chunk 8q + k % 8 (low
            // nibbles for even j, high for odd), row r's bytes 4r..4r+3.
            inline for (0..4) |q| {
                inline for (0..16) |k| {
                    const j = 2 * q + k / 8;
                    const chunk: V32u8 = g.qs[32 * (8 * q + k % 8) ..][0..32].*;
                    const nib = if (k < 8) chunk & low else chunk >> @splat(4);
                    const s = perRow(gs.scales, j);
                    const at = 1024 * q + 64 * k + 32 * h;
                    tiles[at..][0..32].* = nib * (s >> @splat(3));
                    tiles[4096 + at ..][0..32].* = nib * (s & seven);
                    tiles[8192 + at ..][0..32].* = perRow(gs.mins, j);
                }
            }
            for (0..8) |r| {
                scales[32 * b + 8 * h + r] = g.d[r];
                scales[32 * b + 16 + 8 * h + r] = g.dmin[r];
            }
        }
    }
}

// ---- kernels: one tile of 16 rows with 16 tokens ------------------------------------------------

/// The tile shapes the kernels use (one configuration for both formats).
pub fn config(f: Format) amx.Config {
    var c: amx.Config = .{};
    switch (f) {
        .q4_0 => {
            // A (tokens x 32 bytes) in 0 and 1, B (8 quads x 64) in 2 and 3, C in 4 and 5: two
            // blocks in flight, so the next block's tile work overlaps this one's epilogue.
            for ([_]u3{ 0, 1 }) |t| c.set(t, 16, 32);
            for ([_]u3{ 2, 3 }) |t| c.set(t, 8, 64);
            for ([_]u3{ 4, 5 }) |t| c.set(t, 16, 64);
        },
        .q4_k => {
            c.set(0, 16, 64); // A: tokens x 64 bytes
            for ([_]u3{ 1, 2, 3 }) |t| c.set(t, 16, 64); // B: hi, lo, min
            for ([_]u3{ 4, 5, 6 }) |t| c.set(t, 16, 64); // C: hi, lo, min
        },
    }
    return c;
}

const CTile = [tile_tokens]V16i;

/// Q4_0: 16 tokens (Q8_0 rows at x, x_stride apart) with one packed tile of 16 rows; result
/// (token t, row n) to out[t * out_stride + n] for n < rows_valid.
fn kernelQ4_0(comptime T: type, tiles: *T, n_blocks: usize, packed_tile: [*]align(64) const u8,
    x: [*]const u8, x_stride: usize, out: [*]f32, out_stride: usize, rows_valid: usize) void {
    const d_w: [*]const f32 = @ptrCast(@alignCast(packed_tile + n_blocks * q4_0_block_bytes));
    var c: [2]CTile align(64) = undefined;
    var acc: [tile_tokens]V16f = @splat(@splat(0));
    const block_bytes = @sizeOf(q8_0.Block);
    const Issue = struct {
        inline fn run(t: *T, comptime set: u3, b: usize, xp: [*]const u8, xs: usize, bp: [*]const u8, cp: *CTile) void {
            t.load(set, xp + b * block_bytes + 2, xs);
            t.load(2 + set, bp + b * q4_0_block_bytes, 64);
            t.zero(4 + set);
            t.dpbssd(4 + set, set, 2 + set);
            t.store(4 + set, @ptrCast(cp), 64);
        }
    };
    Issue.run(tiles, 0, 0, x, x_stride, packed_tile, &c[0]);
    var b: usize = 0;
    while (b < n_blocks) : (b += 2) {
        if (b + 1 < n_blocks) Issue.run(tiles, 1, b + 1, x, x_stride, packed_tile, &c[1]);
        epilogueQ4_0(&acc, &c[0], d_w + 16 * b, x + b * block_bytes, x_stride);
        if (b + 1 < n_blocks) {
            if (b + 2 < n_blocks) Issue.run(tiles, 0, b + 2, x, x_stride, packed_tile, &c[0]);
            epilogueQ4_0(&acc, &c[1], d_w + 16 * (b + 1), x + (b + 1) * block_bytes, x_stride);
        }
    }
    writeTile(&acc, out, out_stride, rows_valid);
}

/// q4_0_x8.chainStep for 16 tokens x 16 rows: acc = fma(f32(C), d_w * d_x, acc).
inline fn epilogueQ4_0(acc: *[tile_tokens]V16f, c: *const CTile, d_w: [*]const f32, x_block: [*]const u8, x_stride: usize) void {
    const dw: V16f = d_w[0..16].*;
    inline for (0..tile_tokens) |t| {
        const blk: *align(1) const q8_0.Block = @ptrCast(x_block + t * x_stride);
        const d = dw * @as(V16f, @splat(@as(f32, blk.d)));
        acc[t] = @mulAdd(V16f, @floatFromInt(c[t]), d, acc[t]);
    }
}

/// Q4_K: as kernelQ4_0, with Q8_K activation rows.
fn kernelQ4_K(comptime T: type, tiles: *T, n_blocks: usize, packed_tile: [*]align(64) const u8,
    x: [*]const u8, x_stride: usize, out: [*]f32, out_stride: usize, rows_valid: usize) void {
    const scales: [*]const f32 = @ptrCast(@alignCast(packed_tile + n_blocks * q4_k_block_bytes));
    var c: [3]CTile align(64) = undefined;
    var acc: [tile_tokens]V16f = @splat(@splat(0));
    var acc_min: [tile_tokens]V16f = @splat(@splat(0));
    const block_bytes = @sizeOf(q8_k.Block);
    for (0..n_blocks) |b| {
        const bp = packed_tile + b * q4_k_block_bytes;
        inline for (4..7) |t| tiles.zero(t);
        inline for (0..4) |q| {
            tiles.load(0, x + b * block_bytes + 4 + 64 * q, x_stride);
            inline for (0..3) |part| {
                tiles.load(1 + part, bp + 4096 * part + 1024 * q, 64);
                tiles.dpbssd(4 + part, 0, 1 + part);
            }
        }
        inline for (0..3) |part| tiles.store(4 + part, @ptrCast(&c[part]), 64);
        const dw: V16f = scales[32 * b ..][0..16].*;
        const dmin: V16f = scales[32 * b + 16 ..][0..16].*;
        inline for (0..tile_tokens) |t| {
            const blk: *align(1) const q8_k.Block = @ptrCast(x + t * x_stride + b * block_bytes);
            const d_x: V16f = @splat(blk.d);
            const sum = (c[0][t] << @splat(3)) + c[1][t];
            acc[t] = @mulAdd(V16f, @floatFromInt(sum), dw * d_x, acc[t]);
            acc_min[t] = @mulAdd(V16f, @floatFromInt(c[2][t]), dmin * d_x, acc_min[t]);
        }
    }
    inline for (0..tile_tokens) |t| acc[t] -= acc_min[t];
    writeTile(&acc, out, out_stride, rows_valid);
}

inline fn writeTile(acc: *const [tile_tokens]V16f, out: [*]f32, out_stride: usize, rows_valid: usize) void {
    for (0..tile_tokens) |t| {
        if (rows_valid == tile_rows) {
            out[t * out_stride ..][0..16].* = acc[t];
        } else {
            const a: [16]f32 = acc[t];
            @memcpy(out[t * out_stride ..][0..rows_valid], a[0..rows_valid]);
        }
    }
}

// ---- a task: rows of the repacked matrix with every full tile of tokens -------------------------

pub const Task = struct {
    format: Format,
    /// The task's first row (a group boundary) in the repacked layout.
    w: [*]const u8,
    w_row_bytes: usize,
    /// A multiple of 8.
    rows: usize,
    n_in: usize,
    /// Activations in the format's vec_dot type (Q8_0 or Q8_K rows).
    x: [*]const u8,
    x_row_bytes: usize,
    /// A multiple of tile_tokens.
    n_tok: usize,
    y: [*]f32,
    y_stride: usize,
};

/// Bytes of packing `run` needs for a task of `rows` rows.
pub fn scratchBytes(f: Format, rows: usize, n_in: usize) usize {
    const row_tiles = std.math.divCeil(usize, rows, tile_rows) catch unreachable;
    return row_tiles * f.packedBytes(n_in / f.blockValues());
}

/// y rows 0..task.n_tok, columns of the task's rows. `scratch` holds scratchBytes.
pub fn run(comptime T: type, tiles: *T, task: Task, scratch: [*]align(64) u8) void {
    std.debug.assert(task.rows % 8 == 0 and task.n_tok % tile_tokens == 0);
    const n_blocks = task.n_in / task.format.blockValues();
    const tile_bytes = task.format.packedBytes(n_blocks);
    const row_tiles = std.math.divCeil(usize, task.rows, tile_rows) catch unreachable;
    for (0..row_tiles) |rt| {
        const n_groups = @min(2, (task.rows - rt * tile_rows) / 8);
        const w = task.w + rt * tile_rows * task.w_row_bytes;
        const dst: [*]align(64) u8 = @alignCast(scratch + rt * tile_bytes);
        switch (task.format) {
            .q4_0 => packQ4_0(w, task.w_row_bytes, n_groups, n_blocks, dst),
            .q4_k => packQ4_K(w, task.w_row_bytes, n_groups, n_blocks, dst),
        }
    }
    const cfg = config(task.format);
    tiles.configure(&cfg);
    defer tiles.release();
    var t: usize = 0;
    while (t < task.n_tok) : (t += tile_tokens) {
        const x = task.x + t * task.x_row_bytes;
        for (0..row_tiles) |rt| {
            const rows_valid = @min(tile_rows, task.rows - rt * tile_rows);
            const p: [*]align(64) const u8 = @alignCast(scratch + rt * tile_bytes);
            const out = task.y + t * task.y_stride + rt * tile_rows;
            switch (task.format) {
                .q4_0 => kernelQ4_0(T, tiles, n_blocks, p, x, task.x_row_bytes, out, task.y_stride, rows_valid),
                .q4_k => kernelQ4_K(T, tiles, n_blocks, p, x, task.x_row_bytes, out, task.y_stride, rows_valid),
            }
        }
    }
}

// ---- tests: the tile path against the scalar references, bit for bit ----------------------------

const test_util = @import("../quant/test_util.zig");

/// Random weights of `f` (n_out rows x n_blocks), repacked; activations of n_tok rows; y from
/// `run` on tiles of T for every full tile of tokens, against the scalar reference dots.
fn checkFormat(comptime T: type, tiles: *T, comptime f: Format, n_out: usize, n_blocks: usize, n_tok: usize, seed: u64) !void {
    const alloc = std.testing.allocator;
    var rng = test_util.TestRng.init(seed);
    const n_in = n_blocks * f.blockValues();
    const W = switch (f) {
        .q4_0 => q4_0,
        .q4_k => q4_k,
    };
    const X = switch (f) {
        .q4_0 => q8_0,
        .q4_k => q8_k,
    };
    const w = try alloc.alloc(W.Block, n_out * n_blocks);
    defer alloc.free(w);
    const wf = try alloc.alloc(f32, n_in);
    defer alloc.free(wf);
    if (f == .q4_0) {
        rng.bytes(std.mem.sliceAsBytes(w));
        for (w) |*blk| blk.d = test_util.randomScale(&rng, true);
    } else {
        for (0..n_out) |o| {
            rng.floats(wf, 1);
            q4_k.quantizeRef(wf, w[o * n_blocks ..][0..n_blocks]);
        }
        // Every 6-bit scale and min value, the largest products included.
        for (w) |*blk| rng.bytes(&blk.scales);
        w[0].scales = @splat(0xff);
    }
    const row_bytes = n_blocks * @sizeOf(W.Block);
    const packed_w = try alloc.alloc(u8, n_out * row_bytes);
    defer alloc.free(packed_w);
    switch (f) {
        .q4_0 => q4_0_x8.repack(@ptrCast(w.ptr), n_out, n_blocks, packed_w.ptr),
        .q4_k => q4_k_x8.repack(@ptrCast(w.ptr), n_out, n_blocks, packed_w.ptr),
    }
    const x = try alloc.alloc(X.Block, n_tok * n_blocks);
    defer alloc.free(x);
    for (0..n_tok) |t| {
        rng.floats(wf, 3);
        // Full-scale quants (|q| = 127 and -128 where the format allows) in the first token.
        if (t == 0) for (wf, 0..) |*v, i| {
            v.* = if (i % 2 == 0) 4 else -4;
        };
        X.quantize(wf, x[t * n_blocks ..][0..n_blocks]);
    }
    const y = try alloc.alloc(f32, n_tok * n_out);
    defer alloc.free(y);
    @memset(y, std.math.nan(f32));
    const scratch = try alloc.alignedAlloc(u8, 64, scratchBytes(f, n_out, n_in));
    defer alloc.free(scratch);
    // Two tasks (the second starting at a 16-row boundary), as the thread pool splits rows.
    const split = if (n_out > 16) 16 else n_out;
    for ([_][2]usize{ .{ 0, split }, .{ split, n_out } }) |range| {
        if (range[0] == range[1]) continue;
        run(T, tiles, .{ .format = f, .w = packed_w.ptr + range[0] * row_bytes, .w_row_bytes = row_bytes,
            .rows = range[1] - range[0], .n_in = n_in, .x = @ptrCast(x.ptr), .x_row_bytes = n_blocks * @sizeOf(X.Block),
            .n_tok = n_tok, .y = y.ptr + range[0], .y_stride = n_out }, scratch.ptr);
    }
    for (0..n_tok) |t| {
        const xr = x[t * n_blocks ..][0..n_blocks];
        for (0..n_out) |o| {
            const want: u32 = @bitCast(W.dotGgmlScalar(w[o * n_blocks ..][0..n_blocks], xr));
            try std.testing.expectEqual(want, @as(u32, @bitCast(y[t * n_out + o])));
        }
    }
}

test "AMX tile kernels (emulated tiles) equal the single-token arithmetic bit for bit" {
    var e: amx.Emulated = .{};
    // Odd block counts (the two-block pipeline's tail), 8 and 24 rows (a half tile), 2 token tiles.
    for ([_]usize{ 1, 3, 8 }) |n_blocks| {
        for ([_]usize{ 8, 24, 48 }) |n_out| {
            try checkFormat(amx.Emulated, &e, .q4_0, n_out, n_blocks, 32, 40 + n_blocks);
        }
    }
    for ([_]usize{ 1, 3 }) |n_blocks| {
        for ([_]usize{ 8, 40 }) |n_out| {
            try checkFormat(amx.Emulated, &e, .q4_k, n_out, n_blocks, 16, 50 + n_blocks);
        }
    }
}

test "AMX tile kernels on the hardware equal the single-token arithmetic (where the CPU has AMX)" {
    // comptime first: amx.Hardware's x86 inline asm must not reach other targets' test builds.
    if (comptime !amx.compiled) return error.SkipZigTest;
    if (!amx.available()) return error.SkipZigTest;
    var hw: amx.Hardware = .{};
    for ([_]usize{ 1, 5, 96 }) |n_blocks| {
        try checkFormat(amx.Hardware, &hw, .q4_0, 56, n_blocks, 48, 60 + n_blocks);
    }
    for ([_]usize{ 1, 3, 14 }) |n_blocks| {
        try checkFormat(amx.Hardware, &hw, .q4_k, 40, n_blocks, 32, 70 + n_blocks);
    }
}
