//! The CUDA backend's ops: one function per op that validates its arguments and launches the
//! kernels of shaders/cuda/ (lib/cuda/cuda.zig holds the device, memory, graphs and the launch
//! itself), with the rules that choose among kernels (the matvec split and grid, the MMQ
//! tiles). The attention ops live in lib/cuda/attention.zig and are re-exported here.
const std = @import("std");
const status = @import("../status.zig");
const driver = @import("driver.zig");
const cuda = @import("cuda.zig");
const kernels = @import("kernels.zig");
const Kernel = kernels.Kernel;
const weightKind = kernels.weightKind;
const State = cuda.State;
const launch = cuda.launch;
const launchShared = cuda.launchShared;
const ready = cuda.ready;
const invalid = cuda.invalid;
const ceilDiv = cuda.ceilDiv;
const int = cuda.int;
const tooLarge = cuda.tooLarge;
const cublas = @import("cublas.zig");
const attn = @import("attention.zig");
const abi = @import("../abi.zig");

/// The settings of the ops (cuda.init passes lib/settings.zig's before the first launch).
pub fn configure(settings: abi.Settings) void {
    cublas_min_tokens = settings.cuda_cublas_min_tokens;
    batch_mma_min = settings.cuda_batch_mma_min;
}

/// dst[i] = row ids[i] of a table of n_table_rows rows of n_cols values (ids on the device,
/// already checked against n_table_rows by the caller).
pub fn getRows(type_id: u32, table: u64, n_cols: u64, n_ids: u64, ids: u64, dst: u64) i32 {
    const w = weightKind(type_id) orelse return unsupportedType(type_id);
    if (n_cols == 0 or n_cols % w.block_values != 0 or (n_cols % 32 != 0 and w.block_values > 1))
        return invalid("get_rows: n_cols {d} is not a multiple of the {s} block", .{ n_cols, w.name });
    const cols = int(n_cols) orelse return tooLarge("get_rows: n_cols", n_cols);
    if (w.block_values == 1) {
        return launch(w.get_rows, ceilDiv(n_cols, 128), n_ids, 128, .{ table, cols, ids, dst });
    }
    return launch(w.get_rows, ceilDiv(n_cols / 32, 128), n_ids, 128, .{ table, cols, ids, dst });
}

fn unsupportedType(type_id: u32) i32 {
    return status.fail(.unsupported, "the CUDA backend does not compute ggml type {d} yet", .{type_id});
}

/// Quantizes n_rows x n_cols f32 values at x into q (int8) and d (one f32 scale per 32 values):
/// mode 0 = Q8_0 blocks, 1 = Q8_K superblocks (n_cols a multiple of 256).
pub fn quantize(x: u64, n_rows: u64, n_cols: u64, mode: u32, q: u64, d: u64) i32 {
    const block: u64 = if (mode == 0) 32 else if (mode == 1) 256 else return invalid("quantize: mode {d}", .{mode});
    if (n_cols % block != 0) return invalid("quantize: n_cols {d} is not a multiple of {d}", .{ n_cols, block });
    const n = std.math.mul(u64, n_rows, n_cols) catch return tooLarge("quantize: values", n_rows);
    const units = int(n / block) orelse return tooLarge("quantize: blocks", n / block);
    // Q8_0: a warp a unit; Q8_K: a block of 256 threads a superblock.
    if (mode == 0) return launch(.quantize_q8_0, ceilDiv(n / block * 32, 256), 1, 256, .{ x, units, q, d });
    return launch(.quantize_q8_k, n / block, 1, 256, .{ x, units, q, d });
}

/// Batches from this many tokens take the tensor-core kernels (mmq_*); fewer take matvec_8.
const mmq_min_tokens = 16;

/// The tiles of the mmq_* kernels (weight rows × tokens a block): the small one for batches
/// (WeightKind.mmq), the large one for prompts from mmq_large_tokens (WeightKind.mmq_prompt, where
/// the type has one; else the small tile). Measured on an H200 (2,048-token prompts and
/// 32-sequence batches of the 0.6B and 8B shapes): 64 × 128 prefill +7–26%, but half the speed at
/// 32 tokens; 128 × 64 and 64 × 64 tiles were slower than both.
const MmqTile = struct { rows: u32, toks: u32, units: u32 };
const mmq_tiles = [_]MmqTile{
    .{ .rows = 32, .toks = 64, .units = 8 },
    .{ .rows = 64, .toks = 128, .units = 4 },
};
const mmq_large_tokens = 256;

/// K-splits of an mmq_* launch (grid z; shaders/cuda/matmul.cuh mmq). A batch of a few dozen
/// tokens gives a grid of a few hundred blocks (a 4,096-row weight and 32 tokens: 128), each
/// walking the whole row one staged step (a memory round trip) at a time: 56 steps for a
/// 14,336-wide row. Splitting the row over grid z until the blocks fill one wave (the driver's
/// occupancy: 3 or 4 small-tile blocks a multiprocessor, by registers) turns that chain into
/// parallel work; each split keeps at least 2 steps. The partial
/// sums are added in split order (sum_splits), so a result does not depend on timing.
fn mmqSplits(kernel: Kernel, threads: u32, blocks: u64, steps: u64) u64 {
    const s = ready() orelse return 1;
    const cap = @min(mmq_split_max, @max(steps / 2, 1));
    const per_sm: u64 = resident(s, kernel, @intCast(threads));
    const want = ceilDiv(@as(u64, @intCast(s.sm_count)) * (if (per_sm == 0) 4 else per_sm), blocks);
    return @max(@min(want, cap), 1);
}
const mmq_split_max: u64 = 16;

/// Warps sharing a row of a one-token quantized matvec (shaders/cuda/matmul.cuh matvec_q): rows
/// of 384 units (12,288 values) and more take 4, from 192 units 2, so that a long row is not one
/// warp's serial work (an 8B model's 14,336-wide down projection: 4,096 rows, one wave of single
/// warps). The fused matvec_multi uses the same rule, so its rows equal matvec_1's bit for bit.
fn matvecSplit(n_in: u64) u32 {
    const units = n_in / 32;
    return if (units >= 384) 4 else if (units >= 192) 2 else 1;
}
/// Rows a warp of the register-fed one-token matvec (matvec_*_1; shaders/cuda/matmul.cuh
/// matvec_rows): 2. Two rows share each activation load;
/// on an H200 an 8B model's down projection went 20.3 -> 19.0 µs in Q8_0, 14.3 -> 12.6 in
/// Q4_K, 12.9 -> 12.4 in Q4_0.
const matvec_rows_per_warp: u32 = 2;

