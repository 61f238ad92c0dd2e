//! The weighted sums of lib/cpu/attention_f16.zig, out = Σ_cells p · V, as ggml_vec_dot_f16 sums
//! over the cells: 64 partial sums of each output dimension (cell c into slot c % 64, each slot
//! its cells in ascending order), then the reduction of its 4 × 16-lane accumulators. Three
//! orders of the same operations on the same values, so the same bits: slot by slot (prompts),
//! cell by cell (decode), and for a decode step over few cells the partial sums in registers.
const std = @import("std");
const attention = @import("attention.zig");
const f16_attention = @import("attention_f16.zig");

const L16 = f16_attention.L16;
const step = f16_attention.step;
const Run = f16_attention.Run;
const loadF16 = f16_attention.loadF16;
const reduceAccumulators = f16_attention.reduceAccumulators;
const prefetchRow = f16_attention.prefetchRow;
const prefetch_cells = f16_attention.prefetch_cells;

/// In which order the weighted sum visits the cells (each slot c % 64 sums its own cells in
/// ascending order either way, so both give the same bits).
pub const SumOrder = enum {
    /// Slot by slot, a slot's sums in registers from its first cell to its last and stored once:
    /// the cell order loads and stores a slot for every cell (the stores bound a prompt's
    /// attention). V is read 64 cells apart, from L2 for a prompt's queries; from memory, at a
    /// decode step, that order was 5% slower than front to back on this 2-core EPYC.
    slots,
    /// Cell by cell, each V row added into its slot partial[g][c % 64] (32 KiB a head, in L1/L2):
    /// V read front to back, prefetched ahead.
    cells,
};

/// out[g] = Σ_cells p[g][c] · V[c] with ggml_vec_dot_f16's 64 partial sums (slot c % 64), block
/// dimensions at a time, then reduced; dimensions [dim_begin, dim_end) (whole blocks) only, each
/// dimension's sums the same whichever range it is in (a decode step's split over threads).
pub fn weightedSumBlocks(
    comptime order: SumOrder,
    comptime G: usize,
    comptime block: usize,
    v: [*]align(1) const f16,
    s: attention.Shape,
    kv_head: usize,
    runs: []const Run,
    scores: *const [G][]f32,
    out: [*]f32,
    dim_begin: usize,
    dim_end: usize,
) void {
    const d = s.head_dim;
    const chunks = block / 16;
    var dim = dim_begin;
    while (dim < dim_end) : (dim += block) {
        const partial = f16_attention.partial_buf[0 .. G * step * block];
        switch (order) {
            .slots => for (0..step) |slot| {
                var acc: [G][chunks]L16 = @splat(@splat(@splat(0)));
                for (runs) |run| {
                    var c = firstCellOfSlot(run, slot);
                    while (c < run.cell + run.len) : (c += step) {
                        const v_row = v + c * s.kv_stride + kv_head * d + dim;
                        var x: [chunks]L16 = undefined;
                        inline for (0..chunks) |j| x[j] = loadF16(v_row + 16 * j);
                        inline for (0..G) |g| {
                            const p: L16 = @splat(scores[g][c]);
                            inline for (0..chunks) |j| acc[g][j] = @mulAdd(L16, x[j], p, acc[g][j]);
                        }
                    }
                }
                inline for (0..G) |g| {
                    const slot_row = partial[(g * step + slot) * block ..][0..block];
                    inline for (0..chunks) |j| slot_row[16 * j ..][0..16].* = acc[g][j];
                }
            },
            .cells => {
                @memset(partial, 0);
                for (runs) |run| {
                    for (run.cell..run.cell + run.len) |c| {
                        const v_row = v + c * s.kv_stride + kv_head * d + dim;
                        prefetchRow(v_row + prefetch_cells * s.kv_stride, 2 * block);
                        var x: [chunks]L16 = undefined;
                        inline for (0..chunks) |j| x[j] = loadF16(v_row + 16 * j);
                        inline for (0..G) |g| {
                            const p: L16 = @splat(scores[g][c]);
                            const slot = partial[(g * step + c % step) * block ..][0..block];
                            inline for (0..chunks) |j| slot[16 * j ..][0..16].* = @mulAdd(L16, x[j], p, slot[16 * j ..][0..16].*);
                        }
                    }
                }
            },
        }
        inline for (0..G) |g| {
            reducePartials(partial[g * step * block ..][0 .. step * block], block, out[g * d + dim ..][0..block]);
        }
    }
}

