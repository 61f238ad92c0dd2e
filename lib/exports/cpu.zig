//! The CPU's part of the C surface: quant formats (block info, dequantize, quantize, repack),
//! matmul, the thread pool, and the f32 ops (norms, RoPE, attention, activations, token
//! selection) of lib/quant/ and lib/cpu/. Pointers are the caller's arrays; a call with more than
//! a handful of scalars takes them in a struct of lib/abi.zig.
const std = @import("std");
const status = @import("../status.zig");
const abi = @import("../abi.zig");
const quant_types = @import("../quant/types.zig");
const cpu_matmul = @import("../cpu/matmul.zig");
const cpu_threads = @import("../cpu/threads.zig");
const cpu_moe = @import("../cpu/moe.zig");
const norm = @import("../cpu/norm.zig");
const rope = @import("../cpu/rope.zig");
const attention = @import("../cpu/attention.zig");
const kv_turbo = @import("../cpu/kv_turbo.zig");
const act = @import("../cpu/act.zig");
const select = @import("../cpu/select.zig");

// ---- quant formats, matmul, threads ------------------------------------------------------------
/// The traits of `type_id`, or null after recording an `unsupported` status naming the type.
fn quantTraitsOrFail(type_id: u32) ?*const quant_types.Traits {
    if (quant_types.get(type_id)) |t| return t;
    _ = status.fail(.unsupported, "quant type {s} ({d}) is not supported", .{
        quant_types.typeName(type_id), type_id,
    });
    return null;
}

/// Checks that `n` values fill whole blocks of `t`; records invalid_argument otherwise.
fn quantBlocksOk(t: *const quant_types.Traits, n: u64, what: []const u8) bool {
    if (n % t.block_values == 0) return true;
    _ = status.fail(.invalid_argument, "{s} = {d} is not a multiple of the {s} block size {d}", .{
        what, n, t.name, t.block_values,
    });
    return false;
}

/// The status of a failure quantBlocksOk already recorded.
pub fn quantInvalid() i32 {
    return @intFromEnum(status.Status.invalid_argument);
}

/// Out: values per block and bytes per block of a supported type.
export fn infer_quant_block_info(
    type_id: u32,
    out_block_values: ?*u32,
    out_block_bytes: ?*u32,
) i32 {
    const t = quantTraitsOrFail(type_id) orelse return @intFromEnum(status.Status.unsupported);
    const values = out_block_values orelse
        return status.fail(.invalid_argument, "block_info: out_block_values is null", .{});
    const bytes = out_block_bytes orelse
        return status.fail(.invalid_argument, "block_info: out_block_bytes is null", .{});
    values.* = t.block_values;
    bytes.* = t.block_bytes;
    return 0;
}

/// dst[0..n] = the n values stored at src in type `type_id` (n a multiple of its block size).
export fn infer_dequantize(type_id: u32, src: ?[*]const u8, n: u64, dst: ?[*]f32) i32 {
    const t = quantTraitsOrFail(type_id) orelse return @intFromEnum(status.Status.unsupported);
    const s = src orelse return status.fail(.invalid_argument, "dequantize: src is null", .{});
    const d = dst orelse return status.fail(.invalid_argument, "dequantize: dst is null", .{});
    if (!quantBlocksOk(t, n, "dequantize: n")) return quantInvalid();
    t.dequantize_row.?(s, d, @intCast(n));
    return 0;
}

/// Embedding lookup: dst[i * n_cols ..][0..n_cols] = row ids[i] of a table of n_table_rows
/// rows of n_cols values in type `type_id`. Every id is checked before anything is written.
export fn infer_get_rows(
    type_id: u32,
    table: ?[*]const u8,
    n_cols: u64,
    n_table_rows: u64,
    ids: ?[*]const i32,
    n_ids: u64,
    dst: ?[*]f32,
) i32 {
    const t = quantTraitsOrFail(type_id) orelse return @intFromEnum(status.Status.unsupported);
    const tbl = table orelse return status.fail(.invalid_argument, "get_rows: table is null", .{});
    const id_list = ids orelse return status.fail(.invalid_argument, "get_rows: ids is null", .{});
    const out = dst orelse return status.fail(.invalid_argument, "get_rows: dst is null", .{});
    if (!quantBlocksOk(t, n_cols, "get_rows: n_cols")) return quantInvalid();
    const row_bytes = n_cols / t.block_values * t.block_bytes;
    _ = std.math.mul(u64, row_bytes, n_table_rows) catch
        return status.fail(.invalid_argument, "get_rows: table size overflows", .{});
    _ = std.math.mul(u64, n_cols, n_ids) catch
        return status.fail(.invalid_argument, "get_rows: output size overflows", .{});
    for (id_list[0..@intCast(n_ids)], 0..) |id, i| {
        if (id < 0 or @as(u64, @intCast(id)) >= n_table_rows) {
            const fmt = "get_rows: ids[{d}] = {d} is out of range (rows: {d})";
            return status.fail(.invalid_argument, fmt, .{ i, id, n_table_rows });
        }
    }
    const cols: usize = @intCast(n_cols);
    for (id_list[0..@intCast(n_ids)], 0..) |id, i| {
        t.dequantize_row.?(tbl + @as(usize, @intCast(id)) * row_bytes, out + i * cols, cols);
    }
    return 0;
}

