//! Q6_K: 256 values in 210 bytes: 128 bytes `ql` of low nibbles, 64 bytes `qh` of 2-bit highs,
//! 16 signed 8-bit scales (one per 16 values, in value order), f16 `d`. Per 128-value half h,
//! with ql += 64h, qh += 32h, for l < 32:
//!   value l      = ql[l] & 15     | (bits 0..1 of qh[l]) << 4,
//!   value l + 32 = ql[l+32] & 15  | (bits 2..3 of qh[l]) << 4,
//!   value l + 64 = ql[l] >> 4     | (bits 4..5 of qh[l]) << 4,
//!   value l + 96 = ql[l+32] >> 4  | (bits 6..7 of qh[l]) << 4;
//! value = d * scale * (q - 32). Dotted with Q8_K activations.
const std = @import("std");
const simd = @import("simd.zig");
const q8_k = @import("q8_k.zig");

pub const block_values = 256;
pub const Block = extern struct {
    ql: [128]u8,
    qh: [64]u8,
    scales: [16]i8,
    d: f16,
};
comptime {
    std.debug.assert(@sizeOf(Block) == 210);
}

/// Unsigned quant (0..63, offset 32) of value v (0..255).
inline fn quant(b: *align(1) const Block, v: usize) u8 {
    const half = v / 128;
    const k = (v % 128) / 32; // which 32-value group of the half
    const l = v % 32;
    const ql = b.ql[64 * half + 32 * (k & 1) + l];
    const low = if (k < 2) ql & 15 else ql >> 4;
    const shift: u3 = @intCast(2 * k);
    return low | (((b.qh[32 * half + l] >> shift) & 3) << 4);
}

pub fn dequantize(src: []align(1) const Block, dst: []f32) void {
    std.debug.assert(dst.len == src.len * block_values);
    for (src, 0..) |*b, i| {
        const d: f32 = b.d;
        for (dst[i * 256 ..][0..256], 0..) |*y, v| {
            // (d * scale) * q, in this order: ggml's and gguf-py's rounding.
            const q: i32 = @as(i32, quant(b, v)) - 32;
            const scale = d * @as(f32, @floatFromInt(b.scales[v / 16]));
            y.* = scale * @as(f32, @floatFromInt(q));
        }
    }
}

// ---- ggml's reference quantizer (quantize_row_q6_K_ref) ----------------------------------
// What llama-quantize writes without an importance matrix, float operation for float operation.

const nearestInt = @import("q4_k.zig").nearestInt;

