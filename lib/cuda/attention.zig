//! The CUDA backend's attention ops (lib/cuda/ops.zig re-exports them): which kernels of
//! shaders/cuda/attend_*.cuh run for a shape — flash attention and the tensor-core kernels for
//! prompts, attn_decode_w or attn_decode_g* for decode and small batches, the per-head kernels
//! elsewhere — their scratch, and the store of keys and values into the cache: f16, or ggml's
//! Q8_0 / Q4_0 blocks (shaders/cuda/kv_quant.cuh), whose attention attendQuant plans.
const std = @import("std");
const cuda = @import("cuda.zig");
const ops = @import("ops.zig");
const Kernel = @import("kernels.zig").Kernel;
const launch = cuda.launch;
const invalid = cuda.invalid;
const ceilDiv = cuda.ceilDiv;
const int = cuda.int;
const tooLarge = cuda.tooLarge;
const status = @import("../status.zig");
const abi = @import("../abi.zig");

/// Which kernels decode attention (rows under 16) takes (infer_cuda_set_decode_attention: the
/// tests run each attention case under each):
/// - auto: attn_decode_mma_d* where it fits (decodeMmaTakes) and the keys take two splits or more
///   (past 128), else attn_decode_w where it takes the shape (decodeWarpsTakes, group × splits <
///   128), else attn_decode_g*. One split is the context where attn_decode_w's short chain wins:
///   at 19 keys the 8B's attention 3.3 µs a launch against mma's 5.5; from 128 keys on mma is
///   ahead (5.6 against 6.2, 9.5 against 11.5 at 1,001 keys, 11.0 against g4's 17.8 at 4,096;
///   bench/cuda-probe.cu on an H200), and a graph's kernels are
///   chosen by its split count, not by the keys, which the device reads from the positions;
/// - warps: attn_decode_w and attn_decode_g* as auto picks them without attn_decode_mma_d* (the
///   plan before it);
/// - groups: attn_decode_g* wherever it fits;
/// - mma: attn_decode_mma_d* wherever it fits, else as auto.
pub const DecodeAttention = enum(u32) { auto = 0, warps = 1, groups = 2, mma = 3 };
var decode_attn: DecodeAttention = .auto;

/// Sets the decode attention's kernels (DecodeAttention's values); "unsupported" for mma where
/// the device did not take its shared memory.
pub fn setDecodeAttention(mode: u32) i32 {
    const m = std.meta.intToEnum(DecodeAttention, mode) catch return invalid("decode attention mode {d}", .{mode});
    const s = cuda.ready() orelse return @intFromEnum(status.Status.internal);
    if (m == .mma and !s.decode_mma_ok)
        return status.fail(.unsupported, "decode attention on the tensor cores is not available on this device", .{});
    decode_attn = m;
    return 0;
}

/// A cache's type: ggml's ids, as shaders/cuda/kv_quant.cuh names them, and infer's rotated
/// codes TQ3/TQ4 (shaders/cuda/kv_turbo.cuh; lib/cpu/kv_turbo.zig's bytes).
pub const kv_f16: u32 = 1;
pub const kv_q4_0: u32 = 2;
pub const kv_q8_0: u32 = 8;
pub const kv_tq3: u32 = 103;
pub const kv_tq4: u32 = 104;

pub fn isTurbo(t: u32) bool {
    return t == kv_tq3 or t == kv_tq4;
}

/// The head dims the rotated codes take on CUDA: a power of two (the Hadamard transform), at most
/// the attention kernels' head_dim_max.
pub fn turboDimFits(head_dim: u64) bool {
    return head_dim >= 8 and head_dim <= head_dim_max and std.math.isPowerOfTwo(head_dim);
}

