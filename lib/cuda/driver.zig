//! The CUDA driver API, loaded at run time: dlopen("libcuda.so.1") and dlsym of the entry points
//! below, so that libinfer builds and runs with no CUDA toolkit or driver present. Symbol names
//! are the versioned ones cuda.h maps its macros to (cuMemAlloc -> cuMemAlloc_v2, ...).
const std = @import("std");
const builtin = @import("builtin");

pub const CUresult = c_int;
pub const CUdevice = c_int;
pub const CUdeviceptr = u64;
pub const CUcontext = ?*anyopaque;
pub const CUmodule = ?*anyopaque;
pub const CUfunction = ?*anyopaque;
pub const CUstream = ?*anyopaque;
pub const CUgraph = ?*anyopaque;
pub const CUgraphExec = ?*anyopaque;
pub const CUevent = ?*anyopaque;

/// cuLaunchKernelEx's attribute (cuda.h CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte union).
pub const CUlaunchAttribute = extern struct {
    id: c_int,
    pad: [4]u8 = .{ 0, 0, 0, 0 },
    value: [64]u8 align(8) = [_]u8{0} ** 64,
};

pub const CUlaunchConfig = extern struct {
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_bytes: c_uint,
    stream: CUstream,
    attrs: ?[*]CUlaunchAttribute,
    attr_count: c_uint,
};

/// cuda.h CUmemLocation: a location type and a device ordinal (a union of an int and two bytes).
pub const CUmemLocation = extern struct {
    type: c_int,
    id: c_int,
};

/// cuda.h CUmemAllocationProp (CUDA 10.2 to 13): what cuMemCreate makes and where.
pub const CUmemAllocationProp = extern struct {
    type: c_int,
    requested_handle_types: c_int = 0,
    location: CUmemLocation,
    win32_handle_meta_data: ?*anyopaque = null,
    compression_type: u8 = 0,
    gpu_direct_rdma_capable: u8 = 0,
    usage: u16 = 0,
    reserved: [4]u8 = .{ 0, 0, 0, 0 },
};

/// cuda.h CUmemAccessDesc: who may access a mapped range, and how.
pub const CUmemAccessDesc = extern struct {
    location: CUmemLocation,
    flags: c_int,
};

pub const CUmemGenericAllocationHandle = c_ulonglong;

comptime {
    std.debug.assert(@sizeOf(CUmemLocation) == 8);
    std.debug.assert(@offsetOf(CUmemAllocationProp, "location") == 8 and
        @offsetOf(CUmemAllocationProp, "win32_handle_meta_data") == 16 and
        @offsetOf(CUmemAllocationProp, "compression_type") == 24 and @sizeOf(CUmemAllocationProp) == 32);
    std.debug.assert(@offsetOf(CUmemAccessDesc, "flags") == 8 and @sizeOf(CUmemAccessDesc) == 12);
    std.debug.assert(@sizeOf(CUlaunchAttribute) == 72);
    std.debug.assert(@offsetOf(CUlaunchConfig, "stream") == 32 and @sizeOf(CUlaunchConfig) == 56);
}

pub const success: CUresult = 0;
pub const error_out_of_memory: CUresult = 2;

pub const attr_multiprocessor_count: c_int = 16;
pub const attr_l2_cache_size: c_int = 38;
pub const attr_cc_major: c_int = 75;
pub const attr_cc_minor: c_int = 76;
/// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
pub const attr_virtual_memory_management: c_int = 102;
pub const mem_allocation_type_pinned: c_int = 1;
pub const mem_location_type_device: c_int = 1;
pub const mem_access_read_write: c_int = 3;
/// CU_MEM_ALLOC_GRANULARITY_MINIMUM: the size and alignment every map must be a multiple of.
pub const mem_granularity_minimum: c_int = 0;
pub const stream_non_blocking: c_uint = 1;
pub const capture_mode_thread_local: c_int = 1;
pub const event_disable_timing: c_uint = 2;
/// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: the launch may begin before the kernel
/// ahead of it in the stream ends; the kernel waits for it with griddepcontrol.wait.
pub const launch_attribute_programmatic_serialization: c_int = 6;

