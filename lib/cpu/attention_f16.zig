//! Attention over an F16 KV cache with llama.cpp's arithmetic, operation for operation, so that
//! logits equal llama.cpp's bit for bit (Gemma 3 270M turns a 1-ulp difference into different
//! greedy tokens within a few dozen steps). llama.cpp's CPU graph without flash attention is
//!   kq   = mul_mat(K, q)      q rounded to f16; ggml_vec_dot_f16 over head_dim
//!   p    = soft_max_ext(kq)   scale, mask, max, ggml_v_expf in blocks of 16 cells summed in f64,
//!                             multiplied by (float)(1/sum)
//!   out  = mul_mat(Vᵀ, p)     p rounded to f16; ggml_vec_dot_f16 over the cells
//! where ggml_vec_dot_f16 (AVX-512 build) keeps 4 accumulators of 16 lanes, element i going to
//! accumulator (i / 16) % 4, lane i % 16, and reduces them as GGML_F32Cx16_REDUCE does. Sums run
//! over cache cells in cell order: position p is in cell p (or p % ring for a sliding-window ring,
//! as llama.cpp's SWA cache places it); masked cells add exact zeros, so only visible keys are
//! visited. The results equal llama.cpp's AVX-512 build on any CPU.
//! The weighted sums (the second mul_mat, in three orders) are in attention_f16_sum.zig.
const std = @import("std");
const attention = @import("attention.zig");
const expV = @import("expf.zig").expV;
const weighted = @import("attention_f16_sum.zig");
const weightedSumBlocks = weighted.weightedSumBlocks;
const weightedSumFew = weighted.weightedSumFew;
const reducePartials = weighted.reducePartials;
const visibleCells = weighted.visibleCells;
const few_cells_max = weighted.few_cells_max;

pub const L16 = @Vector(16, f32);
/// Elements per step of ggml_vec_dot_f16: 4 accumulators × 16 lanes.
pub const step = 64;

