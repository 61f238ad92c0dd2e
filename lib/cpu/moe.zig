//! A mixture-of-experts FFN for one token in two thread-pool dispatches, as ggml's mul_mat_id
//! runs all chosen experts in one op: out = Σ_j w_j · down[e_j] · (silu(gate[e_j] x) ⊙ up[e_j] x)
//! over the k chosen experts e_j, summed in rank order. Each expert's matrix is a weight of its
//! own (any matmul type, repacked or as stored; one type per tensor), found through a table of
//! addresses. Dispatch 1: tasks over (expert, block of hidden rows) compute the block's gate and
//! up dots, SwiGLU, and quantize the block for down. Dispatch 2: tasks over blocks of output rows
//! run every chosen expert's down rows and sum them weighted. The dots are matmul's single-token
//! dots (dot_rows over whole row groups), the activation quantization and SwiGLU are matmul's and
//! act.gated's over whole blocks, so the result equals, bit for bit, three matmul calls, a SwiGLU
//! and the weighted sum per expert (the test below).
const std = @import("std");
const types = @import("../quant/types.zig");
const threads = @import("threads.zig");
const act = @import("act.zig");

/// One expert tensor: per expert the address of its n_out x n_in matrix, all of one type.
pub const Experts = struct {
    table: [*]const u64,
    traits: *const types.Traits,
};

pub const Problem = struct {
    gate: Experts,
    up: Experts,
    down: Experts,
    n_embd: usize,
    n_ff: usize,
    /// The k chosen experts (indexes into the tables) and their weights, best first.
    ids: []const u32,
    weights: []const f32,
    x: [*]const f32,
    out: [*]f32,
};

/// Rows a task computes at most (its stack buffers); blocks aim at `rows_target` rows.
const rows_max = 256;
const rows_target = 64;

/// Library-owned scratch (quantized input, hidden rows, quantized hidden rows), grown when a
/// call needs more; one call at a time.
var scratch: []align(64) u8 = &.{};
var scratch_mutex: std.Thread.Mutex = .{};

fn ensureScratch(bytes: usize) error{OutOfMemory}![]align(64) u8 {
    if (scratch.len >= bytes) return scratch;
    const fresh = try std.heap.page_allocator.alignedAlloc(u8, 64, @max(bytes, scratch.len + scratch.len / 2));
    if (scratch.len > 0) std.heap.page_allocator.free(scratch);
    scratch = fresh;
    return scratch;
}

fn activation(t: *const types.Traits) *const types.Traits {
    return types.get(@intFromEnum(t.vec_dot_type)).?;
}

/// Rows per block: a multiple of `unit`, about rows_target, at most rows_max.
fn blockRows(unit: usize) usize {
    return std.mem.alignForward(usize, rows_target, unit);
}

pub const Error = error{ OutOfMemory, Unsupported };

/// The shape checks the export makes, shared with the test: null when `p` can run.
pub fn unsupported(p: *const Problem) ?[]const u8 {
    for ([_]*const types.Traits{ p.gate.traits, p.up.traits, p.down.traits }) |t| {
        if (t.dot_rows == null) return "an expert type has no single-token dot";
    }
    if (blockRows(hiddenUnit(p)) > rows_max or blockRows(p.down.traits.row_group) > rows_max) {
        return "row groups too large for one task";
    }
    return null;
}

/// Hidden rows come in blocks that are whole row groups of gate and up, whole 16-value runs of
/// act.gated's vector loop and whole blocks of down's activation format.
fn hiddenUnit(p: *const Problem) usize {
    const groups = lcm(p.gate.traits.row_group, p.up.traits.row_group);
    return lcm(lcm(groups, 16), activation(p.down.traits).block_values);
}

fn lcm(a: usize, b: usize) usize {
    return a / std.math.gcd(a, b) * b;
}

