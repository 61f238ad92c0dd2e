//! Host side of the CUDA backend: device and context, one stream, device memory, the kernel
//! module (shaders/cuda/infer.cu, compiled by shaders/cuda/build.sh and loaded from a path at
//! run time), stream capture into CUDA graphs, and the launch of a kernel; the ops, a function
//! each that validates its arguments and launches kernels, are lib/cuda/ops.zig. Every driver
//! call's status becomes a Status with a message (lib/status.zig); nothing here needs CUDA at
//! build time (lib/cuda/driver.zig loads libcuda). Device addresses cross the C ABI as u64.
const std = @import("std");
const status = @import("../status.zig");
const driver = @import("driver.zig");
const settings = @import("../settings.zig");

const kernels = @import("kernels.zig");
pub const Kernel = kernels.Kernel;
pub const WeightKind = kernels.WeightKind;
pub const weightKind = kernels.weightKind;
pub const packed_type = kernels.packed_type;
pub const repackedType = kernels.repackedType;
const kernel_count = kernels.kernel_count;

/// The ops (what each validates and launches): lib/cuda/ops.zig.
pub const ops = @import("ops.zig");

/// Rewrites n_rows rows of n_in values of ggml type `type_id` at w (device memory, just
/// uploaded) into the GPU layout repackedType names, in place, in stream order. A type without
/// one is left as it is.
pub fn repack(w: u64, type_id: u32, n_rows: u64, n_in: u64) i32 {
    const to = repackedType(type_id, n_in);
    if (to == type_id) return 0;
    const groups = std.math.mul(u64, n_rows, n_in / 256) catch return tooLarge("repack: groups", n_rows);
    const kernel: Kernel = switch (type_id) {
        2 => .repack_q4_0,
        8 => .repack_q8_0,
        else => .repack_q4_k,
    };
    return launch(kernel, ceilDiv(groups, 128), 1, 128, .{ w, @as(i64, @intCast(groups)) });
}

/// Every field has its default, so init starts from `.{}`: a field added later cannot be left
/// undefined (the occupancy cache once was).
pub const State = struct {
    device: driver.CUdevice = 0,
    context: driver.CUcontext = null,
    stream: driver.CUstream = null,
    module: driver.CUmodule = null,
    kernels: [kernel_count]driver.CUfunction = [_]driver.CUfunction{null} ** kernel_count,
    /// Blocks of 128 threads of each kernel resident on a multiprocessor at once (0: not asked yet).
    resident: [kernel_count]u8 = [_]u8{0} ** kernel_count,
    name: [256]u8 = [_]u8{0} ** 256,
    sm_count: i32 = 0,
    cc_major: i32 = 0,
    cc_minor: i32 = 0,
    l2_bytes: i32 = 0,
    driver_version: i32 = 0,
    capturing: bool = false,
    debug_sync: bool = false,
    /// Launches carry the programmatic-serialization attribute (sm_90+, the cuda_pdl setting): a
    /// kernel's blocks may start while the kernel before it drains, and wait for it in
    /// griddepcontrol.wait (pdl_begin in shaders/cuda/common.cuh), which hides launch latency.
    pdl: bool = false,
    /// Events that mark asynchronous downloads done (downloadAsync / eventWait), by slot.
    events: [event_slots]driver.CUevent = [_]driver.CUevent{null} ** event_slots,
    /// Device scratch by use (`scratch`): the f16 copies a cuBLAS GEMM reads (ops.zig gemmF16),
    /// the K-split partial sums of mmq_* (ops.zig matmul).
    scratch: [@typeInfo(Scratch).@"enum".fields.len]ScratchBuffer = [_]ScratchBuffer{.{}} ** @typeInfo(Scratch).@"enum".fields.len,
    /// Dynamic shared memory the pipelined matvecs may take (raised past 48 KiB at init where the
    /// driver allows).
    pipe_shared_max: u32 = 48 << 10,
    /// Whether attn_decode_mma_d* got the dynamic shared memory of its two 128-key tiles
    /// (69,632 bytes at head_dim 128; lib/cuda/attention.zig decodeMmaTakes).
    decode_mma_ok: bool = false,
    /// Whether attn_decode_mma_q_d* (quantized caches) got its f16 tiles and staged blocks
    /// (104,448 bytes at head_dim 128).
    decode_mma_q_ok: bool = false,
};

