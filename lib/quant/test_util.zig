//! Shared checks for the quant formats' inline tests: random weight blocks and activations,
//! fast dot against the scalar reference, and the quantized dot against plain f32 arithmetic.
const std = @import("std");
const simd = @import("simd.zig");

pub const TestRng = simd.TestRng;

/// Random bytes everywhere, then `fixBlock` makes the f16 scale fields finite and moderate.
pub fn randomBlocks(
    comptime Block: type,
    rng: *TestRng,
    out: []Block,
    fixBlock: fn (*Block, *TestRng) void,
) void {
    for (out) |*b| {
        rng.bytes(std.mem.asBytes(b));
        fixBlock(b, rng);
    }
}

/// A random f16 scale in [2^-12, 2^-6) with a random sign when `signed`.
pub fn randomScale(rng: *TestRng, signed: bool) f16 {
    const mag: f32 = (1.0 + rng.float()) * 0.0078125 + 0.0002;
    const neg = signed and (rng.next() & 1) == 1;
    return @floatCast(if (neg) -mag else mag);
}

/// Runs `W` (weight format) against `X` (its activation format) for 1, 3 and 7 blocks:
///  - W.dot == W.dotScalar up to f32 reassociation,
///  - W.dotScalar == f64 dot of dequantized W and dequantized X (the integer path is exact),
///  - and within the activation quantization error of the dot with the original f32 activations.
pub fn checkDot(
    comptime W: type,
    comptime X: type,
    seed: u64,
    fixBlock: fn (*W.Block, *TestRng) void,
) !void {
    const alloc = std.testing.allocator;
    var rng = TestRng.init(seed);
    for ([_]usize{ 1, 3, 7 }) |n_blocks| {
        const n = n_blocks * W.block_values;
        const w = try alloc.alloc(W.Block, n_blocks);
        defer alloc.free(w);
        const xq = try alloc.alloc(X.Block, n / X.block_values);
        defer alloc.free(xq);
        const x = try alloc.alloc(f32, n);
        defer alloc.free(x);
        const wf = try alloc.alloc(f32, n);
        defer alloc.free(wf);
        const xf = try alloc.alloc(f32, n);
        defer alloc.free(xf);

        randomBlocks(W.Block, &rng, w, fixBlock);
        rng.floats(x, 3);
        X.quantize(x, xq);
        W.dequantize(w, wf);
        X.dequantize(xq, xf);

        var exact: f64 = 0; // dequantized weights x dequantized activations
        var original: f64 = 0; // dequantized weights x original activations
        var magnitude: f64 = 0;
        for (wf, xf, x) |a, b, c| {
            exact += @as(f64, a) * b;
            original += @as(f64, a) * c;
            magnitude += @abs(@as(f64, a) * c);
        }
        const fast = W.dot(w, xq);
        const ref = W.dotScalar(w, xq);
        const tight: f64 = 1e-5 * magnitude + 1e-6;
        try std.testing.expectApproxEqAbs(ref, fast, @as(f32, @floatCast(tight)));
        try std.testing.expectApproxEqAbs(exact, @as(f64, ref), tight);
        // 8-bit activations: each |x - xq| <= amax/254, so the error is <~ 1% of sum |w x|.
        try std.testing.expectApproxEqAbs(original, @as(f64, ref), 0.02 * magnitude + 1e-6);
        if (@hasDecl(W, "dotMulti")) try checkDotMulti(W, X, &rng, w, tight);
    }
}

/// W.dotMulti over R = 3 activation rows equals W.dotScalar row by row.
fn checkDotMulti(
    comptime W: type,
    comptime X: type,
    rng: *TestRng,
    w: []const W.Block,
    tight: f64,
) !void {
    const alloc = std.testing.allocator;
    const R = 3;
    const n = w.len * W.block_values;
    const x = try alloc.alloc(f32, n);
    defer alloc.free(x);
    const xq = try alloc.alloc(X.Block, R * (n / X.block_values));
    defer alloc.free(xq);
    var rows: [R][*]align(1) const X.Block = undefined;
    for (0..R) |r| {
        rng.floats(x, 3);
        const row = xq[r * (n / X.block_values) ..][0 .. n / X.block_values];
        X.quantize(x, row);
        rows[r] = row.ptr;
    }
    const got = W.dotMulti(R, w, rows);
    for (0..R) |r| {
        const want = W.dotScalar(w, rows[r][0 .. n / X.block_values]);
        try std.testing.expectApproxEqAbs(want, got[r], @as(f32, @floatCast(tight * 4)));
    }
}

/// W.dotRows (one token over row-major rows) against W.dotGgmlScalar row by row, bit for bit:
/// 11 rows (groups of 4 or 8 and a remainder), 1, 3 and 6 blocks a row, rows a block apart
/// (a row stride past the row's bytes).
pub fn checkDotRows(
    comptime W: type,
    comptime X: type,
    seed: u64,
    fixBlock: fn (*W.Block, *TestRng) void,
) !void {
    var rng = TestRng.init(seed);
    for ([_]usize{ 1, 3, 6 }) |n_blocks| {
        const n_out = 11;
        const stride = n_blocks + 1;
        var w: [n_out * 7]W.Block = undefined;
        randomBlocks(W.Block, &rng, w[0 .. n_out * stride], fixBlock);
        var xf: [6 * 256]f32 = undefined;
        const n = n_blocks * W.block_values;
        rng.floats(xf[0..n], 3);
        var x: [6 * 256 / X.block_values]X.Block = undefined;
        X.quantize(xf[0..n], x[0 .. n / X.block_values]);
        var out: [n_out]f32 = undefined;
        W.dotRows(n_blocks, @ptrCast(&w), stride * @sizeOf(W.Block), n_out, &x, &out);
        for (0..n_out) |o| {
            const want = W.dotGgmlScalar(w[o * stride ..][0..n_blocks], x[0 .. n / X.block_values]);
            try std.testing.expectEqual(@as(u32, @bitCast(want)), @as(u32, @bitCast(out[o])));
        }
    }
}