/// y[t * n_out + o] = sum_i W[o][i] * x[t * n_in + i] for t < n_tok, o < n_out. W is n_out
/// rows of n_in values in type `w_type` (row o at byte o * row_bytes). x is quantized to the
/// type's activation format first (Q8_0 / Q8_K / f16 / bf16), as ggml does.
export fn infer_matmul(
    w: ?[*]const u8,
    w_type: u32,
    n_out: u64,
    n_in: u64,
    x: ?[*]const f32,
    n_tok: u64,
    y: ?[*]f32,
) i32 {
    const t = quant_types.getForMatmul(w_type) orelse quantTraitsOrFail(w_type) orelse
        return @intFromEnum(status.Status.unsupported);
    if (n_out % t.row_group != 0) {
        return status.fail(.invalid_argument, "matmul: {s} needs rows in groups of {d}, got {d}", .{ t.name, t.row_group, n_out });
    }
    if (t.dot_rows == null) {
        const fmt = "matmul: {s} is an activation format, not a weight type";
        return status.fail(.unsupported, fmt, .{t.name});
    }
    const weights = w orelse return status.fail(.invalid_argument, "matmul: w is null", .{});
    const acts = x orelse return status.fail(.invalid_argument, "matmul: x is null", .{});
    const out = y orelse return status.fail(.invalid_argument, "matmul: y is null", .{});
    if (!quantBlocksOk(t, n_in, "matmul: n_in")) return quantInvalid();
    const act_traits = quant_types.get(@intFromEnum(t.vec_dot_type)).?;
    if (!quantBlocksOk(act_traits, n_in, "matmul: n_in")) return quantInvalid();
    _ = std.math.mul(u64, n_in / t.block_values * t.block_bytes, n_out) catch
        return status.fail(.invalid_argument, "matmul: weight size overflows", .{});
    _ = std.math.mul(u64, n_tok, @max(n_in, n_out) * 4) catch
        return status.fail(.invalid_argument, "matmul: activation size overflows", .{});
    const rows: usize = @intCast(n_out);
    const cols: usize = @intCast(n_in);
    cpu_matmul.matmul(weights, t, rows, cols, acts, @intCast(n_tok), out) catch |err| {
        return switch (err) {
            error.OutOfMemory => status.fail(.out_of_memory, "matmul: no memory for x", .{}),
            error.Unsupported => status.fail(.unsupported, "matmul: {s} has no dot", .{t.name}),
        };
    };
    return 0;
}