/// One-token matvecs (matvec_*_1, matvec_multi_*) launch one wave: as many blocks as fit on the
/// GPU at once (the driver's occupancy for 128 threads × multiprocessors), each looping over row
/// blocks. Every block is then resident from the start, so the kernel lets its successor launch
/// (pdl_begin) at once and the next norm or attention waits on the GPU already, where a grid of a
/// block per row block (up to 7,168 for an 8B model's gate/up) let it launch only once its last
/// wave had started. Measured on an H200: decode 8B Q4_0 406 -> 423 tok/s, 0.6B 1,227 -> 1,263 in
/// the same call; a grid past one wave (8 blocks a multiprocessor where Q8_0's 6 fit) was slower
/// than a block per row block.
fn matvecGrid(kernel: Kernel, row_blocks: u64) u64 {
    const s = ready() orelse return row_blocks;
    const per_sm: u64 = resident(s, kernel, 128);
    if (per_sm == 0) return row_blocks;
    return @min(row_blocks, per_sm * @as(u64, @intCast(s.sm_count)));
}

/// Blocks of 128 threads (no dynamic shared memory) of kernel k resident on a multiprocessor at
/// once, as the driver computes it from registers and shared memory; 0 when it cannot say.
fn resident(s: *State, k: Kernel, threads: c_int) u8 {
    const i = @intFromEnum(k);
    if (s.resident[i] == 0) {
        const occupancy = driver.optional.cuOccupancyMaxActiveBlocksPerMultiprocessor orelse return 0;
        var n: c_int = 0;
        if (occupancy(&n, s.kernels[i], threads, 0) != driver.success or n <= 0) return 0;
        s.resident[i] = @intCast(@min(n, 255));
    }
    return s.resident[i];
}

/// y[t][o] = W[o] · x[t] for t < n_tok. Quantized W reads the activations from xq/xd (see
/// quantize, in W's activation format); float W reads x.
pub fn matmul(a: abi.CudaMatmulArgs) i32 {
    const w = a.w;
    const type_id = a.type_id;
    const n_out = a.n_out;
    const n_in = a.n_in;
    const x = a.x;
    const xq = a.xq;
    const xd = a.xd;
    const n_tok = a.n_tok;
    const y = a.y;
    const k = weightKind(type_id) orelse return unsupportedType(type_id);
    if (n_in == 0 or n_in % k.block_values != 0 or (k.block_values > 1 and n_in % 32 != 0))
        return invalid("matmul: n_in {d} is not a multiple of the {s} block", .{ n_in, k.name });
    const out = int(n_out) orelse return tooLarge("matmul: n_out", n_out);
    const in = int(n_in) orelse return tooLarge("matmul: n_in", n_in);
    const tok = int(n_tok) orelse return tooLarge("matmul: n_tok", n_tok);
    const kernel = if (n_tok == 1) k.matvec_1 else k.matvec_8;
    const grid_y = if (n_tok == 1) 1 else ceilDiv(n_tok, 8);
    if (k.activation < 0) {
        if (cublas_min_tokens > 0 and n_tok >= cublas_min_tokens) {
            if (gemmFloat(type_id, w, out, in, x, tok, y)) |rc| return rc;
        }
        return launch(kernel, ceilDiv(n_out, 4), grid_y, 128, .{ w, out, in, x, tok, y });
    }
    if (xq == 0 or xd == 0) return invalid("matmul: {s} needs quantized activations", .{k.name});
    if (n_tok == 1) {
        if (pipeStages(k, n_in, n_out, true)) |p| {
            const pipe = if (p.split) k.matvec_pipe_split.? else k.matvec_pipe.?;
            return launchShared(pipe, pipeGrid(pipe, ceilDiv(n_out, p.blockRows()), p.shared), 1, 128, p.shared, .{ w, out, in, xq, xd, y, @as(i32, @intCast(p.rows_per_warp)), @as(i32, @intFromBool(p.halves)) });
        }
    }
    if (x != 0 and cublas_min_tokens > 0 and n_tok >= cublas_min_tokens) {
        if (gemmF16(k, w, out, in, x, tok, y)) |rc| return rc;
    }
    if (k.mmqn) |mmqn| {
        if (batch_mma_min >= batch_mma_k16) {
            // The m16n8k16 kernels, which benches compare with mmqn (K-quants stop at 32 rows).
            const min = batch_mma_min - batch_mma_k16;
            const max: i32 = if (k.activation == 1) 32 else batch_mma_max;
            if (min > 0 and n_tok >= min and n_tok <= max) return batchMmaK16(k.mmqn_k16.?, w, out, in, xq, xd, tok, y);
        } else if (batch_mma_min > 0 and n_tok >= batch_mma_min and n_tok <= batch_mma_max) {
            return batchMma(mmqn, w, out, in, xq, xd, tok, y);
        }
    }
    if (k.mmq) |mmq| {
        if (n_tok >= mmq_min_tokens) {
            const large = n_tok >= mmq_large_tokens and k.mmq_prompt != null;
            const tile = mmq_tiles[@intFromBool(large)];
            const kernel_mmq = if (large) k.mmq_prompt.? else mmq;
            const tiles_x = ceilDiv(n_out, tile.rows);
            const tiles_y = ceilDiv(n_tok, tile.toks);
            const splits = mmqSplits(kernel_mmq, tile.toks * 2, tiles_x * tiles_y, ceilDiv(n_in / 32, tile.units));
            if (splits > 1) {
                // Each split's partial sums in a plane of the scratch, then added in split order.
                const plane = n_tok * n_out;
                var parts: u64 = 0;
                if (cuda.scratch(.mmq_partials, 4 * plane * splits, &parts) == 0) {
                    const rc = cuda.launchGrid(kernel_mmq, tiles_x, tiles_y, splits, tile.toks * 2, 0, .{ w, out, in, xq, xd, tok, parts });
                    if (rc != 0) return rc;
                    const grid = @min(@as(u64, @intCast(ready().?.sm_count)) * 8, ceilDiv(plane, 256));
                    return launch(.sum_splits, grid, 1, 256, .{ parts, @as(i32, @intCast(splits)), @as(i64, @intCast(plane)), y });
                }
            }
            return launch(kernel_mmq, tiles_x, tiles_y, tile.toks * 2, .{ w, out, in, xq, xd, tok, y });
        }
    }
    const split: u32 = if (n_tok == 1) matvecSplit(n_in) else 1;
    const rows_per_warp: u32 = if (n_tok == 1) matvec_rows_per_warp else 1;
    const row_blocks = ceilDiv(n_out, 4 * rows_per_warp / split);
    return launch(kernel, if (n_tok == 1) matvecGrid(kernel, row_blocks) else row_blocks, grid_y, 128, .{ w, out, in, xq, xd, tok, y, @as(i32, @intCast(split)), @as(i32, @intCast(rows_per_warp)) });
}

