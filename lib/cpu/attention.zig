//! Causal multi-head attention over a KV cache (Vaswani et al. 2017), with grouped-query heads
//! (Ainslie et al. 2023) and an optional sliding window (Gemma 2/3 local layers).
//!   q:   [n_tok][n_head][head_dim] f32, the queries at absolute positions pos0 + t
//!   k,v: [pos][n_kv_head][head_dim], rows kv_stride elements apart, each F32, F16, Q4_0 or Q8_0
//!        (ggml type ids 0, 1, 2, 8; the quantized forms in kv_quant.zig), or infer's rotated
//!        codes TQ3/TQ4 (ids 103, 104; one coded vector per head, kv_turbo.zig)
//!   out: [n_tok][n_head][head_dim] = softmax_j(scale · q·k_j) · v_j over the visible keys j:
//!        j <= p (causal) and, when window > 0, p - j < window. With attention sinks (gpt-oss),
//!        head h's softmax has one more logit, sinks[h], in its denominator and no value.
//! Softmax is the online form (Milakov & Gimelshein 2018): a running max m, running sum l and an
//! unnormalised accumulator that lives in the output row, so no scratch is needed; all query heads
//! of one KV head are processed together so each K/V row is converted once.
//! Work is split into "rows" (kv_head, t); attendRows handles a range of them, and `attention`
//! hands ranges to the thread pool. Rows run KV-head-major so that a range reads one KV head's
//! keys and values for many queries: a prompt's K and V over all heads outgrow L2 (2 MiB for
//! 512 Qwen3 positions), one head's do not.
const std = @import("std");
const attention_f16 = @import("attention_f16.zig");
const threads = @import("threads.zig");
const attention_f16_split = @import("attention_f16_split.zig");
const kv_quant = @import("kv_quant.zig");
const kv_turbo = @import("kv_turbo.zig");
const attention_kv = @import("attention_kv.zig");

const lanes = 8;
const V = @Vector(lanes, f32);

pub const KvType = enum(u32) {
    f32 = 0,
    f16 = 1,
    q4_0 = 2,
    q8_0 = 8,
    tq3 = 103,
    tq4 = 104,

    /// ggml's block quantizations (32 values to a block).
    pub fn quantized(t: KvType) bool {
        return t == .q4_0 or t == .q8_0;
    }

    /// infer's rotated codes (one coded vector per head of head_dim values).
    pub fn turbo(t: KvType) bool {
        return t == .tq3 or t == .tq4;
    }

    /// Bytes of n values (n a whole number of blocks, or of head vectors of head_dim values).
    pub fn bytes(t: KvType, n: usize, head_dim: usize) usize {
        return switch (t) {
            .f32 => 4 * n,
            .f16 => 2 * n,
            .q4_0 => n / kv_quant.block_values * @sizeOf(kv_quant.Q4Block),
            .q8_0 => n / kv_quant.block_values * @sizeOf(kv_quant.Q8Block),
            .tq3 => n / head_dim * kv_turbo.vectorBytes(3, head_dim),
            .tq4 => n / head_dim * kv_turbo.vectorBytes(4, head_dim),
        };
    }
};

/// Stack sizes for one K/V row and one group's softmax state.
pub const head_dim_max = 1024;
pub const group_max = 256;

pub const Shape = struct {
    n_tok: usize,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    /// Absolute position of query 0; keys 0 .. pos0 + n_tok - 1 are in the cache.
    pos0: usize,
    /// Elements between consecutive positions of the cache.
    kv_stride: usize,
    /// 0 = full causal attention.
    window: usize,
    /// 0: the cache holds position p in row p. Otherwise it is a ring of `ring` rows and position
    /// p lives in row p % ring (sliding-window layers keep only what their window can see).
    ring: usize = 0,
    scale: f32,
    /// Sum an F16 cache's dot products in the order of llama.cpp's batched kernel (tinyBLAS: one
    /// FMA chain of 16 lanes), which its prompts take, instead of its single-token kernel's
    /// (ggml_vec_dot_f16: four); attention_f16.zig. Embeddings ask for it (docs/embeddings.md).
    batched_order: bool = false,
    /// One learned logit per query head added to the softmax's denominator (gpt-oss's attention
    /// sinks), or null.
    sinks: ?[*]const f32 = null,

    pub fn group(s: Shape) usize {
        return s.n_head / s.n_kv_head;
    }
    /// The number of (kv head, token) work rows.
    pub fn rowCount(s: Shape) usize {
        return s.n_tok * s.n_kv_head;
    }
    /// The query token of work row r.
    pub fn rowToken(s: Shape, r: usize) usize {
        return r % s.n_tok;
    }
    /// The KV head of work row r.
    pub fn rowKvHead(s: Shape, r: usize) usize {
        return r / s.n_tok;
    }
    /// Visible key range [begin, end) for the query at position p.
    pub fn keyRange(s: Shape, p: usize) struct { usize, usize } {
        const begin = if (s.window > 0 and p + 1 > s.window) p + 1 - s.window else 0;
        return .{ begin, p + 1 };
    }
    /// The cache row (cell) that holds position j.
    pub fn cell(s: Shape, j: usize) usize {
        return if (s.ring == 0) j else j % s.ring;
    }
    /// Rows the cache holds.
    pub fn cells(s: Shape) usize {
        return if (s.ring == 0) s.pos0 + s.n_tok else s.ring;
    }
    /// Query head h's sink logit, if the heads have sinks.
    pub fn sink(s: Shape, h: usize) ?f32 {
        return if (s.sinks) |sinks| sinks[h] else null;
    }
    /// Elements the K (or V) cache must hold.
    pub fn cacheLen(s: Shape) usize {
        return (s.cells() - 1) * s.kv_stride + s.n_kv_head * s.head_dim;
    }
};