/// Row t of out (n_tok x n_embd) = Σ_j w_j · down[e_j] · (silu(gate[e_j] x_t) ⊙ up[e_j] x_t) with
/// e_j = ids[t · n_used + j], w_j = weights[t · n_used + j], summed in rank order (abi.MoeShape).
/// One token: two thread-pool dispatches; several: rows grouped by expert, four. Equal bit for bit
/// to per-expert infer_matmul calls (rows gathered per expert), infer_silu_mul and the weighted sum.
export fn infer_moe_ffn(
    gate: ?[*]const u64,
    up: ?[*]const u64,
    down: ?[*]const u64,
    ids: ?[*]const u32,
    weights: ?[*]const f32,
    x: ?[*]const f32,
    out: ?[*]f32,
    shape: *const abi.MoeShape,
) i32 {
    const s = shape.*;
    const n_slots = std.math.cast(usize, std.math.mul(u64, s.n_used, s.n_tok) catch
        return opsInvalid("moe_ffn: n_used x n_tok overflows", .{})) orelse return opsInvalid("moe_ffn: n_used x n_tok overflows", .{});
    if (s.n_tok == 0) return opsInvalid("moe_ffn: n_tok must be > 0", .{});
    _ = std.math.mul(u64, n_slots, @max(s.n_embd, s.n_ff) * 4) catch
        return opsInvalid("moe_ffn: activation size overflows", .{});
    const traits = [3]?*const quant_types.Traits{
        quant_types.getForMatmul(s.gate_type), quant_types.getForMatmul(s.up_type), quant_types.getForMatmul(s.down_type),
    };
    for (traits, [_]u32{ s.gate_type, s.up_type, s.down_type }) |t, id| {
        if (t == null) return status.fail(.unsupported, "moe_ffn: quant type {s} ({d}) is not supported", .{ quant_types.typeName(id), id });
    }
    const p = cpu_moe.Problem{
        .gate = .{ .table = gate orelse return opsInvalid("moe_ffn: gate is null", .{}), .traits = traits[0].? },
        .up = .{ .table = up orelse return opsInvalid("moe_ffn: up is null", .{}), .traits = traits[1].? },
        .down = .{ .table = down orelse return opsInvalid("moe_ffn: down is null", .{}), .traits = traits[2].? },
        .n_embd = std.math.cast(usize, s.n_embd) orelse return opsInvalid("moe_ffn: n_embd too large", .{}),
        .n_ff = std.math.cast(usize, s.n_ff) orelse return opsInvalid("moe_ffn: n_ff too large", .{}),
        .n_expert = std.math.cast(usize, s.n_expert) orelse return opsInvalid("moe_ffn: n_expert too large", .{}),
        .n_tok = @intCast(s.n_tok),
        .ids = (ids orelse return opsInvalid("moe_ffn: ids is null", .{}))[0..n_slots],
        .weights = (weights orelse return opsInvalid("moe_ffn: weights is null", .{}))[0..n_slots],
        .x = x orelse return opsInvalid("moe_ffn: x is null", .{}),
        .out = out orelse return opsInvalid("moe_ffn: out is null", .{}),
    };
    if (cpu_moe.unsupported(&p)) |why| return status.fail(.unsupported, "moe_ffn: {s}", .{why});
    for ([_]*const quant_types.Traits{ p.gate.traits, p.up.traits }) |t| {
        if (!quantBlocksOk(t, s.n_embd, "moe_ffn: n_embd")) return quantInvalid();
        if (!quantBlocksOk(quant_types.get(@intFromEnum(t.vec_dot_type)).?, s.n_embd, "moe_ffn: n_embd")) return quantInvalid();
        if (s.n_ff % t.row_group != 0) return opsInvalid("moe_ffn: {s} needs n_ff in groups of {d}", .{ t.name, t.row_group });
    }
    if (!quantBlocksOk(p.down.traits, s.n_ff, "moe_ffn: n_ff")) return quantInvalid();
    if (!quantBlocksOk(quant_types.get(@intFromEnum(p.down.traits.vec_dot_type)).?, s.n_ff, "moe_ffn: n_ff")) return quantInvalid();
    if (s.n_embd % p.down.traits.row_group != 0) {
        return opsInvalid("moe_ffn: {s} needs n_embd in groups of {d}", .{ p.down.traits.name, p.down.traits.row_group });
    }
    for (p.ids) |id| {
        if (id >= s.n_expert) return opsInvalid("moe_ffn: expert {d} of {d}", .{ id, s.n_expert });
    }
    cpu_moe.ffn(&p) catch |err| return switch (err) {
        error.OutOfMemory => status.fail(.out_of_memory, "moe_ffn: scratch allocation failed", .{}),
        error.Unsupported => status.fail(.unsupported, "moe_ffn: unsupported types", .{}),
    };
    return 0;
}

/// The layout a matmul weight of `type_id` with n_out rows is faster in (Q4_0 and Q4_K with n_out
/// a multiple of 8: their rows interleaved by eight), or 0 where it is used as stored. The
/// repacked weights take the same bytes; pass the returned id to infer_matmul with them.
export fn infer_repacked_type(type_id: u32, n_out: u64) u32 {
    const t = quant_types.repackedType(type_id, @intCast(n_out)) orelse return 0;
    return @intFromEnum(t.id);
}

/// The layout whose matmul reads the same weight bytes as layout `type_id` but rounds as
/// llama.cpp's batched (prompt) kernel for it does, or 0 where the two round alike: embeddings
/// ask for it for the rows llama.cpp computes in groups of four (docs/embeddings.md).
export fn infer_prompt_rounding_type(type_id: u32) u32 {
    const t = quant_types.promptRoundingType(type_id) orelse return 0;
    return @intFromEnum(t.id);
}

/// Writes the n_out x n_in weights at src (type_id, row-major) into dst (as many bytes) in the
/// layout infer_repacked_type names.
export fn infer_repack(type_id: u32, src: ?[*]const u8, n_out: u64, n_in: u64, dst: ?[*]u8) i32 {
    const t = quantTraitsOrFail(type_id) orelse return @intFromEnum(status.Status.unsupported);
    if (quant_types.repackedType(type_id, @intCast(n_out)) == null) {
        return status.fail(.unsupported, "repack: {s} with {d} rows has no repacked layout", .{ t.name, n_out });
    }
    const s = src orelse return status.fail(.invalid_argument, "repack: src is null", .{});
    const d = dst orelse return status.fail(.invalid_argument, "repack: dst is null", .{});
    if (!quantBlocksOk(t, n_in, "repack: n_in")) return quantInvalid();
    _ = std.math.mul(u64, n_in / t.block_values * t.block_bytes, n_out) catch
        return status.fail(.invalid_argument, "repack: weight size overflows", .{});
    cpu_matmul.repackParallel(type_id, s, @intCast(n_out), @intCast(n_in), d);
    return 0;
}

