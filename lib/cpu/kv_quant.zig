//! A K or V cache in ggml's Q8_0 or Q4_0 blocks (llama.cpp's `-ctk/-ctv q8_0/q4_0`): every 32
//! consecutive values of a row (one KV head's head_dim is a whole number of blocks) share an f16
//! scale. Storing a row quantizes it as llama.cpp's set_rows does (Q8_0: the SIMD quantizer,
//! round half to even; Q4_0: quantize_row_q4_0_ref); attention reads the blocks as llama.cpp's
//! CPU flash attention does: the query is quantized to Q8_0 once per head and dotted with each
//! key's blocks by the integer kernels of lib/quant, and a value row is expanded block by block
//! into the f32 row its weight multiplies, never the whole cache at once.
const std = @import("std");
const q8_0 = @import("../quant/q8_0.zig");
const q4_0 = @import("../quant/q4_0.zig");

pub const block_values = 32;

pub const Q8Block = q8_0.Block;
pub const Q4Block = q4_0.Block;

/// Quantizes src (a whole number of blocks) into dst as Q8_0.
pub fn storeQ8(src: []const f32, dst: [*]u8) void {
    const blocks: [*]align(1) Q8Block = @ptrCast(dst);
    q8_0.quantize(src, blocks[0 .. src.len / block_values]);
}

/// Quantizes src (a whole number of blocks) into dst as Q4_0.
pub fn storeQ4(src: []const f32, dst: [*]u8) void {
    const blocks: [*]align(1) Q4Block = @ptrCast(dst);
    q4_0.quantizeRef(src, blocks[0 .. src.len / block_values]);
}

/// The query row as Q8_0 blocks (the vec_dot_type of both cache types).
pub fn quantizeQuery(q: []const f32, dst: []align(1) Q8Block) void {
    q8_0.quantize(q, dst);
}

/// Value i of a Q8_0 cache (element offsets as in an f32 cache).
pub fn atQ8(c: [*]align(1) const Q8Block, i: usize) f32 {
    const b = c[i / block_values];
    return @as(f32, @floatFromInt(b.qs[i % block_values])) * @as(f32, b.d);
}

/// Value i of a Q4_0 cache.
pub fn atQ4(c: [*]align(1) const Q4Block, i: usize) f32 {
    const b = c[i / block_values];
    const j = i % block_values;
    const nibble: i32 = if (j < 16) b.qs[j] & 15 else b.qs[j - 16] >> 4;
    return @as(f32, @floatFromInt(nibble - 8)) * @as(f32, b.d);
}

/// The row of buf.len values at element offset `start` as f32.
pub fn rowQ8(c: [*]align(1) const Q8Block, start: usize, buf: []f32) []const f32 {
    q8_0.dequantize(c[start / block_values ..][0 .. buf.len / block_values], buf);
    return buf;
}

pub fn rowQ4(c: [*]align(1) const Q4Block, start: usize, buf: []f32) []const f32 {
    q4_0.dequantize(c[start / block_values ..][0 .. buf.len / block_values], buf);
    return buf;
}

/// key · query for the key row at element offset `start`, the query already Q8_0.
pub fn dotQ8(c: [*]align(1) const Q8Block, start: usize, q: []align(1) const Q8Block) f32 {
    return q8_0.dot(c[start / block_values ..][0..q.len], q);
}

pub fn dotQ4(c: [*]align(1) const Q4Block, start: usize, q: []align(1) const Q8Block) f32 {
    return q4_0.dot(c[start / block_values ..][0..q.len], q);
}

/// The scalar forms of dotQ8 and dotQ4 (ggml's generic vec_dot), for the tests and the reference.
pub fn dotQ8Scalar(c: [*]align(1) const Q8Block, start: usize, q: []align(1) const Q8Block) f32 {
    return q8_0.dotScalar(c[start / block_values ..][0..q.len], q);
}

pub fn dotQ4Scalar(c: [*]align(1) const Q4Block, start: usize, q: []align(1) const Q8Block) f32 {
    return q4_0.dotScalar(c[start / block_values ..][0..q.len], q);
}

// ---- tests ---------------------------------------------------------------------------------

test "the SIMD key dots equal the scalar ones and the dequantized values" {
    const gpa = std.testing.allocator;
    var prng = std.Random.DefaultPrng.init(7);
    const rand = prng.random();
    for ([_]usize{ 1, 3, 8, 9 }) |n_blocks| {
        const n = n_blocks * block_values;
        const x = try gpa.alloc(f32, 3 * n);
        defer gpa.free(x);
        for (x) |*v| v.* = (rand.float(f32) * 2 - 1) * 3;
        // Two rows of cache, the second at element offset n, and a query.
        const k8 = try gpa.alloc(Q8Block, 2 * n_blocks);
        defer gpa.free(k8);
        const k4 = try gpa.alloc(Q4Block, 2 * n_blocks);
        defer gpa.free(k4);
        storeQ8(x[0 .. 2 * n], @ptrCast(k8.ptr));
        storeQ4(x[0 .. 2 * n], @ptrCast(k4.ptr));
        const q = try gpa.alloc(Q8Block, n_blocks);
        defer gpa.free(q);
        quantizeQuery(x[2 * n ..], q);
        const row = try gpa.alloc(f32, n);
        defer gpa.free(row);
        const qf = try gpa.alloc(f32, n);
        defer gpa.free(qf);
        q8_0.dequantize(q, qf);
        for ([_]usize{ 0, n }) |start| {
            const s8 = dotQ8Scalar(k8.ptr, start, q);
            const s4 = dotQ4Scalar(k4.ptr, start, q);
            try std.testing.expectApproxEqRel(s8, dotQ8(k8.ptr, start, q), 1e-5);
            try std.testing.expectApproxEqRel(s4, dotQ4(k4.ptr, start, q), 1e-5);
            // The dot is that of the dequantized rows; value access agrees with the row.
            var want8: f64 = 0;
            var want4: f64 = 0;
            _ = rowQ8(k8.ptr, start, row);
            for (row, qf, 0..) |r, y, i| {
                try std.testing.expectEqual(r, atQ8(k8.ptr, start + i));
                want8 += r * y;
            }
            _ = rowQ4(k4.ptr, start, row);
            for (row, qf, 0..) |r, y, i| {
                try std.testing.expectEqual(r, atQ4(k4.ptr, start + i));
                want4 += r * y;
            }
            try std.testing.expectApproxEqAbs(@as(f32, @floatCast(want8)), s8, 1e-3 * @as(f32, @floatFromInt(n)));
            try std.testing.expectApproxEqAbs(@as(f32, @floatCast(want4)), s4, 1e-3 * @as(f32, @floatFromInt(n)));
        }
        // Quantization error within half a step (Q4_0: a step, where the value opposite the
        // block's extreme clamps to +7), plus the scale's rounding to f16 over 127 (8) steps.
        _ = rowQ8(k8.ptr, 0, row);
        for (row, x[0..n], 0..) |r, v, i| {
            const d: f32 = k8[i / block_values].d;
            try std.testing.expect(@abs(r - v) <= @abs(d) * 0.57 + 1e-6);
        }
        _ = rowQ4(k4.ptr, 0, row);
        for (row, x[0..n], 0..) |r, v, i| {
            const d: f32 = k4[i / block_values].d;
            try std.testing.expect(@abs(r - v) <= @abs(d) * 1.01 + 1e-6);
        }
    }
}