/// A K or V cache seen as rows of f32, f16 or quantized blocks (addressed by element offset).
pub const Cache = union(KvType) {
    f32: [*]const f32,
    f16: [*]align(1) const f16,
    q4_0: [*]align(1) const kv_quant.Q4Block,
    q8_0: [*]align(1) const kv_quant.Q8Block,
    tq3: [*]const u8,
    tq4: [*]const u8,

    pub fn fromBytes(kv_type: KvType, bytes: [*]const u8) Cache {
        return switch (kv_type) {
            .f32 => .{ .f32 = @ptrCast(@alignCast(bytes)) },
            .f16 => .{ .f16 = @ptrCast(bytes) },
            .q4_0 => .{ .q4_0 = @ptrCast(bytes) },
            .q8_0 => .{ .q8_0 = @ptrCast(bytes) },
            .tq3 => .{ .tq3 = bytes },
            .tq4 => .{ .tq4 = bytes },
        };
    }

    /// Value i (not for the rotated codes: they are read a whole vector at a time).
    fn at(c: Cache, i: usize) f32 {
        return switch (c) {
            .f32 => |p| p[i],
            .f16 => |p| p[i],
            .q4_0 => |p| kv_quant.atQ4(p, i),
            .q8_0 => |p| kv_quant.atQ8(p, i),
            .tq3, .tq4 => unreachable,
        };
    }

    pub fn turbo(c: Cache) bool {
        return c == .tq3 or c == .tq4;
    }

    /// The head vector at element offset `start` as stored, in the original domain, by the
    /// scalar references (the rotated codes decoded and rotated back): for the reference.
    fn vectorReference(c: Cache, start: usize, buf: []f32) []const f32 {
        const d = buf.len;
        switch (c) {
            .tq3 => |p| {
                kv_turbo.decodeRotatedScalar(3, p + start / d * kv_turbo.vectorBytes(3, d), buf);
                kv_turbo.unrotateScalar(buf);
            },
            .tq4 => |p| {
                kv_turbo.decodeRotatedScalar(4, p + start / d * kv_turbo.vectorBytes(4, d), buf);
                kv_turbo.unrotateScalar(buf);
            },
            else => for (buf, 0..) |*x, i| {
                x.* = c.at(start + i);
            },
        }
        return buf;
    }

    fn quantized(c: Cache) bool {
        return c == .q4_0 or c == .q8_0;
    }

    /// The row at element offset `start` as f32: a view for F32, converted into `buf` for F16.
    pub fn row(c: Cache, start: usize, buf: []f32) []const f32 {
        switch (c) {
            .f32 => |p| return p[start..][0..buf.len],
            .f16 => |p| {
                const src = p[start..][0..buf.len];
                var i: usize = 0;
                while (i + lanes <= buf.len) : (i += lanes) {
                    const h: @Vector(lanes, f16) = src[i..][0..lanes].*;
                    buf[i..][0..lanes].* = @as(V, @floatCast(h));
                }
                while (i < buf.len) : (i += 1) buf[i] = src[i];
                return buf;
            },
            .q4_0 => |p| return kv_quant.rowQ4(p, start, buf),
            .q8_0 => |p| return kv_quant.rowQ8(p, start, buf),
            .tq3, .tq4 => unreachable,
        }
    }
};

/// Handles work rows [row_begin, row_end). Returns false only when scratch memory fails.
/// F16 keys with F16 values take llama.cpp's arithmetic (attention_f16.zig); every other pair
/// of types the chunked online softmax of attention_kv.zig, which reads quantized keys by integer
/// dots with the query in Q8_0 and the rotated codes in the rotated domain.
pub fn attendRows(
    q: [*]const f32,
    k: Cache,
    v: Cache,
    out: [*]f32,
    s: Shape,
    row_begin: usize,
    row_end: usize,
) bool {
    std.debug.assert(s.head_dim <= head_dim_max and s.group() <= group_max);
    if (k == .f16 and v == .f16) return attention_f16.attendRows(q, k.f16, v.f16, out, s, row_begin, row_end);
    return attention_kv.attendRows(q, k, v, out, s, row_begin, row_end);
}

const Job = struct {
    q: [*]const f32,
    k: Cache,
    v: Cache,
    out: [*]f32,
    s: Shape,
    rows_per_task: usize,
    failed: std.atomic.Value(bool) = .init(false),
};

fn runTask(job: *Job, task: usize) void {
    const begin = task * job.rows_per_task;
    const end = @min(begin + job.rows_per_task, job.s.rowCount());
    if (!attendRows(job.q, job.k, job.v, job.out, job.s, begin, end)) job.failed.store(true, .monotonic);
}

/// Tasks per thread: a row's cost grows with its position (causal), so rows go out in small
/// ranges that the threads take in turn, which evens out the load.
const tasks_per_thread = 8;

