//! The core of the C surface: the library's version and last error, its settings, the mapping
//! of model files and the huge-page regions of repacked weights.
const std = @import("std");
const status = @import("../status.zig");
const file_map = @import("../file_map.zig");
const abi = @import("../abi.zig");
const settings = @import("../settings.zig");
const pages = @import("../pages.zig");

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

test {
    _ = pages;
    _ = file_map;
    _ = status;
}