/// _mm512_reduce_add_ps: halves, then quarters, then pairs (GCC and clang expand it alike).
fn reduce16(v: L16) f32 {
    var t8: [8]f32 = undefined;
    for (0..8) |i| t8[i] = v[i + 8] + v[i];
    var t4: [4]f32 = undefined;
    for (0..4) |i| t4[i] = t8[i + 4] + t8[i];
    return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

/// GGML_F32Cx16_REDUCE of the four accumulators.
pub fn reduceAccumulators(acc: [4]L16) f32 {
    return reduce16(accumulatorLanes(acc));
}

/// The four accumulators added lane-wise as GGML_F32Cx16_REDUCE adds them before its final sum.
fn accumulatorLanes(acc: [4]L16) L16 {
    return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

pub fn loadF16(p: [*]align(1) const f16) L16 {
    const h: @Vector(16, f16) = p[0..16].*;
    return @floatCast(h);
}

/// ggml_vec_dot_f16(n, k, q) with q already rounded to f16 (held as f32).
fn dotF16(k: [*]align(1) const f16, q: []const f32) f32 {
    const n = q.len;
    const np = n - n % step;
    var acc: [4]L16 = @splat(@splat(0));
    var i: usize = 0;
    while (i < np) : (i += step) {
        inline for (0..4) |j| {
            const x = loadF16(k + i + 16 * j);
            const y: L16 = q[i + 16 * j ..][0..16].*;
            acc[j] = @mulAdd(L16, x, y, acc[j]);
        }
    }
    var sum: f64 = reduceAccumulators(acc);
    while (i < n) : (i += 1) sum += @as(f32, k[i]) * q[i];
    return @floatCast(sum);
}

/// The same dot in the order of llama.cpp's batched f16 kernel (tinyBLAS<16, __m512, ...>, which
/// its mul_mat takes for two query rows or more): one accumulator of 16 lanes, element i in lane
/// i % 16, FMAs in ascending i, then _mm512_reduce_add_ps. n is a multiple of 16.
fn dotF16Batched(k: [*]align(1) const f16, q: []const f32) f32 {
    var acc: L16 = @splat(0);
    var i: usize = 0;
    while (i < q.len) : (i += 16) acc = @mulAdd(L16, loadF16(k + i), q[i..][0..16].*, acc);
    return reduce16(acc);
}

/// Per-thread scratch, grown (never shrunk) on demand so the hot path does not allocate once a
/// context's length has been seen: the scores of one query over the cells, and the 64 partial
/// sums of every output dimension.
threadlocal var scores_buf: []f32 = &.{};
pub threadlocal var partial_buf: []f32 = &.{};

pub fn grow(buf: *[]f32, n: usize) bool {
    if (buf.len >= n) return true;
    // Doubling: the scores grow with the context, one position per decode step, and a fresh
    // mapping per step would cost its page faults every token.
    const grown = std.heap.page_allocator.alloc(f32, @max(n, 2 * buf.len, 4096)) catch return false;
    if (buf.len > 0) std.heap.page_allocator.free(buf.*);
    buf.* = grown;
    return true;
}

/// Consecutive visible positions that sit in consecutive cells.
pub const Run = struct { pos: usize, cell: usize, len: usize };

/// The visible positions [begin, end) of one query as runs in ascending cell order: one run, or
/// two when a ring wraps (the newest positions, in cells from 0, come first).
pub fn runsInCellOrder(s: attention.Shape, begin: usize, end: usize) std.BoundedArray(Run, 2) {
    var runs = std.BoundedArray(Run, 2){};
    const first = s.cell(begin);
    const len = end - begin;
    if (s.ring == 0 or first + len <= s.ring) {
        runs.appendAssumeCapacity(.{ .pos = begin, .cell = first, .len = len });
    } else {
        const wrap = begin + (s.ring - first); // the first position stored in cell 0
        runs.appendAssumeCapacity(.{ .pos = wrap, .cell = 0, .len = end - wrap });
        runs.appendAssumeCapacity(.{ .pos = begin, .cell = first, .len = wrap - begin });
    }
    return runs;
}

/// Handles work rows [row_begin, row_end) of attention.Shape; false when scratch memory fails.
pub fn attendRows(
    q: [*]const f32,
    k: [*]align(1) const f16,
    v: [*]align(1) const f16,
    out: [*]f32,
    s: attention.Shape,
    row_begin: usize,
    row_end: usize,
) bool {
    if (s.batched_order and s.head_dim % 16 == 0) return attendRowsBatchedOrder(q, k, v, out, s, row_begin, row_end);
    if (s.head_dim % step == 0) return attendRowsGrouped(q, k, v, out, s, row_begin, row_end);
    return attendRowsPerHead(q, k, v, out, s, row_begin, row_end);
}

/// One query head at a time: the plain form of the arithmetic, and the path for head sizes
/// that are not a multiple of 64 (whose dots end in ggml's f64 tail loop).
pub fn attendRowsPerHead(
    q: [*]const f32,
    k: [*]align(1) const f16,
    v: [*]align(1) const f16,
    out: [*]f32,
    s: attention.Shape,
    row_begin: usize,
    row_end: usize,
) bool {
    const d = s.head_dim;
    const group = s.group();
    // Softmax blocks of 16 cells are aligned to cell 0: round the scores up to a whole block.
    if (!grow(&scores_buf, s.cells() + 16) or !grow(&partial_buf, step * d)) return false;
    var q16_buf: [attention.head_dim_max]f32 = undefined;
    const q16 = q16_buf[0..d];
    for (row_begin..row_end) |r| {
        const t = s.rowToken(r);
        const kv_head = s.rowKvHead(r);
        const begin, const end = s.keyRange(s.pos0 + t);
        const runs = runsInCellOrder(s, begin, end);
        for (0..group) |g| {
            const row = (t * s.n_head + kv_head * group + g) * d;
            for (q16, q[row..][0..d]) |*dst, x| dst.* = @as(f16, @floatCast(x));
            softmaxF16(k, q16, s, kv_head, kv_head * group + g, runs.constSlice());
            weightedSum(v, s, kv_head, runs.constSlice(), out[row..][0..d]);
        }
    }
    return true;
}

/// attendRowsPerHead with llama.cpp's batched order of sums (Shape.batched_order; head_dim a
/// multiple of 16): scores by dotF16Batched, and the weighted sum of each output dimension as
/// tinyBLAS sums it over the cells, cell c in lane c % 16 (masked cells add exact zeros there).
/// The softmax between them is the same as a single token's (soft_max_ext is per row).
fn attendRowsBatchedOrder(
    q: [*]const f32,
    k: [*]align(1) const f16,
    v: [*]align(1) const f16,
    out: [*]f32,
    s: attention.Shape,
    row_begin: usize,
    row_end: usize,
) bool {
    const d = s.head_dim;
    const group = s.group();
    if (!grow(&scores_buf, s.cells() + 16) or !grow(&partial_buf, 16 * d)) return false;
    var q16_buf: [attention.head_dim_max]f32 = undefined;
    const q16 = q16_buf[0..d];
    for (row_begin..row_end) |r| {
        const t = s.rowToken(r);
        const kv_head = s.rowKvHead(r);
        const begin, const end = s.keyRange(s.pos0 + t);
        const runs = runsInCellOrder(s, begin, end);
        for (0..group) |g| {
            const row = (t * s.n_head + kv_head * group + g) * d;
            for (q16, q[row..][0..d]) |*dst, x| dst.* = @as(f16, @floatCast(x));
            const scores = scores_buf;
            const block_lo, const block_hi = blockSpan(runs.constSlice());
            @memset(scores[block_lo..block_hi], -std.math.inf(f32));
            var max: f32 = -std.math.inf(f32);
            for (runs.constSlice()) |run| {
                for (run.cell..run.cell + run.len) |c| {
                    scores[c] = dotF16Batched(k + c * s.kv_stride + kv_head * d, q16) * s.scale;
                    max = @max(max, scores[c]);
                }
            }
            normalizeF16(scores, runs.constSlice(), block_lo, block_hi, max, s.sink(kv_head * group + g));
            weightedSumBatched(v, s, kv_head, runs.constSlice(), out[row..][0..d]);
        }
    }
    return true;
}

fn weightedSumBatched(v: [*]align(1) const f16, s: attention.Shape, kv_head: usize, runs: []const Run, out: []f32) void {
    const d = out.len;
    const partial = partial_buf[0 .. 16 * d];
    @memset(partial, 0);
    // Cells in ascending order (runsInCellOrder), as tinyBLAS walks them.
    for (runs) |run| {
        for (run.cell..run.cell + run.len) |c| {
            const p_v: L16 = @splat(scores_buf[c]);
            const slot = partial[(c % 16) * d ..][0..d];
            const v_row = v + c * s.kv_stride + kv_head * d;
            var i: usize = 0;
            while (i < d) : (i += 16) slot[i..][0..16].* = @mulAdd(L16, loadF16(v_row + i), p_v, slot[i..][0..16].*);
        }
    }
    for (out, 0..) |*o, i| {
        var lanes: L16 = undefined;
        inline for (0..16) |l| lanes[l] = partial[l * d + i];
        o.* = reduce16(lanes);
    }
}

/// Query heads that share a KV head, handled together (up to this many per pass).
pub const heads_per_pass = 4;

/// The same arithmetic as attendRowsPerHead, for head sizes that are a multiple of 64, with the
/// query heads of one KV head in passes of up to four: each K and V row is converted from f16
/// once per pass instead of once per head.
fn attendRowsGrouped(
    q: [*]const f32,
    k: [*]align(1) const f16,
    v: [*]align(1) const f16,
    out: [*]f32,
    s: attention.Shape,
    row_begin: usize,
    row_end: usize,
) bool {
    const score_len = s.cells() + 16;
    if (!grow(&scores_buf, heads_per_pass * score_len) or !grow(&partial_buf, heads_per_pass * step * 128)) return false;
    var r = row_begin;
    while (r < row_end) {
        const kv_head = s.rowKvHead(r);
        const head_end = @min(row_end, (kv_head + 1) * s.n_tok);
        if (s.n_tok > 1 and s.kv_stride != s.head_dim and head_end - r >= dense_rows_min) {
            // A prompt's rows of one KV head read its slice of every K and V row many times over:
            // a slice (head_dim values) every kv_stride elements, a power-of-two stride whose
            // rows fall in a few cache sets, so they left the caches between one query's pass and
            // the next (on a 2-core Xeon, 8 KV heads × 128: V's loads were a fifth of a prompt's
            // attention). Copied into rows of their own, they stay in L2 for all the rows. (A
            // cache of one KV head is such rows already: Gemma 3 270M's.)
            const hi = if (s.ring == 0) s.pos0 + s.rowToken(head_end - 1) + 1 else s.cells();
            if (denseHead(k, v, s, kv_head, hi)) {
                var dense = s;
                dense.kv_stride = s.head_dim;
                attendHeadRows(q, k_dense.ptr, v_dense.ptr, out, dense, kv_head, 0, r, head_end, score_len);
                r = head_end;
                continue;
            }
        }
        attendHeadRows(q, k, v, out, s, kv_head, kv_head, r, head_end, score_len);
        r = head_end;
    }
    return true;
}

/// Rows of one KV head at which a prompt's attention reads a copy of its K and V slices.
const dense_rows_min = 8;
/// Per-thread copies of one KV head's K and V slices (cells × head_dim), grown on demand.
threadlocal var k_dense: []f16 = &.{};
threadlocal var v_dense: []f16 = &.{};

/// Copies cells [0, hi) of KV head kv_head's K and V slices into k_dense and v_dense, rows
/// head_dim apart; false when memory for them fails (the caller reads the cache in place).
fn denseHead(k: [*]align(1) const f16, v: [*]align(1) const f16, s: attention.Shape, kv_head: usize, hi: usize) bool {
    const d = s.head_dim;
    const n = hi * d;
    inline for (.{ &k_dense, &v_dense }) |buf| {
        if (buf.len < n) {
            const grown = std.heap.page_allocator.alloc(f16, @max(n, 2 * buf.len)) catch return false;
            if (buf.len > 0) std.heap.page_allocator.free(buf.*);
            buf.* = grown;
        }
    }
    for (0..hi) |c| {
        const from = c * s.kv_stride + kv_head * d;
        @memcpy(k_dense[c * d ..][0..d], k[from..][0..d]);
        @memcpy(v_dense[c * d ..][0..d], v[from..][0..d]);
    }
    return true;
}

/// Rows [row_begin, row_end) of KV head kv_head (its queries' rows of q and out), whose K and V
/// slices sit at column kv_col of k and v (kv_head in the cache itself, 0 in a dense copy).
fn attendHeadRows(
    q: [*]const f32,
    k: [*]align(1) const f16,
    v: [*]align(1) const f16,
    out: [*]f32,
    s: attention.Shape,
    kv_head: usize,
    kv_col: usize,
    row_begin: usize,
    row_end: usize,
    score_len: usize,
) void {
    const d = s.head_dim;
    const group = s.group();
    var r = row_begin;
    while (r < row_end) : (r += 1) {
        const t = s.rowToken(r);
        const begin, const end = s.keyRange(s.pos0 + t);
        const runs = runsInCellOrder(s, begin, end);
        // A prompt's consecutive queries, taken together where their heads are fewer than a pass
        // holds (Qwen3's 2, MHA's 1): each K and V row converted once for them all.
        if (s.n_tok > 1 and group <= 2) {
            const T = heads_per_pass / group; // queries a pass: 2 (two heads each) or 4 (one)
            if (r + T <= row_end and t + T <= s.n_tok and sameStart(s, t, T, runs.constSlice())) {
                const cell0 = runs.get(0).cell;
                if (group == 1) attendPassTokens(1, 4, q, k, v, out, s, kv_head, kv_col, t, cell0, score_len) else attendPassTokens(2, 2, q, k, v, out, s, kv_head, kv_col, t, cell0, score_len);
                r += T - 1;
                continue;
            }
        }
        var g: usize = 0;
        while (g < group) : (g += heads_per_pass) {
            const first_row = (t * s.n_head + kv_head * group + g) * d;
            switch (@min(heads_per_pass, group - g)) {
                inline 1...heads_per_pass => |G| attendPass(G, q + first_row, k, v, out + first_row, s, kv_col, kv_head * group + g, runs.constSlice(), score_len),
                else => unreachable,
            }
        }
    }
}

/// Whether queries t .. t + n - 1 (token indices, of one KV head) each see one run of cells
/// that starts where query t's does (`runs`), so that only their ends differ, by one cell each:
/// causal attention with no window in effect and no ring wrapped.
fn sameStart(s: attention.Shape, t: usize, n: usize, runs: []const Run) bool {
    if (runs.len != 1) return false;
    for (1..n) |i| {
        const begin, const end = s.keyRange(s.pos0 + t + i);
        const other = runsInCellOrder(s, begin, end);
        if (other.len != 1 or other.get(0).cell != runs[0].cell or other.get(0).len != runs[0].len + i) return false;
    }
    return true;
}

/// attendPass for T consecutive queries of a prompt and their G heads each (G·T ≤ 4 rows),
/// whose visible cells are [cell0, cell0 + len + i) for query t + i. Each row's arithmetic is
/// attendPass's (the same dots, softmax blocks and slot sums over its own cells): rows share
/// the loads and f16 conversions of K and V, a row skipping the cells past its own end.
fn attendPassTokens(
    comptime G: usize,
    comptime T: usize,
    q: [*]const f32,
    k: [*]align(1) const f16,
    v: [*]align(1) const f16,
    out: [*]f32,
    s: attention.Shape,
    kv_head: usize,
    kv_col: usize,
    t: usize,
    cell0: usize,
    score_len: usize,
) void {
    const R = G * T;
    const d = s.head_dim;
    var q16_buf: [R][attention.head_dim_max]f32 = undefined;
    var outs: [R][*]f32 = undefined;
    var ends: [R]usize = undefined;
    var scores: [R][]f32 = undefined;
    inline for (0..T) |i| {
        const begin, const end = s.keyRange(s.pos0 + t + i);
        inline for (0..G) |g| {
            const row = (t + i) * s.n_head + kv_head * G + g;
            for (q16_buf[i * G + g][0..d], q[row * d ..][0..d]) |*dst, x| dst.* = @as(f16, @floatCast(x));
            outs[i * G + g] = out + row * d;
            ends[i * G + g] = cell0 + (end - begin);
            scores[i * G + g] = scores_buf[(i * G + g) * score_len ..][0..score_len];
        }
    }
    const end_max = ends[R - 1];
    const block_lo = cell0 - cell0 % 16;
    const block_hi = end_max + (16 - end_max % 16) % 16;
    var max: [R]f32 = @splat(-std.math.inf(f32));
    inline for (0..R) |i| @memset(scores[i][block_lo..block_hi], -std.math.inf(f32));
    var c = cell0;
    while (c < end_max) {
        const n = @min(16, end_max - c);
        // K from a dense copy or L2 (a prompt's): no prefetch.
        const dots = scoreCells(R, false, k, s, kv_col, &q16_buf, c, n);
        inline for (0..R) |row| {
            for (0..@min(n, ends[row] -| c)) |i| {
                scores[row][c + i] = dots[row][i];
                max[row] = @max(max[row], dots[row][i]);
            }
        }
        c += n;
    }
    inline for (0..R) |row| {
        const runs = [1]Run{.{ .pos = 0, .cell = cell0, .len = ends[row] - cell0 }};
        const hi = ends[row] + (16 - ends[row] % 16) % 16;
        normalizeF16(scores[row], &runs, block_lo, hi, max[row], s.sink(kv_head * G + row % G));
    }
    if (d % 128 == 0 and R <= 2) weighted.weightedSumRows(R, 128, v, s, kv_col, cell0, ends, &scores, outs) else weighted.weightedSumRows(R, step, v, s, kv_col, cell0, ends, &scores, outs);
}

fn attendPass(
    comptime G: usize,
    q: [*]const f32,
    k: [*]align(1) const f16,
    v: [*]align(1) const f16,
    out: [*]f32,
    s: attention.Shape,
    kv_head: usize,
    head0: usize,
    runs: []const Run,
    score_len: usize,
) void {
    const d = s.head_dim;
    var q16_buf: [G][attention.head_dim_max]f32 = undefined;
    inline for (0..G) |g| {
        for (q16_buf[g][0..d], q[g * d ..][0..d]) |*dst, x| dst.* = @as(f16, @floatCast(x));
    }
    var scores: [G][]f32 = undefined;
    inline for (0..G) |g| scores[g] = scores_buf[g * score_len ..][0..score_len];

    // A decode step over few cells sums the values in registers (weightedSumFew), in an order
    // the prefetchers cannot follow: ask for its V rows now, so they arrive while K is scored.
    const few = s.n_tok == 1 and visibleCells(runs) <= few_cells_max;
    if (few) {
        for (runs) |run| {
            for (run.cell..run.cell + run.len) |c| prefetchRow(v + c * s.kv_stride + kv_head * d, 2 * d);
        }
    }
    const block_lo, const block_hi = blockSpan(runs);
    var max: [G]f32 = @splat(-std.math.inf(f32));
    inline for (0..G) |g| @memset(scores[g][block_lo..block_hi], -std.math.inf(f32));
    for (runs) |run| {
        var c = run.cell;
        while (c < run.cell + run.len) {
            const n = @min(16, run.cell + run.len - c);
            const dots = scoreCells(G, true, k, s, kv_head, &q16_buf, c, n);
            inline for (0..G) |g| {
                for (0..n) |i| {
                    scores[g][c + i] = dots[g][i];
                    max[g] = @max(max[g], dots[g][i]);
                }
            }
            c += n;
        }
    }
    inline for (0..G) |g| normalizeF16(scores[g], runs, block_lo, block_hi, max[g], s.sink(head0 + g));

    // Weighted sum, 128 (or 64) dimensions at a time, each slot c % 64 summing its cells in the
    // per-head path's order. A prompt's queries find their head's V in L2 and take it slot by
    // slot (sums in registers; up to 2 heads take 128 dimensions, 16 accumulators, more take
    // 64); a decode step streams V from memory and takes it cell by cell, front to back.
    if (few) {
        if (d % 128 == 0) weightedSumFew(G, 128, v, s, kv_head, runs, &scores, out) else weightedSumFew(G, step, v, s, kv_head, runs, &scores, out);
    } else if (s.n_tok > 1) {
        if (d % 128 == 0 and G <= 2) weightedSumBlocks(.slots, G, 128, v, s, kv_head, runs, &scores, out, 0, d) else weightedSumBlocks(.slots, G, step, v, s, kv_head, runs, &scores, out, 0, d);
    } else {
        if (d % 128 == 0) weightedSumBlocks(.cells, G, 128, v, s, kv_head, runs, &scores, out, 0, d) else weightedSumBlocks(.cells, G, step, v, s, kv_head, runs, &scores, out, 0, d);
    }
}

/// The scaled scores of cells c .. c + n - 1 (n <= 16) for R query rows, K's slices at column
/// kv_col: each cell's dot left as its 16-lane sum of ggml's accumulators, then the 16
/// horizontal sums done together (reduce16Many), lane-wise adds in reduce16's order where one
/// at a time each cell's sum was a chain of extracts and scalar adds. `prefetch`: ask for the
/// row prefetch_cells ahead (a head's rows sit kv_stride apart, a stride the hardware
/// prefetchers do not pick up at decode, where the cache streams from memory).
pub inline fn scoreCells(
    comptime R: usize,
    comptime prefetch: bool,
    k: [*]align(1) const f16,
    s: attention.Shape,
    kv_col: usize,
    q16: *const [R][attention.head_dim_max]f32,
    c: usize,
    n: usize,
) [R]L16 {
    const d = s.head_dim;
    var sums: [R][16]L16 = undefined;
    for (0..n) |i| {
        if (prefetch) prefetchRow(k + (c + i + prefetch_cells) * s.kv_stride + kv_col * d, 2 * d);
        const lanes = dotLanesF16(R, k + (c + i) * s.kv_stride + kv_col * d, q16, d);
        inline for (0..R) |row| sums[row][i] = lanes[row];
    }
    var dots: [R]L16 = undefined;
    inline for (0..R) |row| dots[row] = reduce16Many(&sums[row]) * @as(L16, @splat(s.scale));
    return dots;
}

/// Cells ahead that the K and V loops prefetch.
pub const prefetch_cells = 16;

/// Prefetches `bytes` from p, one hint per 64-byte line (a hint past the cache's end is harmless:
/// prefetches do not fault).
pub inline fn prefetchRow(p: [*]align(1) const f16, bytes: usize) void {
    const base: [*]const u8 = @ptrCast(p);
    var off: usize = 0;
    while (off < bytes) : (off += 64) @prefetch(base + off, .{ .locality = 3 });
}

/// ggml_vec_dot_f16(d, k, q_g) for G query rows at once (d a multiple of 64), before its final
/// horizontal sum: (acc0 + acc2) + (acc1 + acc3), whose reduce16 is the dot. Each k chunk is
/// converted once and fed to every head's four accumulators.
inline fn dotLanesF16(comptime G: usize, k: [*]align(1) const f16, q16: *const [G][attention.head_dim_max]f32, d: usize) [G]L16 {
    var acc: [G][4]L16 = @splat(@splat(@splat(0)));
    var i: usize = 0;
    while (i < d) : (i += step) {
        inline for (0..4) |j| {
            const x = loadF16(k + i + 16 * j);
            inline for (0..G) |g| acc[g][j] = @mulAdd(L16, x, q16[g][i + 16 * j ..][0..16].*, acc[g][j]);
        }
    }
    var lanes: [G]L16 = undefined;
    inline for (0..G) |g| lanes[g] = accumulatorLanes(acc[g]);
    return lanes;
}

/// reduce16 of 16 vectors at once: lane i of the result is reduce16(v[i]), bit for bit — the
/// same adds of the same lanes (halves, quarters, then (t0 + t2) + (t1 + t3)), done lane-wise
/// on vectors that hold two, four and then eight of the inputs' partial sums.
fn reduce16Many(v: *const [16]L16) L16 {
    const lo8 = [16]i32{ 0, 1, 2, 3, 4, 5, 6, 7, -1, -2, -3, -4, -5, -6, -7, -8 };
    const hi8 = [16]i32{ 8, 9, 10, 11, 12, 13, 14, 15, -9, -10, -11, -12, -13, -14, -15, -16 };
    // z[j]: t8 of v[2j] in lanes 0..7, of v[2j + 1] in lanes 8..15.
    var z: [8]L16 = undefined;
    inline for (0..8) |j| z[j] = @shuffle(f32, v[2 * j], v[2 * j + 1], hi8) + @shuffle(f32, v[2 * j], v[2 * j + 1], lo8);
    // w[j]: t4 of v[4j + m] in lanes 4m..4m+3.
    const lo4 = [16]i32{ 0, 1, 2, 3, 8, 9, 10, 11, -1, -2, -3, -4, -9, -10, -11, -12 };
    const hi4 = [16]i32{ 4, 5, 6, 7, 12, 13, 14, 15, -5, -6, -7, -8, -13, -14, -15, -16 };
    var w: [4]L16 = undefined;
    inline for (0..4) |j| w[j] = @shuffle(f32, z[2 * j], z[2 * j + 1], hi4) + @shuffle(f32, z[2 * j], z[2 * j + 1], lo4);
    // u[j]: (t4[0] + t4[2], t4[1] + t4[3]) of v[8j + m] in lanes 2m, 2m + 1.
    const lo2 = [16]i32{ 0, 1, 4, 5, 8, 9, 12, 13, -1, -2, -5, -6, -9, -10, -13, -14 };
    const hi2 = [16]i32{ 2, 3, 6, 7, 10, 11, 14, 15, -3, -4, -7, -8, -11, -12, -15, -16 };
    var u: [2]L16 = undefined;
    inline for (0..2) |j| u[j] = @shuffle(f32, w[2 * j], w[2 * j + 1], lo2) + @shuffle(f32, w[2 * j], w[2 * j + 1], hi2);
    const even = [16]i32{ 0, 2, 4, 6, 8, 10, 12, 14, -1, -3, -5, -7, -9, -11, -13, -15 };
    const odd = [16]i32{ 1, 3, 5, 7, 9, 11, 13, 15, -2, -4, -6, -8, -10, -12, -14, -16 };
    return @shuffle(f32, u[0], u[1], even) + @shuffle(f32, u[0], u[1], odd);
}

test "reduce16Many equals reduce16 lane by lane, bit for bit" {
    var rng = std.Random.DefaultPrng.init(9);
    const r = rng.random();
    for (0..200) |_| {
        var v: [16]L16 = undefined;
        for (&v) |*x| {
            for (0..16) |l| x[l] = (r.float(f32) - 0.5) * std.math.pow(f32, 2, @floatFromInt(r.intRangeAtMost(i32, -20, 20)));
        }
        const got = reduce16Many(&v);
        for (0..16) |i| try std.testing.expectEqual(@as(u32, @bitCast(reduce16(v[i]))), @as(u32, @bitCast(got[i])));
    }
}

/// Leaves the probabilities of the visible cells, rounded to f16 (as f32), in scores_buf[cell].
fn softmaxF16(
    k: [*]align(1) const f16,
    q16: []const f32,
    s: attention.Shape,
    kv_head: usize,
    head: usize,
    runs: []const Run,
) void {
    const d = q16.len;
    const scores = scores_buf;
    const block_lo, const block_hi = blockSpan(runs);
    // Every cell of the blocks the visible cells touch starts masked: exp(-inf - max) = 0.
    @memset(scores[block_lo..block_hi], -std.math.inf(f32));
    var max: f32 = -std.math.inf(f32);
    for (runs) |run| {
        for (run.cell..run.cell + run.len) |c| {
            scores[c] = dotF16(k + c * s.kv_stride + kv_head * d, q16) * s.scale;
            max = @max(max, scores[c]);
        }
    }
    normalizeF16(scores, runs, block_lo, block_hi, max, s.sink(head));
}

/// The 16-cell softmax blocks (aligned to cell 0) that the runs' cells touch: [lo, hi).
pub fn blockSpan(runs: []const Run) struct { usize, usize } {
    var lo: usize = std.math.maxInt(usize);
    var hi: usize = 0;
    for (runs) |run| {
        lo = @min(lo, run.cell);
        hi = @max(hi, run.cell + run.len);
    }
    return .{ lo - lo % 16, hi + (16 - hi % 16) % 16 };
}

/// soft_max_ext's second half: ggml_v_expf(score - max) over whole 16-cell blocks (masked cells
/// hold -inf and give 0), summed block by block in f64, then each visible cell's probability
/// p * (float)(1/sum), rounded to f16 as the next mul_mat reads it.
/// A head's sink (attention.Shape.sinks) joins as ggml's soft_max adds it: in the max, and
/// expf(sink - max) added to the f64 sum.
pub fn normalizeF16(scores: []f32, runs: []const Run, block_lo: usize, block_hi: usize, max_keys: f32, sink: ?f32) void {
    const max = if (sink) |sk| @max(max_keys, sk) else max_keys;
    var sum: f64 = if (sink) |sk| @exp(sk - max) else 0;
    var c = block_lo;
    while (c < block_hi) : (c += 16) {
        const vals = expV(@as(L16, scores[c..][0..16].*) - @as(L16, @splat(max)));
        scores[c..][0..16].* = vals;
        sum += reduce16(vals);
    }
    const inv: f32 = @floatCast(1.0 / sum);
    for (runs) |run| {
        for (scores[run.cell..][0..run.len]) |*p| p.* = @as(f16, @floatCast(p.* * inv));
    }
}

/// out[i] = Σ_cells p16[c] · V[c][i] as ggml_vec_dot_f16 over cells: partial sum (c % 64) per
/// dimension, accumulated in cell order, then reduced.
fn weightedSum(
    v: [*]align(1) const f16,
    s: attention.Shape,
    kv_head: usize,
    runs: []const Run,
    out: []f32,
) void {
    const d = out.len;
    const partial = partial_buf[0 .. step * d];
    @memset(partial, 0);
    for (runs) |run| {
        for (run.cell..run.cell + run.len) |c| {
            const p = scores_buf[c];
            const slot = partial[(c % step) * d ..][0..d];
            const v_row = v + c * s.kv_stride + kv_head * d;
            const p_v: L16 = @splat(p);
            var i: usize = 0;
            while (i + 16 <= d) : (i += 16) {
                slot[i..][0..16].* = @mulAdd(L16, loadF16(v_row + i), p_v, slot[i..][0..16].*);
            }
            while (i < d) : (i += 1) slot[i] = @mulAdd(f32, v_row[i], p, slot[i]);
        }
    }
    reducePartials(partial, d, out);
}

test "grouped heads equal one head at a time, bit for bit (GQA, windows, a wrapping ring, sinks)" {
    const alloc = std.testing.allocator;
    var rng = std.Random.DefaultPrng.init(11);
    const r = rng.random();
    const Case = struct { d: usize, n_head: usize, n_kv_head: usize, n_tok: usize, pos0: usize, window: usize, ring: usize };
    const cases = [_]Case{
        .{ .d = 64, .n_head = 1, .n_kv_head = 1, .n_tok = 3, .pos0 = 0, .window = 0, .ring = 0 },
        .{ .d = 128, .n_head = 16, .n_kv_head = 8, .n_tok = 5, .pos0 = 70, .window = 0, .ring = 0 },
        // Prompts' queries taken two or four at a time (attendPassTokens): one head a KV head
        // (4 queries a pass), two (2 a pass) from cell 0 and across softmax blocks, and a window
        // that takes effect within the chunk (queries past it one at a time).
        .{ .d = 128, .n_head = 4, .n_kv_head = 4, .n_tok = 9, .pos0 = 20, .window = 0, .ring = 0 },
        .{ .d = 128, .n_head = 8, .n_kv_head = 4, .n_tok = 6, .pos0 = 0, .window = 0, .ring = 0 },
        .{ .d = 64, .n_head = 4, .n_kv_head = 2, .n_tok = 37, .pos0 = 3, .window = 0, .ring = 0 },
        .{ .d = 64, .n_head = 2, .n_kv_head = 2, .n_tok = 10, .pos0 = 58, .window = 64, .ring = 0 },
        .{ .d = 256, .n_head = 2, .n_kv_head = 1, .n_tok = 5, .pos0 = 11, .window = 0, .ring = 0 },
        // A wrapped ring read through the dense copy of a KV head (8 rows and more a head).
        .{ .d = 64, .n_head = 4, .n_kv_head = 2, .n_tok = 12, .pos0 = 100, .window = 64, .ring = 96 },
        .{ .d = 128, .n_head = 6, .n_kv_head = 1, .n_tok = 1, .pos0 = 200, .window = 0, .ring = 0 },
        .{ .d = 256, .n_head = 4, .n_kv_head = 1, .n_tok = 7, .pos0 = 150, .window = 100, .ring = 128 },
        .{ .d = 64, .n_head = 10, .n_kv_head = 2, .n_tok = 4, .pos0 = 300, .window = 64, .ring = 96 },
        // Decode steps: weightedSumFew up to few_cells_max visible cells (some slots empty below
        // 64; two runs after a ring's wrap), weightedSumBlocks past it.
        .{ .d = 128, .n_head = 16, .n_kv_head = 8, .n_tok = 1, .pos0 = 0, .window = 0, .ring = 0 },
        .{ .d = 128, .n_head = 16, .n_kv_head = 8, .n_tok = 1, .pos0 = 15, .window = 0, .ring = 0 },
        .{ .d = 128, .n_head = 16, .n_kv_head = 8, .n_tok = 1, .pos0 = 64, .window = 0, .ring = 0 },
        .{ .d = 128, .n_head = 8, .n_kv_head = 2, .n_tok = 1, .pos0 = few_cells_max - 1, .window = 0, .ring = 0 },
        .{ .d = 128, .n_head = 8, .n_kv_head = 2, .n_tok = 1, .pos0 = few_cells_max, .window = 0, .ring = 0 },
        .{ .d = 64, .n_head = 32, .n_kv_head = 8, .n_tok = 1, .pos0 = 40, .window = 0, .ring = 0 },
        .{ .d = 64, .n_head = 32, .n_kv_head = 8, .n_tok = 1, .pos0 = 100, .window = 0, .ring = 0 },
        .{ .d = 256, .n_head = 4, .n_kv_head = 1, .n_tok = 1, .pos0 = 50, .window = 24, .ring = 32 },
        .{ .d = 256, .n_head = 4, .n_kv_head = 1, .n_tok = 1, .pos0 = 150, .window = 100, .ring = 128 },
        .{ .d = 256, .n_head = 1, .n_kv_head = 1, .n_tok = 1, .pos0 = 40, .window = 0, .ring = 0 },
    };
    // Every case also with attention sinks (a head's logit in the denominator), some above the
    // keys' scores and some far below.
    var sinks: [32]f32 = undefined;
    for (&sinks, 0..) |*x, i| x.* = if (i % 3 == 0) 6 else (r.float(f32) - 0.5) * 8;
    for (0..2 * cases.len) |case_index| {
        const c = cases[case_index % cases.len];
        const kv_stride = c.n_kv_head * c.d;
        const s = attention.Shape{
            .n_tok = c.n_tok, .n_head = c.n_head, .n_kv_head = c.n_kv_head, .head_dim = c.d,
            .pos0 = c.pos0, .kv_stride = kv_stride, .window = c.window, .ring = c.ring, .scale = 0.09,
            .sinks = if (case_index >= cases.len) &sinks else null,
        };
        const q = try alloc.alloc(f32, c.n_tok * c.n_head * c.d);
        defer alloc.free(q);
        for (q) |*x| x.* = (r.float(f32) - 0.5) * 4;
        const cache_len = s.cacheLen();
        const k = try alloc.alloc(f16, cache_len);
        defer alloc.free(k);
        const v = try alloc.alloc(f16, cache_len);
        defer alloc.free(v);
        for (k, v) |*a, *b| {
            a.* = @floatCast((r.float(f32) - 0.5) * 3);
            b.* = @floatCast((r.float(f32) - 0.5) * 3);
        }
        const want = try alloc.alloc(f32, q.len);
        defer alloc.free(want);
        const got = try alloc.alloc(f32, q.len);
        defer alloc.free(got);
        try std.testing.expect(attendRowsPerHead(q.ptr, k.ptr, v.ptr, want.ptr, s, 0, s.rowCount()));
        try std.testing.expect(attendRowsGrouped(q.ptr, k.ptr, v.ptr, got.ptr, s, 0, s.rowCount()));
        try std.testing.expectEqualSlices(u32, std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(want)), std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(got)));
        // And across the thread pool (rows in ranges on several threads).
        @memset(got, std.math.nan(f32));
        try std.testing.expect(attention.attention(q.ptr, .{ .f16 = k.ptr }, .{ .f16 = v.ptr }, got.ptr, s));
        try std.testing.expectEqualSlices(u32, std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(want)), std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(got)));
    }
}