/// Device scratch of ops that need room beyond their output, one buffer per use, grown on demand.
pub const Scratch = enum { f16_copies, mmq_partials };

/// At least `bytes` of the `use` scratch (the old buffer freed once the stream has drained:
/// queued kernels may still read it). During a capture a buffer cannot grow: "invalid" then.
pub fn scratch(use: Scratch, bytes: u64, out: *u64) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    const slot = &s.scratch[@intFromEnum(use)];
    if (slot.bytes < bytes) {
        if (s.capturing) return invalid("{s} scratch: cannot grow during a capture", .{@tagName(use)});
        if (slot.ptr != 0) {
            const rc = api.cuStreamSynchronize(s.stream);
            if (rc != driver.success) return cuFail(rc, "waiting for the stream", .{});
            free(slot.ptr);
            slot.* = .{};
        }
        var ptr: u64 = 0;
        const rc = malloc(bytes, &ptr);
        if (rc != 0) return rc;
        slot.* = .{ .ptr = ptr, .bytes = bytes };
    }
    out.* = slot.ptr;
    return 0;
}

pub const ScratchBuffer = struct { ptr: u64 = 0, bytes: u64 = 0 };

pub const event_slots = 16;

var api: driver.Api = undefined;
var state: ?State = null;
threadlocal var context_current: bool = false;

fn notInitialized() i32 {
    return status.fail(.internal, "the CUDA backend is not initialized (infer_cuda_init)", .{});
}

/// The state, with its context current on this thread; null after recording an error.
pub fn ready() ?*State {
    const s = &(state orelse {
        _ = notInitialized();
        return null;
    });
    if (!context_current) {
        const rc = api.cuCtxSetCurrent(s.context);
        if (rc != driver.success) {
            _ = cuFail(rc, "making the context current", .{});
            return null;
        }
        context_current = true;
    }
    return s;
}

pub fn cuFail(rc: driver.CUresult, comptime what: []const u8, args: anytype) i32 {
    var name: []const u8 = undefined;
    var text: []const u8 = undefined;
    driver.describe(&api, rc, &name, &text);
    var buf: [300]u8 = undefined;
    const prefix = std.fmt.bufPrint(&buf, what, args) catch what;
    const kind: status.Status = if (rc == driver.error_out_of_memory) .out_of_memory else .internal;
    return status.fail(kind, "CUDA error {s}: {s} ({s})", .{ prefix, name, text });
}

pub fn invalid(comptime fmt: []const u8, args: anytype) i32 {
    return status.fail(.invalid_argument, fmt, args);
}

// ---- setup -------------------------------------------------------------------------------------

