//! Gemma 3n's ops on the C surface: AltUp's predict and correct over tables of stream addresses,
//! gaussian top-k sparsity, magnitude matching and the small row ops its graph needs
//! (lib/cpu/altup.zig), run across the CPU's pool as the other f32 ops are.
const abi = @import("../abi.zig");
const altup = @import("../cpu/altup.zig");
const cpu_threads = @import("../cpu/threads.zig");
const ops = @import("cpu.zig");
const opsInvalid = ops.opsInvalid;
const rowsPerTask = ops.rowsPerTask;
const opsCount = ops.opsCount;
const quantInvalid = ops.quantInvalid;

/// The streams of an AltUp call as slices, or null after recording why.
fn altupStreams(
    table: ?[*]const u64,
    s: abi.AltUpShape,
    what: []const u8,
    out: *[altup.streams_max][*]f32,
) ?altup.Streams {
    const t = table orelse {
        _ = opsInvalid("altup: {s} is null", .{what});
        return null;
    };
    if (s.n_streams < 2 or s.n_streams > altup.streams_max or s.n_cols == 0) {
        _ = opsInvalid("altup: {d} streams of {d} values (2..{d} streams)", .{
            s.n_streams, s.n_cols, altup.streams_max,
        });
        return null;
    }
    _ = opsCount(s.n_rows, s.n_cols) orelse {
        _ = opsInvalid("altup: {d} x {d} overflows", .{ s.n_rows, s.n_cols });
        return null;
    };
    const k: usize = @intCast(s.n_streams);
    for (0..k) |i| {
        if (t[i] == 0) {
            _ = opsInvalid("altup: {s} stream {d} is null", .{ what, i });
            return null;
        }
        out[i] = @ptrFromInt(@as(usize, @intCast(t[i])));
    }
    return .{ .rows = out[0..k], .n_rows = @intCast(s.n_rows), .n_cols = @intCast(s.n_cols) };
}

/// AltUp's prediction (abi.AltUpShape): out_i = x_i + Σ_s coefs[r][i·n + s] · x_s for each row r,
/// coefs n_rows x n² values; out may be x.
export fn infer_altup_predict(
    x: ?[*]const u64,
    coefs: ?[*]const f32,
    out: ?[*]const u64,
    shape: *const abi.AltUpShape,
) i32 {
    const s = shape.*;
    var x_rows: [altup.streams_max][*]f32 = undefined;
    var out_rows: [altup.streams_max][*]f32 = undefined;
    const xs = altupStreams(x, s, "x", &x_rows) orelse return quantInvalid();
    const os = altupStreams(out, s, "out", &out_rows) orelse return quantInvalid();
    const Rows = struct {
        x: altup.Streams,
        c: [*]const f32,
        out: altup.Streams,
        fn range(r: *const @This(), begin: usize, end: usize) void {
            altup.predict(r.x, r.c, r.out, begin, end);
        }
    };
    const c = coefs orelse return opsInvalid("altup_predict: coefs is null", .{});
    const rows: Rows = .{ .x = xs, .c = c, .out = os };
    cpu_threads.runRanges(xs.n_rows, 1, rowsPerTask(s.n_cols * s.n_streams), &rows, Rows.range);
    return 0;
}

/// AltUp's correction (abi.AltUpShape): out_i = p_i + (coefs[r][i] + 1) · (activated − p_active)
/// for each row r, coefs n_rows x n values; out may be p.
export fn infer_altup_correct(
    p: ?[*]const u64,
    activated: ?[*]const f32,
    coefs: ?[*]const f32,
    out: ?[*]const u64,
    shape: *const abi.AltUpShape,
) i32 {
    const s = shape.*;
    if (s.active >= s.n_streams) {
        return opsInvalid("altup_correct: active stream {d} of {d}", .{ s.active, s.n_streams });
    }
    var p_rows: [altup.streams_max][*]f32 = undefined;
    var out_rows: [altup.streams_max][*]f32 = undefined;
    const ps = altupStreams(p, s, "predictions", &p_rows) orelse return quantInvalid();
    const os = altupStreams(out, s, "out", &out_rows) orelse return quantInvalid();
    const Rows = struct {
        p: altup.Streams,
        a: [*]const f32,
        c: [*]const f32,
        active: usize,
        out: altup.Streams,
        fn range(r: *const @This(), begin: usize, end: usize) void {
            altup.correct(r.p, r.a, r.c, r.active, r.out, begin, end);
        }
    };
    const rows: Rows = .{
        .p = ps,
        .a = activated orelse return opsInvalid("altup_correct: activated is null", .{}),
        .c = coefs orelse return opsInvalid("altup_correct: coefs is null", .{}),
        .active = @intCast(s.active),
        .out = os,
    };
    cpu_threads.runRanges(ps.n_rows, 1, rowsPerTask(s.n_cols * s.n_streams), &rows, Rows.range);
    return 0;
}