/// Quantizes n f32 values into `type_id` with ggml's reference quantizer (what llama.cpp's
/// quantize tool writes): F32, F16, BF16, Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, Q8_K, MXFP4.
export fn infer_quantize_row(type_id: u32, src: ?[*]const f32, n: u64, dst: ?[*]u8) i32 {
    const t = quantTraitsOrFail(type_id) orelse return @intFromEnum(status.Status.unsupported);
    const quantize = t.quantize_ref orelse
        return status.fail(.unsupported, "quantizing to {s} is not implemented", .{t.name});
    const s = src orelse return status.fail(.invalid_argument, "quantize_row: src is null", .{});
    const d = dst orelse return status.fail(.invalid_argument, "quantize_row: dst is null", .{});
    if (!quantBlocksOk(t, n, "quantize_row: n")) return quantInvalid();
    quantize(s, d, @intCast(n));
    return 0;
}

/// Sets the threads kernels use (the caller's thread included); 0 = one per CPU.
export fn infer_threads_set(n: u32) i32 {
    if (n > cpu_threads.threads_max) {
        return status.fail(.invalid_argument, "threads_set: {d} threads is more than {d}", .{
            n, cpu_threads.threads_max,
        });
    }
    cpu_threads.setThreadCount(n) catch |err|
        return status.fail(.internal, "threads_set: cannot start threads: {s}", .{@errorName(err)});
    return 0;
}

export fn infer_threads_get() u32 {
    return @intCast(cpu_threads.threadCount());
}

// ---- f32 ops: norm, RoPE, attention, activations, token selection -----------------------------

/// rows · cols as an element count, or null when it overflows (a count from an untrusted shape).
pub fn opsCount(a: u64, b: u64) ?usize {
    return std.math.mul(usize, a, b) catch null;
}

pub fn opsInvalid(comptime fmt: []const u8, args: anytype) i32 {
    return status.fail(.invalid_argument, fmt, args);
}

/// out = x / sqrt(mean(x²) + eps) · weight per row of n_cols; weight null = no weight.
/// `out` may alias `x`. Mirrors ggml's rms_norm (f64 sum of squares) followed by ggml_mul.
export fn infer_rms_norm(
    x: [*]const f32,
    weight: ?[*]const f32,
    n_rows: u64,
    n_cols: u64,
    eps: f32,
    out: [*]f32,
) i32 {
    if (n_cols == 0) return opsInvalid("rms_norm: n_cols must be > 0", .{});
    const n = opsCount(n_rows, n_cols) orelse
        return opsInvalid("rms_norm: {d} x {d} overflows", .{ n_rows, n_cols });
    const w: ?[]const f32 = if (weight) |p| p[0..n_cols] else null;
    const Rows = struct {
        x: [*]const f32,
        w: ?[]const f32,
        n_cols: usize,
        eps: f32,
        out: [*]f32,
        fn range(r: *const @This(), begin: usize, end: usize) void {
            norm.rmsNorm(r.x[begin * r.n_cols .. end * r.n_cols], r.w, r.n_cols, r.eps, r.out[begin * r.n_cols .. end * r.n_cols]);
        }
    };
    _ = n;
    const rows: Rows = .{ .x = x, .w = w, .n_cols = @intCast(n_cols), .eps = eps, .out = out };
    cpu_threads.runRanges(@intCast(n_rows), 1, rowsPerTask(n_cols), &rows, Rows.range);
    return 0;
}

/// residual += rms_norm(x) · weight per row (Gemma's post-norm fused with the residual add).
export fn infer_rms_norm_add(
    x: [*]const f32,
    weight: [*]const f32,
    n_rows: u64,
    n_cols: u64,
    eps: f32,
    residual: [*]f32,
) i32 {
    if (n_cols == 0) return opsInvalid("rms_norm_add: n_cols must be > 0", .{});
    const n = opsCount(n_rows, n_cols) orelse
        return opsInvalid("rms_norm_add: {d} x {d} overflows", .{ n_rows, n_cols });
    const Rows = struct {
        x: [*]const f32,
        w: []const f32,
        n_cols: usize,
        eps: f32,
        residual: [*]f32,
        fn range(r: *const @This(), begin: usize, end: usize) void {
            norm.rmsNormAdd(r.x[begin * r.n_cols .. end * r.n_cols], r.w, r.n_cols, r.eps, r.residual[begin * r.n_cols .. end * r.n_cols]);
        }
    };
    _ = n;
    const rows: Rows = .{ .x = x, .w = weight[0..n_cols], .n_cols = @intCast(n_cols), .eps = eps, .residual = residual };
    cpu_threads.runRanges(@intCast(n_rows), 1, rowsPerTask(n_cols), &rows, Rows.range);
    return 0;
}

