//! Gemma 3n's row ops beside the matmuls (ts/model/gemma3n.ts): AltUp's prediction and
//! correction over its hidden streams (Baykal et al. 2023, "Alternating Updates for Efficient
//! Transformers"), the magnitude matching of projected streams, and gaussian top-k activation
//! sparsity. Each has the obvious scalar loop (…Reference) beside the vectorised one; where the
//! vectors change only which lane adds what (f64 sums of exact f32 products), the two agree bit for
//! bit, and the tests below hold them to that or to a named tolerance.
//!   predict:   out_i = x_i + Σ_s c[i·n + s] · x_s        (c: n² coefficients per row)
//!   correct:   out_i = p_i + (c_i + 1) · (a − p_active)  (c: n coefficients per row)
//!   top-k:     x = relu(x − (mean + m · std)), std over n − 1 as llama.cpp's gemma3n graph
//!   magnitude: x ·= rms(target) / sqrt(max(mean(x²), floor))
const std = @import("std");

const lanes = 8;
const V = @Vector(lanes, f32);
const V64 = @Vector(lanes, f64);

/// AltUp's streams are at most this many (Gemma 3n has 4; the GGUF's altup.num_inputs is
/// bounded by the model's parser).
pub const streams_max = 16;

/// n_rows x n_cols f32 rows of each stream, at its own address.
pub const Streams = struct {
    rows: []const [*]f32,
    n_rows: usize,
    n_cols: usize,
};

pub fn predictReference(x: Streams, coefs: [*]const f32, out: Streams) void {
    const k = x.rows.len;
    const n = x.n_cols;
    for (0..x.n_rows) |r| {
        const c = coefs[r * k * k ..][0 .. k * k];
        for (0..n) |j| {
            const o = r * n + j;
            var column: [streams_max]f32 = undefined;
            for (0..k) |s| column[s] = x.rows[s][o];
            for (0..k) |i| {
                var sum: f64 = 0;
                for (0..k) |s| sum += @as(f64, c[i * k + s]) * @as(f64, column[s]);
                out.rows[i][o] = column[i] + @as(f32, @floatCast(sum));
            }
        }
    }
}

/// Rows begin..end of predictReference, eight columns at a time; each stream's column chunk is
/// read before any is written, so out may be x.
pub fn predict(x: Streams, coefs: [*]const f32, out: Streams, begin: usize, end: usize) void {
    const k = x.rows.len;
    const n = x.n_cols;
    std.debug.assert(k <= streams_max and out.rows.len == k);
    for (begin..end) |r| {
        const c = coefs[r * k * k ..][0 .. k * k];
        var j: usize = 0;
        while (j + lanes <= n) : (j += lanes) {
            const o = r * n + j;
            var column: [streams_max]V64 = undefined;
            var own: [streams_max]V = undefined;
            for (0..k) |s| {
                own[s] = x.rows[s][o..][0..lanes].*;
                column[s] = @floatCast(own[s]);
            }
            for (0..k) |i| {
                var sum: V64 = @splat(0);
                for (0..k) |s| sum += @as(V64, @splat(@as(f64, c[i * k + s]))) * column[s];
                out.rows[i][o..][0..lanes].* = own[i] + @as(V, @floatCast(sum));
            }
        }
        if (j < n) {
            var shifted: [streams_max][*]f32 = undefined;
            var shifted_out: [streams_max][*]f32 = undefined;
            for (0..k) |s| {
                shifted[s] = x.rows[s] + r * n + j;
                shifted_out[s] = out.rows[s] + r * n + j;
            }
            // the row's last columns, as the reference computes them
            const tail_in: Streams = .{ .rows = shifted[0..k], .n_rows = 1, .n_cols = n - j };
            const tail_out: Streams = .{ .rows = shifted_out[0..k], .n_rows = 1, .n_cols = n - j };
            predictReference(tail_in, c.ptr, tail_out);
        }
    }
}

pub fn correctReference(
    p: Streams,
    activated: [*]const f32,
    coefs: [*]const f32,
    active: usize,
    out: Streams,
) void {
    const k = p.rows.len;
    const n = p.n_cols;
    for (0..p.n_rows) |r| {
        var scale: [streams_max]f32 = undefined;
        for (0..k) |i| scale[i] = coefs[r * k + i] + 1;
        for (0..n) |j| {
            const o = r * n + j;
            const innovation = activated[o] - p.rows[active][o];
            for (0..k) |i| out.rows[i][o] = p.rows[i][o] + scale[i] * innovation;
        }
    }
}

