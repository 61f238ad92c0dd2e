//! The only exported surface of libinfer. Every function is C-ABI, named infer_<area>_<verb>,
//! takes plain types, and returns an i32 Status where it can fail (message: infer_last_error).
//! ts/native/symbols.gen.ts is generated from the `export fn` lines of this file
//! (bun ts/native/gen-symbols.ts), so the two sides cannot drift.
const std = @import("std");
const status = @import("status.zig");
const file_map = @import("file_map.zig");

pub const version: u32 = 1;

export fn infer_version() u32 {
    return version;
}

export fn infer_last_error() [*:0]const u8 {
    return status.lastError();
}

const abi = @import("abi.zig");
const settings = @import("settings.zig");

/// Takes the library's settings (lib/abi.zig Settings). The host calls it once, right after
/// loading the library and before any other call; until then the struct's defaults hold.
export fn infer_configure(s: *const abi.Settings) i32 {
    if (s.cublas_path_len >= abi.Settings.path_bytes_max)
        return status.fail(.invalid_argument, "configure: a cuBLAS path of {d} bytes", .{s.cublas_path_len});
    settings.current = s.*;
    return 0;
}

// ---- files ---------------------------------------------------------------------------------

/// Maps `path` read-only. Out: an opaque handle for infer_file_close, the base address, the size.
export fn infer_file_open(
    path_ptr: [*]const u8,
    path_len: usize,
    out_handle: *?*anyopaque,
    out_base: *?[*]const u8,
    out_len: *u64,
) i32 {
    const mapping = std.heap.c_allocator.create(file_map.Mapping) catch
        return status.fail(.out_of_memory, "out of memory", .{});
    const rc = file_map.open(path_ptr[0..path_len], mapping);
    if (rc != 0) {
        std.heap.c_allocator.destroy(mapping);
        return rc;
    }
    out_handle.* = mapping;
    out_base.* = mapping.bytes.ptr;
    out_len.* = mapping.bytes.len;
    return 0;
}

export fn infer_file_close(handle: ?*anyopaque) void {
    const mapping: *file_map.Mapping = @ptrCast(@alignCast(handle orelse return));
    file_map.close(mapping.*);
    std.heap.c_allocator.destroy(mapping);
}

/// Drops the whole pages of bytes [offset, offset + len) of a mapping from infer_file_open from
/// the process's memory once their bytes live elsewhere (a repacked weight); reads fault them back.
export fn infer_file_release(handle: ?*anyopaque, offset: u64, len: u64) i32 {
    const mapping: *file_map.Mapping = @ptrCast(@alignCast(handle orelse
        return status.fail(.invalid_argument, "release: no mapping", .{})));
    return file_map.release(mapping.*, @intCast(offset), @intCast(len));
}

const pages = @import("pages.zig");

/// Zeroed anonymous memory for weights and caches read on every token: 2 MiB-aligned, in huge
/// pages where the system allows (lib/pages.zig). out[0] = its address; free with
/// infer_pages_free and the same byte count.
export fn infer_pages_alloc(bytes: u64, out: *u64) i32 {
    if (bytes == 0 or bytes > 1 << 46) return status.fail(.invalid_argument, "pages_alloc: {d} bytes", .{bytes});
    const region = pages.alloc(@intCast(bytes)) catch
        return status.fail(.out_of_memory, "cannot map {d} bytes", .{bytes});
    out.* = @intFromPtr(region.ptr);
    return 0;
}

export fn infer_pages_free(address: u64, bytes: u64) void {
    if (address == 0 or address % pages.huge_bytes != 0) return;
    pages.free(@ptrFromInt(address), @intCast(bytes));
}

test {
    _ = pages;
}

