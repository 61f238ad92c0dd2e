//! Integer dot-product building blocks shared by the quantized kernels.
//! The library is built for the native CPU, so the instruction choice is made at comptime from
//! `builtin.cpu.features`: AVX-512 VNNI (vpdpbusd), else AVX2 (vpmaddubsw + vpmaddwd, as ggml's
//! AVX2 kernels do), else portable @Vector arithmetic. Every path returns exactly the same integers
//! (the AVX2 path never saturates for the operand ranges the kernels feed it, noted per caller).
const std = @import("std");
const builtin = @import("builtin");

pub const V32u8 = @Vector(32, u8);
pub const V32i8 = @Vector(32, i8);
pub const V16i16 = @Vector(16, i16);
pub const V8i32 = @Vector(8, i32);
pub const V8f32 = @Vector(8, f32);

pub const is_x86 = builtin.cpu.arch == .x86_64;
pub const has_vnni = is_x86 and
    std.Target.x86.featureSetHasAll(builtin.cpu.features, .{ .avx512vnni, .avx512vl });
const has_avx2 = is_x86 and std.Target.x86.featureSetHas(builtin.cpu.features, .avx2);
const is_arm = builtin.cpu.arch == .aarch64;
const has_dotprod = is_arm and std.Target.aarch64.featureSetHas(builtin.cpu.features, .dotprod);

/// Names the path compiled in, for benchmark reports.
pub const path_name = if (has_vnni)
    "avx512-vnni"
else if (has_avx2)
    "avx2"
else if (has_dotprod)
    "neon-dotprod"
else if (is_arm)
    "neon"
else
    "generic";

/// NEON SDOT (Armv8.2 dot product): each i32 lane adds the four products of its i8 group, the
/// same grouping as vpdpbusd, so both paths give the same integers.
inline fn sdot(acc: @Vector(4, i32), a: @Vector(16, i8), b: @Vector(16, i8)) @Vector(4, i32) {
    return asm ("sdot %[acc].4s, %[a].16b, %[b].16b"
        : [acc] "=w" (-> @Vector(4, i32)),
        : [a] "w" (a),
          [b] "w" (b),
          [acc_in] "0" (acc),
    );
}

inline fn sdot32(acc: V8i32, a: V32i8, b: V32i8) V8i32 {
    const lo = sdot(@shuffle(i32, acc, undefined, [4]i32{ 0, 1, 2, 3 }), half(i8, a, 0), half(i8, b, 0));
    const hi = sdot(@shuffle(i32, acc, undefined, [4]i32{ 4, 5, 6, 7 }), half(i8, a, 16), half(i8, b, 16));
    return @shuffle(i32, lo, hi, [8]i32{ 0, 1, 2, 3, -1, -2, -3, -4 });
}

inline fn half(comptime T: type, v: @Vector(32, T), comptime first: usize) @Vector(16, T) {
    return @shuffle(T, v, undefined, if (first == 0) low_half else high_half);
}

const low_half = halfMask(0);
const high_half = halfMask(16);

fn halfMask(comptime first: i32) [16]i32 {
    var m: [16]i32 = undefined;
    for (0..16) |i| m[i] = first + @as(i32, @intCast(i));
    return m;
}

/// dotU8I8 for callers whose unsigned operand stays below 128 (nibbles, small quants): on
/// aarch64 it is one SDOT per 16 bytes, elsewhere the same as dotU8I8.
pub inline fn dotU7I8(a: V32u8, b: V32i8) V8i32 {
    if (comptime has_dotprod) return sdot32(@splat(0), @bitCast(a), b);
    return dotU8I8(a, b);
}

/// dotAccU8I8 for unsigned operands below 128: one SDOT per 16 bytes on aarch64.
pub inline fn dotAccU7I8(acc: V8i32, a: V32u8, b: V32i8) V8i32 {
    if (comptime has_dotprod) return sdot32(acc, @bitCast(a), b);
    return dotAccU8I8(acc, a, b);
}