/// null where k_type and v_type are cache types CUDA keeps and `values` (a head, or a row of
/// heads) is whole 32-value blocks for the Q8_0/Q4_0 ones (TQ3/TQ4: turboDimFits, checked where
/// the head_dim is known); else the failed status.
pub fn checkKvTypes(what: []const u8, k_type: u32, v_type: u32, values: u64) ?i32 {
    for ([_]u32{ k_type, v_type }) |t| {
        if (isTurbo(t)) continue;
        if (t != kv_f16 and t != kv_q4_0 and t != kv_q8_0)
            return invalid("{s}: cache type {d} is not f16 (1), q4_0 (2), q8_0 (8), tq3 (103) or tq4 (104)", .{ what, t });
        if (t != kv_f16 and values % 32 != 0)
            return invalid("{s}: a q8_0/q4_0 cache needs head_dim a multiple of 32, not {d}", .{ what, values });
    }
    return null;
}

/// null where neither type is TQ3/TQ4 (the kernels that store or read a cache by 32-value
/// blocks: the fused norm + RoPE + store, the table of caches); else the failed status.
pub fn refuseTurbo(what: []const u8, k_type: u32, v_type: u32) ?i32 {
    if (isTurbo(k_type) or isTurbo(v_type))
        return status.fail(.unsupported, "{s}: tq3/tq4 caches are stored and read one sequence at a time", .{what});
    return null;
}

/// abi.CudaKvStoreTurboArgs: rows coded into a tq3/tq4 cache, a block a head vector.
pub fn kvStoreTurbo(a: abi.CudaKvStoreTurboArgs) i32 {
    if (!isTurbo(a.cache_type)) return invalid("kv_store_turbo: type {d} is not tq3 (103) or tq4 (104)", .{a.cache_type});
    if (!turboDimFits(a.head_dim))
        return status.fail(.unsupported, "kv_store_turbo: tq3/tq4 on CUDA need head_dim a power of two in 8..{d}, not {d}", .{ head_dim_max, a.head_dim });
    const kvh = int(a.kv_heads) orelse return tooLarge("kv_store_turbo: kv_heads", a.kv_heads);
    const c = int(a.cells) orelse return tooLarge("kv_store_turbo: cells", a.cells);
    const first = int(a.first_cell) orelse return tooLarge("kv_store_turbo: first_cell", a.first_cell);
    if (a.kv_heads == 0 or a.n_tok == 0) return 0;
    return launch(.kv_store_turbo, a.n_tok * a.kv_heads, 1, 128, .{
        a.x, kvh, @as(i32, @intCast(a.head_dim)), a.cache, @as(i32, @intCast(a.cache_type)), a.positions, first, c, @as(i32, @intFromBool(a.ring)), a.anchor,
    });
}

/// Rows t < n_tok of k and v (kv_dim values each) into cell positions[t] (mod cells when ring).
pub fn kvStore(a: abi.CudaKvStoreArgs) i32 {
    const dim = int(a.kv_dim) orelse return tooLarge("kv_store: kv_dim", a.kv_dim);
    const c = int(a.cells) orelse return tooLarge("kv_store: cells", a.cells);
    if (checkKvTypes("kv_store", a.k_type, a.v_type, a.kv_dim)) |rc| return rc;
    return launch(.kv_store, ceilDiv(a.kv_dim, 256), a.n_tok, 256, .{
        a.k, a.v, dim, a.k_cache, a.v_cache, a.positions, c, @as(i32, @intFromBool(a.ring)),
        @as(i32, @intCast(a.k_type)), @as(i32, @intCast(a.v_type)),
    });
}

pub const head_dim_max = 512;
pub const split_max = 64;

/// f32 values of attention scratch, enough for either way: scores, split maxima and (n_split >
/// 1) partial outputs (attn_scores/attn_values), or each split's maximum and sum of exponentials
/// and partial outputs (attn_decode_*).
pub fn attentionScratch(n_tok: u64, n_head: u64, head_dim: u64, cells: u64, n_split: u64) u64 {
    const rows = n_tok * n_head;
    return rows * cells + 2 * rows * n_split + (if (n_split > 1) rows * n_split * head_dim else 0);
}