/// Decode batches of batch_mma_min to batch_mma_max tokens take mmqn_* (shaders/cuda/matmul.cuh
/// mmqn): the weights as the MMA's 16-row side, tiles of 64 weight rows × 8, 16, 32 or 64 tokens
/// (the smallest that holds the batch; the 64-token tile is 8 warps, two per 16 rows), split over
/// K (grid z) until the blocks fill one wave, as mmq's batches are. Below batch_mma_min,
/// matvec_8 (one token: the matvecs). The cuda_batch_mma_min setting (lib/abi.zig Settings; 0:
/// never). Measured on an H100 (bench/results/cuda.md) with the m16n8k16 kernel (mmqn_k16),
/// decode steps of the 8B shape against matvec_8 / mmq: Q4_0 GPU time 7.3 -> 4.0 ms at 8 rows,
/// 13.9 -> 7.7 at 32, 15.8 -> 12.7 at 64; Q4_K 7.6 -> 4.9 at 8, 11.9 -> 11.0 at 32, 13.2 -> 20.1
/// at 64 (two 32-token tiles).
/// A setting of batch_mma_k16 + n takes mmqn_k16 from n rows instead, the K-quants to 32 rows
/// and the prompt's tile past that, so that a bench compares the two kernels in one process.
var batch_mma_min: u32 = (abi.Settings{}).cuda_batch_mma_min;
const batch_mma_max: i32 = 64;
const batch_mma_k16: u32 = 100;

pub fn setBatchMma(min_tokens: u32) i32 {
    batch_mma_min = min_tokens;
    return 0;
}

fn batchMma(mmqn: [4]Kernel, w: u64, out: i32, in: i32, xq: u64, xd: u64, tok: i32, y: u64) i32 {
    const toks: u32 = if (tok <= 8) 8 else if (tok <= 16) 16 else if (tok <= 32) 32 else 64;
    const kernel = mmqn[if (toks == 8) 0 else if (toks == 16) 1 else if (toks == 32) 2 else 3];
    const threads: u32 = if (toks == 64) 256 else 128;
    return launchSplit(kernel, threads, toks, w, out, in, xq, xd, tok, y);
}

fn batchMmaK16(mmqn: [3]Kernel, w: u64, out: i32, in: i32, xq: u64, xd: u64, tok: i32, y: u64) i32 {
    const toks: u32 = if (tok <= 8) 8 else if (tok <= 16) 16 else 32;
    const kernel = mmqn[if (toks == 8) 0 else if (toks == 16) 1 else 2];
    return launchSplit(kernel, 128, toks, w, out, in, xq, xd, tok, y);
}

/// A decode batch's tiles of 64 weight rows × toks tokens, split over K until they fill a wave.
fn launchSplit(kernel: Kernel, threads: u32, toks: u32, w: u64, out: i32, in: i32, xq: u64, xd: u64, tok: i32, y: u64) i32 {
    const tiles_x = ceilDiv(@intCast(out), 64);
    const tiles_y = ceilDiv(@intCast(tok), toks);
    const splits = mmqSplits(kernel, threads, tiles_x * tiles_y, ceilDiv(@as(u64, @intCast(in)) / 32, 8));
    if (splits > 1) {
        const plane = @as(u64, @intCast(tok)) * @as(u64, @intCast(out));
        var parts: u64 = 0;
        if (cuda.scratch(.mmq_partials, 4 * plane * splits, &parts) == 0) {
            const rc = cuda.launchGrid(kernel, tiles_x, tiles_y, splits, threads, 0, .{ w, out, in, xq, xd, tok, parts });
            if (rc != 0) return rc;
            const grid = @min(@as(u64, @intCast(ready().?.sm_count)) * 8, ceilDiv(plane, 256));
            return launch(.sum_splits, grid, 1, 256, .{ parts, @as(i32, @intCast(splits)), @as(i64, @intCast(plane)), y });
        }
    }
    return launch(kernel, tiles_x, tiles_y, threads, .{ w, out, in, xq, xd, tok, y });
}

/// Prompts of at least this many tokens (0: none) take a quantized matmul as a cuBLAS f16 GEMM
/// where cuBLAS loads: the weight dequantized to f16 (the CPU's values, rounded to f16), the
/// activations rounded to f16 (where MMQ quantizes them to 8 bits as the CPU does), the products
/// summed in f32 on the tensor cores (wgmma on Hopper, which MMQ's mma.sync does not reach).
/// Below it MMQ wins: dequantizing a whole weight costs as much as MMQ's pass over a few dozen
/// tokens (the crossover measured on an H200). The cuda_cublas_min_tokens setting at init
/// (lib/abi.zig Settings; 0: never), infer_cuda_set_cublas at run time.
var cublas_min_tokens: u32 = (abi.Settings{}).cuda_cublas_min_tokens;

pub fn cublasMinTokens() u32 {
    return cublas_min_tokens;
}

/// Sets cublas_min_tokens (0: off); fails with "unsupported" when cuBLAS does not load.
pub fn setCublas(min_tokens: u32) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    if (min_tokens > 0 and !cublas.ready(s.stream))
        return status.fail(.unsupported, "cuBLAS not available: no libcublas.so.13 or .12 (INFER_CUBLAS names one)", .{});
    cublas_min_tokens = min_tokens;
    return 0;
}