/// In-place RoPE on x[n_tok][n_heads][head_dim] (lib/abi.zig RopeShape), with optional per-pair
/// frequency factors (n_rot/2 of them, null: none): theta_i / ff_i.
export fn infer_rope(
    x: [*]f32,
    positions: [*]const i32,
    freq_factors: ?[*]const f32,
    shape: *const abi.RopeShape,
) i32 {
    const s = shape.*;
    const rope_mode = std.meta.intToEnum(rope.Mode, s.mode) catch
        return opsInvalid("rope: mode {d} is not 0 (normal) or 2 (neox)", .{s.mode});
    const n_rot_ok = s.n_rot > 0 and s.n_rot % 2 == 0 and s.n_rot <= s.head_dim;
    if (!n_rot_ok or s.n_rot > rope.rot_dims_max) return opsInvalid(
        "rope: n_rot {d} must be even, > 0, <= head_dim {d} and <= {d}",
        .{ s.n_rot, s.head_dim, rope.rot_dims_max },
    );
    if (!(s.freq_base > 0) or !std.math.isFinite(s.freq_base) or !std.math.isFinite(s.freq_scale))
        return opsInvalid("rope: bad freq_base {d} or freq_scale {d}", .{ s.freq_base, s.freq_scale });
    if (!(s.attn_factor > 0) or !std.math.isFinite(s.attn_factor))
        return opsInvalid("rope: bad attn_factor {d}", .{s.attn_factor});
    const yarn = s.ext_factor != 0;
    if (!std.math.isFinite(s.ext_factor) or (yarn and !(s.freq_scale > 0 and s.n_ctx_orig > 0 and
        s.beta_fast > 0 and s.beta_slow > 0 and std.math.isFinite(s.beta_fast) and std.math.isFinite(s.beta_slow))))
        return opsInvalid("rope: bad YaRN ext_factor {d}, freq_scale {d}, n_ctx_orig {d}, beta_fast {d}, beta_slow {d}", .{ s.ext_factor, s.freq_scale, s.n_ctx_orig, s.beta_fast, s.beta_slow });
    const per_tok = opsCount(s.n_heads, s.head_dim) orelse return opsInvalid("rope: overflow", .{});
    const n = opsCount(s.n_tok, per_tok) orelse return opsInvalid("rope: overflow", .{});
    _ = n;
    const Tokens = struct {
        x: [*]f32,
        positions: [*]const i32,
        per_tok: usize,
        params: rope.Params,
        fn range(r: *const @This(), begin: usize, end: usize) void {
            rope.rope(r.x[begin * r.per_tok .. end * r.per_tok], r.positions[begin..end], r.params);
        }
    };
    const tokens: Tokens = .{ .x = x, .positions = positions, .per_tok = @intCast(per_tok), .params = .{
        .n_heads = s.n_heads,
        .head_dim = s.head_dim,
        .n_rot = s.n_rot,
        .freq_base = s.freq_base,
        .freq_scale = s.freq_scale,
        .attn_factor = s.attn_factor,
        .mode = rope_mode,
        .freq_factors = if (freq_factors) |f| f[0 .. s.n_rot / 2] else null,
        .ext_factor = s.ext_factor,
        .corr_dims = if (yarn) rope.yarnCorrDims(s.n_rot, s.n_ctx_orig, s.freq_base, s.beta_fast, s.beta_slow) else .{ 0, 0 },
    } };
    cpu_threads.runRanges(s.n_tok, 1, rowsPerTask(per_tok), &tokens, Tokens.range);
    return 0;
}

