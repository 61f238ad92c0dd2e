//! ggml_v_expf, the AVX-512 version, on 16-lane vectors of any target: the exp of the attention
//! softmax (lib/cpu/attention_f16.zig), of SiLU (ggml_v_silu, lib/cpu/act.zig) and of the
//! sampler's softmax (lib/cpu/select.zig). They round as llama.cpp's AVX-512 build does on every
//! CPU, where a vector @exp becomes a libm expf call per lane, which rounds a little differently
//! and costs far more.
const std = @import("std");

const L16 = @Vector(16, f32);

/// ggml_v_expf, the AVX-512 version: a degree-5 polynomial after range reduction by ln 2.
pub fn expV(x: L16) L16 {
    const splat = struct {
        fn f(c: f32) L16 {
            return @splat(c);
        }
    }.f;
    const r = splat(0x1.8p23);
    const z = @mulAdd(L16, x, splat(0x1.715476p+0), r);
    const n = z - r;
    const b = @mulAdd(L16, -n, splat(0x1.7f7d1cp-20), @mulAdd(L16, -n, splat(0x1.62e4p-1), x));
    const u = b * b;
    const j = @mulAdd(
        L16,
        @mulAdd(L16, @mulAdd(L16, splat(0x1.0e4020p-7), b, splat(0x1.573e2ep-5)), u, @mulAdd(L16, splat(0x1.555e66p-3), b, splat(0x1.fffdb6p-2))),
        u,
        @mulAdd(L16, splat(0x1.ffffecp-1), b, splat(1.0)),
    );
    return scalef(j, n);
}

/// _mm512_scalef_ps(j, n) for the integral n of expV: j · 2^n rounded once; where |n| > 192,
/// ggml_v_expf returns 0 (n <= 0) or +inf instead. j is in [0.7, 1.5], so j · 2^n1 with
/// n1 = n / 2 is exact and normal, and the second power of two does the one rounding. A NaN
/// lane (x was NaN) converts 0 instead of n, whose conversion is undefined, and stays NaN
/// through j.
fn scalef(j: L16, n: L16) L16 {
    const I16 = @Vector(16, i32);
    const big = @abs(n) > @as(L16, @splat(192));
    const in_range = @abs(n) <= @as(L16, @splat(192));
    const n_int: I16 = @intFromFloat(@select(f32, in_range, n, @as(L16, @splat(0))));
    const n1 = @divTrunc(n_int, @as(I16, @splat(2)));
    const n2 = n_int - n1;
    const scaled = (j * powerOfTwo(n1)) * powerOfTwo(n2);
    const saturated = @select(f32, n <= @as(L16, @splat(0)), @as(L16, @splat(0)), @as(L16, @splat(std.math.inf(f32))));
    return @select(f32, big, saturated, scaled);
}

/// 2^k for k in [-126, 127], built from its exponent bits.
fn powerOfTwo(k: @Vector(16, i32)) L16 {
    return @bitCast((k + @as(@Vector(16, i32), @splat(127))) << @splat(23));
}

/// The per-lane form of scalef (std.math.ldexp rounds as the instruction does): the reference.
fn scalefScalar(j: L16, n: L16) L16 {
    var out: L16 = undefined;
    for (0..16) |l| {
        out[l] = if (@abs(n[l]) > 192)
            (if (n[l] <= 0) 0 else std.math.inf(f32))
        else
            std.math.ldexp(j[l], @as(i32, @intFromFloat(n[l])));
    }
    return out;
}

test "expV is NaN for NaN, 0 for -inf, +inf for +inf, and finite lanes keep their values" {
    var x: L16 = undefined;
    for (0..16) |l| x[l] = @as(f32, @floatFromInt(l)) * 0.7 - 5.0;
    const finite = expV(x);
    x[1] = std.math.nan(f32);
    x[2] = -std.math.inf(f32);
    x[3] = std.math.inf(f32);
    const got = expV(x);
    try std.testing.expect(std.math.isNan(got[1]));
    try std.testing.expectEqual(@as(f32, 0), got[2]);
    try std.testing.expect(std.math.isPositiveInf(got[3]));
    for (0..16) |l| if (l < 1 or l > 3) try std.testing.expectEqual(finite[l], got[l]);
}

test "scalef equals ldexp lane by lane, saturation included" {
    var rng = std.Random.DefaultPrng.init(3);
    const r = rng.random();
    for (0..20000) |_| {
        var j: L16 = undefined;
        var n: L16 = undefined;
        for (0..16) |l| {
            j[l] = 0.7 + r.float(f32) * 0.8;
            n[l] = @floatFromInt(r.intRangeAtMost(i32, -200, 200));
        }
        const want: [16]u32 = @bitCast(scalefScalar(j, n));
        const got: [16]u32 = @bitCast(scalef(j, n));
        try std.testing.expectEqual(want, got);
    }
}
