//! Rotary position embedding (Su et al. 2021, "RoFormer"), in place on [n_tok][n_heads][head_dim].
//! Pair i (i < n_rot/2) is rotated by theta_i = pos · freq_scale · base^(-2i/n_rot) / ff_i:
//!   normal: the adjacent pair (2i, 2i+1) (GPT-J / Llama style in ggml's numbering);
//!   neox:   the pair (i, i + n_rot/2) ("rotate half", GPT-NeoX, Gemma, Qwen).
//! Dimensions >= n_rot are left unchanged.
//! The angles follow ggml_rope_cache_init exactly: theta starts at (float)pos and is multiplied
//! in f32 by theta_scale = powf(base, -2.0f/n_rot) once per pair, then divided by the frequency
//! factor and multiplied by freq_scale (rope_yarn with ext_factor 0, mscale attn_factor: the
//! cosines and sines are multiplied by it, 1 unless LongRoPE scales attention), with the C
//! library's sinf/cosf; with YaRN (ext_factor != 0, gpt-oss) each angle is blended between the
//! interpolated and the extrapolated one by ggml's ramp over the correction dims and mscale gains
//! 1 + 0.1·ln(1/freq_scale), as rope_yarn computes them; each rotation is contracted into an FMA the way the compiled ggml does
//! (x0·c − x1·s → fma(x0, c, −x1·s)), so results equal llama.cpp's bit for bit.
const std = @import("std");

const lanes = 8;
const V = @Vector(lanes, f32);

pub const Mode = enum(u32) { normal = 0, neox = 2 };

/// Largest n_rot: the per-token cos/sin table lives on the stack.
pub const rot_dims_max = 1024;

pub const Params = struct {
    n_heads: usize,
    head_dim: usize,
    n_rot: usize,
    freq_base: f32,
    freq_scale: f32,
    /// ggml's mscale: multiplies every cosine and sine (LongRoPE's attention factor; 1: none).
    attn_factor: f32 = 1,
    mode: Mode,
    /// Per-pair divisors of theta (Llama 3 "rope_freqs"), n_rot/2 of them, or null.
    freq_factors: ?[]const f32 = null,
    /// YaRN's extrapolation mix (ggml's ext_factor; 0: none) and its correction dims (yarnCorrDims).
    ext_factor: f32 = 0,
    corr_dims: [2]f32 = .{ 0, 0 },
};

// The C library's powf/sinf/cosf, as ggml calls them: their results differ from correctly
// rounded ones by an ulp now and then (seen: sinf at 4 of 128 angles of one Gemma head), and
// llama.cpp's tokens follow those ulps.
extern "c" fn powf(x: f32, y: f32) f32;
extern "c" fn sinf(x: f32) f32;
extern "c" fn cosf(x: f32) f32;
extern "c" fn logf(x: f32) f32;

/// ggml_rope_yarn_corr_dim: the pair index whose wavelength turns `n_rot_turns` times over the
/// original context (n_dims · ln(n_ctx_orig / (turns · 2π)) / (2 · ln base)), in f32.
fn yarnCorrDim(n_dims: usize, n_ctx_orig: u32, turns: f32, base: f32) f32 {
    const dims: f32 = @floatFromInt(n_dims);
    const ctx: f32 = @floatFromInt(n_ctx_orig);
    return dims * logf(ctx / (turns * 2 * @as(f32, std.math.pi))) / (2 * logf(base));
}

/// ggml_rope_yarn_corr_dims: the pairs between which YaRN ramps from extrapolation (fast
/// rotations, beta_fast turns) to interpolation (slow ones, beta_slow turns).
pub fn yarnCorrDims(n_rot: usize, n_ctx_orig: u32, freq_base: f32, beta_fast: f32, beta_slow: f32) [2]f32 {
    const start = @floor(yarnCorrDim(n_rot, n_ctx_orig, beta_fast, freq_base));
    const end = @ceil(yarnCorrDim(n_rot, n_ctx_orig, beta_slow, freq_base));
    return .{ @max(0, start), @min(@as(f32, @floatFromInt(n_rot - 1)), end) };
}

/// rope_yarn_ramp: 1 for pairs below low (extrapolated), 0 above high (interpolated).
fn yarnRamp(low: f32, high: f32, i: usize) f32 {
    const y = (@as(f32, @floatFromInt(i)) - low) / @max(0.001, high - low);
    return 1 - @min(1, @max(0, y));
}

