//! Element-wise ops: gated activations (Shazeer 2020, "GLU Variants Improve Transformer"),
//! softmax, add, scale.
//!   gelu_tanh(x) = 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))   (Hendrycks & Gimpel 2016)
//!   silu(x)      = x / (1 + e^-x)                                   (Elfwing et al. 2017)
//! GELU follows llama.cpp's CPU numerics (GGML_GELU_FP16): the input is rounded to f16 and
//! the result read from a 65,536-entry f16 table of gelu_tanh, with x <= -10 → 0 and x >= 10 → x.
//! The rounding moves logits by ~1e-2 against exact f32; reproducing it (down to libc's tanhf)
//! keeps greedy tokens equal to llama.cpp's. The scalar reference computes it without the table.
const std = @import("std");

const lanes = 8;
const V = @Vector(lanes, f32);
const L16 = @Vector(16, f32);
const expV = @import("expf.zig").expV;

// The C library's tanhf, as ggml's table init calls it (ggml_gelu_f32): an f64 tanh rounds a few
// of the 65,536 table entries differently.
extern "c" fn tanhf(x: f32) f32;

/// ggml_gelu_f32 operation for operation, in f32: 0.5f*x*(1.0f + tanhf(S*x*(1.0f + A*x*x))),
/// with `1.0f + A*x*x` contracted into fma(A*x, x, 1) as the compiled ggml has it (it decides
/// one ulp of the f16 entry for some inputs, e.g. x = -1.999).
fn geluTanh(x: f32) f32 {
    const sqrt_2_over_pi: f32 = 0.79788456080286535587989211986876;
    const coef_a: f32 = 0.044715;
    return 0.5 * x * (1.0 + tanhf(sqrt_2_over_pi * x * @mulAdd(f32, coef_a * x, x, 1.0)));
}

pub fn geluReference(x: f32) f32 {
    if (x <= -10) return 0;
    if (x >= 10) return x;
    const h: f16 = @floatCast(x);
    const y: f16 = @floatCast(geluTanh(h));
    return y;
}

var gelu_table: [1 << 16]f16 = undefined;
var gelu_table_once = std.once(buildGeluTable);

fn buildGeluTable() void {
    for (&gelu_table, 0..) |*entry, i| {
        const h: f16 = @bitCast(@as(u16, @intCast(i)));
        entry.* = @floatCast(geluTanh(h));
    }
}

fn gelu(x: f32) f32 {
    if (x <= -10) return 0;
    if (x >= 10) return x;
    const h: f16 = @floatCast(x);
    return gelu_table[@as(u16, @bitCast(h))];
}

pub fn siluReference(x: f32) f32 {
    const xd: f64 = x;
    return @floatCast(xd / (1 + @exp(-xd)));
}

/// ggml_v_silu: x / (1 + ggml_v_expf(0 - x)), 16 lanes (lib/cpu/expf.zig). ggml's swiglu takes
/// whole 16-value blocks so, and the rest one value at a time with libm's expf (silu below).
fn siluV(x: L16) L16 {
    return x / (@as(L16, @splat(1)) + expV(@as(L16, @splat(0)) - x));
}

fn silu(x: f32) f32 {
    return x / (1 + @exp(-x));
}

pub const Gate = enum { gelu_tanh, silu, swiglu_oai };

extern "c" fn expf(x: f32) f32;

/// gpt-oss's SwiGLU constants (llama.cpp's LLM_FFN_SWIGLU_OAI_MOE, transformers' GptOssExperts).
pub const oai_alpha: f32 = 1.702;
pub const oai_limit: f32 = 7.0;

/// ggml_compute_forward_swiglu_oai_f32, one value: the gate clamped above, the up clamped both
/// ways and shifted by one, libm's expf as ggml calls it.
pub fn swigluOai(g: f32, u: f32) f32 {
    const x = @min(g, oai_limit);
    const y = std.math.clamp(u, -oai_limit, oai_limit);
    const glu = x / (1 + expf(oai_alpha * (-x)));
    return glu * (y + 1);
}

