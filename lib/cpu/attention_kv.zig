//! Attention over every cache but F16 keys with F16 values (attention_f16.zig's, which follows
//! llama.cpp's arithmetic bit for bit): F32, Q8_0, Q4_0 and the rotated codes TQ3/TQ4, alone or
//! mixed. attention.zig's `attendRows` and `attention` call in here.
//!
//! A query's visible keys are cut into chunks of `chunk_keys` positions counted from its first
//! visible key. Each chunk gets a softmax state of its own (running max, sum and unnormalised
//! output, the online softmax of Milakov & Gimelshein 2018, a block of `block_keys` keys at a
//! time), and the chunks' states are merged in order (flash-decoding, Dao et al. 2023). One
//! thread taking the chunks in turn and several threads taking one chunk each then do the same
//! arithmetic, so a decode step over a long context, which has a single work row per KV head,
//! spreads over the threads and gives the same bits as any other split.
//!
//! Within a block: the scores of all of a KV head's query heads first, then one exp per score
//! (expV, 16 at a time), then the weighted sum of the values with the accumulators in registers,
//! 64 dimensions and up to four heads at a time, each value row decoded once for every head.
//! - Q8_0 and Q4_0 keys: the query quantized to Q8_0 once per head and dotted with a run of keys by
//!   the integer matvec kernels of lib/quant (vpdpbusd where VNNI is), as ggml's flash attention
//!   dots its quantized keys.
//! - TQ3/TQ4 keys and values: read in the rotated domain (kv_turbo.zig). A code's level is one
//!   16-entry table lookup (vpermps) of its sign and magnitude bits, taken from the bytes as they
//!   lie: a TQ4 byte's two nibbles, a TQ3 byte's four 2-bit magnitudes with their sign bits. The
//!   lanes then hold coordinates in a permuted order (`permute`), in which the rotated query is
//!   kept and the rotated output summed; the output is put back in order and rotated back once.
const std = @import("std");
const builtin = @import("builtin");
const attention = @import("attention.zig");
const kv_quant = @import("kv_quant.zig");
const kv_turbo = @import("kv_turbo.zig");
const q8_0 = @import("../quant/q8_0.zig");
const q4_0 = @import("../quant/q4_0.zig");
const expV = @import("expf.zig").expV;
const threads = @import("threads.zig");

const Cache = attention.Cache;
const Shape = attention.Shape;
const L16 = @Vector(16, f32);
const U16 = @Vector(16, u32);

/// Keys whose scores are taken before their exps and their values' sum (a block's K and V rows
/// stay in L1 between the passes: 32 Q8_0 rows of 256 values are 8.5 KiB).
pub const block_keys = 32;
/// Keys of one softmax state: the unit of work a decode step spreads over the threads.
pub const chunk_keys = 512;
/// Dimensions a pass of the weighted sum keeps in registers.
const dims_per_pass = 64;

const is_x86 = builtin.cpu.arch == .x86_64;
const has_avx512 = is_x86 and std.Target.x86.featureSetHas(builtin.cpu.features, .avx512f);
const has_avx2 = is_x86 and std.Target.x86.featureSetHas(builtin.cpu.features, .avx2);
/// Query heads whose accumulators (4 vectors of 16 each) share a pass: 16 of AVX-512's 32
/// registers, half that where a 16-lane vector takes two of AVX2's 16.
const heads_per_pass = if (has_avx512) 4 else 2;

// ---- the rotated codes' lanes ---------------------------------------------------------------

/// table[idx] for 16 lanes (idx < 16): one vpermps with AVX-512, two and a blend with AVX2.
inline fn lookup16(table: L16, idx: U16) L16 {
    if (has_avx512) {
        return asm ("vpermps %[t], %[i], %[o]"
            : [o] "=v" (-> L16),
            : [t] "v" (table),
              [i] "v" (idx),
        );
    }
    if (has_avx2) {
        const lo: @Vector(8, f32) = @shuffle(f32, table, undefined, [8]i32{ 0, 1, 2, 3, 4, 5, 6, 7 });
        const hi: @Vector(8, f32) = @shuffle(f32, table, undefined, [8]i32{ 8, 9, 10, 11, 12, 13, 14, 15 });
        var halves: [2]@Vector(8, f32) = undefined;
        inline for (0..2) |h| {
            const i8v: @Vector(8, u32) = @shuffle(u32, idx, undefined, half(h));
            const a = vperm8(lo, i8v);
            const b = vperm8(hi, i8v);
            halves[h] = @select(f32, i8v & @as(@Vector(8, u32), @splat(8)) != @as(@Vector(8, u32), @splat(0)), b, a);
        }
        return @shuffle(f32, halves[0], halves[1], [16]i32{ 0, 1, 2, 3, 4, 5, 6, 7, -1, -2, -3, -4, -5, -6, -7, -8 });
    }
    var out: L16 = undefined;
    inline for (0..16) |i| out[i] = table[idx[i]];
    return out;
}

