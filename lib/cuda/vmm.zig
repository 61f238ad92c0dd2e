//! CUDA virtual memory management, for the paged KV cache (ts/backend/cuda-pages.ts): a cache
//! layer reserves the address range of its whole context once, and physical granules are created
//! and mapped into it as positions are written. Kernels and CUDA graphs keep using the range's
//! stable address; only what is mapped takes memory. A physical granule's handle may be mapped at
//! several ranges (sharing). Where libcuda lacks the entry points or the device does not support
//! them, granularity() fails with `unsupported` and the caller allocates caches whole.
const std = @import("std");
const status = @import("../status.zig");
const driver = @import("driver.zig");
const cuda = @import("cuda.zig");

const o = &driver.optional;

fn device() ?driver.CUdevice {
    const s = cuda.ready() orelse return null;
    return s.device;
}

fn pinnedOn(dev: driver.CUdevice) driver.CUmemAllocationProp {
    return .{
        .type = driver.mem_allocation_type_pinned,
        .location = .{ .type = driver.mem_location_type_device, .id = dev },
    };
}

fn lacking() i32 {
    return status.fail(.unsupported, "this libcuda lacks the virtual memory management entry points", .{});
}

/// Out: the granularity (bytes) every reserved range, map and offset is a multiple of.
pub fn granularity(out: *u64) i32 {
    const dev = device() orelse return @intFromEnum(status.Status.internal);
    const get = o.cuMemGetAllocationGranularity orelse return lacking();
    if (o.cuMemAddressReserve == null or o.cuMemAddressFree == null or o.cuMemCreate == null or
        o.cuMemRelease == null or o.cuMemMap == null or o.cuMemUnmap == null or o.cuMemSetAccess == null) return lacking();
    var supported: c_int = 0;
    const rc0 = cuda.deviceAttribute(&supported, driver.attr_virtual_memory_management, dev);
    if (rc0 != driver.success or supported == 0) {
        return status.fail(.unsupported, "the device does not support virtual memory management", .{});
    }
    const prop = pinnedOn(dev);
    var bytes: usize = 0;
    const rc = get(&bytes, &prop, driver.mem_granularity_minimum);
    if (rc != driver.success) return cuda.cuFail(rc, "querying the allocation granularity", .{});
    if (bytes == 0) return status.fail(.unsupported, "the allocation granularity is 0", .{});
    out.* = bytes;
    return 0;
}

/// Reserves `bytes` (a multiple of the granularity) of device address space; out: its address.
pub fn reserve(bytes: u64, out: *u64) i32 {
    _ = device() orelse return @intFromEnum(status.Status.internal);
    const f = o.cuMemAddressReserve orelse return lacking();
    var ptr: driver.CUdeviceptr = 0;
    const rc = f(&ptr, @intCast(bytes), 0, 0, 0);
    if (rc != driver.success) return cuda.cuFail(rc, "reserving {d} MiB of device address space", .{bytes >> 20});
    out.* = ptr;
    return 0;
}

/// Gives back a reserved range (everything in it unmapped first).
pub fn addressFree(ptr: u64, bytes: u64) void {
    const f = o.cuMemAddressFree orelse return;
    if (ptr == 0 or cuda.ready() == null) return;
    _ = f(ptr, @intCast(bytes));
}

/// Creates `bytes` (a multiple of the granularity) of physical device memory; out: its handle.
pub fn create(bytes: u64, out: *u64) i32 {
    const dev = device() orelse return @intFromEnum(status.Status.internal);
    const f = o.cuMemCreate orelse return lacking();
    const prop = pinnedOn(dev);
    var handle: driver.CUmemGenericAllocationHandle = 0;
    const rc = f(&handle, @intCast(bytes), &prop, 0);
    if (rc == driver.error_out_of_memory) {
        return status.fail(.out_of_memory, "CUDA out of memory: cannot create {d} MiB for the KV cache", .{bytes >> 20});
    }
    if (rc != driver.success) return cuda.cuFail(rc, "creating {d} bytes of device memory", .{bytes});
    out.* = handle;
    return 0;
}

/// Drops the handle's reference; its memory is freed once no range maps it.
pub fn release(handle: u64) void {
    const f = o.cuMemRelease orelse return;
    if (handle == 0 or cuda.ready() == null) return;
    _ = f(handle);
}

/// Maps physical memory `handle` (of `bytes`) at ptr, inside a reserved range, read-write for
/// the device.
pub fn map(ptr: u64, bytes: u64, handle: u64) i32 {
    const dev = device() orelse return @intFromEnum(status.Status.internal);
    const m = o.cuMemMap orelse return lacking();
    const access = o.cuMemSetAccess orelse return lacking();
    var rc = m(ptr, @intCast(bytes), 0, handle, 0);
    if (rc != driver.success) return cuda.cuFail(rc, "mapping {d} bytes of device memory", .{bytes});
    const desc = [1]driver.CUmemAccessDesc{.{
        .location = .{ .type = driver.mem_location_type_device, .id = dev },
        .flags = driver.mem_access_read_write,
    }};
    rc = access(ptr, @intCast(bytes), &desc, 1);
    if (rc != driver.success) {
        if (o.cuMemUnmap) |u| _ = u(ptr, @intCast(bytes));
        return cuda.cuFail(rc, "making {d} mapped bytes accessible", .{bytes});
    }
    return 0;
}

/// Unmaps [ptr, ptr + bytes) once the stream has drained (queued kernels may still read it).
pub fn unmap(ptr: u64, bytes: u64) i32 {
    _ = device() orelse return @intFromEnum(status.Status.internal);
    const f = o.cuMemUnmap orelse return lacking();
    const rc0 = cuda.sync();
    if (rc0 != 0) return rc0;
    const rc = f(ptr, @intCast(bytes));
    if (rc != driver.success) return cuda.cuFail(rc, "unmapping {d} bytes of device memory", .{bytes});
    return 0;
}
