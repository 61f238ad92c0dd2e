//! The eight-row layout of q4_0_x8.zig and q8_0_x8.zig, for a block type with an f16 scale `d`
//! and quants `qs`: a group (eight rows, one block column) holds the eight rows' scales, then
//! chunk c (32 bytes) holds quant word c (4 bytes) of every row, row r at bytes 4r .. 4r + 4, so
//! one vector lane is one row. A group has the bytes of the eight blocks it replaces, so group g
//! of rows 8k..8k+7 starts where row 8k did.
const std = @import("std");

pub fn Rows(comptime Block: type) type {
    return struct {
        pub const rows = 8;
        /// 4-byte words of quants in a block (4 for Q4_0, 8 for Q8_0).
        pub const words = @sizeOf(@FieldType(Block, "qs")) / 4;

        pub const Group = extern struct {
            d: [rows]f16,
            qs: [rows * 4 * words]u8,
        };
        comptime {
            std.debug.assert(@sizeOf(Group) == rows * @sizeOf(Block));
        }

        /// Interleaves n_out (a multiple of 8) row-major rows of n_blocks blocks into groups.
        pub fn repack(src: [*]const u8, n_out: usize, n_blocks: usize, dst: [*]u8) void {
            std.debug.assert(n_out % rows == 0);
            const row_bytes = n_blocks * @sizeOf(Block);
            var o: usize = 0;
            while (o < n_out) : (o += rows) {
                const groups: [*]align(1) Group = @ptrCast(dst + o * row_bytes);
                for (0..n_blocks) |b| {
                    const g = &groups[b];
                    for (0..rows) |r| {
                        const row: [*]align(1) const Block = @ptrCast(src + (o + r) * row_bytes);
                        const blk = &row[b];
                        g.d[r] = blk.d;
                        const q = std.mem.asBytes(&blk.qs);
                        for (0..words) |c| @memcpy(g.qs[32 * c + 4 * r ..][0..4], q[4 * c ..][0..4]);
                    }
                }
            }
        }

        /// The inverse of repack: n_out rows (a multiple of 8, from a group boundary) back to
        /// row-major blocks. Batches of Q8_0 copy every tile of rows back this way each call
        /// (q8_0_x8.zig), so its 8 x 8 words go through vector registers: a 16-token Q8_0 matmul
        /// spent more time in 4-byte copies than in its dots (bench/matvec.ts --tokens 16).
        pub fn unpack(src: [*]const u8, n_out: usize, n_blocks: usize, dst: [*]u8) void {
            const row_bytes = n_blocks * @sizeOf(Block);
            if (words == rows) {
                var o: usize = 0;
                while (o < n_out) : (o += rows) {
                    const groups: [*]align(1) const Group = @ptrCast(src + o * row_bytes);
                    for (0..n_blocks) |b| {
                        const g = &groups[b];
                        var m: [rows]@Vector(rows, u32) = undefined;
                        inline for (0..rows) |c| m[c] = @bitCast(g.qs[32 * c ..][0..32].*);
                        const t = transpose8(m);
                        inline for (0..rows) |r| {
                            const row: [*]align(1) Block = @ptrCast(dst + (o + r) * row_bytes);
                            row[b].d = g.d[r];
                            std.mem.asBytes(&row[b].qs).* = @bitCast(t[r]);
                        }
                    }
                }
                return;
            }
            var o: usize = 0;
            while (o < n_out) : (o += rows) {
                const groups: [*]align(1) const Group = @ptrCast(src + o * row_bytes);
                for (0..n_blocks) |b| {
                    const g = &groups[b];
                    for (0..rows) |r| {
                        const row: [*]align(1) Block = @ptrCast(dst + (o + r) * row_bytes);
                        row[b].d = g.d[r];
                        const q = std.mem.asBytes(&row[b].qs);
                        for (0..words) |c| @memcpy(q[4 * c ..][0..4], g.qs[32 * c + 4 * r ..][0..4]);
                    }
                }
            }
        }
    };
}

const V8u32 = @Vector(8, u32);

/// The 8 x 8 transpose of u32 words: out[v][l] = m[l][v]. Three stages, each swapping one bit of
/// the vector index with the same bit of the lane index (4-word halves, then pairs, then words).
fn transpose8(m: [8]V8u32) [8]V8u32 {
    var a: [8]V8u32 = undefined;
    inline for (0..4) |i| {
        a[i] = @shuffle(u32, m[i], m[i + 4], [8]i32{ 0, 1, 2, 3, ~@as(i32, 0), ~@as(i32, 1), ~@as(i32, 2), ~@as(i32, 3) });
        a[i + 4] = @shuffle(u32, m[i], m[i + 4], [8]i32{ 4, 5, 6, 7, ~@as(i32, 4), ~@as(i32, 5), ~@as(i32, 6), ~@as(i32, 7) });
    }
    var b: [8]V8u32 = undefined;
    inline for ([_]usize{ 0, 1, 4, 5 }) |v| {
        b[v] = @shuffle(u32, a[v], a[v + 2], [8]i32{ 0, 1, ~@as(i32, 0), ~@as(i32, 1), 4, 5, ~@as(i32, 4), ~@as(i32, 5) });
        b[v + 2] = @shuffle(u32, a[v], a[v + 2], [8]i32{ 2, 3, ~@as(i32, 2), ~@as(i32, 3), 6, 7, ~@as(i32, 6), ~@as(i32, 7) });
    }
    var c: [8]V8u32 = undefined;
    inline for ([_]usize{ 0, 2, 4, 6 }) |v| {
        c[v] = @shuffle(u32, b[v], b[v + 1], [8]i32{ 0, ~@as(i32, 0), 2, ~@as(i32, 2), 4, ~@as(i32, 4), 6, ~@as(i32, 6) });
        c[v + 1] = @shuffle(u32, b[v], b[v + 1], [8]i32{ 1, ~@as(i32, 1), 3, ~@as(i32, 3), 5, ~@as(i32, 5), 7, ~@as(i32, 7) });
    }
    return c;
}

test "transpose8 transposes" {
    var m: [8]V8u32 = undefined;
    for (0..8) |i| {
        for (0..8) |j| m[i][j] = @intCast(10 * i + j);
    }
    const t = transpose8(m);
    for (0..8) |v| {
        for (0..8) |l| try std.testing.expectEqual(m[l][v], t[v][l]);
    }
}