/// `instruction` (an AVX-512 VNNI dot: vpdpbusd, vpdpwssd) of acc and a with the i32 words[word]
/// in every lane, the word read and broadcast by the instruction itself (an embedded {1to8}
/// broadcast): one instruction where a broadcast and the dot were two; the hot loops of the
/// repacked kernels issue one such dot per 32 weight bytes. `word` is comptime so that its offset
/// is written into the instruction and one register holds `words` for every use. The asm reads
/// words[word] through the pointer, so it declares a memory clobber: no store to the words moves
/// past it (measured free: the kernels' loops run as fast with it).
inline fn vnniWord(comptime instruction: []const u8, acc: V8i32, a: anytype, words: [*]align(1) const i32, comptime word: usize) V8i32 {
    comptime std.debug.assert(has_vnni);
    return asm (std.fmt.comptimePrint("{s} {d}(%[p]){{1to8}}, %[a], %[acc]", .{ instruction, 4 * word })
        : [acc] "=v" (-> V8i32),
        : [a] "v" (a),
          [p] "r" (words),
          [acc_in] "0" (acc),
        : "memory"
    );
}

/// dotAccU7I8(acc, a, the i32 words[word] in every lane), by vnniWord's vpdpbusd where there is
/// VNNI (which takes any unsigned byte in a).
pub inline fn dotAccU7I8Word(acc: V8i32, a: V32u8, words: [*]align(1) const i32, comptime word: usize) V8i32 {
    if (comptime has_vnni) return vnniWord("vpdpbusd", acc, a, words, word);
    return dotAccU7I8(acc, a, @bitCast(@as(V8i32, @splat(words[word]))));
}

/// acc[k] + a[2k] * w0 + a[2k+1] * w1 for k < 8, where (w0, w1) are the two i16 of the i32
/// words[word] (vnniWord's vpdpwssd: exact i32 sums of i16 products). Only where has_vnni.
pub inline fn dotAccI16Word(acc: V8i32, a: V16i16, words: [*]align(1) const i32, comptime word: usize) V8i32 {
    return vnniWord("vpdpwssd", acc, a, words, word);
}

/// Where the row-major kernels that read several rows a block at a time (q4_0.dotRows' eight,
/// q8_0.dotRowsOffset's four) prefetch the next rows: into L1 where `rows` rows fit beside the
/// ones being read (16 KiB), else L2. Q4_0, 1,024-wide rows: 94-97% of the bandwidth with L1,
/// 71-75% with L2; 8,192-wide: 75% with L1, 97-109% with L2.
pub fn nextRowsInL1(rows: usize, row_bytes: usize) bool {
    return rows * row_bytes <= 16 << 10;
}

/// Prefetches block column b's share of the `rows` rows after the `rows` at w (rows back to back,
/// blocks of block_bytes): called once a block column, it walks those rows' bytes in order. Such
/// kernels read rows a few bytes at a time each, which the hardware's prefetchers do not follow
/// (Q4_0 eight rows: 10 GB/s from DRAM with 2 cores without it). Never faults past the end.
pub inline fn prefetchNextRows(comptime rows: usize, comptime block_bytes: usize, comptime to_l1: bool, w: [*]const u8, row_bytes: usize, b: usize) void {
    const ahead = w + rows * row_bytes + b * rows * block_bytes;
    inline for (0..(rows * block_bytes + 63) / 64) |l| @prefetch(ahead + 64 * l, .{ .locality = if (to_l1) 3 else 2 });
}

/// One token over n_out row-major rows of format Fmt (n_blocks Fmt.Block a row): `rows` rows at
/// a time by Fmt.rowGroup(next_in_l1, n_blocks, first row, w_row_bytes, x), which prefetches the
/// next rows (into L1 where nextRowsInL1 says), the rest one at a time by Fmt.dot.
pub inline fn dotRowGroups(comptime Fmt: type, comptime rows: usize, n_blocks: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: anytype, out: [*]f32) void {
    var o: usize = 0;
    const next_in_l1 = nextRowsInL1(rows, w_row_bytes);
    while (o + rows <= n_out) : (o += rows) {
        const first = w + o * w_row_bytes;
        out[o..][0..rows].* = if (next_in_l1)
            Fmt.rowGroup(true, n_blocks, first, w_row_bytes, x)
        else
            Fmt.rowGroup(false, n_blocks, first, w_row_bytes, x);
    }
    while (o < n_out) : (o += 1) {
        const row: [*]align(1) const Fmt.Block = @ptrCast(w + o * w_row_bytes);
        out[o] = Fmt.dot(row[0..n_blocks], x[0..n_blocks]);
    }
}