/// Attention of n_tok queries (at positions[t]) over f16 caches of `cells` rows (lib/abi.zig
/// CudaAttentionArgs): see the attn_* kernels. With kv_table, rows of different sequences, row t
/// over the caches at kv_table[2t] and kv_table[2t + 1] (the server's batched decode): one launch
/// of attn_decode_*. With quant_mode >= 0, then quantize(out, n_tok, n_head * head_dim,
/// quant_mode, quant_q, quant_d) of the output (the o-projection's input): in the attention
/// kernel's own epilogue where it computes a whole group of heads that is whole quantization
/// blocks (attn_decode_*, see quantize_group), else as the two launches. The buffers end the same
/// either way, bit for bit.
pub fn attention(a: abi.CudaAttentionArgs) i32 {
    if (a.kv_table != 0) {
        if (!decodeAttentionFits(a.n_head, a.n_kv_head, a.head_dim))
            return invalid("attention_rows: {d} heads over {d} KV heads of {d} dims take one sequence at a time", .{ a.n_head, a.n_kv_head, a.head_dim });
        if (a.k_cache != 0 or a.v_cache != 0) return invalid("attention: a table of caches or one cache, not both", .{});
    } else if (a.k_cache == 0 or a.v_cache == 0) return invalid("attention: no cache", .{});
    var oq: OutQuant = .{};
    if (a.quant_mode >= 0) {
        const block: u64 = if (a.quant_mode == 0) 32 else if (a.quant_mode == 1) 256 else return invalid("attention_quant: mode {d}", .{a.quant_mode});
        if ((a.n_head * a.head_dim) % block != 0) return invalid("attention_quant: rows of {d} values are not whole blocks of {d}", .{ a.n_head * a.head_dim, block });
        oq = .{ .mode = a.quant_mode, .q = a.quant_q, .d = a.quant_d };
    } else if (a.quant_mode != -1) return invalid("attention_quant: mode {d}", .{a.quant_mode});
    return attend(a, oq);
}

/// Where attend quantizes its output (mode -1: it does not).
const OutQuant = struct { mode: i32 = -1, q: u64 = 0, d: u64 = 0 };

/// Whether attention of these shapes runs as attn_decode_* (rows under 16), the kernels that
/// also take a table of caches (attention with kv_table).
pub fn decodeAttentionFits(n_head: u64, n_kv_head: u64, head_dim: u64) bool {
    return n_kv_head > 0 and n_head % n_kv_head == 0 and n_head / n_kv_head <= 8 and head_dim % 8 == 0 and head_dim > 0 and head_dim <= 256;
}


/// attn_decode_w reads each key and value row once per query head (G times a KV head, from L2
/// after the first); attn_decode_g* once per KV head. At G × splits of 128 keys from this many
/// (8B shape, G = 4, 32 splits: 4,096 keys), the reads cost more than the shorter chain saves:
/// 21.3 against 19.5 µs a launch there, 11.1 against 19.9 at 1,001 keys (bench/cuda-probe.cu on
/// an H200).
const warps_group_splits_max = 128;

/// Whether decode attention (rows under 16) of this head_dim runs as attn_decode_w: a power of
/// two from 32 to 256, so that a key's dimensions split over 1 to 8 lanes of 32 each and a value
/// row over 4 to 32 lanes of 8 (and not the `groups` choice).
pub fn decodeWarpsTakes(head_dim: u64) bool {
    return decode_attn != .groups and head_dim >= 32 and head_dim <= 256 and std.math.isPowerOfTwo(head_dim);
}

/// Whether decode attention of this shape can run as attn_decode_mma_d*: head_dim 64 or 128, a
/// group of at most 8 query heads (the rows 0..7 of its A operand), the device's opt-in to its
/// shared memory (cuda.zig decode_mma_ok), and not the `warps` or `groups` choice.
pub fn decodeMmaTakes(n_head: u64, n_kv_head: u64, head_dim: u64) bool {
    const s = cuda.ready() orelse return false;
    return s.decode_mma_ok and (decode_attn == .auto or decode_attn == .mma) and
        decodeAttentionFits(n_head, n_kv_head, head_dim) and (head_dim == 64 or head_dim == 128);
}