/// Loads the driver, takes device `ordinal`'s primary context, creates the stream and loads the
/// kernels from `path`. Idempotent. Failures that mean "no usable CUDA here" return
/// `unsupported` with a message starting "CUDA not available: ".
pub fn init(path: []const u8, ordinal: i32) i32 {
    if (state != null) return 0;
    ops.configure(settings.current);
    if (driver.load(&api)) |e| {
        const sep: []const u8 = if (e.detail.len > 0) ": " else "";
        return status.fail(.unsupported, "CUDA not available: {s}{s}{s}", .{ e.reason, sep, e.detail });
    }
    var name: []const u8 = undefined;
    var text: []const u8 = undefined;
    var rc = api.cuInit(0);
    if (rc != driver.success) {
        driver.describe(&api, rc, &name, &text);
        return status.fail(.unsupported, "CUDA not available: cuInit failed: {s} ({s})", .{ name, text });
    }
    var count: c_int = 0;
    rc = api.cuDeviceGetCount(&count);
    if (rc != driver.success) return cuFail(rc, "counting devices", .{});
    if (count == 0) return status.fail(.unsupported, "CUDA not available: no CUDA device found", .{});
    if (ordinal < 0 or ordinal >= count)
        return invalid("CUDA device {d} does not exist ({d} device(s))", .{ ordinal, count });
    var s: State = .{};
    rc = api.cuDeviceGet(&s.device, ordinal);
    if (rc != driver.success) return cuFail(rc, "getting device {d}", .{ordinal});
    _ = api.cuDeviceGetName(&s.name, s.name.len - 1, s.device);
    var attr: c_int = 0;
    _ = api.cuDeviceGetAttribute(&attr, driver.attr_multiprocessor_count, s.device);
    s.sm_count = attr;
    _ = api.cuDeviceGetAttribute(&attr, driver.attr_cc_major, s.device);
    s.cc_major = attr;
    _ = api.cuDeviceGetAttribute(&attr, driver.attr_cc_minor, s.device);
    s.cc_minor = attr;
    _ = api.cuDeviceGetAttribute(&attr, driver.attr_l2_cache_size, s.device);
    s.l2_bytes = attr;
    _ = api.cuDriverGetVersion(&attr);
    s.driver_version = attr;
    rc = api.cuDevicePrimaryCtxRetain(&s.context, s.device);
    if (rc != driver.success) return cuFail(rc, "retaining the primary context", .{});
    rc = api.cuCtxSetCurrent(s.context);
    if (rc != driver.success) return cuFail(rc, "making the context current", .{});
    context_current = true;
    rc = api.cuStreamCreate(&s.stream, driver.stream_non_blocking);
    if (rc != driver.success) return cuFail(rc, "creating a stream", .{});
    for (&s.events) |*e| {
        rc = api.cuEventCreate(e, driver.event_disable_timing);
        if (rc != driver.success) return cuFail(rc, "creating an event", .{});
    }
    s.pdl = s.cc_major >= 9 and driver.optional.cuLaunchKernelEx != null and settings.current.cuda_pdl;

    const image = std.fs.cwd().readFileAlloc(std.heap.c_allocator, path, 256 << 20) catch |err| {
        return status.fail(.unsupported, "CUDA not available: cannot read the kernels at '{s}' ({s}): " ++
            "build them with shaders/cuda/build.sh (needs nvcc) or set INFER_CUDA_KERNELS", .{ path, @errorName(err) });
    };
    defer std.heap.c_allocator.free(image);
    rc = api.cuModuleLoadData(&s.module, image.ptr);
    if (rc != driver.success) {
        driver.describe(&api, rc, &name, &text);
        return status.fail(.unsupported, "CUDA not available: the kernels at '{s}' do not load on {s} " ++
            "(sm_{d}{d}): {s} ({s}); rebuild them with CUDA_ARCHS=\"{d}{d}\" shaders/cuda/build.sh", .{
            path, std.mem.sliceTo(&s.name, 0), s.cc_major, s.cc_minor, name, text, s.cc_major, s.cc_minor,
        });
    }
    inline for (@typeInfo(Kernel).@"enum".fields, 0..) |f, i| {
        rc = api.cuModuleGetFunction(&s.kernels[i], s.module, f.name);
        if (rc != driver.success) {
            return status.fail(.unsupported, "CUDA not available: kernel {s} is missing from '{s}' " ++
                "(stale build: rerun shaders/cuda/build.sh)", .{ f.name, path });
        }
    }
    // The pipelined matvecs stage 3 × 4 weight rows in shared memory: up to 227 KiB on sm_90.
    if (driver.optional.cuFuncSetAttribute) |set| {
        var ok = true;
        for ([_]Kernel{ .matvec_pipe_q4_0r, .matvec_pipe_q8_0r, .matvec_pipe_q4_kr, .matvec_pipe_split_q4_0r, .matvec_pipe_split_q8_0r, .matvec_pipe_split_q4_kr, .matvec_pipe_multi_q4_0r, .matvec_pipe_multi_q8_0r, .matvec_pipe_multi_q4_kr }) |k| {
            ok = ok and set(s.kernels[@intFromEnum(k)], driver.func_attribute_max_dynamic_shared, pipe_shared_sm90) == driver.success;
        }
        if (ok and s.cc_major >= 9) s.pipe_shared_max = pipe_shared_sm90;
        // mma.sync m16n8k16 f16 and cp.async need sm_80; the kernels are built for sm_90.
        s.decode_mma_ok = s.cc_major >= 8 and
            set(s.kernels[@intFromEnum(Kernel.attn_decode_mma_d64)], driver.func_attribute_max_dynamic_shared, decode_mma_shared_d64) == driver.success and
            set(s.kernels[@intFromEnum(Kernel.attn_decode_mma_d128)], driver.func_attribute_max_dynamic_shared, decode_mma_shared_d128) == driver.success;
        s.decode_mma_q_ok = s.cc_major >= 8 and
            set(s.kernels[@intFromEnum(Kernel.attn_decode_mma_q_d64)], driver.func_attribute_max_dynamic_shared, decode_mma_q_shared_d64) == driver.success and
            set(s.kernels[@intFromEnum(Kernel.attn_decode_mma_q_d128)], driver.func_attribute_max_dynamic_shared, decode_mma_q_shared_d128) == driver.success;
    }
    state = s;
    return 0;
}

