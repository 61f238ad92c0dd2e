//! The traits table: for each supported ggml type id, its block geometry, dequantizer, dot
//! kernels and activation ("vec_dot") type, as ggml's type_traits / type_traits_cpu. Kernels
//! are reached through type-erased byte pointers so matmul and get_rows stay format-agnostic.
const std = @import("std");

pub const f32_fmt = @import("f32.zig");
pub const f16_fmt = @import("f16.zig");
pub const bf16_fmt = @import("bf16.zig");
pub const q4_0 = @import("q4_0.zig");
pub const q5_0 = @import("q5_0.zig");
pub const q8_0 = @import("q8_0.zig");
pub const q4_k = @import("q4_k.zig");
pub const q5_k = @import("q5_k.zig");
pub const q6_k = @import("q6_k.zig");
pub const q8_k = @import("q8_k.zig");
pub const mxfp4 = @import("mxfp4.zig");
pub const q4_0_x8 = @import("q4_0_x8.zig");
pub const q8_0_x8 = @import("q8_0_x8.zig");
pub const q4_k_x8 = @import("q4_k_x8.zig");

/// ggml_type ids as stored in GGUF tensor infos.
pub const TypeId = enum(u32) {
    f32 = 0,
    f16 = 1,
    q4_0 = 2,
    q5_0 = 6,
    q8_0 = 8,
    q4_k = 12,
    q5_k = 13,
    q6_k = 14,
    q8_k = 15,
    bf16 = 30,
    mxfp4 = 39,
    /// Internal layouts made at load time (never in a GGUF file): see `repackedType`.
    q4_0_x8 = 1002,
    q8_0_x8 = 1008,
    q4_k_x8 = 1012,
    /// q4_k_x8's bytes, rounded as llama.cpp's batched kernel: see `promptRoundingType`.
    q4_k_x8_pairs = 1112,
    _,
};

/// dst[0..n] = values of the n quantized values at src (n a multiple of block_values).
pub const DequantizeFn = *const fn (src: [*]const u8, dst: [*]f32, n: usize) void;
/// Dot of n values: a weight row at w with an activation row (in vec_dot_type) at x.
pub const DotFn = *const fn (n: usize, w: [*]const u8, x: [*]const u8) f32;
/// Dots of n values: `n_out` weight rows at w (w_row_bytes apart) with `n_rows`
/// (1..Traits.multi_rows) activation rows starting at x, x_row_bytes apart; the result for weight
/// row o and activation row r goes to out[r * out_stride + o]. Each weight row is unpacked once
/// for all n_rows.
pub const DotMultiFn = *const fn (
    n: usize,
    w: [*]const u8,
    w_row_bytes: usize,
    n_out: usize,
    x: [*]const u8,
    x_row_bytes: usize,
    n_rows: usize,
    out: [*]f32,
    out_stride: usize,
) void;
/// Per-token tables a batched kernel reads beside its activation rows, made from the quantized
/// activations once a matmul call, before its tasks run (q8_0_tiles.zig says why).
pub const ActivationTables = struct {
    /// Bytes of one activation row's tables (a multiple of 4), for rows of n values.
    row_bytes: *const fn (n: usize) usize,
    /// One row's tables (n values of activations at x) to dst (4-byte aligned).
    fill: *const fn (x: [*]const u8, n: usize, dst: [*]u8) void,
    /// dot_multi reading row r's tables at tables + r * tables_row_bytes.
    dot_multi: *const fn (
        n: usize,
        w: [*]const u8,
        w_row_bytes: usize,
        n_out: usize,
        x: [*]const u8,
        x_row_bytes: usize,
        tables: [*]const u8,
        tables_row_bytes: usize,
        n_rows: usize,
        out: [*]f32,
        out_stride: usize,
    ) void,
};
/// Activation rows per dot_multi call unless a format says otherwise (`multi_rows`).
const default_multi_rows = 4;
/// The most activation rows any format's dot_multi takes.
pub const multi_rows_max = 8;
/// Dots of n values: `n_out` weight rows at w, w_row_bytes apart, each with the one activation
/// row at x; out[o] for row o. One call per task, not one indirect call per row.
pub const DotRowsFn = *const fn (
    n: usize,
    w: [*]const u8,
    w_row_bytes: usize,
    n_out: usize,
    x: [*]const u8,
    out: [*]f32,
) void;
/// dst = n values of src in this format.
pub const QuantizeFn = *const fn (src: [*]const f32, dst: [*]u8, n: usize) void;
/// Rows n_rows (a multiple of row_group, from a group boundary) of n values of a repacked
/// layout written back as the rows of its base format (row r at dst + r * row bytes).
pub const UnpackRowsFn = *const fn (src: [*]const u8, n_rows: usize, n: usize, dst: [*]u8) void;

