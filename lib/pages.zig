//! Anonymous memory for what the kernels stream through on every token: the repacked weights
//! (ts/backend/arena.ts says why not the KV caches). Regions are aligned to 2 MiB and, on Linux, advised into transparent huge pages
//! (MADV_HUGEPAGE; this machine's default is "madvise", so nothing is huge unless asked). With
//! 4 KiB pages a read stream crosses a page every 64 cache lines, where the hardware prefetcher
//! stops and the TLB misses: two cores read 21.8 GB/s from 4 KiB pages and 29-30 GB/s from huge
//! ones (AVX-512 loads over 512 MiB). Elsewhere the advice is skipped and pages are the system's;
//! the huge_pages setting (lib/abi.zig Settings; INFER_HUGE_PAGES=0) skips it too (to compare, or
//! where huge pages cost more than they give).
const std = @import("std");
const builtin = @import("builtin");
const settings = @import("settings.zig");

pub const huge_bytes = 2 << 20;

/// Whole huge pages covering `bytes`.
pub fn roundedSize(bytes: usize) usize {
    return std.mem.alignForward(usize, @max(bytes, 1), huge_bytes);
}

/// Zeroed memory of roundedSize(bytes), aligned to 2 MiB; free with free(ptr, bytes).
pub fn alloc(bytes: usize) error{OutOfMemory}![]align(huge_bytes) u8 {
    const size = roundedSize(bytes);
    // Over-map by one huge page and trim both ends to the aligned middle.
    const mapped = std.posix.mmap(null, size + huge_bytes, std.posix.PROT.READ | std.posix.PROT.WRITE, .{ .TYPE = .PRIVATE, .ANONYMOUS = true }, -1, 0) catch
        return error.OutOfMemory;
    const start = std.mem.alignForward(usize, @intFromPtr(mapped.ptr), huge_bytes);
    const head = start - @intFromPtr(mapped.ptr);
    if (head > 0) std.posix.munmap(@alignCast(mapped[0..head]));
    const tail = huge_bytes - head;
    if (tail > 0) std.posix.munmap(@alignCast(mapped[head + size ..][0..tail]));
    const region: []align(huge_bytes) u8 = @as([*]align(huge_bytes) u8, @ptrFromInt(start))[0..size];
    if (builtin.os.tag == .linux and settings.current.huge_pages) {
        // Advice, not a requirement: where THP is off the region is ordinary memory.
        std.posix.madvise(region.ptr, region.len, std.posix.MADV.HUGEPAGE) catch {};
    }
    return region;
}

pub fn free(ptr: [*]align(huge_bytes) u8, bytes: usize) void {
    std.posix.munmap(ptr[0..roundedSize(bytes)]);
}

test "huge-page regions: aligned, zeroed, writable, freed" {
    for ([_]usize{ 1, 4096, huge_bytes, huge_bytes + 1, 5 * huge_bytes + 3 }) |bytes| {
        const region = try alloc(bytes);
        defer free(region.ptr, bytes);
        try std.testing.expectEqual(@as(usize, 0), @intFromPtr(region.ptr) % huge_bytes);
        try std.testing.expectEqual(roundedSize(bytes), region.len);
        try std.testing.expect(region.len >= bytes);
        for (region) |b| try std.testing.expectEqual(@as(u8, 0), b);
        @memset(region, 0xab);
        try std.testing.expectEqual(@as(u8, 0xab), region[region.len - 1]);
    }
}