/// Rows begin..end of correctReference (the same f32 operations, eight columns at a time); the
/// innovation is formed before any stream is written, so out may be p.
pub fn correct(
    p: Streams,
    activated: [*]const f32,
    coefs: [*]const f32,
    active: usize,
    out: Streams,
    begin: usize,
    end: usize,
) void {
    const k = p.rows.len;
    const n = p.n_cols;
    std.debug.assert(k <= streams_max and out.rows.len == k and active < k);
    for (begin..end) |r| {
        var scale: [streams_max]f32 = undefined;
        for (0..k) |i| scale[i] = coefs[r * k + i] + 1;
        var j: usize = 0;
        while (j + lanes <= n) : (j += lanes) {
            const o = r * n + j;
            const a: V = activated[o..][0..lanes].*;
            const innovation = a - @as(V, p.rows[active][o..][0..lanes].*);
            for (0..k) |i| {
                const pi: V = p.rows[i][o..][0..lanes].*;
                out.rows[i][o..][0..lanes].* = pi + @as(V, @splat(scale[i])) * innovation;
            }
        }
        while (j < n) : (j += 1) {
            const o = r * n + j;
            const innovation = activated[o] - p.rows[active][o];
            for (0..k) |i| out.rows[i][o] = p.rows[i][o] + scale[i] * innovation;
        }
    }
}

/// The row's cutoff mean + multiplier · std, std = sqrt(Σ (x − mean)² / (n − 1)), in f64, as
/// llama.cpp's gaussian_topk (transformers' torch.std(unbiased=False) divides by n).
fn cutoffReference(row: []const f32, multiplier: f32) f32 {
    var sum: f64 = 0;
    for (row) |v| sum += v;
    const n: f64 = @floatFromInt(row.len);
    const mean = sum / n;
    var squares: f64 = 0;
    for (row) |v| squares += (v - mean) * (v - mean);
    return @floatCast(mean + @sqrt(squares / (n - 1)) * multiplier);
}

pub fn gaussianTopKReference(x: []f32, n_cols: usize, multiplier: f32) void {
    var r: usize = 0;
    while (r < x.len) : (r += n_cols) {
        const row = x[r..][0..n_cols];
        const c = cutoffReference(row, multiplier);
        for (row) |*v| v.* = @max(0, v.* - c);
    }
}

fn cutoff(row: []const f32, multiplier: f32) f32 {
    var acc: V64 = @splat(0);
    var j: usize = 0;
    while (j + lanes <= row.len) : (j += lanes) {
        acc += @as(V64, @floatCast(@as(V, row[j..][0..lanes].*)));
    }
    var sum: f64 = @reduce(.Add, acc);
    while (j < row.len) : (j += 1) sum += row[j];
    const n: f64 = @floatFromInt(row.len);
    const mean = sum / n;
    const mean_v: V64 = @splat(mean);
    acc = @splat(0);
    j = 0;
    while (j + lanes <= row.len) : (j += lanes) {
        const d = @as(V64, @floatCast(@as(V, row[j..][0..lanes].*))) - mean_v;
        acc += d * d;
    }
    var squares: f64 = @reduce(.Add, acc);
    while (j < row.len) : (j += 1) squares += (row[j] - mean) * (row[j] - mean);
    return @floatCast(mean + @sqrt(squares / (n - 1)) * multiplier);
}

/// Gaussian top-k of whole rows in place (x.len a multiple of n_cols, n_cols > 1).
pub fn gaussianTopK(x: []f32, n_cols: usize, multiplier: f32) void {
    std.debug.assert(n_cols > 1 and x.len % n_cols == 0);
    var r: usize = 0;
    while (r < x.len) : (r += n_cols) {
        const row = x[r..][0..n_cols];
        const c: V = @splat(cutoff(row, multiplier));
        const zero: V = @splat(0);
        var j: usize = 0;
        while (j + lanes <= n_cols) : (j += lanes) {
            const kept: V = @max(zero, @as(V, row[j..][0..lanes].*) - c);
            row[j..][0..lanes].* = kept;
        }
        const cs = c[0];
        while (j < n_cols) : (j += 1) row[j] = @max(0, row[j] - cs);
    }
}

fn sumSquaresReference(row: []const f32) f64 {
    var sum: f64 = 0;
    for (row) |v| sum += @as(f64, v) * @as(f64, v);
    return sum;
}

