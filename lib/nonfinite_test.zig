//! Method: every CPU op of the C ABI on NaN and infinite input (activations, weights and their
//! block scales, KV caches), in the test build's safety-checked mode, where undefined behaviour
//! (a NaN converted to an integer, an index out of range) panics. Each op must return ok, and
//! NaN must reach the outputs that read it: a model file with NaN weights ends in NaN logits,
//! which generation refuses, never in finite garbage.
const std = @import("std");
const select = @import("cpu/select.zig");
const TestRng = @import("quant/simd.zig").TestRng;
const shapes = @import("abi.zig");

const nan = std.math.nan(f32);
const inf = std.math.inf(f32);
const alloc = std.testing.allocator;
const expect = std.testing.expect;

/// The call returned ok.
fn ok(status: i32) !void {
    try std.testing.expectEqual(@as(i32, 0), status);
}

/// The C ABI as a caller links it (the test binary exports these from lib/exports/).
const abi = struct {
    extern fn infer_above(x: [*]const f32, n: u64, floor: f32, ids: [*]i32, out_count: *u32) i32;
    extern fn infer_add(a: [*]const f32, b: [*]const f32, n: u64, out: [*]f32) i32;
    extern fn infer_argmax(x: [*]const f32, n: u64, out: *u32) i32;
    extern fn infer_attention(
        q: [*]const f32,
        k: [*]const u8,
        v: [*]const u8,
        out: [*]f32,
        shape: *const shapes.AttentionShape,
    ) i32;
    extern fn infer_draw(x: [*]const f32, n: u64, max: f32, scale: f32, target: f64, out: *u32) i32;
    extern fn infer_exp_sum(
        x: [*]const f32,
        n: u64,
        max: f32,
        scale: f32,
        floor: f32,
        out: *f64,
    ) i32;
    extern fn infer_first_nonfinite(x: [*]const f32, n: u64, out: *u64) i32;
    extern fn infer_gelu_mul(gate: [*]const f32, up: [*]const f32, n: u64, out: [*]f32) i32;
    extern fn infer_get_rows(
        type_id: u32,
        table: ?[*]const u8,
        n_cols: u64,
        n_table_rows: u64,
        ids: ?[*]const i32,
        n_ids: u64,
        dst: ?[*]f32,
    ) i32;
    extern fn infer_kv_store(src: [*]const f32, dst: [*]u8, dst_type: u32, n: u64, head_dim: u64, anchor: ?[*]const f32, anchor_len: u64) i32;
    extern fn infer_matmul(
        w: ?[*]const u8,
        w_type: u32,
        n_out: u64,
        n_in: u64,
        x: ?[*]const f32,
        n_tok: u64,
        y: ?[*]f32,
    ) i32;
    extern fn infer_quant_block_info(
        type_id: u32,
        out_block_values: ?*u32,
        out_block_bytes: ?*u32,
    ) i32;
    extern fn infer_quantize_row(type_id: u32, src: ?[*]const f32, n: u64, dst: ?[*]u8) i32;
    extern fn infer_repack(type_id: u32, src: ?[*]const u8, n_out: u64, n_in: u64, dst: ?[*]u8) i32;
    extern fn infer_repacked_type(type_id: u32, n_out: u64) u32;
    extern fn infer_rms_norm(
        x: [*]const f32,
        weight: ?[*]const f32,
        n_rows: u64,
        n_cols: u64,
        eps: f32,
        out: [*]f32,
    ) i32;
    extern fn infer_rms_norm_add(
        x: [*]const f32,
        weight: [*]const f32,
        n_rows: u64,
        n_cols: u64,
        eps: f32,
        residual: [*]f32,
    ) i32;
    extern fn infer_rope(
        x: [*]f32,
        positions: [*]const i32,
        freq_factors: ?[*]const f32,
        shape: *const shapes.RopeShape,
    ) i32;
    extern fn infer_scale(x: [*]f32, n: u64, s: f32) i32;
    extern fn infer_silu_mul(gate: [*]const f32, up: [*]const f32, n: u64, out: [*]f32) i32;
    extern fn infer_softmax(x: [*]f32, n_rows: u64, n_cols: u64) i32;
    extern fn infer_top_k(
        x: [*]const f32,
        n: u64,
        k: u64,
        ids: [*]i32,
        values: [*]f32,
        out_count: *u32,
    ) i32;
};