const Job = struct {
    p: *const Problem,
    xq_gate: [*]const u8,
    xq_up: [*]const u8,
    hidden: [*]f32, // k rows of n_ff
    hidden_q: [*]u8, // k rows in down's activation format (hidden itself when that is f32)
    hidden_q_row_bytes: usize,
    hidden_rows: usize,
    hidden_blocks: usize,
    out_rows: usize,
};

fn address(e: Experts, id: u32) [*]const u8 {
    return @ptrFromInt(@as(usize, @intCast(e.table[id])));
}

fn hiddenTask(job: *const Job, task: usize) void {
    const p = job.p;
    const j = task / job.hidden_blocks;
    const begin = (task % job.hidden_blocks) * job.hidden_rows;
    const n = @min(job.hidden_rows, p.n_ff - begin);
    const id = p.ids[j];
    var gate: [rows_max]f32 = undefined;
    var up: [rows_max]f32 = undefined;
    const gate_row_bytes = p.gate.traits.rowBytes(p.n_embd);
    const up_row_bytes = p.up.traits.rowBytes(p.n_embd);
    p.gate.traits.dot_rows.?(p.n_embd, address(p.gate, id) + begin * gate_row_bytes, gate_row_bytes, n, job.xq_gate, &gate);
    p.up.traits.dot_rows.?(p.n_embd, address(p.up, id) + begin * up_row_bytes, up_row_bytes, n, job.xq_up, &up);
    const h = job.hidden + j * p.n_ff + begin;
    act.gated(.silu, gate[0..n], up[0..n], h[0..n]);
    const a = activation(p.down.traits);
    if (a.id != .f32) a.quantize_activation.?(h, job.hidden_q + j * job.hidden_q_row_bytes + a.rowBytes(begin), n);
}

fn outputTask(job: *const Job, task: usize) void {
    const p = job.p;
    const begin = task * job.out_rows;
    const n = @min(job.out_rows, p.n_embd - begin);
    const row_bytes = p.down.traits.rowBytes(p.n_ff);
    var y: [rows_max]f32 = undefined;
    const sum = p.out[begin..][0..n];
    for (p.ids, p.weights, 0..) |id, w, j| {
        p.down.traits.dot_rows.?(p.n_ff, address(p.down, id) + begin * row_bytes, row_bytes, n,
            job.hidden_q + j * job.hidden_q_row_bytes, &y);
        // Each product rounded to f32, then added in rank order: the per-expert path's order.
        if (j == 0) {
            for (sum, y[0..n]) |*s, v| s.* = w * v;
        } else {
            for (sum, y[0..n]) |*s, v| s.* = s.* + w * v;
        }
    }
}

/// out (n_embd) = the MoE FFN of x (n_embd) over the chosen experts. The caller has validated
/// the shapes (unsupported(p) null, n_embd and n_ff whole blocks of the types, ids in range).
pub fn ffn(p: *const Problem) Error!void {
    const k = p.ids.len;
    if (k == 0) {
        @memset(p.out[0..p.n_embd], 0);
        return;
    }
    scratch_mutex.lock();
    defer scratch_mutex.unlock();
    const a_gate = activation(p.gate.traits);
    const a_up = activation(p.up.traits);
    const a_down = activation(p.down.traits);
    const xq_gate_bytes = std.mem.alignForward(usize, a_gate.rowBytes(p.n_embd), 64);
    const xq_up_bytes = if (a_up == a_gate) 0 else std.mem.alignForward(usize, a_up.rowBytes(p.n_embd), 64);
    const hidden_bytes = std.mem.alignForward(usize, k * p.n_ff * 4, 64);
    const hidden_q_row_bytes = a_down.rowBytes(p.n_ff);
    const hidden_q_bytes = if (a_down.id == .f32) 0 else k * hidden_q_row_bytes;
    const buf = try ensureScratch(xq_gate_bytes + xq_up_bytes + hidden_bytes + hidden_q_bytes);
    const xq_gate = quantized(a_gate, p.x, p.n_embd, buf.ptr);
    const xq_up = if (a_up == a_gate) xq_gate else quantized(a_up, p.x, p.n_embd, buf.ptr + xq_gate_bytes);
    const hidden: [*]f32 = @ptrCast(@alignCast(buf.ptr + xq_gate_bytes + xq_up_bytes));
    const hidden_rows = blockRows(hiddenUnit(p));
    const job = Job{
        .p = p,
        .xq_gate = xq_gate,
        .xq_up = xq_up,
        .hidden = hidden,
        .hidden_q = if (hidden_q_bytes == 0) @ptrCast(hidden) else buf.ptr + xq_gate_bytes + xq_up_bytes + hidden_bytes,
        .hidden_q_row_bytes = hidden_q_row_bytes,
        .hidden_rows = hidden_rows,
        .hidden_blocks = std.math.divCeil(usize, p.n_ff, hidden_rows) catch unreachable,
        .out_rows = blockRows(p.down.traits.row_group),
    };
    threads.run(k * job.hidden_blocks, &job, hiddenTask);
    threads.run(std.math.divCeil(usize, p.n_embd, job.out_rows) catch unreachable, &job, outputTask);
}