pub const Traits = struct {
    id: TypeId,
    name: []const u8,
    block_values: u32,
    block_bytes: u32,
    /// Rows stored together (8 for a repacked layout): matmul hands kernels whole groups,
    /// and a group of rows starts where its first row would in row-major order.
    row_group: u32 = 1,
    /// Null for repacked layouts, whose rows are not stored one by one.
    dequantize_row: ?DequantizeFn,
    /// Fast and reference dots; null for activation-only formats (Q8_K).
    dot: ?DotFn,
    dot_scalar: ?DotFn,
    /// Several activation rows per weight-row pass (weights unpacked once); null: use `dot`.
    dot_multi: ?DotMultiFn,
    /// Activation rows dot_multi takes per call (matmul's token tile).
    multi_rows: u32 = default_multi_rows,
    /// `dot` over a run of weight rows, for one activation row (single-token matmuls).
    dot_rows: ?DotRowsFn,
    /// A repacked layout that computes batches on its base format's rows instead: matmul copies
    /// each tile of rows back once a call (unpack_rows) and runs batch_format's dot_multi on it.
    unpack_rows: ?UnpackRowsFn = null,
    batch_format: ?*const Traits = null,
    /// Rows a batched kernel takes together: matmul's prompt tasks hold whole multiples (the
    /// last one may be short by a row group).
    batch_row_group: u32 = 2,
    /// Set where dot_multi's per-token tables can be made once a call (matmul does; the MoE's
    /// tiles call dot_multi, which makes its own).
    activation_tables: ?*const ActivationTables = null,
    vec_dot_type: TypeId,
    /// How matmul quantizes f32 activations into this format (set for activation formats).
    quantize_activation: ?QuantizeFn,
    /// ggml's reference quantizer, as used when writing GGUF files; null where not implemented.
    quantize_ref: ?QuantizeFn,

    pub fn rowBytes(self: *const Traits, n: usize) usize {
        std.debug.assert(n % self.block_values == 0);
        return n / self.block_values * self.block_bytes;
    }
};

fn blocks(comptime Fmt: type, p: anytype, n: usize) []align(1) const Fmt.Block {
    const ptr: [*]align(1) const Fmt.Block = @ptrCast(p);
    return ptr[0 .. n / Fmt.block_values];
}

fn blocksMut(comptime Fmt: type, p: [*]u8, n: usize) []align(1) Fmt.Block {
    const ptr: [*]align(1) Fmt.Block = @ptrCast(p);
    return ptr[0 .. n / Fmt.block_values];
}

fn dequantizeFn(comptime Fmt: type) DequantizeFn {
    return struct {
        fn run(src: [*]const u8, dst: [*]f32, n: usize) void {
            Fmt.dequantize(blocks(Fmt, src, n), dst[0..n]);
        }
    }.run;
}

fn dotFn(comptime W: type, comptime X: type, comptime scalar: bool) DotFn {
    return struct {
        fn run(n: usize, w: [*]const u8, x: [*]const u8) f32 {
            const f = if (scalar) W.dotScalar else W.dot;
            return f(blocks(W, w, n), blocks(X, x, n));
        }
    }.run;
}

fn dotRowsFn(comptime W: type, comptime X: type) DotRowsFn {
    return struct {
        fn run(n: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]const u8, out: [*]f32) void {
            const x_blocks = blocks(X, x, n);
            if (@hasDecl(W, "dotRows")) return W.dotRows(n / W.block_values, w, w_row_bytes, n_out, x_blocks.ptr, out);
            var o: usize = 0;
            while (o < n_out) : (o += 1) out[o] = W.dot(blocks(W, w + o * w_row_bytes, n), x_blocks);
        }
    }.run;
}

fn multiRows(comptime Fmt: type) comptime_int {
    const rows = if (@hasDecl(Fmt, "multi_rows")) Fmt.multi_rows else default_multi_rows;
    std.debug.assert(rows <= multi_rows_max);
    return rows;
}