/// Gaussian top-k sparsity in place: each row x = relu(x − (mean + multiplier · std)), std with
/// the squares over n_cols − 1 (llama.cpp's gemma3n graph).
export fn infer_gaussian_top_k(x: [*]f32, n_rows: u64, n_cols: u64, multiplier: f32) i32 {
    if (n_cols < 2) return opsInvalid("gaussian_top_k: n_cols must be > 1", .{});
    _ = opsCount(n_rows, n_cols) orelse
        return opsInvalid("gaussian_top_k: {d} x {d} overflows", .{ n_rows, n_cols });
    const Rows = struct {
        x: [*]f32,
        n_cols: usize,
        m: f32,
        fn range(r: *const @This(), begin: usize, end: usize) void {
            altup.gaussianTopK(r.x[begin * r.n_cols .. end * r.n_cols], r.n_cols, r.m);
        }
    };
    const rows: Rows = .{ .x = x, .n_cols = @intCast(n_cols), .m = multiplier };
    cpu_threads.runRanges(@intCast(n_rows), 1, rowsPerTask(n_cols), &rows, Rows.range);
    return 0;
}

/// Each row of x scaled to the root mean square of target's row: x ·= rms(target) /
/// sqrt(max(mean(x²), floor)).
export fn infer_match_magnitude(
    x: [*]f32,
    target: [*]const f32,
    n_rows: u64,
    n_cols: u64,
    floor: f32,
) i32 {
    if (n_cols == 0) return opsInvalid("match_magnitude: n_cols must be > 0", .{});
    const n = opsCount(n_rows, n_cols) orelse
        return opsInvalid("match_magnitude: {d} x {d} overflows", .{ n_rows, n_cols });
    altup.matchMagnitude(x[0..n], target[0..n], @intCast(n_cols), floor);
    return 0;
}

/// x = tanh(x) in place (libm's tanhf, as ggml_tanh).
export fn infer_tanh(x: [*]f32, n: u64) i32 {
    altup.tanhInPlace(x[0..@intCast(n)]);
    return 0;
}

/// Each row of x (n_cols values) times w element by element, in place.
export fn infer_mul_rows(x: [*]f32, w: [*]const f32, n_rows: u64, n_cols: u64) i32 {
    if (n_cols == 0) return opsInvalid("mul_rows: n_cols must be > 0", .{});
    const n = opsCount(n_rows, n_cols) orelse
        return opsInvalid("mul_rows: {d} x {d} overflows", .{ n_rows, n_cols });
    altup.mulRows(x[0..n], w[0..@intCast(n_cols)]);
    return 0;
}

/// Row r of dst (dst_cols values) = columns first .. first + dst_cols − 1 of row r of src.
export fn infer_copy_columns(
    src: [*]const f32,
    src_cols: u64,
    first: u64,
    n_rows: u64,
    dst: [*]f32,
    dst_cols: u64,
) i32 {
    if (first > src_cols or dst_cols > src_cols - first) {
        return opsInvalid("copy_columns: columns {d}..{d} of {d}", .{
            first, first +| dst_cols, src_cols,
        });
    }
    const sc: usize = @intCast(src_cols);
    const dc: usize = @intCast(dst_cols);
    const f: usize = @intCast(first);
    for (0..@intCast(n_rows)) |r| @memcpy(dst[r * dc ..][0..dc], src[r * sc + f ..][0..dc]);
    return 0;
}