pub fn swigluOaiReference(g: f32, u: f32) f32 {
    const x: f64 = @min(g, oai_limit);
    const y: f64 = std.math.clamp(u, -oai_limit, oai_limit);
    return @floatCast(x / (1 + @exp(-@as(f64, oai_alpha) * x)) * (y + 1));
}

/// out = act(gate) · up; `out` may alias `gate` or `up`.
pub fn gatedReference(kind: Gate, gate: []const f32, up: []const f32, out: []f32) void {
    for (gate, up, out) |g, u, *o| {
        o.* = switch (kind) {
            .gelu_tanh => geluReference(g) * u,
            .silu => siluReference(g) * u,
            .swiglu_oai => swigluOaiReference(g, u),
        };
    }
}

pub fn gated(kind: Gate, gate: []const f32, up: []const f32, out: []f32) void {
    std.debug.assert(gate.len == up.len and out.len == gate.len);
    if (kind == .gelu_tanh) gelu_table_once.call();
    var i: usize = 0;
    switch (kind) {
        .gelu_tanh => while (i + lanes <= gate.len) : (i += lanes) {
            const g: V = gate[i..][0..lanes].*;
            const u: V = up[i..][0..lanes].*;
            var r: V = undefined; // table lookups: no vector gather worth having here
            inline for (0..lanes) |l| r[l] = gelu(g[l]);
            out[i..][0..lanes].* = r * u;
        },
        .silu => while (i + 16 <= gate.len) : (i += 16) {
            const g: L16 = gate[i..][0..16].*;
            const u: L16 = up[i..][0..16].*;
            out[i..][0..16].* = siluV(g) * u;
        },
        .swiglu_oai => {}, // one value at a time below, as ggml computes it
    }
    while (i < gate.len) : (i += 1) {
        out[i] = switch (kind) {
            .gelu_tanh => gelu(gate[i]) * up[i],
            .silu => silu(gate[i]) * up[i],
            .swiglu_oai => swigluOai(gate[i], up[i]),
        };
    }
}

/// Row-wise softmax in place, as ggml_soft_max: subtract the max, exp in f32, sum in f64.
pub fn softmaxReference(x: []f32, n_cols: usize) void {
    var row: usize = 0;
    while (row * n_cols < x.len) : (row += 1) {
        const r = x[row * n_cols ..][0..n_cols];
        var max: f32 = -std.math.inf(f32);
        for (r) |v| max = @max(max, v);
        var sum: f64 = 0;
        for (r) |*v| {
            v.* = @exp(v.* - max);
            sum += v.*;
        }
        const inv: f32 = @floatCast(1 / sum);
        for (r) |*v| v.* *= inv;
    }
}

pub fn softmax(x: []f32, n_cols: usize) void {
    std.debug.assert(n_cols > 0 and x.len % n_cols == 0);
    for (0..x.len / n_cols) |row| {
        const r = x[row * n_cols ..][0..n_cols];
        var max_v: V = @splat(-std.math.inf(f32));
        var i: usize = 0;
        while (i + lanes <= n_cols) : (i += lanes) max_v = @max(max_v, @as(V, r[i..][0..lanes].*));
        var max = @reduce(.Max, max_v);
        while (i < n_cols) : (i += 1) max = @max(max, r[i]);
        const max_s: V = @splat(max);
        var sum_v: @Vector(lanes, f64) = @splat(0);
        i = 0;
        while (i + lanes <= n_cols) : (i += lanes) {
            const e = @exp(@as(V, r[i..][0..lanes].*) - max_s);
            r[i..][0..lanes].* = e;
            sum_v += @as(@Vector(lanes, f64), @floatCast(e));
        }
        var sum: f64 = @reduce(.Add, sum_v);
        while (i < n_cols) : (i += 1) {
            r[i] = @exp(r[i] - max);
            sum += r[i];
        }
        scale(r, @floatCast(1 / sum));
    }
}