fn half(comptime h: usize) [8]i32 {
    var m: [8]i32 = undefined;
    for (0..8) |i| m[i] = @intCast(8 * h + i);
    return m;
}

inline fn vperm8(table: @Vector(8, f32), idx: @Vector(8, u32)) @Vector(8, f32) {
    return asm ("vpermps %[t], %[i], %[o]"
        : [o] "=x" (-> @Vector(8, f32)),
        : [t] "x" (table),
          [i] "x" (idx),
    );
}

/// A code's level by its bits: tq4 sign << 3 | magnitude index, tq3 sign << 2 | index.
fn levelTable(comptime bits: u32) L16 {
    @setEvalBranchQuota(10_000);
    const n = kv_turbo.magnitudeCount(bits);
    var t: [16]f32 = undefined;
    for (0..16) |c| {
        const m = kv_turbo.magnitude(bits, c % n);
        t[c] = if (c % (2 * n) >= n) -m else m;
    }
    return t;
}

/// Sixteen bytes as sixteen u32 lanes.
inline fn widen(p: [*]const u8) U16 {
    const b: @Vector(16, u8) = p[0..16].*;
    return @intCast(b);
}

/// The 64 levels (unscaled) of pass c of a coded vector of d values, in permuted order.
inline fn turboLevels(comptime bits: u32, codes: [*]const u8, d: usize, c: usize) [4]L16 {
    var out: [4]L16 = undefined;
    const fifteen: U16 = @splat(15);
    if (bits == 4) {
        inline for (0..2) |h| {
            const x = widen(codes + 32 * c + 16 * h);
            out[2 * h] = lookup16(comptime levelTable(4), x & fifteen);
            out[2 * h + 1] = lookup16(comptime levelTable(4), x >> @splat(4));
        }
    } else {
        // Lane k holds coordinates 4k .. 4k+3 of the pass: its byte of magnitudes, and the
        // nibble of sign bits at bit 4k of the pass's 8 sign bytes.
        const m = widen(codes + 16 * c);
        const sign_word = std.mem.readInt(u64, (codes + d / 4 + 8 * c)[0..8], .little);
        const words = @select(u32, comptime laneBelow8(), @as(U16, @splat(@truncate(sign_word))), @as(U16, @splat(@truncate(sign_word >> 32))));
        const signs = words >> comptime signShifts();
        inline for (0..4) |f| {
            const idx = (m >> @splat(2 * f)) & @as(U16, @splat(3));
            const neg = (signs >> @splat(f)) & @as(U16, @splat(1));
            out[f] = lookup16(comptime levelTable(3), idx | neg << @splat(2));
        }
    }
    return out;
}

fn laneBelow8() @Vector(16, bool) {
    var m: [16]bool = undefined;
    for (0..16) |i| m[i] = i < 8;
    return m;
}

fn signShifts() U16 {
    var m: [16]u32 = undefined;
    for (0..16) |i| m[i] = @intCast(4 * (i % 8));
    return m;
}

/// Where coordinate i of a pass of 64 sits in turboLevels' lanes: tq4 passes are two groups of
/// 32 whose even coordinates come first, tq3's coordinate 4k + f sits in lane k of vector f.
fn permutedIndex(comptime bits: u32, i: usize) usize {
    const pass = i - i % 64;
    const j = i % 64;
    if (bits == 4) return pass + j - j % 32 + (j % 32 % 2) * 16 + j % 32 / 2;
    return pass + (j % 4) * 16 + j / 4;
}

pub fn permute(comptime bits: u32, natural: []const f32, out: []f32) void {
    for (natural, 0..) |x, i| out[permutedIndex(bits, i)] = x;
}

pub fn unpermute(comptime bits: u32, permuted: []const f32, out: []f32) void {
    for (out, 0..) |*x, i| x.* = permuted[permutedIndex(bits, i)];
}