/// Whether quantized caches' decode attention of this shape runs as attn_decode_mma_q_d*: head_dim
/// 64 or 128, a group of at most 8 query heads, the device's opt-in to its shared memory.
pub fn decodeMmaQTakes(n_head: u64, n_kv_head: u64, head_dim: u64) bool {
    const s = cuda.ready() orelse return false;
    return s.decode_mma_q_ok and decodeAttentionFits(n_head, n_kv_head, head_dim) and (head_dim == 64 or head_dim == 128);
}

/// Whether attention with a table of caches (the server's batched decode) takes this shape and
/// these cache types: quantized caches only by attn_decode_mma_q_d*; with attention sinks, only
/// the tensor-core kernels (the other one-pass kernels have none).
pub fn attentionRowsFit(n_head: u64, n_kv_head: u64, head_dim: u64, k_type: u32, v_type: u32, sinks: bool) bool {
    if (checkKvTypes("attention_rows", k_type, v_type, head_dim) != null) return false;
    if (isTurbo(k_type) or isTurbo(v_type)) return false; // one sequence at a time (attendTurbo)
    if (sinks and k_type == kv_f16 and v_type == kv_f16) return decodeMmaTakes(n_head, n_kv_head, head_dim);
    if (k_type == kv_f16 and v_type == kv_f16) return decodeAttentionFits(n_head, n_kv_head, head_dim);
    return decodeMmaQTakes(n_head, n_kv_head, head_dim);
}

/// kvStore for rows of different sequences, row t into the caches of kv_table (see attention).
pub fn kvStoreRows(k: u64, v: u64, kv_dim: u64, n_tok: u64, kv_table: u64, positions: u64, cells: u64, ring: bool, k_type: u32, v_type: u32) i32 {
    if (kv_table == 0) return invalid("kv_store_rows: no table of caches", .{});
    const dim = int(kv_dim) orelse return tooLarge("kv_store_rows: kv_dim", kv_dim);
    const c = int(cells) orelse return tooLarge("kv_store_rows: cells", cells);
    if (checkKvTypes("kv_store_rows", k_type, v_type, kv_dim)) |rc| return rc;
    if (refuseTurbo("kv_store_rows", k_type, v_type)) |rc| return rc;
    return launch(.kv_store_rows, ceilDiv(kv_dim, 256), n_tok, 256, .{
        k, v, dim, kv_table, positions, c, @as(i32, @intFromBool(ring)), @as(i32, @intCast(k_type)), @as(i32, @intCast(v_type)),
    });
}

fn attend(a: abi.CudaAttentionArgs, oq: OutQuant) i32 {
    var quantized = false;
    const rc = attendInto(a, oq, &quantized);
    if (rc != 0 or oq.mode < 0 or quantized) return rc;
    return ops.quantize(a.out, a.n_tok, a.n_head * a.head_dim, @intCast(oq.mode), oq.q, oq.d);
}

