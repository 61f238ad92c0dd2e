//! The CUDA backend's mixture-of-experts ops (shaders/cuda/moe.cuh): the router's choice on the
//! device, the slots grouped by expert, matvecs indexed by expert id (ggml's mul_mat_id) and the
//! weighted sum. A token's k chosen experts are its k slots (slot s = token · k + rank); every op
//! reads the expert ids from device memory, so a decode step with experts is one CUDA graph.
const std = @import("std");
const cuda = @import("cuda.zig");
const Kernel = @import("kernels.zig").Kernel;
const abi = @import("../abi.zig");
const status = @import("../status.zig");
const launch = cuda.launch;
const invalid = cuda.invalid;
const ceilDiv = cuda.ceilDiv;
const int = cuda.int;
const tooLarge = cuda.tooLarge;

/// Experts a layer may have (the router's shared-memory row: 4 bytes each; the grouping's: 8).
pub const experts_max: u64 = 4096;

/// The expert kernels of a weight type: per slot; per tile of up to 8 slots (matvec); per tile of
/// up to 8 or 32 slots on the tensor cores (mmq[0], mmq[1]).
const MoeKernels = struct { mv: Kernel, mv8: Kernel, mmq: [2]Kernel };

fn moeKernels(type_id: u32) ?MoeKernels {
    return switch (type_id) {
        2 => .{ .mv = .moe_mv_q4_0, .mv8 = .moe_mv8_q4_0, .mmq = .{ .moe_mmq_q4_0_n8, .moe_mmq_q4_0_n32 } },
        6 => .{ .mv = .moe_mv_q5_0, .mv8 = .moe_mv8_q5_0, .mmq = .{ .moe_mmq_q5_0_n8, .moe_mmq_q5_0_n32 } },
        8 => .{ .mv = .moe_mv_q8_0, .mv8 = .moe_mv8_q8_0, .mmq = .{ .moe_mmq_q8_0_n8, .moe_mmq_q8_0_n32 } },
        39 => .{ .mv = .moe_mv_mxfp4, .mv8 = .moe_mv8_mxfp4, .mmq = .{ .moe_mmq_mxfp4_n8, .moe_mmq_mxfp4_n32 } },
        12 => .{ .mv = .moe_mv_q4_k, .mv8 = .moe_mv8_q4_k, .mmq = .{ .moe_mmq_q4_k_n8, .moe_mmq_q4_k_n32 } },
        13 => .{ .mv = .moe_mv_q5_k, .mv8 = .moe_mv8_q5_k, .mmq = .{ .moe_mmq_q5_k_n8, .moe_mmq_q5_k_n32 } },
        14 => .{ .mv = .moe_mv_q6_k, .mv8 = .moe_mv8_q6_k, .mmq = .{ .moe_mmq_q6_k_n8, .moe_mmq_q6_k_n32 } },
        cuda.packed_type | 2 => .{ .mv = .moe_mv_q4_0r, .mv8 = .moe_mv8_q4_0r, .mmq = .{ .moe_mmq_q4_0r_n8, .moe_mmq_q4_0r_n32 } },
        cuda.packed_type | 8 => .{ .mv = .moe_mv_q8_0r, .mv8 = .moe_mv8_q8_0r, .mmq = .{ .moe_mmq_q8_0r_n8, .moe_mmq_q8_0r_n32 } },
        cuda.packed_type | 12 => .{ .mv = .moe_mv_q4_kr, .mv8 = .moe_mv8_q4_kr, .mmq = .{ .moe_mmq_q4_kr_n8, .moe_mmq_q4_kr_n32 } },
        else => null,
    };
}

/// Whether experts of type `type_id` run on the GPU (the quantized types).
pub fn supports(type_id: u32) bool {
    return moeKernels(type_id) != null;
}

/// Per token t < n_tok: the k experts of its n_expert router logits into ids[t·k ..] and their
/// weights into weights[t·k ..] (gating 0: softmax, top k, `norm`: divided by their sum;
/// gating 1: top k, softmax over them).
pub fn route(logits: u64, n_tok: u64, n_expert: u64, k: u64, gating: u32, norm: bool, ids: u64, weights: u64) i32 {
    if (n_expert == 0 or n_expert > experts_max) return invalid("moe_route: {d} experts (1 to {d})", .{ n_expert, experts_max });
    if (k == 0 or k > n_expert) return invalid("moe_route: k = {d} of {d} experts", .{ k, n_expert });
    if (gating > 1) return invalid("moe_route: gating {d}", .{gating});
    if (n_tok > 65535 * 1024) return tooLarge("moe_route: n_tok", n_tok);
    const shared: u32 = @intCast(4 * n_expert);
    return cuda.launchShared(.moe_route, n_tok, 1, 32, shared, .{
        logits, @as(i32, @intCast(n_expert)), @as(i32, @intCast(k)), @as(i32, @intCast(gating)), @as(i32, @intFromBool(norm)), ids, weights,
    });
}

