//! The kernels of the CUDA module (shaders/cuda/*.cu, *.cuh) by their extern "C" names, and
//! how each weight type is computed: which kernels, block sizes, the activation format, and the
//! GPU layouts some types are rewritten into at upload (shaders/cuda/packed.cuh). Data only:
//! lib/cuda/cuda.zig loads the kernels and launches them.
const std = @import("std");

/// Kernels of the module, by their extern "C" names in shaders/cuda/infer.cu.
pub const Kernel = enum {
    get_rows_q4_0,
    get_rows_q5_0,
    get_rows_q8_0,
    get_rows_mxfp4,
    get_rows_q4_k,
    get_rows_q5_k,
    get_rows_q6_k,
    get_rows_f32,
    get_rows_f16,
    get_rows_bf16,
    get_rows_q4_0r,
    get_rows_q8_0r,
    get_rows_q4_kr,
    repack_q4_0,
    repack_q8_0,
    repack_q4_k,
    quantize_q8_0,
    quantize_q8_k,
    matvec_q4_0_1,
    matvec_q4_0_8,
    matvec_q5_0_1,
    matvec_q5_0_8,
    matvec_q8_0_1,
    matvec_q8_0_8,
    matvec_mxfp4_1,
    matvec_mxfp4_8,
    matvec_q4_k_1,
    matvec_q4_k_8,
    matvec_q5_k_1,
    matvec_q5_k_8,
    matvec_q6_k_1,
    matvec_q6_k_8,
    matvec_f32_1,
    matvec_f32_8,
    matvec_f16_1,
    matvec_f16_8,
    matvec_bf16_1,
    matvec_bf16_8,
    matvec_q4_0r_1,
    matvec_q4_0r_8,
    matvec_q8_0r_1,
    matvec_q8_0r_8,
    matvec_q4_kr_1,
    matvec_q4_kr_8,
    matvec_multi_q4_0,
    matvec_multi_q5_0,
    matvec_multi_q8_0,
    matvec_multi_mxfp4,
    matvec_multi_q4_k,
    matvec_multi_q5_k,
    matvec_multi_q6_k,
    matvec_multi_q4_0r,
    matvec_multi_q8_0r,
    matvec_multi_q4_kr,
    matvec_pipe_q4_0r,
    matvec_pipe_q8_0r,
    matvec_pipe_q4_kr,
    matvec_pipe_split_q4_0r,
    matvec_pipe_split_q8_0r,
    matvec_pipe_split_q4_kr,
    matvec_pipe_multi_q4_0r,
    matvec_pipe_multi_q8_0r,
    matvec_pipe_multi_q4_kr,
    attn_scores_mma,
    attn_values_mma,
    mmq_q4_0,
    mmq_q5_0,
    mmq_q8_0,
    mmq_q4_k,
    mmq_q5_k,
    mmq_q6_k,
    mmq_q4_0r,
    mmq_q8_0r,
    mmq_q4_kr,
    mmqn_q4_0_n8,
    mmqn_q4_0_n16,
    mmqn_q4_0_n32,
    mmqn_q4_0_n64,
    mmqn_q5_0_n8,
    mmqn_q5_0_n16,
    mmqn_q5_0_n32,
    mmqn_q5_0_n64,
    mmqn_q8_0_n8,
    mmqn_q8_0_n16,
    mmqn_q8_0_n32,
    mmqn_q8_0_n64,
    mmqn_q4_k_n8,
    mmqn_q4_k_n16,
    mmqn_q4_k_n32,
    mmqn_q4_k_n64,
    mmqn_q5_k_n8,
    mmqn_q5_k_n16,
    mmqn_q5_k_n32,
    mmqn_q5_k_n64,
    mmqn_q6_k_n8,
    mmqn_q6_k_n16,
    mmqn_q6_k_n32,
    mmqn_q6_k_n64,
    mmqn_q4_0r_n8,
    mmqn_q4_0r_n16,
    mmqn_q4_0r_n32,
    mmqn_q4_0r_n64,
    mmqn_q8_0r_n8,
    mmqn_q8_0r_n16,
    mmqn_q8_0r_n32,
    mmqn_q8_0r_n64,
    mmqn_q4_kr_n8,
    mmqn_q4_kr_n16,
    mmqn_q4_kr_n32,
    mmqn_q4_kr_n64,
    mmqn_k16_q4_0_n8,
    mmqn_k16_q4_0_n16,
    mmqn_k16_q4_0_n32,
    mmqn_k16_q5_0_n8,
    mmqn_k16_q5_0_n16,
    mmqn_k16_q5_0_n32,
    mmqn_k16_q8_0_n8,
    mmqn_k16_q8_0_n16,
    mmqn_k16_q8_0_n32,
    mmqn_k16_q4_k_n8,
    mmqn_k16_q4_k_n16,
    mmqn_k16_q4_k_n32,
    mmqn_k16_q5_k_n8,
    mmqn_k16_q5_k_n16,
    mmqn_k16_q5_k_n32,
    mmqn_k16_q6_k_n8,
    mmqn_k16_q6_k_n16,
    mmqn_k16_q6_k_n32,
    mmqn_k16_q4_0r_n8,
    mmqn_k16_q4_0r_n16,
    mmqn_k16_q4_0r_n32,
    mmqn_k16_q8_0r_n8,
    mmqn_k16_q8_0r_n16,
    mmqn_k16_q8_0r_n32,
    mmqn_k16_q4_kr_n8,
    mmqn_k16_q4_kr_n16,
    mmqn_k16_q4_kr_n32,
    mmq_q4_0_64x128,
    mmq_q5_0_64x128,
    mmq_q8_0_64x128,
    mmq_q6_k_64x128,
    mmq_q4_0r_64x128,
    mmq_q8_0r_64x128,
    rms_norm,
    rms_norm_add,
    rms_norm_q,
    add_rms_norm_q,
    rms_norm2,
    rope,
    rope2,
    kv_store,
    kv_store_rows,
    kv_shift_gather,
    kv_shift_scatter,
    kv_store_turbo,
    tq_rotate,
    attn_scores,
    attn_values,
    attn_decode_g1,
    attn_decode_g2,
    attn_decode_g4,
    attn_decode_g8,
    attn_decode_w,
    attn_decode_mma_d64,
    attn_decode_mma_d128,
    attn_prompt_d64,
    attn_prompt_d128,
    attn_decode_mma_q_d64,
    attn_decode_mma_q_d128,
    attn_prompt_q_d64,
    attn_prompt_q_d128,
    gelu_mul,
    silu_mul,
    add,
    scale,
    add_row_bias,
    gelu_mul_q,
    silu_mul_q,
    argmax_f32,
    norm_rope_store,
    dequant_f16_q4_0,
    dequant_f16_q5_0,
    dequant_f16_q8_0,
    dequant_f16_mxfp4,
    dequant_f16_q4_k,
    dequant_f16_q5_k,
    dequant_f16_q6_k,
    dequant_f16_q4_0r,
    dequant_f16_q8_0r,
    dequant_f16_q4_kr,
    f32_to_f16,
    f32_to_bf16,
    sum_splits,
    moe_route,
    moe_group,
    moe_sum,
    moe_swiglu_oai,
    moe_swiglu_oai_q,
    moe_mv_q4_0,
    moe_mv8_q4_0,
    moe_mv_q5_0,
    moe_mv8_q5_0,
    moe_mv_q8_0,
    moe_mv8_q8_0,
    moe_mv_mxfp4,
    moe_mv8_mxfp4,
    moe_mv_q4_k,
    moe_mv8_q4_k,
    moe_mv_q5_k,
    moe_mv8_q5_k,
    moe_mv_q6_k,
    moe_mv8_q6_k,
    moe_mv_q4_0r,
    moe_mv8_q4_0r,
    moe_mv_q8_0r,
    moe_mv8_q8_0r,
    moe_mv_q4_kr,
    moe_mv8_q4_kr,
    moe_mmq_q4_0_n8,
    moe_mmq_q4_0_n32,
    moe_mmq_q5_0_n8,
    moe_mmq_q5_0_n32,
    moe_mmq_q8_0_n8,
    moe_mmq_q8_0_n32,
    moe_mmq_mxfp4_n8,
    moe_mmq_mxfp4_n32,
    moe_mmq_q4_k_n8,
    moe_mmq_q4_k_n32,
    moe_mmq_q5_k_n8,
    moe_mmq_q5_k_n32,
    moe_mmq_q6_k_n8,
    moe_mmq_q6_k_n32,
    moe_mmq_q4_0r_n8,
    moe_mmq_q4_0r_n32,
    moe_mmq_q8_0r_n8,
    moe_mmq_q8_0r_n32,
    moe_mmq_q4_kr_n8,
    moe_mmq_q4_kr_n32,
};