fn magnitudeScale(have: f64, want: f64, n: usize, floor: f32) f64 {
    const count: f64 = @floatFromInt(n);
    return @sqrt(want / count) / @sqrt(@max(have / count, floor));
}

pub fn matchMagnitudeReference(x: []f32, target: []const f32, n_cols: usize, floor: f32) void {
    var r: usize = 0;
    while (r < x.len) : (r += n_cols) {
        const row = x[r..][0..n_cols];
        const want = sumSquaresReference(target[r..][0..n_cols]);
        const scale = magnitudeScale(sumSquaresReference(row), want, n_cols, floor);
        for (row) |*v| v.* = @floatCast(@as(f64, v.*) * scale);
    }
}

/// Σ x² with f64 lanes: each square of an f32 is exact in f64, so only the sums' order differs.
fn sumSquares(row: []const f32) f64 {
    var acc: V64 = @splat(0);
    var j: usize = 0;
    while (j + lanes <= row.len) : (j += lanes) {
        const v: V64 = @floatCast(@as(V, row[j..][0..lanes].*));
        acc += v * v;
    }
    var sum: f64 = @reduce(.Add, acc);
    while (j < row.len) : (j += 1) sum += @as(f64, row[j]) * @as(f64, row[j]);
    return sum;
}

/// Rows of x scaled to the magnitude of target's rows (x.len = target.len, whole rows).
pub fn matchMagnitude(x: []f32, target: []const f32, n_cols: usize, floor: f32) void {
    std.debug.assert(n_cols > 0 and x.len % n_cols == 0 and target.len == x.len);
    var r: usize = 0;
    while (r < x.len) : (r += n_cols) {
        const row = x[r..][0..n_cols];
        const want = sumSquares(target[r..][0..n_cols]);
        const scale = magnitudeScale(sumSquares(row), want, n_cols, floor);
        const s: V64 = @splat(scale);
        var j: usize = 0;
        while (j + lanes <= n_cols) : (j += lanes) {
            const v: V64 = @floatCast(@as(V, row[j..][0..lanes].*));
            const scaled: V = @floatCast(v * s);
            row[j..][0..lanes].* = scaled;
        }
        while (j < n_cols) : (j += 1) row[j] = @floatCast(@as(f64, row[j]) * scale);
    }
}

// ---- the plain element ops around them ----------------------------------------------------------

// The C library's tanhf, as ggml_tanh calls it.
extern "c" fn tanhf(x: f32) f32;

pub fn tanhInPlace(x: []f32) void {
    for (x) |*v| v.* = tanhf(v.*);
}

/// Each row of x (n_cols values) times w, element by element.
pub fn mulRows(x: []f32, w: []const f32) void {
    std.debug.assert(w.len > 0 and x.len % w.len == 0);
    var r: usize = 0;
    while (r < x.len) : (r += w.len) {
        for (x[r..][0..w.len], w) |*v, m| v.* *= m;
    }
}

// ---- tests: the vectorised ops against the references on random data, odd sizes -------------

fn randomValues(rand: std.Random, out: []f32, spread: f32) void {
    for (out) |*v| v.* = (rand.float(f32) * 2 - 1) * spread;
}

fn maxRelativeError(a: []const f32, b: []const f32) f64 {
    var diff: f64 = 0;
    var scale: f64 = 0;
    for (a, b) |x, y| {
        diff = @max(diff, @abs(@as(f64, x) - y));
        scale = @max(scale, @abs(@as(f64, y)));
    }
    return if (scale == 0) diff else diff / scale;
}

