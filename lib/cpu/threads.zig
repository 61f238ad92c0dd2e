//! A persistent thread pool: workers are spawned once (or when the thread count changes) and
//! woken per parallel op through a futex, so an op costs no allocation and no thread creation.
//! The calling thread runs tasks too. Tasks are claimed one at a time from an atomic word that
//! holds the op's slot, task count and next task, so uneven tasks balance themselves, and the caller waits
//! only for tasks to finish, never for a worker to wake up: on a busy machine a descheduled worker
//! simply claims nothing. One op runs at a time (a mutex serialises callers); tasks must not call
//! parallelFor themselves.
//!
//! At 8-16 threads a decode step's few hundred ops make the pool's own cost visible, so: every
//! word that threads write sits on its own cache line (a claim does not evict the line the idle
//! workers poll, nor the caller's), a claim is one fetchAdd, finished tasks are counted once per
//! thread and op, workers and the caller spin before they sleep, and a
//! futex call is made only when someone sleeps (an op with everyone spinning makes no syscall).
const std = @import("std");
const Futex = std.Thread.Futex;

pub const TaskFn = *const fn (ctx: *const anyopaque, task: usize) void;

pub const threads_max = 256;
/// Busy-wait rounds before sleeping: decode issues ops back to back, and a futex wake-up
/// costs microseconds, so a worker keeps polling briefly after each op.
const spin_rounds = 20_000;

/// One op's description. Two slots alternate by generation, so a late worker reading the slot
/// of an old generation never sees it rewritten while that generation can still be claimed.
const JobSlot = struct {
    func: std.atomic.Value(usize) = .init(0),
    ctx: std.atomic.Value(usize) = .init(0),
};

const cache_line = std.atomic.cache_line;

const Pool = struct {
    mutex: std.Thread.Mutex = .{},
    workers: [threads_max - 1]std.Thread = undefined,
    n_workers: usize = 0,
    started: bool = false,
    stop: std.atomic.Value(bool) = .init(false),
    generation: u32 = 0, // written by the caller only (under the mutex)

    /// Written once per op by the caller, then only read.
    jobs: [2]JobSlot align(cache_line) = .{ .{}, .{} },
    /// (slot parity << 63) | (task count << 32) | next task index: a task is claimed by fetchAdd.
    claim: std.atomic.Value(u64) align(cache_line) = .init(0),
    /// Tasks finished in the current generation; the caller sleeps on it.
    done: std.atomic.Value(u32) align(cache_line) = .init(0),
    /// Set while the caller sleeps on `done`: only then does the last task's finisher wake it.
    caller_sleeps: std.atomic.Value(bool) align(cache_line) = .init(false),
    /// The generation workers should run: the futex they sleep on, polled by idle workers.
    wake_generation: std.atomic.Value(u32) align(cache_line) = .init(0),
    sleepers: std.atomic.Value(u32) align(cache_line) = .init(0),
};

var pool: Pool = .{};

/// Claims and runs tasks until none are left. A claim is one fetchAdd on `claim`, whose old value
/// says which job (the slot parity), how many tasks it has and which task this is; so a claim never
/// fails and retries (at 16 threads a CAS loop's failed attempts cost as much as the claims), and
/// a claim that lands on a newer op than the worker was woken for is a real task of that op.
/// Finished tasks are counted here and added to `done` once, when the claims run out: the op
/// cannot end before they are added, so every claim of this call is of the same op.
fn participate() void {
    var finished: u32 = 0;
    var op_tasks: u32 = 0;
    while (true) {
        const word = pool.claim.fetchAdd(1, .acq_rel);
        const task: u32 = @truncate(word);
        const n_tasks: u32 = @as(u31, @truncate(word >> 32));
        if (task >= n_tasks) break;
        // The caller wrote the slot before its release store of `claim`, which this acquire
        // RMW reads from; the slot is not rewritten before this task is counted done.
        const slot = &pool.jobs[word >> 63];
        const func: TaskFn = @ptrFromInt(slot.func.load(.monotonic));
        const ctx: *const anyopaque = @ptrFromInt(slot.ctx.load(.monotonic));
        func(ctx, task);
        finished += 1;
        op_tasks = n_tasks;
    }
    if (finished == 0) return;
    if (pool.done.fetchAdd(finished, .seq_cst) + finished == op_tasks and pool.caller_sleeps.load(.seq_cst)) {
        Futex.wake(&pool.done, 1);
    }
}