/// The weight types matmul and get_rows read from files (ggml ids).
const weight_types = [_]u32{ 0, 1, 30, 2, 6, 8, 12, 13, 14 };

fn blockInfo(type_id: u32) struct { values: usize, bytes: usize } {
    var values: u32 = 0;
    var bytes: u32 = 0;
    std.debug.assert(abi.infer_quant_block_info(type_id, &values, &bytes) == 0);
    return .{ .values = values, .bytes = bytes };
}

fn allNonFinite(y: []const f32) bool {
    for (y) |v| if (std.math.isFinite(v)) return false;
    return true;
}

fn allFinite(y: []const f32) bool {
    return select.firstNonFinite(y) == y.len;
}

/// Weights of `type_id` quantized from moderate random values; the caller may spoil them.
fn finiteWeights(type_id: u32, rng: *TestRng, n_out: usize, n_in: usize) ![]u8 {
    const info = blockInfo(type_id);
    const w = try alloc.alloc(u8, n_out * n_in / info.values * info.bytes);
    const wf = try alloc.alloc(f32, n_out * n_in);
    defer alloc.free(wf);
    rng.floats(wf, 0.5);
    try ok(abi.infer_quantize_row(type_id, wf.ptr, wf.len, w.ptr));
    return w;
}

/// y = W·x through the layout matmul reads (the repacked one where the type has it).
fn matmul(type_id: u32, w: []const u8, n_out: usize, n_in: usize, x: []const f32, y: []f32) !void {
    const n_tok = x.len / n_in;
    const packed_type = abi.infer_repacked_type(type_id, n_out);
    if (packed_type == 0) {
        try ok(abi.infer_matmul(w.ptr, type_id, n_out, n_in, x.ptr, n_tok, y.ptr));
        return;
    }
    const p = try alloc.alloc(u8, w.len);
    defer alloc.free(p);
    try ok(abi.infer_repack(type_id, w.ptr, n_out, n_in, p.ptr));
    try ok(abi.infer_matmul(p.ptr, packed_type, n_out, n_in, x.ptr, n_tok, y.ptr));
}

test "matmul: a NaN or infinite activation makes its row's every output non-finite" {
    var rng = TestRng.init(71);
    const n_out = 16;
    const n_in = 512;
    for (weight_types) |type_id| {
        const w = try finiteWeights(type_id, &rng, n_out, n_in);
        defer alloc.free(w);
        for ([_]usize{ 1, 5 }) |n_tok| {
            for ([_]f32{ nan, inf, -inf }) |bad| {
                const x = try alloc.alloc(f32, n_tok * n_in);
                defer alloc.free(x);
                const y = try alloc.alloc(f32, n_tok * n_out);
                defer alloc.free(y);
                rng.floats(x, 1);
                const bad_row = n_tok / 2;
                x[bad_row * n_in + 300] = bad;
                try matmul(type_id, w, n_out, n_in, x, y);
                for (0..n_tok) |t| {
                    const row = y[t * n_out ..][0..n_out];
                    try expect(if (t == bad_row) allNonFinite(row) else allFinite(row));
                }
            }
        }
    }
}

test "matmul and get_rows: NaN weights (every byte 0xff: NaN values and NaN block scales)" {
    var rng = TestRng.init(73);
    const n_out = 16;
    const n_in = 256;
    for (weight_types) |type_id| {
        const w = try finiteWeights(type_id, &rng, n_out, n_in);
        defer alloc.free(w);
        @memset(w, 0xff);
        var x: [3 * n_in]f32 = undefined;
        rng.floats(&x, 1);
        var y: [3 * n_out]f32 = undefined;
        try matmul(type_id, w, n_out, n_in, &x, &y);
        try expect(allNonFinite(&y));
        const ids = [_]i32{ 0, 7, 15 };
        var rows: [3 * n_in]f32 = undefined;
        try ok(abi.infer_get_rows(type_id, w.ptr, n_in, n_out, &ids, ids.len, &rows));
        try expect(!allFinite(&rows));
    }
}