pub const kernel_count = @typeInfo(Kernel).@"enum".fields.len;

/// How a weight type is computed on the GPU.
pub const WeightKind = struct {
    name: []const u8,
    block_values: u32,
    block_bytes: u32,
    get_rows: Kernel,
    matvec_1: Kernel,
    matvec_8: Kernel,
    /// Several matrices sharing one input and one token (quantized types only).
    matvec_multi: ?Kernel = null,
    /// One-token matvecs whose weights stream through shared memory (GPU layouts only), and their
    /// matvec_multi; shaders/cuda/matvec_pipe.cuh.
    matvec_pipe: ?Kernel = null,
    /// The same with each row split among the block's 4 warps (long rows: ops.zig pipeStages).
    matvec_pipe_split: ?Kernel = null,
    matvec_pipe_multi: ?Kernel = null,
    /// Whether the pipelined matvec can sum half a superblock a lane, the activation in shared
    /// memory (n_in bytes after its stages; matvec_pipe.cuh rows_halves, ops.zig pipe_halves_min).
    pipe_halves: bool = false,
    /// The tensor-core kernel for batches of many tokens (the 32 × 64 tile), if any.
    mmq: ?Kernel = null,
    /// Its 64 × 128 tile, which prompts of lib/cuda/ops.zig's mmq_large_tokens and more take.
    /// None for Q4_K and Q5_K: their small-tile kernel stages whole superblocks and sums each as
    /// integers (shaders/cuda/matmul.cuh mmq, SUPER), which a half-superblock stage cannot.
    mmq_prompt: ?Kernel = null,
    /// The tensor-core kernels for decode batches of 2 to 64 tokens, tiles of 8, 16, 32 and 64
    /// tokens (shaders/cuda/matmul.cuh mmqn; lib/cuda/ops.zig batchMma).
    mmqn: ?[4]Kernel = null,
    /// The same with two m16n8k16 MMAs and a float combine per unit, tiles of 8, 16 and 32 tokens
    /// (shaders/cuda/matmul.cuh mmqn_k16): kept while benches compare the two
    /// (INFER_CUDA_BATCH_MMA of 100 and more).
    mmqn_k16: ?[3]Kernel = null,
    /// The activation format its matvec reads: 0 = Q8_0 blocks, 1 = Q8_K superblocks, -1 = f32.
    activation: i32,
    /// Its rows dequantized to f16, for the cuBLAS GEMM of long prompts (quantized types).
    dequant_f16: ?Kernel = null,
};

