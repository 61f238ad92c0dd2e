//! RMS normalisation (Zhang & Sennrich 2019): y = x / sqrt(mean(x²) + eps) · w.
//! Mirrors ggml's ggml_compute_forward_rms_norm_f32 so results track llama.cpp: each square is
//! formed in f32 and summed in f64 (ggml_float), the mean is rounded to f32,
//! scale = 1 / sqrtf(mean + eps), and the weight is applied afterwards as a separate f32
//! multiply (llama.cpp builds rms_norm then ggml_mul), i.e. y = (x · scale) · w.
const std = @import("std");

const lanes = 8;
const V = @Vector(lanes, f32);
const V64 = @Vector(lanes, f64);

/// 1 / sqrt(mean(x²) + eps), the obvious sequential loop.
pub fn rowScaleReference(x: []const f32, eps: f32) f32 {
    var sum: f64 = 0;
    for (x) |v| sum += @as(f64, v * v);
    const mean: f32 = @floatCast(sum / @as(f64, @floatFromInt(x.len)));
    return 1.0 / @sqrt(mean + eps);
}

/// Same value as rowScaleReference; the f64 lanes make the summation order immaterial.
pub fn rowScale(x: []const f32, eps: f32) f32 {
    var acc: V64 = @splat(0);
    var i: usize = 0;
    while (i + lanes <= x.len) : (i += lanes) {
        const v: V = x[i..][0..lanes].*;
        acc += @as(V64, @floatCast(v * v));
    }
    var sum: f64 = @reduce(.Add, acc);
    while (i < x.len) : (i += 1) sum += @as(f64, x[i] * x[i]);
    const mean: f32 = @floatCast(sum / @as(f64, @floatFromInt(x.len)));
    return 1.0 / @sqrt(mean + eps);
}

/// out = (x · scale) · w per row; `weight` null means no weight. `out` may alias `x`.
pub fn rmsNormReference(
    x: []const f32,
    weight: ?[]const f32,
    n_cols: usize,
    eps: f32,
    out: []f32,
) void {
    var row: usize = 0;
    while (row * n_cols < x.len) : (row += 1) {
        const xr = x[row * n_cols ..][0..n_cols];
        const yr = out[row * n_cols ..][0..n_cols];
        const scale = rowScaleReference(xr, eps);
        for (xr, yr, 0..) |v, *y, c| {
            const scaled = v * scale;
            y.* = if (weight) |w| scaled * w[c] else scaled;
        }
    }
}

pub fn rmsNorm(x: []const f32, weight: ?[]const f32, n_cols: usize, eps: f32, out: []f32) void {
    std.debug.assert(n_cols > 0 and x.len % n_cols == 0 and out.len == x.len);
    const n_rows = x.len / n_cols;
    for (0..n_rows) |row| {
        const xr = x[row * n_cols ..][0..n_cols];
        const yr = out[row * n_cols ..][0..n_cols];
        const scale = rowScale(xr, eps);
        const scale_v: V = @splat(scale);
        var i: usize = 0;
        while (i + lanes <= n_cols) : (i += lanes) {
            const v: V = xr[i..][0..lanes].*;
            var y = v * scale_v;
            if (weight) |w| y *= @as(V, w[i..][0..lanes].*);
            yr[i..][0..lanes].* = y;
        }
        while (i < n_cols) : (i += 1) {
            const scaled = xr[i] * scale;
            yr[i] = if (weight) |w| scaled * w[i] else scaled;
        }
    }
}

/// residual += (x · scale) · w per row: Gemma's post-norm fused with the residual add.
pub fn rmsNormAddReference(
    x: []const f32,
    weight: []const f32,
    n_cols: usize,
    eps: f32,
    residual: []f32,
) void {
    var row: usize = 0;
    while (row * n_cols < x.len) : (row += 1) {
        const xr = x[row * n_cols ..][0..n_cols];
        const rr = residual[row * n_cols ..][0..n_cols];
        const scale = rowScaleReference(xr, eps);
        for (xr, rr, weight[0..n_cols]) |v, *r, w| r.* += (v * scale) * w;
    }
}

