//! cuBLAS, loaded at run time like libcuda (lib/cuda/driver.zig), for one thing: the f16 GEMM of
//! long prompts. A prompt's quantized matmul can run as dequantize-to-f16 then a tensor-core GEMM
//! (on Hopper cuBLAS issues wgmma, which the hand-written MMQ kernels' mma.sync do not reach);
//! ops.zig decides when. Missing cuBLAS is not an error: the MMQ kernels remain.
const std = @import("std");
const builtin = @import("builtin");
const driver = @import("driver.zig");
const settings = @import("../settings.zig");

const cc = std.builtin.CallingConvention.c;
pub const Handle = ?*anyopaque;
/// cublasStatus_t, cudaDataType_t, cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t values.
pub const status_success: c_int = 0;
pub const r_16f: c_int = 2;
pub const r_16bf: c_int = 14;
pub const r_32f: c_int = 0;
pub const compute_32f: c_int = 68;
pub const gemm_default: c_int = -1;
pub const op_n: c_int = 0;
pub const op_t: c_int = 1;

const Api = struct {
    cublasCreate_v2: *const fn (*Handle) callconv(cc) c_int,
    cublasSetStream_v2: *const fn (Handle, driver.CUstream) callconv(cc) c_int,
    cublasGemmEx: *const fn (
        Handle,
        c_int, // transa
        c_int, // transb
        c_int, // m
        c_int, // n
        c_int, // k
        *const anyopaque, // alpha
        ?*const anyopaque, // A
        c_int, // Atype
        c_int, // lda
        ?*const anyopaque, // B
        c_int, // Btype
        c_int, // ldb
        *const anyopaque, // beta
        ?*anyopaque, // C
        c_int, // Ctype
        c_int, // ldc
        c_int, // computeType
        c_int, // algo
    ) callconv(cc) c_int,
};

var api: Api = undefined;
var handle: Handle = null;
var tried = false;

/// Library names tried in turn: CUDA 13's, 12's, the unversioned link, and the toolkit's usual
/// place (the cublas_path setting, INFER_CUBLAS, names a file to try first: lib/abi.zig Settings).
const names = [_][:0]const u8{
    "libcublas.so.13",
    "libcublas.so.12",
    "libcublas.so",
    "/usr/local/cuda/lib64/libcublas.so",
};

/// Loads cuBLAS and makes a handle on `stream` (once); false when it is not there.
pub fn ready(stream: driver.CUstream) bool {
    if (handle != null) return true;
    if (tried) return false;
    tried = true;
    if (builtin.os.tag != .linux) return false;
    var lib: ?*anyopaque = null;
    if (settings.current.cublasPath()) |path| {
        var buf: [std.fs.max_path_bytes:0]u8 = undefined;
        if (path.len < buf.len) {
            @memcpy(buf[0..path.len], path);
            buf[path.len] = 0;
            lib = std.c.dlopen(buf[0..path.len :0], .{ .NOW = true });
        }
    }
    for (names) |name| {
        if (lib != null) break;
        lib = std.c.dlopen(name, .{ .NOW = true });
    }
    const l = lib orelse return false;
    inline for (@typeInfo(Api).@"struct".fields) |f| {
        const sym = std.c.dlsym(l, f.name) orelse return false;
        @field(api, f.name) = @ptrCast(@alignCast(sym));
    }
    var h: Handle = null;
    if (api.cublasCreate_v2(&h) != status_success) return false;
    if (api.cublasSetStream_v2(h, stream) != status_success) return false;
    handle = h;
    return true;
}

/// y[t][o] = Σ_i w[o][i] · x[t][i] for t < n_tok, o < n_out: w and x row-major, both of `kind`
/// (r_16f, r_16bf or r_32f), y f32 row-major, the products summed in f32 (column-major cuBLAS:
/// yᵀ = wᵀᵀ · xᵀ). Returns the cublasStatus_t.
pub fn gemm(kind: c_int, w: u64, x: u64, y: u64, n_out: i32, n_in: i32, n_tok: i32) c_int {
    const alpha: f32 = 1;
    const beta: f32 = 0;
    return api.cublasGemmEx(handle, op_t, op_n, n_out, n_tok, n_in, &alpha, @ptrFromInt(w), kind, n_in, @ptrFromInt(x), kind, n_in, &beta, @ptrFromInt(y), r_32f, n_out, compute_32f, gemm_default);
}