fn dotMultiFn(comptime W: type, comptime X: type) DotMultiFn {
    return struct {
        fn run(
            n: usize,
            w: [*]const u8,
            w_row_bytes: usize,
            n_out: usize,
            x: [*]const u8,
            x_row_bytes: usize,
            n_rows: usize,
            out: [*]f32,
            out_stride: usize,
        ) void {
            switch (n_rows) {
                inline 1...multiRows(W) => |R| {
                    var rows: [R][*]align(1) const X.Block = undefined;
                    inline for (0..R) |r| rows[r] = @ptrCast(x + r * x_row_bytes);
                    if (@hasDecl(W, "dotRowsMulti")) {
                        if (W.dotRowsMulti(R, n / W.block_values, w, w_row_bytes, n_out, rows, out, out_stride)) return;
                    }
                    for (0..n_out) |o| {
                        const sums = W.dotMulti(R, blocks(W, w + o * w_row_bytes, n), rows);
                        inline for (0..R) |r| out[r * out_stride + o] = sums[r];
                    }
                },
                else => unreachable,
            }
        }
    }.run;
}

fn quantizeFn(comptime Fmt: type, comptime f: anytype) QuantizeFn {
    return struct {
        fn run(src: [*]const f32, dst: [*]u8, n: usize) void {
            f(src[0..n], blocksMut(Fmt, dst, n));
        }
    }.run;
}

fn entry(
    comptime id: TypeId,
    comptime name: []const u8,
    comptime W: type,
    comptime X: ?type,
) Traits {
    const act = X orelse W;
    return .{
        .id = id,
        .name = name,
        .block_values = W.block_values,
        .block_bytes = @sizeOf(W.Block),
        .dequantize_row = dequantizeFn(W),
        .dot = if (X) |x| dotFn(W, x, false) else null,
        .dot_scalar = if (X) |x| dotFn(W, x, true) else null,
        .dot_multi = if (X != null and @hasDecl(W, "dotMulti")) dotMultiFn(W, X.?) else null,
        .multi_rows = multiRows(W),
        .dot_rows = if (X) |x| dotRowsFn(W, x) else null,
        .vec_dot_type = if (X == null) id else activationId(act),
        .quantize_activation = if (@hasDecl(W, "quantize")) quantizeFn(W, W.quantize) else null,
        .quantize_ref = if (@hasDecl(W, "quantizeRef"))
            quantizeFn(W, W.quantizeRef)
        else if (@hasDecl(W, "quantize") and W != q8_0)
            quantizeFn(W, W.quantize)
        else
            null,
    };
}

fn activationId(comptime X: type) TypeId {
    if (X == q8_0) return .q8_0;
    if (X == q8_k) return .q8_k;
    if (X == f16_fmt) return .f16;
    if (X == bf16_fmt) return .bf16;
    return .f32;
}

test "dot_rows equals dot row by row, bit for bit" {
    var rng = @import("simd.zig").TestRng.init(5);
    const n = 512;
    for (table) |t| {
        const dot = t.dot orelse continue;
        const act = get(@intFromEnum(t.vec_dot_type)).?;
        var w: [7 * 4 * n]u8 = undefined;
        var x: [4 * n]u8 = undefined;
        rng.bytes(&w);
        // keep f16 scales finite: re-quantize x from floats where the format has a quantizer
        var xf: [n]f32 = undefined;
        rng.floats(&xf, 1);
        if (act.quantize_activation) |q| q(&xf, &x, n) else @memcpy(x[0 .. n * 4], std.mem.sliceAsBytes(&xf));
        if (t.quantize_ref) |q| {
            for (0..7) |r| q(&xf, w[r * t.rowBytes(n) ..].ptr, n);
        } else if (t.id == .f32) {
            for (0..7) |r| @memcpy(w[r * n * 4 ..][0 .. n * 4], std.mem.sliceAsBytes(&xf));
        }
        var out: [7]f32 = undefined;
        t.dot_rows.?(n, &w, t.rowBytes(n), 7, &x, &out);
        for (0..7) |r| { // as bits: random K-quant scales may be NaN, which still must match
            const want: u32 = @bitCast(dot(n, w[r * t.rowBytes(n) ..].ptr, &x));
            try std.testing.expectEqual(want, @as(u32, @bitCast(out[r])));
        }
    }
}

