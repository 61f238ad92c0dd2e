//! NCCL, loaded at run time like libcuda (driver.zig) and cuBLAS (cublas.zig): the collectives of
//! tensor parallelism over several GPUs of one host (ts/model/tensor-parallel.ts). One process
//! drives every GPU with a stream each (ncclCommInitAll, calls between ncclGroupStart/End), or a
//! process per GPU (ncclGetUniqueId, ncclCommInitRank); both run on the devices' primary
//! contexts, which is what the CUDA backend uses (cuda.zig). Nothing loads it unless asked for
//! several GPUs, so a missing NCCL costs a one-GPU user nothing.
const std = @import("std");
const builtin = @import("builtin");
const status = @import("../status.zig");

const cc = std.builtin.CallingConvention.c;
pub const Comm = ?*anyopaque;
pub const Stream = ?*anyopaque;

/// ncclUniqueId: 128 opaque bytes passed by value (nccl.h NCCL_UNIQUE_ID_BYTES).
pub const UniqueId = extern struct { internal: [128]u8 };

/// ncclResult_t, ncclDataType_t and ncclRedOp_t values used here (nccl.h).
pub const success: c_int = 0;
pub const float32: c_int = 7;
pub const float16: c_int = 6;
pub const sum: c_int = 0;

const Api = struct {
    ncclGetVersion: *const fn (*c_int) callconv(cc) c_int,
    ncclGetUniqueId: *const fn (*UniqueId) callconv(cc) c_int,
    ncclCommInitRank: *const fn (*Comm, c_int, UniqueId, c_int) callconv(cc) c_int,
    ncclCommInitAll: *const fn ([*]Comm, c_int, ?[*]const c_int) callconv(cc) c_int,
    ncclCommDestroy: *const fn (Comm) callconv(cc) c_int,
    ncclAllReduce: *const fn (?*const anyopaque, ?*anyopaque, usize, c_int, c_int, Comm, Stream) callconv(cc) c_int,
    ncclAllGather: *const fn (?*const anyopaque, ?*anyopaque, usize, c_int, Comm, Stream) callconv(cc) c_int,
    ncclGroupStart: *const fn () callconv(cc) c_int,
    ncclGroupEnd: *const fn () callconv(cc) c_int,
    ncclGetErrorString: *const fn (c_int) callconv(cc) ?[*:0]const u8,
};

var api: Api = undefined;
var loaded = false;

/// NCCL 2's soname, then the unversioned link (a toolkit or a pip wheel's lib on the loader path).
const names = [_][:0]const u8{ "libnccl.so.2", "libnccl.so" };

/// Loads NCCL once; fails with one line naming what was tried.
pub fn load() i32 {
    if (loaded) return @intFromEnum(status.Status.ok);
    if (builtin.os.tag != .linux) return status.fail(.unsupported, "NCCL not available: several GPUs run on Linux only", .{});
    var lib: ?*anyopaque = null;
    for (names) |name| {
        lib = std.c.dlopen(name, .{ .NOW = true });
        if (lib != null) break;
    }
    const l = lib orelse return status.fail(.unsupported, "NCCL not available: cannot load libnccl.so.2 " ++
        "(several GPUs need NCCL 2: the libnccl2 package or the nvidia-nccl-cu12 wheel on the library path)", .{});
    inline for (@typeInfo(Api).@"struct".fields) |f| {
        const sym = std.c.dlsym(l, f.name) orelse
            return status.fail(.unsupported, "NCCL not available: libnccl lacks " ++ f.name ++ " (NCCL older than 2.x?)", .{});
        @field(api, f.name) = @ptrCast(@alignCast(sym));
    }
    loaded = true;
    return @intFromEnum(status.Status.ok);
}

fn check(rc: c_int, comptime what: []const u8) i32 {
    if (rc == success) return @intFromEnum(status.Status.ok);
    const text: []const u8 = if (api.ncclGetErrorString(rc)) |t| std.mem.span(t) else "unknown error";
    return status.fail(.internal, "NCCL " ++ what ++ ": {s} (ncclResult {d})", .{ text, rc });
}

