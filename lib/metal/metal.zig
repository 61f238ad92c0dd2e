//! Host-side dispatch of the Metal backend (macOS builds only; lib/exports/metal.zig picks
//! unavailable.zig elsewhere, so none of this is in a Linux library): the system default device,
//! one command queue, pipelines compiled once from the kernels' source text at init, shared
//! buffers (new ones, or ones wrapping mmap'd weights without a copy), and one command buffer with
//! one compute encoder that collects every dispatch until flush commits it and waits, i.e. one per
//! decode step. The encoder is concurrent (MTLDispatchTypeConcurrent): dispatches between two
//! barriers may overlap on the GPU, and ts/backend/metal-hazards.ts asks for a buffer barrier
//! (barrier()) before every dispatch that reads or overwrites what an earlier one of the same
//! section writes or reads. What to dispatch (kernel, grid, threadgroup, bindings, arguments) is decided by
//! ts/backend/metal-plan.ts; this file only checks the numbers and forwards them. Objective-C is
//! reached through lib/metal/objc.zig (runtime loading, no metal-cpp: see there).
const std = @import("std");
const status = @import("../status.zig");
const objc = @import("objc.zig");

const Id = objc.Id;

/// MTLSize: three NSUInteger, passed by value.
const Size = extern struct { width: usize, height: usize, depth: usize };

/// Metal requires threadgroup memory lengths in multiples of 16 bytes.
const threadgroup_memory_granule = 16;
const bindings_max = 31;
const command_buffer_completed = 4;
const dispatch_type_concurrent: usize = 1; // MTLDispatchTypeConcurrent
const barrier_scope_buffers: usize = 1; // MTLBarrierScopeBuffers

const State = struct {
    rt: objc.Runtime,
    device: Id,
    queue: Id,
    pipelines: []Id,
    threads_max: []usize,
    // The open step: a command buffer and its encoder (both retained), or null. Every exported
    // call pushes and pops its own autorelease pool; nothing autoreleased outlives one call.
    command_buffer: Id = null,
    encoder: Id = null,
};

var state: ?State = null;

/// The system default device, else the first of MTLCopyAllDevices (see objc.load on why the
/// default can be nil); owned (+1) by the caller. Call inside an autorelease pool.
fn systemDevice(rt: *const objc.Runtime) Id {
    const default = rt.MTLCreateSystemDefaultDevice();
    if (default != null) return default;
    const copy_all = rt.MTLCopyAllDevices orelse return null;
    const all = copy_all();
    if (all == null) return null;
    defer rt.release(all);
    if (rt.send(usize, all, rt.sel("count"), .{}) == 0) return null;
    return rt.retain(rt.send(Id, all, rt.sel("objectAtIndex:"), .{@as(usize, 0)}));
}

fn notAvailable(comptime fmt: []const u8, args: anytype) i32 {
    return status.fail(.unsupported, "Metal not available: " ++ fmt, args);
}

fn ready() ?*State {
    if (state) |*s| return s;
    _ = status.fail(.internal, "the Metal backend is not initialized (infer_metal_init)", .{});
    return null;
}

/// Loads the runtime, takes the default device, compiles `source` and makes one pipeline per
/// kernel named in `names` (newline-separated); pipeline i is the i-th name. Idempotent.
pub fn init(source: []const u8, names: []const u8, out_count: *u32) i32 {
    if (state) |s| {
        out_count.* = @intCast(s.pipelines.len);
        return 0;
    }
    var rt: objc.Runtime = undefined;
    if (objc.load(&rt)) |e| return notAvailable("{s}", .{e.reason});
    const pool = rt.objc_autoreleasePoolPush();
    defer rt.objc_autoreleasePoolPop(pool);
    const device = systemDevice(&rt) orelse return notAvailable("no Metal device (MTLCreateSystemDefaultDevice and MTLCopyAllDevices found none)", .{});
    const queue = rt.send(Id, device, rt.sel("newCommandQueue"), .{});
    if (queue == null) return status.fail(.internal, "Metal: newCommandQueue failed", .{});

    const alloc = std.heap.c_allocator;
    const source_z = alloc.dupeZ(u8, source) catch return status.fail(.out_of_memory, "Metal: source", .{});
    defer alloc.free(source_z);
    const options = rt.send(Id, rt.send(Id, rt.objc_getClass("MTLCompileOptions"), rt.sel("alloc"), .{}), rt.sel("init"), .{});
    defer rt.release(options);
    // Precise math: the kernels rely on IEEE exp/tanh and finite sentinels; it is also what the
    // Linux emulation computes, so the proven numerics are the ones that run.
    rt.send(void, options, rt.sel("setFastMathEnabled:"), .{false});
    var err: Id = null;
    const library = rt.send(Id, device, rt.sel("newLibraryWithSource:options:error:"), .{
        rt.string(source_z.ptr), options, &err,
    });
    if (library == null) return status.fail(.internal, "Metal: compiling the kernels failed: {s}", .{rt.errorText(err)});
    defer rt.release(library);

    const count = std.mem.count(u8, names, "\n") + @intFromBool(names.len > 0 and names[names.len - 1] != '\n');
    const pipelines = alloc.alloc(Id, count) catch return status.fail(.out_of_memory, "Metal: pipelines", .{});
    const threads_max = alloc.alloc(usize, count) catch return status.fail(.out_of_memory, "Metal: pipelines", .{});
    var it = std.mem.tokenizeScalar(u8, names, '\n');
    var i: usize = 0;
    while (it.next()) |name| : (i += 1) {
        var buf: [128]u8 = undefined;
        const name_z = std.fmt.bufPrintZ(&buf, "{s}", .{name}) catch
            return status.fail(.invalid_argument, "Metal: kernel name too long", .{});
        const function = rt.send(Id, library, rt.sel("newFunctionWithName:"), .{rt.string(name_z.ptr)});
        if (function == null) return status.fail(.internal, "Metal: no kernel named {s} in the source", .{name});
        defer rt.release(function);
        err = null;
        const pipeline = rt.send(Id, device, rt.sel("newComputePipelineStateWithFunction:error:"), .{ function, &err });
        if (pipeline == null) return status.fail(.internal, "Metal: pipeline {s}: {s}", .{ name, rt.errorText(err) });
        pipelines[i] = pipeline;
        threads_max[i] = rt.send(usize, pipeline, rt.sel("maxTotalThreadsPerThreadgroup"), .{});
    }
    state = .{ .rt = rt, .device = device, .queue = queue, .pipelines = pipelines[0..i], .threads_max = threads_max[0..i] };
    out_count.* = @intCast(i);
    return 0;
}

