//! The context shift on the GPU (lib/abi.zig CudaKvShiftArgs; ts/backend/cuda.ts shiftKv and
//! compactKv): kv_shift_gather reads the rows that move (keys dequantized and re-rotated to f32,
//! values' bytes as they are) into scratch, kv_shift_scatter stores them at their new cells (keys
//! quantized as kv_store quantizes them). Two launches, so that no row is overwritten before it is
//! read, however the moves overlap (shaders/cuda/kv_shift.cuh).
const std = @import("std");
const cuda = @import("cuda.zig");
const ops = @import("ops.zig");
const attn = @import("attention.zig");
const status = @import("../status.zig");
const abi = @import("../abi.zig");
const invalid = cuda.invalid;
const int = cuda.int;
const tooLarge = cuda.tooLarge;

extern "c" fn powf(x: f32, y: f32) f32;

/// Bytes of a cache row of n values of a cache type (shaders/cuda/kv_quant.cuh kv_bytes).
fn kvBytes(t: u32, n: u64) u64 {
    return if (t == attn.kv_q8_0) n / 32 * 34 else if (t == attn.kv_q4_0) n / 32 * 18 else 2 * n;
}

/// Offset of the values' part of the scratch: after n_rows · kv_dim f32 keys, 256-byte aligned.
fn valuesOffset(kv_dim: u64, n_rows: u64) u64 {
    return std.mem.alignForward(u64, n_rows * kv_dim * 4, 256);
}

/// Bytes of scratch infer_cuda_kv_shift needs for n_rows rows (0 for an unknown v_type).
pub fn kvShiftScratch(kv_heads: u64, head_dim: u64, n_rows: u64, v_type: u32) u64 {
    const kv_dim = kv_heads * head_dim;
    return valuesOffset(kv_dim, n_rows) + n_rows * kvBytes(v_type, kv_dim);
}

pub fn kvShift(a: abi.CudaKvShiftArgs) i32 {
    if (a.k_cache == 0 or a.v_cache == 0 or a.scratch == 0) return invalid("kv_shift: no cache or no scratch", .{});
    if (a.mode != 0 and a.mode != 2) return invalid("kv_shift: mode {d} is not 0 (normal) or 2 (neox)", .{a.mode});
    if (a.head_dim == 0 or a.head_dim > attn.head_dim_max or a.n_rot == 0 or a.n_rot % 2 != 0 or a.n_rot > a.head_dim)
        return invalid("kv_shift: n_rot {d} must be even, > 0, <= head_dim {d} <= {d}", .{ a.n_rot, a.head_dim, attn.head_dim_max });
    if (!(a.freq_base > 0) or !std.math.isFinite(a.freq_base) or !std.math.isFinite(a.freq_scale))
        return invalid("kv_shift: bad freq_base {d} or freq_scale {d}", .{ a.freq_base, a.freq_scale });
    if (attn.checkKvTypes("kv_shift", a.k_type, a.v_type, a.head_dim)) |rc| return rc;
    if (attn.refuseTurbo("kv_shift", a.k_type, a.v_type)) |rc| return rc;
    const cells = int(a.cells) orelse return tooLarge("kv_shift: cells", a.cells);
    const heads = int(a.kv_heads) orelse return tooLarge("kv_shift: kv_heads", a.kv_heads);
    if (heads == 0 or a.kv_heads > 65535) return invalid("kv_shift: {d} KV heads", .{a.kv_heads});
    if (a.n_rows > a.cells or a.to > a.cells - a.n_rows)
        return invalid("kv_shift: {d} rows to cell {d} overrun {d} cells", .{ a.n_rows, a.to, a.cells });
    if (a.from == 0 and a.first >= a.cells) return invalid("kv_shift: first cell {d} of {d}", .{ a.first, a.cells });
    if (a.move < -std.math.maxInt(i32) or a.move > std.math.maxInt(i32)) return tooLarge("kv_shift: move", @abs(a.move));
    if (a.n_rows == 0) return 0;
    const y = ops.ropeYarn("kv_shift", a) orelse return @intFromEnum(status.Status.invalid_argument);
    // powf(base, -2/n_rot) from the C library, as lib/cpu/rope.zig (and ggml) computes it.
    const theta_scale = powf(a.freq_base, -2.0 / @as(f32, @floatFromInt(a.n_rot)));
    const dim: i32 = @intCast(a.head_dim);
    const threads: u32 = @intCast(std.mem.alignForward(u64, a.head_dim, 32));
    const kv_dim = a.kv_heads * a.head_dim;
    const values = a.scratch + valuesOffset(kv_dim, a.n_rows);
    const kt: i32 = @intCast(a.k_type);
    const vt: i32 = @intCast(a.v_type);
    const rc = cuda.launch(.kv_shift_gather, a.n_rows, a.kv_heads, threads, .{
        a.k_cache,                      a.v_cache, heads, dim, a.from, @as(i32, @intCast(@min(a.first, a.cells))), cells,
        @as(i32, @intCast(a.to)),       @as(i32, @intCast(a.move)), a.scratch, values, kt, vt,
        @as(i32, @intCast(a.n_rot)),    theta_scale, a.freq_scale, @as(i32, if (a.mode == 2) 1 else 0), a.freq_factors,
        y.mscale,                       y.ext, y.low, y.high,
    });
    if (rc != 0) return rc;
    return cuda.launch(.kv_shift_scatter, a.n_rows, a.kv_heads, threads, .{
        a.k_cache, a.v_cache, heads, dim, @as(i32, @intCast(a.to)), a.scratch, values, kt, vt,
    });
}

test "kv_shift scratch: the keys as f32, then the values' bytes at a 256-byte boundary" {
    try std.testing.expectEqual(@as(u64, 3 * 64 * 4 + 3 * 64 * 2), kvShiftScratch(1, 64, 3, attn.kv_f16));
    try std.testing.expectEqual(@as(u64, 256 + 32 * 2), kvShiftScratch(1, 32, 1, attn.kv_f16));
    try std.testing.expectEqual(@as(u64, 2 * 128 * 4 * 5 + 5 * 2 * 4 * 34), kvShiftScratch(2, 128, 5, attn.kv_q8_0));
}