/// weightedSumBlocks(.slots) for R rows whose visible cells all start at cell0 and end at
/// ends[r] (a prompt's consecutive queries, attention_f16.zig attendPassTokens): each V row is
/// converted once for every row that sees it; each row's slots sum its own cells in ascending
/// order, as weightedSumBlocks sums them, into outs[r].
pub fn weightedSumRows(
    comptime R: usize,
    comptime block: usize,
    v: [*]align(1) const f16,
    s: attention.Shape,
    kv_head: usize,
    cell0: usize,
    ends: [R]usize,
    scores: *const [R][]f32,
    outs: [R][*]f32,
) void {
    const d = s.head_dim;
    const chunks = block / 16;
    var end_max: usize = 0;
    for (ends) |e| end_max = @max(end_max, e);
    const first = Run{ .pos = 0, .cell = cell0, .len = end_max - cell0 };
    var dim: usize = 0;
    while (dim < d) : (dim += block) {
        const partial = f16_attention.partial_buf[0 .. R * step * block];
        for (0..step) |slot| {
            var acc: [R][chunks]L16 = @splat(@splat(@splat(0)));
            var c = firstCellOfSlot(first, slot);
            while (c < end_max) : (c += step) {
                const v_row = v + c * s.kv_stride + kv_head * d + dim;
                var x: [chunks]L16 = undefined;
                inline for (0..chunks) |j| x[j] = loadF16(v_row + 16 * j);
                inline for (0..R) |r| {
                    if (c < ends[r]) {
                        const p: L16 = @splat(scores[r][c]);
                        inline for (0..chunks) |j| acc[r][j] = @mulAdd(L16, x[j], p, acc[r][j]);
                    }
                }
            }
            inline for (0..R) |r| {
                const slot_row = partial[(r * step + slot) * block ..][0..block];
                inline for (0..chunks) |j| slot_row[16 * j ..][0..16].* = acc[r][j];
            }
        }
        inline for (0..R) |r| {
            reducePartials(partial[r * step * block ..][0 .. step * block], block, outs[r][dim..][0..block]);
        }
    }
}

/// Visible cells at or under which a decode step's weighted sum is weightedSumFew (its V rows,
/// 256 B each at head_dim 128, stay in L1 for the G heads' passes). Past ~64 cells the partial
/// rows' fixed cost is spread thin and V streams from memory in cell order faster than slot
/// by slot: on this 2-core EPYC, a Qwen3-0.6B-shape decode attention with its cache in memory
/// (`bun bench/attention-decode.ts --keys 16,48,64,80,144`, two runs each) took
/// 12.9–13.7 against 20.9–26.2 µs a layer at 16 keys, 22.7–23.3 against 31.5–41.5 at 48 and
/// 27.3–31.4 against 32.3–49.3 at 64; at 80 and 144 keys the slot order was no faster.
pub const few_cells_max = 64;

pub fn visibleCells(runs: []const Run) usize {
    var n: usize = 0;
    for (runs) |run| n += run.len;
    return n;
}

/// weightedSumBlocks' sums for one query (a decode step) without its G · 64 · block partial rows,
/// whose zeroing, updates and reduction (64 KiB a KV head at head_dim 128, G = 2) are a fixed
/// cost of ~1 µs a KV head, most of a decode step's attention at a short context: per lane l of the reduction, the slot sums P[l], P[16 + l],
/// P[32 + l] and P[48 + l] (each slot its cells in ascending order, fused multiply-adds from
/// zero, as ggml_vec_dot_f16 accumulates) are made in registers and combined as reducePartials
/// combines them, (P[l] + P[32 + l]) + (P[16 + l] + P[48 + l]); only those 16 vectors a block go
/// through memory. The same operations on the same values, so the same bits.
pub fn weightedSumFew(
    comptime G: usize,
    comptime block: usize,
    v: [*]align(1) const f16,
    s: attention.Shape,
    kv_head: usize,
    runs: []const Run,
    scores: *const [G][]f32,
    out: [*]f32,
) void {
    const d = s.head_dim;
    const chunks = block / 16;
    var lanes: [chunks][16]L16 = undefined;
    inline for (0..G) |g| {
        var dim: usize = 0;
        while (dim < d) : (dim += block) {
            const base = v + kv_head * d + dim;
            for (0..16) |l| {
                const a0 = slotSum(chunks, base, s.kv_stride, runs, scores[g], l);
                const a2 = slotSum(chunks, base, s.kv_stride, runs, scores[g], l + 32);
                var pair: [chunks]L16 = undefined;
                inline for (0..chunks) |j| pair[j] = a0[j] + a2[j];
                const a1 = slotSum(chunks, base, s.kv_stride, runs, scores[g], l + 16);
                const a3 = slotSum(chunks, base, s.kv_stride, runs, scores[g], l + 48);
                inline for (0..chunks) |j| lanes[j][l] = pair[j] + (a1[j] + a3[j]);
            }
            inline for (0..chunks) |j| {
                out[g * d + dim + 16 * j ..][0..16].* = reduceLanes(&lanes[j]);
            }
        }
    }
}

