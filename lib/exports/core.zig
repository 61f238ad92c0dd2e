//! The core of the C surface: the library's version and last error, its settings, the mapping
//! of model files and the huge-page regions of repacked weights.
const std = @import("std");
const status = @import("../status.zig");
const file_map = @import("../file_map.zig");
const abi = @import("../abi.zig");
const settings = @import("../settings.zig");
const pages = @import("../pages.zig");
const kv_share = @import("../kv_share.zig");

pub const version: u32 = 1;

export fn infer_version() u32 {
    return version;
}

export fn infer_last_error() [*:0]const u8 {
    return status.lastError();
}

/// Takes the library's settings (lib/abi.zig Settings). The host calls it once, right after
/// loading the library and before any other call; until then the struct's defaults hold.
export fn infer_configure(s: *const abi.Settings) i32 {
    if (s.cublas_path_len >= abi.Settings.path_bytes_max)
        return status.fail(.invalid_argument, "configure: a cuBLAS path of {d} bytes", .{s.cublas_path_len});
    settings.current = s.*;
    return 0;
}

/// Maps `path` read-only. Out: an opaque handle for infer_file_close, the base address, the size.
export fn infer_file_open(
    path_ptr: [*]const u8,
    path_len: usize,
    out_handle: *?*anyopaque,
    out_base: *?[*]const u8,
    out_len: *u64,
) i32 {
    const mapping = std.heap.c_allocator.create(file_map.Mapping) catch
        return status.fail(.out_of_memory, "out of memory", .{});
    const rc = file_map.open(path_ptr[0..path_len], mapping);
    if (rc != 0) {
        std.heap.c_allocator.destroy(mapping);
        return rc;
    }
    out_handle.* = mapping;
    out_base.* = mapping.bytes.ptr;
    out_len.* = mapping.bytes.len;
    return 0;
}

export fn infer_file_close(handle: ?*anyopaque) void {
    const mapping: *file_map.Mapping = @ptrCast(@alignCast(handle orelse return));
    file_map.close(mapping.*);
    std.heap.c_allocator.destroy(mapping);
}

/// Drops the whole pages of bytes [offset, offset + len) of a mapping from infer_file_open from
/// the process's memory once their bytes live elsewhere (a repacked weight); reads fault them back.
export fn infer_file_release(handle: ?*anyopaque, offset: u64, len: u64) i32 {
    const mapping: *file_map.Mapping = @ptrCast(@alignCast(handle orelse
        return status.fail(.invalid_argument, "release: no mapping", .{})));
    return file_map.release(mapping.*, @intCast(offset), @intCast(len));
}

/// Zeroed anonymous memory for weights and caches read on every token: 2 MiB-aligned, in huge
/// pages where the system allows (lib/pages.zig). out[0] = its address; free with
/// infer_pages_free and the same byte count.
export fn infer_pages_alloc(bytes: u64, out: *u64) i32 {
    if (bytes == 0 or bytes > 1 << 46) return status.fail(.invalid_argument, "pages_alloc: {d} bytes", .{bytes});
    const region = pages.alloc(@intCast(bytes)) catch
        return status.fail(.out_of_memory, "cannot map {d} bytes", .{bytes});
    out.* = @intFromPtr(region.ptr);
    return 0;
}

export fn infer_pages_free(address: u64, bytes: u64) void {
    if (address == 0 or address % pages.huge_bytes != 0) return;
    pages.free(@ptrFromInt(address), @intCast(bytes));
}

/// The system's page size: the granularity at which KV cache rows can be shared (lib/kv_share.zig).
export fn infer_kv_pages_size() u64 {
    return kv_share.pageBytes();
}

/// Zeroed anonymous memory for a KV cache layer whose rows may be shared: page-aligned, ordinary
/// pages. out[0] = its address; free with infer_kv_pages_free and the same byte count.
export fn infer_kv_pages_alloc(bytes: u64, out: *u64) i32 {
    if (bytes == 0 or bytes > 1 << 46) return status.fail(.invalid_argument, "kv_pages_alloc: {d} bytes", .{bytes});
    const region = kv_share.alloc(@intCast(bytes)) catch
        return status.fail(.out_of_memory, "cannot map {d} bytes", .{bytes});
    out.* = @intFromPtr(region.ptr);
    return 0;
}

export fn infer_kv_pages_free(address: u64, bytes: u64) void {
    if (address == 0 or address % kv_share.pageBytes() != 0) return;
    kv_share.free(@intCast(address), @intCast(bytes));
}

/// The prefix cache's block storage: a memory file of `bytes`, mapped shared. out[0] = its file
/// descriptor, out[1] = the address. Fails with unsupported outside Linux.
export fn infer_kv_share_open(bytes: u64, out: *[2]u64) i32 {
    if (bytes == 0 or bytes > 1 << 46) return status.fail(.invalid_argument, "kv_share_open: {d} bytes", .{bytes});
    const store = kv_share.open(@intCast(bytes)) catch |err| return switch (err) {
        error.Unsupported => status.fail(.unsupported, "shared KV blocks need Linux (memfd)", .{}),
        error.OutOfMemory => status.fail(.out_of_memory, "cannot make a shared KV store of {d} bytes", .{bytes}),
    };
    out[0] = @intCast(store.fd);
    out[1] = @intFromPtr(store.bytes.ptr);
    return 0;
}

export fn infer_kv_share_close(fd: i32, address: u64, bytes: u64) void {
    if (address == 0 or address % kv_share.pageBytes() != 0) return;
    const size = std.mem.alignForward(usize, @intCast(bytes), kv_share.pageBytes());
    const ptr: [*]align(std.heap.page_size_min) u8 = @ptrFromInt(@as(usize, @intCast(address)));
    kv_share.close(.{ .fd = fd, .bytes = ptr[0..size] });
}

/// Maps `bytes` of the store's file at `offset` over `address` copy-on-write (lib/kv_share.zig).
/// Fails (the range then anonymous, its contents undefined) where unaligned or the map fails.
export fn infer_kv_share_map(address: u64, bytes: u64, fd: i32, offset: u64) i32 {
    kv_share.map(@intCast(address), @intCast(bytes), fd, @intCast(offset)) catch |err| return switch (err) {
        error.Misaligned => status.fail(.invalid_argument, "kv_share_map: a range not on page boundaries", .{}),
        error.MapFailed => status.fail(.out_of_memory, "kv_share_map: the system refused the mapping", .{}),
    };
    return 0;
}

/// Gives a mapped range private copies of the pages it has not written (before the file changes).
export fn infer_kv_share_detach(address: u64, bytes: u64) void {
    if (address == 0 or bytes == 0) return;
    kv_share.detach(@intCast(address), @intCast(bytes));
}

test {
    _ = pages;
    _ = kv_share;
    _ = file_map;
    _ = status;
}