pub fn rmsNormAdd(
    x: []const f32,
    weight: []const f32,
    n_cols: usize,
    eps: f32,
    residual: []f32,
) void {
    std.debug.assert(n_cols > 0 and x.len % n_cols == 0 and residual.len == x.len);
    const n_rows = x.len / n_cols;
    for (0..n_rows) |row| {
        const xr = x[row * n_cols ..][0..n_cols];
        const rr = residual[row * n_cols ..][0..n_cols];
        const scale = rowScale(xr, eps);
        const scale_v: V = @splat(scale);
        var i: usize = 0;
        while (i + lanes <= n_cols) : (i += lanes) {
            const v: V = xr[i..][0..lanes].*;
            const w: V = weight[i..][0..lanes].*;
            const r: V = rr[i..][0..lanes].*;
            rr[i..][0..lanes].* = r + (v * scale_v) * w;
        }
        while (i < n_cols) : (i += 1) rr[i] += (xr[i] * scale) * weight[i];
    }
}

// ---- tests ---------------------------------------------------------------------------------

const test_sizes = [_]usize{ 1, 7, 31, 33, 257, 640 };

fn fillRandom(rand: std.Random, xs: []f32) void {
    for (xs) |*x| x.* = rand.float(f32) * 4 - 2;
}

fn expectClose(expected: []const f32, actual: []const f32, tol: f32) !void {
    for (expected, actual) |e, a| {
        if (@abs(e - a) > tol * @max(1.0, @abs(e))) {
            std.debug.print("expected {d}, got {d}\n", .{ e, a });
            return error.TestExpectedApproxEq;
        }
    }
}

test "rms_norm fast path matches the scalar reference" {
    const gpa = std.testing.allocator;
    var prng = std.Random.DefaultPrng.init(1);
    const rand = prng.random();
    for (test_sizes) |n_cols| {
        const n_rows = 3;
        const x = try gpa.alloc(f32, n_rows * n_cols);
        defer gpa.free(x);
        const w = try gpa.alloc(f32, n_cols);
        defer gpa.free(w);
        const want = try gpa.alloc(f32, x.len);
        defer gpa.free(want);
        const got = try gpa.alloc(f32, x.len);
        defer gpa.free(got);
        fillRandom(rand, x);
        fillRandom(rand, w);
        rmsNormReference(x, w, n_cols, 1e-6, want);
        rmsNorm(x, w, n_cols, 1e-6, got);
        try expectClose(want, got, 1e-6);
        rmsNormReference(x, null, n_cols, 1e-6, want);
        rmsNorm(x, null, n_cols, 1e-6, got);
        try expectClose(want, got, 1e-6);
        // In place: out aliases x.
        @memcpy(got, x);
        rmsNorm(got, null, n_cols, 1e-6, got);
        try expectClose(want, got, 1e-6);
    }
}

test "rms_norm_add fast path matches the scalar reference" {
    const gpa = std.testing.allocator;
    var prng = std.Random.DefaultPrng.init(2);
    const rand = prng.random();
    for (test_sizes) |n_cols| {
        const n_rows = 2;
        const x = try gpa.alloc(f32, n_rows * n_cols);
        defer gpa.free(x);
        const w = try gpa.alloc(f32, n_cols);
        defer gpa.free(w);
        const want = try gpa.alloc(f32, x.len);
        defer gpa.free(want);
        const got = try gpa.alloc(f32, x.len);
        defer gpa.free(got);
        fillRandom(rand, x);
        fillRandom(rand, w);
        fillRandom(rand, want);
        @memcpy(got, want);
        rmsNormAddReference(x, w, n_cols, 1e-6, want);
        rmsNormAdd(x, w, n_cols, 1e-6, got);
        try expectClose(want, got, 1e-6);
    }
}

test "rms of a constant row is exact" {
    var x = [_]f32{ 3, 3, 3, 3, 3, 3, 3, 3, 3 };
    rmsNorm(&x, null, x.len, 0, &x);
    for (x) |v| try std.testing.expectApproxEqAbs(@as(f32, 1), v, 1e-7);
}
