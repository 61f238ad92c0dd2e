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
    n_expert: usize,
    /// Tokens: rows of x and out.
    n_tok: usize = 1,
    /// Per token its k chosen experts (indexes into the tables) and their weights, best first.
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
    // Several tokens: the per-expert path's SwiGLU runs over all of an expert's rows at once,
    // whose 16-value vector runs line up with each row's only where rows are whole runs.
    if (p.n_tok > 1 and p.n_ff % 16 != 0) return "several tokens need n_ff a multiple of 16";
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
    if (p.n_tok > 1) return ffnRows(p);
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

// ---- several tokens: rows grouped by expert --------------------------------------------------
// As the per-expert path (ts/model/moe.ts) runs them: each expert's matrices once over the rows
// that chose it (slots in slot order), matmul's batched dots for two or more rows and its
// single-token dots for one, SwiGLU over each row, each slot weighted, then each token's slots
// summed in rank order. Four dispatches: quantize the rows per slot; gate/up/SwiGLU/quantize over
// (expert, block of hidden rows); down and the weights over (expert, block of output rows); the sums.

const Grouped = struct {
    p: *const Problem,
    k: usize,
    /// Slots (token · k + rank) sorted by expert, stable; expert e's at order[start[e]..start[e+1]].
    order: [*]const u32,
    start: [*]const u32,
    /// The experts some slot chose, ascending.
    active: [*]const u32,
    xq_gate: [*]u8, // per sorted slot, its token's row in gate's activation format
    xq_up: [*]u8,
    xq_gate_row_bytes: usize,
    xq_up_row_bytes: usize,
    separate_up: bool,
    hidden_gate: [*]f32, // per sorted slot, n_ff
    hidden_up: [*]f32,
    hidden_q: [*]u8, // per sorted slot, down's activation format (hidden_gate where f32)
    hidden_q_row_bytes: usize,
    hidden_rows: usize,
    hidden_blocks: usize,
    out_rows: usize,
    out_blocks: usize,
    down_rows: [*]f32, // per sorted slot, n_embd
    slots: [*]f32, // per slot, weighted, n_embd
};

/// A thread's copy of a tile of repacked rows in their base format (as matmul's unpack_rows).
threadlocal var unpacked: []align(64) u8 = &.{};

fn unpackBuffer(bytes: usize) ?[*]u8 {
    if (unpacked.len < bytes) {
        const fresh = std.heap.page_allocator.alignedAlloc(u8, 64, bytes) catch return null;
        if (unpacked.len > 0) std.heap.page_allocator.free(unpacked);
        unpacked = fresh;
    }
    return unpacked.ptr;
}

/// Weight rows [w_rows, + n_rows) times m activation rows, as matmul computes a task's tile:
/// one row by the single-token dots; more by the batched ones (a repacked tile unpacked first),
/// in groups of multi_rows from the first. y[t · y_stride + o] for row o, activation row t.
fn tileDots(t: *const types.Traits, n_in: usize, w_rows: [*]const u8, n_rows: usize, x: [*]const u8,
    x_row_bytes: usize, m: usize, y: [*]f32, y_stride: usize) void {
    const row_bytes = t.rowBytes(n_in);
    if (m == 1) return t.dot_rows.?(n_in, w_rows, row_bytes, n_rows, x, y);
    const batch = t.batch_format orelse t;
    var rows_at = w_rows;
    if (t.unpack_rows) |unpack| {
        if (unpackBuffer(n_rows * row_bytes)) |copy| {
            unpack(w_rows, n_rows, n_in, copy);
            rows_at = copy;
        } else {
            for (0..m) |r| t.dot_rows.?(n_in, w_rows, row_bytes, n_rows, x + r * x_row_bytes, y + r * y_stride);
            return;
        }
    }
    if (batch.dot_multi) |dot_multi| {
        var r: usize = 0;
        while (r < m) : (r += batch.multi_rows) {
            const n = @min(batch.multi_rows, m - r);
            dot_multi(n_in, rows_at, row_bytes, n_rows, x + r * x_row_bytes, x_row_bytes, n, y + r * y_stride, y_stride);
        }
        return;
    }
    for (0..m) |r| t.dot_rows.?(n_in, w_rows, row_bytes, n_rows, x + r * x_row_bytes, y + r * y_stride);
}

fn quantizeSlotTask(g: *const Grouped, pos: usize) void {
    const p = g.p;
    const row = p.x + (g.order[pos] / g.k) * p.n_embd;
    copyQuantized(activation(p.gate.traits), row, p.n_embd, g.xq_gate + pos * g.xq_gate_row_bytes);
    if (g.separate_up) copyQuantized(activation(p.up.traits), row, p.n_embd, g.xq_up + pos * g.xq_up_row_bytes);
}

