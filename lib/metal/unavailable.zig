//! The Metal backend's entry points where there is no Metal (every target but macOS): each
//! reports `unsupported`, so a Linux library carries none of lib/metal/metal.zig.
const status = @import("../status.zig");

fn unavailable() i32 {
    return status.fail(.unsupported, "Metal not available: the Metal backend runs on macOS (Apple silicon) only", .{});
}

pub fn init(source: []const u8, names: []const u8, out_count: *u32) i32 {
    _ = .{ source, names };
    out_count.* = 0;
    return unavailable();
}

pub fn deviceName(out: [*]u8, len: usize) i32 {
    _ = .{ out, len };
    return unavailable();
}

pub fn deviceLimits(out: *[4]u64) i32 {
    out.* = .{ 0, 0, 0, 0 };
    return unavailable();
}

pub fn bufferNew(bytes: u64, out_handle: *u64, out_contents: *u64) i32 {
    _ = .{ bytes, out_handle, out_contents };
    return unavailable();
}

pub fn bufferWrap(address: u64, bytes: u64, out_handle: *u64) i32 {
    _ = .{ address, bytes, out_handle };
    return unavailable();
}

pub fn bufferFree(handle: u64) void {
    _ = handle;
}

pub fn encode(
    pipeline: u32,
    dims: *const [6]u32,
    threadgroup_bytes: u32,
    bindings: [*]const u64,
    n_bindings: u32,
    args: [*]const u8,
    args_len: u32,
    args_index: u32,
) i32 {
    _ = .{ pipeline, dims, threadgroup_bytes, bindings, n_bindings, args, args_len, args_index };
    return unavailable();
}

pub fn barrier() i32 {
    return unavailable();
}

pub fn flush() i32 {
    return unavailable();
}