/// All rows, across the thread pool. False when scratch memory failed.
pub fn attention(q: [*]const f32, k: Cache, v: Cache, out: [*]f32, s: Shape) bool {
    const rows = s.rowCount();
    const n_threads = threads.threadCount();
    // Fewer rows than threads (a decode step) over a long context: each row's keys in chunks
    // across the threads, which gives the bits one thread gives.
    if (!(k == .f16 and v == .f16) and attention_kv.splits(s, n_threads)) return attention_kv.attentionSplit(q, k, v, out, s);
    // An F16 cache's decode step: its scores, softmaxes and output dimensions across the threads,
    // which gives the bits one thread a KV head gives (attention_f16_split.zig).
    if (k == .f16 and v == .f16 and attention_f16_split.splits(s, n_threads)) return attention_f16_split.attentionSplit(q, k.f16, v.f16, out, s, 0);
    if (n_threads <= 1 or rows <= 1) return attendRows(q, k, v, out, s, 0, rows);
    const n_tasks = @min(rows, n_threads * tasks_per_thread);
    var job = Job{ .q = q, .k = k, .v = v, .out = out, .s = s, .rows_per_task = std.math.divCeil(usize, rows, n_tasks) catch unreachable };
    threads.run(std.math.divCeil(usize, rows, job.rows_per_task) catch unreachable, &job, runTask);
    return !job.failed.load(.monotonic);
}

/// Two passes per query head, in the textbook order: scores, max, exp and sum, weighted sum.
/// With an F16 cache it rounds the query and the probabilities to f16 as the fast path does;
/// with a quantized K cache it rounds the query through Q8_0 as the fast path does.
/// `scores` needs pos0 + n_tok entries.
pub fn attentionReference(
    q: [*]const f32,
    k: Cache,
    v: Cache,
    out: [*]f32,
    s: Shape,
    scores: []f32,
) void {
    const d = s.head_dim;
    const round = k == .f16 and v == .f16;
    for (0..s.n_tok) |t| {
        for (0..s.n_head) |h| {
            const kv_head = h / s.group();
            var q_row: [head_dim_max]f32 = undefined;
            for (0..d) |i| {
                const x = q[(t * s.n_head + h) * d + i];
                q_row[i] = if (round) @as(f16, @floatCast(x)) else x;
            }
            if (k.quantized()) {
                var blocks: [head_dim_max / kv_quant.block_values]kv_quant.Q8Block = undefined;
                const nb = d / kv_quant.block_values;
                kv_quant.quantizeQuery(q_row[0..d], blocks[0..nb]);
                _ = kv_quant.rowQ8(&blocks, 0, q_row[0..d]);
            }
            const o_row = out[(t * s.n_head + h) * d ..][0..d];
            const begin, const end = s.keyRange(s.pos0 + t);
            var max: f32 = -std.math.inf(f32);
            var k_row: [head_dim_max]f32 = undefined;
            for (begin..end) |j| {
                var sum: f32 = 0;
                _ = k.vectorReference(s.cell(j) * s.kv_stride + kv_head * d, k_row[0..d]);
                for (0..d) |i| sum += q_row[i] * k_row[i];
                scores[j] = s.scale * sum;
                max = @max(max, scores[j]);
            }
            const sink: ?f32 = if (s.sinks) |sinks| sinks[h] else null;
            if (sink) |sk| max = @max(max, sk);
            var total: f64 = 0;
            for (begin..end) |j| {
                scores[j] = @exp(scores[j] - max);
                total += scores[j];
            }
            if (sink) |sk| total += @exp(sk - max);
            @memset(o_row, 0);
            for (begin..end) |j| {
                const p: f32 = scores[j] / @as(f32, @floatCast(total));
                const weight: f32 = if (round) @as(f16, @floatCast(p)) else p;
                var v_row: [head_dim_max]f32 = undefined;
                _ = v.vectorReference(s.cell(j) * s.kv_stride + kv_head * d, v_row[0..d]);
                for (0..d) |i| o_row[i] += weight * v_row[i];
            }
        }
    }
}

/// accumulateMass's scores of one query head, grown on demand.
threadlocal var mass_scores: []f32 = &.{};

/// mass[j] += the softmax weight of key j, summed over every query head and token of the call:
/// the accumulated attention by which the H2O context shift (Zhang et al. 2023) keeps its heavy
/// hitters. The weights are attention's own up to rounding (keys read as f32, tq keys in the
/// rotated domain, a sink in the denominator); a linear cache (ring 0). False when memory fails.
pub fn accumulateMass(q: [*]const f32, k: Cache, s: Shape, mass: []f32) bool {
    std.debug.assert(s.ring == 0 and mass.len >= s.pos0 + s.n_tok);
    const d = s.head_dim;
    const n = s.pos0 + s.n_tok;
    if (mass_scores.len < n) {
        // Grown by doubling and kept: a decode loop's context grows a position a step.
        const grown = std.heap.page_allocator.alloc(f32, @max(n, 2 * mass_scores.len)) catch return false;
        if (mass_scores.len > 0) std.heap.page_allocator.free(mass_scores);
        mass_scores = grown;
    }
    const scores = mass_scores[0..n];
    var q_row: [head_dim_max]f32 = undefined;
    var k_row: [head_dim_max]f32 = undefined;
    for (0..s.n_tok) |t| for (0..s.n_head) |h| {
        const kv_head = h / s.group();
        @memcpy(q_row[0..d], q[(t * s.n_head + h) * d ..][0..d]);
        if (k.turbo()) kv_turbo.rotate(q_row[0..d]);
        const begin, const end = s.keyRange(s.pos0 + t);
        var max: f32 = -std.math.inf(f32);
        for (begin..end) |j| {
            const start = j * s.kv_stride + kv_head * d;
            const key = switch (k) {
                inline .tq3, .tq4 => |p, kt| blk: {
                    const bits = if (kt == .tq3) 3 else 4;
                    kv_turbo.decodeRotated(bits, p + start / d * kv_turbo.vectorBytes(bits, d), k_row[0..d]);
                    break :blk k_row[0..d];
                },
                else => k.row(start, k_row[0..d]),
            };
            scores[j] = s.scale * dot(q_row[0..d], key);
            max = @max(max, scores[j]);
        }
        const sink = s.sink(h);
        if (sink) |sk| max = @max(max, sk);
        var total: f32 = if (sink) |sk| @exp(sk - max) else 0;
        for (scores[begin..end]) |*x| {
            x.* = @exp(x.* - max);
            total += x.*;
        }
        for (scores[begin..end], mass[begin..end]) |x, *m| m.* += x / total;
    };
    return true;
}