/// The device name, NUL-terminated, into `out`.
pub fn deviceName(out: [*]u8, len: usize) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    if (len == 0) return status.fail(.invalid_argument, "Metal: empty name buffer", .{});
    const pool = s.rt.objc_autoreleasePoolPush();
    defer s.rt.objc_autoreleasePoolPop(pool);
    const name = s.rt.send(Id, s.device, s.rt.sel("name"), .{});
    const utf8 = s.rt.send(?[*:0]const u8, name, s.rt.sel("UTF8String"), .{});
    const text = if (utf8) |t| std.mem.span(t) else "";
    const n = @min(text.len, len - 1);
    @memcpy(out[0..n], text[0..n]);
    out[n] = 0;
    return 0;
}

/// The device's limits: maxBufferLength, recommendedMaxWorkingSetSize,
/// maxThreadgroupMemoryLength, hasUnifiedMemory (0 or 1).
pub fn deviceLimits(out: *[4]u64) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    const rt = &s.rt;
    const pool = rt.objc_autoreleasePoolPush();
    defer rt.objc_autoreleasePoolPop(pool);
    out[0] = rt.send(usize, s.device, rt.sel("maxBufferLength"), .{});
    out[1] = rt.send(u64, s.device, rt.sel("recommendedMaxWorkingSetSize"), .{});
    out[2] = rt.send(usize, s.device, rt.sel("maxThreadgroupMemoryLength"), .{});
    out[3] = @intFromBool(rt.send(bool, s.device, rt.sel("hasUnifiedMemory"), .{}));
    return 0;
}

/// A new shared buffer of `bytes` (zeroed by Metal). Out: handle and CPU address of its contents.
pub fn bufferNew(bytes: u64, out_handle: *u64, out_contents: *u64) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    const pool = s.rt.objc_autoreleasePoolPush();
    defer s.rt.objc_autoreleasePoolPop(pool);
    const shared: usize = 0; // MTLResourceStorageModeShared | default cache and hazard tracking
    const buffer = s.rt.send(Id, s.device, s.rt.sel("newBufferWithLength:options:"), .{ @as(usize, @intCast(@max(bytes, 16))), shared });
    if (buffer == null) return status.fail(.out_of_memory, "Metal: no memory for a buffer of {d} bytes", .{bytes});
    out_handle.* = @intFromPtr(buffer);
    out_contents.* = @intFromPtr(s.rt.send(?*anyopaque, buffer, s.rt.sel("contents"), .{}));
    return 0;
}

/// A buffer over existing memory (the mmap'd model), without a copy: `address` must be page
/// aligned; the length is rounded up to whole pages (the mapping covers them).
pub fn bufferWrap(address: u64, bytes: u64, out_handle: *u64) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    const page = std.heap.pageSize();
    if (address % page != 0) return status.fail(.invalid_argument, "Metal: wrapped memory at {x} is not page aligned", .{address});
    const length = std.mem.alignForward(usize, @intCast(bytes), page);
    const pool = s.rt.objc_autoreleasePoolPush();
    defer s.rt.objc_autoreleasePoolPop(pool);
    const buffer = s.rt.send(Id, s.device, s.rt.sel("newBufferWithBytesNoCopy:length:options:deallocator:"), .{
        @as(?*anyopaque, @ptrFromInt(@as(usize, @intCast(address)))), length, @as(usize, 0), @as(Id, null),
    });
    if (buffer == null) return status.fail(.out_of_memory, "Metal: cannot wrap {d} bytes (over the device's maxBufferLength?)", .{bytes});
    out_handle.* = @intFromPtr(buffer);
    return 0;
}