fn ready() ?i32 {
    if (!loaded) return status.fail(.internal, "NCCL used before infer_nccl_load", .{});
    return null;
}

/// NCCL's version as major*10000 + minor*100 + patch (NCCL_VERSION_CODE).
pub fn version(out: *i32) i32 {
    if (ready()) |rc| return rc;
    var v: c_int = 0;
    const rc = check(api.ncclGetVersion(&v), "get version");
    out.* = v;
    return rc;
}

/// One communicator per device 0 .. n - 1, every rank in this process (ncclCommInitAll).
pub fn initAll(comms: []u64) i32 {
    if (ready()) |rc| return rc;
    if (comms.len == 0 or comms.len > 64) return status.fail(.invalid_argument, "NCCL: {d} devices", .{comms.len});
    var handles: [64]Comm = @splat(null);
    const rc = check(api.ncclCommInitAll(&handles, @intCast(comms.len), null), "comm init all");
    for (comms, handles[0..comms.len]) |*c, h| c.* = @intFromPtr(h);
    return rc;
}

/// A new unique id for ncclCommInitRank (rank 0 makes it and hands it to the others).
pub fn uniqueId(out: *[128]u8) i32 {
    if (ready()) |rc| return rc;
    var id: UniqueId = undefined;
    const rc = check(api.ncclGetUniqueId(&id), "get unique id");
    out.* = id.internal;
    return rc;
}

/// This process's rank of `ranks` (on its current device), joined under `id`.
pub fn initRank(id: *const [128]u8, ranks: u32, rank: u32, out: *u64) i32 {
    if (ready()) |rc| return rc;
    if (rank >= ranks) return status.fail(.invalid_argument, "NCCL: rank {d} of {d}", .{ rank, ranks });
    var comm: Comm = null;
    const rc = check(api.ncclCommInitRank(&comm, @intCast(ranks), .{ .internal = id.* }, @intCast(rank)), "comm init rank");
    out.* = @intFromPtr(comm);
    return rc;
}

pub fn destroy(comm: u64) i32 {
    if (ready()) |rc| return rc;
    return check(api.ncclCommDestroy(@ptrFromInt(comm)), "comm destroy");
}

pub fn groupStart() i32 {
    if (ready()) |rc| return rc;
    return check(api.ncclGroupStart(), "group start");
}

pub fn groupEnd() i32 {
    if (ready()) |rc| return rc;
    return check(api.ncclGroupEnd(), "group end");
}

/// The element type of a collective: 0 = f32, 1 = f16.
fn dataType(kind: u32) ?c_int {
    return switch (kind) {
        0 => float32,
        1 => float16,
        else => null,
    };
}

/// recv = Σ over ranks of send (count elements), queued on `stream`; send may equal recv.
pub fn allReduceSum(comm: u64, stream: u64, send: u64, recv: u64, count: u64, kind: u32) i32 {
    if (ready()) |rc| return rc;
    const dt = dataType(kind) orelse return status.fail(.invalid_argument, "NCCL: element type {d}", .{kind});
    return check(api.ncclAllReduce(@ptrFromInt(send), @ptrFromInt(recv), count, dt, sum, @ptrFromInt(comm), @ptrFromInt(stream)), "all-reduce");
}

/// recv = every rank's send (count elements each) in rank order, queued on `stream`.
pub fn allGather(comm: u64, stream: u64, send: u64, recv: u64, count: u64, kind: u32) i32 {
    if (ready()) |rc| return rc;
    const dt = dataType(kind) orelse return status.fail(.invalid_argument, "NCCL: element type {d}", .{kind});
    return check(api.ncclAllGather(@ptrFromInt(send), @ptrFromInt(recv), count, dt, @ptrFromInt(comm), @ptrFromInt(stream)), "all-gather");
}