pub fn add(a: []const f32, b: []const f32, out: []f32) void {
    std.debug.assert(a.len == b.len and out.len == a.len);
    var i: usize = 0;
    while (i + lanes <= a.len) : (i += lanes) {
        out[i..][0..lanes].* = @as(V, a[i..][0..lanes].*) + @as(V, b[i..][0..lanes].*);
    }
    while (i < a.len) : (i += 1) out[i] = a[i] + b[i];
}

pub fn scale(x: []f32, s: f32) void {
    const s_v: V = @splat(s);
    var i: usize = 0;
    while (i + lanes <= x.len) : (i += lanes) x[i..][0..lanes].* = @as(V, x[i..][0..lanes].*) * s_v;
    while (i < x.len) : (i += 1) x[i] *= s;
}

// ---- tests ---------------------------------------------------------------------------------

const test_sizes = [_]usize{ 1, 7, 31, 33, 257, 640 };

fn expectClose(expected: []const f32, actual: []const f32, tol: f32) !void {
    for (expected, actual) |e, a| {
        if (@abs(e - a) > tol * @max(1.0, @abs(e))) {
            std.debug.print("expected {d}, got {d}\n", .{ e, a });
            return error.TestExpectedApproxEq;
        }
    }
}

test "gated activations match the f64 reference" {
    const gpa = std.testing.allocator;
    var prng = std.Random.DefaultPrng.init(4);
    const rand = prng.random();
    for (test_sizes) |n| {
        const gate = try gpa.alloc(f32, n);
        defer gpa.free(gate);
        const up = try gpa.alloc(f32, n);
        defer gpa.free(up);
        const want = try gpa.alloc(f32, n);
        defer gpa.free(want);
        const got = try gpa.alloc(f32, n);
        defer gpa.free(got);
        for (gate) |*x| x.* = rand.float(f32) * 24 - 12;
        for (up) |*x| x.* = rand.float(f32) * 2 - 1;
        if (n > 1) gate[0] = -100; // exp overflows to inf: the result must be -0, not NaN
        for ([_]Gate{ .gelu_tanh, .silu, .swiglu_oai }) |kind| {
            gatedReference(kind, gate, up, want);
            gated(kind, gate, up, got);
            try expectClose(want, got, 2e-6);
            @memcpy(got, gate);
            gated(kind, got, up, got); // out aliases gate
            try expectClose(want, got, 2e-6);
        }
    }
}

test "swiglu_oai clamps the gate above and the up both ways" {
    // g = 9 → 7 · σ(11.914); u = -9 → -7 + 1 = -6; u = 9 → 8.
    const want_hi: f32 = 7.0 / (1.0 + @exp(-1.702 * 7.0));
    try std.testing.expectApproxEqRel(want_hi * -6, swigluOai(9, -9), 1e-6);
    try std.testing.expectApproxEqRel(want_hi * 8, swigluOai(100, 9), 1e-6);
    // A very negative gate is not clamped below: its GLU goes to -0 and the product stays finite.
    try std.testing.expect(swigluOai(-1000, 3) == 0);
    try std.testing.expectApproxEqRel(swigluOaiReference(0.5, 0.25), swigluOai(0.5, 0.25), 1e-6);
}

test "softmax, add and scale match the scalar loops" {
    const gpa = std.testing.allocator;
    var prng = std.Random.DefaultPrng.init(5);
    const rand = prng.random();
    for (test_sizes) |n| {
        const x = try gpa.alloc(f32, 2 * n);
        defer gpa.free(x);
        const y = try gpa.alloc(f32, 2 * n);
        defer gpa.free(y);
        for (x) |*v| v.* = rand.float(f32) * 20 - 10;
        @memcpy(y, x);
        softmaxReference(x, n);
        softmax(y, n);
        try expectClose(x, y, 1e-6);
        var row_sum: f32 = 0;
        for (y[0..n]) |v| row_sum += v;
        try std.testing.expectApproxEqAbs(@as(f32, 1), row_sum, 1e-5);

        @memcpy(y, x);
        add(x, y, y);
        for (x, y) |a, b| try std.testing.expectEqual(a + a, b);
        scale(y, 0.5);
        try expectClose(x, y, 0);
    }
}
