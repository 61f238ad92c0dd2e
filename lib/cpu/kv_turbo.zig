//! infer's rotated K/V cache codes `tq3` and `tq4`, after TurboQuant (Zandieh et al., ICLR 2026):
//! each head vector x (head_dim d, a power of two) is rotated by a fixed random orthogonal
//! transform T = H·D2·H·D1 / d (D1, D2: seeded ±1 diagonals, H: the Walsh–Hadamard matrix; two
//! rounds so that a vector carried by a few channels, as keys' outlier channels are, still comes
//! out near-Gaussian), and every rotated coordinate is coded on its own with the Lloyd–Max levels
//! of a unit Gaussian (Max 1960) at 3 or 4 bits, after dividing by the vector's RMS. One f16 per
//! vector scales the levels: the least-squares factor s = <y, c> / <c, c> of the rotated vector y
//! on its codes c (not the norm), so the error left is orthogonal to the stored vector.
//!
//! Attention never expands the cache: inner products survive the rotation (<q, k> = <Tq, Tk>), so
//! the query is rotated once per head and dotted with each key's levels in the rotated domain; the
//! softmax-weighted values are summed in the rotated domain as well and the output rotated back
//! once per head (lib/cpu/attention.zig).
//!
//! A vector's bytes: the f16 scale, then tq4: d nibbles (coordinate i in nibble i, low first);
//! tq3: d 2-bit magnitudes (coordinate i at bits 2i) then d sign bits (coordinate i at bit i).
//! A code's top bit is the sign, its other bits index the magnitudes, so a level is ±mag[idx].
const std = @import("std");
const builtin = @import("builtin");

pub const dim_min = 8;
pub const dim_max = 1024;

/// Whether head vectors of d values can be coded (the Hadamard transform needs a power of two).
pub fn dimSupported(d: usize) bool {
    return d >= dim_min and d <= dim_max and std.math.isPowerOfTwo(d);
}

/// Bytes of one coded vector of d values.
pub fn vectorBytes(comptime bits: u32, d: usize) usize {
    return 2 + d * bits / 8;
}

/// The Lloyd–Max reconstruction magnitudes of N(0, 1) (Max 1960), and the decision thresholds
/// between them (their midpoints: the optimal quantizer's boundaries for fixed levels).
fn magnitudes(comptime bits: u32) []const f32 {
    return switch (bits) {
        3 => &.{ 0.2451, 0.7560, 1.3440, 2.1520 },
        4 => &.{ 0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6181, 2.0690, 2.7326 },
        else => @compileError("tq codes have 3 or 4 bits"),
    };
}

pub fn magnitudeCount(comptime bits: u32) usize {
    return magnitudes(bits).len;
}

pub fn magnitude(comptime bits: u32, i: usize) f32 {
    return magnitudes(bits)[i];
}

fn thresholds(comptime bits: u32) [magnitudes(bits).len - 1]f32 {
    const m = magnitudes(bits);
    var t: [m.len - 1]f32 = undefined;
    for (&t, 0..) |*x, i| x.* = (m[i] + m[i + 1]) / 2;
    return t;
}

/// The two sign diagonals, ±1 from a fixed seed (splitmix64), the first d of each used.
const signs: [2][dim_max]f32 = blk: {
    @setEvalBranchQuota(100_000);
    var out: [2][dim_max]f32 = undefined;
    var state: u64 = 0x7475_7262_6f71_7561; // fixed: every cache and every run rotates alike
    for (&out) |*row| for (row) |*s| {
        state +%= 0x9e37_79b9_7f4a_7c15;
        var z = state;
        z = (z ^ (z >> 30)) *% 0xbf58_476d_1ce4_e5b9;
        z = (z ^ (z >> 27)) *% 0x94d0_49bb_1331_11eb;
        z ^= z >> 31;
        s.* = if (z & 1 == 0) 1 else -1;
    };
    break :blk out;
};

const lanes = 8;
const V = @Vector(lanes, f32);

