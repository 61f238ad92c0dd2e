//! Q5_K: 256 values in 176 bytes: f16 `d` and `dmin`, 12 bytes of 6-bit scales and mins (as
//! Q4_K), 32 bytes `qh` of fifth bits, 128 bytes of low nibbles. Chunk c (64 values) takes
//! its low nibbles from qs[32c..] as Q4_K does; value 64c+l gets bit 2c of qh[l], value
//! 64c+32+l bit 2c+1. value = d * scale * q - dmin * min. Dotted with Q8_K activations.
const std = @import("std");
const simd = @import("simd.zig");
const q8_k = @import("q8_k.zig");
const q4_k = @import("q4_k.zig");

pub const block_values = 256;
pub const Block = extern struct {
    d: f16,
    dmin: f16,
    scales: [12]u8,
    qh: [32]u8,
    qs: [128]u8,
};
comptime {
    std.debug.assert(@sizeOf(Block) == 176);
}

/// Quant l (0..31) of sub-block 2c (`high` = false) or 2c+1 (`high` = true), in 0..31.
inline fn quant(b: *align(1) const Block, c: usize, l: usize, high: bool) u8 {
    const q = b.qs[32 * c + l];
    const low = if (high) q >> 4 else q & 15;
    const bit_index: u3 = @intCast(2 * c + @intFromBool(high));
    return low | (((b.qh[l] >> bit_index) & 1) << 4);
}

pub fn dequantize(src: []align(1) const Block, dst: []f32) void {
    std.debug.assert(dst.len == src.len * block_values);
    for (src, 0..) |*b, i| {
        const d: f32 = b.d;
        const dmin: f32 = b.dmin;
        const sm = q4_k.unpackScales(&b.scales);
        const out = dst[i * 256 ..][0..256];
        for (0..4) |c| {
            const d1 = d * @as(f32, @floatFromInt(sm.scales[2 * c]));
            const m1 = dmin * @as(f32, @floatFromInt(sm.mins[2 * c]));
            const d2 = d * @as(f32, @floatFromInt(sm.scales[2 * c + 1]));
            const m2 = dmin * @as(f32, @floatFromInt(sm.mins[2 * c + 1]));
            for (0..32) |l| {
                out[64 * c + l] = d1 * @as(f32, @floatFromInt(quant(b, c, l, false))) - m1;
                out[64 * c + 32 + l] = d2 * @as(f32, @floatFromInt(quant(b, c, l, true))) - m2;
            }
        }
    }
}

/// ggml's quantize_row_q5_K_ref: Q4_K's superblock search with 5-bit quants (rmin -0.5, 16 grid
/// steps); quants above 15 set their bit in qh.
pub fn quantizeRef(src: []const f32, dst: []align(1) Block) void {
    std.debug.assert(src.len == dst.len * block_values);
    for (dst, 0..) |*b, i| {
        var quants: [256]u8 = undefined;
        var d: f16 = undefined;
        var dmin: f16 = undefined;
        const x = src[i * 256 ..][0..256];
        q4_k.quantizeSuperblock(31, x, -0.5, 15, &b.scales, &d, &dmin, &quants);
        b.d = d;
        b.dmin = dmin;
        b.qh = @splat(0);
        for (0..4) |c| {
            const bit_low: u8 = @as(u8, 1) << @intCast(2 * c);
            for (0..32) |l| {
                const lo = quants[64 * c + l];
                const hi = quants[64 * c + 32 + l];
                if (lo > 15) b.qh[l] |= bit_low;
                if (hi > 15) b.qh[l] |= bit_low << 1;
                b.qs[32 * c + l] = (lo & 15) | ((hi & 15) << 4);
            }
        }
    }
}

/// ggml_vec_dot_q5_K_q8_K_generic, in integers per sub-block as Q4_K.
pub fn dotScalar(w: []align(1) const Block, x: []align(1) const q8_k.Block) f32 {
    std.debug.assert(w.len == x.len);
    var sum: f32 = 0;
    for (w, x) |*wb, *xb| {
        const sm = q4_k.unpackScales(&wb.scales);
        var sumi: i32 = 0;
        for (0..4) |c| {
            var lo: i32 = 0;
            var hi: i32 = 0;
            for (0..32) |l| {
                lo += @as(i32, quant(wb, c, l, false)) * xb.qs[64 * c + l];
                hi += @as(i32, quant(wb, c, l, true)) * xb.qs[64 * c + 32 + l];
            }
            sumi += lo * sm.scales[2 * c] + hi * sm.scales[2 * c + 1];
        }
        const d = @as(f32, wb.d) * xb.d;
        const dmin = @as(f32, wb.dmin) * xb.d;
        sum += d * @as(f32, @floatFromInt(sumi));
        sum -= dmin * @as(f32, @floatFromInt(q4_k.minsDot(sm.mins, &xb.bsums)));
    }
    return sum;
}