const table = [_]Traits{
    entry(.f32, "F32", f32_fmt, f32_fmt),
    entry(.f16, "F16", f16_fmt, f32_fmt), // f32 activations: see f16.zig
    entry(.bf16, "BF16", bf16_fmt, bf16_fmt),
    entry(.q4_0, "Q4_0", q4_0, q8_0),
    entry(.q5_0, "Q5_0", q5_0, q8_0),
    entry(.q8_0, "Q8_0", q8_0, q8_0),
    entry(.q4_k, "Q4_K", q4_k, q8_k),
    entry(.q5_k, "Q5_K", q5_k, q8_k),
    entry(.q6_k, "Q6_K", q6_k, q8_k),
    entry(.q8_k, "Q8_K", q8_k, null),
    entry(.mxfp4, "MXFP4", mxfp4, q8_0),
};

/// The traits of a supported GGUF type, or null (see typeName for the message).
pub fn get(type_id: u32) ?*const Traits {
    for (&table) |*t| if (@intFromEnum(t.id) == type_id) return t;
    return null;
}

/// The traits of a layout with `Packed.rows` rows interleaved (q4_0_x8.zig, q8_0_x8.zig,
/// q4_k_x8.zig): made at load from format `Base` (activations in `X`), read by matmul only, so
/// there is no row to dequantize and no single-row dot.
fn repackedEntry(comptime id: TypeId, comptime name: []const u8, comptime Packed: type, comptime Base: type, comptime X: type) Traits {
    var t: Traits = .{
        .id = id,
        .name = name,
        .block_values = Base.block_values,
        .block_bytes = @sizeOf(Base.Block),
        .row_group = Packed.rows,
        .dequantize_row = null,
        .dot = null,
        .dot_scalar = null,
        .dot_multi = null,
        .dot_rows = struct {
            fn run(n: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]const u8, out: [*]f32) void {
                _ = w_row_bytes; // groups follow each other: the layout knows its own stride
                Packed.dotRows(n / Base.block_values, w, n_out, @ptrCast(x), out);
            }
        }.run,
        .vec_dot_type = activationId(X),
        .quantize_activation = null,
        .quantize_ref = null,
    };
    if (@hasDecl(Packed, "tiles")) if (Packed.tiles) |Tiles| {
        // Batches on tiles made from the groups once a call (q8_0_tiles.zig).
        t.unpack_rows = struct {
            fn run(src: [*]const u8, n_rows: usize, n: usize, dst: [*]u8) void {
                Tiles.makeTiles(src, n_rows, n / Base.block_values, dst);
            }
        }.run;
        t.batch_format = &TileTraits(id, Tiles, Base, X).traits;
        return t;
    };
    if (@hasDecl(Packed, "unpackRows")) {
        // Batches on the base format's rows (q8_0_x8.zig says why).
        t.unpack_rows = struct {
            fn run(src: [*]const u8, n_rows: usize, n: usize, dst: [*]u8) void {
                Packed.unpackRows(src, n_rows, n / Base.block_values, dst);
            }
        }.run;
        t.batch_format = get(@intFromEnum(Packed.base_id)).?;
        return t;
    }
    t.dot_multi = struct {
        fn run(n: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]const u8, x_row_bytes: usize, n_rows: usize, out: [*]f32, out_stride: usize) void {
            _ = w_row_bytes;
            switch (n_rows) {
                inline 1...multiRows(Packed) => |R| {
                    var rows: [R][*]align(1) const X.Block = undefined;
                    inline for (0..R) |r| rows[r] = @ptrCast(x + r * x_row_bytes);
                    Packed.dotRowsMulti(R, n / Base.block_values, w, n_out, rows, out, out_stride);
                },
                else => unreachable,
            }
        }
    }.run;
    t.multi_rows = multiRows(Packed);
    return t;
}