fn workerMain(first_seen: u32) void {
    var seen = first_seen;
    while (true) {
        var rounds: u32 = 0;
        while (pool.wake_generation.load(.acquire) == seen) {
            if (rounds < spin_rounds) {
                rounds += 1;
                std.atomic.spinLoopHint();
            } else {
                _ = pool.sleepers.fetchAdd(1, .seq_cst);
                Futex.wait(&pool.wake_generation, seen);
                _ = pool.sleepers.fetchSub(1, .seq_cst);
            }
        }
        seen = pool.wake_generation.load(.acquire);
        if (pool.stop.load(.acquire)) return;
        participate();
    }
}

/// Moves workers to generation `gen`.
fn wakeWorkers(gen: u32) void {
    pool.wake_generation.store(gen, .seq_cst);
    // A worker that registers as a sleeper after this load sees the new generation in
    // Futex.wait and does not sleep (both sides are seq_cst).
    if (pool.sleepers.load(.seq_cst) > 0) Futex.wake(&pool.wake_generation, std.math.maxInt(u32));
}

fn waitTasks(n_tasks: u32) void {
    var rounds: u32 = 0;
    while (true) {
        const finished = pool.done.load(.acquire);
        if (finished == n_tasks) return;
        if (rounds < spin_rounds) {
            rounds += 1;
            std.atomic.spinLoopHint();
        } else {
            // The finisher's fetchAdd and its load of caller_sleeps are seq_cst, as are this
            // store and the futex's compare: either it sees the flag, or the wait sees its count.
            pool.caller_sleeps.store(true, .seq_cst);
            Futex.wait(&pool.done, finished);
            pool.caller_sleeps.store(false, .seq_cst);
        }
    }
}

fn defaultThreadCount() usize {
    const n = std.Thread.getCpuCount() catch 1;
    return @max(1, @min(n, threads_max));
}

/// Joins the running workers and spawns `n_threads - 1` new ones. Caller holds the mutex.
fn restart(n_threads: usize) !void {
    if (pool.n_workers > 0) {
        pool.stop.store(true, .release);
        pool.generation +%= 1;
        wakeWorkers(pool.generation);
        for (pool.workers[0..pool.n_workers]) |t| t.join();
        pool.n_workers = 0;
        pool.stop.store(false, .release);
    }
    pool.started = true;
    for (0..n_threads - 1) |i| {
        const config: std.Thread.SpawnConfig = .{ .stack_size = 1 << 20 };
        pool.workers[i] = try std.Thread.spawn(config, workerMain, .{pool.generation});
        pool.n_workers = i + 1;
    }
}

/// Sets the number of threads ops use (the caller included); 0 means one per CPU.
pub fn setThreadCount(n: usize) !void {
    pool.mutex.lock();
    defer pool.mutex.unlock();
    const count = if (n == 0) defaultThreadCount() else @min(n, threads_max);
    if (pool.started and count == pool.n_workers + 1) return;
    try restart(count);
}

pub fn threadCount() usize {
    pool.mutex.lock();
    defer pool.mutex.unlock();
    return if (pool.started) pool.n_workers + 1 else defaultThreadCount();
}

/// Runs func(ctx, task) for every task in 0..n_tasks across the pool and returns when all
/// have finished. Starts the pool (one thread per CPU) on first use.
pub fn parallelFor(n_tasks: usize, ctx: *const anyopaque, func: TaskFn) void {
    if (n_tasks == 0) return;
    std.debug.assert(n_tasks <= std.math.maxInt(u31));
    pool.mutex.lock();
    defer pool.mutex.unlock();
    if (!pool.started) restart(defaultThreadCount()) catch {}; // too few threads: run inline
    if (pool.n_workers == 0 or n_tasks == 1) {
        for (0..n_tasks) |task| func(ctx, task);
        return;
    }
    const gen = pool.generation +% 1;
    pool.generation = gen;
    const slot = &pool.jobs[gen & 1];
    slot.func.store(@intFromPtr(func), .monotonic);
    slot.ctx.store(@intFromPtr(ctx), .monotonic);
    pool.done.store(0, .monotonic);
    pool.claim.store(@as(u64, gen & 1) << 63 | @as(u64, n_tasks) << 32, .release);
    wakeWorkers(gen);
    participate();
    waitTasks(@intCast(n_tasks));
}