/// y = x · wᵀ through cuBLAS (see cublas_min_tokens); null to leave it to the MMQ kernels: no
/// cuBLAS, a type without an f16 dequantization, a graph being captured (the scratch may have to
/// grow), or no memory for the scratch.
fn gemmF16(k: kernels.WeightKind, w: u64, n_out: i32, n_in: i32, x: u64, n_tok: i32, y: u64) ?i32 {
    const s = ready() orelse return null;
    const dequant = k.dequant_f16 orelse return null;
    if (s.capturing or !cublas.ready(s.stream)) return null;
    const w_values = @as(u64, @intCast(n_out)) * @as(u64, @intCast(n_in));
    const x_values = @as(u64, @intCast(n_tok)) * @as(u64, @intCast(n_in));
    var scratch: u64 = 0;
    var rc = cuda.scratch(.f16_copies, 2 * (w_values + x_values), &scratch);
    if (rc != 0) return null;
    const w16 = scratch;
    const x16 = scratch + 2 * w_values;
    const grid = @as(u64, @intCast(s.sm_count)) * 8;
    rc = launch(dequant, @min(grid, ceilDiv(w_values / 32, 256)), 1, 256, .{ w, n_out, n_in, w16 });
    if (rc != 0) return rc;
    rc = launch(.f32_to_f16, @min(grid, ceilDiv(x_values, 256)), 1, 256, .{ x, @as(i64, @intCast(x_values)), x16 });
    if (rc != 0) return rc;
    return gemmStatus(cublas.gemm(cublas.r_16f, w16, x16, y, n_out, n_in, n_tok), n_out, n_in, n_tok);
}

/// y = x · wᵀ through cuBLAS for float weights (see cublas_min_tokens): F16 and BF16 weights as
/// they are, the activations rounded to the weight's type (where matvec_f keeps them f32); F32
/// as SGEMM. null to leave it to matvec_f (no cuBLAS, a capture, no scratch).
fn gemmFloat(type_id: u32, w: u64, n_out: i32, n_in: i32, x: u64, n_tok: i32, y: u64) ?i32 {
    const s = ready() orelse return null;
    if (s.capturing or !cublas.ready(s.stream)) return null;
    if (type_id == 0) return gemmStatus(cublas.gemm(cublas.r_32f, w, x, y, n_out, n_in, n_tok), n_out, n_in, n_tok);
    const kind, const convert: Kernel = switch (type_id) {
        1 => .{ cublas.r_16f, .f32_to_f16 },
        30 => .{ cublas.r_16bf, .f32_to_bf16 },
        else => return null,
    };
    const x_values = @as(u64, @intCast(n_tok)) * @as(u64, @intCast(n_in));
    var x16: u64 = 0;
    if (cuda.scratch(.f16_copies, 2 * x_values, &x16) != 0) return null;
    const rc = launch(convert, @min(@as(u64, @intCast(s.sm_count)) * 8, ceilDiv(x_values, 256)), 1, 256, .{ x, @as(i64, @intCast(x_values)), x16 });
    if (rc != 0) return rc;
    return gemmStatus(cublas.gemm(kind, w, x16, y, n_out, n_in, n_tok), n_out, n_in, n_tok);
}

fn gemmStatus(st: c_int, n_out: i32, n_in: i32, n_tok: i32) i32 {
    if (st != cublas.status_success) return invalid("matmul: cuBLAS GEMM {d} x {d} x {d} failed (status {d})", .{ n_tok, n_out, n_in, st });
    return 0;
}

/// Threads of a row's RMSNorm (rms_norm, rms_norm_q, add_rms_norm_q). A decode step has a row or
/// a few, so its latency is the block's: 1,024 threads, a warp per 32-value unit quantizing a
/// 1,024-wide row in one pass; many rows (a prompt) and rows of up to 256 values (head norms) keep
/// 256. The three kernels choose alike, so they sum the squares in the same order (the fused step
/// equals the unfused one bit for bit), and a head norm sums as rms_norm2's 256 threads do.
fn normThreads(n_rows: u64, n_cols: u64) u32 {
    return if (n_cols > 256 and n_rows <= 8) 1024 else 256;
}

pub fn rmsNorm(x: u64, weight: u64, n_rows: u64, n_cols: u64, eps: f32, out: u64) i32 {
    const cols = int(n_cols) orelse return tooLarge("rms_norm: n_cols", n_cols);
    if (cols == 0) return invalid("rms_norm: n_cols must be > 0", .{});
    return launch(.rms_norm, n_rows, 1, normThreads(n_rows, n_cols), .{ x, weight, cols, eps, out });
}

pub fn rmsNormAdd(x: u64, weight: u64, n_rows: u64, n_cols: u64, eps: f32, residual: u64) i32 {
    const cols = int(n_cols) orelse return tooLarge("rms_norm_add: n_cols", n_cols);
    if (cols == 0) return invalid("rms_norm_add: n_cols must be > 0", .{});
    return launch(.rms_norm_add, n_rows, 1, 256, .{ x, weight, cols, eps, residual });
}

extern "c" fn powf(x: f32, y: f32) f32;
const cpu_rope = @import("../cpu/rope.zig");

/// What the RoPE kernels take beyond the plain rotation: mscale, ext_factor and YaRN's
/// correction dims, computed as lib/cpu/rope.zig computes them (so the angles are the CPU's).
pub const RopeYarn = struct { mscale: f32, ext: f32, low: f32, high: f32 };

pub fn ropeYarn(what: []const u8, a: anytype) ?RopeYarn {
    if (!(a.attn_factor > 0) or !std.math.isFinite(a.attn_factor)) {
        _ = invalid("{s}: bad attn_factor {d}", .{ what, a.attn_factor });
        return null;
    }
    const yarn = a.ext_factor != 0;
    if (!std.math.isFinite(a.ext_factor) or (yarn and !(a.freq_scale > 0 and a.n_ctx_orig > 0 and
        a.beta_fast > 0 and a.beta_slow > 0 and std.math.isFinite(a.beta_fast) and std.math.isFinite(a.beta_slow))))
    {
        _ = invalid("{s}: bad YaRN ext_factor {d}, freq_scale {d}, n_ctx_orig {d}", .{ what, a.ext_factor, a.freq_scale, a.n_ctx_orig });
        return null;
    }
    const corr: [2]f32 = if (yarn) cpu_rope.yarnCorrDims(a.n_rot, a.n_ctx_orig, a.freq_base, a.beta_fast, a.beta_slow) else .{ 0, 0 };
    return .{ .mscale = cpu_rope.mscaleOf(a.attn_factor, a.ext_factor, a.freq_scale), .ext = a.ext_factor, .low = corr[0], .high = corr[1] };
}

