//! Picking tokens from a row of logits: the first maximum (greedy), the k largest (top-k), the
//! logits at or above a floor (min-p, top-p), softmax sums and a draw from the softmax over the
//! whole row (sampling with nothing cut, as an OpenAI request's defaults ask). A vocabulary of
//! 262,144 logits is a megabyte; in JavaScript the sampler took 0.11 ms a row for greedy, 0.39 ms
//! with llama.cpp's defaults, 2.3 ms with nothing cut and 145 ms for top-p alone (a sort of the
//! whole row), next to a batched server step of ~30 ms for eight streams (bun bench/sampling.ts,
//! bench/results/server.md).
//!
//! Semantics, shared by the scalar references and the fast paths:
//!   - argmax: the lowest index holding the largest value; NaN never wins, and a row with
//!     nothing above -inf gives 0;
//!   - topK: the k largest values that are neither -inf nor NaN, best first, equal values in
//!     index order (so topK with k = 1 is argmax);
//!   - softmax weights exp((x - max) · scale) come from ggml's vector expf (attention_f16.expV,
//!     ~1 ulp), 0 for -inf and NaN, and are summed in f64.
const std = @import("std");

const lanes = 16;
const V = @Vector(lanes, f32);
const Vi = @Vector(lanes, u32);
const Vd = @Vector(lanes, f64);
const expV = @import("expf.zig").expV;

pub fn argmaxScalar(x: []const f32) usize {
    var best: usize = 0;
    var best_value: f32 = -std.math.inf(f32);
    for (x, 0..) |v, i| {
        if (v > best_value) {
            best = i;
            best_value = v;
        }
    }
    return best;
}

/// Each lane keeps its own first maximum (strict >, so its lowest index); the lanes are merged
/// by value, then index.
pub fn argmax(x: []const f32) usize {
    const none = std.math.maxInt(u32);
    const step: Vi = @splat(lanes);
    var index: Vi = std.simd.iota(u32, lanes);
    var best_value: V = @splat(-std.math.inf(f32));
    var best_index: Vi = @splat(none);
    var i: usize = 0;
    while (i + lanes <= x.len) : (i += lanes) {
        const v: V = x[i..][0..lanes].*;
        const better = v > best_value;
        best_value = @select(f32, better, v, best_value);
        best_index = @select(u32, better, index, best_index);
        index += step;
    }
    var best: usize = 0;
    var value: f32 = -std.math.inf(f32);
    inline for (0..lanes) |l| {
        const li: usize = best_index[l];
        if (li != none and (best_value[l] > value or (best_value[l] == value and li < best))) {
            best = li;
            value = best_value[l];
        }
    }
    while (i < x.len) : (i += 1) {
        if (x[i] > value) {
            best = i;
            value = x[i];
        }
    }
    return best;
}

/// A best-first list of at most k (value, index) pairs; an index arriving later than the
/// others goes after those of equal value.
const Kept = struct {
    ids: []i32,
    values: []f32,
    n: usize = 0,

    fn insert(self: *Kept, v: f32, i: usize) void {
        const k = self.ids.len;
        var j = if (self.n < k) self.n else k - 1;
        if (self.n < k) self.n += 1;
        while (j > 0 and self.values[j - 1] < v) : (j -= 1) {
            self.values[j] = self.values[j - 1];
            self.ids[j] = self.ids[j - 1];
        }
        self.values[j] = v;
        self.ids[j] = @intCast(i);
    }

    /// Values at or below this cannot enter: -inf until the list is full.
    fn floor(self: *const Kept) f32 {
        return if (self.n < self.ids.len) -std.math.inf(f32) else self.values[self.n - 1];
    }
};

/// ids[0..count) and values[0..count): see the file's comment. ids and values hold k each.
pub fn topKScalar(x: []const f32, ids: []i32, values: []f32) usize {
    std.debug.assert(ids.len == values.len and ids.len > 0);
    var kept = Kept{ .ids = ids, .values = values };
    for (x, 0..) |v, i| if (v > kept.floor()) kept.insert(v, i);
    return kept.n;
}