/// Typed convenience: calls `func(context, task)` with `context` of any pointer type.
pub fn run(
    n_tasks: usize,
    context: anytype,
    comptime func: fn (@TypeOf(context), usize) void,
) void {
    const Wrapper = struct {
        fn call(ctx: *const anyopaque, task: usize) void {
            func(@ptrCast(@alignCast(@constCast(ctx))), task);
        }
    };
    parallelFor(n_tasks, @ptrCast(context), Wrapper.call);
}

/// Runs func(context, begin, end) over 0..n in ranges of whole `granule`s of at least
/// `min_items` items, one range per thread at most; inline where one range covers everything
/// (a decode step's row-sized ops, whose work is less than an op of the pool costs).
pub fn runRanges(
    n: usize,
    granule: usize,
    min_items: usize,
    context: anytype,
    comptime func: fn (@TypeOf(context), usize, usize) void,
) void {
    if (n == 0) return;
    const per_thread = std.math.divCeil(usize, n, threadCount()) catch unreachable;
    const chunk = std.mem.alignForward(usize, @max(min_items, per_thread, 1), granule);
    if (chunk >= n) return func(context, 0, n);
    const Ranges = struct {
        inner: @TypeOf(context),
        n: usize,
        chunk: usize,
        fn task(self: *const @This(), t: usize) void {
            const begin = t * self.chunk;
            func(self.inner, begin, @min(begin + self.chunk, self.n));
        }
    };
    const ranges: Ranges = .{ .inner = context, .n = n, .chunk = chunk };
    run(std.math.divCeil(usize, n, chunk) catch unreachable, &ranges, Ranges.task);
}

test "runRanges covers 0..n once, in whole granules" {
    const Cover = struct {
        hits: [5000]std.atomic.Value(u32),
        granule: usize,
        fn range(self: *@This(), begin: usize, end: usize) void {
            std.debug.assert(begin % self.granule == 0);
            for (begin..end) |i| _ = self.hits[i].fetchAdd(1, .monotonic);
        }
    };
    var cover: Cover = undefined;
    for ([_]usize{ 1, 3 }) |threads| {
        try setThreadCount(threads);
        for ([_]usize{ 1, 63, 64, 4999 }) |n| {
            for ([_]usize{ 1, 64 }) |granule| {
                for (&cover.hits) |*h| h.* = .init(0);
                cover.granule = granule;
                runRanges(n, granule, 100, &cover, Cover.range);
                for (cover.hits[0..n]) |*h| try std.testing.expectEqual(@as(u32, 1), h.load(.monotonic));
                for (cover.hits[n..]) |*h| try std.testing.expectEqual(@as(u32, 0), h.load(.monotonic));
            }
        }
    }
}

test "parallelFor runs every task exactly once, for several thread counts" {
    const Counter = struct {
        hits: [1000]std.atomic.Value(u32),
        fn task(self: *@This(), i: usize) void {
            _ = self.hits[i].fetchAdd(1, .monotonic);
        }
    };
    var counter: Counter = undefined;
    for ([_]usize{ 1, 2, 3, 8, 0 }) |threads| {
        try setThreadCount(threads);
        for ([_]usize{ 1, 2, 7, 1000 }) |n| {
            for (0..100) |_| {
                for (&counter.hits) |*h| h.* = .init(0);
                run(n, &counter, Counter.task);
                for (counter.hits[0..n]) |*h| {
                    try std.testing.expectEqual(@as(u32, 1), h.load(.monotonic));
                }
            }
        }
    }
    try std.testing.expect(threadCount() >= 1);
}
