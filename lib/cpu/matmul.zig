//! y[t][o] = sum_i W[o][i] * x[t][i]: a weight matrix of n_out rows x n_in columns in any
//! supported ggml type (row-major; row o starts at o * row_bytes) times n_tok f32 activation
//! rows. As ggml does, the activations are first quantized once into the weight type's
//! vec_dot type (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_K for K-quants, bf16 for BF16; F16 keeps them in
//! f32, see f16.zig), then the output rows are split into tasks across the thread pool. A task computes a tile of rows for
//! every token, so each weight tile is read from memory once and reused from cache per token.
const std = @import("std");
const types = @import("../quant/types.zig");
const threads = @import("threads.zig");

/// Weight bytes per task when several tokens share a pass: the tile is reused from L2 for every
/// group of tokens, and a batched call prepares its activation rows once for all the tile's
/// rows, so a tile of a few rows (32 KiB was 3 rows of a 8,192-wide Q8_0 matrix) spends its
/// time preparing activations. 128 KiB measured 1.3-1.6x faster than 32 KiB (bench/matvec.ts
/// --tokens 256) for Q8_0, Q4_0 and Q4_K at 1,024-8,192 columns.
const tile_bytes_multi_token = 128 * 1024;
/// Tasks per thread for a single token: enough to balance uneven cores, few enough that the
/// atomic task counter is negligible.
const tasks_per_thread = 4;
/// From this many threads a single token's matvec takes one task per thread: every claim is an
/// atomic on the one cache line all threads share, and at 16 threads of a server's mesh the small
/// matvecs took ~10 µs more than their bytes need with 4 tasks per thread (~80 claims an op;
/// bench/results/cpu.md), more than uneven cores lose. llama.cpp's matvec takes one chunk per
/// thread too.
const one_task_per_thread_from = 8;

/// Quantized activations (and the batched kernel's tables of them, Traits.activation_tables),
/// owned by the library: grown when a call needs more, never freed per call. Guarded by
/// `scratch_mutex` (one matmul at a time uses it).
var scratch: []align(64) u8 = &.{};
var scratch_mutex: std.Thread.Mutex = .{};

fn ensureScratch(bytes: usize) error{OutOfMemory}![]align(64) u8 {
    if (scratch.len >= bytes) return scratch;
    const grown = @max(bytes, scratch.len + scratch.len / 2);
    const fresh = try std.heap.page_allocator.alignedAlloc(u8, 64, grown);
    if (scratch.len > 0) std.heap.page_allocator.free(scratch);
    scratch = fresh;
    return scratch;
}

const Job = struct {
    w: [*]const u8,
    w_row_bytes: usize,
    dot_rows: types.DotRowsFn,
    dot_multi: ?types.DotMultiFn,
    /// Set for layouts whose batches run on their base format's rows (Traits.unpack_rows):
    /// each task's tile is copied back once, then dot_multi (the base format's) reads the copy.
    unpack_rows: ?types.UnpackRowsFn = null,
    multi_rows: usize,
    n_out: usize,
    n_in: usize,
    x: [*]const u8, // activations in the vec_dot type
    x_row_bytes: usize,
    /// Set where the batched kernel reads tables made once for the call (at `tables_at`, one
    /// row of tables_row_bytes a token): its dot_multi runs instead of the job's.
    tables: ?*const types.ActivationTables = null,
    tables_at: [*]const u8 = undefined,
    tables_row_bytes: usize = 0,
    n_tok: usize,
    y: [*]f32,
    rows_per_task: usize,
};

/// A thread's copy of its task's tile of rows (unpack_rows): grown as needed, kept for the
/// next call (a tile is at most ~128 KiB, or 8 rows).
threadlocal var tile: []align(64) u8 = &.{};

fn tileBuffer(bytes: usize) ?[*]u8 {
    if (tile.len < bytes) {
        const fresh = std.heap.page_allocator.alignedAlloc(u8, 64, bytes) catch return null;
        if (tile.len > 0) std.heap.page_allocator.free(tile);
        tile = fresh;
    }
    return tile.ptr;
}