/// Whether the rotated codes of d values take the lane-table path (whole passes of 64).
fn turboFast(d: usize) bool {
    return d % dims_per_pass == 0;
}

// ---- value rows -----------------------------------------------------------------------------

inline fn loadF16(p: [*]align(1) const f16) L16 {
    const h: @Vector(16, f16) = p[0..16].*;
    return @floatCast(h);
}

/// Dimensions [64c, 64c + 64) of the value row at element offset `start`, as f32 (scales
/// applied; the rotated codes in permuted order, in the rotated domain).
inline fn valuePass(v: Cache, start: usize, d: usize, c: usize) [4]L16 {
    var out: [4]L16 = undefined;
    switch (v) {
        .f32 => |p| inline for (0..4) |i| {
            out[i] = p[start + 64 * c + 16 * i ..][0..16].*;
        },
        .f16 => |p| inline for (0..4) |i| {
            out[i] = loadF16(p + start + 64 * c + 16 * i);
        },
        .q8_0 => |p| inline for (0..2) |b| {
            const blk = &p[(start + 64 * c) / 32 + b];
            const scale: L16 = @splat(@as(f32, blk.d));
            inline for (0..2) |h| {
                const qs: @Vector(16, i8) = blk.qs[16 * h ..][0..16].*;
                out[2 * b + h] = @as(L16, @floatFromInt(qs)) * scale;
            }
        },
        .q4_0 => |p| inline for (0..2) |b| {
            const blk = &p[(start + 64 * c) / 32 + b];
            const scale: L16 = @splat(@as(f32, blk.d));
            const x = widen(&blk.qs);
            const eight: L16 = @splat(8);
            out[2 * b] = (@as(L16, @floatFromInt(x & @as(U16, @splat(15)))) - eight) * scale;
            out[2 * b + 1] = (@as(L16, @floatFromInt(x >> @splat(4))) - eight) * scale;
        },
        inline .tq3, .tq4 => |p, t| {
            const bits = if (t == .tq3) 3 else 4;
            const vec = p + start / d * kv_turbo.vectorBytes(bits, d);
            const scale: L16 = @splat(kv_turbo.scaleOf(vec));
            out = turboLevels(bits, vec + 2, d, c);
            inline for (&out) |*x| x.* *= scale;
        },
    }
    return out;
}

// ---- one query row --------------------------------------------------------------------------

/// Per-thread scratch, grown on demand and kept (a decode loop allocates once).
const Scratch = struct {
    /// The row's query heads as Q8_0 blocks (Q8_0/Q4_0 keys).
    q_blocks: []kv_quant.Q8Block = &.{},
    /// The row's query heads rotated and permuted (TQ keys), or as f32 (the other keys).
    q_rows: []f32 = &.{},
    /// A block's scores then probabilities, block_keys a head.
    probs: []f32 = &.{},
    /// One chunk's unnormalised outputs and running max and sum (a merge's right side).
    part: []f32 = &.{},
    part_max: []f32 = &.{},
    part_sum: []f32 = &.{},

    fn grow(self: *Scratch, s: Shape) bool {
        const g = s.group();
        const d = s.head_dim;
        return growSlice(kv_quant.Q8Block, &self.q_blocks, g * (d / kv_quant.block_values + 1)) and
            growSlice(f32, &self.q_rows, g * d) and growSlice(f32, &self.probs, g * block_keys) and
            growSlice(f32, &self.part, g * d) and growSlice(f32, &self.part_max, g) and
            growSlice(f32, &self.part_sum, g);
    }
};

threadlocal var scratch: Scratch = .{};

fn growSlice(comptime T: type, buf: *[]T, n: usize) bool {
    if (buf.len >= n) return true;
    const grown = std.heap.page_allocator.alloc(T, @max(n, 2 * buf.len)) catch return false;
    if (buf.len > 0) std.heap.page_allocator.free(buf.*);
    buf.* = grown;
    return true;
}

/// The softmax state of a row's G heads over some keys: out holds G rows of d unnormalised sums.
const State = struct {
    out: []f32,
    max: []f32,
    sum: []f32,
};