fn dot(a: []const f32, b: []const f32) f32 {
    var acc: V = @splat(0);
    var i: usize = 0;
    while (i + lanes <= a.len) : (i += lanes) acc += @as(V, a[i..][0..lanes].*) * @as(V, b[i..][0..lanes].*);
    var sum = @reduce(.Add, acc);
    while (i < a.len) : (i += 1) sum += a[i] * b[i];
    return sum;
}

/// Reads dst.len values of a cache back as f32 (dst.len whole blocks or head vectors): the
/// rotated codes decoded and rotated back to the original domain, the anchor they were stored
/// less (a row of values, repeated; tq3/tq4 only) added back.
pub fn load(src: [*]const u8, src_type: KvType, dst: []f32, head_dim: usize, anchor: ?[]const f32) void {
    switch (src_type) {
        inline .tq3, .tq4 => |t| {
            const bits = if (t == .tq3) 3 else 4;
            const vb = kv_turbo.vectorBytes(bits, head_dim);
            for (0..dst.len / head_dim) |i| {
                const out = dst[i * head_dim ..][0..head_dim];
                kv_turbo.decode(bits, src + i * vb, out);
                if (anchor) |a| for (out, a[i * head_dim % a.len ..][0..head_dim]) |*x, c| {
                    x.* += c;
                };
            }
        },
        .f32 => @memcpy(dst, @as([*]align(1) const f32, @ptrCast(src))[0..dst.len]),
        .f16, .q4_0, .q8_0 => {
            const out = Cache.fromBytes(src_type, src).row(0, dst);
            std.debug.assert(out.ptr == dst.ptr);
        },
    }
}

/// Writes n f32 values into a cache as F32, F16 (round to nearest even, as ggml's F16C path),
/// Q8_0 or Q4_0 (n a whole number of blocks), TQ3 or TQ4 (n a whole number of head vectors).
/// TQ3/TQ4 may code each row less an anchor (a row of values, a whole number of head vectors):
/// a K cache whose keys share a large vector (Gemma 3's do) codes what differs between them, and
/// every score of a query moves by the same q·anchor, which the softmax does not see.
pub fn store(src: []const f32, dst: [*]u8, dst_type: KvType, head_dim: usize) void {
    storeAnchored(src, dst, dst_type, head_dim, null);
}

pub fn storeAnchored(src: []const f32, dst: [*]u8, dst_type: KvType, head_dim: usize, anchor: ?[]const f32) void {
    switch (dst_type) {
        inline .tq3, .tq4 => |t| {
            const bits = if (t == .tq3) 3 else 4;
            const vb = kv_turbo.vectorBytes(bits, head_dim);
            for (0..src.len / head_dim) |i| {
                const part = if (anchor) |a| a[i * head_dim % a.len ..][0..head_dim] else null;
                kv_turbo.encodeOffset(bits, src[i * head_dim ..][0..head_dim], part, dst + i * vb);
            }
        },
        .q8_0 => kv_quant.storeQ8(src, dst),
        .q4_0 => kv_quant.storeQ4(src, dst),
        .f32 => @memcpy(@as([*]align(1) f32, @ptrCast(dst))[0..src.len], src),
        .f16 => {
            const out: [*]align(1) f16 = @ptrCast(dst);
            var i: usize = 0;
            while (i + lanes <= src.len) : (i += lanes) {
                const h: @Vector(lanes, f16) = @floatCast(@as(V, src[i..][0..lanes].*));
                out[i..][0..lanes].* = h;
            }
            while (i < src.len) : (i += 1) out[i] = @floatCast(src[i]);
        },
    }
}

// ---- tests ---------------------------------------------------------------------------------

fn runCase(kv_type: KvType, s: Shape, seed: u64) !void {
    return runMixedCase(kv_type, kv_type, s, seed);
}

