//! Q8_0: 32 values in 34 bytes: an f16 scale `d` and 32 signed bytes; value = q * d.
//! Also the activation format for Q4_0, Q5_0 and Q8_0 weights (ggml's vec_dot_type).
const std = @import("std");
const simd = @import("simd.zig");

pub const block_values = 32;
pub const Block = extern struct {
    d: f16,
    qs: [32]i8,
};
comptime {
    std.debug.assert(@sizeOf(Block) == 34);
}

pub fn dequantize(src: []align(1) const Block, dst: []f32) void {
    std.debug.assert(dst.len == src.len * block_values);
    for (src, 0..) |b, i| {
        const d: f32 = b.d;
        for (b.qs, dst[i * 32 ..][0..32]) |q, *y| y.* = @as(f32, @floatFromInt(q)) * d;
    }
}

/// Round half to even for |v| < 2^22 by the float "magic number" trick (ggml's nearest_int),
/// matching vroundps(_MM_ROUND_NEAREST) / vcvtnq_s32_f32 in ggml's SIMD quantizers.
pub inline fn roundEven(v: anytype) @TypeOf(v) {
    const T = @TypeOf(v);
    const magic: T = if (@typeInfo(T) == .vector) @splat(12582912.0) else 12582912.0;
    return (v + magic) - magic;
}

/// Activation quantization as ggml-cpu runs it on x86 (AVX2) and ARM (NEON), which is what
/// llama.cpp computes: d = amax/127, q = round_half_even(x * (127/amax)). (ggml's portable
/// quantize_row_q8_0_ref uses x * (1/d) and roundf instead: see quantizeRef.) A block holding a
/// NaN gets d = NaN: the max and the clamp would turn it into a finite quant, and every dot
/// with it must stay NaN so that a forward pass reading NaN weights is caught at its logits.
pub fn quantize(src: []const f32, dst: []align(1) Block) void {
    std.debug.assert(src.len == dst.len * block_values);
    const V = @Vector(32, f32);
    for (dst, 0..) |*b, i| {
        const x: V = src[i * 32 ..][0..32].*;
        const amax = @reduce(.Max, @abs(x));
        const d = amax / 127.0;
        const id: f32 = if (amax != 0) 127.0 / amax else 0;
        b.d = @floatCast(d);
        const q = roundEven(x * @as(V, @splat(id)));
        const clamped = std.math.clamp(q, @as(V, @splat(-128)), @as(V, @splat(127)));
        b.qs = @as(@Vector(32, i8), @intFromFloat(clamped));
        if (@reduce(.Or, x != x)) b.d = std.math.nan(f16);
    }
}

/// ggml's quantize_row_q8_0_ref (what llama-quantize writes into GGUF files).
pub fn quantizeRef(src: []const f32, dst: []align(1) Block) void {
    std.debug.assert(src.len == dst.len * block_values);
    for (dst, 0..) |*b, i| {
        const x = src[i * 32 ..][0..32];
        var amax: f32 = 0;
        for (x) |v| amax = @max(amax, @abs(v));
        const d = amax / 127.0;
        const id: f32 = if (d != 0) 1.0 / d else 0;
        b.d = @floatCast(d);
        // |v · id| <= 127 for every finite v; a NaN or infinite value (whose conversion is
        // undefined) stores 0, what the C cast gives on x86.
        for (x, &b.qs) |v, *q| {
            const r = @round(v * id);
            q.* = if (r >= -128 and r <= 127) @intFromFloat(r) else 0;
        }
    }
}

/// Reference dot of a Q8_0 weight row with a Q8_0 activation row: integer sum per block,
/// scaled by d_w * d_x (ggml_vec_dot_q8_0_q8_0_generic).
pub fn dotScalar(w: []align(1) const Block, x: []align(1) const Block) f32 {
    std.debug.assert(w.len == x.len);
    var sum: f32 = 0;
    for (w, x) |wb, xb| {
        var sumi: i32 = 0;
        for (wb.qs, xb.qs) |a, b| sumi += @as(i32, a) * b;
        sum += @as(f32, @floatFromInt(sumi)) * (@as(f32, wb.d) * @as(f32, xb.d));
    }
    return sum;
}