/// One work row (a query token and a KV head) with its query heads prepared for the key type.
const Row = struct {
    s: Shape,
    k: Cache,
    v: Cache,
    kv_head: usize,
    first_head: usize,
    /// The key range [begin, end) of the query's position.
    begin: usize,
    end: usize,
    sc: *Scratch,

    fn init(s: Shape, k: Cache, v: Cache, q: [*]const f32, r: usize, sc: *Scratch) Row {
        const t = s.rowToken(r);
        const kv_head = s.rowKvHead(r);
        const group = s.group();
        const d = s.head_dim;
        const begin, const end = s.keyRange(s.pos0 + t);
        const row = Row{ .s = s, .k = k, .v = v, .kv_head = kv_head, .first_head = kv_head * group, .begin = begin, .end = end, .sc = sc };
        const q_row = q + (t * s.n_head + kv_head * group) * d;
        const nb = d / kv_quant.block_values;
        for (0..group) |g| {
            const head = q_row[g * d ..][0..d];
            switch (k) {
                .q8_0, .q4_0 => kv_quant.quantizeQuery(head, sc.q_blocks[g * nb ..][0..nb]),
                inline .tq3, .tq4 => |_, kt| {
                    var rot: [attention.head_dim_max]f32 = undefined;
                    @memcpy(rot[0..d], head);
                    kv_turbo.rotate(rot[0..d]);
                    const dst = sc.q_rows[g * d ..][0..d];
                    if (turboFast(d)) permute(if (kt == .tq3) 3 else 4, rot[0..d], dst) else @memcpy(dst, rot[0..d]);
                },
                .f32, .f16 => @memcpy(sc.q_rows[g * d ..][0..d], head),
            }
        }
        return row;
    }

    fn chunkCount(row: Row) usize {
        return std.math.divCeil(usize, row.end - row.begin, chunk_keys) catch unreachable;
    }

    fn kvStart(row: Row, j: usize) usize {
        return row.s.cell(j) * row.s.kv_stride + row.kv_head * row.s.head_dim;
    }

    /// Chunk `c` of the row's keys into a fresh state.
    fn chunk(row: Row, c: usize, st: State) void {
        const g_n = row.s.group();
        const d = row.s.head_dim;
        @memset(st.out[0 .. g_n * d], 0);
        @memset(st.max[0..g_n], -std.math.inf(f32));
        @memset(st.sum[0..g_n], 0);
        const lo = row.begin + c * chunk_keys;
        const hi = @min(row.end, lo + chunk_keys);
        var j = lo;
        while (j < hi) : (j += block_keys) {
            const n = @min(block_keys, hi - j);
            row.scores(j, n);
            row.softmaxBlock(n, st);
            row.weightedSum(j, n, st);
        }
    }

    /// Scaled scores of keys j .. j + n - 1 into probs[g * block_keys + i].
    fn scores(row: Row, j: usize, n: usize) void {
        const s = row.s;
        const d = s.head_dim;
        const g_n = s.group();
        const probs = row.sc.probs;
        switch (row.k) {
            inline .q8_0, .q4_0 => |p, kt| {
                const Block = if (kt == .q8_0) kv_quant.Q8Block else kv_quant.Q4Block;
                const nb = d / kv_quant.block_values;
                const row_bytes = s.kv_stride / kv_quant.block_values * @sizeOf(Block);
                // A run of consecutive cells at a time (a ring's block may wrap past its end).
                var i: usize = 0;
                while (i < n) {
                    const cell = s.cell(j + i);
                    const len = if (s.ring == 0) n - i else @min(n - i, s.ring - cell);
                    const base: [*]const u8 = @ptrCast(p + row.kvStart(j + i) / kv_quant.block_values);
                    for (0..g_n) |g| {
                        const qb = row.sc.q_blocks[g * nb ..].ptr;
                        const dst = probs[g * block_keys + i ..].ptr;
                        if (kt == .q8_0) q8_0.dotRows(nb, base, row_bytes, len, qb, dst) else q4_0.dotRows(nb, base, row_bytes, len, qb, dst);
                    }
                    i += len;
                }
            },
            inline .tq3, .tq4 => |p, kt| {
                const bits = if (kt == .tq3) 3 else 4;
                const vb = kv_turbo.vectorBytes(bits, d);
                for (0..n) |i| {
                    const vec = p + row.kvStart(j + i) / d * vb;
                    const scale = kv_turbo.scaleOf(vec);
                    if (turboFast(d)) {
                        var g: usize = 0;
                        while (g < g_n) : (g += heads_per_pass) switch (@min(heads_per_pass, g_n - g)) {
                            inline 1...heads_per_pass => |G| {
                                const dots = turboDots(bits, G, vec + 2, row.sc.q_rows[g * d ..].ptr, d);
                                inline for (0..G) |x| probs[(g + x) * block_keys + i] = dots[x] * scale;
                            },
                            else => unreachable,
                        };
                    } else {
                        var buf: [attention.head_dim_max]f32 = undefined;
                        kv_turbo.decodeRotated(bits, vec, buf[0..d]);
                        for (0..g_n) |g| probs[g * block_keys + i] = dotF32(row.sc.q_rows[g * d ..][0..d], buf[0..d]);
                    }
                }
            },
            .f32, .f16 => {
                var buf: [attention.head_dim_max]f32 = undefined;
                for (0..n) |i| {
                    const key = row.k.row(row.kvStart(j + i), buf[0..d]);
                    for (0..g_n) |g| probs[g * block_keys + i] = dotF32(row.sc.q_rows[g * d ..][0..d], key);
                }
            },
        }
        for (0..g_n) |g| for (probs[g * block_keys ..][0..n]) |*x| {
            x.* *= s.scale;
        };
    }

    /// The online softmax over one block: each head's max moves to cover the block's scores,
    /// its sum and outputs rescaled where it moved, and the scores become exp(score - max).
    fn softmaxBlock(row: Row, n: usize, st: State) void {
        const d = row.s.head_dim;
        for (0..row.s.group()) |g| {
            const p = row.sc.probs[g * block_keys ..][0..block_keys];
            @memset(p[n..], -std.math.inf(f32));
            var block_max: f32 = -std.math.inf(f32);
            for (p[0..n]) |x| block_max = @max(block_max, x);
            if (block_max > st.max[g]) {
                const correction = @exp(st.max[g] - block_max);
                st.max[g] = block_max;
                st.sum[g] *= correction;
                const o = st.out[g * d ..][0..d];
                if (correction != 1) for (o) |*x| {
                    x.* *= correction;
                };
            }
            const m: L16 = @splat(st.max[g]);
            var total: L16 = @splat(0);
            var i: usize = 0;
            while (i < block_keys) : (i += 16) {
                const e = expV(@as(L16, p[i..][0..16].*) - m);
                p[i..][0..16].* = e;
                total += e;
            }
            st.sum[g] += @reduce(.Add, total);
        }
    }

    /// out[g] += Σ_i probs[g][i] · value(j + i) over the block's n keys.
    fn weightedSum(row: Row, j: usize, n: usize, st: State) void {
        const d = row.s.head_dim;
        const g_n = row.s.group();
        const v = row.v;
        const fast = d % dims_per_pass == 0;
        if (!fast) {
            // Any head size: a row at a time as f32 (the tests' odd sizes; models take the rest).
            var buf: [attention.head_dim_max]f32 = undefined;
            for (0..n) |i| {
                const start = row.kvStart(j + i);
                const val = switch (v) {
                    inline .tq3, .tq4 => |p, t| blk: {
                        const bits = if (t == .tq3) 3 else 4;
                        kv_turbo.decodeRotated(bits, p + start / d * kv_turbo.vectorBytes(bits, d), buf[0..d]);
                        break :blk buf[0..d];
                    },
                    else => v.row(start, buf[0..d]),
                };
                for (0..g_n) |g| {
                    const w = row.sc.probs[g * block_keys + i];
                    for (st.out[g * d ..][0..d], val) |*o, x| o.* += w * x;
                }
            }
            return;
        }
        var g: usize = 0;
        while (g < g_n) : (g += heads_per_pass) switch (@min(heads_per_pass, g_n - g)) {
            inline 1...heads_per_pass => |G| for (0..d / dims_per_pass) |c| {
                var acc: [G][4]L16 = undefined;
                inline for (0..G) |x| inline for (0..4) |l| {
                    acc[x][l] = st.out[(g + x) * d + 64 * c + 16 * l ..][0..16].*;
                };
                for (0..n) |i| {
                    const vals = valuePass(v, row.kvStart(j + i), d, c);
                    inline for (0..G) |x| {
                        const w: L16 = @splat(row.sc.probs[(g + x) * block_keys + i]);
                        inline for (0..4) |l| acc[x][l] = @mulAdd(L16, vals[l], w, acc[x][l]);
                    }
                }
                inline for (0..G) |x| inline for (0..4) |l| {
                    st.out[(g + x) * d + 64 * c + 16 * l ..][0..16].* = acc[x][l];
                };
            },
            else => unreachable,
        };
    }

    /// Folds state b (the later keys) into a: both maxima moved to the larger.
    fn merge(row: Row, a: State, b: State) void {
        const d = row.s.head_dim;
        for (0..row.s.group()) |g| {
            const m = @max(a.max[g], b.max[g]);
            const ca = if (a.max[g] == m) 1 else @exp(a.max[g] - m);
            const cb = if (b.max[g] == m) 1 else @exp(b.max[g] - m);
            a.max[g] = m;
            a.sum[g] = a.sum[g] * ca + b.sum[g] * cb;
            for (a.out[g * d ..][0..d], b.out[g * d ..][0..d]) |*x, y| x.* = x.* * ca + y * cb;
        }
    }

    /// The output rows: a sink joined to the softmax (after the keys, as llama.cpp adds it), the
    /// sums divided out, the rotated codes' order and rotation undone. st.out may be the output.
    fn finish(row: Row, st: State, out: [*]f32, t: usize) void {
        const s = row.s;
        const d = s.head_dim;
        for (0..s.group()) |g| {
            const h = row.first_head + g;
            var keep: f32 = 1;
            var sum = st.sum[g];
            if (s.sink(h)) |sink| {
                if (sink > st.max[g]) {
                    keep = @exp(st.max[g] - sink);
                    sum = sum * keep + 1;
                } else sum += @exp(sink - st.max[g]);
            }
            const scale = keep / sum;
            const o = out[(t * s.n_head + h) * d ..][0..d];
            var acc_buf: [attention.head_dim_max]f32 = undefined;
            const acc = acc_buf[0..d];
            @memcpy(acc, st.out[g * d ..][0..d]);
            switch (row.v) {
                inline .tq3, .tq4 => |_, vt| {
                    if (turboFast(d)) unpermute(if (vt == .tq3) 3 else 4, acc, o) else @memcpy(o, acc);
                    for (o) |*x| x.* *= scale;
                    kv_turbo.unrotate(o);
                },
                else => for (o, acc) |*x, y| {
                    x.* = y * scale;
                },
            }
        }
    }
};