fn runTask(job: *const Job, task: usize) void {
    const row_begin = task * job.rows_per_task;
    const row_end = @min(row_begin + job.rows_per_task, job.n_out);
    var rows_at = job.w + row_begin * job.w_row_bytes;
    if (job.unpack_rows) |unpack| {
        if (tileBuffer((row_end - row_begin) * job.w_row_bytes)) |copy| {
            unpack(rows_at, row_end - row_begin, job.n_in, copy);
            rows_at = copy;
        } else {
            // No memory for the copy: the repacked rows one token at a time (the same sums).
            for (0..job.n_tok) |t| {
                job.dot_rows(job.n_in, rows_at, job.w_row_bytes, row_end - row_begin, job.x + t * job.x_row_bytes,
                    job.y + t * job.n_out + row_begin);
            }
            return;
        }
    }
    if (job.dot_multi) |dot_multi| {
        // Tokens in groups: each weight row is unpacked once per group, and the task's rows
        // stay in cache from one group to the next.
        var t: usize = 0;
        while (t < job.n_tok) : (t += job.multi_rows) {
            const n_rows = @min(job.multi_rows, job.n_tok - t);
            const x_rows = job.x + t * job.x_row_bytes;
            const w_rows = rows_at;
            const y_first = job.y + t * job.n_out + row_begin;
            if (job.tables) |tables| {
                tables.dot_multi(job.n_in, w_rows, job.w_row_bytes, row_end - row_begin, x_rows, job.x_row_bytes,
                    job.tables_at + t * job.tables_row_bytes, job.tables_row_bytes, n_rows, y_first, job.n_out);
            } else {
                dot_multi(job.n_in, w_rows, job.w_row_bytes, row_end - row_begin, x_rows, job.x_row_bytes, n_rows, y_first, job.n_out);
            }
        }
        return;
    }
    for (0..job.n_tok) |t| {
        const x_row = job.x + t * job.x_row_bytes;
        const y_row = job.y + t * job.n_out;
        const w_rows = job.w + row_begin * job.w_row_bytes;
        job.dot_rows(job.n_in, w_rows, job.w_row_bytes, row_end - row_begin, x_row, y_row + row_begin);
    }
}

const QuantizeJob = struct {
    quantize: types.QuantizeFn,
    x: [*]const f32,
    n_in: usize,
    dst: [*]u8,
    dst_row_bytes: usize,
    tables: ?*const types.ActivationTables = null,
    tables_dst: [*]u8 = undefined,
    tables_row_bytes: usize = 0,
};

fn runQuantizeTask(job: *const QuantizeJob, t: usize) void {
    const row = job.dst + t * job.dst_row_bytes;
    job.quantize(job.x + t * job.n_in, row, job.n_in);
    if (job.tables) |tables| tables.fill(row, job.n_in, job.tables_dst + t * job.tables_row_bytes);
}

pub const Error = error{ OutOfMemory, Unsupported };

/// Computes y (n_tok x n_out) = x (n_tok x n_in) times W^T. The caller has validated the shapes:
/// n_in is a multiple of the weight and activation block sizes and the buffers are that large.
pub fn matmul(
    w: [*]const u8,
    w_traits: *const types.Traits,
    n_out: usize,
    n_in: usize,
    x: [*]const f32,
    n_tok: usize,
    y: [*]f32,
) Error!void {
    if (n_out == 0 or n_tok == 0) return;
    const dot_rows = w_traits.dot_rows orelse return error.Unsupported;
    const act = types.get(@intFromEnum(w_traits.vec_dot_type)) orelse return error.Unsupported;
    std.debug.assert(n_in % w_traits.block_values == 0 and n_in % act.block_values == 0);
    const row_group: usize = w_traits.row_group;
    std.debug.assert(n_out % row_group == 0);

    scratch_mutex.lock();
    defer scratch_mutex.unlock();

    // Batches of a layout that computes them on its base format's rows: that format's kernel,
    // and its tables of the activations, made here with them once a call (not once a task).
    const batch = if (n_tok > 1) w_traits.batch_format orelse w_traits else w_traits;
    const tables = if (n_tok > 1 and act.id != .f32) batch.activation_tables else null;

    var x_act: [*]const u8 = @ptrCast(x);
    const x_row_bytes = act.rowBytes(n_in);
    var tables_at: [*]u8 = undefined;
    const tables_row_bytes = if (tables) |tb| tb.row_bytes(n_in) else 0;
    if (act.id != .f32) {
        const tables_offset = std.mem.alignForward(usize, n_tok * x_row_bytes, 64);
        const buf = try ensureScratch(tables_offset + n_tok * tables_row_bytes);
        tables_at = buf.ptr + tables_offset;
        const qjob = QuantizeJob{
            .quantize = act.quantize_activation.?,
            .x = x,
            .n_in = n_in,
            .dst = buf.ptr,
            .dst_row_bytes = x_row_bytes,
            .tables = tables,
            .tables_dst = tables_at,
            .tables_row_bytes = tables_row_bytes,
        };
        if (n_tok == 1) runQuantizeTask(&qjob, 0) else threads.run(n_tok, &qjob, runQuantizeTask);
        x_act = buf.ptr;
    }

    const w_row_bytes = w_traits.rowBytes(n_in);
    const n_threads = threads.threadCount();
    const per_thread: usize = if (n_tok == 1 and n_threads >= one_task_per_thread_from) 1 else tasks_per_thread;
    const n_tasks_balanced = n_threads * per_thread;
    const balanced_rows = std.math.divCeil(usize, n_out, n_tasks_balanced) catch unreachable;
    const rows_ungrouped = if (n_tok == 1)
        balanced_rows
    else
        @max(1, @min(balanced_rows, tile_bytes_multi_token / w_row_bytes));
    // Batched kernels take weight rows in pairs (q8_0.dotRowsMultiSigned) or tiles
    // (q8_0_tiles.zig): tasks of whole ones.
    const rows_per_task = std.mem.alignForward(usize, rows_ungrouped, if (n_tok > 1) @max(row_group, batch.batch_row_group) else row_group);
    const job = Job{
        .w = w,
        .w_row_bytes = w_row_bytes,
        .dot_rows = dot_rows,
        .dot_multi = if (n_tok > 1) batch.dot_multi else null,
        .unpack_rows = if (n_tok > 1) w_traits.unpack_rows else null,
        .multi_rows = batch.multi_rows,
        .n_out = n_out,
        .n_in = n_in,
        .x = x_act,
        .x_row_bytes = x_row_bytes,
        .n_tok = n_tok,
        .y = y,
        .rows_per_task = rows_per_task,
        .tables = tables,
        .tables_at = tables_at,
        .tables_row_bytes = tables_row_bytes,
    };
    threads.run(std.math.divCeil(usize, n_out, rows_per_task) catch unreachable, &job, runTask);
}