/// As ggml's AVX2 kernel: 8 lanes of integer partial sums per block, converted and FMA'd.
pub fn dot(w: []align(1) const Block, x: []align(1) const Block) f32 {
    std.debug.assert(w.len == x.len);
    // One accumulator, block by block, as ggml's AVX2 kernel: the rounding then equals
    // llama.cpp's and the multi-row path's, so a batch gives exactly what single tokens give.
    var acc: simd.V8f32 = @splat(0);
    for (w, x) |*wb, *xb| acc = blockDot(acc, wb, xb);
    return simd.hsum(acc);
}

/// Single-token matvec: `dot` of `n_out` rows, w_row_bytes apart, with one activation row.
/// Rows are read one after another: on the EPYC measured (bench/matvec.ts), one sequential
/// stream per core reads memory about twice as fast as two interleaved rows, even though two
/// rows give the core two independent FMA chains.
pub fn dotRows(n_blocks: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]align(1) const Block, out: [*]f32) void {
    if (comptime simd.has_vnni) {
        // w ^ 0x80 is w + 128 as an unsigned byte, which vpdpbusd takes without a sign trick.
        return dotRowsOffset(Block, 128, unpackFlipped, n_blocks, w, w_row_bytes, n_out, x, out);
    }
    for (0..n_out) |o| {
        const row: [*]align(1) const Block = @ptrCast(w + o * w_row_bytes);
        out[o] = dot(row[0..n_blocks], x[0..n_blocks]);
    }
}

inline fn unpackFlipped(b: *align(1) const Block) simd.V32u8 {
    return @as(simd.V32u8, @bitCast(b.qs)) ^ @as(simd.V32u8, @splat(0x80));
}

/// Activation blocks whose lane corrections dotRowsOffset keeps on the stack (n_in <= 32768).
const offset_rows_max_blocks = 1024;

/// `dot`'s arithmetic for formats whose quants are u - offset with u an unsigned byte (Q8_0 as
/// w ^ 0x80 with offset 128, Q5_0 with 16): each of the 8 integer lanes of a block is
/// dpbusd(u, x) - offset * (sum of the lane's four activation quants), which is exactly the
/// signed lane sum, so the FMA chain sees the integers `dot` sees. The corrections depend only
/// on the activations: they are computed once per call, not once per row. Callers keep u * x
/// pairs within i16 where vpmaddubsw is the instruction (AVX2), or use VNNI.
pub inline fn dotRowsOffset(
    comptime WBlock: type,
    comptime offset: i32,
    comptime unpackU: fn (*align(1) const WBlock) callconv(.@"inline") simd.V32u8,
    n_blocks: usize,
    w: [*]const u8,
    w_row_bytes: usize,
    n_out: usize,
    x: [*]align(1) const Block,
    out: [*]f32,
) void {
    if (n_blocks > offset_rows_max_blocks) {
        for (0..n_out) |o| {
            const row: [*]align(1) const WBlock = @ptrCast(w + o * w_row_bytes);
            var acc: simd.V8f32 = @splat(0);
            for (0..n_blocks) |b| acc = blockDotOffset(WBlock, offset, unpackU, acc, &row[b], &x[b], laneCorrection(offset, &x[b]));
            out[o] = simd.hsum(acc);
        }
        return;
    }
    var corrections: [offset_rows_max_blocks]simd.V8i32 = undefined;
    for (0..n_blocks) |b| corrections[b] = laneCorrection(offset, &x[b]);
    // Four rows' FMA chains side by side (a row alone waits on its chain's latency every block),
    // the next four rows prefetched meanwhile (simd.prefetchNextRows).
    var o: usize = 0;
    const next_in_l1 = simd.nextRowsInL1(offset_rows, w_row_bytes);
    while (o + offset_rows <= n_out) : (o += offset_rows) {
        const w_rows = w + o * w_row_bytes;
        if (next_in_l1)
            rowsOffset(offset_rows, true, WBlock, offset, unpackU, n_blocks, w_rows, w_row_bytes, x, &corrections, out + o)
        else
            rowsOffset(offset_rows, false, WBlock, offset, unpackU, n_blocks, w_rows, w_row_bytes, x, &corrections, out + o);
    }
    while (o < n_out) : (o += 1) {
        const row: [*]align(1) const WBlock = @ptrCast(w + o * w_row_bytes);
        var acc: simd.V8f32 = @splat(0);
        for (0..n_blocks) |b| acc = blockDotOffset(WBlock, offset, unpackU, acc, &row[b], &x[b], corrections[b]);
        out[o] = simd.hsum(acc);
    }
}