/// Dots of G permuted rotated query heads (q_rows, d apart) with a coded vector's levels.
inline fn turboDots(comptime bits: u32, comptime G: usize, codes: [*]const u8, q_rows: [*]const f32, d: usize) [G]f32 {
    var acc: [G]L16 = @splat(@splat(0));
    for (0..d / dims_per_pass) |c| {
        const lv = turboLevels(bits, codes, d, c);
        inline for (0..G) |x| inline for (0..4) |l| {
            acc[x] = @mulAdd(L16, lv[l], q_rows[x * d + 64 * c + 16 * l ..][0..16].*, acc[x]);
        };
    }
    var out: [G]f32 = undefined;
    inline for (0..G) |x| out[x] = @reduce(.Add, acc[x]);
    return out;
}

fn dotF32(a: []const f32, b: []const f32) f32 {
    var acc: L16 = @splat(0);
    var i: usize = 0;
    while (i + 16 <= a.len) : (i += 16) acc = @mulAdd(L16, a[i..][0..16].*, b[i..][0..16].*, acc);
    var sum = @reduce(.Add, acc);
    while (i < a.len) : (i += 1) sum += a[i] * b[i];
    return sum;
}

// ---- rows, and a row's chunks across the threads --------------------------------------------

/// Work rows [row_begin, row_end), each its chunks in turn. False when scratch memory fails.
pub fn attendRows(q: [*]const f32, k: Cache, v: Cache, out: [*]f32, s: Shape, row_begin: usize, row_end: usize) bool {
    const sc = &scratch;
    if (!sc.grow(s)) return false;
    const g_n = s.group();
    const d = s.head_dim;
    for (row_begin..row_end) |r| {
        const row = Row.init(s, k, v, q, r, sc);
        const t = s.rowToken(r);
        // Chunk 0 straight into the output rows, the later ones merged in.
        var max: [attention.group_max]f32 = undefined;
        var sum: [attention.group_max]f32 = undefined;
        const first = State{ .out = out[(t * s.n_head + row.first_head) * d ..][0 .. g_n * d], .max = max[0..g_n], .sum = sum[0..g_n] };
        row.chunk(0, first);
        const part = State{ .out = sc.part, .max = sc.part_max, .sum = sc.part_sum };
        for (1..row.chunkCount()) |c| {
            row.chunk(c, part);
            row.merge(first, part);
        }
        row.finish(first, out, t);
    }
    return true;
}