/// The factor on every cosine and sine (rope_yarn's mscale): attn_factor, with YaRN (ext_factor
/// != 0) times 1 + 0.1 ln(1 / freq_scale), in f32 with the C library's logf.
pub fn mscaleOf(attn_factor: f32, ext_factor: f32, freq_scale: f32) f32 {
    var mscale = attn_factor;
    if (ext_factor != 0) mscale *= 1.0 + 0.1 * logf(1.0 / freq_scale);
    return mscale;
}

/// powf(base, -2/n_rot), in f32 as ggml_rope_cache_init computes it.
fn thetaScale(freq_base: f32, n_rot: usize) f32 {
    const exponent: f32 = -2.0 / @as(f32, @floatFromInt(n_rot));
    return powf(freq_base, exponent);
}

/// cos/sin of the n_rot/2 rotation angles at `pos`.
pub fn angles(params: Params, pos: i32, cos_out: []f32, sin_out: []f32) void {
    const half = params.n_rot / 2;
    std.debug.assert(cos_out.len >= half and sin_out.len >= half);
    const theta_scale = thetaScale(params.freq_base, params.n_rot);
    var theta: f32 = @floatFromInt(pos);
    const mscale = mscaleOf(params.attn_factor, params.ext_factor, params.freq_scale);
    for (0..half) |i| {
        const ff: f32 = if (params.freq_factors) |f| f[i] else 1.0;
        const extrapolated = theta / ff;
        var angle: f32 = params.freq_scale * extrapolated;
        if (params.ext_factor != 0) {
            const mix = yarnRamp(params.corr_dims[0], params.corr_dims[1], i) * params.ext_factor;
            angle = angle * (1 - mix) + extrapolated * mix;
        }
        cos_out[i] = cosf(angle) * mscale;
        sin_out[i] = sinf(angle) * mscale;
        theta *= theta_scale;
    }
}

/// Rotates one head's pairs with the given table, one pair at a time.
fn rotateHeadReference(head: []f32, mode: Mode, cos: []const f32, sin: []const f32) void {
    const half = cos.len;
    for (0..half) |i| {
        const a_idx, const b_idx = switch (mode) {
            .normal => .{ 2 * i, 2 * i + 1 },
            .neox => .{ i, i + half },
        };
        const a = head[a_idx];
        const b = head[b_idx];
        head[a_idx] = @mulAdd(f32, a, cos[i], -(b * sin[i]));
        head[b_idx] = @mulAdd(f32, a, sin[i], b * cos[i]);
    }
}

/// NeoX: both halves are contiguous, so lanes map directly onto pairs.
fn rotateHeadNeox(head: []f32, cos: []const f32, sin: []const f32) void {
    const half = cos.len;
    var i: usize = 0;
    while (i + lanes <= half) : (i += lanes) {
        const a: V = head[i..][0..lanes].*;
        const b: V = head[i + half ..][0..lanes].*;
        const c: V = cos[i..][0..lanes].*;
        const s: V = sin[i..][0..lanes].*;
        head[i..][0..lanes].* = @mulAdd(V, a, c, -(b * s));
        head[i + half ..][0..lanes].* = @mulAdd(V, a, s, b * c);
    }
    while (i < half) : (i += 1) {
        const a = head[i];
        const b = head[i + half];
        head[i] = @mulAdd(f32, a, cos[i], -(b * sin[i]));
        head[i + half] = @mulAdd(f32, a, sin[i], b * cos[i]);
    }
}

const even_from_ab = [lanes]i32{ 0, 2, 4, 6, -1, -3, -5, -7 };
const odd_from_ab = [lanes]i32{ 1, 3, 5, 7, -2, -4, -6, -8 };
const interleave_lo = [lanes]i32{ 0, -1, 1, -2, 2, -3, 3, -4 };
const interleave_hi = [lanes]i32{ 4, -5, 5, -6, 6, -7, 7, -8 };

