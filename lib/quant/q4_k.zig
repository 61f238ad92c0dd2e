//! Q4_K: 256 values in 144 bytes: f16 `d` and `dmin`, 12 bytes packing eight 6-bit scales and
//! eight 6-bit mins (one pair per 32 values), 128 bytes of nibbles. Each 64-value chunk c uses
//! qs[32c..32c+32]: low nibbles are values 64c..64c+31 (sub-block 2c), high nibbles the next 32
//! (sub-block 2c+1). value = d * scale * q - dmin * min. Dotted with Q8_K activations.
const std = @import("std");
const simd = @import("simd.zig");
const q8_k = @import("q8_k.zig");

pub const block_values = 256;
pub const Block = extern struct {
    d: f16,
    dmin: f16,
    scales: [12]u8,
    qs: [128]u8,
};
comptime {
    std.debug.assert(@sizeOf(Block) == 144);
}

pub const ScalesMins = struct { scales: [8]u8, mins: [8]u8 };

/// Unpacks the 12-byte scale field shared by Q4_K and Q5_K (ggml's get_scale_min_k4):
/// sub-block j < 4: scale = s[j] & 63, min = s[j+4] & 63; j >= 4: the low 4 bits come from
/// s[j+4] (scale: low nibble, min: high nibble) and the top 2 from s[j-4] / s[j] bits 6..7.
/// Done four sub-blocks at a time on 32-bit words (bytes a = s[0..4], b = s[4..8], c = s[8..12]).
pub fn unpackScales(s: *const [12]u8) ScalesMins {
    const a = std.mem.readInt(u32, s[0..4], .little);
    const b = std.mem.readInt(u32, s[4..8], .little);
    const c = std.mem.readInt(u32, s[8..12], .little);
    const low6: u32 = 0x3f3f3f3f;
    const low4: u32 = 0x0f0f0f0f;
    const low2: u32 = 0x03030303;
    const scales_hi = (c & low4) | (((a >> 6) & low2) << 4);
    const mins_hi = ((c >> 4) & low4) | (((b >> 6) & low2) << 4);
    var out: ScalesMins = undefined;
    std.mem.writeInt(u32, out.scales[0..4], a & low6, .little);
    std.mem.writeInt(u32, out.scales[4..8], scales_hi, .little);
    std.mem.writeInt(u32, out.mins[0..4], b & low6, .little);
    std.mem.writeInt(u32, out.mins[4..8], mins_hi, .little);
    return out;
}