pub fn weightKind(type_id: u32) ?WeightKind {
    return switch (type_id) {
        0 => .{ .name = "F32", .block_values = 1, .block_bytes = 4, .get_rows = .get_rows_f32, .matvec_1 = .matvec_f32_1, .matvec_8 = .matvec_f32_8, .activation = -1 },
        1 => .{ .name = "F16", .block_values = 1, .block_bytes = 2, .get_rows = .get_rows_f16, .matvec_1 = .matvec_f16_1, .matvec_8 = .matvec_f16_8, .activation = -1 },
        30 => .{ .name = "BF16", .block_values = 1, .block_bytes = 2, .get_rows = .get_rows_bf16, .matvec_1 = .matvec_bf16_1, .matvec_8 = .matvec_bf16_8, .activation = -1 },
        2 => .{ .name = "Q4_0", .block_values = 32, .block_bytes = 18, .get_rows = .get_rows_q4_0, .matvec_1 = .matvec_q4_0_1, .matvec_8 = .matvec_q4_0_8, .matvec_multi = .matvec_multi_q4_0, .mmq = .mmq_q4_0, .mmqn = .{ .mmqn_q4_0_n8, .mmqn_q4_0_n16, .mmqn_q4_0_n32, .mmqn_q4_0_n64 }, .mmqn_k16 = .{ .mmqn_k16_q4_0_n8, .mmqn_k16_q4_0_n16, .mmqn_k16_q4_0_n32 }, .mmq_prompt = .mmq_q4_0_64x128, .activation = 0, .dequant_f16 = .dequant_f16_q4_0 },
        6 => .{ .name = "Q5_0", .block_values = 32, .block_bytes = 22, .get_rows = .get_rows_q5_0, .matvec_1 = .matvec_q5_0_1, .matvec_8 = .matvec_q5_0_8, .matvec_multi = .matvec_multi_q5_0, .mmq = .mmq_q5_0, .mmqn = .{ .mmqn_q5_0_n8, .mmqn_q5_0_n16, .mmqn_q5_0_n32, .mmqn_q5_0_n64 }, .mmqn_k16 = .{ .mmqn_k16_q5_0_n8, .mmqn_k16_q5_0_n16, .mmqn_k16_q5_0_n32 }, .mmq_prompt = .mmq_q5_0_64x128, .activation = 0, .dequant_f16 = .dequant_f16_q5_0 },
        8 => .{ .name = "Q8_0", .block_values = 32, .block_bytes = 34, .get_rows = .get_rows_q8_0, .matvec_1 = .matvec_q8_0_1, .matvec_8 = .matvec_q8_0_8, .matvec_multi = .matvec_multi_q8_0, .mmq = .mmq_q8_0, .mmqn = .{ .mmqn_q8_0_n8, .mmqn_q8_0_n16, .mmqn_q8_0_n32, .mmqn_q8_0_n64 }, .mmqn_k16 = .{ .mmqn_k16_q8_0_n8, .mmqn_k16_q8_0_n16, .mmqn_k16_q8_0_n32 }, .mmq_prompt = .mmq_q8_0_64x128, .activation = 0, .dequant_f16 = .dequant_f16_q8_0 },
        // MXFP4 (gpt-oss's experts): one-token and batch matvecs, no tensor-core kernel; long
        // prompts take cuBLAS on its f16 dequantization.
        39 => .{ .name = "MXFP4", .block_values = 32, .block_bytes = 17, .get_rows = .get_rows_mxfp4, .matvec_1 = .matvec_mxfp4_1, .matvec_8 = .matvec_mxfp4_8, .matvec_multi = .matvec_multi_mxfp4, .activation = 0, .dequant_f16 = .dequant_f16_mxfp4 },
        12 => .{ .name = "Q4_K", .block_values = 256, .block_bytes = 144, .get_rows = .get_rows_q4_k, .matvec_1 = .matvec_q4_k_1, .matvec_8 = .matvec_q4_k_8, .matvec_multi = .matvec_multi_q4_k, .mmq = .mmq_q4_k, .mmqn = .{ .mmqn_q4_k_n8, .mmqn_q4_k_n16, .mmqn_q4_k_n32, .mmqn_q4_k_n64 }, .mmqn_k16 = .{ .mmqn_k16_q4_k_n8, .mmqn_k16_q4_k_n16, .mmqn_k16_q4_k_n32 }, .activation = 1, .dequant_f16 = .dequant_f16_q4_k },
        13 => .{ .name = "Q5_K", .block_values = 256, .block_bytes = 176, .get_rows = .get_rows_q5_k, .matvec_1 = .matvec_q5_k_1, .matvec_8 = .matvec_q5_k_8, .matvec_multi = .matvec_multi_q5_k, .mmq = .mmq_q5_k, .mmqn = .{ .mmqn_q5_k_n8, .mmqn_q5_k_n16, .mmqn_q5_k_n32, .mmqn_q5_k_n64 }, .mmqn_k16 = .{ .mmqn_k16_q5_k_n8, .mmqn_k16_q5_k_n16, .mmqn_k16_q5_k_n32 }, .activation = 1, .dequant_f16 = .dequant_f16_q5_k },
        14 => .{ .name = "Q6_K", .block_values = 256, .block_bytes = 210, .get_rows = .get_rows_q6_k, .matvec_1 = .matvec_q6_k_1, .matvec_8 = .matvec_q6_k_8, .matvec_multi = .matvec_multi_q6_k, .mmq = .mmq_q6_k, .mmqn = .{ .mmqn_q6_k_n8, .mmqn_q6_k_n16, .mmqn_q6_k_n32, .mmqn_q6_k_n64 }, .mmqn_k16 = .{ .mmqn_k16_q6_k_n8, .mmqn_k16_q6_k_n16, .mmqn_k16_q6_k_n32 }, .mmq_prompt = .mmq_q6_k_64x128, .activation = 1, .dequant_f16 = .dequant_f16_q6_k },
        // The GPU layouts of shaders/cuda/packed.cuh (repack): groups of 256 values, the bytes of
        // the blocks they came from.
        packed_type | 2 => .{ .name = "Q4_0 (GPU layout)", .block_values = 256, .block_bytes = 144, .get_rows = .get_rows_q4_0r, .matvec_1 = .matvec_q4_0r_1, .matvec_8 = .matvec_q4_0r_8, .matvec_multi = .matvec_multi_q4_0r, .matvec_pipe = .matvec_pipe_q4_0r, .matvec_pipe_split = .matvec_pipe_split_q4_0r, .matvec_pipe_multi = .matvec_pipe_multi_q4_0r, .mmq = .mmq_q4_0r, .mmqn = .{ .mmqn_q4_0r_n8, .mmqn_q4_0r_n16, .mmqn_q4_0r_n32, .mmqn_q4_0r_n64 }, .mmqn_k16 = .{ .mmqn_k16_q4_0r_n8, .mmqn_k16_q4_0r_n16, .mmqn_k16_q4_0r_n32 }, .mmq_prompt = .mmq_q4_0r_64x128, .activation = 0, .dequant_f16 = .dequant_f16_q4_0r },
        packed_type | 8 => .{ .name = "Q8_0 (GPU layout)", .block_values = 256, .block_bytes = 272, .get_rows = .get_rows_q8_0r, .matvec_1 = .matvec_q8_0r_1, .matvec_8 = .matvec_q8_0r_8, .matvec_multi = .matvec_multi_q8_0r, .matvec_pipe = .matvec_pipe_q8_0r, .matvec_pipe_split = .matvec_pipe_split_q8_0r, .matvec_pipe_multi = .matvec_pipe_multi_q8_0r, .mmq = .mmq_q8_0r, .mmqn = .{ .mmqn_q8_0r_n8, .mmqn_q8_0r_n16, .mmqn_q8_0r_n32, .mmqn_q8_0r_n64 }, .mmqn_k16 = .{ .mmqn_k16_q8_0r_n8, .mmqn_k16_q8_0r_n16, .mmqn_k16_q8_0r_n32 }, .mmq_prompt = .mmq_q8_0r_64x128, .activation = 0, .dequant_f16 = .dequant_f16_q8_0r },
        packed_type | 12 => .{ .name = "Q4_K (GPU layout)", .block_values = 256, .block_bytes = 144, .get_rows = .get_rows_q4_kr, .matvec_1 = .matvec_q4_kr_1, .matvec_8 = .matvec_q4_kr_8, .matvec_multi = .matvec_multi_q4_kr, .matvec_pipe = .matvec_pipe_q4_kr, .matvec_pipe_split = .matvec_pipe_split_q4_kr, .matvec_pipe_multi = .matvec_pipe_multi_q4_kr, .pipe_halves = true, .mmq = .mmq_q4_kr, .mmqn = .{ .mmqn_q4_kr_n8, .mmqn_q4_kr_n16, .mmqn_q4_kr_n32, .mmqn_q4_kr_n64 }, .mmqn_k16 = .{ .mmqn_k16_q4_kr_n8, .mmqn_k16_q4_kr_n16, .mmqn_k16_q4_kr_n32 }, .activation = 1, .dequant_f16 = .dequant_f16_q4_kr },
        else => null,
    };
}