fn runMixedCase(k_type: KvType, v_type: KvType, s: Shape, seed: u64) !void {
    const gpa = std.testing.allocator;
    var prng = std.Random.DefaultPrng.init(seed);
    const rand = prng.random();
    const q = try gpa.alloc(f32, s.n_tok * s.n_head * s.head_dim);
    defer gpa.free(q);
    for (q) |*x| x.* = rand.float(f32) * 2 - 1;
    const cache_len = s.cacheLen();
    const kv_f32 = try gpa.alloc(f32, 2 * cache_len);
    defer gpa.free(kv_f32);
    for (kv_f32) |*x| x.* = rand.float(f32) * 2 - 1;
    const k_bytes = try gpa.alignedAlloc(u8, 4, k_type.bytes(cache_len, s.head_dim));
    defer gpa.free(k_bytes);
    const v_bytes = try gpa.alignedAlloc(u8, 4, v_type.bytes(cache_len, s.head_dim));
    defer gpa.free(v_bytes);
    store(kv_f32[0..cache_len], k_bytes.ptr, k_type, s.head_dim);
    store(kv_f32[cache_len..], v_bytes.ptr, v_type, s.head_dim);
    const k = Cache.fromBytes(k_type, k_bytes.ptr);
    const v = Cache.fromBytes(v_type, v_bytes.ptr);
    const want = try gpa.alloc(f32, q.len);
    defer gpa.free(want);
    const got = try gpa.alloc(f32, q.len);
    defer gpa.free(got);
    const scores = try gpa.alloc(f32, s.pos0 + s.n_tok);
    defer gpa.free(scores);
    attentionReference(q.ptr, k, v, want.ptr, s, scores);
    try std.testing.expect(attention(q.ptr, k, v, got.ptr, s));
    // F16: a probability whose f32 value sits on an f16 rounding boundary may round one ulp
    // (2^-11 relative) apart in the two summation orders.
    // The rotated codes: the fast path sums in the rotated domain, the reference in the original
    // one (the same products, rounded in another order).
    const tolerance: f32 = if (k_type == .f16 and v_type == .f16) 1e-3 else if (k_type.turbo() or v_type.turbo()) 1e-4 else 1e-5;
    for (want, got) |w, g| try std.testing.expectApproxEqAbs(w, g, tolerance);
}

test "attention over rotated-code caches, alone and mixed, matches the two-pass reference" {
    const types = [_]KvType{ .f32, .f16, .q8_0, .tq3, .tq4 };
    for ([_]usize{ 8, 64, 256 }, 0..) |d, i| {
        for (types) |k_type| for (types) |v_type| {
            if (!k_type.turbo() and !v_type.turbo()) continue;
            if ((k_type.quantized() or v_type.quantized()) and d % 32 != 0) continue;
            // GQA 4:1 prefill; decode over padded rows (whole vectors apart); a window; GQA 3:1.
            try runMixedCase(k_type, v_type, .{ .n_tok = 5, .n_head = 4, .n_kv_head = 1, .head_dim = d, .pos0 = 0, .kv_stride = d, .window = 0, .scale = 0.125 }, i);
            try runMixedCase(k_type, v_type, .{ .n_tok = 1, .n_head = 8, .n_kv_head = 2, .head_dim = d, .pos0 = 37, .kv_stride = 3 * d, .window = 0, .scale = 0.3 }, i + 10);
            try runMixedCase(k_type, v_type, .{ .n_tok = 9, .n_head = 2, .n_kv_head = 2, .head_dim = d, .pos0 = 4, .kv_stride = 2 * d, .window = 3, .scale = 1 }, i + 20);
            try runMixedCase(k_type, v_type, .{ .n_tok = 3, .n_head = 9, .n_kv_head = 3, .head_dim = d, .pos0 = 11, .kv_stride = 3 * d, .window = 0, .scale = 0.2 }, i + 30);
        };
    }
}

/// RMS of got - want over RMS of want: attention through a cache type against an f32 cache.
fn attentionError(kv_type: KvType, s: Shape, seed: u64, outliers: bool) !f64 {
    const gpa = std.testing.allocator;
    var prng = std.Random.DefaultPrng.init(seed);
    const rand = prng.random();
    const n = s.cacheLen();
    const q = try gpa.alloc(f32, s.n_tok * s.n_head * s.head_dim);
    defer gpa.free(q);
    for (q) |*x| x.* = rand.floatNorm(f32);
    const kv = try gpa.alignedAlloc(f32, 4, 2 * n);
    defer gpa.free(kv);
    for (kv) |*x| x.* = rand.floatNorm(f32);
    // Keys and values as models make them: a few channels of every head far larger than the rest.
    if (outliers) for (0..2 * n / s.head_dim) |r| {
        for ([_]usize{ 3, 17, 40 }) |c| kv[r * s.head_dim + c % s.head_dim] *= 12;
    };
    const kb = try gpa.alloc(u8, kv_type.bytes(n, s.head_dim));
    defer gpa.free(kb);
    const vb = try gpa.alloc(u8, kv_type.bytes(n, s.head_dim));
    defer gpa.free(vb);
    store(kv[0..n], kb.ptr, kv_type, s.head_dim);
    store(kv[n..], vb.ptr, kv_type, s.head_dim);
    const want = try gpa.alloc(f32, q.len);
    defer gpa.free(want);
    const got = try gpa.alloc(f32, q.len);
    defer gpa.free(got);
    try std.testing.expect(attention(q.ptr, .{ .f32 = kv.ptr }, .{ .f32 = kv[n..].ptr }, want.ptr, s));
    try std.testing.expect(attention(q.ptr, Cache.fromBytes(kv_type, kb.ptr), Cache.fromBytes(kv_type, vb.ptr), got.ptr, s));
    var err: f64 = 0;
    var norm: f64 = 0;
    for (want, got) |w, g| {
        err += (w - g) * (w - g);
        norm += w * w;
    }
    return @sqrt(err / norm);
}