/// Rows dotRowsOffset takes at a time: from L2, one core, 2,048-wide (`bench/matvec.ts --mib
/// 0.3 --threads 1`), Q5_0 13.7 -> 17.0 GB/s and Q8_0 26.2 -> 35.2 with four against one (eight:
/// 17.4 and 37.9). Several rows read a block at a time defeat the hardware prefetchers (four rows
/// without the prefetch below: 15.6 GB/s from DRAM where one row read 27.5), hence rowsOffset's.
const offset_rows = 4;

/// R adjacent rows of dotRowsOffset, each its own FMA chain in `dot`'s order; the R rows after
/// them (when rows follow rows: w_row_bytes = n_blocks blocks) prefetched in order, a block's
/// share an iteration.
inline fn rowsOffset(
    comptime R: usize,
    comptime next_in_l1: bool,
    comptime WBlock: type,
    comptime offset: i32,
    comptime unpackU: fn (*align(1) const WBlock) callconv(.@"inline") simd.V32u8,
    n_blocks: usize,
    w: [*]const u8,
    w_row_bytes: usize,
    x: [*]align(1) const Block,
    corrections: *const [offset_rows_max_blocks]simd.V8i32,
    out: [*]f32,
) void {
    var rows: [R][*]align(1) const WBlock = undefined;
    inline for (0..R) |r| rows[r] = @ptrCast(w + r * w_row_bytes);
    var acc: [R]simd.V8f32 = @splat(@splat(0));
    for (0..n_blocks) |b| {
        simd.prefetchNextRows(R, @sizeOf(WBlock), next_in_l1, w, w_row_bytes, b);
        inline for (0..R) |r| acc[r] = blockDotOffset(WBlock, offset, unpackU, acc[r], &rows[r][b], &x[b], corrections[b]);
    }
    inline for (0..R) |r| out[r] = simd.hsum(acc[r]);
}

/// Activation rows x blocks that dotRowsMultiSigned keeps, shifted, on the stack.
const multi_max_blocks = 2048;

/// Activation rows per batched call where the batched kernel is dotRowsMultiSigned with VNNI:
/// its two weight rows x 8 activation rows keep 16 accumulators in AVX-512's 32 registers, and
/// each weight block's unpacking, correction and scale serve 8 dots instead of 4.
pub const multi_rows = if (simd.has_vnni) 8 else 4;

/// Whether the batched dot of a format multiplies unsigned activations (x + 128, i.e. x ^ 0x80)
/// by its signed weights, the operand order vpdpbusd and vpmaddubsw take, rather than signed by
/// signed (simd.dotAccI8I8: NEON SDOT, or AVX2's sign trick, |w| times x with w's sign). With
/// VNNI always; on AVX2 only for weights within ±64 (`small_weights`: Q5_0's ±16), since
/// vpmaddubsw's pairs of (x + 128) * w saturate past ±32767 — Q8_0 there takes the sign trick
/// (prefill 86–95 -> 108–122 tok/s on the Qwen3-0.6B shape, where it fell back to dotMulti row by
/// row; Q5_0 kept shifted: the sign trick took Gemma's prefill from ~370 to ~290 tok/s,
/// bench/results/cpu.md).
fn shiftActivations(comptime small_weights: bool) bool {
    return simd.has_vnni or (simd.is_x86 and small_weights);
}