/// x in activation format `a` (at dst), or x itself where that format is f32.
fn quantized(a: *const types.Traits, x: [*]const f32, n: usize, dst: [*]u8) [*]const u8 {
    if (a.id == .f32) return @ptrCast(x);
    a.quantize_activation.?(x, dst, n);
    return dst;
}

const simd = @import("../quant/simd.zig");
const matmul = @import("matmul.zig");

/// The per-expert path: three matmul calls, act.gated, and the weighted sum in rank order.
fn reference(alloc: std.mem.Allocator, p: *const Problem) ![]f32 {
    const gate = try alloc.alloc(f32, p.n_ff);
    defer alloc.free(gate);
    const up = try alloc.alloc(f32, p.n_ff);
    defer alloc.free(up);
    const y = try alloc.alloc(f32, p.n_embd);
    defer alloc.free(y);
    const out = try alloc.alloc(f32, p.n_embd);
    for (p.ids, p.weights, 0..) |id, w, j| {
        try matmul.matmul(address(p.gate, id), p.gate.traits, p.n_ff, p.n_embd, p.x, 1, gate.ptr);
        try matmul.matmul(address(p.up, id), p.up.traits, p.n_ff, p.n_embd, p.x, 1, up.ptr);
        act.gated(.silu, gate, up, gate);
        try matmul.matmul(address(p.down, id), p.down.traits, p.n_embd, p.n_ff, gate.ptr, 1, y.ptr);
        for (out, y) |*o, v| o.* = if (j == 0) w * v else o.* + w * v;
    }
    return out;
}

/// Random experts of `type_id` (n_out x n_in each), repacked where matmul would repack them.
const TestExperts = struct {
    bytes: []u8,
    table: []u64,
    traits: *const types.Traits,

    fn init(alloc: std.mem.Allocator, rng: *simd.TestRng, type_id: types.TypeId, n_expert: usize, n_out: usize, n_in: usize) !TestExperts {
        const t = types.get(@intFromEnum(type_id)).?;
        const row_bytes = t.rowBytes(n_in);
        const bytes = try alloc.alloc(u8, n_expert * n_out * row_bytes);
        const table = try alloc.alloc(u64, n_expert);
        const wf = try alloc.alloc(f32, n_in);
        defer alloc.free(wf);
        const stored = try alloc.alloc(u8, n_out * row_bytes);
        defer alloc.free(stored);
        const packed_traits = types.repackedType(@intFromEnum(type_id), n_out);
        for (0..n_expert) |e| {
            const at = bytes[e * n_out * row_bytes ..][0 .. n_out * row_bytes];
            for (0..n_out) |o| {
                rng.floats(wf, 1.0 / @sqrt(@as(f32, @floatFromInt(n_in))));
                t.quantize_ref.?(wf.ptr, stored[o * row_bytes ..].ptr, n_in);
            }
            if (packed_traits != null) types.repack(@intFromEnum(type_id), stored.ptr, n_out, n_in, at.ptr) else @memcpy(at, stored);
            table[e] = @intFromPtr(at.ptr);
        }
        return .{ .bytes = bytes, .table = table, .traits = packed_traits orelse t };
    }

    fn experts(self: *const TestExperts) Experts {
        return .{ .table = self.table.ptr, .traits = self.traits };
    }

    fn deinit(self: *TestExperts, alloc: std.mem.Allocator) void {
        alloc.free(self.bytes);
        alloc.free(self.table);
    }
};

