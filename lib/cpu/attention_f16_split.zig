//! A decode step's attention over an F16 cache spread over the threads with attention_f16.zig's
//! arithmetic unchanged, so the same bits as one thread a KV head. llama.cpp's graph without flash
//! attention (the arithmetic infer follows) orders its sums so that they split without a change:
//!   scores  each cell's dot is its own (mul_mat's rows are independent): the cells in chunks,
//!           one task a chunk of a KV head, for all its query heads;
//!   softmax max, exps and the f64 sum in 16-cell blocks, in cell order: one task a query head;
//!   sum     each output dimension sums its own 64 slots over the cells in cell order
//!           (ggml_vec_dot_f16 over a row of Vᵀ): one task a block of dimensions of a KV head.
//! Splitting the keys themselves, as attention_kv.zig does for the other types (and llama.cpp's
//! flash attention does for F16), would merge per-chunk softmax states and change the bits. Without
//! this, a model with fewer KV heads than threads (Gemma 3: one) did a full-attention layer's
//! attention on one thread at a decode step while the others waited.
const std = @import("std");
const attention = @import("attention.zig");
const f16a = @import("attention_f16.zig");
const weighted = @import("attention_f16_sum.zig");
const threads = @import("threads.zig");

const Run = f16a.Run;
const step = f16a.step;
const heads_per_pass = f16a.heads_per_pass;

/// Visible cells from which a decode step is split (below, three dispatches of the pool cost
/// more than one thread's work).
pub const split_cells_min = 1024;

/// Whether attention() splits this call: one query (a decode step), fewer KV heads than threads,
/// a long context, and the grouped path's head sizes (a multiple of 64) in ggml_vec_dot_f16's order.
pub fn splits(s: attention.Shape, n_threads: usize) bool {
    if (n_threads <= 1 or s.n_tok != 1 or s.n_kv_head >= n_threads) return false;
    if (s.batched_order or s.head_dim % step != 0) return false;
    const begin, const end = s.keyRange(s.pos0);
    return end - begin >= split_cells_min;
}