/// Causal (optionally sliding-window) grouped-query attention of queries q over the K/V cache
/// k, v as lib/abi.zig AttentionShape says (with per-head sinks when shape.sinks is set). out: [n_tok][n_head][head_dim]. See cpu/attention.zig.
export fn infer_attention(
    q: [*]const f32,
    k: [*]const u8,
    v: [*]const u8,
    out: [*]f32,
    shape: *const abi.AttentionShape,
) i32 {
    const n_tok = shape.n_tok;
    const n_head = shape.n_head;
    const n_kv_head = shape.n_kv_head;
    const head_dim = shape.head_dim;
    const pos0 = shape.pos0;
    const kv_stride = shape.kv_stride;
    const window = shape.window;
    const ring = shape.ring;
    const scale = shape.scale;
    const k_type = std.meta.intToEnum(attention.KvType, shape.k_type) catch return opsInvalid(
        "attention: k_type {d} is not 0 (F32), 1 (F16), 2 (Q4_0), 8 (Q8_0), 103 (TQ3) or 104 (TQ4)",
        .{shape.k_type},
    );
    const v_type = std.meta.intToEnum(attention.KvType, shape.v_type) catch return opsInvalid(
        "attention: v_type {d} is not 0 (F32), 1 (F16), 2 (Q4_0), 8 (Q8_0), 103 (TQ3) or 104 (TQ4)",
        .{shape.v_type},
    );
    if (n_kv_head == 0 or n_head == 0 or n_head % n_kv_head != 0) return opsInvalid(
        "attention: n_head {d} is not a multiple of n_kv_head {d}",
        .{ n_head, n_kv_head },
    );
    if (n_head / n_kv_head > attention.group_max)
        return opsInvalid("attention: over {d} query heads per kv head", .{attention.group_max});
    const head_dim_max = attention.head_dim_max;
    if (head_dim == 0 or head_dim > head_dim_max)
        return opsInvalid("attention: head_dim {d} not in 1..{d}", .{ head_dim, head_dim_max });
    const kv_row = opsCount(n_kv_head, head_dim) orelse
        return opsInvalid("attention: shape overflows", .{});
    if (kv_stride < kv_row)
        return opsInvalid("attention: kv_stride {d} < n_kv_head·head_dim {d}", .{ kv_stride, kv_row });
    const positions_max: u64 = 1 << 32;
    const too_long = pos0 >= positions_max or n_tok >= positions_max;
    if (too_long or opsCount(pos0 + n_tok, kv_stride) == null)
        return opsInvalid("attention: pos0 {d} + n_tok {d} too large", .{ pos0, n_tok });
    if ((k_type == .f32 and @intFromPtr(k) % 4 != 0) or (v_type == .f32 and @intFromPtr(v) % 4 != 0))
        return opsInvalid("attention: F32 cache pointers must be 4-byte aligned", .{});
    if ((k_type.quantized() or v_type.quantized()) and (head_dim % 32 != 0 or kv_stride % 32 != 0)) return opsInvalid(
        "attention: a quantized cache needs head_dim {d} and kv_stride {d} to be multiples of 32",
        .{ head_dim, kv_stride },
    );
    if ((k_type.turbo() or v_type.turbo()) and (!kv_turbo.dimSupported(head_dim) or kv_stride % head_dim != 0)) return opsInvalid(
        "attention: a tq3/tq4 cache needs head_dim {d} a power of two in {d}..{d} and kv_stride {d} a multiple of it",
        .{ head_dim, kv_turbo.dim_min, kv_turbo.dim_max, kv_stride },
    );
    // A ring holds position p in cell p % ring; it must keep every key the batch's queries see.
    if (ring != 0 and (window == 0 or ring < window + n_tok - 1)) return opsInvalid(
        "attention: a ring of {d} cells needs a window and at least window + n_tok - 1 = {d} cells",
        .{ ring, window + n_tok -| 1 },
    );
    if (shape.order > 1) return opsInvalid("attention: order {d} is not 0 (single token) or 1 (batched)", .{shape.order});
    if (shape.sinks % 4 != 0) return opsInvalid("attention: the sinks must be 4-byte aligned f32", .{});
    if (shape.mass % 4 != 0 or (shape.mass != 0 and ring != 0))
        return opsInvalid("attention: mass must be 4-byte aligned f32, over a linear cache", .{});
    if (n_tok == 0) return 0;
    const k_cache = attention.Cache.fromBytes(k_type, k);
    const v_cache = attention.Cache.fromBytes(v_type, v);
    const attn_shape: attention.Shape = .{
        .n_tok = n_tok,
        .n_head = n_head,
        .n_kv_head = n_kv_head,
        .head_dim = head_dim,
        .pos0 = pos0,
        .kv_stride = kv_stride,
        .window = window,
        .ring = ring,
        .scale = scale,
        .batched_order = shape.order == 1,
        .sinks = if (shape.sinks == 0) null else @ptrFromInt(shape.sinks),
    };
    const done = attention.attention(q, k_cache, v_cache, out, attn_shape);
    if (!done) return status.fail(.out_of_memory, "attention: no memory for {d} scores", .{pos0 + n_tok});
    if (shape.mass != 0) {
        const mass: [*]f32 = @ptrFromInt(shape.mass);
        // the same shape: mass needs a linear cache (checked above) and takes no batched order
        if (!attention.accumulateMass(q, k_cache, attn_shape, mass[0 .. pos0 + n_tok])) return status.fail(.out_of_memory, "attention: no memory for {d} scores", .{pos0 + n_tok});
    }
    return 0;
}

/// Writes n f32 values into a K/V cache as dst_type (0 = F32, 1 = F16 rounded to nearest even,
/// 2 = Q4_0, 8 = Q8_0 as llama.cpp quantizes a cache row, n a multiple of 32 for those; 103 =
/// TQ3, 104 = TQ4, infer's rotated codes, one per head vector of head_dim values, n a multiple
/// of head_dim). head_dim matters only to TQ3/TQ4, which may code each row of anchor_len values
/// less `anchor` (null: none; see cpu/attention.zig store).
export fn infer_kv_store(src: [*]const f32, dst: [*]u8, dst_type: u32, n: u64, head_dim: u64, anchor: ?[*]const f32, anchor_len: u64) i32 {
    const cache_type = kvTypeOf("kv_store: dst_type", dst_type) orelse return quantInvalid();
    if (!kvCountOk("kv_store", cache_type, n, head_dim)) return quantInvalid();
    const a = anchorOf("kv_store", cache_type, anchor, anchor_len, n, head_dim) catch return quantInvalid();
    attention.storeAnchored(src[0..n], dst, cache_type, head_dim, a);
    return 0;
}

