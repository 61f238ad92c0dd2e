//! The only exported surface of libinfer. Every function is C-ABI, named infer_<area>_<verb>,
//! takes plain types, and returns an i32 Status where it can fail (message: infer_last_error).
//! ts/native/symbols.gen.ts is generated from the `export fn` lines of this file
//! (bun ts/native/gen-symbols.ts), so the two sides cannot drift.
const std = @import("std");
const status = @import("status.zig");
const file_map = @import("file_map.zig");

pub const version: u32 = 1;

export fn infer_version() u32 {
    return version;
}

export fn infer_last_error() [*:0]const u8 {
    return status.lastError();
}

// ---- files ---------------------------------------------------------------------------------

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

// ---- quant formats, matmul, threads (lib/quant/, lib/cpu/matmul.zig, lib/cpu/threads.zig) ------
// (kernels helper section: begin)
// (kernels helper section: end)

// ---- f32 ops: norm, rope, attention, activations (lib/cpu/*.zig) ----------------------------
// (ops helper section: begin)
// (ops helper section: end)

test {
    std.testing.refAllDecls(@This());
    _ = status;
    _ = file_map;
}