fn attendInto(a: abi.CudaAttentionArgs, oq: OutQuant, quantized: *bool) i32 {
    const q = a.q;
    const k_cache = a.k_cache;
    const v_cache = a.v_cache;
    const kv_table = a.kv_table;
    const out = a.out;
    const positions = a.positions;
    const n_tok = a.n_tok;
    const n_head = a.n_head;
    const n_kv_head = a.n_kv_head;
    const head_dim = a.head_dim;
    const window = a.window;
    const cells = a.cells;
    const ring = a.ring;
    const scratch = a.scratch;
    const scratch_floats = a.scratch_floats;
    const n_split = a.n_split;
    const arrived = a.arrived;
    const scale_ = a.scale;
    if (n_kv_head == 0 or n_head == 0 or n_head % n_kv_head != 0)
        return invalid("attention: n_head {d} is not a multiple of n_kv_head {d}", .{ n_head, n_kv_head });
    if (head_dim == 0 or head_dim > head_dim_max)
        return invalid("attention: head_dim {d} not in 1..{d} on CUDA", .{ head_dim, head_dim_max });
    if (n_split == 0 or n_split > split_max) return invalid("attention: n_split {d} not in 1..{d}", .{ n_split, split_max });
    if (n_split > 1 and arrived == 0) return invalid("attention: {d} splits need counters", .{n_split});
    if (ring and window == 0) return invalid("attention: a ring needs a window", .{});
    const need = attentionScratch(n_tok, n_head, head_dim, cells, n_split);
    if (need > scratch_floats) return invalid("attention: scratch of {d} values, {d} needed", .{ scratch_floats, need });
    const heads = int(n_head) orelse return tooLarge("attention: n_head", n_head);
    const kv_heads = int(n_kv_head) orelse return tooLarge("attention: n_kv_head", n_kv_head);
    const dim: i32 = @intCast(head_dim);
    const win = int(window) orelse return tooLarge("attention: window", window);
    const c = int(cells) orelse return tooLarge("attention: cells", cells);
    const splits: i32 = @intCast(n_split);
    const ring_i: i32 = @intFromBool(ring);
    if (checkKvTypes("attention", a.k_type, a.v_type, head_dim)) |rc| return rc;
    if (isTurbo(a.k_type) or isTurbo(a.v_type)) return attendTurbo(a);
    if (a.k_type != kv_f16 or a.v_type != kv_f16) return attendQuant(a, oq, quantized);
    const rows = n_tok * n_head;
    const scores = scratch;
    const maxima = scratch + rows * cells * 4;
    if (kv_table == 0 and n_tok >= 16 and n_split == 1 and (head_dim == 64 or head_dim == 128) and n_head % n_kv_head == 0) {
        // Prompts: flash attention, 64 queries of one head a block (attn_prompt_*; no scratch).
        return launch(if (head_dim == 64) .attn_prompt_d64 else .attn_prompt_d128, ceilDiv(n_tok, 64), n_head, 128, .{
            q, k_cache, v_cache, positions, @as(i32, @intCast(n_tok)), heads, kv_heads, win, c, ring_i, scale_, out, a.sinks,
        });
    }
    if (kv_table == 0 and n_tok >= 16 and n_split == 1 and head_dim <= 256 and head_dim % 16 == 0 and a.sinks == 0) {
        // Prompts: 16 queries of one head per block, the products on the tensor cores (attn_*_mma).
        const tok: i32 = @intCast(n_tok);
        const q_tiles = ceilDiv(n_tok, 16);
        const rc = launch(.attn_scores_mma, q_tiles, n_head, 128, .{
            q, k_cache, positions, tok, heads, kv_heads, dim, win, c, ring_i, scale_, scores, c, maxima,
        });
        if (rc != 0) return rc;
        return launch(.attn_values_mma, q_tiles, n_head, 128, .{
            scores, c, maxima, v_cache, positions, tok, heads, kv_heads, dim, win, c, ring_i, out,
        });
    }
    const group = n_head / n_kv_head;
    // Sinks: the tensor-core kernel wherever it fits (the other one-pass kernels have none).
    const mma = decodeMmaTakes(n_head, n_kv_head, head_dim) and (n_split >= 2 or decode_attn == .mma or a.sinks != 0);
    if (a.sinks != 0 and !mma) {
        if (kv_table != 0) return invalid("attention_rows: sinks with head_dim {d} take one sequence at a time", .{head_dim});
        return attendHeads(a, @intCast(kv_f16), @intCast(kv_f16));
    }
    if (!mma and decodeWarpsTakes(head_dim) and q % 16 == 0 and group * n_split < warps_group_splits_max) {
        // Decode and small batches: a block per (row, query head, split), each warp a softmax of
        // its own (shaders/cuda/attend_warps.cuh). A block's outputs are whole Q8_0 units, quantized
        // in the kernel; a Q8_K superblock spans blocks, so Q8_K is a launch of its own (attend's).
        quantized.* = oq.mode == 0;
        return launch(.attn_decode_w, n_tok * n_head, n_split, 128, .{
            q, k_cache, v_cache, kv_table, positions, heads, kv_heads, dim, win, c, ring_i, scale_, splits, out,
            scratch, scratch + rows * n_split * 2 * 4, arrived,
            @as(i32, if (oq.mode == 0) 0 else -1), if (oq.mode == 0) oq.q else 0, if (oq.mode == 0) oq.d else 0,
        });
    }
    if (decodeAttentionFits(n_head, n_kv_head, head_dim)) {
        // Decode and small batches: a block per (row, KV head, split), all the group's query heads;
        // on the tensor cores (attend_decode_mma.cuh) where it fits, else attn_decode_g*.
        const kernel: Kernel = if (mma)
            (if (head_dim == 64) .attn_decode_mma_d64 else .attn_decode_mma_d128)
        else if (group == 1) .attn_decode_g1 else if (group == 2) .attn_decode_g2 else if (group <= 4) .attn_decode_g4 else .attn_decode_g8;
        const shared: u32 = if (!mma) 0 else @intCast(if (head_dim == 64) cuda.decode_mma_shared_d64 else cuda.decode_mma_shared_d128);
        const part_ml = scratch;
        const part = scratch + rows * n_split * 2 * 4;
        // The quantization in the epilogue where each block's outputs (the group's heads, at a
        // multiple of their count in the row) are whole blocks of oq's format.
        const fused = oq.mode >= 0 and (group * head_dim) % (if (oq.mode == 0) @as(u64, 32) else 256) == 0;
        const qmode: i32 = if (fused) oq.mode else -1;
        quantized.* = fused;
        if (mma) return cuda.launchShared(kernel, n_tok * n_kv_head, n_split, 128, shared, .{
            q, k_cache, v_cache, kv_table, positions, heads, kv_heads, dim, win, c, ring_i, scale_, splits, out, part_ml, part, arrived,
            qmode, if (fused) oq.q else 0, if (fused) oq.d else 0, a.sinks,
        });
        return cuda.launchShared(kernel, n_tok * n_kv_head, n_split, 128, shared, .{
            q, k_cache, v_cache, kv_table, positions, heads, kv_heads, dim, win, c, ring_i, scale_, splits, out, part_ml, part, arrived,
            qmode, if (fused) oq.q else 0, if (fused) oq.d else 0,
        });
    }
    return attendHeads(a, @intCast(kv_f16), @intCast(kv_f16));
}