/// A K-quant superblock's scaled sum over its 8 sub-blocks of 32 values, in 8 integer lanes:
/// sum_j scale_j * (q_j . x_j), as two chains (exact integers, so any grouping) to halve the
/// dot instructions' latency chain. x: the Q8_K block's sub-blocks (q8_k.subBlocks).
pub inline fn scaledDots(q: *const [8]V32u8, x: *const [8]V32i8, scale: *const [8]V16i16) V8i32 {
    var sumi: [2]V8i32 = @splat(@splat(0));
    inline for (0..8) |j| sumi[j % 2] = dotScaledAcc(sumi[j % 2], q[j], x[j], scale[j]);
    return sumi[0] + sumi[1];
}

/// acc[k] + sum_{j<4} a[4k+j] * b[4k+j] for k < 8: u8 x i8 products summed in groups of four.
/// Callers keep a <= 128 and pairs a*b + a'*b' within i16 (|sum| <= 32767) so AVX2 never saturates.
pub inline fn dotAccU8I8(acc: V8i32, a: V32u8, b: V32i8) V8i32 {
    if (comptime has_vnni) {
        return asm ("vpdpbusd %[b], %[a], %[acc]"
            : [acc] "=x" (-> V8i32),
            : [a] "x" (a),
              [b] "x" (b),
              [acc_in] "0" (acc),
        );
    } else if (comptime has_avx2) {
        const pairs = asm ("vpmaddubsw %[b], %[a], %[out]"
            : [out] "=x" (-> V16i16),
            : [a] "x" (a),
              [b] "x" (b),
        );
        const ones: V16i16 = @splat(1);
        const quads = asm ("vpmaddwd %[b], %[a], %[out]"
            : [out] "=x" (-> V8i32),
            : [a] "x" (pairs),
              [b] "x" (ones),
        );
        return acc + quads;
    } else {
        return acc + dotU8I8Generic(a, b);
    }
}

/// acc + (u8 x i8 products summed in pairs, each pair times the i16 `scale` of its lane,
/// summed in pairs again): the K-quant inner step, a sub-block dot times its scale in two
/// instructions. Callers keep |a*b + a'*b'| <= 32767 (vpmaddubsw saturates beyond).
pub inline fn dotScaledAcc(acc: V8i32, a: V32u8, b: V32i8, scale: V16i16) V8i32 {
    if (comptime has_vnni or has_avx2) {
        const pairs = asm ("vpmaddubsw %[b], %[a], %[out]"
            : [out] "=x" (-> V16i16),
            : [a] "x" (a),
              [b] "x" (b),
        );
        if (comptime has_vnni) {
            return asm ("vpdpwssd %[s], %[p], %[acc]"
                : [acc] "=x" (-> V8i32),
                : [p] "x" (pairs),
                  [s] "x" (scale),
                  [acc_in] "0" (acc),
            );
        }
        const quads = asm ("vpmaddwd %[s], %[p], %[out]"
            : [out] "=x" (-> V8i32),
            : [p] "x" (pairs),
              [s] "x" (scale),
        );
        return acc + quads;
    } else {
        const prod = @as(@Vector(32, i32), a) * @as(@Vector(32, i32), b);
        const even = even_lanes;
        const odd = odd_lanes;
        const pairs = @shuffle(i32, prod, undefined, even) + @shuffle(i32, prod, undefined, odd);
        const scaled = pairs * @as(@Vector(16, i32), scale);
        return acc + @shuffle(i32, scaled, undefined, even[0..8].*) +
            @shuffle(i32, scaled, undefined, odd[0..8].*);
    }
}