/// Slots a tile of moe_group's table may hold: 8 (moe_mv8_*, moe_mmq_*_n8) or 32 (moe_mmq_*_n32).
pub fn tileSlotsValid(tile: u64) bool {
    return tile == 8 or tile == 32;
}

/// Tiles of up to `tile` slots of one expert that n_slots slots of n_expert experts make at most.
pub fn maxTiles(n_slots: u64, n_expert: u64, tile: u64) u64 {
    return ceilDiv(n_slots, tile) + @min(n_slots, n_expert);
}

/// Tile entries a table holds room for (the most any tile size makes: tiles of 8); the sorted
/// slot list starts after them.
fn tableTiles(n_slots: u64, n_expert: u64) u64 {
    return maxTiles(n_slots, n_expert, 8);
}

/// Ints of moe_group's table for n_slots slots: the tile count, 3 per tile, the sorted slots.
pub fn groupTableInts(n_slots: u64, n_expert: u64) u64 {
    return 1 + 3 * tableTiles(n_slots, n_expert) + n_slots;
}

/// Sorts the n_slots slots at ids by expert into `table` (groupTableInts ints), cut into tiles of
/// up to `tile` slots of one expert, for moeMatmul with the same tile.
pub fn group(ids: u64, n_slots: u64, n_expert: u64, tile: u64, table: u64) i32 {
    if (n_expert == 0 or n_expert > experts_max) return invalid("moe_group: {d} experts (1 to {d})", .{ n_expert, experts_max });
    if (!tileSlotsValid(tile)) return invalid("moe_group: tiles of {d} slots (8 or 32)", .{tile});
    const slots = int(n_slots) orelse return tooLarge("moe_group: n_slots", n_slots);
    const tiles = tableTiles(n_slots, n_expert);
    if (tiles > 65535) return tooLarge("moe_group: tiles", tiles);
    const shared: u32 = @intCast(8 * n_expert);
    return cuda.launchShared(.moe_group, 1, 1, 1024, shared, .{ ids, slots, @as(i32, @intCast(n_expert)), @as(i32, @intCast(tile)), @as(i32, @intCast(tiles)), table });
}

/// Row blocks of moe_mv_*: matvec_rows' 2 rows a warp, `split` warps a row (ops.zig matvecSplit).
fn splitFor(n_in: u64) u32 {
    const units = n_in / 32;
    return if (units >= 384) 4 else if (units >= 192) 2 else 1;
}

/// y0[s] = W0[ids[s]] · x[s / x_div] (and y1 with W1, where w1 ≠ 0) for the n_slots slots; x in
/// the weight type's activation format at xq/xd. `groups` = 0: a grid row a slot (each slot
/// reads its expert's rows); else moe_group's table for these ids in tiles of `tile` slots: each
/// expert's rows read once a tile, on the tensor cores with `mma` (tiles of 8 or 32), else by
/// the tile matvec (tiles of 8).
pub fn matmul(a: abi.CudaMoeMatmulArgs) i32 {
    const kinds = moeKernels(a.type_id) orelse
        return status.fail(.unsupported, "the CUDA backend has no expert matvec for ggml type {d}", .{a.type_id});
    const w = cuda.weightKind(a.type_id).?;
    if (a.n_in == 0 or a.n_in % w.block_values != 0 or a.n_in % 32 != 0)
        return invalid("moe_matmul: n_in {d} is not a multiple of the {s} block", .{ a.n_in, w.name });
    if (a.n_expert == 0 or a.n_expert > experts_max) return invalid("moe_matmul: {d} experts", .{a.n_expert});
    if (a.x_div == 0 or a.n_slots % a.x_div != 0) return invalid("moe_matmul: {d} slots, {d} a row", .{ a.n_slots, a.x_div });
    if (a.w0 == 0 or a.y0 == 0 or a.ids == 0 or a.xq == 0 or a.xd == 0) return invalid("moe_matmul: a null address", .{});
    if ((a.w1 == 0) != (a.y1 == 0)) return invalid("moe_matmul: w1 and y1 both or neither", .{});
    const row_bytes = a.n_in / w.block_values * w.block_bytes;
    if (a.expert_bytes != row_bytes * a.n_out) return invalid("moe_matmul: {d} bytes an expert, {d} rows of {d}", .{ a.expert_bytes, a.n_out, row_bytes });
    const out = int(a.n_out) orelse return tooLarge("moe_matmul: n_out", a.n_out);
    const in = int(a.n_in) orelse return tooLarge("moe_matmul: n_in", a.n_in);
    const x_div = int(a.x_div) orelse return tooLarge("moe_matmul: x_div", a.x_div);
    const eb: i64 = @intCast(a.expert_bytes);
    const mats: u64 = if (a.w1 != 0) 2 else 1;
    if (a.groups == 0) {
        if (a.n_slots > 65535) return tooLarge("moe_matmul: n_slots", a.n_slots);
        const split = splitFor(a.n_in);
        return cuda.launchGrid(kinds.mv, ceilDiv(a.n_out, 8 / split), a.n_slots, mats, 128, 0, .{
            a.w0, a.w1, eb, @as(i32, @intCast(a.n_expert)), out, in, a.xq, a.xd, x_div, a.ids, a.y0, a.y1, @as(i32, @intCast(split)),
        });
    }
    if (!tileSlotsValid(a.tile) or (a.mma == 0 and a.tile != 8))
        return invalid("moe_matmul: tiles of {d} slots ({s})", .{ a.tile, if (a.mma != 0) "8 or 32" else "8 for the matvec" });
    const stored: i32 = @intCast(tableTiles(a.n_slots, a.n_expert));
    const tiles = maxTiles(a.n_slots, a.n_expert, a.tile);
    if (tiles > 65535) return tooLarge("moe_matmul: tiles", tiles);
    if (a.mma != 0) {
        return cuda.launchGrid(kinds.mmq[@intFromBool(a.tile == 32)], ceilDiv(a.n_out, 64), tiles, mats, 128, 0, .{
            a.w0, a.w1, eb, out, in, a.xq, a.xd, x_div, a.groups, stored, a.y0, a.y1,
        });
    }
    return cuda.launchGrid(kinds.mv8, ceilDiv(a.n_out, 4), tiles, mats, 128, 0, .{
        a.w0, a.w1, eb, out, in, a.xq, a.xd, x_div, a.groups, stored, a.y0, a.y1,
    });
}