const cc = std.builtin.CallingConvention.c;

/// The entry points infer uses; each field name is the exported symbol.
pub const Api = struct {
    cuGetErrorName: *const fn (CUresult, *?[*:0]const u8) callconv(cc) CUresult,
    cuGetErrorString: *const fn (CUresult, *?[*:0]const u8) callconv(cc) CUresult,
    cuInit: *const fn (c_uint) callconv(cc) CUresult,
    cuDriverGetVersion: *const fn (*c_int) callconv(cc) CUresult,
    cuDeviceGetCount: *const fn (*c_int) callconv(cc) CUresult,
    cuDeviceGet: *const fn (*CUdevice, c_int) callconv(cc) CUresult,
    cuDeviceGetName: *const fn ([*]u8, c_int, CUdevice) callconv(cc) CUresult,
    cuDeviceGetAttribute: *const fn (*c_int, c_int, CUdevice) callconv(cc) CUresult,
    cuDeviceTotalMem_v2: *const fn (*usize, CUdevice) callconv(cc) CUresult,
    cuDevicePrimaryCtxRetain: *const fn (*CUcontext, CUdevice) callconv(cc) CUresult,
    cuCtxSetCurrent: *const fn (CUcontext) callconv(cc) CUresult,
    cuMemGetInfo_v2: *const fn (*usize, *usize) callconv(cc) CUresult,
    cuMemAlloc_v2: *const fn (*CUdeviceptr, usize) callconv(cc) CUresult,
    cuMemFree_v2: *const fn (CUdeviceptr) callconv(cc) CUresult,
    cuMemAllocHost_v2: *const fn (*?*anyopaque, usize) callconv(cc) CUresult,
    cuMemFreeHost: *const fn (?*anyopaque) callconv(cc) CUresult,
    cuMemcpyHtoDAsync_v2: *const fn (CUdeviceptr, ?*const anyopaque, usize, CUstream) callconv(cc) CUresult,
    cuMemcpyDtoHAsync_v2: *const fn (?*anyopaque, CUdeviceptr, usize, CUstream) callconv(cc) CUresult,
    cuMemcpyDtoDAsync_v2: *const fn (CUdeviceptr, CUdeviceptr, usize, CUstream) callconv(cc) CUresult,
    cuMemsetD32Async: *const fn (CUdeviceptr, c_uint, usize, CUstream) callconv(cc) CUresult,
    cuModuleLoadData: *const fn (*CUmodule, ?*const anyopaque) callconv(cc) CUresult,
    cuModuleGetFunction: *const fn (*CUfunction, CUmodule, [*:0]const u8) callconv(cc) CUresult,
    cuLaunchKernel: *const fn (
        CUfunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        CUstream,
        ?[*]?*anyopaque,
        ?[*]?*anyopaque,
    ) callconv(cc) CUresult,
    cuStreamCreate: *const fn (*CUstream, c_uint) callconv(cc) CUresult,
    cuStreamSynchronize: *const fn (CUstream) callconv(cc) CUresult,
    cuStreamBeginCapture_v2: *const fn (CUstream, c_int) callconv(cc) CUresult,
    cuStreamEndCapture: *const fn (CUstream, *CUgraph) callconv(cc) CUresult,
    cuGraphInstantiateWithFlags: *const fn (*CUgraphExec, CUgraph, c_ulonglong) callconv(cc) CUresult,
    cuGraphLaunch: *const fn (CUgraphExec, CUstream) callconv(cc) CUresult,
    cuGraphExecDestroy: *const fn (CUgraphExec) callconv(cc) CUresult,
    cuGraphDestroy: *const fn (CUgraph) callconv(cc) CUresult,
    cuEventCreate: *const fn (*CUevent, c_uint) callconv(cc) CUresult,
    cuEventRecord: *const fn (CUevent, CUstream) callconv(cc) CUresult,
    cuEventSynchronize: *const fn (CUevent) callconv(cc) CUresult,
};