/// The states of every (row, chunk) of a split call, made by the threads and merged after.
threadlocal var split_states: []f32 = &.{};

const SplitJob = struct {
    q: [*]const f32,
    k: Cache,
    v: Cache,
    s: Shape,
    chunks: usize,
    states: []f32,
    failed: std.atomic.Value(bool) = .init(false),

    fn stride(job: *const SplitJob) usize {
        return job.s.group() * (job.s.head_dim + 2);
    }

    fn state(job: *const SplitJob, r: usize, c: usize) State {
        const g_n = job.s.group();
        const base = job.states[(r * job.chunks + c) * job.stride() ..];
        return .{ .out = base[0 .. g_n * job.s.head_dim], .max = base[g_n * job.s.head_dim ..][0..g_n], .sum = base[g_n * (job.s.head_dim + 1) ..][0..g_n] };
    }

    fn task(job: *SplitJob, i: usize) void {
        const r = i / job.chunks;
        const c = i % job.chunks;
        const sc = &scratch;
        if (!sc.grow(job.s)) return job.failed.store(true, .monotonic);
        const row = Row.init(job.s, job.k, job.v, job.q, r, sc);
        if (c < row.chunkCount()) row.chunk(c, job.state(r, c));
    }
};

/// Whether a call is split by chunks across the threads: fewer rows than threads (a decode
/// step's one row a KV head) and a row of several chunks.
pub fn splits(s: Shape, n_threads: usize) bool {
    if (n_threads <= 1 or s.rowCount() >= n_threads) return false;
    const begin, const end = s.keyRange(s.pos0 + s.n_tok - 1);
    return end - begin > chunk_keys;
}