pub fn rope(a: abi.CudaRopeArgs) i32 {
    const x = a.x;
    const n_tok = a.n_tok;
    const n_heads = a.n_heads;
    const head_dim = a.head_dim;
    const n_rot = a.n_rot;
    const positions = a.positions;
    const freq_base = a.freq_base;
    const freq_scale = a.freq_scale;
    const mode = a.mode;
    const freq_factors = a.freq_factors;
    if (mode != 0 and mode != 2) return invalid("rope: mode {d} is not 0 (normal) or 2 (neox)", .{mode});
    if (n_rot == 0 or n_rot % 2 != 0 or n_rot > head_dim or n_rot > 2048)
        return invalid("rope: n_rot {d} must be even, > 0, <= head_dim {d} and <= 2048", .{ n_rot, head_dim });
    if (!(freq_base > 0) or !std.math.isFinite(freq_base) or !std.math.isFinite(freq_scale))
        return invalid("rope: bad freq_base {d} or freq_scale {d}", .{ freq_base, freq_scale });
    const heads = int(n_heads) orelse return tooLarge("rope: n_heads", n_heads);
    const dim = int(head_dim) orelse return tooLarge("rope: head_dim", head_dim);
    // powf(base, -2/n_rot) from the C library, as lib/cpu/rope.zig (and ggml) computes it.
    const theta_scale = powf(freq_base, -2.0 / @as(f32, @floatFromInt(n_rot)));
    const y = ropeYarn("rope", a) orelse return @intFromEnum(status.Status.invalid_argument);
    const blocks = std.math.mul(u64, n_tok, n_heads) catch return tooLarge("rope: rows", n_tok);
    return launch(.rope, blocks, 1, @intCast(n_rot / 2), .{
        x, heads, dim, @as(i32, @intCast(n_rot)), positions, theta_scale, freq_scale, @as(i32, if (mode == 2) 1 else 0), freq_factors,
        y.mscale, y.ext, y.low, y.high,
    });
}

pub const head_dim_max = attn.head_dim_max;
pub const split_max = attn.split_max;
pub const attentionScratch = attn.attentionScratch;
pub const attention = attn.attention;
pub const decodeAttentionFits = attn.decodeAttentionFits;
pub const decodeWarpsTakes = attn.decodeWarpsTakes;
pub const setDecodeAttention = attn.setDecodeAttention;
pub const kvStore = attn.kvStore;
pub const kvStoreRows = attn.kvStoreRows;
pub const kvShift = @import("kv_shift.zig").kvShift;
pub const kvShiftScratch = @import("kv_shift.zig").kvShiftScratch;
pub const attentionRowsFit = attn.attentionRowsFit;
pub const checkKvTypes = attn.checkKvTypes;
pub const kvStoreTurbo = attn.kvStoreTurbo;

/// One token's query and key head norms (wq = wk = 0: none), their RoPE, and the store of the
/// keys and values into the f16 cache at positions[0]: rms_norm2 + rope2 + kv_store in one launch
/// (see norm_rope_store in shaders/cuda/decode.cuh).
pub fn normRopeStore(a: abi.CudaNormRopeStoreArgs) i32 {
    const q = a.q;
    const heads_q = a.heads_q;
    const k = a.k;
    const heads_k = a.heads_k;
    const v = a.v;
    const wq = a.wq;
    const wk = a.wk;
    const eps = a.eps;
    const head_dim = a.head_dim;
    const n_rot = a.n_rot;
    const positions = a.positions;
    const freq_base = a.freq_base;
    const freq_scale = a.freq_scale;
    const mode = a.mode;
    const freq_factors = a.freq_factors;
    const k_cache = a.k_cache;
    const v_cache = a.v_cache;
    const cells = a.cells;
    const ring = a.ring;
    if (mode != 0 and mode != 2) return invalid("norm_rope_store: mode {d} is not 0 (normal) or 2 (neox)", .{mode});
    if (n_rot == 0 or n_rot % 2 != 0 or n_rot > head_dim or head_dim > head_dim_max)
        return invalid("norm_rope_store: n_rot {d} must be even, > 0, <= head_dim {d} <= {d}", .{ n_rot, head_dim, head_dim_max });
    if ((wq == 0) != (wk == 0)) return invalid("norm_rope_store: both head norms or neither", .{});
    if (checkKvTypes("norm_rope_store", a.k_type, a.v_type, head_dim)) |rc| return rc;
    if (attn.refuseTurbo("norm_rope_store", a.k_type, a.v_type)) |rc| return rc;
    const hq = int(heads_q) orelse return tooLarge("norm_rope_store: heads_q", heads_q);
    const hk = int(heads_k) orelse return tooLarge("norm_rope_store: heads_k", heads_k);
    const c = int(cells) orelse return tooLarge("norm_rope_store: cells", cells);
    const theta_scale = powf(freq_base, -2.0 / @as(f32, @floatFromInt(n_rot)));
    const y = ropeYarn("norm_rope_store", a) orelse return @intFromEnum(status.Status.invalid_argument);
    return launch(.norm_rope_store, heads_q + heads_k, 1, 256, .{
        q, hq, k, hk, v, wq, wk, eps, @as(i32, @intCast(head_dim)), @as(i32, @intCast(n_rot)), positions, theta_scale,
        freq_scale, @as(i32, if (mode == 2) 1 else 0), freq_factors, y.mscale, y.ext, y.low, y.high, k_cache, v_cache, c,
        @as(i32, @intFromBool(ring)), @as(i32, @intCast(a.k_type)), @as(i32, @intCast(a.v_type)),
    });
}

/// out[0] = the index of the largest of the n f32 values at x (the first on ties, as the host's
/// argmax): greedy sampling on the device. `scratch`: 16 bytes, zero before the first call, which
/// every call leaves zero again (see argmax_f32 in shaders/cuda/decode.cuh).
pub fn argmax(x: u64, n: u64, scratch: u64, out: u64) i32 {
    const s = ready() orelse return @intFromEnum(status.Status.internal);
    const count = int(n) orelse return tooLarge("argmax: n", n);
    if (n == 0) return invalid("argmax of nothing", .{});
    const blocks = @min(ceilDiv(n, 256 * 4), @as(u64, @intCast(s.sm_count)));
    return launch(.argmax_f32, blocks, 1, 256, .{ x, count, scratch, scratch + 8, out });
}