/// As topKScalar. Once the list is full almost every block of 16 logits holds none above its
/// floor, which one compare and one mask test find.
pub fn topK(x: []const f32, ids: []i32, values: []f32) usize {
    std.debug.assert(ids.len == values.len and ids.len > 0);
    var kept = Kept{ .ids = ids, .values = values };
    var i: usize = 0;
    while (i + lanes <= x.len) : (i += lanes) {
        const v: V = x[i..][0..lanes].*;
        var candidates: u16 = @bitCast(v > @as(V, @splat(kept.floor())));
        while (candidates != 0) : (candidates &= candidates - 1) {
            const l = @ctz(candidates);
            const value = x[i + l];
            // The floor rises as the list fills: the lanes after the first are checked again.
            if (value > kept.floor()) kept.insert(value, i + l);
        }
    }
    while (i < x.len) : (i += 1) if (x[i] > kept.floor()) kept.insert(x[i], i);
    return kept.n;
}

/// Below this exp's result is 0 in f32 (and expV's range reduction would need |n| > 192).
const exp_floor: f32 = -200;

fn weightScalar(v: f32, max: f32, scale: f32) f32 {
    const t = (v - max) * scale;
    if (!(t >= exp_floor)) return 0;
    return @floatCast(@exp(@as(f64, t)));
}

inline fn weights(v: V, max: f32, scale: f32) V {
    const t = (v - @as(V, @splat(max))) * @as(V, @splat(scale));
    // -inf, NaN and the far tail go in as exp_floor, whose expV is 0.
    return expV(@select(f32, t >= @as(V, @splat(exp_floor)), t, @as(V, @splat(exp_floor))));
}

inline fn weightAt(x: []const f32, i: usize, max: f32, scale: f32) f32 {
    var v: V = @splat(-std.math.inf(f32));
    v[0] = x[i];
    return weights(v, max, scale)[0];
}

pub fn expSumScalar(x: []const f32, max: f32, scale: f32, floor: f32) f64 {
    var sum: f64 = 0;
    for (x) |v| if (v >= floor) {
        sum += weightScalar(v, max, scale);
    };
    return sum;
}

/// The sum of exp((x - max) · scale) over the x at or above `floor` (-inf: every finite x).
pub fn expSum(x: []const f32, max: f32, scale: f32, floor: f32) f64 {
    var acc: Vd = @splat(0);
    const floor_v: V = @splat(floor);
    var i: usize = 0;
    while (i + lanes <= x.len) : (i += lanes) {
        const v: V = x[i..][0..lanes].*;
        const w = @select(f32, v >= floor_v, weights(v, max, scale), @as(V, @splat(0)));
        acc += @as(Vd, w);
    }
    var sum = @reduce(.Add, acc);
    while (i < x.len) : (i += 1) if (x[i] >= floor) {
        sum += weightAt(x, i, max, scale);
    };
    return sum;
}

/// The first index at which the running sum of exp((x - max) · scale) reaches `target` (a
/// uniform draw times expSum's total), skipping zero weights; where rounding leaves the target
/// just out of reach, the last index of non-zero weight.
pub fn draw(x: []const f32, max: f32, scale: f32, target: f64) usize {
    var sum: f64 = 0;
    var last: usize = 0;
    var i: usize = 0;
    while (i + lanes <= x.len) : (i += lanes) {
        const w = weights(x[i..][0..lanes].*, max, scale);
        const block: f64 = @reduce(.Add, @as(Vd, w));
        if (block == 0) continue;
        if (sum + block < target) {
            sum += block;
            inline for (0..lanes) |l| if (w[l] > 0) {
                last = i + l;
            };
            continue;
        }
        inline for (0..lanes) |l| if (w[l] > 0) {
            sum += w[l];
            last = i + l;
            if (sum >= target) return last;
        };
    }
    while (i < x.len) : (i += 1) {
        const w = weightAt(x, i, max, scale);
        if (w == 0) continue;
        sum += w;
        last = i;
        if (sum >= target) return last;
    }
    return last;
}

pub fn drawScalar(x: []const f32, max: f32, scale: f32, target: f64) usize {
    var sum: f64 = 0;
    var last: usize = 0;
    for (x, 0..) |v, i| {
        const w = weightScalar(v, max, scale);
        if (w == 0) continue;
        sum += w;
        last = i;
        if (sum >= target) return i;
    }
    return last;
}