const Job = struct {
    q: [*]const f32,
    k: [*]align(1) const f16,
    v: [*]align(1) const f16,
    out: [*]f32,
    s: attention.Shape,
    runs: std.BoundedArray(Run, 2),
    block_lo: usize,
    block_hi: usize,
    /// Cells a scoring task takes (a multiple of 16, so tasks meet at softmax blocks).
    chunk: usize,
    chunks: usize,
    /// Dimensions a summing task takes, and such tasks a KV head.
    dim_block: usize,
    dim_tasks: usize,
    /// n_head rows of score_len: each query head's scores, then its probabilities.
    scores: []f32,
    score_len: usize,
    failed: std.atomic.Value(bool) = .init(false),

    fn headScores(job: *const Job, h: usize) []f32 {
        return job.scores[h * job.score_len ..][0..job.score_len];
    }

    /// Scores of cells [lo, hi) of one KV head's chunk for its query heads, passes of up to 4.
    fn score(job: *Job, task: usize) void {
        const s = job.s;
        const kv_head = task / job.chunks;
        const lo = job.block_lo + (task % job.chunks) * job.chunk;
        const hi = @min(lo + job.chunk, job.block_hi);
        const group = s.group();
        var g: usize = 0;
        while (g < group) : (g += heads_per_pass) {
            switch (@min(heads_per_pass, group - g)) {
                inline 1...heads_per_pass => |G| job.scorePass(G, kv_head, kv_head * group + g, lo, hi),
                else => unreachable,
            }
        }
    }

    fn scorePass(job: *Job, comptime G: usize, kv_head: usize, head0: usize, lo: usize, hi: usize) void {
        const s = job.s;
        const d = s.head_dim;
        var q16: [G][attention.head_dim_max]f32 = undefined;
        var rows: [G][]f32 = undefined;
        inline for (0..G) |g| {
            for (q16[g][0..d], job.q[(head0 + g) * d ..][0..d]) |*dst, x| dst.* = @as(f16, @floatCast(x));
            rows[g] = job.headScores(head0 + g);
            @memset(rows[g][lo..hi], -std.math.inf(f32));
        }
        for (job.runs.constSlice()) |run| {
            var c = @max(lo, run.cell);
            const end = @min(hi, run.cell + run.len);
            while (c < end) {
                const n = @min(16, end - c);
                const dots = f16a.scoreCells(G, true, job.k, s, kv_head, &q16, c, n);
                inline for (0..G) |g| {
                    for (0..n) |i| rows[g][c + i] = dots[g][i];
                }
                c += n;
            }
        }
    }

    /// Query head h's softmax over its scores (masked and padding cells hold -inf).
    fn normalize(job: *Job, h: usize) void {
        const row = job.headScores(h);
        var max_v: f16a.L16 = @splat(-std.math.inf(f32));
        var c = job.block_lo;
        while (c < job.block_hi) : (c += 16) max_v = @max(max_v, @as(f16a.L16, row[c..][0..16].*));
        const max = @reduce(.Max, max_v);
        f16a.normalizeF16(row, job.runs.constSlice(), job.block_lo, job.block_hi, max, job.s.sink(h));
    }

    /// Dimensions [dim_block · i, dim_block · (i + 1)) of one KV head's query heads.
    fn sum(job: *Job, task: usize) void {
        const s = job.s;
        const d = s.head_dim;
        if (!f16a.grow(&f16a.partial_buf, heads_per_pass * step * 128)) {
            job.failed.store(true, .monotonic);
            return;
        }
        const kv_head = task / job.dim_tasks;
        const dim0 = (task % job.dim_tasks) * job.dim_block;
        const group = s.group();
        var g: usize = 0;
        while (g < group) : (g += heads_per_pass) {
            switch (@min(heads_per_pass, group - g)) {
                inline 1...heads_per_pass => |G| {
                    const head0 = kv_head * group + g;
                    var rows: [G][]f32 = undefined;
                    inline for (0..G) |i| rows[i] = job.headScores(head0 + i);
                    const out = job.out + head0 * d;
                    const runs = job.runs.constSlice();
                    if (job.dim_block == 128) {
                        weighted.weightedSumBlocks(.cells, G, 128, job.v, s, kv_head, runs, &rows, out, dim0, dim0 + 128);
                    } else {
                        weighted.weightedSumBlocks(.cells, G, step, job.v, s, kv_head, runs, &rows, out, dim0, dim0 + step);
                    }
                },
                else => unreachable,
            }
        }
    }
};

/// The scores of every query head, shared by the tasks (the caller's, grown on demand).
threadlocal var split_scores: []f32 = &.{};

/// One decode step (s.n_tok == 1, splits(s)) across the pool; `chunks` scoring tasks a KV head
/// (0: two a thread). False when scratch memory fails.
pub fn attentionSplit(q: [*]const f32, k: [*]align(1) const f16, v: [*]align(1) const f16, out: [*]f32, s: attention.Shape, chunks_asked: usize) bool {
    std.debug.assert(s.n_tok == 1 and s.head_dim % step == 0);
    const n_threads = threads.threadCount();
    const begin, const end = s.keyRange(s.pos0);
    const runs = f16a.runsInCellOrder(s, begin, end);
    const block_lo, const block_hi = f16a.blockSpan(runs.constSlice());
    const span = block_hi - block_lo;
    const chunks_wanted = if (chunks_asked > 0) chunks_asked else 2 * n_threads;
    const chunk = std.mem.alignForward(usize, std.math.divCeil(usize, span, chunks_wanted) catch unreachable, 16);
    const score_len = s.cells() + 16;
    if (!f16a.grow(&split_scores, s.n_head * score_len)) return false;
    // 128 dimensions a summing task where that still gives every thread one, else 64.
    const dim_block: usize = if (s.head_dim % 128 == 0 and s.n_kv_head * (s.head_dim / 128) >= n_threads) 128 else step;
    var job = Job{
        .q = q, .k = k, .v = v, .out = out, .s = s, .runs = runs, .block_lo = block_lo, .block_hi = block_hi,
        .chunk = chunk, .chunks = std.math.divCeil(usize, span, chunk) catch unreachable,
        .dim_block = dim_block, .dim_tasks = s.head_dim / dim_block, .scores = split_scores, .score_len = score_len,
    };
    threads.run(s.n_kv_head * job.chunks, &job, Job.score);
    threads.run(s.n_head, &job, Job.normalize);
    threads.run(s.n_kv_head * job.dim_tasks, &job, Job.sum);
    return !job.failed.load(.monotonic);
}

