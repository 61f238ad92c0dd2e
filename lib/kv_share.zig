//! Copy-on-write sharing of KV cache rows between sequences (ts/backend/cpu.ts KvBlockStore,
//! ts/engine/prefix-cache.ts). The prefix cache's blocks live in one memory file (memfd), mapped
//! shared where the cache writes them. A sequence's full-attention layers are page-aligned
//! anonymous regions; handing a sequence a cached block maps the block's pages over its rows
//! privately (MAP_PRIVATE | MAP_FIXED): every sequence reads the same physical pages, and the
//! first write to one gives the writer its own copy of that page (the kernel's copy-on-write),
//! so the attention kernels keep reading contiguous rows and never know. Before the cache
//! rewrites a block, detach() gives each sequence mapping it private copies of the pages it has
//! not written yet: a private mapping may otherwise see later writes to the file.
//! Linux only (memfd); elsewhere open() fails and the prefix cache copies rows as before.
const std = @import("std");
const builtin = @import("builtin");

pub const supported = builtin.os.tag == .linux;

pub fn pageBytes() usize {
    return std.heap.pageSize();
}

/// Zeroed anonymous memory, page-aligned, in the system's ordinary pages (ts/backend/arena.ts
/// says why not huge ones for caches).
pub fn alloc(bytes: usize) error{OutOfMemory}![]align(std.heap.page_size_min) u8 {
    const size = std.mem.alignForward(usize, @max(bytes, 1), pageBytes());
    return std.posix.mmap(null, size, std.posix.PROT.READ | std.posix.PROT.WRITE, .{ .TYPE = .PRIVATE, .ANONYMOUS = true }, -1, 0) catch
        error.OutOfMemory;
}

pub fn free(address: usize, bytes: usize) void {
    const size = std.mem.alignForward(usize, @max(bytes, 1), pageBytes());
    const ptr: [*]align(std.heap.page_size_min) u8 = @ptrFromInt(address);
    std.posix.munmap(ptr[0..size]);
}

pub const Store = struct { fd: i32, bytes: []align(std.heap.page_size_min) u8 };

/// A memory file of `bytes` (sparse: pages take memory when first written), mapped shared.
pub fn open(bytes: usize) error{ Unsupported, OutOfMemory }!Store {
    if (!supported) return error.Unsupported;
    const size = std.mem.alignForward(usize, @max(bytes, 1), pageBytes());
    const fd = std.posix.memfd_create("infer-kv-blocks", std.os.linux.MFD.CLOEXEC) catch return error.OutOfMemory;
    errdefer std.posix.close(fd);
    std.posix.ftruncate(fd, size) catch return error.OutOfMemory;
    const mapped = std.posix.mmap(null, size, std.posix.PROT.READ | std.posix.PROT.WRITE, .{ .TYPE = .SHARED }, fd, 0) catch
        return error.OutOfMemory;
    return .{ .fd = fd, .bytes = mapped };
}

pub fn close(store: Store) void {
    std.posix.munmap(store.bytes);
    std.posix.close(store.fd);
}

fn aligned(x: usize) bool {
    return x % pageBytes() == 0;
}

/// Maps bytes offset .. offset + len of the store's file over address .. address + len,
/// privately. On failure the range is anonymous memory again (what it holds is then undefined:
/// the caller copies the rows instead).
pub fn map(address: usize, len: usize, fd: i32, offset: usize) error{ Misaligned, MapFailed }!void {
    if (!aligned(address) or !aligned(len) or !aligned(offset) or len == 0) return error.Misaligned;
    const hint: [*]align(std.heap.page_size_min) u8 = @ptrFromInt(address);
    const prot = std.posix.PROT.READ | std.posix.PROT.WRITE;
    _ = std.posix.mmap(hint, len, prot, .{ .TYPE = .PRIVATE, .FIXED = true }, fd, offset) catch {
        // A failed MAP_FIXED may have unmapped the range already: put ordinary memory back.
        _ = std.posix.mmap(hint, len, prot, .{ .TYPE = .PRIVATE, .ANONYMOUS = true, .FIXED = true }, -1, 0) catch
            @panic("kv_share: cannot restore a KV cache range after a failed mapping");
        return error.MapFailed;
    };
}

/// Gives address .. address + len (a mapped range) private copies of the pages not written yet,
/// by writing each page's first byte back to it, so the file's later contents stay out of it.
pub fn detach(address: usize, len: usize) void {
    var page = address - address % pageBytes();
    while (page < address + len) : (page += pageBytes()) {
        const byte: *volatile u8 = @ptrFromInt(page);
        byte.* = byte.*;
    }
}

test "a block mapped into two regions: shared until written, detached before the file changes" {
    if (!supported) return error.SkipZigTest;
    const page = pageBytes();
    const store = try open(4 * page);
    defer close(store);
    @memset(store.bytes[page .. 2 * page], 7);
    const a = try alloc(3 * page);
    defer free(@intFromPtr(a.ptr), a.len);
    const b = try alloc(3 * page);
    defer free(@intFromPtr(b.ptr), b.len);
    try map(@intFromPtr(a.ptr) + page, page, store.fd, page);
    try map(@intFromPtr(b.ptr) + page, page, store.fd, page);
    try std.testing.expectEqual(@as(u8, 7), a[page + 5]);
    a[page + 5] = 9; // a's own copy now
    try std.testing.expectEqual(@as(u8, 7), b[page + 5]);
    try std.testing.expectEqual(@as(u8, 7), store.bytes[page + 5]);
    detach(@intFromPtr(b.ptr) + page, page);
    @memset(store.bytes[page .. 2 * page], 1); // the block is reused
    try std.testing.expectEqual(@as(u8, 7), b[page + 100]);
    try std.testing.expectEqual(@as(u8, 9), a[page + 5]);
    try std.testing.expectError(error.Misaligned, map(@intFromPtr(a.ptr) + 1, page, store.fd, 0));
}