test "matmul and get_rows: random bytes (any scale, NaN and infinite ones included) are defined" {
    var rng = TestRng.init(79);
    const n_out = 16;
    const n_in = 256;
    for (weight_types) |type_id| {
        const info = blockInfo(type_id);
        const w = try alloc.alloc(u8, n_out * n_in / info.values * info.bytes);
        defer alloc.free(w);
        for (0..8) |_| {
            rng.bytes(w);
            var x: [2 * n_in]f32 = undefined;
            rng.floats(&x, 100);
            var y: [2 * n_out]f32 = undefined;
            try matmul(type_id, w, n_out, n_in, &x, &y);
            const ids = [_]i32{ 3, 9 };
            var rows: [2 * n_in]f32 = undefined;
            try ok(abi.infer_get_rows(type_id, w.ptr, n_in, n_out, &ids, ids.len, &rows));
        }
    }
}

test "quantize_row: NaN and infinities in any type's reference quantizer are defined" {
    var rng = TestRng.init(83);
    for (weight_types ++ [_]u32{15}) |type_id| {
        const info = blockInfo(type_id);
        var x: [512]f32 = undefined;
        const out = try alloc.alloc(u8, x.len / info.values * info.bytes);
        defer alloc.free(out);
        for ([_]f32{ nan, inf, -inf }) |bad| {
            rng.floats(&x, 1);
            x[5] = bad;
            x[300] = bad;
            try ok(abi.infer_quantize_row(type_id, &x, x.len, out.ptr));
            @memset(&x, bad);
            try ok(abi.infer_quantize_row(type_id, &x, x.len, out.ptr));
        }
    }
}

test "attention: NaN in a query or in the cache reaches the heads that read it" {
    var rng = TestRng.init(89);
    // head sizes of the grouped (multiple of 64) and per-head paths; decode and prompt rows;
    // early positions (few cells) and later ones; a sliding window over a ring.
    const Case = struct { d: usize, n_tok: usize, pos0: usize, window: usize, ring: usize };
    const cases = [_]Case{
        .{ .d = 64, .n_tok = 1, .pos0 = 3, .window = 0, .ring = 0 },
        .{ .d = 64, .n_tok = 1, .pos0 = 70, .window = 0, .ring = 0 },
        .{ .d = 128, .n_tok = 4, .pos0 = 20, .window = 0, .ring = 0 },
        .{ .d = 40, .n_tok = 3, .pos0 = 9, .window = 0, .ring = 0 },
        .{ .d = 64, .n_tok = 2, .pos0 = 50, .window = 16, .ring = 32 },
    };
    const n_head = 4;
    const n_kv_head = 2;
    for (cases) |c| {
        // F32, F16 and the rotated codes TQ3/TQ4 (head dims a power of two).
        for ([_]u32{ 0, 1, 103, 104 }) |kv_type| {
            if (kv_type >= 103 and !std.math.isPowerOfTwo(c.d)) continue;
            for ([_]f32{ nan, inf, -inf }) |bad| {
                for (0..3) |where| { // 0: a query value, 1: a key, 2: a value
                    const kv_row = n_kv_head * c.d;
                    const cells = if (c.ring != 0) c.ring else c.pos0 + c.n_tok;
                    const q = try alloc.alloc(f32, c.n_tok * n_head * c.d);
                    defer alloc.free(q);
                    const out = try alloc.alloc(f32, q.len);
                    defer alloc.free(out);
                    const kf = try alloc.alloc(f32, cells * kv_row);
                    defer alloc.free(kf);
                    const vf = try alloc.alloc(f32, cells * kv_row);
                    defer alloc.free(vf);
                    rng.floats(q, 1);
                    rng.floats(kf, 1);
                    rng.floats(vf, 1);
                    // The last query's own cell (always visible to it), kv head 0.
                    const last = c.pos0 + c.n_tok - 1;
                    const cell = if (c.ring != 0) last % c.ring else last;
                    switch (where) {
                        0 => q[(c.n_tok - 1) * n_head * c.d + 1] = bad,
                        1 => kf[cell * kv_row + 2] = bad,
                        else => vf[cell * kv_row + 3] = bad,
                    }
                    const bytes: usize = switch (kv_type) {
                        0 => kf.len * 4,
                        1 => kf.len * 2,
                        else => kf.len / c.d * (2 + c.d * (kv_type - 100) / 8),
                    };
                    const k = try alloc.alignedAlloc(u8, 4, bytes);
                    defer alloc.free(k);
                    const v = try alloc.alignedAlloc(u8, 4, bytes);
                    defer alloc.free(v);
                    try ok(abi.infer_kv_store(kf.ptr, k.ptr, kv_type, kf.len, c.d, null, 0));
                    try ok(abi.infer_kv_store(vf.ptr, v.ptr, kv_type, vf.len, c.d, null, 0));
                    const shape: shapes.AttentionShape = .{
                        .k_type = kv_type,
                        .v_type = kv_type,
                        .n_tok = c.n_tok,
                        .n_head = n_head,
                        .n_kv_head = n_kv_head,
                        .head_dim = c.d,
                        .pos0 = c.pos0,
                        .kv_stride = kv_row,
                        .window = c.window,
                        .ring = c.ring,
                        .scale = 0.125,
                    };
                    try ok(abi.infer_attention(q.ptr, k.ptr, v.ptr, out.ptr, &shape));
                    // Query head 0 of the last row reads kv head 0 (two query heads per kv
                    // head). An infinity may give a score of -inf, whose weight is just 0.
                    const head0 = out[(c.n_tok - 1) * n_head * c.d ..][0..c.d];
                    if (bad != bad) try expect(!allFinite(head0));
                }
            }
        }
    }
}