/// In-place unnormalised fast Walsh–Hadamard transform: the scalar reference.
pub fn fwhtScalar(x: []f32) void {
    var h: usize = 1;
    while (h < x.len) : (h *= 2) {
        var i: usize = 0;
        while (i < x.len) : (i += 2 * h) {
            for (i..i + h) |j| {
                const a = x[j];
                const b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
    }
}

/// The same transform on 8-lane vectors (x.len a power of two >= 8): the three innermost stages
/// inside each vector by shuffles, the rest between vectors. Bit-identical to fwhtScalar (a - b
/// is a + (-1)·b exactly).
pub fn fwht(x: []f32) void {
    std.debug.assert(x.len >= lanes and x.len % lanes == 0);
    var i: usize = 0;
    while (i < x.len) : (i += lanes) {
        var v: V = x[i..][0..lanes].*;
        inline for (.{ 1, 2, 4 }) |h| {
            const lo = comptime pick(h, false);
            const hi = comptime pick(h, true);
            const sign = comptime signOf(h);
            v = @shuffle(f32, v, undefined, lo) + @shuffle(f32, v, undefined, hi) * sign;
        }
        x[i..][0..lanes].* = v;
    }
    var h: usize = lanes;
    while (h < x.len) : (h *= 2) {
        i = 0;
        while (i < x.len) : (i += 2 * h) {
            var j = i;
            while (j < i + h) : (j += lanes) {
                const a: V = x[j..][0..lanes].*;
                const b: V = x[j + h ..][0..lanes].*;
                x[j..][0..lanes].* = a + b;
                x[j + h ..][0..lanes].* = a - b;
            }
        }
    }
}

/// Lane j of stage h reads the pair's first (lo) or second (hi) element.
fn pick(comptime h: usize, comptime second: bool) @Vector(lanes, i32) {
    var m: [lanes]i32 = undefined;
    for (0..lanes) |j| {
        const first = j - j % (2 * h) + j % h;
        m[j] = @intCast(if (second) first + h else first);
    }
    return m;
}

fn signOf(comptime h: usize) V {
    var s: [lanes]f32 = undefined;
    for (0..lanes) |j| s[j] = if (j % (2 * h) < h) 1 else -1;
    return s;
}

fn mulSigns(x: []f32, s: []const f32, c: f32) void {
    const cv: V = @splat(c);
    var i: usize = 0;
    while (i < x.len) : (i += lanes) {
        x[i..][0..lanes].* = @as(V, x[i..][0..lanes].*) * @as(V, s[i..][0..lanes].*) * cv;
    }
}

/// x = T x in place (x.len a supported head dim). 1/d is a power of two, so every step but the
/// additions is exact and rotateScalar gives the same bits.
pub fn rotate(x: []f32) void {
    const d = x.len;
    const inv_d = 1 / @as(f32, @floatFromInt(d));
    mulSigns(x, signs[0][0..d], 1);
    fwht(x);
    mulSigns(x, signs[1][0..d], 1);
    fwht(x);
    const c: V = @splat(inv_d);
    var i: usize = 0;
    while (i < d) : (i += lanes) x[i..][0..lanes].* = @as(V, x[i..][0..lanes].*) * c;
}

/// x = Tᵀ x = D1·H·D2·H·x / d in place: the inverse rotation.
pub fn unrotate(x: []f32) void {
    const d = x.len;
    const inv_d = 1 / @as(f32, @floatFromInt(d));
    fwht(x);
    mulSigns(x, signs[1][0..d], 1);
    fwht(x);
    mulSigns(x, signs[0][0..d], inv_d);
}

/// The scalar references of rotate and unrotate.
pub fn rotateScalar(x: []f32) void {
    const d = x.len;
    const inv_d = 1 / @as(f32, @floatFromInt(d));
    for (x, signs[0][0..d]) |*v, s| v.* *= s;
    fwhtScalar(x);
    for (x, signs[1][0..d]) |*v, s| v.* *= s;
    fwhtScalar(x);
    for (x) |*v| v.* *= inv_d;
}

pub fn unrotateScalar(x: []f32) void {
    const d = x.len;
    const inv_d = 1 / @as(f32, @floatFromInt(d));
    fwhtScalar(x);
    for (x, signs[1][0..d]) |*v, s| v.* *= s;
    fwhtScalar(x);
    for (x, signs[0][0..d]) |*v, s| v.* = v.* * s * inv_d;
}

/// Codes one head vector x (x.len = d, supported) into dst (vectorBytes(bits, d) bytes).
/// A non-finite value makes the scale NaN, so attention over it is NaN as over an f16 cache.
pub fn encode(comptime bits: u32, x: []const f32, dst: [*]u8) void {
    encodeOffset(bits, x, null, dst);
}

/// Codes x - anchor (anchor null: x): a K cache codes its keys less a vector common to them all
/// (attention.zig's anchors), which moves every score of a query alike and so no softmax.
pub fn encodeOffset(comptime bits: u32, x: []const f32, anchor: ?[]const f32, dst: [*]u8) void {
    const d = x.len;
    const mags = comptime magnitudes(bits);
    const bounds = comptime thresholds(bits);
    var y_buf: [dim_max]f32 = undefined;
    const y = y_buf[0..d];
    @memcpy(y, x);
    if (anchor) |a| for (y, a) |*v, c| {
        v.* -= c;
    };
    rotate(y);
    var sum_sq: f32 = 0;
    for (y) |v| sum_sq += v * v;
    const rms = @sqrt(sum_sq / @as(f32, @floatFromInt(d)));
    const inv_rms: f32 = if (rms > 0) 1 / rms else 0;
    const codes = dst + 2;
    @memset(codes[0 .. d * bits / 8], 0);
    var dot_yc: f32 = 0;
    var dot_cc: f32 = 0;
    for (y, 0..) |v, i| {
        const u = @abs(v * inv_rms);
        var idx: u8 = 0;
        inline for (bounds) |b| idx += @intFromBool(u > b);
        const negative = v < 0;
        const level = if (negative) -mags[idx] else mags[idx];
        dot_yc += v * level;
        dot_cc += level * level;
        const neg: u8 = @intFromBool(negative);
        if (bits == 4) {
            const code = idx | neg << 3;
            codes[i / 2] |= code << @intCast(4 * (i % 2));
        } else {
            codes[i / 4] |= idx << @intCast(2 * (i % 4));
            codes[d / 4 + i / 8] |= neg << @intCast(i % 8);
        }
    }
    const scale: f32 = if (std.math.isFinite(sum_sq)) dot_yc / dot_cc else std.math.nan(f32);
    std.mem.writeInt(u16, dst[0..2], @bitCast(@as(f16, @floatCast(scale))), .little);
}

pub fn scaleOf(src: [*]const u8) f32 {
    return @as(f16, @bitCast(std.mem.readInt(u16, src[0..2], .little)));
}

/// The vector's levels times its scale, in the rotated domain (out.len = d): the scalar reference.
pub fn decodeRotatedScalar(comptime bits: u32, src: [*]const u8, out: []f32) void {
    const d = out.len;
    const mags = comptime magnitudes(bits);
    const s = scaleOf(src);
    const codes = src + 2;
    for (out, 0..) |*o, i| {
        const idx, const neg = if (bits == 4) blk: {
            const c = codes[i / 2] >> @intCast(4 * (i % 2));
            break :blk .{ c & 7, (c >> 3) & 1 };
        } else .{ (codes[i / 4] >> @intCast(2 * (i % 4))) & 3, (codes[d / 4 + i / 8] >> @intCast(i % 8)) & 1 };
        const m = mags[idx];
        o.* = (if (neg == 1) -m else m) * s;
    }
}

const U = @Vector(lanes, u32);

const has_avx2 = builtin.cpu.arch == .x86_64 and std.Target.x86.featureSetHas(builtin.cpu.features, .avx2);

/// ±mag[idx] for 8 lanes at once: one vpermps from the magnitudes where AVX2 has it, else a
/// select tree on the index bits; then the sign bit xored in.
inline fn levels(comptime bits: u32, idx: U, neg: U) V {
    const sign_bits: U = neg << @splat(31);
    if (has_avx2) {
        const mags = comptime magnitudes(bits);
        const table: V = comptime blk: {
            var t: [lanes]f32 = undefined;
            for (&t, 0..) |*x, i| x.* = mags[i % mags.len];
            break :blk t;
        };
        const mag = asm ("vpermps %[t], %[i], %[o]"
            : [o] "=x" (-> V),
            : [t] "x" (table),
              [i] "x" (idx),
        );
        return @bitCast(@as(U, @bitCast(mag)) ^ sign_bits);
    }
    return @bitCast(@as(U, @bitCast(selectLevels(bits, idx))) ^ sign_bits);
}

/// mag[idx] by a select tree on the index bits: the portable path.
inline fn selectLevels(comptime bits: u32, idx: U) V {
    const mags = comptime magnitudes(bits);
    const one: U = @splat(1);
    var level: [mags.len]V = undefined;
    inline for (mags, 0..) |m, i| level[i] = @splat(m);
    comptime var n = mags.len;
    comptime var bit = 0;
    inline while (n > 1) : ({
        n /= 2;
        bit += 1;
    }) {
        const set = (idx >> @splat(bit)) & one == one;
        inline for (0..n / 2) |i| level[i] = @select(f32, set, level[2 * i + 1], level[2 * i]);
    }
    return level[0];
}

/// decodeRotatedScalar on 8-lane vectors: the same bits.
pub fn decodeRotated(comptime bits: u32, src: [*]const u8, out: []f32) void {
    const d = out.len;
    const s: V = @splat(scaleOf(src));
    const codes = src + 2;
    var i: usize = 0;
    while (i < d) : (i += lanes) {
        const idx, const neg = if (bits == 4) blk: {
            const word: U = @splat(std.mem.readInt(u32, codes[i / 2 ..][0..4], .little));
            const c = (word >> U{ 0, 4, 8, 12, 16, 20, 24, 28 }) & @as(U, @splat(15));
            break :blk .{ c & @as(U, @splat(7)), c >> @splat(3) };
        } else blk: {
            const m: U = @splat(std.mem.readInt(u16, codes[i / 4 ..][0..2], .little));
            const g: U = @splat(codes[d / 4 + i / 8]);
            break :blk .{
                (m >> U{ 0, 2, 4, 6, 8, 10, 12, 14 }) & @as(U, @splat(3)),
                (g >> U{ 0, 1, 2, 3, 4, 5, 6, 7 }) & @as(U, @splat(1)),
            };
        };
        out[i..][0..lanes].* = levels(bits, idx, neg) * s;
    }
}

/// The vector as stored, back in the original domain (out.len = d).
pub fn decode(comptime bits: u32, src: [*]const u8, out: []f32) void {
    decodeRotated(bits, src, out);
    unrotate(out);
}

// ---- tests ---------------------------------------------------------------------------------

const testing = std.testing;

fn gaussian(rand: std.Random, x: []f32) void {
    for (x) |*v| v.* = rand.floatNorm(f32);
}

test "the SIMD Hadamard rotation equals the scalar one and inverts exactly enough" {
    var prng = std.Random.DefaultPrng.init(11);
    const rand = prng.random();
    var d: usize = dim_min;
    while (d <= dim_max) : (d *= 2) {
        var x: [dim_max]f32 = undefined;
        var a: [dim_max]f32 = undefined;
        var b: [dim_max]f32 = undefined;
        gaussian(rand, x[0..d]);
        @memcpy(a[0..d], x[0..d]);
        @memcpy(b[0..d], x[0..d]);
        rotate(a[0..d]);
        rotateScalar(b[0..d]);
        try testing.expectEqualSlices(f32, b[0..d], a[0..d]);
        // Orthogonal: the norm is kept, and the inverse gives x back.
        var n0: f64 = 0;
        var n1: f64 = 0;
        for (x[0..d], a[0..d]) |u, v| {
            n0 += u * u;
            n1 += v * v;
        }
        try testing.expectApproxEqRel(n0, n1, 1e-5);
        unrotate(a[0..d]);
        unrotateScalar(b[0..d]);
        try testing.expectEqualSlices(f32, b[0..d], a[0..d]);
        for (x[0..d], a[0..d]) |u, v| try testing.expectApproxEqAbs(u, v, 1e-5);
    }
}

fn codeRoundTrip(comptime bits: u32, rand: std.Random, d: usize, spiky: bool) !f64 {
    var x: [dim_max]f32 = undefined;
    gaussian(rand, x[0..d]);
    // Keys carry a few outlier channels; the two rounds of rotation spread them.
    if (spiky) for (0..4) |c| {
        x[(c * 37) % d] *= 20;
    };
    var bytes: [vectorBytes(4, dim_max)]u8 = undefined;
    encode(bits, x[0..d], &bytes);
    var simd: [dim_max]f32 = undefined;
    var scalar: [dim_max]f32 = undefined;
    decodeRotated(bits, &bytes, simd[0..d]);
    decodeRotatedScalar(bits, &bytes, scalar[0..d]);
    try testing.expectEqualSlices(f32, scalar[0..d], simd[0..d]);
    decode(bits, &bytes, simd[0..d]);
    var err: f64 = 0;
    var norm: f64 = 0;
    for (x[0..d], simd[0..d]) |u, v| {
        err += (u - v) * (u - v);
        norm += u * u;
    }
    return err / norm;
}

test "the select tree gives the levels the table lookup gives" {
    inline for (.{ 3, 4 }) |bits| {
        const n = magnitudes(bits).len;
        var idx: [lanes]u32 = undefined;
        for (0..n) |first| {
            for (&idx, 0..) |*x, j| x.* = @intCast((first + j) % n);
            const neg = U{ 0, 1, 0, 1, 1, 0, 0, 1 };
            const got = levels(bits, idx, neg);
            const tree = selectLevels(bits, idx);
            for (0..lanes) |j| {
                const m = magnitudes(bits)[idx[j]];
                try testing.expectEqual(if (neg[j] == 1) -m else m, got[j]);
                try testing.expectEqual(m, tree[j]);
            }
        }
    }
}

test "tq3 and tq4 round trips: SIMD decode equals scalar, error near Lloyd-Max's" {
    var prng = std.Random.DefaultPrng.init(3);
    const rand = prng.random();
    // Lloyd-Max's mean squared error for a unit Gaussian: 0.03454 (3 bits), 0.009497 (4 bits).
    for ([_]usize{ 8, 16, 64, 128, 256, 512, 1024 }) |d| {
        for ([_]bool{ false, true }) |spiky| {
            var e3: f64 = 0;
            var e4: f64 = 0;
            const trials = 40;
            for (0..trials) |_| {
                e3 += try codeRoundTrip(3, rand, d, spiky);
                e4 += try codeRoundTrip(4, rand, d, spiky);
            }
            e3 /= trials;
            e4 /= trials;
            if (d >= 64) {
                try testing.expect(e3 < 0.0345 * 1.1);
                try testing.expect(e4 < 0.0095 * 1.15);
            } else {
                try testing.expect(e3 < 0.06);
                try testing.expect(e4 < 0.02);
            }
        }
    }
}

test "inner products with a coded key: unbiased in the mean, error as the distortion predicts" {
    var prng = std.Random.DefaultPrng.init(5);
    const rand = prng.random();
    const d = 128;
    inline for (.{ 3, 4 }) |bits| {
        var sum_err: f64 = 0;
        var sum_sq: f64 = 0;
        var sum_ref: f64 = 0;
        const trials = 400;
        for (0..trials) |_| {
            var k: [d]f32 = undefined;
            var q: [d]f32 = undefined;
            gaussian(rand, &k);
            gaussian(rand, &q);
            var bytes: [vectorBytes(bits, d)]u8 = undefined;
            encode(bits, &k, &bytes);
            // Through the rotated domain, as attention reads it.
            var q_rot = q;
            rotate(&q_rot);
            var k_rot: [d]f32 = undefined;
            decodeRotated(bits, &bytes, &k_rot);
            var got: f64 = 0;
            var want: f64 = 0;
            for (q_rot, k_rot, q, k) |a, b, c, e| {
                got += a * b;
                want += c * e;
            }
            sum_err += got - want;
            sum_sq += (got - want) * (got - want);
            sum_ref += want * want;
        }
        // The relative error variance of <q, k̂> is about the code's distortion.
        const rel = sum_sq / sum_ref;
        const distortion: f64 = if (bits == 3) 0.0345 else 0.0095;
        try testing.expect(rel < distortion * 1.3);
        try testing.expect(@abs(sum_err / trials) < 3 * @sqrt(sum_sq / trials / trials));
    }
}

test "a non-finite value makes the whole vector NaN; a zero vector stays zero" {
    var x = [_]f32{1} ** 16;
    x[5] = std.math.nan(f32);
    var bytes: [vectorBytes(4, 16)]u8 = undefined;
    encode(4, &x, &bytes);
    var out: [16]f32 = undefined;
    decode(4, &bytes, &out);
    for (out) |v| try testing.expect(std.math.isNan(v));
    x = [_]f32{0} ** 16;
    encode(3, &x, &bytes);
    decode(3, &bytes, &out);
    for (out) |v| try testing.expectEqual(@as(f32, 0), v);
}

/// TurboQuant's inner-product code for a key at `bits` bits a value: (bits - 1)-bit Lloyd–Max
/// levels plus QJL's 1-bit sketch of the residual (its signs after a further rotation, and its
/// norm), estimating <q, k> without bias. Test-only: the comparison below is why the cache
/// spends every bit on the levels instead.
fn qjlInnerProduct(comptime bits: u32, k: []const f32, q: []const f32) f32 {
    const d = k.len;
    var y_buf: [dim_max]f32 = undefined;
    var q_buf: [dim_max]f32 = undefined;
    const y = y_buf[0..d];
    const qr = q_buf[0..d];
    @memcpy(y, k);
    @memcpy(qr, q);
    rotate(y);
    rotate(qr);
    // The (bits - 1)-bit levels with their least-squares scale, as encode does.
    var bytes: [vectorBytes(4, dim_max)]u8 = undefined;
    var levels_buf: [dim_max]f32 = undefined;
    const lv = levels_buf[0..d];
    if (bits - 1 >= 3) {
        encode(bits - 1, k, &bytes);
        decodeRotatedScalar(bits - 1, &bytes, lv);
    } else {
        // 2 bits: Lloyd–Max's ±0.4528, ±1.5104 (threshold 0.9816).
        var sum_sq: f32 = 0;
        for (y) |v| sum_sq += v * v;
        const rms = @sqrt(sum_sq / @as(f32, @floatFromInt(d)));
        var yc: f32 = 0;
        var cc: f32 = 0;
        for (y, lv) |v, *l| {
            const m: f32 = if (@abs(v) > 0.9816 * rms) 1.5104 else 0.4528;
            l.* = if (v < 0) -m else m;
            yc += v * l.*;
            cc += l.* * l.*;
        }
        for (lv) |*l| l.* *= yc / cc;
    }
    var estimate: f32 = 0;
    var residual_sq: f32 = 0;
    var r_buf: [dim_max]f32 = undefined;
    const r = r_buf[0..d];
    for (y, lv, qr, r) |v, l, a, *e| {
        estimate += a * l;
        e.* = v - l;
        residual_sq += e.* * e.*;
    }
    // QJL: <q, r> ~ |r| sqrt(pi/2) / sqrt(d) * sum_i sign((S r)_i) (S q)_i, S orthogonal.
    rotate(r);
    rotate(qr);
    var sketch: f32 = 0;
    for (r, qr) |e, a| sketch += if (e < 0) -a else a;
    const fd: f32 = @floatFromInt(d);
    return estimate + @sqrt(residual_sq) * @sqrt(std.math.pi / 2.0) / @sqrt(fd) * sketch;
}

test "QJL's 1-bit residual sketch costs keys more than the bit spent on a finer level" {
    // Same bits a value: tq3's 3-bit levels against 2-bit levels + a 1-bit sketch (and tq4's
    // against 3 + 1). The sketch is unbiased, but its variance (pi/2 - 1 times the coarser
    // levels' residual) is about twice what the extra level bit leaves (measured at d 128: 0.064
    // against 0.028 of <q, k>'s square at 3 bits, 0.019 against 0.010 at 4).
    var prng = std.Random.DefaultPrng.init(17);
    const rand = prng.random();
    const d = 128;
    inline for (.{ 3, 4 }) |bits| {
        var err_levels: f64 = 0;
        var err_qjl: f64 = 0;
        var ref: f64 = 0;
        for (0..300) |_| {
            var k: [d]f32 = undefined;
            var q: [d]f32 = undefined;
            gaussian(rand, &k);
            gaussian(rand, &q);
            var want: f64 = 0;
            for (k, q) |a, b| want += a * b;
            var bytes: [vectorBytes(bits, d)]u8 = undefined;
            encode(bits, &k, &bytes);
            var kq: [d]f32 = undefined;
            decode(bits, &bytes, &kq);
            var got: f64 = 0;
            for (kq, q) |a, b| got += a * b;
            const est = qjlInnerProduct(bits, &k, &q);
            err_levels += (got - want) * (got - want);
            err_qjl += (est - want) * (est - want);
            ref += want * want;
        }
        try testing.expect(err_qjl > 1.5 * err_levels);
    }
}