fn elementwise(k: Kernel, n: u64, args: anytype) i32 {
    _ = int(n) orelse return tooLarge(@tagName(k), n);
    return launch(k, ceilDiv(n, 256), 1, 256, args);
}

pub fn geluMul(gate: u64, up: u64, n: u64, out: u64) i32 {
    return elementwise(.gelu_mul, n, .{ gate, up, @as(i32, @intCast(@min(n, std.math.maxInt(i32)))), out });
}

pub fn siluMul(gate: u64, up: u64, n: u64, out: u64) i32 {
    return elementwise(.silu_mul, n, .{ gate, up, @as(i32, @intCast(@min(n, std.math.maxInt(i32)))), out });
}

pub fn add(a: u64, b: u64, n: u64, out: u64) i32 {
    return elementwise(.add, n, .{ a, b, @as(i32, @intCast(@min(n, std.math.maxInt(i32)))), out });
}

pub fn scale(x: u64, n: u64, s: f32) i32 {
    return elementwise(.scale, n, .{ x, @as(i32, @intCast(@min(n, std.math.maxInt(i32)))), s });
}

pub fn addRowBias(x: u64, bias: u64, n_rows: u64, n_cols: u64) i32 {
    if (n_cols == 0) return invalid("add_row_bias: n_cols must be > 0", .{});
    const n = std.math.mul(u64, n_rows, n_cols) catch return tooLarge("add_row_bias: values", n_rows);
    return elementwise(.add_row_bias, n, .{ x, bias, @as(i32, @intCast(@min(n, std.math.maxInt(i32)))), @as(i32, @intCast(@min(n_cols, std.math.maxInt(i32)))) });
}

// ---- fused ops (the CUDA backend's decode-step peephole; each equals its parts bit for bit) ----

/// The activation format `mode` names (0 = Q8_0, 1 = Q8_K) where rows of n_cols values split into
/// its blocks, else null.
pub fn quantMode(mode: u32, n_cols: u64) ?i32 {
    const block: u64 = if (mode == 0) 32 else if (mode == 1) 256 else return null;
    if (n_cols % block != 0) return null;
    return @intCast(mode);
}

/// rms_norm, then quantize (mode as infer_cuda_quantize) of its output.
pub fn rmsNormQuant(a: abi.CudaRmsNormQuantArgs) i32 {
    const x = a.x;
    const weight = a.weight;
    const n_rows = a.n_rows;
    const n_cols = a.n_cols;
    const eps = a.eps;
    const out = a.out;
    const mode = a.mode;
    const q = a.q;
    const d = a.d;
    const m = quantMode(mode, n_cols) orelse return invalid("rms_norm_quant: mode {d} with n_cols {d}", .{ mode, n_cols });
    if (n_cols == 0 or n_cols > fused_cols_max) return invalid("rms_norm_quant: n_cols {d} not in 1..{d}", .{ n_cols, fused_cols_max });
    const cols: i32 = @intCast(n_cols);
    return launchShared(.rms_norm_q, n_rows, 1, normThreads(n_rows, n_cols), @intCast(n_cols * 8), .{ x, weight, cols, eps, out, m, q, d });
}

/// Fused norms keep a row and its weights in shared memory, 8 bytes a value, beside their 1,280
/// static bytes, within the 48 KiB a block gets without opting in: 5,888 values (23 Q8_K
/// superblocks). Wider rows take rms_norm and quantize (ts/backend/cuda-fuse.ts FUSED_COLS_MAX).
/// (6,144 once: 49,152 + 1,280 bytes, and the launch failed.)
pub const fused_cols_max = 5888;

/// In-place rms_norm of rows_a rows at xa (weights wa) and rows_b rows at xb (weights wb).
pub fn rmsNorm2(xa: u64, wa: u64, rows_a: u64, xb: u64, wb: u64, rows_b: u64, n_cols: u64, eps: f32) i32 {
    const cols = int(n_cols) orelse return tooLarge("rms_norm2: n_cols", n_cols);
    if (cols == 0) return invalid("rms_norm2: n_cols must be > 0", .{});
    const ra = int(rows_a) orelse return tooLarge("rms_norm2: rows_a", rows_a);
    return launch(.rms_norm2, rows_a + rows_b, 1, 256, .{ xa, wa, ra, xb, wb, cols, eps });
}

/// sum = a + b (sum may alias a), then rms_norm(sum) into out, quantized.
pub fn addRmsNormQuant(args: abi.CudaAddRmsNormQuantArgs) i32 {
    const a = args.a;
    const b = args.b;
    const sum = args.sum;
    const weight = args.weight;
    const n_rows = args.n_rows;
    const n_cols = args.n_cols;
    const eps = args.eps;
    const out = args.out;
    const mode = args.mode;
    const q = args.q;
    const d = args.d;
    const m = quantMode(mode, n_cols) orelse return invalid("add_rms_norm_quant: mode {d} with n_cols {d}", .{ mode, n_cols });
    if (n_cols == 0 or n_cols > fused_cols_max) return invalid("add_rms_norm_quant: n_cols {d} not in 1..{d}", .{ n_cols, fused_cols_max });
    const cols: i32 = @intCast(n_cols);
    return launchShared(.add_rms_norm_q, n_rows, 1, normThreads(n_rows, n_cols), @intCast(n_cols * 8), .{ a, b, sum, weight, cols, eps, out, m, q, d });
}

