//! The Metal backend's part of the C surface (lib/metal/: the Objective-C runtime loaded at run
//! time, kernels compiled from shaders/metal/). Only macOS builds compile the host code;
//! elsewhere every call fails with `unsupported` and "Metal not available: ...". Buffer handles
//! and CPU addresses cross the C ABI as u64.
const metal = if (@import("builtin").os.tag == .macos) @import("../metal/metal.zig") else @import("../metal/unavailable.zig");

/// Takes the default device and compiles `source`, one pipeline per newline-separated kernel name.
export fn infer_metal_init(source: [*]const u8, source_len: usize, names: [*]const u8, names_len: usize, out_count: *u32) i32 {
    return metal.init(source[0..source_len], names[0..names_len], out_count);
}

export fn infer_metal_device_name(out: [*]u8, len: usize) i32 {
    return metal.deviceName(out, len);
}

/// out: maxBufferLength, recommendedMaxWorkingSetSize, maxThreadgroupMemoryLength,
/// hasUnifiedMemory (0/1).
export fn infer_metal_device_limits(out: *[4]u64) i32 {
    return metal.deviceLimits(out);
}

/// A shared buffer; out: its handle and the CPU address of its contents.
export fn infer_metal_buffer_new(bytes: u64, out_handle: *u64, out_contents: *u64) i32 {
    return metal.bufferNew(bytes, out_handle, out_contents);
}

/// A buffer over page-aligned native memory (the mmap'd model), without a copy.
export fn infer_metal_buffer_wrap(address: u64, bytes: u64, out_handle: *u64) i32 {
    return metal.bufferWrap(address, bytes, out_handle);
}

export fn infer_metal_buffer_free(handle: u64) void {
    metal.bufferFree(handle);
}

/// One dispatch into the step's command buffer: dims = grid (3) and threadgroup (3); bindings =
/// (handle, offset) per buffer index; args copied with setBytes at args_index.
export fn infer_metal_encode(pipeline: u32, dims: *const [6]u32, threadgroup_bytes: u32, bindings: [*]const u64, n_bindings: u32, args: [*]const u8, args_len: u32, args_index: u32) i32 {
    return metal.encode(pipeline, dims, threadgroup_bytes, bindings, n_bindings, args, args_len, args_index);
}

/// A buffer barrier in the step's concurrent encoder: what follows sees what came before.
export fn infer_metal_barrier() i32 {
    return metal.barrier();
}

/// Commits the step's command buffer and waits for it.
export fn infer_metal_flush() i32 {
    return metal.flush();
}

test {
    _ = metal;
    _ = @import("../metal/blocks_test.zig");
}