/// The traits of a repacked layout's prompt tiles (Traits.batch_format): only dot_multi, and
/// the same with the activations' tables made once a call.
fn TileTraits(comptime id: TypeId, comptime Tiles: type, comptime Base: type, comptime X: type) type {
    return struct {
        const activation_tables: ActivationTables = .{
            .row_bytes = struct {
                fn run(n: usize) usize {
                    return Tiles.tableRowBytes(n / Base.block_values);
                }
            }.run,
            .fill = struct {
                fn run(x: [*]const u8, n: usize, dst: [*]u8) void {
                    Tiles.fillTables(@ptrCast(x), n / Base.block_values, @ptrCast(@alignCast(dst)));
                }
            }.run,
            .dot_multi = struct {
                fn run(n: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]const u8, x_row_bytes: usize, tables: [*]const u8, tables_row_bytes: usize, n_rows: usize, out: [*]f32, out_stride: usize) void {
                    Tiles.dotTilesWithTables(n / Base.block_values, w, w_row_bytes, n_out, x, x_row_bytes, tables, tables_row_bytes, n_rows, out, out_stride);
                }
            }.run,
        };
        const traits: Traits = .{
            .id = id,
            .name = "prompt tiles",
            .block_values = Base.block_values,
            .block_bytes = @sizeOf(Base.Block),
            .dequantize_row = null,
            .dot = null,
            .dot_scalar = null,
            .dot_multi = struct {
                fn run(n: usize, w: [*]const u8, w_row_bytes: usize, n_out: usize, x: [*]const u8, x_row_bytes: usize, n_rows: usize, out: [*]f32, out_stride: usize) void {
                    Tiles.dotTiles(n / Base.block_values, w, w_row_bytes, n_out, x, x_row_bytes, n_rows, out, out_stride);
                }
            }.run,
            .multi_rows = Tiles.multi_rows,
            .batch_row_group = Tiles.tile_rows,
            .activation_tables = &activation_tables,
            .dot_rows = null,
            .vec_dot_type = activationId(X),
            .quantize_activation = null,
            .quantize_ref = null,
        };
    };
}

const q4_0_x8_traits = repackedEntry(.q4_0_x8, "Q4_0x8", q4_0_x8, q4_0, q8_0);
const q8_0_x8_traits = repackedEntry(.q8_0_x8, "Q8_0x8", q8_0_x8, q8_0, q8_0);
const q4_k_x8_traits = repackedEntry(.q4_k_x8, "Q4_Kx8", q4_k_x8, q4_k, q8_k);
const q4_k_x8_pairs_traits = repackedEntry(.q4_k_x8_pairs, "Q4_Kx8 (llama.cpp's batched rounding)",
    q4_k_x8.sub_block_pairs, q4_k, q8_k);

/// Traits for matmul: a GGUF type or a repacked layout.
pub fn getForMatmul(type_id: u32) ?*const Traits {
    if (type_id == @intFromEnum(TypeId.q4_0_x8)) return &q4_0_x8_traits;
    if (type_id == @intFromEnum(TypeId.q8_0_x8)) return &q8_0_x8_traits;
    if (type_id == @intFromEnum(TypeId.q4_k_x8)) return &q4_k_x8_traits;
    if (type_id == @intFromEnum(TypeId.q4_k_x8_pairs)) return &q4_k_x8_pairs_traits;
    return get(type_id);
}

/// The layout that reads the same bytes as layout `type_id` but rounds as llama.cpp's batched
/// x86 kernel for it, which llama.cpp's prompts take four rows at a time while its single tokens
/// take the kernel whose sums the layout keeps; null otherwise (llama.cpp's batched Q5_0, Q8_0
/// and Q6_K kernels, the default model's other matrices, sum as its single-token ones; other
/// formats' are not compared). Embeddings ask for it so as to equal llama-embedding
/// (docs/embeddings.md).
pub fn promptRoundingType(type_id: u32) ?*const Traits {
    if (type_id == @intFromEnum(TypeId.q4_k_x8)) return &q4_k_x8_pairs_traits;
    return null;
}

/// The layout a weight of `type_id` with n_out rows is repacked into for faster matmuls, or
/// null where it is used as stored. Repacking copies the weights (the mapped file is then only
/// read for embedding rows), which is what llama.cpp does for the same formats.
pub fn repackedType(type_id: u32, n_out: usize) ?*const Traits {
    if (n_out % 8 != 0) return null;
    if (type_id == @intFromEnum(TypeId.q4_0)) return &q4_0_x8_traits;
    if (type_id == @intFromEnum(TypeId.q8_0)) return &q8_0_x8_traits;
    if (type_id == @intFromEnum(TypeId.q4_k)) return &q4_k_x8_traits;
    return null;
}