const RepackJob = struct {
    type_id: u32,
    src: [*]const u8,
    dst: [*]u8,
    n_out: usize,
    n_in: usize,
    row_bytes: usize,
    rows_per_task: usize,
};

fn runRepackTask(job: *const RepackJob, task: usize) void {
    const first = task * job.rows_per_task;
    const rows = @min(job.rows_per_task, job.n_out - first);
    const at = first * job.row_bytes;
    types.repack(job.type_id, job.src + at, rows, job.n_in, job.dst + at);
}

/// types.repack across the thread pool: each group of eight rows is independent and lands at its
/// rows' own offset, so tasks of whole groups write disjoint bytes with the same result. Spread
/// over the threads, the copy's pages are first touched by the pool (on a machine of several
/// memory nodes, near the threads that read them) and a large model repacks in a fraction of
/// the time.
pub fn repackParallel(type_id: u32, src: [*]const u8, n_out: usize, n_in: usize, dst: [*]u8) void {
    const traits = types.get(type_id).?;
    const n_tasks_balanced = threads.threadCount() * tasks_per_thread;
    const rows_per_task = std.mem.alignForward(usize, std.math.divCeil(usize, n_out, n_tasks_balanced) catch unreachable, 8);
    const job = RepackJob{
        .type_id = type_id,
        .src = src,
        .dst = dst,
        .n_out = n_out,
        .n_in = n_in,
        .row_bytes = traits.rowBytes(n_in),
        .rows_per_task = rows_per_task,
    };
    threads.run(std.math.divCeil(usize, n_out, rows_per_task) catch unreachable, &job, runRepackTask);
}

const simd = @import("../quant/simd.zig");