/// Entry points that may be missing without making CUDA unusable.
pub const Optional = struct {
    cuProfilerStart: ?*const fn () callconv(cc) CUresult = null,
    cuProfilerStop: ?*const fn () callconv(cc) CUresult = null,
    /// CUDA 11.8+; without it kernels launch without programmatic dependent launch.
    cuLaunchKernelEx: ?*const fn (*const CUlaunchConfig, CUfunction, ?[*]?*anyopaque, ?[*]?*anyopaque) callconv(cc) CUresult = null,
    /// Without it one-token matvecs launch a block per row block rather than one wave.
    cuOccupancyMaxActiveBlocksPerMultiprocessor: ?*const fn (*c_int, CUfunction, c_int, usize) callconv(cc) CUresult = null,
    /// Without it kernels get 48 KiB of dynamic shared memory at most (the pipelined matvecs of
    /// longer rows then take the register-fed ones).
    cuFuncSetAttribute: ?*const fn (CUfunction, c_int, c_int) callconv(cc) CUresult = null,
    /// Virtual memory management (CUDA 10.2+): the paged KV cache reserves address ranges and maps
    /// physical granules into them as positions are written. Without them every cache is
    /// allocated whole (cuMemAlloc). None of these has a versioned name in cuda.h.
    cuMemGetAllocationGranularity: ?*const fn (*usize, *const CUmemAllocationProp, c_int) callconv(cc) CUresult = null,
    cuMemAddressReserve: ?*const fn (*CUdeviceptr, usize, usize, CUdeviceptr, c_ulonglong) callconv(cc) CUresult = null,
    cuMemAddressFree: ?*const fn (CUdeviceptr, usize) callconv(cc) CUresult = null,
    cuMemCreate: ?*const fn (*CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, c_ulonglong) callconv(cc) CUresult = null,
    cuMemRelease: ?*const fn (CUmemGenericAllocationHandle) callconv(cc) CUresult = null,
    cuMemMap: ?*const fn (CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, c_ulonglong) callconv(cc) CUresult = null,
    cuMemUnmap: ?*const fn (CUdeviceptr, usize) callconv(cc) CUresult = null,
    cuMemSetAccess: ?*const fn (CUdeviceptr, usize, [*]const CUmemAccessDesc, usize) callconv(cc) CUresult = null,
};

/// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
pub const func_attribute_max_dynamic_shared = 8;

pub var optional: Optional = .{};

pub const LoadError = struct {
    /// What failed, for "CUDA not available: <reason>".
    reason: []const u8,
    detail: []const u8 = "",
};

/// Opens libcuda.so.1 and resolves every entry point; on failure returns why.
pub fn load(out: *Api) ?LoadError {
    if (builtin.os.tag != .linux) return .{ .reason = "the CUDA backend is only built for Linux" };
    const handle = std.c.dlopen("libcuda.so.1", .{ .NOW = true }) orelse {
        const detail: []const u8 = if (std.c.dlerror()) |e| std.mem.span(e) else "";
        return .{ .reason = "cannot load libcuda.so.1 (no NVIDIA driver installed?)", .detail = detail };
    };
    inline for (@typeInfo(Api).@"struct".fields) |f| {
        const sym = std.c.dlsym(handle, f.name) orelse
            return .{ .reason = "libcuda.so.1 lacks " ++ f.name ++ " (NVIDIA driver too old?)" };
        @field(out, f.name) = @ptrCast(@alignCast(sym));
    }
    inline for (@typeInfo(Optional).@"struct".fields) |f| {
        if (std.c.dlsym(handle, f.name)) |sym| @field(optional, f.name) = @ptrCast(@alignCast(sym));
    }
    return null;
}

/// "CUDA_ERROR_X: description" for a driver status (static strings owned by the driver).
pub fn describe(api: *const Api, rc: CUresult, name_out: *[]const u8, text_out: *[]const u8) void {
    var name: ?[*:0]const u8 = null;
    var text: ?[*:0]const u8 = null;
    _ = api.cuGetErrorName(rc, &name);
    _ = api.cuGetErrorString(rc, &text);
    name_out.* = if (name) |n| std.mem.span(n) else "CUDA_ERROR_UNKNOWN";
    text_out.* = if (text) |t| std.mem.span(t) else "unknown error";
}