/// Up to three matmuls of one token over the same quantized input (n2 = 0: two matrices).
pub fn matmulMulti(args: abi.CudaMatmulMultiArgs) i32 {
    const type_id = args.type_id;
    const n_in = args.n_in;
    const xq = args.xq;
    const xd = args.xd;
    const w0 = args.w0;
    const n0 = args.n0;
    const y0 = args.y0;
    const w1 = args.w1;
    const n1 = args.n1;
    const y1 = args.y1;
    const w2 = args.w2;
    const n2 = args.n2;
    const y2 = args.y2;
    const k = weightKind(type_id) orelse return unsupportedType(type_id);
    const kernel = k.matvec_multi orelse return invalid("matmul_multi: {s} is not a quantized type", .{k.name});
    if (n_in == 0 or n_in % k.block_values != 0) return invalid("matmul_multi: n_in {d} is not a multiple of the {s} block", .{ n_in, k.name });
    const in = int(n_in) orelse return tooLarge("matmul_multi: n_in", n_in);
    const a = int(n0) orelse return tooLarge("matmul_multi: n0", n0);
    const b = int(n1) orelse return tooLarge("matmul_multi: n1", n1);
    const c = int(n2) orelse return tooLarge("matmul_multi: n2", n2);
    if (pipeStages(k, n_in, @max(n0, @max(n1, n2)), false)) |p| {
        const pipe = k.matvec_pipe_multi.?;
        const per = p.blockRows();
        const row_blocks = ceilDiv(n0, per) + ceilDiv(n1, per) + ceilDiv(n2, per);
        return launchShared(pipe, pipeGrid(pipe, row_blocks, p.shared), 1, 128, p.shared, .{ w0, a, y0, w1, b, y1, w2, c, y2, in, xq, xd, @as(i32, @intCast(p.rows_per_warp)), @as(i32, @intFromBool(p.halves)) });
    }
    const split = matvecSplit(n_in);
    const rows_per_block = 4 / split;
    const blocks = ceilDiv(n0, rows_per_block) + ceilDiv(n1, rows_per_block) + ceilDiv(n2, rows_per_block);
    return launch(kernel, matvecGrid(kernel, blocks), 1, 128, .{ w0, a, y0, w1, b, y1, w2, c, y2, in, xq, xd, @as(i32, @intCast(split)) });
}

/// How a pipelined one-token matvec (shaders/cuda/matvec_pipe.cuh: 3 stages of a row block) of
/// weight kind k with rows of n_in values runs — its rows a warp, whether the 4 warps split each
/// row, and its dynamic shared memory — or null where it takes the register-fed kernels: no GPU
/// layout, or long rows in a fused launch (`split_ok` false).
/// Rows a warp: 2, fewer where they would not fit. Two
/// rows share each activation load: an 8B model's Q4_0 gate 12.4 -> 10.9 µs, q 4.1 -> 3.7 on an
/// H200; four were slower on all but the LM head.
/// Rows of split_min_units units and more (a down projection's) are split among the block's 4
/// warps, a row block pipe_rows_split rows: a warp alone on such a row from shared memory was
/// slower than the register-fed kernel (an 8B model's down projection 13.2 -> 16.6 µs in Q4_0,
/// 21.2 -> 29.3 in Q8_0, on an H200), its serial work long and its stages leaving room for 1–2
/// blocks a multiprocessor; split, the 8B's Q4_K down projection went 12.5 -> 10.7 µs (Q4_0
/// 12.2 either way) and decode Q4_K 531 -> 550 tok/s, Q8_0 345 -> 358, 1B Q4_K 1,755 -> 1,774
/// (1, 2 or 4 rows a stage alike alone; bench/results/cuda.md).
fn pipeStages(k: kernels.WeightKind, n_in: u64, n_out: u64, split_ok: bool) ?PipeLaunch {
    if (k.matvec_pipe == null) return null;
    const split = n_in / 32 >= split_min_units;
    if (split and (!split_ok or k.matvec_pipe_split == null)) return null;
    const s = ready() orelse return null;
    const row_bytes = (n_in / k.block_values) * k.block_bytes;
    const reserve = s.pipe_shared_max >= 227 << 10; // sm_90's 228 KB a multiprocessor
    var rows: u32 = if (split) pipe_rows_split else if (n_out >= tall_rows) pipe_rows_tall else pipe_rows_per_warp;
    const halves = k.pipe_halves and n_in >= pipe_halves_min;
    while (true) : (rows /= 2) {
        var p: PipeLaunch = .{ .shared = 0, .rows_per_warp = rows, .halves = halves, .split = split };
        // After the stages: the activation (halves), the warps' partial sums (split).
        const bytes = pipe_stages * p.blockRows() * row_bytes + (if (halves) n_in else 0) + (if (split) 16 * rows else 0);
        if (bytes <= s.pipe_shared_max) {
            // Under a reserve, fewer rows a warp where their stages would leave one block a
            // multiprocessor (an 8B model's Q8_0 rows: 2 rows 104 KB, 1 row 52 KB).
            p.shared = if (reserve) reserving(@intCast(bytes)) else @intCast(bytes);
            if (!reserve or rows == 1 or blocksBeside(@intCast(bytes)) >= 2) return p;
        }
        if (rows == 1) return null;
    }
}
const PipeLaunch = struct {
    shared: u32,
    rows_per_warp: u32,
    halves: bool,
    split: bool,
    /// Rows of a row block (matvec_pipe.cuh pipe_block_rows).
    fn blockRows(p: PipeLaunch) u32 {
        return if (p.split) p.rows_per_warp else 4 * p.rows_per_warp;
    }
};
/// Rows of this many 32-value units and more are split among a pipelined block's warps (the
/// register-fed kernels split them from the same width: matvecSplit).
const split_min_units = 192;
/// Rows of a row block whose rows the warps split.
const pipe_rows_split: u32 = 2;
/// Q4_K rows of at least this many values are summed half a superblock a lane, the activation in
/// shared memory (kernels.zig pipe_halves; shaders/cuda/matvec_pipe.cuh rows_halves); shorter
/// rows keep a unit a lane, as a half a lane would leave lanes idle (a 1,024-wide row has 8
/// halves). On an H200: decode 8B Q4_K 449 -> 492
/// tok/s (rows of 4,096), 4B 588 -> 601 (2,560); with halves at every width the 1B (2,048)
/// 1,812 -> 1,753 and the 0.6B (1,024) 1,453 -> 1,375.
const pipe_halves_min: u64 = 2560;
const pipe_rows_per_warp: u32 = 2;
/// Rows a warp of the pipelined matvec for matrices of tall_rows rows and more (the LM head):
/// 4. A long launch reads at its steady state, which four rows a
/// warp raise: an 8B model's LM head 83.6 -> 73.4 µs in Q4_0, 140 -> 130 in Q8_0 on an H200,
/// where every shorter matrix was slower with four.
const pipe_rows_tall: u32 = 4;
const tall_rows = 32768;
const pipe_stages = 3;

