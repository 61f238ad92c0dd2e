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
        /// row-major blocks.
        pub fn unpack(src: [*]const u8, n_out: usize, n_blocks: usize, dst: [*]u8) void {
            const row_bytes = n_blocks * @sizeOf(Block);
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