pub fn bufferFree(handle: u64) void {
    const s = &(state orelse return);
    const pool = s.rt.objc_autoreleasePoolPush();
    defer s.rt.objc_autoreleasePoolPop(pool);
    s.rt.release(@ptrFromInt(@as(usize, @intCast(handle))));
}

/// Encodes one dispatch. dims: threadgroups per grid (3), threads per threadgroup (3).
/// bindings: (buffer handle, byte offset) per index 0..n_bindings-1, handle 0 = unbound; the
/// constant arguments go to args_index with setBytes.
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
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    if (pipeline >= s.pipelines.len) return status.fail(.invalid_argument, "Metal: no pipeline {d}", .{pipeline});
    if (n_bindings > bindings_max or args_index > bindings_max)
        return status.fail(.invalid_argument, "Metal: buffer index over {d}", .{bindings_max});
    const threads = @as(u64, dims[3]) * dims[4] * dims[5];
    if (threads == 0 or threads > s.threads_max[pipeline])
        return status.fail(.invalid_argument, "Metal: {d} threads per threadgroup (pipeline {d} allows {d})", .{ threads, pipeline, s.threads_max[pipeline] });
    const rt = &s.rt;
    const pool = rt.objc_autoreleasePoolPush();
    defer rt.objc_autoreleasePoolPop(pool);
    if (s.encoder == null) {
        // Both come autoreleased: retained here, released by flush, so that they outlive this
        // call's pool.
        const command_buffer = rt.send(Id, s.queue, rt.sel("commandBuffer"), .{});
        if (command_buffer == null) return status.fail(.internal, "Metal: cannot make a command buffer", .{});
        const encoder = rt.send(Id, command_buffer, rt.sel("computeCommandEncoderWithDispatchType:"), .{dispatch_type_concurrent});
        if (encoder == null) return status.fail(.internal, "Metal: cannot make a compute encoder", .{});
        s.command_buffer = rt.retain(command_buffer);
        s.encoder = rt.retain(encoder);
    }
    const enc = s.encoder;
    rt.send(void, enc, rt.sel("setComputePipelineState:"), .{s.pipelines[pipeline]});
    for (0..n_bindings) |i| {
        const handle = bindings[2 * i];
        if (handle == 0) continue;
        const buffer: Id = @ptrFromInt(@as(usize, @intCast(handle)));
        rt.send(void, enc, rt.sel("setBuffer:offset:atIndex:"), .{ buffer, @as(usize, @intCast(bindings[2 * i + 1])), i });
    }
    rt.send(void, enc, rt.sel("setBytes:length:atIndex:"), .{ @as(*const anyopaque, args), @as(usize, args_len), @as(usize, args_index) });
    if (threadgroup_bytes > 0) {
        const length = std.mem.alignForward(usize, threadgroup_bytes, threadgroup_memory_granule);
        rt.send(void, enc, rt.sel("setThreadgroupMemoryLength:atIndex:"), .{ length, @as(usize, 0) });
    }
    const grid: Size = .{ .width = dims[0], .height = dims[1], .depth = dims[2] };
    const group: Size = .{ .width = dims[3], .height = dims[4], .depth = dims[5] };
    rt.send(void, enc, rt.sel("dispatchThreadgroups:threadsPerThreadgroup:"), .{ grid, group });
    return 0;
}

/// Orders the dispatches encoded so far before the ones that follow (a memory barrier over
/// buffers); nothing to order when no encoder is open.
pub fn barrier() i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    if (s.encoder == null) return 0;
    const rt = &s.rt;
    const pool = rt.objc_autoreleasePoolPush();
    defer rt.objc_autoreleasePoolPop(pool);
    rt.send(void, s.encoder, rt.sel("memoryBarrierWithScope:"), .{barrier_scope_buffers});
    return 0;
}

/// Ends the encoder, commits the command buffer and waits for it; reports a GPU-side error.
pub fn flush() i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    if (s.encoder == null) return 0;
    const rt = &s.rt;
    const pool = rt.objc_autoreleasePoolPush();
    defer rt.objc_autoreleasePoolPop(pool);
    rt.send(void, s.encoder, rt.sel("endEncoding"), .{});
    rt.send(void, s.command_buffer, rt.sel("commit"), .{});
    rt.send(void, s.command_buffer, rt.sel("waitUntilCompleted"), .{});
    const st = rt.send(usize, s.command_buffer, rt.sel("status"), .{});
    var rc: i32 = 0;
    if (st != command_buffer_completed) {
        const err = rt.send(Id, s.command_buffer, rt.sel("error"), .{});
        rc = status.fail(.internal, "Metal: command buffer failed: {s}", .{rt.errorText(err)});
    }
    rt.release(s.encoder);
    rt.release(s.command_buffer);
    s.encoder = null;
    s.command_buffer = null;
    return rc;
}