const pipe_shared_sm90: c_int = 227 << 10;

/// Dynamic shared memory of attn_decode_mma_d64 / _d128 (shaders/cuda/attend_decode_mma.cuh
/// mma_decode_shared_bytes: a 128-key tile of key rows and one of value rows, each row padded by
/// 8 halves).
pub const decode_mma_shared_d64: c_int = 2 * 128 * (64 + 8) * 2;
pub const decode_mma_shared_d128: c_int = 2 * 128 * (128 + 8) * 2;

/// Dynamic shared memory of attn_decode_mma_q_d64 / _d128 (mma_decode_q_shared_bytes): the f16
/// tiles and, for K and V each, a 128-key tile of a head's Q8_0 blocks (34 bytes per 32 values).
pub const decode_mma_q_shared_d64: c_int = decode_mma_shared_d64 + 2 * 128 * (64 / 32 * 34);
pub const decode_mma_q_shared_d128: c_int = decode_mma_shared_d128 + 2 * 128 * (128 / 32 * 34);

/// Out: the device name (NUL-terminated, truncated to name_len) and
/// [total bytes, free bytes, multiprocessors, compute capability (major*10+minor), driver version, L2 bytes].
pub fn deviceInfo(name_out: [*]u8, name_len: usize, out: *[6]i64) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    if (name_len > 0) {
        const name = std.mem.sliceTo(&s.name, 0);
        const n = @min(name.len, name_len - 1);
        @memcpy(name_out[0..n], name[0..n]);
        name_out[n] = 0;
    }
    var free_bytes: usize = 0;
    var total_bytes: usize = 0;
    const rc = api.cuMemGetInfo_v2(&free_bytes, &total_bytes);
    if (rc != driver.success) return cuFail(rc, "reading memory info", .{});
    out.* = .{ @intCast(total_bytes), @intCast(free_bytes), s.sm_count, s.cc_major * 10 + s.cc_minor, s.driver_version, s.l2_bytes };
    return 0;
}

/// Starts or stops the profiler's collection (Nsight Compute --profile-from-start off).
pub fn profiler(on: bool) i32 {
    _ = ready() orelse return @intFromEnum(status.Status.internal);
    const f = (if (on) driver.optional.cuProfilerStart else driver.optional.cuProfilerStop) orelse
        return status.fail(.unsupported, "this libcuda has no cuProfilerStart/Stop", .{});
    const rc = f();
    if (rc != driver.success) return cuFail(rc, "switching the profiler", .{});
    return 0;
}

pub fn setDebugSync(on: bool) void {
    if (state) |*s| s.debug_sync = on;
}