/// out[t] = Σ_j weights[t·k + j] · (y[t·k + j] + bias[ids[t·k + j]]) for t < n_tok, rows of
/// n_cols values; bias = 0: no bias (else a row of n_cols f32 per expert).
pub fn sum(y: u64, weights: u64, k: u64, n_cols: u64, n_tok: u64, bias: u64, ids: u64, out: u64) i32 {
    if (bias != 0 and ids == 0) return invalid("moe_sum: a bias without expert ids", .{});
    const s = cuda.ready() orelse return @intFromEnum(status.Status.internal);
    const kk = int(k) orelse return tooLarge("moe_sum: k", k);
    const cols = int(n_cols) orelse return tooLarge("moe_sum: n_cols", n_cols);
    if (k == 0 or n_cols == 0) return invalid("moe_sum: k {d}, n_cols {d}", .{ k, n_cols });
    const n = std.math.mul(u64, n_tok, n_cols) catch return tooLarge("moe_sum: values", n_tok);
    const grid = @min(ceilDiv(n, 256), @as(u64, @intCast(s.sm_count)) * 8);
    return launch(.moe_sum, grid, 1, 256, .{ y, weights, kk, cols, @as(i64, @intCast(n)), bias, ids, out });
}

/// out = swiglu_oai(gate + bias_gate[ids[s]], up + bias_up[ids[s]]) over n_rows rows of n_cols
/// (row s's expert ids[s]); bias_gate = 0: no biases (then bias_up and ids are not read).
pub fn swigluOai(gate: u64, up: u64, bias_gate: u64, bias_up: u64, ids: u64, n_rows: u64, n_cols: u64, out: u64) i32 {
    if (bias_gate != 0 and (bias_up == 0 or ids == 0)) return invalid("moe_swiglu_oai: gate and up biases and ids together", .{});
    const cols = int(n_cols) orelse return tooLarge("moe_swiglu_oai: n_cols", n_cols);
    if (n_cols == 0) return invalid("moe_swiglu_oai: n_cols 0", .{});
    const n = std.math.mul(u64, n_rows, n_cols) catch return tooLarge("moe_swiglu_oai: values", n_rows);
    if (n == 0) return 0;
    if (ceilDiv(n, 256) > std.math.maxInt(i32)) return tooLarge("moe_swiglu_oai: values", n);
    return launch(.moe_swiglu_oai, ceilDiv(n, 256), 1, 256, .{ gate, up, bias_gate, bias_up, ids, cols, @as(i64, @intCast(n)), out });
}

test "group tables hold every tile and slot" {
    // 4 slots of 4 different experts: 4 tiles; 64 slots of one expert: 8 tiles of 8, 2 of 32;
    // 33 slots of 2 experts (32 + 1): 2 tiles of 32, 5 of 8.
    try std.testing.expect(maxTiles(4, 128, 8) >= 4 and maxTiles(4, 128, 32) >= 4);
    try std.testing.expect(maxTiles(64, 1, 8) >= 8 and maxTiles(64, 1, 32) >= 2);
    try std.testing.expect(maxTiles(33, 2, 32) >= 2 and maxTiles(33, 2, 8) >= 5);
    try std.testing.expect(tableTiles(4096, 128) >= maxTiles(4096, 128, 32));
    try std.testing.expectEqual(@as(u64, 1 + 3 * maxTiles(10, 3, 8) + 10), groupTableInts(10, 3));
    try std.testing.expect(tileSlotsValid(8) and tileSlotsValid(32) and !tileSlotsValid(16));
    try std.testing.expect(supports(2) and supports(cuda.packed_type | 12) and supports(39) and !supports(0));
}
