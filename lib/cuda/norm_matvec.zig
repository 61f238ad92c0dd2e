//! A decode step's RMSNorms folded into the matvecs around them. Where a layer ran
//!   o-projection → add + rms_norm + quantize → gate/up   (and down → … → next q/k/v, head),
//! it runs
//!   o-projection adding its output into the residual → gate/up normalizing that residual itself,
//! two launches where there were three: the pipelined matvec's epilogue does the add (res,
//! shaders/cuda/matvec_pipe.cuh MATVEC_PIPE) and every block of the next matvec computes
//! rms_norm_q of the row into its own shared memory before its first row block
//! (MATVEC_PIPE_NORM). Both give every value bit for bit as the kernels they replace. Why: a
//! kernel boundary in a decode step costs a few µs of drain and ramp, and a row of a few thousand
//! values read from L2 by each block would cost less; measured, it does not
//! (bench/results/cuda.md, "Tried and not kept").
//! ts/backend/cuda-fuse.ts decides where the forms apply (fusable); each call here also runs
//! the unfused kernels when its fused kernel does not take the matrix, so every call is correct
//! on its own. Off unless INFER_CUDA_NORM_MATVEC=1 (see `enabled`).
const std = @import("std");
const cuda = @import("cuda.zig");
const ops = @import("ops.zig");
const kernels = @import("kernels.zig");

const invalid = cuda.invalid;
const int = cuda.int;
const tooLarge = cuda.tooLarge;

/// Off by default: measured on an H200 (bench/results/cuda.md) the fold costs more than
/// the launches it saves (the 8B's Q4_0 step 2,437 against 1,835 µs), likely because every
/// block of a folded matvec waits on the whole residual row and its norm before its weights.
/// INFER_CUDA_NORM_MATVEC=1 at init, or infer_cuda_set_norm_matvec, turns it on.
var enabled = false;

pub fn readSettings() void {
    if (std.posix.getenv("INFER_CUDA_NORM_MATVEC")) |v| enabled = std.mem.eql(u8, v, "1");
}

pub fn setEnabled(on: bool) void {
    enabled = on;
}

/// Shared bytes MATVEC_PIPE_NORM keeps besides the stages: the quantized row, its scales, 32
/// warps' sums of squares.
fn normBytes(n_in: u64) u64 {
    return n_in + n_in / 8 + 256;
}

/// The rows a matvec normalizes itself (matvec_pipe.cuh NORM_COLS_MAX: values held in registers,
/// 32 a thread) from those that rms_norm_q sums with 1,024 threads (ops.zig normThreads), in Q8_0
/// activations only: the Q8_K superblocks of Q4_K span the block's warps.
const norm_cols_max = 4096;
fn normFits(k: kernels.WeightKind, n_in: u64) bool {
    return k.matvec_pipe_norm != null and k.activation == 0 and n_in > 256 and n_in <= norm_cols_max and
        ops.normThreads(1, n_in) == 1024;
}

/// Whether the fused kernel takes this matrix: as a producer adding into the residual
/// (`residual`), or as a consumer normalizing its input (the widest of its matrices' rows).
pub fn fusable(type_id: u32, n_in: u64, n_out: u64, residual: bool) bool {
    if (!enabled) return false;
    const s = cuda.ready() orelse return false;
    const k = kernels.weightKind(type_id) orelse return false;
    if (n_in == 0 or n_in % k.block_values != 0) return false;
    if (residual) return ops.pipeStages(k, n_in, n_out, true, 0) != null;
    return s.norm_matvec_ok and normFits(k, n_in) and ops.pipeStages(k, n_in, n_out, false, normBytes(n_in)) != null;
}

/// res[i] += (W · xq)[i] for one token (the o or down projection, then the residual add). Where
/// the pipelined kernel does not take W: the matvec into y, then add(res, y).
pub fn matmulResidual(w: u64, type_id: u32, n_out: u64, n_in: u64, xq: u64, xd: u64, y: u64, res: u64) i32 {
    if (fusable(type_id, n_in, n_out, true)) {
        const k = kernels.weightKind(type_id).?;
        const p = ops.pipeStages(k, n_in, n_out, true, 0).?;
        const out = int(n_out) orelse return tooLarge("matmul_residual: n_out", n_out);
        const in = int(n_in) orelse return tooLarge("matmul_residual: n_in", n_in);
        const pipe = if (p.split) k.matvec_pipe_split.? else k.matvec_pipe.?;
        const grid = ops.pipeGrid(pipe, cuda.ceilDiv(n_out, p.blockRows()), p.shared);
        return cuda.launchShared(pipe, grid, 1, 128, p.shared, .{ w, out, in, xq, xd, res, @as(i32, @intCast(p.rows_per_warp)), @as(i32, @intFromBool(p.halves)), res });
    }
    const rc = ops.matmul(w, type_id, n_out, n_in, 0, xq, xd, 1, y);
    if (rc != 0) return rc;
    return ops.add(res, y, n_out, res);
}

/// Up to three one-token matmuls (n1 = 0: one; n2 = 0: two) of rms_norm(x) · weight quantized
/// in `mode`. Where the fused kernel does not take them: rms_norm_quant into normed, xq, xd,
/// then the matmuls.
pub fn normMatmul(type_id: u32, n_in: u64, x: u64, weight: u64, eps: f32, normed: u64, mode: u32, xq: u64, xd: u64, w0: u64, n0: u64, y0: u64, w1: u64, n1: u64, y1: u64, w2: u64, n2: u64, y2: u64) i32 {
    const k = kernels.weightKind(type_id) orelse return ops.unsupportedType(type_id);
    const m = ops.quantMode(mode, n_in) orelse return invalid("norm_matmul: mode {d} with n_in {d}", .{ mode, n_in });
    if (k.activation != m) return invalid("norm_matmul: mode {d} is not the activation format of {s}", .{ mode, k.name });
    if (n1 == 0 and n2 != 0) return invalid("norm_matmul: a third matrix without a second", .{});
    const widest = @max(n0, @max(n1, n2));
    if (fusable(type_id, n_in, widest, false)) {
        const p = ops.pipeStages(k, n_in, widest, false, normBytes(n_in)).?;
        const in = int(n_in) orelse return tooLarge("norm_matmul: n_in", n_in);
        const a = int(n0) orelse return tooLarge("norm_matmul: n0", n0);
        const b = int(n1) orelse return tooLarge("norm_matmul: n1", n1);
        const c = int(n2) orelse return tooLarge("norm_matmul: n2", n2);
        const per = p.blockRows();
        const row_blocks = cuda.ceilDiv(n0, per) + cuda.ceilDiv(n1, per) + cuda.ceilDiv(n2, per);
        const kernel = k.matvec_pipe_norm.?;
        return cuda.launchShared(kernel, ops.pipeGrid(kernel, row_blocks, p.shared), 1, 128, p.shared, .{ w0, a, y0, w1, b, y1, w2, c, y2, in, x, weight, eps, @as(i32, @intCast(p.rows_per_warp)), @as(i32, @intFromBool(p.halves)) });
    }
    const rc = ops.rmsNormQuant(x, weight, 1, n_in, eps, normed, mode, xq, xd);
    if (rc != 0) return rc;
    if (n1 == 0) return ops.matmul(w0, type_id, n0, n_in, 0, xq, xd, 1, y0);
    return ops.matmulMulti(type_id, n_in, xq, xd, w0, n0, y0, w1, n1, y1, w2, n2, y2);
}