/// All rows, their chunks spread over the thread pool, then merged in order per row.
pub fn attentionSplit(q: [*]const f32, k: Cache, v: Cache, out: [*]f32, s: Shape) bool {
    const rows = s.rowCount();
    var chunks: usize = 1;
    for (0..s.n_tok) |t| {
        const begin, const end = s.keyRange(s.pos0 + t);
        chunks = @max(chunks, std.math.divCeil(usize, end - begin, chunk_keys) catch unreachable);
    }
    var job = SplitJob{ .q = q, .k = k, .v = v, .s = s, .chunks = chunks, .states = &.{} };
    if (!growSlice(f32, &split_states, rows * chunks * job.stride())) return false;
    job.states = split_states;
    threads.run(rows * chunks, &job, SplitJob.task);
    if (job.failed.load(.monotonic)) return false;
    const sc = &scratch;
    if (!sc.grow(s)) return false;
    for (0..rows) |r| {
        const row = Row.init(s, k, v, q, r, sc);
        const first = job.state(r, 0);
        for (1..row.chunkCount()) |c| row.merge(first, job.state(r, c));
        row.finish(first, out, s.rowToken(r));
    }
    return true;
}

// ---- tests ----------------------------------------------------------------------------------

test "the lane tables give the scalar decode's levels, in permuted order" {
    var rng = std.Random.DefaultPrng.init(3);
    const rand = rng.random();
    inline for (.{ 3, 4 }) |bits| {
        for ([_]usize{ 64, 128, 256 }) |d| {
            var x: [256]f32 = undefined;
            for (x[0..d]) |*v| v.* = rand.floatNorm(f32);
            var codes: [2 + 256 * 4 / 8]u8 = undefined;
            kv_turbo.encode(bits, x[0..d], &codes);
            var want: [256]f32 = undefined;
            kv_turbo.decodeRotatedScalar(bits, &codes, want[0..d]);
            var want_perm: [256]f32 = undefined;
            permute(bits, want[0..d], want_perm[0..d]);
            const cache: Cache = if (bits == 3) .{ .tq3 = &codes } else .{ .tq4 = &codes };
            for (0..d / 64) |c| {
                const got = valuePass(cache, 0, d, c);
                for (0..64) |i| try std.testing.expectEqual(want_perm[64 * c + i], got[i / 16][i % 16]);
            }
            // The key dot: a permuted query with the unscaled levels, times the scale.
            var q: [256]f32 = undefined;
            for (q[0..d]) |*v| v.* = rand.floatNorm(f32);
            var q_perm: [256]f32 = undefined;
            permute(bits, q[0..d], q_perm[0..d]);
            var ref: f64 = 0;
            for (q[0..d], want[0..d]) |a, b| ref += a * b;
            const got = turboDots(bits, 1, codes[2..].ptr, &q_perm, d)[0] * kv_turbo.scaleOf(&codes);
            try std.testing.expectApproxEqAbs(@as(f32, @floatCast(ref)), got, 1e-4 * @as(f32, @floatFromInt(d)));
            var back: [256]f32 = undefined;
            unpermute(bits, want_perm[0..d], back[0..d]);
            try std.testing.expectEqualSlices(f32, want[0..d], back[0..d]);
        }
    }
}