/// dotRows for R activation rows (a batch), for formats whose blocks unpack to 32 signed quants
/// and an f16 scale (Q8_0, Q5_0). The activations are shifted to unsigned bytes once per call,
/// into 32-byte aligned rows (a 34-byte block stride splits half the loads across cache lines),
/// so the integer lane sum of a (weight block, activation block) is
/// dpbusd(x + 128, w) - 128 * (lane sum of w): exactly `dot`'s signed lane sum, with a
/// correction that depends on the weight block only, made once for all R (without VNNI the
/// signed lane sum directly: shiftActivations). Each (weight row, activation row) pair is
/// `dot`'s FMA chain, block by block. Results go to out[r * out_stride + o]; false where the
/// batch is too long for the stack buffers.
pub inline fn dotRowsMultiSigned(
    comptime WBlock: type,
    comptime small_weights: bool,
    comptime unpack: fn (*align(1) const WBlock) callconv(.@"inline") simd.V32i8,
    comptime R: usize,
    n_blocks: usize,
    w: [*]const u8,
    w_row_bytes: usize,
    n_out: usize,
    xs: [R][*]align(1) const Block,
    out: [*]f32,
    out_stride: usize,
) bool {
    if (R * n_blocks > multi_max_blocks) return false;
    const shift = comptime shiftActivations(small_weights);
    var x_quants: [multi_max_blocks]simd.V32i8 = undefined;
    // Block-major: one block's R activation scales are one vector.
    var x_scales: [multi_max_blocks / R][R]f32 = undefined;
    inline for (0..R) |r| {
        for (0..n_blocks) |b| {
            const q: simd.V32i8 = xs[r][b].qs;
            x_quants[r * n_blocks + b] = if (comptime shift) q ^ @as(simd.V32i8, @splat(-128)) else q;
            x_scales[b][r] = xs[r][b].d;
        }
    }
    var o: usize = 0;
    if (comptime shift and simd.has_vnni) {
        while (o + 4 <= n_out) : (o += 4) {
            rowsMultiPairs(WBlock, unpack, 2, R, n_blocks, w + o * w_row_bytes, w_row_bytes, &x_quants, &x_scales, out + o, out_stride);
        }
    }
    while (o + 2 <= n_out) : (o += 2) {
        rowsMulti(WBlock, unpack, shift, 2, R, n_blocks, w + o * w_row_bytes, w_row_bytes, &x_quants, &x_scales, out + o, out_stride);
    }
    if (o < n_out) rowsMulti(WBlock, unpack, shift, 1, R, n_blocks, w + o * w_row_bytes, w_row_bytes, &x_quants, &x_scales, out + o, out_stride);
    return true;
}

/// -128 * (sum of each lane's four weight quants): what the activations' +128 shift adds.
inline fn shiftCorrection(comptime shift: bool, q: simd.V32i8) simd.V8i32 {
    if (!shift) return @splat(0);
    const offset: simd.V32u8 = @splat(128);
    return @as(simd.V8i32, @splat(0)) -% simd.dotU8I8(offset, q);
}

/// The signed lane sums of x and q, from the shifted activations (see dotRowsMultiSigned).
inline fn dotShifted(comptime shift: bool, correction: simd.V8i32, x: simd.V32i8, q: simd.V32i8) simd.V8i32 {
    if (!shift) return simd.dotAccI8I8(correction, q, x);
    return simd.dotAccU8I8(correction, @bitCast(x), q);
}