/// Shared memory of an sm_90 multiprocessor (the reserve applies there only) and what the driver
/// reserves for each block.
const sm_shared: u32 = 228 << 10;
const block_reserved: u32 = 1 << 10;
/// The pipelined matvec's blocks leave 40 KiB of each multiprocessor's shared memory free (their
/// dynamic size padded so that one block fewer fits, and fewer rows a warp where a row block's
/// stages would then leave one block), so that the small kernel after a matvec (a fused norm
/// keeps 8 bytes a value, ~33 KB at 4,096; the decode attention ~23 KB), launched while the
/// matvec runs, is resident beside it and stages its weights and prefetches ahead of the wait.
/// On an H200: 8B decode Q4_0 471 -> 488 tok/s, Q4_K 428
/// -> 431, Q8_0 313 -> 331 (three blocks of one row a warp where two blocks of two rows filled
/// 209 KB); the 0.6B unchanged (its row blocks are small); the 4B's Q8_0 (rows of 2,560) 479 ->
/// 468 (two blocks where three fitted).
const pipe_reserve: u32 = 40 << 10;
fn reserving(shared: u32) u32 {
    const fit = blocksBeside(shared);
    if (fit == 0) return shared;
    return @max(shared, (sm_shared - pipe_reserve) / fit - block_reserved);
}
/// Blocks of `shared` bytes that fit a multiprocessor beside the reserve.
fn blocksBeside(shared: u32) u32 {
    return (sm_shared - pipe_reserve) / (shared + block_reserved);
}

/// One wave of the pipelined matvec: as many blocks as fit with `shared` bytes each (the driver's
/// occupancy), at most one per row block.
fn pipeGrid(kernel: Kernel, row_blocks: u64, shared: u32) u64 {
    const s = ready() orelse return row_blocks;
    const occupancy = driver.optional.cuOccupancyMaxActiveBlocksPerMultiprocessor orelse return row_blocks;
    var n: c_int = 0;
    if (occupancy(&n, s.kernels[@intFromEnum(kernel)], 128, shared) != driver.success or n <= 0) return row_blocks;
    return @min(row_blocks, @as(u64, @intCast(n)) * @as(u64, @intCast(s.sm_count)));
}

/// out = act(gate) * up (kind 0 = GELU, 1 = SiLU) over n_rows x n_cols, quantized.
pub fn actMulQuant(a: abi.CudaActMulQuantArgs) i32 {
    const kind = a.kind;
    const gate = a.gate;
    const up = a.up;
    const n_rows = a.n_rows;
    const n_cols = a.n_cols;
    const out = a.out;
    const mode = a.mode;
    const q = a.q;
    const d = a.d;
    const m = quantMode(mode, n_cols) orelse return invalid("act_mul_quant: mode {d} with n_cols {d}", .{ mode, n_cols });
    const n = std.math.mul(u64, n_rows, n_cols) catch return tooLarge("act_mul_quant: values", n_rows);
    const groups = int(n / (if (mode == 0) @as(u64, 32) else 256)) orelse return tooLarge("act_mul_quant: groups", n);
    const kernel: Kernel = switch (kind) {
        0 => .gelu_mul_q,
        1 => .silu_mul_q,
        2 => .moe_swiglu_oai_q,
        else => return invalid("act_mul_quant: kind {d}", .{kind}),
    };
    // Q8_0: a warp a unit; Q8_K: a block of 256 threads a superblock (infer.cu act_mul_q).
    const blocks: u64 = if (mode == 0) ceilDiv(@as(u64, @intCast(groups)) * 32, 256) else @intCast(groups);
    if (kind == 2) {
        if (a.bias_gate != 0 and (a.bias_up == 0 or a.ids == 0)) return invalid("act_mul_quant: gate and up biases and ids together", .{});
        const cols = int(n_cols) orelse return tooLarge("act_mul_quant: n_cols", n_cols);
        return launch(kernel, blocks, 1, 256, .{ gate, up, groups, out, m, q, d, a.bias_gate, a.bias_up, a.ids, cols });
    }
    return launch(kernel, blocks, 1, 256, .{ gate, up, groups, out, m, q, d });
}

/// RoPE of two tensors (queries and keys) with the same positions and parameters.
pub fn rope2(a: abi.CudaRope2Args) i32 {
    const xa = a.xa;
    const heads_a = a.heads_a;
    const xb = a.xb;
    const heads_b = a.heads_b;
    const n_tok = a.n_tok;
    const head_dim = a.head_dim;
    const n_rot = a.n_rot;
    const positions = a.positions;
    const freq_base = a.freq_base;
    const freq_scale = a.freq_scale;
    const mode = a.mode;
    const freq_factors = a.freq_factors;
    if (mode != 0 and mode != 2) return invalid("rope2: mode {d} is not 0 (normal) or 2 (neox)", .{mode});
    if (n_rot == 0 or n_rot % 2 != 0 or n_rot > head_dim or n_rot > 2048)
        return invalid("rope2: n_rot {d} must be even, > 0, <= head_dim {d} and <= 2048", .{ n_rot, head_dim });
    const ha = int(heads_a) orelse return tooLarge("rope2: heads_a", heads_a);
    const hb = int(heads_b) orelse return tooLarge("rope2: heads_b", heads_b);
    const dim = int(head_dim) orelse return tooLarge("rope2: head_dim", head_dim);
    const theta_scale = powf(freq_base, -2.0 / @as(f32, @floatFromInt(n_rot)));
    const y = ropeYarn("rope2", a) orelse return @intFromEnum(status.Status.invalid_argument);
    const blocks = std.math.mul(u64, n_tok, heads_a + heads_b) catch return tooLarge("rope2: rows", n_tok);
    return launch(.rope2, blocks, 1, @intCast(n_rot / 2), .{
        xa, ha, xb, hb, dim, @as(i32, @intCast(n_rot)), positions, theta_scale, freq_scale, @as(i32, if (mode == 2) 1 else 0), freq_factors,
        y.mscale, y.ext, y.low, y.high,
    });
}

test "attention scratch: scores, maxima, partials" {
    try std.testing.expectEqual(@as(u64, 2 * 4 * 100 + 2 * 2 * 4 * 1), attentionScratch(2, 4, 64, 100, 1));
    try std.testing.expectEqual(@as(u64, 4 * 100 + 2 * 4 * 8 + 4 * 8 * 64), attentionScratch(1, 4, 64, 100, 8));
}