test "batched order: tinyBLAS's sums (one 16-lane FMA chain), not ggml_vec_dot_f16's" {
    const alloc = std.testing.allocator;
    var rng = std.Random.DefaultPrng.init(45);
    const r = rng.random();
    const d = 256;
    const s = attention.Shape{
        .n_tok = 40, .n_head = 4, .n_kv_head = 1, .head_dim = d, .pos0 = 3, .kv_stride = d,
        .window = 0, .scale = 1, .batched_order = true,
    };
    const q = try alloc.alloc(f32, s.n_tok * s.n_head * d);
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
    const got = try alloc.alloc(f32, q.len);
    defer alloc.free(got);
    try std.testing.expect(attention.attention(q.ptr, .{ .f16 = k.ptr }, .{ .f16 = v.ptr }, got.ptr, s));
    // The reference, element by element: tinyBLAS's lane l sums elements l, l + 16, ... in order.
    try std.testing.expect(grow(&scores_buf, s.cells() + 16));
    var differs: usize = 0;
    for (0..s.n_tok) |t| {
        for (0..s.n_head) |h| {
            const row = (t * s.n_head + h) * d;
            var q16: [d]f32 = undefined;
            for (&q16, q[row..][0..d]) |*dst, x| dst.* = @as(f16, @floatCast(x));
            const begin, const end = s.keyRange(s.pos0 + t);
            const runs = runsInCellOrder(s, begin, end);
            const lo, const hi = blockSpan(runs.constSlice());
            @memset(scores_buf[lo..hi], -std.math.inf(f32));
            var max: f32 = -std.math.inf(f32);
            for (begin..end) |c| {
                var lanes: L16 = @splat(0);
                for (0..d / 16) |blk| {
                    for (0..16) |l| lanes[l] = @mulAdd(f32, @as(f32, k[c * d + 16 * blk + l]), q16[16 * blk + l], lanes[l]);
                }
                scores_buf[c] = reduce16(lanes);
                max = @max(max, scores_buf[c]);
            }
            normalizeF16(scores_buf, runs.constSlice(), lo, hi, max, null);
            for (0..d) |i| {
                var lanes: L16 = @splat(0);
                for (begin..end) |c| lanes[c % 16] = @mulAdd(f32, @as(f32, v[c * d + i]), scores_buf[c], lanes[c % 16]);
                const want = reduce16(lanes);
                try std.testing.expectEqual(@as(u32, @bitCast(want)), @as(u32, @bitCast(got[row + i])));
            }
        }
    }
    // The single-token order differs somewhere (else the option would be pointless).
    const single = try alloc.alloc(f32, q.len);
    defer alloc.free(single);
    var s1 = s;
    s1.batched_order = false;
    try std.testing.expect(attention.attention(q.ptr, .{ .f16 = k.ptr }, .{ .f16 = v.ptr }, single.ptr, s1));
    for (single, got) |a, b| differs += @intFromBool(a != b);
    try std.testing.expect(differs > 0);
}