/// The float arithmetic of ggml_vec_dot_q5_K_q8_K's AVX2 branch (arch/x86/quants.c; Q5_K is not
/// repacked on x86). Per superblock, 8 integer lanes: lane L sums scale_j * q * x over values
/// 32j+4L..32j+4L+3 of every sub-block j; acc[L] = fma(d_x * d_w, f32(lane L), acc[L]). The
/// mins go to a scalar: summs = fma(-d_x * dmin_w, f32(sum_j min_j * bsum pair j), summs)
/// (GCC contracts ggml's `summs += dmin * sum` into that FMA). Result hsum_float_8(acc) + summs.
/// Written as plain scalar loops: the reference the fast path must equal bit for bit.
pub fn dotGgmlScalar(w: []align(1) const Block, x: []align(1) const q8_k.Block) f32 {
    std.debug.assert(w.len == x.len);
    var acc: simd.V8f32 = @splat(0);
    var summs: f32 = 0;
    for (w, x) |*wb, *xb| {
        const sm = q4_k.unpackScales(&wb.scales);
        var lanes: [8]i32 = @splat(0);
        var sum_min: i32 = 0;
        for (0..8) |j| {
            const c = j / 2;
            const high = j % 2 == 1;
            for (0..32) |l| {
                const prod = @as(i32, quant(wb, c, l, high)) * xb.qs[32 * j + l];
                lanes[l / 4] += prod * sm.scales[j];
            }
            sum_min += @as(i32, sm.mins[j]) * (@as(i32, xb.bsums[2 * j]) + xb.bsums[2 * j + 1]);
        }
        const d = xb.d * @as(f32, wb.d);
        const dmin = -xb.d * @as(f32, wb.dmin);
        for (0..8) |lane| acc[lane] = @mulAdd(f32, d, @floatFromInt(lanes[lane]), acc[lane]);
        summs = @mulAdd(f32, dmin, @floatFromInt(sum_min), summs);
    }
    return simd.hsum(acc) + summs;
}

pub fn dot(w: []align(1) const Block, x: []align(1) const q8_k.Block) f32 {
    std.debug.assert(w.len == x.len);
    return dotMulti(1, w, .{x.ptr})[0];
}

/// One token over n_out row-major rows: four rows' chains side by side, sharing each activation
/// load and the activation's sums, the next four rows prefetched meanwhile
/// (simd.prefetchNextRows); the rest one at a time. Bit for bit dotGgmlScalar.
pub fn dotRows(n_blocks: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]align(1) const q8_k.Block, out: [*]f32) void {
    simd.dotRowGroups(@This(), four_rows, n_blocks, w, w_row_bytes, n_out, x, out);
}

const four_rows = 4;

/// Four rows of dotRows (simd.dotRowGroups), the next four prefetched.
pub inline fn rowGroup(comptime next_in_l1: bool, n_blocks: usize, w: [*]const u8, w_row_bytes: usize, x: [*]align(1) const q8_k.Block) [four_rows]f32 {
    const R = four_rows;
    var acc: [R]simd.V8f32 = @splat(@splat(0));
    var summs: @Vector(R, f32) = @splat(0);
    for (0..n_blocks) |b| {
        simd.prefetchNextRows(R, @sizeOf(Block), next_in_l1, w, w_row_bytes, b);
        const xb = &x[b];
        const x_q = q8_k.subBlocks(xb);
        var min_lanes: [8]simd.V8i32 = @splat(@splat(0));
        var dmin: @Vector(R, f32) = undefined;
        inline for (0..R) |r| {
            const wb: *align(1) const Block = @ptrCast(w + r * w_row_bytes + b * @sizeOf(Block));
            const u = unpack(wb);
            const sumi = simd.scaledDots(&u.q, &x_q, &u.scale);
            const d: simd.V8f32 = @splat(xb.d * @as(f32, wb.d));
            acc[r] = @mulAdd(simd.V8f32, d, @floatFromInt(sumi), acc[r]);
            min_lanes[r] = simd.maddI16(xb.bsums, u.mins);
            dmin[r] = -xb.d * @as(f32, wb.dmin);
        }
        const sums = simd.reduceEight(min_lanes);
        const sum_min: @Vector(R, i32) = @shuffle(i32, sums, undefined, [R]i32{ 0, 1, 2, 3 });
        summs = @mulAdd(@Vector(R, f32), dmin, @floatFromInt(sum_min), summs);
    }
    var out: [R]f32 = undefined;
    inline for (0..R) |r| out[r] = simd.hsum(acc[r]) + summs[r];
    return out;
}