// ---- tests ----------------------------------------------------------------------------------

test "a decode step split over the threads equals one thread a KV head, bit for bit" {
    const alloc = std.testing.allocator;
    var rng = std.Random.DefaultPrng.init(47);
    const r = rng.random();
    const Case = struct { d: usize, n_head: usize, n_kv_head: usize, pos0: usize, window: usize, ring: usize };
    const cases = [_]Case{
        .{ .d = 256, .n_head = 4, .n_kv_head = 1, .pos0 = 3000, .window = 0, .ring = 0 }, // Gemma 3 270M's global layers
        .{ .d = 128, .n_head = 16, .n_kv_head = 8, .pos0 = 1500, .window = 0, .ring = 0 },
        .{ .d = 64, .n_head = 10, .n_kv_head = 2, .pos0 = 1100, .window = 0, .ring = 0 }, // 5 heads: passes of 4 and 1
        .{ .d = 128, .n_head = 6, .n_kv_head = 1, .pos0 = 2049, .window = 0, .ring = 0 },
        .{ .d = 256, .n_head = 4, .n_kv_head = 1, .pos0 = 5000, .window = 1500, .ring = 1536 }, // a wrapped ring
    };
    var sinks: [16]f32 = undefined;
    for (&sinks, 0..) |*x, i| x.* = if (i % 3 == 0) 6 else (r.float(f32) - 0.5) * 8;
    for (0..2 * cases.len) |case_index| {
        const c = cases[case_index % cases.len];
        const s = attention.Shape{
            .n_tok = 1, .n_head = c.n_head, .n_kv_head = c.n_kv_head, .head_dim = c.d, .pos0 = c.pos0,
            .kv_stride = c.n_kv_head * c.d, .window = c.window, .ring = c.ring, .scale = 0.09,
            .sinks = if (case_index >= cases.len) &sinks else null,
        };
        const q = try alloc.alloc(f32, c.n_head * c.d);
        defer alloc.free(q);
        for (q) |*x| x.* = (r.float(f32) - 0.5) * 4;
        const k = try alloc.alloc(f16, s.cacheLen());
        defer alloc.free(k);
        const v = try alloc.alloc(f16, s.cacheLen());
        defer alloc.free(v);
        for (k, v) |*a, *b| {
            a.* = @floatCast((r.float(f32) - 0.5) * 3);
            b.* = @floatCast((r.float(f32) - 0.5) * 3);
        }
        const want = try alloc.alloc(f32, q.len);
        defer alloc.free(want);
        const got = try alloc.alloc(f32, q.len);
        defer alloc.free(got);
        try std.testing.expect(f16a.attendRows(q.ptr, k.ptr, v.ptr, want.ptr, s, 0, s.rowCount()));
        for ([_]usize{ 0, 1, 3, 7 }) |chunks| {
            @memset(got, std.math.nan(f32));
            try std.testing.expect(attentionSplit(q.ptr, k.ptr, v.ptr, got.ptr, s, chunks));
            try std.testing.expectEqualSlices(u32, std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(want)), std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(got)));
        }
    }
}