// ---- memory ------------------------------------------------------------------------------------

/// cuDeviceGetAttribute, for lib/cuda/vmm.zig.
pub fn deviceAttribute(out: *c_int, attr: c_int, dev: driver.CUdevice) driver.CUresult {
    return api.cuDeviceGetAttribute(out, attr, dev);
}

/// Virtual memory management: reserved ranges, physical granules mapped into them.
pub const vmm = @import("vmm.zig");

pub fn malloc(bytes: u64, out: *u64) i32 {
    _ = ready() orelse return @intFromEnum(status.Status.internal);
    if (bytes == 0) return invalid("cuda malloc: 0 bytes", .{});
    var ptr: driver.CUdeviceptr = 0;
    const rc = api.cuMemAlloc_v2(&ptr, @intCast(bytes));
    if (rc == driver.error_out_of_memory) {
        var free_bytes: usize = 0;
        var total_bytes: usize = 0;
        _ = api.cuMemGetInfo_v2(&free_bytes, &total_bytes);
        return status.fail(.out_of_memory, "CUDA out of memory: cannot allocate {d} MiB ({d} MiB free of {d} MiB)", .{
            bytes >> 20, free_bytes >> 20, total_bytes >> 20,
        });
    }
    if (rc != driver.success) return cuFail(rc, "allocating {d} bytes", .{bytes});
    out.* = ptr;
    return 0;
}

pub fn free(ptr: u64) void {
    if (ptr == 0 or state == null) return;
    _ = api.cuMemFree_v2(ptr);
}

/// Page-locked host memory (fast downloads); TypeScript views it with toArrayBuffer.
pub fn hostAlloc(bytes: u64, out: *u64) i32 {
    _ = ready() orelse return @intFromEnum(status.Status.internal);
    var ptr: ?*anyopaque = null;
    const rc = api.cuMemAllocHost_v2(&ptr, @intCast(bytes));
    if (rc != driver.success) return cuFail(rc, "allocating {d} bytes of pinned host memory", .{bytes});
    out.* = @intFromPtr(ptr);
    return 0;
}

pub fn hostFree(ptr: u64) void {
    if (ptr == 0 or state == null) return;
    _ = api.cuMemFreeHost(@ptrFromInt(ptr));
}

/// Stream-ordered copy host -> device. The host bytes may be reused when this returns.
pub fn upload(dst: u64, src: [*]const u8, bytes: u64) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    if (bytes == 0) return 0;
    const rc = api.cuMemcpyHtoDAsync_v2(dst, src, @intCast(bytes), s.stream);
    if (rc != driver.success) return cuFail(rc, "uploading {d} bytes", .{bytes});
    return 0;
}

/// Queues device -> host into pinned memory `dst` and marks it with event `slot`; eventWait(slot)
/// waits for it. The host does not wait here, so the GPU runs on (greedy decoding's token ids).
pub fn downloadAsync(dst: u64, src: u64, bytes: u64, slot: u32) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    if (slot >= event_slots) return invalid("download_async: event slot {d} not in 0..{d}", .{ slot, event_slots - 1 });
    if (dst == 0) return invalid("download_async: no destination", .{});
    var rc = api.cuMemcpyDtoHAsync_v2(@ptrFromInt(dst), src, @intCast(bytes), s.stream);
    if (rc != driver.success) return cuFail(rc, "downloading {d} bytes", .{bytes});
    rc = api.cuEventRecord(s.events[slot], s.stream);
    if (rc != driver.success) return cuFail(rc, "recording an event", .{});
    return 0;
}

/// Waits until the work queued before event `slot` was last recorded is done.
pub fn eventWait(slot: u32) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    if (slot >= event_slots) return invalid("event_wait: event slot {d} not in 0..{d}", .{ slot, event_slots - 1 });
    const rc = api.cuEventSynchronize(s.events[slot]);
    if (rc != driver.success) return cuFail(rc, "finishing the queued kernels", .{});
    return 0;
}