/// W weight rows (w, w + w_row_bytes, ...) with R activation rows: each activation block is
/// loaded once for the W rows, each weight block is unpacked and corrected once for all R, and
/// a block's R scale products d_w * d_x are one vector multiply, read back by the FMAs as
/// broadcast operands (a scalar product and a broadcast per dot were a third of the loop).
inline fn rowsMulti(
    comptime WBlock: type,
    comptime unpack: fn (*align(1) const WBlock) callconv(.@"inline") simd.V32i8,
    comptime shift: bool,
    comptime W: usize,
    comptime R: usize,
    n_blocks: usize,
    w: [*]const u8,
    w_row_bytes: usize,
    x_quants: *const [multi_max_blocks]simd.V32i8,
    x_scales: *const [multi_max_blocks / R][R]f32,
    out: [*]f32,
    out_stride: usize,
) void {
    var rows: [W][*]align(1) const WBlock = undefined;
    inline for (0..W) |i| rows[i] = @ptrCast(w + i * w_row_bytes);
    // Made before the dot loop and read there from memory: in-loop products were kept in
    // registers and each broadcast became a shuffle, competing with the dots for vector ports.
    var scales: [multi_max_blocks / R][W][R]f32 = undefined;
    for (0..n_blocks) |b| {
        const xs: @Vector(R, f32) = x_scales[b];
        inline for (0..W) |i| scales[b][i] = @as(@Vector(R, f32), @splat(@as(f32, rows[i][b].d))) * xs;
    }
    var acc: [W][R]simd.V8f32 = @splat(@splat(@splat(0)));
    for (0..n_blocks) |b| {
        var q: [W]simd.V32i8 = undefined;
        var correction: [W]simd.V8i32 = undefined;
        inline for (0..W) |i| {
            q[i] = unpack(&rows[i][b]);
            correction[i] = shiftCorrection(shift, q[i]);
        }
        inline for (0..R) |r| {
            const x = x_quants[r * n_blocks + b];
            inline for (0..W) |i| {
                const sumi = dotShifted(shift, correction[i], x, q[i]);
                acc[i][r] = @mulAdd(simd.V8f32, @splat(scales[b][i][r]), @floatFromInt(sumi), acc[i][r]);
            }
        }
    }
    inline for (0..R) |r| {
        inline for (0..W) |i| out[r * out_stride + i] = simd.hsum(acc[i][r]);
    }
}

const V16f32 = @Vector(16, f32);
const V16i32 = @Vector(16, i32);
const V64i8 = @Vector(64, i8);

/// Two 32-byte vectors as the halves of one 64-byte vector.
inline fn halves(lo: simd.V32i8, hi: simd.V32i8) V64i8 {
    const mask = comptime blk: {
        var m: [64]i32 = undefined;
        for (0..32) |i| {
            m[i] = @intCast(i);
            m[32 + i] = -1 - @as(i32, @intCast(i));
        }
        break :blk m;
    };
    return @shuffle(i8, lo, hi, mask);
}

/// vpdpbusd on a whole AVX-512 register: acc + the u8 x i8 products of a and b in groups of four.
inline fn dotAccU8I8Wide(acc: V16i32, a: V64i8, b: V64i8) V16i32 {
    return asm ("vpdpbusd %[b], %[a], %[acc]"
        : [acc] "=v" (-> V16i32),
        : [a] "v" (a),
          [b] "v" (b),
          [acc_in] "0" (acc),
    );
}

/// rowsMulti with VNNI for 2P weight rows, two rows to an AVX-512 register: rows 2p and 2p + 1
/// fill the low and high eight lanes, each activation block is broadcast to both halves, so one
/// vpdpbusd, conversion, scale product and FMA serve two (weight row, activation row) pairs
/// where rowsMulti spends one on each. Lane for lane the same integers, products and FMA chains,
/// so each row's result is rowsMulti's bit for bit (the halves summed by the same hsum).
inline fn rowsMultiPairs(
    comptime WBlock: type,
    comptime unpack: fn (*align(1) const WBlock) callconv(.@"inline") simd.V32i8,
    comptime P: usize,
    comptime R: usize,
    n_blocks: usize,
    w: [*]const u8,
    w_row_bytes: usize,
    x_quants: *const [multi_max_blocks]simd.V32i8,
    x_scales: *const [multi_max_blocks / R][R]f32,
    out: [*]f32,
    out_stride: usize,
) void {
    var rows: [2 * P][*]align(1) const WBlock = undefined;
    inline for (0..2 * P) |i| rows[i] = @ptrCast(w + i * w_row_bytes);
    const offset: V64i8 = @splat(-128); // 0x80: the shift's 128 as an unsigned byte
    var acc: [P][R]V16f32 = @splat(@splat(@splat(0)));
    for (0..n_blocks) |b| {
        var q: [P]V64i8 = undefined;
        var correction: [P]V16i32 = undefined;
        var d_w: [P]V16f32 = undefined;
        inline for (0..P) |p| {
            q[p] = halves(unpack(&rows[2 * p][b]), unpack(&rows[2 * p + 1][b]));
            // -128 * each lane's four weight quants (shiftCorrection for both rows).
            correction[p] = @as(V16i32, @splat(0)) -% dotAccU8I8Wide(@splat(0), offset, q[p]);
            const lo: f32 = rows[2 * p][b].d;
            const hi: f32 = rows[2 * p + 1][b].d;
            d_w[p] = @shuffle(f32, @as(simd.V8f32, @splat(lo)), @as(simd.V8f32, @splat(hi)), [16]i32{ 0, 1, 2, 3, 4, 5, 6, 7, -1, -2, -3, -4, -5, -6, -7, -8 });
        }
        inline for (0..R) |r| {
            const x = x_quants[r * n_blocks + b];
            const xx = halves(x, x);
            const d_x: V16f32 = @splat(x_scales[b][r]);
            inline for (0..P) |p| {
                const sumi = dotAccU8I8Wide(correction[p], xx, q[p]);
                acc[p][r] = @mulAdd(V16f32, d_w[p] * d_x, @floatFromInt(sumi), acc[p][r]);
            }
        }
    }
    inline for (0..R) |r| {
        inline for (0..P) |p| {
            const a = acc[p][r];
            out[r * out_stride + 2 * p] = simd.hsum(@shuffle(f32, a, undefined, [8]i32{ 0, 1, 2, 3, 4, 5, 6, 7 }));
            out[r * out_stride + 2 * p + 1] = simd.hsum(@shuffle(f32, a, undefined, [8]i32{ 8, 9, 10, 11, 12, 13, 14, 15 }));
        }
    }
}