/// ids[0..count) := the indices of the x at or above `floor`, in index order (ids holds x.len).
pub fn above(x: []const f32, floor: f32, ids: []i32) usize {
    var n: usize = 0;
    var i: usize = 0;
    while (i + lanes <= x.len) : (i += lanes) {
        const v: V = x[i..][0..lanes].*;
        var hits: u16 = @bitCast(v >= @as(V, @splat(floor)));
        while (hits != 0) : (hits &= hits - 1) {
            ids[n] = @intCast(i + @ctz(hits));
            n += 1;
        }
    }
    while (i < x.len) : (i += 1) if (x[i] >= floor) {
        ids[n] = @intCast(i);
        n += 1;
    };
    return n;
}

/// The index of the first value that is NaN or infinite, or x.len where every value is finite:
/// a forward pass that overflowed or read NaN weights is caught before a token is drawn from it
/// (x - x is 0 for every finite x and NaN otherwise).
pub fn firstNonFinite(x: []const f32) usize {
    var i: usize = 0;
    while (i + lanes <= x.len) : (i += lanes) {
        const v: V = x[i..][0..lanes].*;
        const bad: u16 = @bitCast((v - v) != @as(V, @splat(0)));
        if (bad != 0) return i + @ctz(bad);
    }
    while (i < x.len) : (i += 1) if (x[i] - x[i] != 0) return i;
    return x.len;
}

/// The plain loop firstNonFinite must equal.
fn firstNonFiniteRef(x: []const f32) usize {
    for (x, 0..) |v, i| if (std.math.isNan(v) or std.math.isInf(v)) return i;
    return x.len;
}

test "firstNonFinite equals the scalar reference on random rows of odd sizes" {
    var rng = @import("../quant/simd.zig").TestRng.init(43);
    var x: [300]f32 = undefined;
    const bad = [_]f32{ std.math.nan(f32), std.math.inf(f32), -std.math.inf(f32) };
    for ([_]usize{ 0, 1, 15, 16, 17, 31, 33, 257, 300 }) |n| {
        for (0..20) |round| {
            rng.floats(x[0..n], 3e38);
            // None, one, or two values that are not finite, at random places.
            for (0..round % 3) |_| {
                if (n > 0) x[rng.next() % n] = bad[rng.next() % bad.len];
            }
            try std.testing.expectEqual(firstNonFiniteRef(x[0..n]), firstNonFinite(x[0..n]));
        }
    }
}

test "firstNonFinite: NaN and either infinity anywhere, every finite row passes" {
    var x: [100]f32 = undefined;
    for (&x, 0..) |*v, i| v.* = (@as(f32, @floatFromInt(i)) - 50) * 6e36;
    try std.testing.expectEqual(@as(usize, 100), firstNonFinite(&x));
    try std.testing.expectEqual(@as(usize, 0), firstNonFinite(x[0..0]));
    for ([_]f32{ std.math.nan(f32), std.math.inf(f32), -std.math.inf(f32) }) |bad| {
        for ([_]usize{ 0, 15, 16, 17, 95, 99 }) |at| {
            const keep = x[at];
            x[at] = bad;
            try std.testing.expectEqual(at, firstNonFinite(&x));
            x[at] = keep;
        }
    }
}

test "argmax: fast path equals the scalar reference, ties and odd sizes" {
    var rng = @import("../quant/simd.zig").TestRng.init(41);
    var x: [1000]f32 = undefined;
    for ([_]usize{ 1, 2, 15, 31, 32, 33, 100, 257, 1000 }) |n| {
        for (0..20) |round| {
            rng.floats(x[0..n], 4);
            // Few distinct values: ties everywhere, maxima in several lanes.
            if (round % 2 == 1) for (x[0..n]) |*v| {
                v.* = @round(v.*);
            };
            if (round == 4) x[n - 1] = std.math.nan(f32);
            if (round == 6) @memset(x[0..n], -std.math.inf(f32));
            if (round == 8) x[0] = std.math.nan(f32);
            try std.testing.expectEqual(argmaxScalar(x[0..n]), argmax(x[0..n]));
        }
    }
    const row = [_]f32{ 1, 3, -2, 3, 0 };
    try std.testing.expectEqual(@as(usize, 1), argmaxScalar(&row));
}