/// attn_scores + attn_values: a block per query row and split (the shapes no one-pass kernel takes).
fn attendHeads(a: abi.CudaAttentionArgs, kt: i32, vt: i32) i32 {
    const rows = a.n_tok * a.n_head;
    const maxima = a.scratch + rows * a.cells * 4;
    const partial = maxima + rows * a.n_split * 4;
    const heads: i32 = @intCast(a.n_head);
    const kv_heads: i32 = @intCast(a.n_kv_head);
    const dim: i32 = @intCast(a.head_dim);
    const win: i32 = @intCast(a.window);
    const c: i32 = @intCast(a.cells);
    const splits: i32 = @intCast(a.n_split);
    const ring_i: i32 = @intFromBool(a.ring);
    const rc = launch(.attn_scores, rows, a.n_split, 128, .{
        a.q, a.k_cache, a.positions, heads, kv_heads, dim, win, c, ring_i, a.scale, a.scratch, c, maxima, splits, kt,
    });
    if (rc != 0) return rc;
    return launch(.attn_values, rows, a.n_split, 128, .{
        a.scratch, c, maxima, a.v_cache, a.positions, heads, kv_heads, dim, win, c, ring_i, splits, a.out, partial,
        a.arrived, vt, a.sinks,
    });
}

/// Attention over caches of which one or both are Q8_0 or Q4_0 (attendInto checked the shapes):
/// prompts of head_dim 64 and 128 by attn_prompt_q_d* (flash attention, each tile's blocks
/// dequantized into its f16 tile), decode and small batches (and a table of caches) by
/// attn_decode_mma_q_d* where it fits, every other shape by attn_scores + attn_values reading
/// value by value. No kernel dequantizes more of the cache than a tile.
fn attendQuant(a: abi.CudaAttentionArgs, oq: OutQuant, quantized: *bool) i32 {
    const kt: i32 = @intCast(a.k_type);
    const vt: i32 = @intCast(a.v_type);
    const heads: i32 = @intCast(a.n_head);
    const kv_heads: i32 = @intCast(a.n_kv_head);
    const dim: i32 = @intCast(a.head_dim);
    const win: i32 = @intCast(a.window);
    const c: i32 = @intCast(a.cells);
    const ring_i: i32 = @intFromBool(a.ring);
    const d64 = a.head_dim == 64;
    if (a.kv_table == 0 and a.n_tok >= 16 and a.n_split == 1 and (d64 or a.head_dim == 128)) {
        return launch(if (d64) .attn_prompt_q_d64 else .attn_prompt_q_d128, ceilDiv(a.n_tok, 64), a.n_head, 128, .{
            a.q, a.k_cache, a.v_cache, a.positions, @as(i32, @intCast(a.n_tok)), heads, kv_heads, win, c, ring_i, a.scale, a.out, kt, vt, a.sinks,
        });
    }
    if (decodeMmaQTakes(a.n_head, a.n_kv_head, a.head_dim)) {
        const group = a.n_head / a.n_kv_head;
        const rows = a.n_tok * a.n_head;
        const fused = oq.mode >= 0 and (group * a.head_dim) % (if (oq.mode == 0) @as(u64, 32) else 256) == 0;
        quantized.* = fused;
        const shared: u32 = @intCast(if (d64) cuda.decode_mma_q_shared_d64 else cuda.decode_mma_q_shared_d128);
        return cuda.launchShared(if (d64) .attn_decode_mma_q_d64 else .attn_decode_mma_q_d128, a.n_tok * a.n_kv_head, a.n_split, 128, shared, .{
            a.q, a.k_cache, a.v_cache, a.kv_table, a.positions, heads, kv_heads, dim, win, c, ring_i, a.scale,
            @as(i32, @intCast(a.n_split)), a.out, a.scratch, a.scratch + rows * a.n_split * 2 * 4, a.arrived,
            @as(i32, if (fused) oq.mode else -1), if (fused) oq.q else 0, if (fused) oq.d else 0, kt, vt, a.sinks,
        });
    }
    if (a.kv_table != 0)
        return invalid("attention_rows: q8_0/q4_0 caches of head_dim {d} take one sequence at a time", .{a.head_dim});
    return attendHeads(a, kt, vt);
}