test "Q8_0 and Q4_0 value passes equal the dequantized rows" {
    var rng = std.Random.DefaultPrng.init(4);
    const rand = rng.random();
    var x: [128]f32 = undefined;
    for (&x) |*v| v.* = rand.floatNorm(f32) * 2;
    var b8: [4]kv_quant.Q8Block = undefined;
    var b4: [4]kv_quant.Q4Block = undefined;
    kv_quant.storeQ8(&x, @ptrCast(&b8));
    kv_quant.storeQ4(&x, @ptrCast(&b4));
    for ([_]Cache{ .{ .q8_0 = &b8 }, .{ .q4_0 = &b4 } }) |cache| {
        var want: [128]f32 = undefined;
        _ = cache.row(0, &want);
        for (0..2) |c| {
            const got = valuePass(cache, 0, 128, c);
            for (0..64) |i| try std.testing.expectApproxEqRel(want[64 * c + i], got[i / 16][i % 16], 1e-6);
        }
    }
}

test "long rows: chunks across the threads give one thread's bits, near the two-pass reference" {
    const gpa = std.testing.allocator;
    var rng = std.Random.DefaultPrng.init(11);
    const rand = rng.random();
    const KvType = attention.KvType;
    const pairs = [_][2]KvType{ .{ .q8_0, .q8_0 }, .{ .q4_0, .q4_0 }, .{ .tq4, .tq4 }, .{ .tq3, .tq3 }, .{ .q8_0, .tq4 }, .{ .f16, .q8_0 }, .{ .f32, .f32 } };
    // Decode after a prompt of 1,700 (four chunks, the last partial) and a ring's wrapped window.
    const shapes = [_]Shape{
        .{ .n_tok = 1, .n_head = 4, .n_kv_head = 1, .head_dim = 128, .pos0 = 1700, .kv_stride = 128, .window = 0, .scale = 0.09 },
        .{ .n_tok = 1, .n_head = 8, .n_kv_head = 2, .head_dim = 64, .pos0 = 2100, .kv_stride = 128, .window = 1200, .ring = 1300, .scale = 0.125 },
    };
    try threads.setThreadCount(3);
    defer threads.setThreadCount(1) catch {};
    for (shapes) |s| for (pairs) |pair| {
        const n = s.cacheLen();
        const kv = try gpa.alloc(f32, 2 * n);
        defer gpa.free(kv);
        for (kv) |*x| x.* = rand.floatNorm(f32);
        const q = try gpa.alloc(f32, s.n_tok * s.n_head * s.head_dim);
        defer gpa.free(q);
        for (q) |*x| x.* = rand.floatNorm(f32);
        const kb = try gpa.alignedAlloc(u8, 4, pair[0].bytes(n, s.head_dim));
        defer gpa.free(kb);
        const vb = try gpa.alignedAlloc(u8, 4, pair[1].bytes(n, s.head_dim));
        defer gpa.free(vb);
        attention.store(kv[0..n], kb.ptr, pair[0], s.head_dim);
        attention.store(kv[n..], vb.ptr, pair[1], s.head_dim);
        const k = Cache.fromBytes(pair[0], kb.ptr);
        const v = Cache.fromBytes(pair[1], vb.ptr);
        const split = try gpa.alloc(f32, q.len);
        defer gpa.free(split);
        const one = try gpa.alloc(f32, q.len);
        defer gpa.free(one);
        const want = try gpa.alloc(f32, q.len);
        defer gpa.free(want);
        try std.testing.expect(splits(s, 3));
        try std.testing.expect(attentionSplit(q.ptr, k, v, split.ptr, s));
        try std.testing.expect(attendRows(q.ptr, k, v, one.ptr, s, 0, s.rowCount()));
        try std.testing.expectEqualSlices(f32, one, split);
        const scores = try gpa.alloc(f32, s.pos0 + s.n_tok);
        defer gpa.free(scores);
        attention.attentionReference(q.ptr, k, v, want.ptr, s, scores);
        for (want, one) |w, g| try std.testing.expectApproxEqAbs(w, g, 1e-4);
    };
}