/// i16 products summed in pairs: lane k = a[2k] * b[2k] + a[2k+1] * b[2k+1] (vpmaddwd).
pub inline fn maddI16(a: V16i16, b: V16i16) V8i32 {
    if (comptime has_avx2) {
        return asm ("vpmaddwd %[b], %[a], %[out]"
            : [out] "=x" (-> V8i32),
            : [a] "x" (a),
              [b] "x" (b),
        );
    } else {
        const prod = @as(@Vector(16, i32), a) * @as(@Vector(16, i32), b);
        return @shuffle(i32, prod, undefined, even_lanes[0..8].*) +
            @shuffle(i32, prod, undefined, odd_lanes[0..8].*);
    }
}

/// The lane sums of 8 vectors, [@reduce(.Add, v[0]), ..., @reduce(.Add, v[7])], by a
/// transposing tree of pairwise adds (3 levels instead of 8 separate reductions).
pub inline fn reduceEight(v: [8]V8i32) V8i32 {
    // Level 1: lanes [a0+a1, b0+b1, a2+a3, b2+b3, ...] for each pair (a, b).
    var t: [4]V8i32 = undefined;
    inline for (0..4) |k| {
        t[k] = @shuffle(i32, v[2 * k], v[2 * k + 1], [8]i32{ 0, -1, 2, -3, 4, -5, 6, -7 }) +
            @shuffle(i32, v[2 * k], v[2 * k + 1], [8]i32{ 1, -2, 3, -4, 5, -6, 7, -8 });
    }
    // Level 2: [a0..3, b0..3, c0..3, d0..3, a4..7, b4..7, c4..7, d4..7] per pair of pairs.
    var u: [2]V8i32 = undefined;
    inline for (0..2) |k| {
        u[k] = @shuffle(i32, t[2 * k], t[2 * k + 1], [8]i32{ 0, 1, -1, -2, 4, 5, -5, -6 }) +
            @shuffle(i32, t[2 * k], t[2 * k + 1], [8]i32{ 2, 3, -3, -4, 6, 7, -7, -8 });
    }
    // Level 3: the two halves of each sum meet.
    return @shuffle(i32, u[0], u[1], [8]i32{ 0, 1, 2, 3, -1, -2, -3, -4 }) +
        @shuffle(i32, u[0], u[1], [8]i32{ 4, 5, 6, 7, -5, -6, -7, -8 });
}

const even_lanes = evenOdd(0);
const odd_lanes = evenOdd(1);

fn evenOdd(comptime first: i32) [16]i32 {
    var m: [16]i32 = undefined;
    for (0..16) |i| m[i] = 2 * @as(i32, @intCast(i)) + first;
    return m;
}

pub inline fn dotU8I8(a: V32u8, b: V32i8) V8i32 {
    return dotAccU8I8(@splat(0), a, b);
}

fn dotU8I8Generic(a: V32u8, b: V32i8) V8i32 {
    const prod = @as(@Vector(32, i32), a) * @as(@Vector(32, i32), b);
    var sum: V8i32 = @splat(0);
    inline for (0..4) |j| {
        const lane_mask = comptime blk: {
            var mask: [8]i32 = undefined;
            for (0..8) |k| mask[k] = @intCast(4 * k + j);
            break :blk mask;
        };
        sum += @shuffle(i32, prod, undefined, lane_mask);
    }
    return sum;
}

/// Signed x signed in groups of four, by ggml's sign trick: |a| * (b with a's sign).
/// Exact unless b holds -128 where a is negative; activation quants stay within [-127, 127].
pub inline fn dotAccI8I8(acc: V8i32, a: V32i8, b: V32i8) V8i32 {
    if (comptime has_dotprod) return sdot32(acc, a, b); // signed x signed directly: exact
    if (comptime has_avx2) {
        // vpsignb: b negated where a < 0 (and zeroed where a = 0, whose product is 0 anyway), one
        // instruction where LLVM lowers the select below to a compare, a xor and a subtract.
        const b_signed = asm ("vpsignb %[a], %[b], %[out]"
            : [out] "=x" (-> V32i8),
            : [b] "x" (b),
              [a] "x" (a),
        );
        return dotAccU8I8(acc, @abs(a), b_signed);
    }
    const zero: V32i8 = @splat(0);
    const b_signed = @select(i8, a < zero, zero -% b, b);
    return dotAccU8I8(acc, @abs(a), b_signed);
}