/// Normal: pairs are interleaved, so 16 values are de-interleaved into evens and odds,
/// rotated, and interleaved back (negative shuffle indices select from the second vector).
fn rotateHeadNormal(head: []f32, cos: []const f32, sin: []const f32) void {
    const half = cos.len;
    var i: usize = 0;
    while (i + lanes <= half) : (i += lanes) {
        const a: V = head[2 * i ..][0..lanes].*;
        const b: V = head[2 * i + lanes ..][0..lanes].*;
        const even = @shuffle(f32, a, b, even_from_ab);
        const odd = @shuffle(f32, a, b, odd_from_ab);
        const c: V = cos[i..][0..lanes].*;
        const s: V = sin[i..][0..lanes].*;
        const r_even = @mulAdd(V, even, c, -(odd * s));
        const r_odd = @mulAdd(V, even, s, odd * c);
        head[2 * i ..][0..lanes].* = @shuffle(f32, r_even, r_odd, interleave_lo);
        head[2 * i + lanes ..][0..lanes].* = @shuffle(f32, r_even, r_odd, interleave_hi);
    }
    while (i < half) : (i += 1) {
        const a = head[2 * i];
        const b = head[2 * i + 1];
        head[2 * i] = @mulAdd(f32, a, cos[i], -(b * sin[i]));
        head[2 * i + 1] = @mulAdd(f32, a, sin[i], b * cos[i]);
    }
}

fn checkParams(x: []const f32, positions: []const i32, params: Params) void {
    std.debug.assert(params.n_rot > 0 and params.n_rot % 2 == 0);
    std.debug.assert(params.n_rot <= params.head_dim and params.n_rot <= rot_dims_max);
    std.debug.assert(x.len == positions.len * params.n_heads * params.head_dim);
    if (params.freq_factors) |f| std.debug.assert(f.len >= params.n_rot / 2);
}

pub fn ropeReference(x: []f32, positions: []const i32, params: Params) void {
    checkParams(x, positions, params);
    var cos: [rot_dims_max / 2]f32 = undefined;
    var sin: [rot_dims_max / 2]f32 = undefined;
    const half = params.n_rot / 2;
    for (positions, 0..) |pos, t| {
        for (0..params.n_heads) |h| {
            angles(params, pos, &cos, &sin);
            const head = x[(t * params.n_heads + h) * params.head_dim ..][0..params.head_dim];
            rotateHeadReference(head, params.mode, cos[0..half], sin[0..half]);
        }
    }
}

/// The angle table is built once per token and shared by all its heads.
pub fn rope(x: []f32, positions: []const i32, params: Params) void {
    checkParams(x, positions, params);
    var cos: [rot_dims_max / 2]f32 = undefined;
    var sin: [rot_dims_max / 2]f32 = undefined;
    const half = params.n_rot / 2;
    for (positions, 0..) |pos, t| {
        angles(params, pos, &cos, &sin);
        for (0..params.n_heads) |h| {
            const head = x[(t * params.n_heads + h) * params.head_dim ..][0..params.head_dim];
            switch (params.mode) {
                .normal => rotateHeadNormal(head, cos[0..half], sin[0..half]),
                .neox => rotateHeadNeox(head, cos[0..half], sin[0..half]),
            }
        }
    }
}

// ---- tests ---------------------------------------------------------------------------------

test "rope fast paths equal the scalar reference bit for bit" {
    const gpa = std.testing.allocator;
    var prng = std.Random.DefaultPrng.init(3);
    const rand = prng.random();
    const head_dims = [_]usize{ 2, 8, 34, 64, 66, 256 };
    for (head_dims) |head_dim| {
        for ([_]Mode{ .normal, .neox }) |mode| {
            for ([_]usize{ head_dim, head_dim / 2 + head_dim / 2 % 2 }) |n_rot_raw| {
                const n_rot = if (n_rot_raw == 0) 2 else n_rot_raw;
                const n_tok = 3;
                const n_heads = 5;
                const factors = try gpa.alloc(f32, n_rot / 2);
                defer gpa.free(factors);
                for (factors) |*f| f.* = 1 + rand.float(f32) * 7;
                const params = Params{
                    .n_heads = n_heads,
                    .head_dim = head_dim,
                    .n_rot = n_rot,
                    .freq_base = 10000,
                    .freq_scale = 0.5,
                    .attn_factor = if (mode == .neox) 1.19 else 1,
                    .mode = mode,
                    .freq_factors = if (head_dim % 4 == 0) factors else null,
                };
                const want = try gpa.alloc(f32, n_tok * n_heads * head_dim);
                defer gpa.free(want);
                const got = try gpa.alloc(f32, want.len);
                defer gpa.free(got);
                for (want) |*v| v.* = rand.float(f32) * 2 - 1;
                @memcpy(got, want);
                const positions = [_]i32{ 0, 17, 4095 };
                ropeReference(want, &positions, params);
                rope(got, &positions, params);
                try std.testing.expectEqualSlices(f32, want, got);
            }
        }
    }
}