fn anchorOf(what: []const u8, t: attention.KvType, anchor: ?[*]const f32, len: u64, n: u64, head_dim: u64) error{Invalid}!?[]const f32 {
    const a = anchor orelse return null;
    if (!t.turbo() or len == 0 or len % head_dim != 0 or n % len != 0) {
        _ = opsInvalid("{s}: an anchor is for tq3/tq4 and needs {d} values a multiple of head_dim {d} dividing {d}", .{ what, len, head_dim, n });
        return error.Invalid;
    }
    return a[0..len];
}

/// Reads n values of a K/V cache of src_type (as infer_kv_store writes them) back as f32: the
/// rotated codes decoded and rotated back, their anchor added back. For the context shift, which
/// re-rotates kept keys, and for copies between caches whose anchors differ.
export fn infer_kv_load(src: [*]const u8, src_type: u32, n: u64, head_dim: u64, anchor: ?[*]const f32, anchor_len: u64, dst: [*]f32) i32 {
    const cache_type = kvTypeOf("kv_load: src_type", src_type) orelse return quantInvalid();
    if (!kvCountOk("kv_load", cache_type, n, head_dim)) return quantInvalid();
    const a = anchorOf("kv_load", cache_type, anchor, anchor_len, n, head_dim) catch return quantInvalid();
    attention.load(src, cache_type, dst[0..n], head_dim, a);
    return 0;
}

fn kvTypeOf(what: []const u8, id: u32) ?attention.KvType {
    return std.meta.intToEnum(attention.KvType, id) catch {
        _ = opsInvalid("{s} {d} is not 0 (F32), 1 (F16), 2 (Q4_0), 8 (Q8_0), 103 (TQ3) or 104 (TQ4)", .{ what, id });
        return null;
    };
}

fn kvCountOk(what: []const u8, t: attention.KvType, n: u64, head_dim: u64) bool {
    if (t.quantized() and n % 32 != 0) {
        _ = opsInvalid("{s}: {d} values are not whole blocks of 32", .{ what, n });
        return false;
    }
    if (t.turbo() and (!kv_turbo.dimSupported(head_dim) or n % head_dim != 0)) {
        _ = opsInvalid("{s}: tq3/tq4 need head_dim {d} a power of two in {d}..{d} and {d} values a multiple of it", .{ what, head_dim, kv_turbo.dim_min, kv_turbo.dim_max, n });
        return false;
    }
    return true;
}

/// out = gelu_tanh(gate) · up; out may alias gate or up.
export fn infer_gelu_mul(gate: [*]const f32, up: [*]const f32, n: u64, out: [*]f32) i32 {
    gatedParallel(.gelu_tanh, gate, up, @intCast(n), out);
    return 0;
}

/// out = silu(gate) · up; out may alias gate or up.
export fn infer_silu_mul(gate: [*]const f32, up: [*]const f32, n: u64, out: [*]f32) i32 {
    gatedParallel(.silu, gate, up, @intCast(n), out);
    return 0;
}

/// gpt-oss's clamped SwiGLU (ggml's swiglu_oai, alpha 1.702, limit 7):
/// out = min(g, 7) · σ(1.702 · min(g, 7)) · (clamp(u, -7, 7) + 1); out may alias gate or up.
export fn infer_swiglu_oai_mul(gate: [*]const f32, up: [*]const f32, n: u64, out: [*]f32) i32 {
    gatedParallel(.swiglu_oai, gate, up, @intCast(n), out);
    return 0;
}

/// Values per task of the row-wise and element-wise ops across the pool: below this an op runs
/// on the calling thread (a decode step's rows cost less than a pool op). A prompt's rows are
/// split by whole rows (tokens) and elements by whole vectors, so every value is computed as on
/// one thread.
const values_per_task = 16 * 1024;

pub fn rowsPerTask(n_cols: u64) usize {
    return @intCast(@max(1, values_per_task / @max(n_cols, 1)));
}

fn gatedParallel(kind: act.Gate, gate: [*]const f32, up: [*]const f32, n: usize, out: [*]f32) void {
    const Elements = struct {
        kind: act.Gate,
        gate: [*]const f32,
        up: [*]const f32,
        out: [*]f32,
        fn range(r: *const @This(), begin: usize, end: usize) void {
            act.gated(r.kind, r.gate[begin..end], r.up[begin..end], r.out[begin..end]);
        }
    };
    const elements: Elements = .{ .kind = kind, .gate = gate, .up = up, .out = out };
    cpu_threads.runRanges(n, 64, values_per_task, &elements, Elements.range);
}

/// Row-wise softmax in place.
export fn infer_softmax(x: [*]f32, n_rows: u64, n_cols: u64) i32 {
    if (n_cols == 0) return opsInvalid("softmax: n_cols must be > 0", .{});
    const n = opsCount(n_rows, n_cols) orelse
        return opsInvalid("softmax: {d} x {d} overflows", .{ n_rows, n_cols });
    act.softmax(x[0..n], n_cols);
    return 0;
}