test "predict and correct equal their references bit for bit (odd widths, 2..5 streams, in place)" {
    var prng = std.Random.DefaultPrng.init(7);
    const rand = prng.random();
    const alloc = std.testing.allocator;
    for ([_]usize{ 1, 7, 8, 13, 61, 256 }) |n_cols| {
        for ([_]usize{ 2, 4, 5 }) |k| {
            const n_rows = 3;
            const size = n_rows * n_cols;
            const buf = try alloc.alloc(f32, 4 * k * size);
            defer alloc.free(buf);
            randomValues(rand, buf, 20);
            var x: [streams_max][*]f32 = undefined;
            var want: [streams_max][*]f32 = undefined;
            var got: [streams_max][*]f32 = undefined;
            var same: [streams_max][*]f32 = undefined;
            for (0..k) |s| {
                x[s] = buf[s * size ..].ptr;
                want[s] = buf[(k + s) * size ..].ptr;
                got[s] = buf[(2 * k + s) * size ..].ptr;
                same[s] = buf[(3 * k + s) * size ..].ptr;
                @memcpy(same[s][0..size], x[s][0..size]);
            }
            var coefs: [3 * streams_max * streams_max]f32 = undefined;
            randomValues(rand, coefs[0 .. n_rows * k * k], 0.3);
            const streams = struct {
                fn of(rows: [][*]f32, n_r: usize, n_c: usize) Streams {
                    return .{ .rows = rows, .n_rows = n_r, .n_cols = n_c };
                }
            };
            const xs = streams.of(x[0..k], n_rows, n_cols);
            const wants = streams.of(want[0..k], n_rows, n_cols);
            const gots = streams.of(got[0..k], n_rows, n_cols);
            const sames = streams.of(same[0..k], n_rows, n_cols);
            predictReference(xs, &coefs, wants);
            predict(xs, &coefs, gots, 0, n_rows);
            predict(sames, &coefs, sames, 0, n_rows);
            for (0..k) |s| {
                try std.testing.expectEqualSlices(f32, want[s][0..size], got[s][0..size]);
                try std.testing.expectEqualSlices(f32, want[s][0..size], same[s][0..size]);
            }
            // correct, with x as the predictions and stream k-1 as the activated rows
            const active = k / 2;
            const activated = x[k - 1];
            for (0..k) |s| @memcpy(same[s][0..size], x[s][0..size]);
            correctReference(xs, activated, &coefs, active, wants);
            correct(xs, activated, &coefs, active, gots, 0, n_rows);
            const activated_copy = try alloc.dupe(f32, activated[0..size]);
            defer alloc.free(activated_copy);
            correct(sames, activated_copy.ptr, &coefs, active, sames, 0, n_rows);
            for (0..k) |s| {
                try std.testing.expectEqualSlices(f32, want[s][0..size], got[s][0..size]);
                try std.testing.expectEqualSlices(f32, want[s][0..size], same[s][0..size]);
            }
        }
    }
}

/// The vectorised sums add the same f64 terms in another order: a cutoff or scale may move by an
/// ulp of f64, which rounds to the same f32 almost always and never further than one f32 ulp.
const row_op_tolerance = 1e-6;

test "gaussian top-k and magnitude matching agree with their references (odd widths)" {
    var prng = std.Random.DefaultPrng.init(11);
    const rand = prng.random();
    const alloc = std.testing.allocator;
    for ([_]usize{ 2, 7, 9, 31, 64, 257, 2049 }) |n_cols| {
        const size = 3 * n_cols;
        const x = try alloc.alloc(f32, size);
        defer alloc.free(x);
        const want = try alloc.alloc(f32, size);
        defer alloc.free(want);
        const target = try alloc.alloc(f32, size);
        defer alloc.free(target);
        randomValues(rand, x, 3);
        randomValues(rand, target, 10);
        @memcpy(want, x);
        gaussianTopKReference(want, n_cols, 1.6448533535003662);
        gaussianTopK(x, n_cols, 1.6448533535003662);
        try std.testing.expect(maxRelativeError(x, want) <= row_op_tolerance);
        // at the 95% quantile some values survive and most do not
        var kept: usize = 0;
        for (x) |v| kept += @intFromBool(v > 0);
        if (n_cols >= 64) try std.testing.expect(kept > 0 and kept < size / 4);

        randomValues(rand, x, 3);
        @memcpy(want, x);
        matchMagnitudeReference(want, target, n_cols, 1e-5);
        matchMagnitude(x, target, n_cols, 1e-5);
        try std.testing.expect(maxRelativeError(x, want) <= row_op_tolerance);
        // each row now has its target's root mean square
        const rms = @sqrt(sumSquares(x[0..n_cols]) / @as(f64, @floatFromInt(n_cols)));
        const want_rms = @sqrt(sumSquares(target[0..n_cols]) / @as(f64, @floatFromInt(n_cols)));
        try std.testing.expectApproxEqRel(want_rms, rms, 1e-6);
    }
}

test "gaussian top-k divides the squares by n - 1" {
    // Row {0, 0, 3}: mean 1, squares 6, std over n − 1 = sqrt(3); cutoff 1 + sqrt(3)·0.5.
    var row = [_]f32{ 0, 0, 3 };
    gaussianTopK(&row, 3, 0.5);
    const c: f32 = @floatCast(1 + @sqrt(3.0) * 0.5);
    try std.testing.expectEqualSlices(f32, &.{ 0, 0, 3 - c }, &row);
}