/// unpackScales one byte at a time, as the format is documented: the reference for the test.
fn unpackScalesBytewise(s: *const [12]u8) ScalesMins {
    var out: ScalesMins = undefined;
    for (0..4) |j| {
        out.scales[j] = s[j] & 63;
        out.mins[j] = s[j + 4] & 63;
    }
    for (4..8) |j| {
        out.scales[j] = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        out.mins[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    return out;
}

pub fn dequantize(src: []align(1) const Block, dst: []f32) void {
    std.debug.assert(dst.len == src.len * block_values);
    for (src, 0..) |*b, i| {
        const d: f32 = b.d;
        const dmin: f32 = b.dmin;
        const sm = unpackScales(&b.scales);
        const out = dst[i * 256 ..][0..256];
        for (0..4) |c| {
            // (d * scale) * q - (dmin * min), in this order: ggml's and gguf-py's rounding.
            const d1 = d * @as(f32, @floatFromInt(sm.scales[2 * c]));
            const m1 = dmin * @as(f32, @floatFromInt(sm.mins[2 * c]));
            const d2 = d * @as(f32, @floatFromInt(sm.scales[2 * c + 1]));
            const m2 = dmin * @as(f32, @floatFromInt(sm.mins[2 * c + 1]));
            for (0..32) |l| {
                const q = b.qs[32 * c + l];
                out[64 * c + l] = d1 * @as(f32, @floatFromInt(q & 15)) - m1;
                out[64 * c + 32 + l] = d2 * @as(f32, @floatFromInt(q >> 4)) - m2;
            }
        }
    }
}

// ---- ggml's reference quantizer (quantize_row_q4_K_ref), shared with Q5_K ------------------
// What llama-quantize writes without an importance matrix. Every float operation is ggml's, in
// its order and in f32 (ggml-base is built without FMA contraction), so the blocks are equal
// byte for byte; only the 8-way search loops are written as Zig loops.

/// ggml's nearest_int: adds 1.5 * 2^23 and reads the integer back from the mantissa bits, which
/// rounds half to even for |v| <= 4194303 (other inputs give what ggml's bits give).
pub inline fn nearestInt(v: f32) i32 {
    const bits: i32 = @bitCast(v + 12582912.0);
    return (bits & 0x007fffff) - 0x00400000;
}

/// ggml's make_qkx2_quants for 32 values (use_mad = false): quants l in 0..nmax and a scale and
/// min with x ~ scale * l - the_min, found by trying nstep + 1 grid scales around nmax / range
/// and solving weighted least squares for each; the lowest weighted squared error wins.
pub fn makeQkx2Quants(
    comptime nmax: i32,
    x: *const [32]f32,
    weights: *const [32]f32,
    quants: *[32]u8,
    the_min: *f32,
    rmin: f32,
    rdelta: f32,
    nstep: u32,
) f32 {
    var min = x[0];
    var max = x[0];
    var sum_w = weights[0];
    var sum_x = sum_w * x[0];
    for (1..32) |i| {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        @memset(quants, 0);
        the_min.* = -min;
        return 0;
    }
    const levels: f32 = @floatFromInt(nmax);
    var iscale = levels / (max - min);
    var scale = 1 / iscale;
    var best_error: f32 = 0;
    for (x, quants, weights) |v, *q, w| {
        q.* = @intCast(std.math.clamp(nearestInt(iscale * (v - min)), 0, nmax));
        const diff = scale * @as(f32, @floatFromInt(q.*)) + min - v;
        best_error += w * (diff * diff);
    }
    var trial: [32]u8 = undefined;
    for (0..nstep + 1) |is| {
        iscale = (rmin + rdelta * @as(f32, @floatFromInt(is)) + levels) / (max - min);
        var sum_l: f32 = 0;
        var sum_l2: f32 = 0;
        var sum_xl: f32 = 0;
        for (x, &trial, weights) |v, *q, w| {
            const l = std.math.clamp(nearestInt(iscale * (v - min)), 0, nmax);
            q.* = @intCast(l);
            const lf: f32 = @floatFromInt(l);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * v;
        }
        const det = sum_w * sum_l2 - sum_l * sum_l;
        if (det > 0) {
            var this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            var this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            var cur_error: f32 = 0;
            for (x, trial, weights) |v, q, w| {
                const diff = this_scale * @as(f32, @floatFromInt(q)) + this_min - v;
                cur_error += w * (diff * diff);
            }
            if (cur_error < best_error) {
                quants.* = trial;
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    the_min.* = -min;
    return scale;
}

/// The scale field, d, dmin and the 256 quants (0..nmax) of one Q4_K / Q5_K superblock, as
/// quantize_row_q4_K_ref / q5_K_ref compute them: make_qkx2_quants per 32 values (weights
/// rms + |x|), scales and mins to 6 bits against the largest, then every quant re-rounded
/// against the scale and min the block will actually hold.
pub fn quantizeSuperblock(
    comptime nmax: i32,
    x: *const [256]f32,
    rmin: f32,
    nstep: u32,
    scales_out: *[12]u8,
    d_out: *f16,
    dmin_out: *f16,
    quants: *[256]u8,
) void {
    var scales: [8]f32 = undefined;
    var mins: [8]f32 = undefined;
    var max_scale: f32 = 0; // mins are subtracted, so scales are positive
    var max_min: f32 = 0;
    for (0..8) |j| {
        const xs = x[32 * j ..][0..32];
        var sum_x2: f32 = 0;
        for (xs) |v| sum_x2 += v * v;
        const av_x = @sqrt(sum_x2 / 32);
        var weights: [32]f32 = undefined;
        for (&weights, xs) |*w, v| w.* = av_x + @abs(v);
        const q = quants[32 * j ..][0..32];
        scales[j] = makeQkx2Quants(nmax, xs, &weights, q, &mins[j], rmin, 0.1, nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const inv_scale: f32 = if (max_scale > 0) 63 / max_scale else 0;
    const inv_min: f32 = if (max_min > 0) 63 / max_min else 0;
    for (0..8) |j| {
        const ls: u8 = @min(63, lowByte(nearestInt(inv_scale * scales[j])));
        const lm: u8 = @min(63, lowByte(nearestInt(inv_min * mins[j])));
        if (j < 4) {
            scales_out[j] = ls;
            scales_out[j + 4] = lm;
        } else {
            scales_out[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            scales_out[j - 4] |= (ls >> 4) << 6;
            scales_out[j] |= (lm >> 4) << 6;
        }
    }
    d_out.* = @floatCast(max_scale / 63);
    dmin_out.* = @floatCast(max_min / 63);
    const sm = unpackScalesBytewise(scales_out);
    for (0..8) |j| {
        const d = @as(f32, d_out.*) * @as(f32, @floatFromInt(sm.scales[j]));
        if (d == 0) continue; // ggml keeps make_qkx2_quants' quants here
        const dm = @as(f32, dmin_out.*) * @as(f32, @floatFromInt(sm.mins[j]));
        for (x[32 * j ..][0..32], quants[32 * j ..][0..32]) |v, *q| {
            q.* = @intCast(std.math.clamp(nearestInt((v + dm) / d), 0, nmax));
        }
    }
}

/// C's conversion of an int to uint8_t: the low byte.
inline fn lowByte(v: i32) u8 {
    return @truncate(@as(u32, @bitCast(v)));
}

/// ggml's quantize_row_q4_K_ref (make_qkx2_quants with rmin -1, 21 grid steps).
pub fn quantizeRef(src: []const f32, dst: []align(1) Block) void {
    std.debug.assert(src.len == dst.len * block_values);
    for (dst, 0..) |*b, i| {
        var quants: [256]u8 = undefined;
        var d: f16 = undefined;
        var dmin: f16 = undefined;
        quantizeSuperblock(15, src[i * 256 ..][0..256], -1, 20, &b.scales, &d, &dmin, &quants);
        b.d = d;
        b.dmin = dmin;
        for (0..4) |c| {
            for (0..32) |l| b.qs[32 * c + l] = quants[64 * c + l] | (quants[64 * c + 32 + l] << 4);
        }
    }
}

/// sum over sub-blocks of min_j * (sum of the 32 activation quants of sub-block j).
pub fn minsDot(mins: [8]u8, bsums: *align(1) const [16]i16) i32 {
    return @reduce(.Add, simd.maddI16(bsums.*, minsPairs(mins)));
}

/// ggml_vec_dot_q4_K_q8_K_generic: integer sums per sub-block times its scale, then
/// d_w * d_x * sum - dmin_w * d_x * sum(min * bsums).
pub fn dotScalar(w: []align(1) const Block, x: []align(1) const q8_k.Block) f32 {
    std.debug.assert(w.len == x.len);
    var sum: f32 = 0;
    for (w, x) |*wb, *xb| {
        const sm = unpackScales(&wb.scales);
        var sumi: i32 = 0;
        for (0..4) |c| {
            var lo: i32 = 0;
            var hi: i32 = 0;
            for (0..32) |l| {
                const q = wb.qs[32 * c + l];
                lo += @as(i32, q & 15) * xb.qs[64 * c + l];
                hi += @as(i32, q >> 4) * xb.qs[64 * c + 32 + l];
            }
            sumi += lo * sm.scales[2 * c] + hi * sm.scales[2 * c + 1];
        }
        const d = @as(f32, wb.d) * xb.d;
        const dmin = @as(f32, wb.dmin) * xb.d;
        sum += d * @as(f32, @floatFromInt(sumi));
        sum -= dmin * @as(f32, @floatFromInt(minsDot(sm.mins, &xb.bsums)));
    }
    return sum;
}

/// The float arithmetic of ggml_gemv_q4_K_8x8_q8_K (arch/x86/repack.cpp), which llama.cpp runs
/// for every Q4_K matmul on an AVX2/AVX-512 CPU (the weights are repacked to block_q4_Kx8 at
/// load when n_out % 8 == 0). Per superblock it forms two exact integers, the scaled quant sum
/// and the mins sum, and feeds each into its own f32 FMA chain; the chains meet at the end:
///   acc  = fma(f32(sum_j scale_j * dot_j),            d_w * d_x,    acc)
///   accm = fma(f32(sum_j min_j * (bsum_2j + bsum_2j+1)), dmin_w * d_x, accm)
///   result = acc - accm.
/// Written as plain scalar loops: the reference the fast path must equal bit for bit.
pub fn dotGgmlScalar(w: []align(1) const Block, x: []align(1) const q8_k.Block) f32 {
    std.debug.assert(w.len == x.len);
    var acc: f32 = 0;
    var acc_min: f32 = 0;
    for (w, x) |*wb, *xb| {
        const sm = unpackScalesBytewise(&wb.scales);
        var sumi: i32 = 0;
        var sum_min: i32 = 0;
        for (0..8) |j| {
            var sub: i32 = 0;
            for (0..32) |l| {
                const q = wb.qs[32 * (j / 2) + l];
                const nib = if (j % 2 == 0) q & 15 else q >> 4;
                sub += @as(i32, nib) * xb.qs[32 * j + l];
            }
            sumi += sub * sm.scales[j];
            sum_min += @as(i32, sm.mins[j]) * (@as(i32, xb.bsums[2 * j]) + xb.bsums[2 * j + 1]);
        }
        const dw: f32 = wb.d;
        const dmin: f32 = wb.dmin;
        acc = @mulAdd(f32, @floatFromInt(sumi), dw * xb.d, acc);
        acc_min = @mulAdd(f32, @floatFromInt(sum_min), dmin * xb.d, acc_min);
    }
    return acc - acc_min;
}

pub fn dot(w: []align(1) const Block, x: []align(1) const q8_k.Block) f32 {
    std.debug.assert(w.len == x.len);
    return dotMulti(1, w, .{x.ptr})[0];
}

/// One token over n_out row-major rows (weights not repacked: rows not a multiple of 8, or
/// INFER_REPACK=0): four rows side by side, sharing each activation load, their eight integer
/// sums (quant and mins sums of each row) out of one transposing reduction and their f32 chains
/// one vector FMA each; the next four rows prefetched meanwhile (simd.prefetchNextRows); the
/// rest one at a time. Bit for bit dotGgmlScalar.
pub fn dotRows(n_blocks: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]align(1) const q8_k.Block, out: [*]f32) void {
    simd.dotRowGroups(@This(), four_rows, n_blocks, w, w_row_bytes, n_out, x, out);
}

const four_rows = 4;

/// Four rows of dotRows (simd.dotRowGroups), the next four prefetched.
pub inline fn rowGroup(comptime next_in_l1: bool, n_blocks: usize, w: [*]const u8, w_row_bytes: usize, x: [*]align(1) const q8_k.Block) [four_rows]f32 {
    const R = four_rows;
    var acc: @Vector(R, f32) = @splat(0);
    var acc_min: @Vector(R, f32) = @splat(0);
    for (0..n_blocks) |b| {
        simd.prefetchNextRows(R, @sizeOf(Block), next_in_l1, w, w_row_bytes, b);
        const xb = &x[b];
        const x_q = q8_k.subBlocks(xb);
        // Row r's quant-sum lanes in vector r, its mins-sum lanes in vector 4 + r.
        var lanes: [8]simd.V8i32 = undefined;
        var dw: @Vector(R, f32) = undefined;
        var dmin: @Vector(R, f32) = undefined;
        inline for (0..R) |r| {
            const wb: *align(1) const Block = @ptrCast(w + r * w_row_bytes + b * @sizeOf(Block));
            const u = unpack(wb);
            const sumi = simd.scaledDots(&u.q, &x_q, &u.scale);
            lanes[r] = sumi;
            lanes[R + r] = simd.maddI16(xb.bsums, u.mins);
            dw[r] = wb.d;
            dmin[r] = wb.dmin;
        }
        const sums = simd.reduceEight(lanes);
        const d_x: @Vector(R, f32) = @splat(xb.d);
        const sumi: @Vector(R, i32) = @shuffle(i32, sums, undefined, [R]i32{ 0, 1, 2, 3 });
        const sum_min: @Vector(R, i32) = @shuffle(i32, sums, undefined, [R]i32{ 4, 5, 6, 7 });
        acc = @mulAdd(@Vector(R, f32), @floatFromInt(sumi), dw * d_x, acc);
        acc_min = @mulAdd(@Vector(R, f32), @floatFromInt(sum_min), dmin * d_x, acc_min);
    }
    return acc - acc_min;
}

/// A superblock's 8 sub-blocks of 32 nibbles, their scales as i16 lanes, and the mins beside
/// the activation's bsums pairs (minsPairs).
const Unpacked = struct { q: [8]simd.V32u8, scale: [8]simd.V16i16, mins: simd.V16i16 };

inline fn unpack(wb: *align(1) const Block) Unpacked {
    const nibble: simd.V32u8 = @splat(15);
    const sm = unpackScales(&wb.scales);
    var u: Unpacked = undefined;
    inline for (0..4) |c| {
        const packed_qs = simd.load32(wb.qs[32 * c ..]);
        u.q[2 * c] = packed_qs & nibble;
        u.q[2 * c + 1] = packed_qs >> @splat(4);
    }
    inline for (0..8) |j| u.scale[j] = @splat(sm.scales[j]);
    u.mins = minsPairs(sm.mins);
    return u;
}

/// Dots one weight row with R activation rows, unpacking each superblock's nibbles and scales
/// once for all R. Rounds as dotGgmlScalar: the integer sums are exact in any lane order, so
/// only the two f32 chains per row need ggml's order.
pub fn dotMulti(
    comptime R: usize,
    w: []align(1) const Block,
    xs: [R][*]align(1) const q8_k.Block,
) [R]f32 {
    var acc: [R]f32 = @splat(0);
    var acc_min: [R]f32 = @splat(0);
    for (w, 0..) |*wb, i| {
        // Sub-block j's 32 quants (0..15: u8 x i8 pairs stay far inside i16) and its scale.
        const u = unpack(wb);
        const q = u.q;
        const scale = u.scale;
        const mins = u.mins;
        const dw: f32 = wb.d;
        const dmin: f32 = wb.dmin;
        // Per token, the lanes of the quant sum (vector r) and of the mins sum (vector 4 + r);
        // one transposing reduction turns up to four tokens' pairs into their eight integers.
        var lanes: [8]simd.V8i32 = @splat(@splat(0));
        inline for (0..R) |r| {
            const xb = &xs[r][i];
            const sumi = simd.scaledDots(&q, &q8_k.subBlocks(xb), &scale);
            lanes[r % 4] = sumi;
            lanes[4 + r % 4] = simd.maddI16(xb.bsums, mins);
            if (r % 4 == 3 or r == R - 1) {
                const sums: [8]i32 = if (R == 1)
                    .{ @reduce(.Add, lanes[0]), 0, 0, 0, @reduce(.Add, lanes[4]), 0, 0, 0 }
                else
                    simd.reduceEight(lanes);
                inline for (r - r % 4..r + 1) |t| {
                    const xt = &xs[t][i];
                    acc[t] = @mulAdd(f32, @floatFromInt(sums[t % 4]), dw * xt.d, acc[t]);
                    acc_min[t] = @mulAdd(f32, @floatFromInt(sums[4 + t % 4]), dmin * xt.d, acc_min[t]);
                }
            }
        }
    }
    var out: [R]f32 = undefined;
    inline for (0..R) |r| out[r] = acc[r] - acc_min[r];
    return out;
}

/// min_j in lanes 2j and 2j+1, beside bsums 2j and 2j+1 (the two halves of sub-block j).
pub inline fn minsPairs(mins: [8]u8) simd.V16i16 {
    const m: @Vector(8, i16) = @as(@Vector(8, u8), mins);
    return @shuffle(i16, m, undefined, [16]i32{ 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7 });
}

const test_util = @import("test_util.zig");

test "q4_k dotRows equals dotGgmlScalar bit for bit, odd block counts and a row stride" {
    try test_util.checkDotRows(@This(), q8_k, 4343, fixBlock);
}

fn fixBlock(b: *Block, rng: *test_util.TestRng) void {
    b.d = test_util.randomScale(rng, false);
    b.dmin = test_util.randomScale(rng, false);
}

test "q4_k dot: fast matches scalar; quantized dot matches f32" {
    try test_util.checkDot(@This(), q8_k, 12, fixBlock);
}

test "q4_k dot: bit-identical to ggml's x86 gemv order" {
    try simd.expectGgmlOrder(@This(), q8_k, 112, fixBlock);
}

test "q4_k scale unpacking follows the documented bit layout" {
    // scale 5 = 0b000101 for j=4 lives in s[8] low nibble (5) and s[0] bits 6..7 (0).
    var s = [_]u8{0} ** 12;
    s[0] = 0b11_000001; // scale0 = 1, scale4 high bits = 3
    s[4] = 0b10_000010; // min0 = 2, min4 high bits = 2
    s[8] = 0x75; // scale4 low = 5, min4 low = 7
    const sm = unpackScales(&s);
    var rng = test_util.TestRng.init(3);
    for (0..1000) |_| {
        var r: [12]u8 = undefined;
        rng.bytes(&r);
        try std.testing.expectEqualDeep(unpackScalesBytewise(&r), unpackScales(&r));
    }
    try std.testing.expectEqual(@as(u8, 1), sm.scales[0]);
    try std.testing.expectEqual(@as(u8, 2), sm.mins[0]);
    try std.testing.expectEqual(@as(u8, 5 | (3 << 4)), sm.scales[4]);
    try std.testing.expectEqual(@as(u8, 7 | (2 << 4)), sm.mins[4]);
}

/// Quantizes `x` with `Fmt.quantizeRef`, dequantizes, and returns the RMS error over the RMS of x.
pub fn roundTripError(comptime Fmt: type, x: []const f32, blocks_out: []Fmt.Block) !f32 {
    const alloc = std.testing.allocator;
    const y = try alloc.alloc(f32, x.len);
    defer alloc.free(y);
    Fmt.quantizeRef(x, blocks_out);
    Fmt.dequantize(blocks_out, y);
    var err: f64 = 0;
    var norm: f64 = 0;
    for (x, y) |a, b| {
        err += (@as(f64, a) - b) * (@as(f64, a) - b);
        norm += @as(f64, a) * a;
    }
    return @floatCast(@sqrt(err / norm));
}

test "q4_k quantizeRef: a 4-bit grid is kept exactly; zeros stay zero; noise within 4-bit error" {
    var x: [256]f32 = undefined;
    for (&x, 0..) |*v, i| v.* = @as(f32, @floatFromInt(i % 16)) * 0.5;
    var b: [1]Block = undefined;
    quantizeRef(&x, &b);
    try std.testing.expectEqual(@as(f16, 0), b[0].dmin); // no negative values: no min
    for (0..256) |i| {
        const q = b[0].qs[32 * (i / 64) + i % 32];
        try std.testing.expectEqual(@as(u8, @intCast(i % 16)), if (i % 64 < 32) q & 15 else q >> 4);
    }
    quantizeRef(&([_]f32{0} ** 256), &b);
    try std.testing.expect(std.mem.allEqual(u8, std.mem.asBytes(&b[0]), 0));
    var rng = test_util.TestRng.init(41);
    var noise: [1024]f32 = undefined;
    rng.floats(&noise, 2);
    var blocks_out: [4]Block = undefined;
    try std.testing.expect(try roundTripError(@This(), &noise, &blocks_out) < 0.1);
}

test "nearestInt rounds half to even, as ggml's nearest_int" {
    const cases = [_][2]f32{
        .{ 0.5, 0 },   .{ 1.5, 2 },  .{ 2.5, 2 },    .{ -0.5, 0 },
        .{ -1.5, -2 }, .{ 3.49, 3 }, .{ -7.51, -8 },
    };
    for (cases) |c| try std.testing.expectEqual(@as(i32, @intFromFloat(c[1])), nearestInt(c[0]));
}