/// A superblock's 8 sub-blocks of 32 quants (0..31: u8 x i8 pairs stay inside i16), their
/// scales as i16 lanes, and the mins beside the activation's bsums pairs (q4_k.minsPairs).
const Unpacked = struct { q: [8]simd.V32u8, scale: [8]simd.V16i16, mins: simd.V16i16 };

inline fn unpack(wb: *align(1) const Block) Unpacked {
    const nibble: simd.V32u8 = @splat(15);
    const one: simd.V32u8 = @splat(1);
    const sm = q4_k.unpackScales(&wb.scales);
    const qh = simd.load32(&wb.qh);
    var u: Unpacked = undefined;
    inline for (0..4) |c| {
        const packed_qs = simd.load32(wb.qs[32 * c ..]);
        const h_lo = ((qh >> @splat(2 * c)) & one) << @splat(4);
        const h_hi = ((qh >> @splat(2 * c + 1)) & one) << @splat(4);
        u.q[2 * c] = (packed_qs & nibble) | h_lo;
        u.q[2 * c + 1] = (packed_qs >> @splat(4)) | h_hi;
    }
    inline for (0..8) |j| u.scale[j] = @splat(sm.scales[j]);
    u.mins = q4_k.minsPairs(sm.mins);
    return u;
}

/// Dots one weight row with R activation rows, unpacking each superblock once for all R.
/// Rounds as dotGgmlScalar.
pub fn dotMulti(
    comptime R: usize,
    w: []align(1) const Block,
    xs: [R][*]align(1) const q8_k.Block,
) [R]f32 {
    var acc: [R]simd.V8f32 = @splat(@splat(0));
    var summs: [R]f32 = @splat(0);
    for (w, 0..) |*wb, i| {
        const u = unpack(wb);
        const q = u.q;
        const scale = u.scale;
        const mins = u.mins;
        const dw: f32 = wb.d;
        const dmin_w: f32 = wb.dmin;
        inline for (0..R) |r| {
            const xb = &xs[r][i];
            const sumi = simd.scaledDots(&q, &q8_k.subBlocks(xb), &scale);
            const d: simd.V8f32 = @splat(xb.d * dw);
            acc[r] = @mulAdd(simd.V8f32, d, @floatFromInt(sumi), acc[r]);
            const sum_min = @reduce(.Add, simd.maddI16(xb.bsums, mins));
            summs[r] = @mulAdd(f32, -xb.d * dmin_w, @floatFromInt(sum_min), summs[r]);
        }
    }
    var out: [R]f32 = undefined;
    inline for (0..R) |r| out[r] = simd.hsum(acc[r]) + summs[r];
    return out;
}

const test_util = @import("test_util.zig");

fn fixBlock(b: *Block, rng: *test_util.TestRng) void {
    b.d = test_util.randomScale(rng, false);
    b.dmin = test_util.randomScale(rng, false);
}

test "q5_k dot: fast matches scalar; quantized dot matches f32" {
    try test_util.checkDot(@This(), q8_k, 13, fixBlock);
}

test "q5_k dot: bit-identical to ggml's x86 vec_dot order" {
    try simd.expectGgmlOrder(@This(), q8_k, 113, fixBlock);
}

test "q5_k dotRows equals dotGgmlScalar bit for bit, odd block counts and a row stride" {
    try test_util.checkDotRows(@This(), q8_k, 5151, fixBlock);
}

test "q5_k quantizeRef: a 5-bit grid is kept exactly; noise within 5-bit error" {
    var x: [256]f32 = undefined;
    for (&x, 0..) |*v, i| v.* = @as(f32, @floatFromInt(i % 32)) * 0.25;
    var b: [1]Block = undefined;
    quantizeRef(&x, &b);
    try std.testing.expectEqual(@as(f16, 0), b[0].dmin);
    for (0..4) |c| {
        for (0..64) |k| {
            const high = k >= 32;
            const want: u8 = @intCast((64 * c + k) % 32);
            try std.testing.expectEqual(want, quant(&b[0], c, k % 32, high));
        }
    }
    var rng = test_util.TestRng.init(42);
    var noise: [1024]f32 = undefined;
    rng.floats(&noise, 2);
    var blocks_out: [4]Block = undefined;
    try std.testing.expect(try q4_k.roundTripError(@This(), &noise, &blocks_out) < 0.05);
}