/// Horizontal sum in ggml's hsum_float_8 order, ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)), so a
/// dot rounds exactly as llama.cpp's does.
pub inline fn hsum(v: V8f32) f32 {
    const a = [4]f32{ v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7] };
    return (a[0] + a[2]) + (a[1] + a[3]);
}

/// Loads 32 bytes from an unaligned pointer.
pub inline fn load32(p: [*]const u8) V32u8 {
    return p[0..32].*;
}

pub inline fn load32i(p: [*]const i8) V32i8 {
    return p[0..32].*;
}

/// table[idx[i]] in each of the 32 lanes (every idx below 16): a table-lookup decode (MXFP4's
/// codes). One vpshufb with AVX2 (which looks up within each 128-bit half, so the table sits in
/// both halves), two tbl on aarch64, else lane by lane.
pub inline fn lookup16(table: @Vector(16, u8), idx: V32u8) V32u8 {
    if (comptime has_avx2) {
        return asm ("vpshufb %[i], %[t], %[out]"
            : [out] "=x" (-> V32u8),
            : [t] "x" (concat16(table, table)),
              [i] "x" (idx),
        );
    }
    if (comptime is_arm) {
        const lo = asm ("tbl %[out].16b, {%[t].16b}, %[i].16b"
            : [out] "=w" (-> @Vector(16, u8)),
            : [t] "w" (table),
              [i] "w" (half(u8, idx, 0)),
        );
        const hi = asm ("tbl %[out].16b, {%[t].16b}, %[i].16b"
            : [out] "=w" (-> @Vector(16, u8)),
            : [t] "w" (table),
              [i] "w" (half(u8, idx, 16)),
        );
        return concat16(lo, hi);
    }
    const t: [16]u8 = table;
    const ids: [32]u8 = idx;
    var out: [32]u8 = undefined;
    for (&out, ids) |*o, i| o.* = t[i];
    return out;
}

/// Concatenates two 16-lane vectors into one 32-lane vector.
pub inline fn concat16(lo: @Vector(16, u8), hi: @Vector(16, u8)) V32u8 {
    return @shuffle(u8, lo, hi, concat_mask);
}

const concat_mask = blk: {
    var m: [32]i32 = undefined;
    for (0..16) |i| {
        m[i] = @intCast(i);
        m[16 + i] = ~@as(i32, @intCast(i));
    }
    break :blk m;
};

/// Small deterministic generator for the kernels' tests (xorshift64*), so failures reproduce.
pub const TestRng = struct {
    state: u64,
    pub fn init(seed: u64) TestRng {
        return .{ .state = seed *% 0x9E3779B97F4A7C15 | 1 };
    }
    pub fn next(self: *TestRng) u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        return self.state *% 0x2545F4914F6CDD1D;
    }
    pub fn bytes(self: *TestRng, out: []u8) void {
        for (out) |*b| b.* = @truncate(self.next() >> 32);
    }
    /// Uniform in [-1, 1).
    pub fn float(self: *TestRng) f32 {
        const u: f32 = @floatFromInt(self.next() >> 40);
        return u / @as(f32, 1 << 23) - 1.0;
    }
    pub fn floats(self: *TestRng, out: []f32, scale: f32) void {
        for (out) |*v| v.* = self.float() * scale;
    }
};