/// Attention over caches of which one or both are TQ3/TQ4, in the codes' rotated domain: a TQ K
/// cache's scores are the rotated query (tq_rotate, written into `out`, which attn_scores has
/// read before attn_values writes it) against each key's levels, <Tq, T(k - anchor)> (the anchor
/// moves every score of a query alike: no softmax sees it); a TQ V cache's weighted sum of levels
/// is rotated back once per head. attn_scores + attn_values read value by value (kv_at), so no
/// kernel expands the cache; a table of caches is refused (attentionRowsFit says so first).
fn attendTurbo(a: abi.CudaAttentionArgs) i32 {
    if (a.kv_table != 0) return refuseTurbo("attention_rows", a.k_type, a.v_type).?;
    if (!turboDimFits(a.head_dim))
        return status.fail(.unsupported, "attention: tq3/tq4 on CUDA need head_dim a power of two in 8..{d}, not {d}", .{ head_dim_max, a.head_dim });
    const vectors = a.n_tok * a.n_head;
    const dim: i32 = @intCast(a.head_dim);
    var b = a;
    if (isTurbo(a.k_type)) {
        const rc = turboRotate(a.q, a.out, vectors, dim, false);
        if (rc != 0) return rc;
        b.q = a.out;
    }
    const rc = attendHeads(b, @intCast(a.k_type), @intCast(a.v_type));
    if (rc != 0 or !isTurbo(a.v_type)) return rc;
    return turboRotate(a.out, a.out, vectors, dim, true);
}

/// tq_rotate: `vectors` head vectors of src into dst (inverse: back), a block a vector.
fn turboRotate(src: u64, dst: u64, vectors: u64, dim: i32, inverse: bool) i32 {
    return launch(.tq_rotate, vectors, 1, 128, .{ src, dst, dim, @as(i32, @intFromBool(inverse)) });
}