/// Waits for the stream, then device -> host. Errors of earlier kernels surface here.
pub fn download(dst: [*]u8, src: u64, bytes: u64) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    var rc = api.cuMemcpyDtoHAsync_v2(dst, src, @intCast(bytes), s.stream);
    if (rc != driver.success) return cuFail(rc, "downloading {d} bytes", .{bytes});
    rc = api.cuStreamSynchronize(s.stream);
    if (rc != driver.success) return cuFail(rc, "finishing the queued kernels", .{});
    return 0;
}

pub fn copy(dst: u64, src: u64, bytes: u64) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    const rc = api.cuMemcpyDtoDAsync_v2(dst, src, @intCast(bytes), s.stream);
    if (rc != driver.success) return cuFail(rc, "copying {d} bytes on the device", .{bytes});
    return 0;
}

/// dst[0..count] = value (32-bit words): zeroing, or poisoning with NaN in tests.
pub fn fill32(dst: u64, value: u32, count: u64) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    const rc = api.cuMemsetD32Async(dst, value, @intCast(count), s.stream);
    if (rc != driver.success) return cuFail(rc, "filling {d} words", .{count});
    return 0;
}

pub fn sync() i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    const rc = api.cuStreamSynchronize(s.stream);
    if (rc != driver.success) return cuFail(rc, "finishing the queued kernels", .{});
    return 0;
}

// ---- graphs ------------------------------------------------------------------------------------

pub fn captureBegin() i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    if (s.capturing) return invalid("capture_begin: a capture is already running", .{});
    const rc = api.cuStreamBeginCapture_v2(s.stream, driver.capture_mode_thread_local);
    if (rc != driver.success) return cuFail(rc, "beginning a stream capture", .{});
    s.capturing = true;
    return 0;
}

/// Ends the capture and instantiates it; out: the executable graph's handle.
pub fn captureEnd(out: *u64) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    if (!s.capturing) return invalid("capture_end: no capture is running", .{});
    s.capturing = false;
    var graph: driver.CUgraph = null;
    var rc = api.cuStreamEndCapture(s.stream, &graph);
    if (rc != driver.success) return cuFail(rc, "ending a stream capture", .{});
    defer _ = api.cuGraphDestroy(graph);
    var exec: driver.CUgraphExec = null;
    rc = api.cuGraphInstantiateWithFlags(&exec, graph, 0);
    if (rc != driver.success) return cuFail(rc, "instantiating a graph", .{});
    out.* = @intFromPtr(exec);
    return 0;
}

/// Ends a capture that failed half-way, discarding what it recorded.
pub fn captureAbort() void {
    const s = &(state orelse return);
    if (!s.capturing) return;
    s.capturing = false;
    var graph: driver.CUgraph = null;
    _ = api.cuStreamEndCapture(s.stream, &graph);
    if (graph != null) _ = api.cuGraphDestroy(graph);
}

pub fn graphLaunch(exec: u64) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    const rc = api.cuGraphLaunch(@ptrFromInt(exec), s.stream);
    if (rc != driver.success) return cuFail(rc, "launching a graph", .{});
    if (s.debug_sync) return sync();
    return 0;
}

pub fn graphDestroy(exec: u64) void {
    if (exec == 0 or state == null) return;
    _ = api.cuGraphExecDestroy(@ptrFromInt(exec));
}

// ---- launches ----------------------------------------------------------------------------------

/// Launches kernel `k` with the tuple `args`, whose field types must be the kernel's parameter
/// types (u64 for pointers, i32 for int, f32 for float).
pub fn launch(k: Kernel, grid_x: u64, grid_y: u64, block: u32, args: anytype) i32 {
    return launchShared(k, grid_x, grid_y, block, 0, args);
}

/// launch with `shared` bytes of dynamic shared memory.
pub fn launchShared(k: Kernel, grid_x: u64, grid_y: u64, block: u32, shared: u32, args: anytype) i32 {
    return launchGrid(k, grid_x, grid_y, 1, block, shared, args);
}