/// x in activation format `a` at dst (a copy where that format is f32).
fn copyQuantized(a: *const types.Traits, x: [*]const f32, n: usize, dst: [*]u8) void {
    if (a.id == .f32) @memcpy(dst[0 .. n * 4], std.mem.sliceAsBytes(x[0..n])) else a.quantize_activation.?(x, dst, n);
}

fn groupedHiddenTask(g: *const Grouped, task: usize) void {
    const p = g.p;
    const e = g.active[task / g.hidden_blocks];
    const begin = (task % g.hidden_blocks) * g.hidden_rows;
    const n = @min(g.hidden_rows, p.n_ff - begin);
    const first = g.start[e];
    const m = g.start[e + 1] - first;
    const gate_row_bytes = p.gate.traits.rowBytes(p.n_embd);
    const up_row_bytes = p.up.traits.rowBytes(p.n_embd);
    const hg = g.hidden_gate + first * p.n_ff + begin;
    const hu = g.hidden_up + first * p.n_ff + begin;
    tileDots(p.gate.traits, p.n_embd, address(p.gate, e) + begin * gate_row_bytes, n,
        g.xq_gate + first * g.xq_gate_row_bytes, g.xq_gate_row_bytes, m, hg, p.n_ff);
    const xq_up = if (g.separate_up) g.xq_up else g.xq_gate;
    const xq_up_row_bytes = if (g.separate_up) g.xq_up_row_bytes else g.xq_gate_row_bytes;
    tileDots(p.up.traits, p.n_embd, address(p.up, e) + begin * up_row_bytes, n,
        xq_up + first * xq_up_row_bytes, xq_up_row_bytes, m, hu, p.n_ff);
    const a = activation(p.down.traits);
    for (0..m) |r| {
        const h = hg + r * p.n_ff;
        act.gated(.silu, h[0..n], (hu + r * p.n_ff)[0..n], h[0..n]);
        if (a.id != .f32) a.quantize_activation.?(h, g.hidden_q + (first + r) * g.hidden_q_row_bytes + a.rowBytes(begin), n);
    }
}

fn groupedOutputTask(g: *const Grouped, task: usize) void {
    const p = g.p;
    const e = g.active[task / g.out_blocks];
    const begin = (task % g.out_blocks) * g.out_rows;
    const n = @min(g.out_rows, p.n_embd - begin);
    const first = g.start[e];
    const m = g.start[e + 1] - first;
    const row_bytes = p.down.traits.rowBytes(p.n_ff);
    const y = g.down_rows + first * p.n_embd + begin;
    tileDots(p.down.traits, p.n_ff, address(p.down, e) + begin * row_bytes, n,
        g.hidden_q + first * g.hidden_q_row_bytes, g.hidden_q_row_bytes, m, y, p.n_embd);
    for (0..m) |r| {
        const slot = g.order[first + r];
        const w = p.weights[slot];
        for ((g.slots + slot * p.n_embd + begin)[0..n], (y + r * p.n_embd)[0..n]) |*s, v| s.* = w * v;
    }
}

fn sumTask(g: *const Grouped, token: usize) void {
    const p = g.p;
    const out = (p.out + token * p.n_embd)[0..p.n_embd];
    @memcpy(out, (g.slots + token * g.k * p.n_embd)[0..p.n_embd]);
    for (1..g.k) |j| {
        for (out, (g.slots + (token * g.k + j) * p.n_embd)[0..p.n_embd]) |*o, v| o.* = o.* + v;
    }
}