test "matmul over repacked Q4_0, Q8_0 and Q4_K equals matmul over the rows as stored, bit for bit" {
    const alloc = std.testing.allocator;
    var rng = simd.TestRng.init(91);
    for ([_]types.TypeId{ .q4_0, .q8_0, .q4_k }) |type_id| {
        for ([_]usize{ 8, 24, 200 }) |n_out| {
            const q4 = types.get(@intFromEnum(type_id)).?;
            for ([_]usize{ 1, 2, 5, 9 }) |n_tok| {
                const n_in: usize = if (type_id == .q4_k) 512 else 96;
                const w = try alloc.alloc(u8, n_out * q4.rowBytes(n_in));
                defer alloc.free(w);
                const wf = try alloc.alloc(f32, n_in);
                defer alloc.free(wf);
                for (0..n_out) |o| {
                    rng.floats(wf, 1);
                    q4.quantize_ref.?(wf.ptr, w[o * q4.rowBytes(n_in) ..].ptr, n_in);
                }
                const repacked_traits = types.repackedType(@intFromEnum(type_id), n_out).?;
                const w_packed = try alloc.alloc(u8, w.len);
                defer alloc.free(w_packed);
                types.repack(@intFromEnum(type_id), w.ptr, n_out, n_in, w_packed.ptr);
                if (n_tok == 1) {
                    // The pool's repack writes the same bytes as the serial one.
                    const w_parallel = try alloc.alloc(u8, w.len);
                    defer alloc.free(w_parallel);
                    for ([_]usize{ 1, 3 }) |n_threads| {
                        try threads.setThreadCount(n_threads);
                        @memset(w_parallel, 0xa5);
                        repackParallel(@intFromEnum(type_id), w.ptr, n_out, n_in, w_parallel.ptr);
                        try std.testing.expectEqualSlices(u8, w_packed, w_parallel);
                    }
                }
                const x = try alloc.alloc(f32, n_tok * n_in);
                defer alloc.free(x);
                rng.floats(x, 2);
                const y = try alloc.alloc(f32, n_tok * n_out);
                defer alloc.free(y);
                const y_packed = try alloc.alloc(f32, n_tok * n_out);
                defer alloc.free(y_packed);
                try matmul(w.ptr, q4, n_out, n_in, x.ptr, n_tok, y.ptr);
                try matmul(w_packed.ptr, repacked_traits, n_out, n_in, x.ptr, n_tok, y_packed.ptr);
                try std.testing.expectEqualSlices(u32, std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(y)), std.mem.bytesAsSlice(u32, std.mem.sliceAsBytes(y_packed)));
            }
        }
    }
}

test "matmul matches per-row dequantized dots for every weight type" {
    const alloc = std.testing.allocator;
    var rng = simd.TestRng.init(77);
    const ids = [_]u32{ 0, 1, 30, 2, 6, 8, 12, 13, 14 };
    for (ids) |id| {
        const t = types.get(id).?;
        const n_in: usize = 512;
        for ([_]usize{ 1, 7, 33 }) |n_out| {
            for ([_]usize{ 1, 3 }) |n_tok| {
                const w_bytes = try alloc.alloc(u8, n_out * t.rowBytes(n_in));
                defer alloc.free(w_bytes);
                // Quantize random weights with the reference quantizer where there is one,
                // else random bytes with small positive scales written into each block.
                const wf = try alloc.alloc(f32, n_out * n_in);
                defer alloc.free(wf);
                rng.floats(wf, 1);
                if (t.quantize_ref) |q| {
                    for (0..n_out) |o| {
                        q(wf[o * n_in ..].ptr, w_bytes[o * t.rowBytes(n_in) ..].ptr, n_in);
                    }
                } else {
                    rng.bytes(w_bytes);
                    var off: usize = 0;
                    while (off < w_bytes.len) : (off += t.block_bytes) {
                        const d_at = if (t.id == .q6_k) off + 208 else off;
                        std.mem.writeInt(u16, w_bytes[d_at..][0..2], 0x1800, .little); // d = 2^-9
                        if (t.id == .q6_k) continue;
                        std.mem.writeInt(u16, w_bytes[off + 2 ..][0..2], 0x1400, .little);
                    }
                }
                const x = try alloc.alloc(f32, n_tok * n_in);
                defer alloc.free(x);
                rng.floats(x, 2);
                const y = try alloc.alloc(f32, n_tok * n_out);
                defer alloc.free(y);
                try matmul(w_bytes.ptr, t, n_out, n_in, x.ptr, n_tok, y.ptr);

                const w_row = try alloc.alloc(f32, n_in);
                defer alloc.free(w_row);
                for (0..n_out) |o| {
                    t.dequantize_row.?(w_bytes[o * t.rowBytes(n_in) ..].ptr, w_row.ptr, n_in);
                    for (0..n_tok) |tok| {
                        var want: f64 = 0;
                        var magnitude: f64 = 0;
                        for (w_row, x[tok * n_in ..][0..n_in]) |a, b| {
                            want += @as(f64, a) * b;
                            magnitude += @abs(@as(f64, a) * b);
                        }
                        // Activation quantization (8-bit: <~1% of sum |w x|; f16/bf16 less).
                        const got = y[tok * n_out + o];
                        const tolerance = 0.02 * magnitude + 1e-6;
                        try std.testing.expectApproxEqAbs(want, @as(f64, got), tolerance);
                    }
                }
            }
        }
    }
}