/// out = a + b; out may alias a or b.
export fn infer_add(a: [*]const f32, b: [*]const f32, n: u64, out: [*]f32) i32 {
    const Elements = struct {
        a: [*]const f32,
        b: [*]const f32,
        out: [*]f32,
        fn range(r: *const @This(), begin: usize, end: usize) void {
            act.add(r.a[begin..end], r.b[begin..end], r.out[begin..end]);
        }
    };
    const elements: Elements = .{ .a = a, .b = b, .out = out };
    cpu_threads.runRanges(@intCast(n), 64, values_per_task, &elements, Elements.range);
    return 0;
}

/// x *= s in place.
export fn infer_scale(x: [*]f32, n: u64, s: f32) i32 {
    act.scale(x[0..n], s);
    return 0;
}

fn selectCount(n: u64, what: []const u8) bool {
    if (n > 0 and n <= std.math.maxInt(i32)) return true;
    _ = opsInvalid("{s}: n = {d} is not in 1..2^31-1", .{ what, n });
    return false;
}

/// out[0] = the lowest index of the largest of n values (greedy sampling); NaN never wins.
export fn infer_argmax(x: [*]const f32, n: u64, out: *u32) i32 {
    if (!selectCount(n, "argmax")) return @intFromEnum(status.Status.invalid_argument);
    out.* = @intCast(select.argmax(x[0..n]));
    return 0;
}

/// The k largest of n values that are neither -inf nor NaN, best first, equal values in index
/// order (top-k sampling): ids[0..count) and values[0..count), count (<= k) in out_count[0].
export fn infer_top_k(x: [*]const f32, n: u64, k: u64, ids: [*]i32, values: [*]f32, out_count: *u32) i32 {
    if (!selectCount(n, "top_k")) return @intFromEnum(status.Status.invalid_argument);
    if (k == 0 or k > n) return opsInvalid("top_k: k = {d} is not in 1..{d}", .{ k, n });
    out_count.* = @intCast(select.topK(x[0..n], ids[0..k], values[0..k]));
    return 0;
}

/// out[0] = the sum of exp((x - max) · scale) over the x at or above floor (-inf: all finite x).
export fn infer_exp_sum(x: [*]const f32, n: u64, max: f32, scale: f32, floor: f32, out: *f64) i32 {
    if (!selectCount(n, "exp_sum")) return @intFromEnum(status.Status.invalid_argument);
    out.* = select.expSum(x[0..n], max, scale, floor);
    return 0;
}

/// out[0] = the first index where the running sum of exp((x - max) · scale) reaches target.
export fn infer_draw(x: [*]const f32, n: u64, max: f32, scale: f32, target: f64, out: *u32) i32 {
    if (!selectCount(n, "draw")) return @intFromEnum(status.Status.invalid_argument);
    out.* = @intCast(select.draw(x[0..n], max, scale, target));
    return 0;
}

/// out[0] = the index of the first NaN or infinite value of n, or n where all are finite.
export fn infer_first_nonfinite(x: [*]const f32, n: u64, out: *u64) i32 {
    if (!selectCount(n, "first_nonfinite")) return @intFromEnum(status.Status.invalid_argument);
    out.* = select.firstNonFinite(x[0..n]);
    return 0;
}

/// ids[0..count) = the indices of the x at or above floor, in order; ids holds n.
export fn infer_above(x: [*]const f32, n: u64, floor: f32, ids: [*]i32, out_count: *u32) i32 {
    if (!selectCount(n, "above")) return @intFromEnum(status.Status.invalid_argument);
    out_count.* = @intCast(select.above(x[0..n], floor, ids[0..n]));
    return 0;
}

// ---- row bias (the q/k/v biases of Qwen 2, the LM-head bias) -----------------------------------

/// x[r][c] += bias[c] for every one of n_rows rows of n_cols (the q/k/v biases of Qwen 2, the
/// LM-head bias): one call per op over the whole batch, as ggml_add broadcasts a row.
export fn infer_add_row_bias(x: [*]f32, bias: [*]const f32, n_rows: u64, n_cols: u64) i32 {
    if (n_cols == 0) return opsInvalid("add_row_bias: n_cols must be > 0", .{});
    const n = opsCount(n_rows, n_cols) orelse
        return opsInvalid("add_row_bias: {d} x {d} overflows", .{ n_rows, n_cols });
    const cols: usize = @intCast(n_cols);
    const b = bias[0..cols];
    var row: usize = 0;
    while (row < n) : (row += cols) {
        const r = x[row .. row + cols];
        act.add(r, b, r);
    }
    return 0;
}

test "add_row_bias adds the bias to every row" {
    var x = [_]f32{ 1, 2, 3, 4, 5, 6 };
    const b = [_]f32{ 0.5, -1, 2 };
    try std.testing.expectEqual(@as(i32, 0), infer_add_row_bias(&x, &b, 2, 3));
    try std.testing.expectEqualSlices(f32, &.{ 1.5, 1, 5, 4.5, 4, 8 }, &x);
}

test {
    _ = quant_types;
    _ = cpu_matmul;
    _ = cpu_threads;
    _ = cpu_moe;
    _ = norm;
    _ = rope;
    _ = attention;
    _ = act;
    _ = select;
}