// ---- quant formats, matmul, threads (lib/quant/, lib/cpu/matmul.zig, lib/cpu/threads.zig) ------
// (kernels helper section: begin)
const quant_types = @import("quant/types.zig");
const cpu_matmul = @import("cpu/matmul.zig");
const cpu_threads = @import("cpu/threads.zig");

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
fn quantInvalid() i32 {
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

/// The layout a matmul weight of `type_id` with n_out rows is faster in (Q4_0 and Q4_K with n_out
/// a multiple of 8: their rows interleaved by eight), or 0 where it is used as stored. The
/// repacked weights take the same bytes; pass the returned id to infer_matmul with them.
export fn infer_repacked_type(type_id: u32, n_out: u64) u32 {
    const t = quant_types.repackedType(type_id, @intCast(n_out)) orelse return 0;
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
    quant_types.repack(type_id, s, @intCast(n_out), @intCast(n_in), d);
    return 0;
}

/// Quantizes n f32 values into `type_id` with ggml's reference quantizer (what llama.cpp's
/// quantize tool writes): F32, F16, BF16, Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, Q8_K.
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

test {
    _ = quant_types;
    _ = cpu_matmul;
    _ = cpu_threads;
}
// (kernels helper section: end)

// ---- f32 ops: norm, rope, attention, activations (lib/cpu/*.zig) ----------------------------
// (ops helper section: begin)
const norm = @import("cpu/norm.zig");
const rope = @import("cpu/rope.zig");
const attention = @import("cpu/attention.zig");
const act = @import("cpu/act.zig");

/// rows · cols as an element count, or null when it overflows (a count from an untrusted shape).
fn opsCount(a: u64, b: u64) ?usize {
    return std.math.mul(usize, a, b) catch null;
}

fn opsInvalid(comptime fmt: []const u8, args: anytype) i32 {
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
    norm.rmsNorm(x[0..n], w, n_cols, eps, out[0..n]);
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
    norm.rmsNormAdd(x[0..n], weight[0..n_cols], n_cols, eps, residual[0..n]);
    return 0;
}

fn opsRope(
    x: [*]f32,
    n_tok: u64,
    n_heads: u64,
    head_dim: u64,
    n_rot: u64,
    positions: [*]const i32,
    freq_base: f32,
    freq_scale: f32,
    mode: u32,
    freq_factors: ?[*]const f32,
) i32 {
    const rope_mode = std.meta.intToEnum(rope.Mode, mode) catch
        return opsInvalid("rope: mode {d} is not 0 (normal) or 2 (neox)", .{mode});
    const n_rot_ok = n_rot > 0 and n_rot % 2 == 0 and n_rot <= head_dim;
    if (!n_rot_ok or n_rot > rope.rot_dims_max) return opsInvalid(
        "rope: n_rot {d} must be even, > 0, <= head_dim {d} and <= {d}",
        .{ n_rot, head_dim, rope.rot_dims_max },
    );
    if (!(freq_base > 0) or !std.math.isFinite(freq_base) or !std.math.isFinite(freq_scale))
        return opsInvalid("rope: bad freq_base {d} or freq_scale {d}", .{ freq_base, freq_scale });
    const per_tok = opsCount(n_heads, head_dim) orelse return opsInvalid("rope: overflow", .{});
    const n = opsCount(n_tok, per_tok) orelse return opsInvalid("rope: overflow", .{});
    rope.rope(x[0..n], positions[0..n_tok], .{
        .n_heads = n_heads,
        .head_dim = head_dim,
        .n_rot = n_rot,
        .freq_base = freq_base,
        .freq_scale = freq_scale,
        .mode = rope_mode,
        .freq_factors = if (freq_factors) |f| f[0 .. n_rot / 2] else null,
    });
    return 0;
}

/// In-place RoPE on x[n_tok][n_heads][head_dim]; mode 0 = normal (pairs 2i, 2i+1), 2 = NeoX
/// (pairs i, i + n_rot/2); theta_i = pos · freq_scale · base^(-2i/n_rot); dims >= n_rot kept.
export fn infer_rope(
    x: [*]f32,
    n_tok: u64,
    n_heads: u64,
    head_dim: u64,
    n_rot: u64,
    positions: [*]const i32,
    freq_base: f32,
    freq_scale: f32,
    mode: u32,
) i32 {
    return opsRope(
        x,
        n_tok,
        n_heads,
        head_dim,
        n_rot,
        positions,
        freq_base,
        freq_scale,
        mode,
        null,
    );
}

/// infer_rope with optional per-pair frequency factors (n_rot/2 of them): theta_i / ff_i.
export fn infer_rope_ext(
    x: [*]f32,
    n_tok: u64,
    n_heads: u64,
    head_dim: u64,
    n_rot: u64,
    positions: [*]const i32,
    freq_base: f32,
    freq_scale: f32,
    mode: u32,
    freq_factors: ?[*]const f32,
) i32 {
    return opsRope(
        x,
        n_tok,
        n_heads,
        head_dim,
        n_rot,
        positions,
        freq_base,
        freq_scale,
        mode,
        freq_factors,
    );
}

/// Causal (optionally sliding-window) grouped-query attention of n_tok queries at positions
/// pos0.. over a K/V cache [pos][n_kv_head][head_dim] (rows kv_stride elements apart) of
/// ggml type kv_type (0 = F32, 1 = F16). out: [n_tok][n_head][head_dim]. See cpu/attention.zig.
export fn infer_attention(
    q: [*]const f32,
    k: [*]const u8,
    v: [*]const u8,
    kv_type: u32,
    out: [*]f32,
    n_tok: u64,
    n_head: u64,
    n_kv_head: u64,
    head_dim: u64,
    pos0: u64,
    kv_stride: u64,
    window: u64,
    ring: u64,
    scale: f32,
) i32 {
    const cache_type = std.meta.intToEnum(attention.KvType, kv_type) catch
        return opsInvalid("attention: kv_type {d} is not 0 (F32) or 1 (F16)", .{kv_type});
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
    if (cache_type == .f32 and (@intFromPtr(k) % 4 != 0 or @intFromPtr(v) % 4 != 0))
        return opsInvalid("attention: F32 cache pointers must be 4-byte aligned", .{});
    // A ring holds position p in cell p % ring; it must keep every key the batch's queries see.
    if (ring != 0 and (window == 0 or ring < window + n_tok - 1)) return opsInvalid(
        "attention: a ring of {d} cells needs a window and at least window + n_tok - 1 = {d} cells",
        .{ ring, window + n_tok -| 1 },
    );
    if (n_tok == 0) return 0;
    const k_cache = attention.Cache.fromBytes(cache_type, k);
    const v_cache = attention.Cache.fromBytes(cache_type, v);
    const done = attention.attention(q, k_cache, v_cache, out, .{
        .n_tok = n_tok,
        .n_head = n_head,
        .n_kv_head = n_kv_head,
        .head_dim = head_dim,
        .pos0 = pos0,
        .kv_stride = kv_stride,
        .window = window,
        .ring = ring,
        .scale = scale,
    });
    if (!done) return status.fail(.out_of_memory, "attention: no memory for {d} scores", .{pos0 + n_tok});
    return 0;
}

/// Writes n f32 values into a K/V cache as dst_type (0 = F32, 1 = F16, round to nearest even).
export fn infer_kv_store(src: [*]const f32, dst: [*]u8, dst_type: u32, n: u64) i32 {
    const cache_type = std.meta.intToEnum(attention.KvType, dst_type) catch
        return opsInvalid("kv_store: dst_type {d} is not 0 (F32) or 1 (F16)", .{dst_type});
    attention.store(src[0..n], dst, cache_type);
    return 0;
}

/// out = gelu_tanh(gate) · up; out may alias gate or up.
export fn infer_gelu_mul(gate: [*]const f32, up: [*]const f32, n: u64, out: [*]f32) i32 {
    act.gated(.gelu_tanh, gate[0..n], up[0..n], out[0..n]);
    return 0;
}

/// out = silu(gate) · up; out may alias gate or up.
export fn infer_silu_mul(gate: [*]const f32, up: [*]const f32, n: u64, out: [*]f32) i32 {
    act.gated(.silu, gate[0..n], up[0..n], out[0..n]);
    return 0;
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
    act.add(a[0..n], b[0..n], out[0..n]);
    return 0;
}

/// x *= s in place.
export fn infer_scale(x: [*]f32, n: u64, s: f32) i32 {
    act.scale(x[0..n], s);
    return 0;
}

const select = @import("cpu/select.zig");

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

test {
    _ = norm;
    _ = rope;
    _ = attention;
    _ = act;
    _ = select;
}
// (ops helper section: end)

// ---- row bias (architectures helper: llama / qwen2 / qwen3) ----------------------------------
// (architectures helper section: begin)

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
// (architectures helper section: end)

test {
    std.testing.refAllDecls(@This());
    _ = status;
    _ = file_map;
    _ = @import("nonfinite_test.zig");
}

// ---- bench (bench helper) ----------------------------------------------------------------------
// (bench helper section: begin)

const bench_threads = @import("cpu/threads.zig");

const BenchRead = struct {
    base: [*]const u8,
    len: usize,
    chunk: usize,
    partial: []u64,

    const Vec = @Vector(8, u64);

    /// Sums one chunk with four independent vector accumulators (64-byte loads, no stores).
    fn task(self: *const BenchRead, i: usize) void {
        const start = i * self.chunk;
        const end = @min(self.len, start + self.chunk);
        var p = start;
        var a0: Vec = @splat(0);
        var a1: Vec = @splat(0);
        var a2: Vec = @splat(0);
        var a3: Vec = @splat(0);
        while (p + 256 <= end) : (p += 256) {
            a0 +%= @as(*align(1) const Vec, @ptrCast(self.base + p)).*;
            a1 +%= @as(*align(1) const Vec, @ptrCast(self.base + p + 64)).*;
            a2 +%= @as(*align(1) const Vec, @ptrCast(self.base + p + 128)).*;
            a3 +%= @as(*align(1) const Vec, @ptrCast(self.base + p + 192)).*;
        }
        var sum: u64 = @reduce(.Add, a0 +% a1 +% a2 +% a3);
        while (p < end) : (p += 1) sum +%= self.base[p];
        self.partial[i] = sum;
    }
};

/// Reads `len` bytes of `buf` once with the thread pool (`threads` > 0 sets its size first) and
/// returns a checksum, so the caller can time a read-only pass: the machine's memory bandwidth
/// when the buffer is far larger than the caches. Returns -1 on a bad argument.
export fn infer_bench_read(buf: [*]const u8, len: u64, threads: u32) f64 {
    if (threads > bench_threads.threads_max) return -1;
    if (threads > 0) bench_threads.setThreadCount(threads) catch return -1;
    const n_tasks: usize = 64;
    var partial: [n_tasks]u64 = @splat(0);
    const n: usize = @intCast(len);
    // 4 KiB-aligned chunks so that no two tasks share a page.
    const chunk = std.mem.alignForward(usize, (n + n_tasks - 1) / n_tasks, 4096);
    if (chunk == 0) return 0;
    const ctx: BenchRead = .{ .base = buf, .len = n, .chunk = chunk, .partial = &partial };
    bench_threads.run((n + chunk - 1) / chunk, &ctx, BenchRead.task);
    var sum: u64 = 0;
    for (partial) |s| sum +%= s;
    return @floatFromInt(sum);
}

test "bench_read sums every u64 lane, and the tail byte by byte" {
    var words: [4096]u64 = undefined;
    var expect: u64 = 0;
    for (&words, 0..) |*w, i| {
        w.* = i * 2654435761;
        expect +%= w.*;
    }
    const bytes: [*]const u8 = @ptrCast(&words);
    for ([_]u32{ 1, 2, 0 }) |threads| {
        try std.testing.expectEqual(@as(f64, @floatFromInt(expect)), infer_bench_read(bytes, @sizeOf(@TypeOf(words)), threads));
    }
    const small = [_]u8{ 1, 2, 3, 250 };
    try std.testing.expectEqual(@as(f64, 256), infer_bench_read(&small, small.len, 0));
    try std.testing.expectEqual(@as(f64, 0), infer_bench_read(&small, 0, 0));
    try std.testing.expectEqual(@as(f64, -1), infer_bench_read(&small, 1, 100_000));
}
// (bench helper section: end)

// ---- CUDA backend (lib/cuda/: driver loaded at run time, kernels from shaders/cuda/) -----------
// (cuda helper section: begin)
// Device addresses are u64. Without a driver, GPU or kernel file, infer_cuda_init fails with
// `unsupported` and "CUDA not available: <reason>"; every other call then fails cleanly.
const cuda = @import("cuda/cuda.zig");

/// Loads libcuda, takes device `device` and loads the kernels (a fatbin) at path.
export fn infer_cuda_init(path_ptr: [*]const u8, path_len: usize, device: i32) i32 {
    return cuda.init(path_ptr[0..path_len], device);
}

/// Out: the device name (NUL-terminated) and [total bytes, free bytes, multiprocessors,
/// compute capability major*10+minor, driver version, L2 bytes].
export fn infer_cuda_device_info(name: [*]u8, name_len: usize, out: *[6]i64) i32 {
    return cuda.deviceInfo(name, name_len, out);
}

/// Synchronise after every launch (debugging: an asynchronous fault is reported by its kernel).
export fn infer_cuda_set_debug_sync(on: bool) void {
    cuda.setDebugSync(on);
}

/// Starts (on) or stops profiler collection, for Nsight Compute's --profile-from-start off.
export fn infer_cuda_profiler(on: bool) i32 {
    return cuda.profiler(on);
}

/// The activation format a weight type's matmul reads: 0 = Q8_0, 1 = Q8_K, -1 = f32;
/// -2 = a type the CUDA backend does not compute.
export fn infer_cuda_weight_activation(type_id: u32) i32 {
    return if (cuda.weightKind(type_id)) |k| k.activation else -2;
}

/// The type id a weight of ggml type `type_id` with rows of n_in values computes as once
/// infer_cuda_repack has run on it (its GPU layout, or type_id when it keeps the GGUF's).
export fn infer_cuda_repacked_type(type_id: u32, n_in: u64) u32 {
    return cuda.repackedType(type_id, n_in);
}

/// Rewrites a just-uploaded weight (n_rows rows of n_in values) into infer_cuda_repacked_type's
/// layout, in place, in stream order.
export fn infer_cuda_repack(w: u64, type_id: u32, n_rows: u64, n_in: u64) i32 {
    return cuda.repack(w, type_id, n_rows, n_in);
}

export fn infer_cuda_malloc(bytes: u64, out: *u64) i32 {
    return cuda.malloc(bytes, out);
}

export fn infer_cuda_free(ptr: u64) void {
    cuda.free(ptr);
}

export fn infer_cuda_host_alloc(bytes: u64, out: *u64) i32 {
    return cuda.hostAlloc(bytes, out);
}

export fn infer_cuda_host_free(ptr: u64) void {
    cuda.hostFree(ptr);
}

/// Stream-ordered host -> device copy; `src` may be reused as soon as this returns.
export fn infer_cuda_upload(dst: u64, src: [*]const u8, bytes: u64) i32 {
    return cuda.upload(dst, src, bytes);
}

/// Waits for queued work, then copies device -> host.
export fn infer_cuda_download(dst: [*]u8, src: u64, bytes: u64) i32 {
    return cuda.download(dst, src, bytes);
}

export fn infer_cuda_copy(dst: u64, src: u64, bytes: u64) i32 {
    return cuda.copy(dst, src, bytes);
}

export fn infer_cuda_fill32(dst: u64, value: u32, count: u64) i32 {
    return cuda.fill32(dst, value, count);
}

export fn infer_cuda_sync() i32 {
    return cuda.sync();
}

/// Records the launches that follow (until capture_end) into a CUDA graph instead of running them.
export fn infer_cuda_capture_begin() i32 {
    return cuda.captureBegin();
}

export fn infer_cuda_capture_end(out_exec: *u64) i32 {
    return cuda.captureEnd(out_exec);
}

export fn infer_cuda_capture_abort() void {
    cuda.captureAbort();
}

export fn infer_cuda_graph_launch(exec: u64) i32 {
    return cuda.graphLaunch(exec);
}

export fn infer_cuda_graph_destroy(exec: u64) void {
    cuda.graphDestroy(exec);
}

/// dst[i] = row ids[i] (i < n_ids, ids on the device) of a table of rows of n_cols values.
export fn infer_cuda_get_rows(type_id: u32, table: u64, n_cols: u64, n_ids: u64, ids: u64, dst: u64) i32 {
    return cuda.ops.getRows(type_id, table, n_cols, n_ids, ids, dst);
}

/// Quantizes f32 rows for a quantized matmul: mode 0 = Q8_0, 1 = Q8_K (q: int8, d: f32 per 32).
export fn infer_cuda_quantize(x: u64, n_rows: u64, n_cols: u64, mode: u32, q: u64, d: u64) i32 {
    return cuda.ops.quantize(x, n_rows, n_cols, mode, q, d);
}

/// y[t][o] = W[o] · x[t]; quantized W reads xq/xd (infer_cuda_quantize), float W reads x.
export fn infer_cuda_matmul(w: u64, type_id: u32, n_out: u64, n_in: u64, x: u64, xq: u64, xd: u64, n_tok: u64, y: u64) i32 {
    return cuda.ops.matmul(w, type_id, n_out, n_in, x, xq, xd, n_tok, y);
}

/// out = rms_norm(x) · weight per row (weight 0: none); out may alias x.
export fn infer_cuda_rms_norm(x: u64, weight: u64, n_rows: u64, n_cols: u64, eps: f32, out: u64) i32 {
    return cuda.ops.rmsNorm(x, weight, n_rows, n_cols, eps, out);
}

export fn infer_cuda_rms_norm_add(x: u64, weight: u64, n_rows: u64, n_cols: u64, eps: f32, residual: u64) i32 {
    return cuda.ops.rmsNormAdd(x, weight, n_rows, n_cols, eps, residual);
}

/// In-place RoPE as infer_rope_ext; positions (i32 per token) and freq factors (0: none) on the device.
export fn infer_cuda_rope(x: u64, n_tok: u64, n_heads: u64, head_dim: u64, n_rot: u64, positions: u64, freq_base: f32, freq_scale: f32, mode: u32, freq_factors: u64) i32 {
    return cuda.ops.rope(x, n_tok, n_heads, head_dim, n_rot, positions, freq_base, freq_scale, mode, freq_factors);
}

/// Rows of k and v into the f16 cache at cell positions[t] (mod cells when ring).
export fn infer_cuda_kv_store(k: u64, v: u64, kv_dim: u64, n_tok: u64, k_cache: u64, v_cache: u64, positions: u64, cells: u64, ring: bool) i32 {
    return cuda.ops.kvStore(k, v, kv_dim, n_tok, k_cache, v_cache, positions, cells, ring);
}

/// f32 values of scratch infer_cuda_attention needs.
export fn infer_cuda_attention_scratch(n_tok: u64, n_head: u64, head_dim: u64, cells: u64, n_split: u64) u64 {
    return cuda.ops.attentionScratch(n_tok, n_head, head_dim, cells, n_split);
}

/// Causal (optionally sliding-window) GQA over the f16 cache, split n_split ways over the keys.
export fn infer_cuda_attention(q: u64, k_cache: u64, v_cache: u64, out: u64, positions: u64, n_tok: u64, n_head: u64, n_kv_head: u64, head_dim: u64, window: u64, cells: u64, ring: bool, scale: f32, scratch: u64, scratch_floats: u64, n_split: u64, arrived: u64) i32 {
    return cuda.ops.attention(q, k_cache, v_cache, out, positions, n_tok, n_head, n_kv_head, head_dim, window, cells, ring, scale, scratch, scratch_floats, n_split, arrived);
}

/// infer_cuda_attention, then infer_cuda_quantize of its output (mode, q, d): in the decode
/// kernels' epilogue where they can, else as two launches; the same bytes either way.
export fn infer_cuda_attention_quant(q_in: u64, k_cache: u64, v_cache: u64, out: u64, positions: u64, n_tok: u64, n_head: u64, n_kv_head: u64, head_dim: u64, window: u64, cells: u64, ring: bool, scale: f32, scratch: u64, scratch_floats: u64, n_split: u64, arrived: u64, mode: u32, q: u64, d: u64) i32 {
    return cuda.ops.attentionQuant(q_in, k_cache, v_cache, out, positions, n_tok, n_head, n_kv_head, head_dim, window, cells, ring, scale, scratch, scratch_floats, n_split, arrived, mode, q, d);
}

/// Attention of rows of different sequences in one launch (the server's batched decode): row t
/// over the f16 caches at kv_table[2t] (keys) and kv_table[2t + 1] (values), a device table of
/// 2 * n_tok addresses.
export fn infer_cuda_attention_rows(q: u64, kv_table: u64, out: u64, positions: u64, n_tok: u64, n_head: u64, n_kv_head: u64, head_dim: u64, window: u64, cells: u64, ring: bool, scale: f32, scratch: u64, scratch_floats: u64, n_split: u64, arrived: u64) i32 {
    return cuda.ops.attentionRows(q, kv_table, out, positions, n_tok, n_head, n_kv_head, head_dim, window, cells, ring, scale, scratch, scratch_floats, n_split, arrived);
}

/// Prompts of at least min_tokens tokens (0: none) take quantized matmuls as cuBLAS f16 GEMMs
/// (lib/cuda/ops.zig gemmF16); "unsupported" when cuBLAS does not load.
export fn infer_cuda_set_cublas(min_tokens: u32) i32 {
    return cuda.ops.setCublas(min_tokens);
}

/// The prompt length from which matmuls run as cuBLAS GEMMs (0: never; cuBLAS may still be
/// missing, in which case MMQ runs).
export fn infer_cuda_cublas_min_tokens() u32 {
    return cuda.ops.cublasMinTokens();
}

/// The decode attention's kernels (0 auto, 1 warps, 2 groups, 3 mma: lib/cuda/attention.zig
/// DecodeAttention): the tests run each attention case under each.
export fn infer_cuda_set_decode_attention(mode: u32) i32 {
    return cuda.ops.setDecodeAttention(mode);
}

/// Whether infer_cuda_attention_rows takes these shapes.
export fn infer_cuda_attention_rows_fit(n_head: u64, n_kv_head: u64, head_dim: u64) bool {
    return cuda.ops.decodeAttentionFits(n_head, n_kv_head, head_dim);
}

/// Keys and values of rows of different sequences into their caches (the table as above).
export fn infer_cuda_kv_store_rows(k: u64, v: u64, kv_dim: u64, n_tok: u64, kv_table: u64, positions: u64, cells: u64, ring: bool) i32 {
    return cuda.ops.kvStoreRows(k, v, kv_dim, n_tok, kv_table, positions, cells, ring);
}

export fn infer_cuda_gelu_mul(gate: u64, up: u64, n: u64, out: u64) i32 {
    return cuda.ops.geluMul(gate, up, n, out);
}

export fn infer_cuda_silu_mul(gate: u64, up: u64, n: u64, out: u64) i32 {
    return cuda.ops.siluMul(gate, up, n, out);
}

export fn infer_cuda_add(a: u64, b: u64, n: u64, out: u64) i32 {
    return cuda.ops.add(a, b, n, out);
}

export fn infer_cuda_scale(x: u64, n: u64, s: f32) i32 {
    return cuda.ops.scale(x, n, s);
}

export fn infer_cuda_add_row_bias(x: u64, bias: u64, n_rows: u64, n_cols: u64) i32 {
    return cuda.ops.addRowBias(x, bias, n_rows, n_cols);
}

/// rms_norm then quantize of its output (the two calls fused; equal bit for bit).
export fn infer_cuda_rms_norm_quant(x: u64, weight: u64, n_rows: u64, n_cols: u64, eps: f32, out: u64, mode: u32, q: u64, d: u64) i32 {
    return cuda.ops.rmsNormQuant(x, weight, n_rows, n_cols, eps, out, mode, q, d);
}

/// sum = a + b, out = rms_norm(sum) · weight, quantized (add + rms_norm + quantize fused).
export fn infer_cuda_add_rms_norm_quant(a: u64, b: u64, sum: u64, weight: u64, n_rows: u64, n_cols: u64, eps: f32, out: u64, mode: u32, q: u64, d: u64) i32 {
    return cuda.ops.addRmsNormQuant(a, b, sum, weight, n_rows, n_cols, eps, out, mode, q, d);
}

/// In-place rms_norm of two tensors (query and key head norms) in one launch.
export fn infer_cuda_rms_norm2(xa: u64, wa: u64, rows_a: u64, xb: u64, wb: u64, rows_b: u64, n_cols: u64, eps: f32) i32 {
    return cuda.ops.rmsNorm2(xa, wa, rows_a, xb, wb, rows_b, n_cols, eps);
}

/// Two or three one-token matmuls over the same quantized input in one launch (n2 = 0: two).
export fn infer_cuda_matmul_multi(type_id: u32, n_in: u64, xq: u64, xd: u64, w0: u64, n0: u64, y0: u64, w1: u64, n1: u64, y1: u64, w2: u64, n2: u64, y2: u64) i32 {
    return cuda.ops.matmulMulti(type_id, n_in, xq, xd, w0, n0, y0, w1, n1, y1, w2, n2, y2);
}

/// gelu_mul (kind 0) or silu_mul (kind 1), then quantize of the product.
export fn infer_cuda_act_mul_quant(kind: u32, gate: u64, up: u64, n_rows: u64, n_cols: u64, out: u64, mode: u32, q: u64, d: u64) i32 {
    return cuda.ops.actMulQuant(kind, gate, up, n_rows, n_cols, out, mode, q, d);
}

/// RoPE of queries and keys in one launch.
export fn infer_cuda_rope2(xa: u64, heads_a: u64, xb: u64, heads_b: u64, n_tok: u64, head_dim: u64, n_rot: u64, positions: u64, freq_base: f32, freq_scale: f32, mode: u32, freq_factors: u64) i32 {
    return cuda.ops.rope2(xa, heads_a, xb, heads_b, n_tok, head_dim, n_rot, positions, freq_base, freq_scale, mode, freq_factors);
}

/// Queues device -> host into pinned memory (infer_cuda_host_alloc) and records event `slot`.
export fn infer_cuda_download_async(dst: u64, src: u64, bytes: u64, slot: u32) i32 {
    return cuda.downloadAsync(dst, src, bytes, slot);
}

/// Waits for the work queued before event `slot` was last recorded.
export fn infer_cuda_event_wait(slot: u32) i32 {
    return cuda.eventWait(slot);
}

/// One token: q/k head norms (wq = wk = 0: none), RoPE of both, k/v into the f16 cache.
export fn infer_cuda_norm_rope_store(q: u64, heads_q: u64, k: u64, heads_k: u64, v: u64, wq: u64, wk: u64, eps: f32, head_dim: u64, n_rot: u64, positions: u64, freq_base: f32, freq_scale: f32, mode: u32, freq_factors: u64, k_cache: u64, v_cache: u64, cells: u64, ring: bool) i32 {
    return cuda.ops.normRopeStore(q, heads_q, k, heads_k, v, wq, wk, eps, head_dim, n_rot, positions, freq_base, freq_scale, mode, freq_factors, k_cache, v_cache, cells, ring);
}

/// out[0] = argmax of n f32 values (greedy sampling on the device); scratch: 16 zeroed bytes.
export fn infer_cuda_argmax(x: u64, n: u64, scratch: u64, out: u64) i32 {
    return cuda.ops.argmax(x, n, scratch, out);
}

test {
    _ = cuda;
    _ = cuda.ops;
}
// (cuda helper section: end)

// ---- Metal backend (lib/metal/: Objective-C runtime loaded at run time, kernels from shaders/metal/)
// (metal helper section: begin)
// Only macOS builds compile the host code; elsewhere every call fails with `unsupported` and
// "Metal not available: ...". Buffer handles and CPU addresses cross the C ABI as u64.
const metal = if (@import("builtin").os.tag == .macos) @import("metal/metal.zig") else @import("metal/unavailable.zig");

/// Takes the default device and compiles `source`, one pipeline per newline-separated kernel name.
export fn infer_metal_init(source: [*]const u8, source_len: usize, names: [*]const u8, names_len: usize, out_count: *u32) i32 {
    return metal.init(source[0..source_len], names[0..names_len], out_count);
}

export fn infer_metal_device_name(out: [*]u8, len: usize) i32 {
    return metal.deviceName(out, len);
}

/// A shared buffer; out: its handle and the CPU address of its contents.
export fn infer_metal_buffer_new(bytes: u64, out_handle: *u64, out_contents: *u64) i32 {
    return metal.bufferNew(bytes, out_handle, out_contents);
}

/// A buffer over page-aligned native memory (the mmap'd model), without a copy.
export fn infer_metal_buffer_wrap(address: u64, bytes: u64, out_handle: *u64) i32 {
    return metal.bufferWrap(address, bytes, out_handle);
}

export fn infer_metal_buffer_free(handle: u64) void {
    metal.bufferFree(handle);
}

/// One dispatch into the step's command buffer: dims = grid (3) and threadgroup (3); bindings =
/// (handle, offset) per buffer index; args copied with setBytes at args_index.
export fn infer_metal_encode(pipeline: u32, dims: *const [6]u32, threadgroup_bytes: u32, bindings: [*]const u64, n_bindings: u32, args: [*]const u8, args_len: u32, args_index: u32) i32 {
    return metal.encode(pipeline, dims, threadgroup_bytes, bindings, n_bindings, args, args_len, args_index);
}

/// Commits the step's command buffer and waits for it.
export fn infer_metal_flush() i32 {
    return metal.flush();
}

test {
    _ = metal;
    _ = @import("metal/blocks_test.zig");
}
// (metal helper section: end)