test "angles follow theta = pos * base^(-2i/n_rot)" {
    var cos: [32]f32 = undefined;
    var sin: [32]f32 = undefined;
    const params = Params{
        .n_heads = 1,
        .head_dim = 64,
        .n_rot = 64,
        .freq_base = 10000,
        .freq_scale = 1,
        .mode = .neox,
    };
    angles(params, 3, &cos, &sin);
    for (0..32) |i| {
        const theta = 3 * std.math.pow(f64, 10000, -2.0 * @as(f64, @floatFromInt(i)) / 64);
        try std.testing.expectApproxEqAbs(@as(f32, @floatCast(@cos(theta))), cos[i], 2e-6);
        try std.testing.expectApproxEqAbs(@as(f32, @floatCast(@sin(theta))), sin[i], 2e-6);
    }
}

test "YaRN angles follow the f64 formula (gpt-oss: factor 32, original context 4096)" {
    var cos: [32]f32 = undefined;
    var sin: [32]f32 = undefined;
    const corr = yarnCorrDims(64, 4096, 150000, 32, 1);
    try std.testing.expectEqual([2]f32{ 8, 18 }, corr);
    const params = Params{
        .n_heads = 1,
        .head_dim = 64,
        .n_rot = 64,
        .freq_base = 150000,
        .freq_scale = 1.0 / 32.0,
        .mode = .neox,
        .ext_factor = 1,
        .corr_dims = corr,
    };
    angles(params, 37, &cos, &sin);
    const mscale = 1 + 0.1 * @log(32.0);
    for (0..32) |i| {
        const fi: f64 = @floatFromInt(i);
        const extrapolated = 37 * std.math.pow(f64, 150000, -2.0 * fi / 64);
        const ramp = 1 - @min(1, @max(0, (fi - 8) / 10));
        const theta = extrapolated / 32 * (1 - ramp) + extrapolated * ramp;
        try std.testing.expectApproxEqAbs(@as(f32, @floatCast(@cos(theta) * mscale)), cos[i], 1e-4);
        try std.testing.expectApproxEqAbs(@as(f32, @floatCast(@sin(theta) * mscale)), sin[i], 1e-4);
    }
}

test "YaRN rotations compose: rope(p) then rope(-d) with mscale divided out equals rope(p - d)" {
    // The context shift (ts/backend/cpu.ts rotatedKeys) re-rotates stored keys this way.
    const base = Params{
        .n_heads = 2,
        .head_dim = 64,
        .n_rot = 64,
        .freq_base = 150000,
        .freq_scale = 1.0 / 32.0,
        .mode = .neox,
        .ext_factor = 1,
        .corr_dims = yarnCorrDims(64, 4096, 150000, 32, 1),
    };
    var shift = base;
    shift.attn_factor = 1 / (1 + 0.1 * logf(32));
    var prng = std.Random.DefaultPrng.init(9);
    const rand = prng.random();
    var a: [128]f32 = undefined;
    for (&a) |*v| v.* = rand.float(f32) * 2 - 1;
    var b = a;
    rope(&a, &[_]i32{300}, base);
    rope(&a, &[_]i32{-120}, shift);
    rope(&b, &[_]i32{180}, base);
    for (a, b) |x, y| try std.testing.expectApproxEqAbs(y, x, 2e-4);
}

test "position 0 and dims beyond n_rot are unchanged" {
    var x = [_]f32{ 1, 2, 3, 4, 5, 6 };
    const params = Params{
        .n_heads = 1,
        .head_dim = 6,
        .n_rot = 4,
        .freq_base = 10000,
        .freq_scale = 1,
        .mode = .normal,
    };
    rope(&x, &[_]i32{0}, params);
    try std.testing.expectEqualSlices(f32, &[_]f32{ 1, 2, 3, 4, 5, 6 }, &x);
    rope(&x, &[_]i32{9}, params);
    try std.testing.expectEqual(@as(f32, 5), x[4]);
    try std.testing.expectEqual(@as(f32, 6), x[5]);
}