test "dotU8I8 matches the widened generic sum" {
    var rng = TestRng.init(1);
    for (0..100) |_| {
        var a_bytes: [32]u8 = undefined;
        var b_bytes: [32]u8 = undefined;
        rng.bytes(&a_bytes);
        rng.bytes(&b_bytes);
        for (&a_bytes) |*v| v.* >>= 1; // keep within the AVX2 no-saturation range
        var b: [32]i8 = @bitCast(b_bytes);
        for (&b) |*v| v.* = if (v.* == -128) -127 else v.*;
        const got = dotU8I8(a_bytes, b);
        const want = dotU8I8Generic(a_bytes, b);
        try std.testing.expectEqual(want, got);
        var scale: V16i16 = undefined;
        for (0..16) |k| scale[k] = @as(i16, @intCast(k)) - 5;
        const scaled = dotScaledAcc(@splat(0), a_bytes, b, scale);
        var want_scaled: V8i32 = @splat(0);
        for (0..32) |j| want_scaled[j / 4] += @as(i32, a_bytes[j]) * b[j] * scale[j / 2];
        try std.testing.expectEqual(want_scaled, scaled);
        var eight: [8]V8i32 = undefined;
        for (&eight, 0..) |*e, k| e.* = want + @as(V8i32, @splat(@as(i32, @intCast(k * 1000))));
        const reduced = reduceEight(eight);
        for (0..8) |k| try std.testing.expectEqual(@reduce(.Add, eight[k]), reduced[k]);
        const signed: V32i8 = @bitCast(b_bytes);
        const s = @reduce(.Add, dotAccI8I8(@splat(0), signed, b));
        var s_ref: i32 = 0;
        for (0..32) |i| s_ref += @as(i32, signed[i]) * b[i];
        try std.testing.expectEqual(s_ref, s);
    }
}

/// Test helper: W.dot and W.dotMulti (1 to 4 rows) equal W.dotGgmlScalar, the scalar emulation
/// of the order ggml's x86 kernel rounds in, bit for bit, on random blocks (`fixBlock` makes
/// the scale fields finite) and random activations quantized by X.quantize.
pub fn expectGgmlOrder(
    comptime W: type,
    comptime X: type,
    seed: u64,
    fixBlock: fn (*W.Block, *TestRng) void,
) !void {
    const alloc = std.testing.allocator;
    var rng = TestRng.init(seed);
    const R = 4;
    for ([_]usize{ 1, 2, 5, 16, 33 }) |n_blocks| {
        const n = n_blocks * W.block_values;
        const n_x = n / X.block_values;
        const w = try alloc.alloc(W.Block, n_blocks);
        defer alloc.free(w);
        const x = try alloc.alloc(f32, n);
        defer alloc.free(x);
        const xq = try alloc.alloc(X.Block, R * n_x);
        defer alloc.free(xq);
        for (w) |*b| {
            rng.bytes(std.mem.asBytes(b));
            fixBlock(b, &rng);
        }
        var rows: [R][*]align(1) const X.Block = undefined;
        for (0..R) |r| {
            rng.floats(x, 3);
            // Outliers make the quantizer's rounding and the 8-bit extremes show up.
            for (0..n / 61) |k| x[61 * k + r] *= 40;
            X.quantize(x, xq[r * n_x ..][0..n_x]);
            rows[r] = xq[r * n_x ..].ptr;
        }
        var want: [R]u32 = undefined;
        for (0..R) |r| want[r] = @bitCast(W.dotGgmlScalar(w, rows[r][0..n_x]));
        try std.testing.expectEqual(want[0], @as(u32, @bitCast(W.dot(w, rows[0][0..n_x]))));
        inline for (1..R + 1) |rows_n| {
            const got = W.dotMulti(rows_n, w, rows[0..rows_n].*);
            for (0..rows_n) |r| try std.testing.expectEqual(want[r], @as(u32, @bitCast(got[r])));
        }
    }
}

test "dotU7I8 and dotAccI8I8 equal the plain integer sums (every path)" {
    var rng = TestRng.init(7);
    for (0..50) |_| {
        var a: [32]u8 = undefined;
        var b: [32]u8 = undefined;
        rng.bytes(&a);
        rng.bytes(&b);
        for (&a) |*x| x.* &= 0x7f;
        const av: V32u8 = a;
        const bv: V32i8 = @bitCast(b);
        const want = dotU8I8Generic(av, bv);
        try std.testing.expectEqual(want, dotU7I8(av, bv));
        // signed x signed, keeping b off -128 where the sign trick needs it
        var bs = bv;
        for (0..32) |i| {
            if (bs[i] == -128) bs[i] = -127;
        }
        const as: V32i8 = @bitCast(av -% @as(V32u8, @splat(64)));
        var want_signed: V8i32 = @splat(0);
        for (0..32) |i| want_signed[i / 4] += @as(i32, as[i]) * bs[i];
        try std.testing.expectEqual(want_signed, dotAccI8I8(@splat(0), as, bs));
    }
}