/// Batched form of dotRows (see dotRowsMultiSigned); false where the caller must fall back to
/// dotMulti row by row.
pub fn dotRowsMulti(comptime R: usize, n_blocks: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, xs: [R][*]align(1) const Block, out: [*]f32, out_stride: usize) bool {
    return dotRowsMultiSigned(Block, false, unpackSelf, R, n_blocks, w, w_row_bytes, n_out, xs, out, out_stride);
}

/// -offset * (sum of the activation block's four quants) for each of its eight lanes: what an
/// `offset` added to unsigned weights (u = w + offset) adds to a lane's dot (q8_0_x8.zig too).
pub inline fn laneCorrection(comptime offset: i32, x: *align(1) const Block) simd.V8i32 {
    const ones: simd.V32u8 = @splat(1);
    return simd.dotU7I8(ones, x.qs) * @as(simd.V8i32, @splat(-offset));
}

inline fn blockDotOffset(
    comptime WBlock: type,
    comptime offset: i32,
    comptime unpackU: fn (*align(1) const WBlock) callconv(.@"inline") simd.V32u8,
    acc: simd.V8f32,
    w: *align(1) const WBlock,
    x: *align(1) const Block,
    correction: simd.V8i32,
) simd.V8f32 {
    const sumi = if (offset < 128)
        simd.dotAccU7I8(correction, unpackU(w), x.qs)
    else
        simd.dotAccU8I8(correction, unpackU(w), x.qs);
    const d: simd.V8f32 = @splat(@as(f32, w.d) * @as(f32, x.d));
    return @mulAdd(simd.V8f32, d, @floatFromInt(sumi), acc);
}

inline fn blockDot(acc: simd.V8f32, w: *align(1) const Block, x: *align(1) const Block) simd.V8f32 {
    // Weights may hold -128 (|-128| = 128 keeps AVX2 pairs within i16); activations stay >= -127.
    const sumi = simd.dotAccI8I8(@splat(0), w.qs, x.qs);
    const d: simd.V8f32 = @splat(@as(f32, w.d) * @as(f32, x.d));
    return @mulAdd(simd.V8f32, d, @floatFromInt(sumi), acc);
}