test "rotated codes: attention's error against f32 falls with the bits; with outlier channels tq4 beats q4_0" {
    // Scores peaked enough (scale 0.25 at d 128) that the keys' errors matter.
    const s = Shape{ .n_tok = 2, .n_head = 4, .n_kv_head = 2, .head_dim = 128, .pos0 = 200, .kv_stride = 256, .window = 0, .scale = 0.25 };
    // Gaussian data: q4_0 (4.5 bits a value, a scale per 32) and tq4 (4.1 bits) are alike.
    const e8 = try attentionError(.q8_0, s, 1, false);
    const e4 = try attentionError(.q4_0, s, 1, false);
    const t4 = try attentionError(.tq4, s, 1, false);
    const t3 = try attentionError(.tq3, s, 1, false);
    try std.testing.expect(e8 < t4 and t4 < 1.25 * e4 and t4 < t3);
    // Outlier channels: a q4_0 block's scale follows its outlier and the rest lose their bits;
    // the rotation spreads the outliers over every coordinate first.
    const o4 = try attentionError(.q4_0, s, 2, true);
    const ot4 = try attentionError(.tq4, s, 2, true);
    const ot3 = try attentionError(.tq3, s, 2, true);
    try std.testing.expect(ot4 < o4 and ot4 < ot3);
}

test "attention over quantized and mixed caches matches the two-pass reference" {
    const types = [_]KvType{ .f32, .f16, .q8_0, .q4_0 };
    for ([_]usize{ 32, 96, 256 }, 0..) |d, i| {
        for (types) |k_type| for (types) |v_type| {
            if (!k_type.quantized() and !v_type.quantized()) continue;
            // GQA 4:1 prefill; decode over padded rows (a whole number of blocks apart); a window.
            try runMixedCase(k_type, v_type, .{ .n_tok = 5, .n_head = 4, .n_kv_head = 1, .head_dim = d, .pos0 = 0, .kv_stride = d, .window = 0, .scale = 0.125 }, i);
            try runMixedCase(k_type, v_type, .{ .n_tok = 1, .n_head = 8, .n_kv_head = 2, .head_dim = d, .pos0 = 37, .kv_stride = 2 * d + 32, .window = 0, .scale = 0.3 }, i + 10);
            try runMixedCase(k_type, v_type, .{ .n_tok = 9, .n_head = 2, .n_kv_head = 2, .head_dim = d, .pos0 = 4, .kv_stride = 2 * d, .window = 3, .scale = 1 }, i + 20);
        };
    }
}

test "attention sinks: every cache type and path matches the reference; a sink only scales" {
    var sinks: [8]f32 = .{ 2.5, -1, 0, 7, -30, 1.25, 4, -0.5 };
    for ([_]KvType{ .f32, .f16, .q8_0 }, 0..) |kv_type, i| {
        for ([_]usize{ 64, 96 }) |d| {
            try runCase(kv_type, .{ .n_tok = 5, .n_head = 4, .n_kv_head = 1, .head_dim = d, .pos0 = 0, .kv_stride = d, .window = 0, .scale = 0.125, .sinks = &sinks }, i);
            try runCase(kv_type, .{ .n_tok = 1, .n_head = 8, .n_kv_head = 2, .head_dim = d, .pos0 = 37, .kv_stride = 2 * d, .window = 0, .scale = 0.3, .sinks = &sinks }, i + 10);
            try runCase(kv_type, .{ .n_tok = 9, .n_head = 2, .n_kv_head = 2, .head_dim = d, .pos0 = 4, .kv_stride = 2 * d, .window = 3, .scale = 1, .sinks = &sinks }, i + 20);
            try runCase(kv_type, .{ .n_tok = 6, .n_head = 2, .n_kv_head = 1, .head_dim = d, .pos0 = 0, .kv_stride = d, .window = 0, .scale = 0.125, .sinks = &sinks }, i + 30);
        }
    }
    // One visible key: its probability is 1 / (1 + exp(sink - score)), so the output is the value
    // times that; a sink of -inf changes nothing.
    const d = 4;
    const q = [_]f32{ 1, 0, 0, 0 };
    const k = [_]f32{ 2, 0, 0, 0 };
    const v = [_]f32{ 1, -2, 3, 0.5 };
    for ([_]f32{ 1, -std.math.inf(f32), 5 }) |sink| {
        var out: [d]f32 = undefined;
        const sk = [_]f32{sink};
        try std.testing.expect(attention(&q, .{ .f32 = &k }, .{ .f32 = &v }, &out, .{ .n_tok = 1, .n_head = 1, .n_kv_head = 1, .head_dim = d, .pos0 = 0, .kv_stride = d, .window = 0, .scale = 1, .sinks = &sk }));
        const p = 1 / (1 + @exp(sink - 2));
        for (out, v) |o, x| try std.testing.expectApproxEqRel(p * x, o, 1e-6);
    }
}

test "a Q8_0 cache's attention stays close to the f32 cache's" {
    const gpa = std.testing.allocator;
    var prng = std.Random.DefaultPrng.init(5);
    const rand = prng.random();
    const s = Shape{ .n_tok = 3, .n_head = 4, .n_kv_head = 2, .head_dim = 64, .pos0 = 60, .kv_stride = 128, .window = 0, .scale = 0.125 };
    const n = s.cacheLen();
    const q = try gpa.alloc(f32, s.n_tok * s.n_head * s.head_dim);
    defer gpa.free(q);
    for (q) |*x| x.* = rand.float(f32) * 2 - 1;
    const kv = try gpa.alignedAlloc(f32, 4, 2 * n);
    defer gpa.free(kv);
    for (kv) |*x| x.* = rand.float(f32) * 2 - 1;
    const k8 = try gpa.alloc(u8, KvType.q8_0.bytes(n, 64));
    defer gpa.free(k8);
    const v8 = try gpa.alloc(u8, KvType.q8_0.bytes(n, 64));
    defer gpa.free(v8);
    store(kv[0..n], k8.ptr, .q8_0, 64);
    store(kv[n..], v8.ptr, .q8_0, 64);
    const want = try gpa.alloc(f32, q.len);
    defer gpa.free(want);
    const got = try gpa.alloc(f32, q.len);
    defer gpa.free(got);
    try std.testing.expect(attention(q.ptr, .{ .f32 = kv.ptr }, .{ .f32 = kv[n..].ptr }, want.ptr, s));
    try std.testing.expect(attention(q.ptr, Cache.fromBytes(.q8_0, k8.ptr), Cache.fromBytes(.q8_0, v8.ptr), got.ptr, s));
    // Values in [-1, 1] quantize with steps under 1/127; the output moves far less than that.
    for (want, got) |w, g| try std.testing.expectApproxEqAbs(w, g, 2e-3);
}