fn ffnRows(p: *const Problem) Error!void {
    const k = p.ids.len / p.n_tok;
    const n_slots = p.ids.len;
    if (k == 0) {
        @memset(p.out[0 .. p.n_tok * p.n_embd], 0);
        return;
    }
    scratch_mutex.lock();
    defer scratch_mutex.unlock();
    const a_gate = activation(p.gate.traits);
    const a_up = activation(p.up.traits);
    const a_down = activation(p.down.traits);
    const separate_up = a_up != a_gate;
    const xq_gate_row_bytes = a_gate.rowBytes(p.n_embd);
    const xq_up_row_bytes = a_up.rowBytes(p.n_embd);
    const hidden_q_row_bytes = a_down.rowBytes(p.n_ff);
    // Scratch: order, start, active (u32), then 64-byte aligned regions.
    const sizes = [_]usize{
        (n_slots + 3 * p.n_expert + 1) * 4,
        n_slots * xq_gate_row_bytes,
        if (separate_up) n_slots * xq_up_row_bytes else 0,
        n_slots * p.n_ff * 4,
        n_slots * p.n_ff * 4,
        if (a_down.id == .f32) 0 else n_slots * hidden_q_row_bytes,
        n_slots * p.n_embd * 4,
        n_slots * p.n_embd * 4,
    };
    var offsets: [sizes.len]usize = undefined;
    var total: usize = 0;
    for (sizes, 0..) |size, i| {
        offsets[i] = total;
        total += std.mem.alignForward(usize, size, 64);
    }
    const buf = try ensureScratch(total);
    const index: [*]u32 = @ptrCast(@alignCast(buf.ptr));
    const order = index[0..n_slots];
    const start = index[n_slots..][0 .. p.n_expert + 1];
    const active = index[n_slots + p.n_expert + 1 ..][0..p.n_expert];
    // Counting sort of the slots by expert, stable (the per-expert path's slot order).
    @memset(start, 0);
    for (p.ids) |id| start[id + 1] += 1;
    var n_active: usize = 0;
    for (0..p.n_expert) |e| {
        if (start[e + 1] > 0) {
            active[n_active] = @intCast(e);
            n_active += 1;
        }
        start[e + 1] += start[e];
    }
    // Positions handed out per expert from its start, in slot order.
    const next = index[n_slots + 2 * p.n_expert + 1 ..][0..p.n_expert];
    @memcpy(next, start[0..p.n_expert]);
    for (p.ids, 0..) |id, slot| {
        order[next[id]] = @intCast(slot);
        next[id] += 1;
    }
    const f32At = struct {
        fn at(b: []align(64) u8, offset: usize) [*]f32 {
            return @ptrCast(@alignCast(b.ptr + offset));
        }
    }.at;
    const hidden_rows = blockRows(hiddenUnit(p));
    const out_rows = blockRows(p.down.traits.row_group);
    const g = Grouped{
        .p = p,
        .k = k,
        .order = order.ptr,
        .start = start.ptr,
        .active = active.ptr,
        .xq_gate = buf.ptr + offsets[1],
        .xq_up = buf.ptr + offsets[2],
        .xq_gate_row_bytes = xq_gate_row_bytes,
        .xq_up_row_bytes = xq_up_row_bytes,
        .separate_up = separate_up,
        .hidden_gate = f32At(buf, offsets[3]),
        .hidden_up = f32At(buf, offsets[4]),
        .hidden_q = if (a_down.id == .f32) buf.ptr + offsets[3] else buf.ptr + offsets[5],
        .hidden_q_row_bytes = hidden_q_row_bytes,
        .hidden_rows = hidden_rows,
        .hidden_blocks = std.math.divCeil(usize, p.n_ff, hidden_rows) catch unreachable,
        .out_rows = out_rows,
        .out_blocks = std.math.divCeil(usize, p.n_embd, out_rows) catch unreachable,
        .down_rows = f32At(buf, offsets[6]),
        .slots = f32At(buf, offsets[7]),
    };
    threads.run(n_slots, &g, quantizeSlotTask);
    threads.run(n_active * g.hidden_blocks, &g, groupedHiddenTask);
    threads.run(n_active * g.out_blocks, &g, groupedOutputTask);
    threads.run(p.n_tok, &g, sumTask);
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

/// The per-expert path for several tokens (ts/model/moe.ts): per expert, in order, its rows
/// gathered, three matmul calls and act.gated over all of them, each slot weighted; then each
/// token's slots summed in rank order.
fn referenceRows(alloc: std.mem.Allocator, p: *const Problem) ![]f32 {
    const k = p.ids.len / p.n_tok;
    const xg = try alloc.alloc(f32, p.ids.len * p.n_embd);
    defer alloc.free(xg);
    const gate = try alloc.alloc(f32, p.ids.len * p.n_ff);
    defer alloc.free(gate);
    const up = try alloc.alloc(f32, p.ids.len * p.n_ff);
    defer alloc.free(up);
    const down = try alloc.alloc(f32, p.ids.len * p.n_embd);
    defer alloc.free(down);
    const slots = try alloc.alloc(f32, p.ids.len * p.n_embd);
    defer alloc.free(slots);
    const chosen = try alloc.alloc(usize, p.ids.len);
    defer alloc.free(chosen);
    for (0..p.n_expert) |e| {
        var m: usize = 0;
        for (p.ids, 0..) |id, slot| {
            if (id != e) continue;
            chosen[m] = slot;
            @memcpy(xg[m * p.n_embd ..][0..p.n_embd], (p.x + (slot / k) * p.n_embd)[0..p.n_embd]);
            m += 1;
        }
        if (m == 0) continue;
        const ee: u32 = @intCast(e);
        try matmul.matmul(address(p.gate, ee), p.gate.traits, p.n_ff, p.n_embd, xg.ptr, m, gate.ptr);
        try matmul.matmul(address(p.up, ee), p.up.traits, p.n_ff, p.n_embd, xg.ptr, m, up.ptr);
        act.gated(.silu, gate[0 .. m * p.n_ff], up[0 .. m * p.n_ff], gate[0 .. m * p.n_ff]);
        try matmul.matmul(address(p.down, ee), p.down.traits, p.n_embd, p.n_ff, gate.ptr, m, down.ptr);
        for (chosen[0..m], 0..) |slot, r| {
            for (slots[slot * p.n_embd ..][0..p.n_embd], down[r * p.n_embd ..][0..p.n_embd]) |*s, v| s.* = p.weights[slot] * v;
        }
    }
    const out = try alloc.alloc(f32, p.n_tok * p.n_embd);
    for (0..p.n_tok) |t| {
        for (0..k) |j| {
            for (out[t * p.n_embd ..][0..p.n_embd], slots[(t * k + j) * p.n_embd ..][0..p.n_embd]) |*o, v| {
                o.* = if (j == 0) v else o.* + v;
            }
        }
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
        // gpt-oss's expert format.
        .{ .gate = .mxfp4, .down = .mxfp4, .n_embd = 96, .n_ff = 160, .n_expert = 5, .k = 4 },
        .{ .gate = .mxfp4, .down = .q8_0, .n_embd = 64, .n_ff = 224, .n_expert = 3, .k = 2 },
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
                .n_embd = c.n_embd, .n_ff = c.n_ff, .n_expert = c.n_expert, .ids = ids[0..c.k], .weights = weights[0..c.k],
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

test "several tokens' MoE FFN equals the per-expert path with rows grouped by expert, bit for bit" {
    const alloc = std.testing.allocator;
    var rng = simd.TestRng.init(2028);
    const Case = struct { gate: types.TypeId, down: types.TypeId, n_embd: usize, n_ff: usize, n_expert: usize, k: usize, n_tok: usize };
    const cases = [_]Case{
        .{ .gate = .q4_0, .down = .q4_0, .n_embd = 96, .n_ff = 224, .n_expert = 5, .k = 3, .n_tok = 7 },
        .{ .gate = .q8_0, .down = .q4_0, .n_embd = 160, .n_ff = 96, .n_expert = 9, .k = 2, .n_tok = 13 },
        .{ .gate = .q4_k, .down = .q6_k, .n_embd = 256, .n_ff = 768, .n_expert = 6, .k = 4, .n_tok = 5 },
        .{ .gate = .q5_0, .down = .q8_0, .n_embd = 64, .n_ff = 96, .n_expert = 16, .k = 8, .n_tok = 3 },
        .{ .gate = .q8_0, .down = .f32, .n_embd = 64, .n_ff = 112, .n_expert = 3, .k = 2, .n_tok = 11 },
        .{ .gate = .f16, .down = .bf16, .n_embd = 40, .n_ff = 32, .n_expert = 4, .k = 3, .n_tok = 6 },
        .{ .gate = .mxfp4, .down = .mxfp4, .n_embd = 96, .n_ff = 160, .n_expert = 6, .k = 4, .n_tok = 9 },
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
            const x = try alloc.alloc(f32, c.n_tok * c.n_embd);
            defer alloc.free(x);
            rng.floats(x, 2);
            const out = try alloc.alloc(f32, c.n_tok * c.n_embd);
            defer alloc.free(out);
            const ids = try alloc.alloc(u32, c.n_tok * c.k);
            defer alloc.free(ids);
            const weights = try alloc.alloc(f32, c.n_tok * c.k);
            defer alloc.free(weights);
            // Distinct experts per token, skewed so that some experts get one row and some many.
            for (0..c.n_tok) |t| {
                for (0..c.k) |j| {
                    ids[t * c.k + j] = @intCast((t * t + j * 3 + (t % 2) * j) % c.n_expert);
                    var dup = true;
                    while (dup) {
                        dup = false;
                        for (ids[t * c.k ..][0..j]) |q| {
                            if (q == ids[t * c.k + j]) dup = true;
                        }
                        if (dup) ids[t * c.k + j] = @intCast((ids[t * c.k + j] + 1) % c.n_expert);
                    }
                    weights[t * c.k + j] = 0.5 / @as(f32, @floatFromInt(j + 1)) + 0.03 * @as(f32, @floatFromInt(t % 3));
                }
            }
            const p = Problem{
                .gate = gate.experts(), .up = up.experts(), .down = down.experts(),
                .n_embd = c.n_embd, .n_ff = c.n_ff, .n_expert = c.n_expert, .n_tok = c.n_tok,
                .ids = ids, .weights = weights, .x = x.ptr, .out = out.ptr,
            };
            try std.testing.expect(unsupported(&p) == null);
            try ffn(&p);
            const want = try referenceRows(alloc, &p);
            defer alloc.free(want);
            try std.testing.expectEqualSlices(u32, std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(want)),
                std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(out)));
        }
    }
}