/// Type ids of weights in a GPU layout: the ggml type id with this bit set (see repack).
pub const packed_type: u32 = 0x100;

/// The type id a weight of ggml type `type_id` and rows of n_in values computes as after
/// repack: its GPU layout (Q4_0, Q8_0, Q4_K with rows of whole 256-value groups), else type_id.
pub fn repackedType(type_id: u32, n_in: u64) u32 {
    if (n_in == 0 or n_in % 256 != 0) return type_id;
    return switch (type_id) {
        2, 8, 12 => packed_type | type_id,
        else => type_id,
    };
}

test "weight kinds cover the CPU's weight types" {
    for ([_]u32{ 0, 1, 2, 6, 8, 12, 13, 14, 30, 39 }) |id| try std.testing.expect(weightKind(id) != null);
    try std.testing.expect(weightKind(15) == null); // Q8_K is an activation format
}

test "GPU layouts: whole 256-value groups of Q4_0, Q8_0 and Q4_K, the GGUF's bytes per row" {
    try std.testing.expectEqual(packed_type | 2, repackedType(2, 768));
    try std.testing.expectEqual(@as(u32, 2), repackedType(2, 640));
    try std.testing.expectEqual(@as(u32, 6), repackedType(6, 768));
    for ([_]u32{ 2, 8, 12 }) |id| {
        const from = weightKind(id).?;
        const to = weightKind(repackedType(id, 4096)).?;
        try std.testing.expectEqual(4096 / from.block_values * from.block_bytes, 4096 / to.block_values * to.block_bytes);
        try std.testing.expectEqual(from.activation, to.activation);
    }
}