test "norms, RoPE, activations, softmax and sampling helpers on NaN and infinities" {
    var rng = TestRng.init(97);
    const n = 64 + 13; // vector lanes and a tail
    var x: [2 * n]f32 = undefined;
    var y: [2 * n]f32 = undefined;
    var out: [2 * n]f32 = undefined;
    var w: [n]f32 = undefined;
    for ([_]f32{ nan, inf, -inf }) |bad| {
        rng.floats(&x, 2);
        rng.floats(&y, 2);
        rng.floats(&w, 1);
        x[n + 70] = bad; // row 1, in its tail
        try ok(abi.infer_rms_norm(&x, &w, 2, n, 1e-6, &out));
        try expect(allFinite(out[0..n]));
        try expect(!allFinite(out[n..]));
        try ok(abi.infer_rms_norm_add(&x, &w, 2, n, 1e-6, &y));
        w[3] = bad;
        try ok(abi.infer_rms_norm(&x, &w, 2, n, 1e-6, &out));
        for ([_]u32{ 0, 2 }) |mode| {
            const positions = [_]i32{ 0, 1000 };
            var r = x;
            const shape: shapes.RopeShape = .{
                .n_tok = 2,
                .n_heads = 1,
                .head_dim = 64,
                .n_rot = 64,
                .freq_base = 1e4,
                .freq_scale = 1,
                .mode = mode,
                .attn_factor = 1,
            };
            try ok(abi.infer_rope(&r, &positions, null, &shape));
            var ff: [32]f32 = undefined;
            rng.floats(&ff, 1);
            ff[7] = bad;
            try ok(abi.infer_rope(&r, &positions, &ff, &shape));
        }
        x[5] = bad; // a vector lane
        try ok(abi.infer_gelu_mul(&x, &y, x.len, &out));
        try ok(abi.infer_silu_mul(&x, &y, x.len, &out));
        if (bad != bad) try expect(std.math.isNan(out[5]) and std.math.isNan(out[n + 70]));
        try ok(abi.infer_add(&x, &y, x.len, &out));
        try ok(abi.infer_scale(&out, out.len, 3));
        out = x;
        try ok(abi.infer_softmax(&out, 2, n));
        var index: u32 = 0;
        try ok(abi.infer_argmax(&x, x.len, &index));
        var ids: [2 * n]i32 = undefined;
        var values: [8]f32 = undefined;
        var count: u32 = 0;
        try ok(abi.infer_top_k(&x, x.len, 8, &ids, &values, &count));
        var sum: f64 = 0;
        try ok(abi.infer_exp_sum(&x, x.len, x[index], 1, -inf, &sum));
        try ok(abi.infer_draw(&x, x.len, x[index], 1, sum / 2, &index));
        try ok(abi.infer_above(&x, x.len, 0, &ids, &count));
        var first: u64 = 0;
        try ok(abi.infer_first_nonfinite(&x, x.len, &first));
        try std.testing.expectEqual(@as(u64, 5), first);
        // An all-NaN (or all-infinite) row: every helper still answers within the row.
        @memset(&x, bad);
        try ok(abi.infer_argmax(&x, x.len, &index));
        try expect(index < x.len);
        try ok(abi.infer_top_k(&x, x.len, 8, &ids, &values, &count));
        try ok(abi.infer_softmax(&x, 2, n));
    }
}