test "topK: fast path equals the scalar reference; -inf and NaN are never kept" {
    var rng = @import("../quant/simd.zig").TestRng.init(43);
    var x: [3000]f32 = undefined;
    for ([_]usize{ 1, 5, 16, 17, 40, 100, 1000, 3000 }) |n| {
        for ([_]usize{ 1, 2, 7, 40, 255 }) |k| {
            for (0..6) |round| {
                rng.floats(x[0..n], 8);
                if (round % 2 == 1) for (x[0..n]) |*v| {
                    v.* = @round(v.*);
                };
                if (round == 2) for (x[0..n], 0..) |*v, i| {
                    if (i % 3 == 0) v.* = -std.math.inf(f32);
                    if (i % 7 == 0) v.* = std.math.nan(f32);
                };
                if (round == 4) for (x[0..n], 0..) |*v, i| { // ascending: every value enters
                    v.* = @floatFromInt(i);
                };
                var ids_want: [255]i32 = undefined;
                var values_want: [255]f32 = undefined;
                var ids_got: [255]i32 = undefined;
                var values_got: [255]f32 = undefined;
                const want = topKScalar(x[0..n], ids_want[0..k], values_want[0..k]);
                const got = topK(x[0..n], ids_got[0..k], values_got[0..k]);
                try std.testing.expectEqual(want, got);
                try std.testing.expectEqualSlices(i32, ids_want[0..want], ids_got[0..got]);
                for (ids_got[0..got], values_got[0..got], 0..) |id, v, j| {
                    try std.testing.expectEqual(x[@intCast(id)], v);
                    try std.testing.expect(v != -std.math.inf(f32) and !std.math.isNan(v));
                    if (j > 0) { // best first, equal values in index order
                        const before = values_got[j - 1];
                        try std.testing.expect(before > v or (before == v and ids_got[j - 1] < id));
                    }
                }
                if (k == 1 and round != 2) {
                    try std.testing.expectEqual(@as(i32, @intCast(argmaxScalar(x[0..n]))), ids_got[0]);
                }
            }
        }
    }
}

test "softmax sums and draws: fast paths equal the scalar references" {
    var rng = @import("../quant/simd.zig").TestRng.init(47);
    var x: [3000]f32 = undefined;
    var ids: [3000]i32 = undefined;
    for ([_]usize{ 1, 15, 16, 17, 100, 3000 }) |n| {
        for (0..8) |round| {
            rng.floats(x[0..n], 12);
            if (round % 2 == 1) for (x[0..n], 0..) |*v, i| {
                if (i % 5 == 0) v.* = -std.math.inf(f32);
                if (i % 11 == 0) v.* = std.math.nan(f32);
            };
            x[n / 2] = 20; // a finite maximum
            const max = x[argmax(x[0..n])];
            const scale: f32 = if (round < 4) 1 else 1.0 / 0.7;
            for ([_]f32{ -std.math.inf(f32), max - 3, max }) |floor| {
                const want = expSumScalar(x[0..n], max, scale, floor);
                const got = expSum(x[0..n], max, scale, floor);
                try std.testing.expectApproxEqRel(want, got, 1e-6);
                const count = above(x[0..n], floor, &ids);
                var count_want: usize = 0;
                for (x[0..n], 0..) |v, i| if (v >= floor) {
                    try std.testing.expectEqual(@as(i32, @intCast(i)), ids[count_want]);
                    count_want += 1;
                };
                try std.testing.expectEqual(count_want, count);
            }
            // Draws: the same index wherever the target is not within rounding of a boundary.
            const total = expSum(x[0..n], max, scale, -std.math.inf(f32));
            for (0..50) |_| {
                const u: f64 = (rng.float() + 1) / 2;
                const target = u * total;
                const got = draw(x[0..n], max, scale, target);
                const want = drawScalar(x[0..n], max, scale, target);
                if (got != want) { // only at a boundary: the running sums differ by rounding
                    const before = expSumScalar(x[0 .. @min(got, want) + 1], max, scale, -std.math.inf(f32));
                    try std.testing.expectApproxEqRel(target, before, 1e-5);
                }
                try std.testing.expect(weightScalar(x[got], max, scale) > 0);
            }
            try std.testing.expectEqual(drawScalar(x[0..n], max, scale, 2 * total), draw(x[0..n], max, scale, 2 * total));
        }
    }
}