/// ggml's make_qx_quants for 16 values, nmax 32, rmse_type 1 (weights x^2): signed quants
/// -32..31 (stored + 32) for the scale whose weighted fit is best among -max/32 and 18 grid
/// neighbours -max/(32 +- 0.1k).
fn makeQxQuants(x: *const [16]f32, quants: *[16]u8) f32 {
    const nmax = 32;
    var max: f32 = 0;
    var amax: f32 = 0;
    for (x) |v| {
        if (@abs(v) > amax) {
            amax = @abs(v);
            max = v;
        }
    }
    if (amax < 1e-15) { // GROUP_MAX_EPS: all zero
        @memset(quants, 0);
        return 0;
    }
    var iscale = -@as(f32, nmax) / max;
    var sumlx: f32 = 0;
    var suml2: f32 = 0;
    for (x, quants) |v, *q| {
        const l = std.math.clamp(nearestInt(iscale * v), -nmax, nmax - 1);
        q.* = @intCast(l + nmax);
        const w = v * v;
        const lf: f32 = @floatFromInt(l);
        sumlx += w * v * lf;
        suml2 += w * lf * lf;
    }
    var scale: f32 = if (suml2 != 0) sumlx / suml2 else 0;
    var best = scale * sumlx;
    var is: i32 = -9;
    while (is <= 9) : (is += 1) {
        if (is == 0) continue;
        iscale = -(@as(f32, nmax) + @as(f32, 0.1) * @as(f32, @floatFromInt(is))) / max;
        sumlx = 0;
        suml2 = 0;
        for (x) |v| {
            const lf: f32 = @floatFromInt(std.math.clamp(nearestInt(iscale * v), -nmax, nmax - 1));
            const w = v * v;
            sumlx += w * v * lf;
            suml2 += w * lf * lf;
        }
        if (suml2 > 0 and sumlx * sumlx > best * suml2) {
            for (x, quants) |v, *q| {
                q.* = @intCast(std.math.clamp(nearestInt(iscale * v), -nmax, nmax - 1) + nmax);
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/// ggml's quantize_row_q6_K_ref: make_qx_quants per 16 values, the 16 scales to signed 8 bits
/// against the largest in magnitude (-128 for it), then every quant re-rounded against the scale
/// the block will hold.
pub fn quantizeRef(src: []const f32, dst: []align(1) Block) void {
    std.debug.assert(src.len == dst.len * block_values);
    for (dst, 0..) |*b, i| {
        const x = src[i * 256 ..][0..256];
        var quants: [256]u8 = undefined;
        var scales: [16]f32 = undefined;
        var max_scale: f32 = 0;
        var max_abs_scale: f32 = 0;
        for (0..16) |g| {
            scales[g] = makeQxQuants(x[16 * g ..][0..16], quants[16 * g ..][0..16]);
            if (@abs(scales[g]) > max_abs_scale) {
                max_abs_scale = @abs(scales[g]);
                max_scale = scales[g];
            }
        }
        if (max_abs_scale < 1e-15) {
            b.* = std.mem.zeroes(Block);
            continue;
        }
        const iscale = -128 / max_scale;
        b.d = @floatCast(1 / iscale);
        for (0..16) |g| {
            // MIN(127, nearest_int(...)) stored into an int8_t: the low byte.
            const s = @min(127, nearestInt(iscale * scales[g]));
            b.scales[g] = @bitCast(@as(u8, @truncate(@as(u32, @bitCast(s)))));
        }
        for (0..16) |g| {
            const d = @as(f32, b.d) * @as(f32, @floatFromInt(b.scales[g]));
            if (d == 0) continue; // ggml keeps make_qx_quants' quants here
            for (x[16 * g ..][0..16], quants[16 * g ..][0..16]) |v, *q| {
                q.* = @intCast(std.math.clamp(nearestInt(v / d), -32, 31) + 32);
            }
        }
        for (0..2) |h| {
            const l = quants[128 * h ..][0..128];
            for (0..32) |k| {
                b.ql[64 * h + k] = (l[k] & 15) | ((l[k + 64] & 15) << 4);
                b.ql[64 * h + 32 + k] = (l[k + 32] & 15) | ((l[k + 96] & 15) << 4);
                b.qh[32 * h + k] = (l[k] >> 4) | ((l[k + 32] >> 4) << 2) |
                    ((l[k + 64] >> 4) << 4) | ((l[k + 96] >> 4) << 6);
            }
        }
    }
}

/// ggml_vec_dot_q6_K_q8_K_generic: integer sums per 16-value group times its scale,
/// scaled by d_w * d_x.
pub fn dotScalar(w: []align(1) const Block, x: []align(1) const q8_k.Block) f32 {
    std.debug.assert(w.len == x.len);
    var sum: f32 = 0;
    for (w, x) |*wb, *xb| {
        var sumi: i32 = 0;
        for (0..16) |g| {
            var group: i32 = 0;
            for (0..16) |l| {
                const v = 16 * g + l;
                group += (@as(i32, quant(wb, v)) - 32) * xb.qs[v];
            }
            sumi += group * wb.scales[g];
        }
        sum += @as(f32, wb.d) * xb.d * @as(f32, @floatFromInt(sumi));
    }
    return sum;
}

/// The float arithmetic of ggml_vec_dot_q6_K_q8_K's AVX2 branch (arch/x86/quants.c; Q6_K is not
/// repacked on x86, and the AVX-512 compile takes this branch too). Per superblock, 8 integer
/// lanes: lane L sums, over the eight 32-value chunks k, scale * q * x for values 32k+4L..+3
/// (unsigned quants 0..63), minus the -32 offset 32 * (bsum_2L * scale_2L + bsum_2L+1 *
/// scale_2L+1). Then acc[L] = fma(d_x * d_w, f32(lane L), acc[L]), and one hsum_float_8 at the
/// end. Written as plain scalar loops: the reference the fast path must equal bit for bit.
pub fn dotGgmlScalar(w: []align(1) const Block, x: []align(1) const q8_k.Block) f32 {
    std.debug.assert(w.len == x.len);
    var acc: simd.V8f32 = @splat(0);
    for (w, x) |*wb, *xb| {
        var lanes: [8]i32 = undefined;
        for (0..8) |lane| {
            var sum: i32 = 0;
            for (0..8) |k| {
                for (0..4) |j| {
                    const v = 32 * k + 4 * lane + j;
                    sum += @as(i32, quant(wb, v)) * xb.qs[v] * wb.scales[v / 16];
                }
            }
            const offset = @as(i32, xb.bsums[2 * lane]) * wb.scales[2 * lane] +
                @as(i32, xb.bsums[2 * lane + 1]) * wb.scales[2 * lane + 1];
            lanes[lane] = sum - 32 * offset;
        }
        const d = xb.d * @as(f32, wb.d);
        for (0..8) |lane| acc[lane] = @mulAdd(f32, d, @floatFromInt(lanes[lane]), acc[lane]);
    }
    return simd.hsum(acc);
}

pub fn dot(w: []align(1) const Block, x: []align(1) const q8_k.Block) f32 {
    std.debug.assert(w.len == x.len);
    return dotMulti(1, w, .{x.ptr})[0];
}

/// One token over n_out row-major rows, four at a time as q4_k.dotRows and q5_k.dotRows take
/// theirs (simd.dotRowGroups): Q6_K is never repacked, so this is every Q6_K matrix's decode
/// matvec (a Q4_K_M model's LM head and half its down projections). Bit for bit dotGgmlScalar.
pub fn dotRows(n_blocks: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]align(1) const q8_k.Block, out: [*]f32) void {
    simd.dotRowGroups(@This(), group_rows, n_blocks, w, w_row_bytes, n_out, x, out);
}

const group_rows = 4;

/// dotRows' four rows: each activation superblock's loads (q8_k.subBlocks) shared by the rows'
/// blockAcc, the next four rows' blocks prefetched (simd.prefetchNextRows).
pub inline fn rowGroup(comptime next_in_l1: bool, n_blocks: usize, w: [*]const u8, w_row_bytes: usize, x: [*]align(1) const q8_k.Block) [group_rows]f32 {
    const R = group_rows;
    var acc: [R]simd.V8f32 = @splat(@splat(0));
    for (0..n_blocks) |b| {
        simd.prefetchNextRows(R, @sizeOf(Block), next_in_l1, w, w_row_bytes, b);
        const xb = &x[b];
        const x_q = q8_k.subBlocks(xb);
        inline for (0..R) |r| {
            const wb: *align(1) const Block = @ptrCast(w + r * w_row_bytes + b * @sizeOf(Block));
            acc[r] = blockAcc(&unpack(wb), wb.d, xb, &x_q, acc[r]);
        }
    }
    var out: [R]f32 = undefined;
    inline for (0..R) |r| out[r] = simd.hsum(acc[r]);
    return out;
}

/// A superblock's 8 groups of 32 unsigned quants (0..63: u8 x i8 pairs stay inside i16), in
/// value order; each group's two scales as i16 lanes (pair lanes 0..7 cover its first 16
/// values, lanes 8..15 the rest); the 16 scales for the offset term.
const Unpacked = struct { q: [8]simd.V32u8, scale: [8]simd.V16i16, scales16: simd.V16i16 };

inline fn unpack(wb: *align(1) const Block) Unpacked {
    const nibble: simd.V32u8 = @splat(15);
    const two_bits: simd.V32u8 = @splat(3);
    var u: Unpacked = undefined;
    inline for (0..2) |half| {
        const ql_a = simd.load32(wb.ql[64 * half ..]);
        const ql_b = simd.load32(wb.ql[64 * half + 32 ..]);
        const qh = simd.load32(wb.qh[32 * half ..]);
        u.q[4 * half + 0] = (ql_a & nibble) | ((qh & two_bits) << @splat(4));
        u.q[4 * half + 1] = (ql_b & nibble) | (((qh >> @splat(2)) & two_bits) << @splat(4));
        u.q[4 * half + 2] = (ql_a >> @splat(4)) | (((qh >> @splat(4)) & two_bits) << @splat(4));
        u.q[4 * half + 3] = (ql_b >> @splat(4)) | ((qh >> @splat(6)) << @splat(4));
    }
    inline for (0..8) |k| {
        const s0: i16 = wb.scales[2 * k];
        const s1: i16 = wb.scales[2 * k + 1];
        u.scale[k] = .{ s0, s0, s0, s0, s0, s0, s0, s0, s1, s1, s1, s1, s1, s1, s1, s1 };
    }
    u.scales16 = @as(@Vector(16, i8), wb.scales);
    return u;
}

/// acc + d_x * d_w * (one superblock's 8 integer lanes), as dotGgmlScalar: the scaled dots
/// (vpmaddubsw pairs, scaled and summed in pairs) less the -32 offset per lane from the
/// activation's group sums (ggml's q8sclsub), one FMA per lane.
inline fn blockAcc(u: *const Unpacked, dw: f32, xb: *align(1) const q8_k.Block, x_q: *const [8]simd.V32i8, acc: simd.V8f32) simd.V8f32 {
    const sumi = simd.scaledDots(&u.q, x_q, &u.scale);
    const offset = simd.maddI16(xb.bsums, u.scales16) << @splat(5);
    const d: simd.V8f32 = @splat(xb.d * dw);
    return @mulAdd(simd.V8f32, d, @floatFromInt(sumi - offset), acc);
}

/// Dots one weight row with R activation rows, unpacking each superblock once for all R.
/// Rounds as dotGgmlScalar.
pub fn dotMulti(
    comptime R: usize,
    w: []align(1) const Block,
    xs: [R][*]align(1) const q8_k.Block,
) [R]f32 {
    var acc: [R]simd.V8f32 = @splat(@splat(0));
    for (w, 0..) |*wb, i| {
        const u = unpack(wb);
        inline for (0..R) |r| {
            const xb = &xs[r][i];
            acc[r] = blockAcc(&u, wb.d, xb, &q8_k.subBlocks(xb), acc[r]);
        }
    }
    var out: [R]f32 = undefined;
    inline for (0..R) |r| out[r] = simd.hsum(acc[r]);
    return out;
}

const test_util = @import("test_util.zig");

fn fixBlock(b: *Block, rng: *test_util.TestRng) void {
    b.d = test_util.randomScale(rng, false);
}

test "q6_k dot: fast matches scalar; quantized dot matches f32" {
    try test_util.checkDot(@This(), q8_k, 14, fixBlock);
}

test "q6_k dot: bit-identical to ggml's x86 vec_dot order" {
    try simd.expectGgmlOrder(@This(), q8_k, 114, fixBlock);
}

test "q6_k dotRows equals dotGgmlScalar bit for bit, odd block counts and a row stride" {
    try test_util.checkDotRows(@This(), q8_k, 6161, fixBlock);
}

test "q6_k quantizeRef: a 6-bit grid is kept; zeros stay zero; noise within 6-bit error" {
    // Every group of 16 starts at -32 * 0.25, its largest magnitude: all scales come out 0.25.
    var x: [256]f32 = undefined;
    var want: [256]u8 = undefined;
    for (&x, &want, 0..) |*v, *q, i| {
        q.* = if (i % 16 == 0) 0 else @max(1, @as(u8, @intCast((i * 7 + 3) % 64)));
        v.* = (@as(f32, @floatFromInt(q.*)) - 32) * 0.25;
    }
    var b: [1]Block = undefined;
    quantizeRef(&x, &b);
    try std.testing.expectEqual(@as(f16, -1.0 / 512.0), b[0].d);
    for (0..256) |v| try std.testing.expectEqual(want[v], quant(&b[0], v));
    quantizeRef(&([_]f32{0} ** 256), &b);
    try std.testing.expect(std.mem.allEqual(u8, std.mem.asBytes(&b[0]), 0));
    var rng = test_util.TestRng.init(43);
    var noise: [1024]f32 = undefined;
    rng.floats(&noise, 2);
    var blocks_out: [4]Block = undefined;
    const err = try @import("q4_k.zig").roundTripError(@This(), &noise, &blocks_out);
    try std.testing.expect(err < 0.03);
}
