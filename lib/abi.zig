//! The structs of the C ABI: what a call takes when its arguments are more than a handful, and
//! the library's settings. ts/native/gen-symbols.ts reads this file and writes each struct's
//! layout (C rules: every field at its natural alignment) into ts/native/symbols.gen.ts, where
//! ts/native/abi.ts packs them field by field, so the two sides cannot drift; the size each
//! `comptime` block asserts is checked by the generator too. Fields are u8/u32/i32/u64/f32/bool
//! or byte arrays; a field's default is the value TypeScript packs when it leaves it out.
const std = @import("std");

/// The library's settings, given once by its host after loading it (infer_configure; the
/// TypeScript side reads them from the environment: ts/config/env.ts). The library reads no
/// environment itself. Until infer_configure runs (the Zig tests), these defaults hold.
pub const Settings = extern struct {
    /// Regions of infer_pages_alloc advised into huge pages where the system allows
    /// (lib/pages.zig; INFER_HUGE_PAGES=0: not).
    huge_pages: bool = true,
    /// CUDA launches with programmatic dependent launch on sm_90+ (lib/cuda/cuda.zig;
    /// INFER_CUDA_PDL=0: every kernel waits for the one before it as a plain stream does).
    cuda_pdl: bool = true,
    /// Bytes of cublas_path used; 0: the usual names only (lib/cuda/cublas.zig).
    cublas_path_len: u16 = 0,
    /// Prompts of at least this many tokens take quantized matmuls as cuBLAS f16 GEMMs where
    /// cuBLAS loads, 0 never (lib/cuda/ops.zig; INFER_CUDA_CUBLAS).
    cuda_cublas_min_tokens: u32 = 128,
    /// A libcublas to try before the usual names (INFER_CUBLAS).
    cublas_path: [path_bytes_max]u8 = @splat(0),

    pub const path_bytes_max = 4096;

    pub fn cublasPath(s: *const Settings) ?[]const u8 {
        return if (s.cublas_path_len == 0) null else s.cublas_path[0..s.cublas_path_len];
    }
};
comptime {
    std.debug.assert(@sizeOf(Settings) == 4104);
}
