//! A persistent thread pool: workers are spawned once (or when the thread count changes) and
//! woken per parallel op through a futex, so an op costs no allocation and no thread creation.
//! The calling thread runs tasks too. Tasks are claimed one at a time from an atomic word that
//! holds (generation << 32 | next task), so uneven tasks balance themselves, and the caller waits
//! only for tasks to finish, never for a worker to wake up: on a busy machine a descheduled worker
//! simply claims nothing. One op runs at a time (a mutex serialises callers); tasks must not call
//! parallelFor themselves.
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
    n_tasks: std.atomic.Value(u32) = .init(0),
};

const Pool = struct {
    mutex: std.Thread.Mutex = .{},
    workers: [threads_max - 1]std.Thread = undefined,
    n_workers: usize = 0,
    started: bool = false,
    stop: std.atomic.Value(bool) = .init(false),

    jobs: [2]JobSlot = .{ .{}, .{} },
    generation: u32 = 0, // written by the caller only (under the mutex)
    /// (generation << 32) | next task index: a task is claimed by CAS on this word.
    claim: std.atomic.Value(u64) = .init(0),
    /// Tasks finished in the current generation; the caller sleeps on it.
    done: std.atomic.Value(u32) = .init(0),
    /// The generation workers should run: the futex they sleep on.
    wake_generation: std.atomic.Value(u32) = .init(0),
    sleepers: std.atomic.Value(u32) = .init(0),
};

var pool: Pool = .{};

/// Claims and runs tasks of generation `gen` until none are left (or a newer op began).
fn participate(gen: u32) void {
    var word = pool.claim.load(.acquire);
    const slot = &pool.jobs[gen & 1];
    // Read after an acquire load that saw `gen`: the slot holds gen's job, unless a newer
    // generation was published since, in which case every CAS below fails and nothing runs.
    const func: TaskFn = @ptrFromInt(slot.func.load(.monotonic));
    const ctx: *const anyopaque = @ptrFromInt(slot.ctx.load(.monotonic));
    const n_tasks = slot.n_tasks.load(.monotonic);
    while (true) {
        const task: u32 = @truncate(word);
        if (@as(u32, @intCast(word >> 32)) != gen or task >= n_tasks) return;
        if (pool.claim.cmpxchgWeak(word, word + 1, .acq_rel, .acquire)) |actual| {
            word = actual;
            continue;
        }
        func(ctx, task);
        if (pool.done.fetchAdd(1, .acq_rel) + 1 == n_tasks) Futex.wake(&pool.done, 1);
        word = pool.claim.load(.acquire);
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
        participate(seen);
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
            Futex.wait(&pool.done, finished);
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
    std.debug.assert(n_tasks <= std.math.maxInt(u32));
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
    slot.n_tasks.store(@intCast(n_tasks), .monotonic);
    pool.done.store(0, .monotonic);
    pool.claim.store(@as(u64, gen) << 32, .release);
    wakeWorkers(gen);
    participate(gen);
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

test "parallelFor runs every task exactly once, for several thread counts" {
    const Counter = struct {
        hits: [1000]std.atomic.Value(u32),
        fn task(self: *@This(), i: usize) void {
            _ = self.hits[i].fetchAdd(1, .monotonic);
        }
    };
    var counter: Counter = undefined;
    for ([_]usize{ 1, 2, 3, 0 }) |threads| {
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