/// Dots one weight row with R activation rows, unpacking each weight block once: the shared
/// kernel of Q4_0, Q5_0 and Q8_0, whose blocks all become 32 signed quants and an f16 scale.
pub inline fn dotMultiSigned(
    comptime WBlock: type,
    comptime unpack: fn (*align(1) const WBlock) callconv(.@"inline") simd.V32i8,
    comptime R: usize,
    w: []align(1) const WBlock,
    xs: [R][*]align(1) const Block,
) [R]f32 {
    const zero: simd.V32i8 = @splat(0);
    var acc: [R]simd.V8f32 = @splat(@splat(0));
    for (w, 0..) |*wb, i| {
        const q = unpack(wb);
        const q_abs = @abs(q);
        const negative = q < zero;
        const dw: f32 = wb.d;
        inline for (0..R) |r| {
            const xb = &xs[r][i];
            // ggml's sign trick, the sign moved onto each activation row.
            const x_signed = @select(i8, negative, zero -% xb.qs, xb.qs);
            const sumi = simd.dotU8I8(q_abs, x_signed);
            const d: simd.V8f32 = @splat(dw * @as(f32, xb.d));
            acc[r] = @mulAdd(simd.V8f32, d, @floatFromInt(sumi), acc[r]);
        }
    }
    var out: [R]f32 = undefined;
    inline for (0..R) |r| out[r] = simd.hsum(acc[r]);
    return out;
}

inline fn unpackSelf(b: *align(1) const Block) simd.V32i8 {
    return b.qs;
}

pub fn dotMulti(
    comptime R: usize,
    w: []align(1) const Block,
    xs: [R][*]align(1) const Block,
) [R]f32 {
    return dotMultiSigned(Block, unpackSelf, R, w, xs);
}

const test_util = @import("test_util.zig");

fn fixBlock(b: *Block, rng: *test_util.TestRng) void {
    b.d = test_util.randomScale(rng, true);
}

test "q8_0 dot: fast matches scalar; quantized dot matches f32" {
    try test_util.checkDot(@This(), @This(), 8, fixBlock);
}

test "q8_0 quantize: rounding and scale as ggml's SIMD quantizer" {
    var x: [32]f32 = undefined;
    for (&x, 0..) |*v, i| v.* = @as(f32, @floatFromInt(i)) - 15.5;
    x[31] = 127.0; // amax 127 -> id = 1: q = round_half_even(x)
    var b: [1]Block = undefined;
    quantize(&x, &b);
    try std.testing.expectEqual(@as(f16, 1.0), b[0].d);
    try std.testing.expectEqual(@as(i8, -16), b[0].qs[0]); // -15.5 -> -16 (even)
    try std.testing.expectEqual(@as(i8, -14), b[0].qs[1]); // -14.5 -> -14 (even)
    try std.testing.expectEqual(@as(i8, 127), b[0].qs[31]);
    const zeros = [_]f32{0} ** 32;
    quantize(&zeros, &b);
    try std.testing.expectEqual(@as(f16, 0), b[0].d);
    try std.testing.expectEqual(@as(i8, 0), b[0].qs[5]);
    quantizeRef(&x, &b);
    try std.testing.expectEqual(@as(i8, -16), b[0].qs[0]); // roundf: away from zero
    try std.testing.expectEqual(@as(i8, -15), b[0].qs[1]);
}

test "q8_0 batched rows (rowsMultiPairs, rowsMulti) equal dot row by row, bit for bit" {
    var rng = simd.TestRng.init(5);
    const n_blocks = 7;
    const n_out_max = 11;
    var wf: [n_blocks * 32]f32 = undefined;
    var w: [n_out_max][n_blocks]Block = undefined;
    for (&w) |*row| {
        rng.floats(&wf, 1);
        quantize(&wf, row);
    }
    var x: [multi_rows][n_blocks]Block = undefined;
    for (&x) |*row| {
        rng.floats(&wf, 3);
        quantize(&wf, row);
    }
    var xs: [multi_rows][*]align(1) const Block = undefined;
    for (0..multi_rows) |r| xs[r] = &x[r];
    // 11 rows: pairs of pairs where VNNI has them, then a pair, then one row alone.
    for ([_]usize{ 1, 2, 4, 6, 11 }) |n_out| {
        var out: [multi_rows * n_out_max]f32 = undefined;
        try std.testing.expect(dotRowsMulti(multi_rows, n_blocks, @ptrCast(&w), n_blocks * @sizeOf(Block), n_out, xs, &out, n_out_max));
        for (0..multi_rows) |r| {
            for (0..n_out) |o| {
                const want = dot(&w[o], &x[r]);
                try std.testing.expectEqual(@as(u32, @bitCast(want)), @as(u32, @bitCast(out[r * n_out_max + o])));
            }
        }
    }
}