test "attention fast path matches the two-pass reference" {
    const dims = [_]usize{ 1, 7, 31, 33, 64, 257 };
    for (dims, 0..) |d, i| {
        for ([_]KvType{ .f32, .f16 }) |kv_type| {
            // GQA 4:1, prefill with causal mask.
            try runCase(kv_type, .{
                .n_tok = 5,
                .n_head = 4,
                .n_kv_head = 1,
                .head_dim = d,
                .pos0 = 0,
                .kv_stride = d,
                .window = 0,
                .scale = 0.125,
            }, i);
            // GQA 8:2, decode after a prefill, padded cache rows.
            try runCase(kv_type, .{
                .n_tok = 1,
                .n_head = 8,
                .n_kv_head = 2,
                .head_dim = d,
                .pos0 = 13,
                .kv_stride = 2 * d + 3,
                .window = 0,
                .scale = 0.3,
            }, i + 10);
            // Sliding window smaller than the sequence.
            try runCase(kv_type, .{
                .n_tok = 9,
                .n_head = 2,
                .n_kv_head = 2,
                .head_dim = d,
                .pos0 = 4,
                .kv_stride = 2 * d,
                .window = 3,
                .scale = 1,
            }, i + 20);
        }
    }
}

test "a single visible key returns its value" {
    const q = [_]f32{ 1, 2, 3 };
    const kv = [_]f32{ 0.5, -1, 2, 7, 8, 9 };
    var out: [3]f32 = undefined;
    const s = Shape{
        .n_tok = 1,
        .n_head = 1,
        .n_kv_head = 1,
        .head_dim = 3,
        .pos0 = 0,
        .kv_stride = 3,
        .window = 0,
        .scale = 1,
    };
    try std.testing.expect(attention(&q, .{ .f32 = &kv }, .{ .f32 = kv[3..].ptr }, &out, s));
    try std.testing.expectEqualSlices(f32, &[_]f32{ 7, 8, 9 }, &out);
}

test "store to f16 rounds to nearest even" {
    const src = [_]f32{ 1.0, 1.0 + 1.0 / 2048.0, 65504, -0.1 };
    var dst: [4]f16 = undefined;
    store(&src, @ptrCast(&dst), .f16, 1);
    try std.testing.expectEqual(@as(f16, 1.0), dst[0]); // the tie rounds to the even mantissa
    try std.testing.expectEqual(@as(f16, 65504), dst[2]);
    try std.testing.expectEqual(@as(f16, @floatCast(@as(f32, -0.1))), dst[3]);
}

test "a ring cache gives what a linear cache gives" {
    const gpa = std.testing.allocator;
    var prng = std.Random.DefaultPrng.init(99);
    const rand = prng.random();
    const d = 64;
    const linear = Shape{ .n_tok = 3, .n_head = 4, .n_kv_head = 1, .head_dim = d, .pos0 = 45, .kv_stride = d, .window = 16, .scale = 0.125 };
    var ringed = linear;
    ringed.ring = 20; // >= window + n_tok - 1; positions 45..47 wrap past cell 19
    const positions = linear.pos0 + linear.n_tok;
    const q = try gpa.alloc(f32, linear.n_tok * linear.n_head * d);
    defer gpa.free(q);
    for (q) |*x| x.* = rand.float(f32) * 2 - 1;
    const lin = try gpa.alloc(f32, 2 * positions * d);
    defer gpa.free(lin);
    for (lin) |*x| x.* = rand.float(f32) * 2 - 1;
    const ring = try gpa.alloc(f32, 2 * ringed.ring * d);
    defer gpa.free(ring);
    for (positions - ringed.ring..positions) |p| {
        const c = ringed.cell(p);
        @memcpy(ring[c * d ..][0..d], lin[p * d ..][0..d]);
        @memcpy(ring[(ringed.ring + c) * d ..][0..d], lin[(positions + p) * d ..][0..d]);
    }
    for ([_]KvType{ .f32, .f16, .q8_0, .q4_0, .tq3, .tq4 }) |kv_type| {
        const lin_bytes = try gpa.alignedAlloc(u8, 4, kv_type.bytes(lin.len, d));
        defer gpa.free(lin_bytes);
        const ring_bytes = try gpa.alignedAlloc(u8, 4, kv_type.bytes(ring.len, d));
        defer gpa.free(ring_bytes);
        store(lin, lin_bytes.ptr, kv_type, d);
        store(ring, ring_bytes.ptr, kv_type, d);
        const want = try gpa.alloc(f32, q.len);
        defer gpa.free(want);
        const got = try gpa.alloc(f32, q.len);
        defer gpa.free(got);
        const lk = Cache.fromBytes(kv_type, lin_bytes.ptr);
        const lv = Cache.fromBytes(kv_type, lin_bytes.ptr + kv_type.bytes(positions * d, d));
        const rk = Cache.fromBytes(kv_type, ring_bytes.ptr);
        const rv = Cache.fromBytes(kv_type, ring_bytes.ptr + kv_type.bytes(ringed.ring * d, d));
        try std.testing.expect(attention(q.ptr, lk, lv, want.ptr, linear));
        try std.testing.expect(attention(q.ptr, rk, rv, got.ptr, ringed));
        // F16 sums the same terms in cell order, which differs from position order once wrapped;
        // the quantized caches hold the same blocks in either layout (a row is whole blocks).
        const tolerance: f32 = if (kv_type == .f16) 1e-3 else 1e-6;
        for (want, got) |w, g| try std.testing.expectApproxEqAbs(w, g, tolerance);
    }
}