/// launchShared with a third grid dimension (the K-splits of mmq_*).
pub fn launchGrid(k: Kernel, grid_x: u64, grid_y: u64, grid_z: u64, block: u32, shared: u32, args: anytype) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    if (grid_x == 0 or grid_y == 0 or grid_z == 0) return 0;
    if (grid_x > std.math.maxInt(i32) or grid_y > 65535 or grid_z > 65535)
        return invalid("{s}: grid {d} x {d} x {d} is too large", .{ @tagName(k), grid_x, grid_y, grid_z });
    var values = args;
    const fields = @typeInfo(@TypeOf(values)).@"struct".fields;
    var params: [fields.len]?*anyopaque = undefined;
    inline for (fields, 0..) |f, i| params[i] = @ptrCast(&@field(values, f.name));
    if (s.pdl and pdlFor(k)) {
        var attr = driver.CUlaunchAttribute{ .id = driver.launch_attribute_programmatic_serialization };
        attr.value[0] = 1; // programmaticStreamSerializationAllowed = 1 (an int, little-endian)
        const config = driver.CUlaunchConfig{
            .grid_x = @intCast(grid_x),
            .grid_y = @intCast(grid_y),
            .grid_z = @intCast(grid_z),
            .block_x = block,
            .block_y = 1,
            .block_z = 1,
            .shared_bytes = shared,
            .stream = s.stream,
            .attrs = @ptrCast(&attr),
            .attr_count = 1,
        };
        const rc = driver.optional.cuLaunchKernelEx.?(&config, s.kernels[@intFromEnum(k)], &params, null);
        if (rc != driver.success) return cuFail(rc, "launching {s}", .{@tagName(k)});
        if (s.debug_sync and !s.capturing) {
            const rc2 = api.cuStreamSynchronize(s.stream);
            if (rc2 != driver.success) return cuFail(rc2, "running {s}", .{@tagName(k)});
        }
        return 0;
    }
    const rc = api.cuLaunchKernel(
        s.kernels[@intFromEnum(k)],
        @intCast(grid_x),
        @intCast(grid_y),
        @intCast(grid_z),
        block,
        1,
        1,
        shared,
        s.stream,
        &params,
        null,
    );
    if (rc != driver.success) return cuFail(rc, "launching {s}", .{@tagName(k)});
    if (s.debug_sync and !s.capturing) {
        const rc2 = api.cuStreamSynchronize(s.stream);
        if (rc2 != driver.success) return cuFail(rc2, "running {s}", .{@tagName(k)});
    }
    return 0;
}

/// Whether kernel k launches with programmatic dependent launch: every kernel of a decode step
/// does; the prompt's tensor-core kernels do not (measured on an H200: PDL took mmq_q4_k's
/// 512-token prefill of the Qwen3-0.6B shape from 26.8k to 18.4k tokens/s), and without the
/// attribute a launch waits for the kernel before it as a plain stream does.
fn pdlFor(k: Kernel) bool {
    return switch (k) {
        .attn_scores_mma, .attn_values_mma, .attn_prompt_d64, .attn_prompt_d128 => false,
        else => !std.mem.startsWith(u8, @tagName(k), "mmq_"),
    };
}

pub fn ceilDiv(a: u64, b: u64) u64 {
    return (a + b - 1) / b;
}

/// An element count as a kernel's int, or null when it does not fit.
pub fn int(v: u64) ?i32 {
    return if (v <= std.math.maxInt(i32)) @intCast(v) else null;
}

pub fn tooLarge(what: []const u8, v: u64) i32 {
    return invalid("{s} = {d} is too large for the CUDA kernels", .{ what, v });
}

test "without a driver, init reports CUDA as not available" {
    // On machines with a driver this test initializes nothing it cannot (a bad kernel path).
    const rc = init("/nonexistent/infer.fatbin", 0);
    if (state == null) {
        try std.testing.expect(rc != 0);
        try std.testing.expect(std.mem.startsWith(u8, std.mem.span(status.lastError()), "CUDA not available: "));
    }
}