/// Partial sum `slot` of weightedSumBlocks over `chunks` × 16 dimensions from `base`: the
/// visible cells c ≡ slot (mod 64), ascending, p[c] · V[c] fused into a sum from zero.
inline fn slotSum(comptime chunks: usize, base: [*]align(1) const f16, stride: usize, runs: []const Run, p: []const f32, slot: usize) [chunks]L16 {
    var acc: [chunks]L16 = @splat(@splat(0));
    for (runs) |run| {
        var c = firstCellOfSlot(run, slot);
        while (c < run.cell + run.len) : (c += step) {
            const row = base + c * stride;
            const pv: L16 = @splat(p[c]);
            inline for (0..chunks) |j| acc[j] = @mulAdd(L16, loadF16(row + 16 * j), pv, acc[j]);
        }
    }
    return acc;
}

/// reduce16 over the lanes, 16 dimensions a vector (v[l]: lane l's (acc0 + acc2) + (acc1 + acc3)):
/// halves, then quarters, then pairs.
inline fn reduceLanes(v: *const [16]L16) L16 {
    var t8: [8]L16 = undefined;
    inline for (0..8) |m| t8[m] = v[m + 8] + v[m];
    var t4: [4]L16 = undefined;
    inline for (0..4) |m| t4[m] = t8[m + 4] + t8[m];
    return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

/// The run's first cell of slot `slot` (cell % 64 == slot).
inline fn firstCellOfSlot(run: Run, slot: usize) usize {
    return run.cell + (slot + step - run.cell % step) % step;
}

/// out[i] = reduceAccumulators of the 64 partial sums of dimension i (partial[slot * d + i]),
/// computed for 16 dimensions at a time: every step of the reduction tree is a lane-wise add of
/// whole rows of partials, the same adds in the same order as reducePartialsScalar.
pub fn reducePartials(partial: []const f32, d: usize, out: []f32) void {
    var i: usize = 0;
    while (i + 16 <= out.len) : (i += 16) {
        const row = struct {
            fn at(p: []const f32, slot: usize, dim: usize, stride: usize) L16 {
                return p[slot * stride + dim ..][0..16].*;
            }
        }.at;
        // v[l] = (acc0 + acc2) + (acc1 + acc3) at lane l, for each of the 16 dimensions.
        var v: [16]L16 = undefined;
        inline for (0..16) |l| {
            v[l] = (row(partial, l, i, d) + row(partial, 32 + l, i, d)) +
                (row(partial, 16 + l, i, d) + row(partial, 48 + l, i, d));
        }
        out[i..][0..16].* = reduceLanes(&v);
    }
    if (i < out.len) reducePartialsScalar(partial, d, out[i..], i);
}

/// The reference: dimension by dimension, the 64 partials gathered into ggml's 4 accumulators.
fn reducePartialsScalar(partial: []const f32, d: usize, out: []f32, first_dim: usize) void {
    for (out, first_dim..) |*o, i| {
        var acc: [4]L16 = undefined;
        inline for (0..4) |a| {
            for (0..16) |l| acc[a][l] = partial[(16 * a + l) * d + i];
        }
        o.* = reduceAccumulators(acc);
    }
}

test "reducePartials equals the dimension-by-dimension reduction bit for bit" {
    var rng = std.Random.DefaultPrng.init(4);
    const r = rng.random();
    for ([_]usize{ 16, 64, 72, 128, 256 }) |d| {
        const partial = try std.testing.allocator.alloc(f32, step * d);
        defer std.testing.allocator.free(partial);
        for (partial) |*p| p.* = (r.float(f32) - 0.5) * std.math.pow(f32, 2, @floatFromInt(r.intRangeAtMost(i32, -8, 8)));
        const want = try std.testing.allocator.alloc(f32, d);
        defer std.testing.allocator.free(want);
        const got = try std.testing.allocator.alloc(f32, d);
        defer std.testing.allocator.free(got);
        reducePartialsScalar(partial, d, want, 0);
        reducePartials(partial, d, got);
        try std.testing.expectEqualSlices(u32, std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(want)), std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(got)));
    }
}