test "the one-token MoE FFN equals the per-expert matmuls, bit for bit" {
    const alloc = std.testing.allocator;
    var rng = simd.TestRng.init(2027);
    const Case = struct { gate: types.TypeId, down: types.TypeId, n_embd: usize, n_ff: usize, n_expert: usize, k: usize };
    const cases = [_]Case{
        // Odd sizes: hidden and output rows that do not fill the last block, row groups of 1.
        .{ .gate = .q4_0, .down = .q4_0, .n_embd = 96, .n_ff = 224, .n_expert = 5, .k = 3 },
        .{ .gate = .q8_0, .down = .q4_0, .n_embd = 160, .n_ff = 96, .n_expert = 7, .k = 2 },
        .{ .gate = .q4_0, .down = .q8_0, .n_embd = 64, .n_ff = 352, .n_expert = 3, .k = 3 },
        .{ .gate = .q5_0, .down = .q5_0, .n_embd = 96, .n_ff = 96, .n_expert = 4, .k = 2 },
        // Gate rows not a multiple of 8: stored as they are, not repacked.
        .{ .gate = .q8_0, .down = .f32, .n_embd = 64, .n_ff = 100, .n_expert = 3, .k = 2 },
        .{ .gate = .q4_k, .down = .q6_k, .n_embd = 256, .n_ff = 768, .n_expert = 6, .k = 4 },
        .{ .gate = .q6_k, .down = .q4_k, .n_embd = 512, .n_ff = 256, .n_expert = 3, .k = 1 },
        .{ .gate = .f16, .down = .f32, .n_embd = 40, .n_ff = 24, .n_expert = 3, .k = 2 },
        .{ .gate = .f32, .down = .bf16, .n_embd = 33, .n_ff = 50, .n_expert = 4, .k = 3 },
    };
    for ([_]usize{ 1, 2, 3 }) |n_threads| {
        try threads.setThreadCount(n_threads);
        for (cases) |c| {
            var gate = try TestExperts.init(alloc, &rng, c.gate, c.n_expert, c.n_ff, c.n_embd);
            defer gate.deinit(alloc);
            var up = try TestExperts.init(alloc, &rng, c.gate, c.n_expert, c.n_ff, c.n_embd);
            defer up.deinit(alloc);
            var down = try TestExperts.init(alloc, &rng, c.down, c.n_expert, c.n_embd, c.n_ff);
            defer down.deinit(alloc);
            const x = try alloc.alloc(f32, c.n_embd);
            defer alloc.free(x);
            rng.floats(x, 2);
            const out = try alloc.alloc(f32, c.n_embd);
            defer alloc.free(out);
            // The last experts, in reverse: ids out of order, weights uneven.
            var ids: [8]u32 = undefined;
            var weights: [8]f32 = undefined;
            for (0..c.k) |j| {
                ids[j] = @intCast(c.n_expert - 1 - j);
                weights[j] = 0.6 / @as(f32, @floatFromInt(j + 1)) + 0.01;
            }
            const p = Problem{
                .gate = gate.experts(), .up = up.experts(), .down = down.experts(),
                .n_embd = c.n_embd, .n_ff = c.n_ff, .ids = ids[0..c.k], .weights = weights[0..c.k],
                .x = x.ptr, .out = out.ptr,
            };
            try std.testing.expect(unsupported(&p) == null);
            try ffn(&p);
            const want = try reference(alloc, &p);
            defer alloc.free(want);
            try std.testing.expectEqualSlices(u32, std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(want)),
                std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(out)));
        }
    }
}