/// Writes weight rows `src` (type_id, n_out x n_in) in the layout repackedType names.
pub fn repack(type_id: u32, src: [*]const u8, n_out: usize, n_in: usize, dst: [*]u8) void {
    const t = repackedType(type_id, n_out).?;
    switch (t.id) {
        .q4_0_x8 => q4_0_x8.repack(src, n_out, n_in / q4_0.block_values, dst),
        .q8_0_x8 => q8_0_x8.repack(src, n_out, n_in / q8_0.block_values, dst),
        .q4_k_x8 => q4_k_x8.repack(src, n_out, n_in / q4_k.block_values, dst),
        else => unreachable,
    }
}

/// ggml's name for any type id (supported or not), for error messages.
pub fn typeName(type_id: u32) []const u8 {
    const names = [_][]const u8{
        "F32",        "F16",        "Q4_0",       "Q4_1",     "Q4_2",    "Q4_3",
        "Q5_0",       "Q5_1",       "Q8_0",       "Q8_1",     "Q2_K",    "Q3_K",
        "Q4_K",       "Q5_K",       "Q6_K",       "Q8_K",     "IQ2_XXS", "IQ2_XS",
        "IQ3_XXS",    "IQ1_S",      "IQ4_NL",     "IQ3_S",    "IQ2_S",   "IQ4_XS",
        "I8",         "I16",        "I32",        "I64",      "F64",     "IQ1_M",
        "BF16",       "Q4_0_4_4",   "Q4_0_4_8",   "Q4_0_8_8", "TQ1_0",   "TQ2_0",
        "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",
    };
    return if (type_id < names.len) names[type_id] else "unknown";
}

test "dot_multi equals dot for every weight row and activation row, bit for bit" {
    var rng = @import("simd.zig").TestRng.init(6);
    const n = 512;
    const n_out = 7;
    for (table) |t| {
        const dot = t.dot orelse continue;
        const dot_multi = t.dot_multi orelse continue;
        const act = get(@intFromEnum(t.vec_dot_type)).?;
        var w: [n_out * 4 * n]u8 = undefined;
        rng.bytes(&w);
        var xf: [n]f32 = undefined;
        if (t.quantize_ref) |q| {
            for (0..n_out) |r| {
                rng.floats(&xf, 1);
                q(&xf, w[r * t.rowBytes(n) ..].ptr, n);
            }
        }
        var x: [multi_rows_max][4 * n]u8 = undefined;
        for (&x) |*row| {
            rng.floats(&xf, 2);
            if (act.quantize_activation) |q| q(&xf, row, n) else @memcpy(row[0 .. n * 4], std.mem.sliceAsBytes(&xf));
        }
        const x_row_bytes = @sizeOf(@TypeOf(x[0]));
        for (1..t.multi_rows + 1) |n_rows| {
            var out: [multi_rows_max * n_out]f32 = undefined;
            dot_multi(n, &w, t.rowBytes(n), n_out, @ptrCast(&x), x_row_bytes, n_rows, &out, n_out);
            for (0..n_rows) |r| {
                for (0..n_out) |o| {
                    const want: u32 = @bitCast(dot(n, w[o * t.rowBytes(n) ..].ptr, &x[r]));
                    try std.testing.expectEqual(want, @as(u32, @bitCast(out[r * n_out + o])));
                }
            }
        }
    }
}

test "table: block sizes match ggml, activation types are dot-less" {
    try std.testing.expectEqual(@as(u32, 144), get(12).?.block_bytes);
    try std.testing.expectEqual(@as(u32, 210), get(14).?.block_bytes);
    try std.testing.expectEqual(TypeId.q8_k, get(12).?.vec_dot_type);
    try std.testing.expectEqual(TypeId.q8_0, get(6).?.vec_dot_type);
    try std.testing.expectEqual(TypeId.bf16, get(30).?.vec_dot_type);
    try std.testing.expect(get(15).?.dot == null);
    try std.testing.expect(get(10) == null);
    try std.testing.expectEqualStrings("Q2_K", typeName(10));
    try std.testing.expectEqualStrings("MXFP4", typeName(39));
    for (&table) |*t| {
        if (t.dot == null) continue;
        const act = get(@intFromEnum(t.vec_dot_type)).?;
        try std.testing.expect(act.quantize_activation != null);
        try std.testing.expectEqual(@as(u32, 0), t.block_values % act.block_values);
    }
}

test {
    std.testing.refAllDecls(@This());
}
