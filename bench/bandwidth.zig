//! The memory read bandwidth probe of bench/bandwidth.ts, a library of its own beside libinfer
//! (zig-out/lib/libbench-bandwidth.so, built by build.zig with the library's thread pool,
//! lib/cpu/threads.zig): it is a measurement, not part of the inference surface.
const std = @import("std");
const pool = @import("threads");

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
export fn bench_read(buf: [*]const u8, len: u64, threads: u32) f64 {
    if (threads > pool.threads_max) return -1;
    if (threads > 0) pool.setThreadCount(threads) catch return -1;
    const n_tasks: usize = 64;
    var partial: [n_tasks]u64 = @splat(0);
    const n: usize = @intCast(len);
    // 4 KiB-aligned chunks so that no two tasks share a page.
    const chunk = std.mem.alignForward(usize, (n + n_tasks - 1) / n_tasks, 4096);
    if (chunk == 0) return 0;
    const ctx: BenchRead = .{ .base = buf, .len = n, .chunk = chunk, .partial = &partial };
    pool.run((n + chunk - 1) / chunk, &ctx, BenchRead.task);
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
        try std.testing.expectEqual(@as(f64, @floatFromInt(expect)), bench_read(bytes, @sizeOf(@TypeOf(words)), threads));
    }
    const small = [_]u8{ 1, 2, 3, 250 };
    try std.testing.expectEqual(@as(f64, 256), bench_read(&small, small.len, 0));
    try std.testing.expectEqual(@as(f64, 0), bench_read(&small, 0, 0));
    try std.testing.expectEqual(@as(f64, -1), bench_read(&small, 1, 100_000));
}