test "a tq K cache coded less an anchor: attention as without it, far closer when keys share a vector" {
    const gpa = std.testing.allocator;
    var prng = std.Random.DefaultPrng.init(21);
    const rand = prng.random();
    const s = Shape{ .n_tok = 2, .n_head = 4, .n_kv_head = 2, .head_dim = 64, .pos0 = 90, .kv_stride = 128, .window = 0, .scale = 0.125 };
    const n = s.cacheLen();
    const q = try gpa.alloc(f32, s.n_tok * s.n_head * s.head_dim);
    defer gpa.free(q);
    for (q) |*x| x.* = rand.floatNorm(f32);
    var common: [128]f32 = undefined;
    for (&common) |*x| x.* = rand.floatNorm(f32) * 6;
    const kv = try gpa.alloc(f32, 2 * n);
    defer gpa.free(kv);
    for (kv, 0..) |*x, i| x.* = rand.floatNorm(f32) + if (i < n) common[i % 128] else 0;
    const want = try gpa.alloc(f32, q.len);
    defer gpa.free(want);
    const got = try gpa.alloc(f32, q.len);
    defer gpa.free(got);
    try std.testing.expect(attention(q.ptr, .{ .f32 = kv.ptr }, .{ .f32 = kv[n..].ptr }, want.ptr, s));
    const kb = try gpa.alloc(u8, KvType.tq4.bytes(n, 64));
    defer gpa.free(kb);
    var errs: [2]f64 = undefined;
    for ([_]?[]const f32{ null, &common }, 0..) |anchor, a| {
        storeAnchored(kv[0..n], kb.ptr, .tq4, 64, anchor);
        try std.testing.expect(attention(q.ptr, Cache.fromBytes(.tq4, kb.ptr), .{ .f32 = kv[n..].ptr }, got.ptr, s));
        var e: f64 = 0;
        var norm: f64 = 0;
        for (want, got) |w, g| {
            e += (w - g) * (w - g);
            norm += w * w;
        }
        errs[a] = @sqrt(e / norm);
    }
    try std.testing.expect(errs[1] * 3 < errs[0]);
}

test {
    _ = attention_kv;
}

test "accumulated attention: each head's weights sum to one over its keys, as the reference's" {
    const gpa = std.testing.allocator;
    var prng = std.Random.DefaultPrng.init(8);
    const rand = prng.random();
    const s = Shape{ .n_tok = 3, .n_head = 4, .n_kv_head = 2, .head_dim = 64, .pos0 = 20, .kv_stride = 128, .window = 0, .scale = 0.125 };
    const n = s.cacheLen();
    const q = try gpa.alloc(f32, s.n_tok * s.n_head * s.head_dim);
    defer gpa.free(q);
    for (q) |*x| x.* = rand.floatNorm(f32);
    const kv = try gpa.alignedAlloc(f32, 4, n);
    defer gpa.free(kv);
    for (kv) |*x| x.* = rand.floatNorm(f32);
    for ([_]KvType{ .f32, .q8_0, .tq4 }) |kv_type| {
        const kb = try gpa.alignedAlloc(u8, 4, kv_type.bytes(n, 64));
        defer gpa.free(kb);
        store(kv, kb.ptr, kv_type, 64);
        var mass = [_]f32{0} ** 23;
        try std.testing.expect(accumulateMass(q.ptr, Cache.fromBytes(kv_type, kb.ptr), s, &mass));
        var total: f32 = 0;
        for (mass) |m| total += m;
        try std.testing.expectApproxEqAbs(@as(f32, 12), total, 1e-4);
        // Key 22 is seen by the last token only; key 0 by all three.
        try std.testing.expect(mass[22] < 4.0001 and mass[0] > 0);
        // The f32 cache's weights are the two-pass reference's.
        if (kv_type == .f32) {
            var want = [_]f32{0} ** 23;
            var scores: [23]f32 = undefined;
            for (0..s.n_tok) |t| for (0..s.n_head) |h| {
                const begin, const end = s.keyRange(s.pos0 + t);
                var max: f32 = -std.math.inf(f32);
                for (begin..end) |j| {
                    var acc: f32 = 0;
                    for (0..64) |i| acc += q[(t * 4 + h) * 64 + i] * kv[j * 128 + h / 2 * 64 + i];
                    scores[j] = acc * s.scale;
                    max = @max(max, scores[j]);
                }
                var sum: f32 = 0;
                for (begin..end) |j| sum += @exp(scores[j] - max);
                for (begin..end) |j| want[j] += @exp(scores[j] - max) / sum;
            };
            for (want, mass) |w, m| try std.testing.expectApproxEqAbs(w, m, 1e-5);
        }
    }
}
