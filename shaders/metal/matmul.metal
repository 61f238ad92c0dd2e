// Batched matrix products for prompts (many tokens): y[t][o] = W[o] · x[t], on the simdgroup
// matrix units (8×8 simdgroup_matrix tiles), shaped as llama.cpp's kernel_mul_mm (its design,
// not its code). A threadgroup of 4 simdgroups computes a tile of MATMUL_TILE_OUT (64) weight rows
// × MATMUL_TILE_TOK (32) tokens; each simdgroup a quarter of it, 16 tokens × 32 rows, as 2 × 4
// accumulators of 8×8 that stay in the matrix registers for the whole dot product.
//
// For each 32-value chunk of the inputs, threads 0..63 dequantize one weight row each into
// threadgroup memory (quant.h, the one place the block layouts are read) while threads 64..127
// copy the tile's activations; both tiles are laid out as 8×8 blocks of 64 consecutive floats
// (block_at), so every simdgroup_load reads one contiguous 256-byte block. After a barrier each
// simdgroup takes the chunk in 4 steps of 8 values: 2 activation blocks and 4 weight blocks
// (loaded transposed: W^T, so acc = x · W^T is already [token][row] as y is laid out) and 8
// multiply-accumulates, then waits again before the next chunk overwrites the tiles.
//
// The tiles hold f32 (llama.cpp's hold f16 for quantized weights): the products then see the same
// dequantized values as the CPU, F32 and BF16 weights keep their range, and Apple GPUs run f32
// and f16 multiply-adds at one rate; the cost is 12 KiB of threadgroup memory instead of 6.
// A tile wholly inside y is stored straight from the matrices; an edge tile goes through
// threadgroup memory (reusing the weight tile) and is copied out with bounds checks.
// Needs the simdgroup matrix units: Apple GPU family 7 (M1, A14) and later.
#include <metal_stdlib>
#include "args.h"
#include "quant.h"
using namespace metal;

// Offset of element (row r, value k) of a tile of 32 values per row, in 8×8 blocks: block
// (r / 8, k / 8) is 64 consecutive floats, row-major inside.
inline uint block_at(uint r, uint k) { return (r / 8) * 256 + (k / 8) * 64 + (r % 8) * 8 + k % 8; }

template <typename W>
inline void matmul(device const uchar* w, device const float* x, device float* y,
                   constant MatmulArgs& args, threadgroup float* tile, uint3 tg, uint tid,
                   uint sg, uint lane) {
    const uint o0 = tg.x * MATMUL_TILE_OUT;
    const uint t0 = tg.y * MATMUL_TILE_TOK;
    threadgroup float* w_tile = tile;
    threadgroup float* x_tile = tile + MATMUL_TILE_OUT * 32;
    // This simdgroup's quarter of the tile: tokens sg_tok.. + 16, rows sg_out.. + 32.
    const uint sg_tok = (sg % 2) * 16;
    const uint sg_out = (sg / 2) * 32;
    simdgroup_float8x8 acc[8];  // acc[i]: tokens sg_tok + 8(i / 4), rows sg_out + 8(i % 4)
    for (uint i = 0; i < 8; i++) acc[i] = make_filled_simdgroup_matrix<float, 8>(0.0f);
    for (uint c = 0; c < W::chunks(args.n_in); c++) {
        if (tid < MATMUL_TILE_OUT) {
            float v[32];
            const uint o = o0 + tid;
            if (o < args.n_out) {
                W::chunk(w + ulong(o) * args.row_bytes, c, args.n_in, v);
            } else {
                for (uint l = 0; l < 32; l++) v[l] = 0.0f;
            }
            for (uint l = 0; l < 32; l++) w_tile[block_at(tid, l)] = v[l];
        } else {
            const uint copiers = MATMUL_THREADS - MATMUL_TILE_OUT;
            for (uint i = tid - MATMUL_TILE_OUT; i < MATMUL_TILE_TOK * 32; i += copiers) {
                const uint t = t0 + i / 32;
                const uint col = 32 * c + i % 32;
                x_tile[block_at(i / 32, i % 32)] =
                    t < args.n_tok && col < args.n_in ? x[ulong(t) * args.n_in + col] : 0.0f;
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint kb = 0; kb < 4; kb++) {
            simdgroup_float8x8 xm[2];
            simdgroup_float8x8 wm[4];
            for (uint j = 0; j < 2; j++) {
                simdgroup_load(xm[j], x_tile + block_at(sg_tok + 8 * j, 8 * kb), 8);
            }
            for (uint j = 0; j < 4; j++) {
                simdgroup_load(wm[j], w_tile + block_at(sg_out + 8 * j, 8 * kb), 8, 0, true);
            }
            for (uint i = 0; i < 8; i++) {
                simdgroup_multiply_accumulate(acc[i], xm[i / 4], wm[i % 4], acc[i]);
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (o0 + MATMUL_TILE_OUT <= args.n_out && t0 + MATMUL_TILE_TOK <= args.n_tok) {
        for (uint i = 0; i < 8; i++) {
            const ulong t = t0 + sg_tok + 8 * (i / 4);
            const uint o = o0 + sg_out + 8 * (i % 4);
            simdgroup_store(acc[i], y + t * args.n_out + o, args.n_out);
        }
        return;
    }
    // An edge tile: each simdgroup's 16 × 32 quarter into its own 512 floats of the weight tile
    // (free since the last barrier), then copied out where it lies inside y.
    threadgroup float* part = tile + sg * 512;
    for (uint i = 0; i < 8; i++) simdgroup_store(acc[i], part + 256 * (i / 4) + 8 * (i % 4), 32);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint i = lane; i < 512; i += 32) {
        const uint t = t0 + sg_tok + i / 32;
        const uint o = o0 + sg_out + i % 32;
        if (t < args.n_tok && o < args.n_out) y[ulong(t) * args.n_out + o] = part[i];
    }
}

kernel void matmul_f32(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                       device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                       threadgroup float* tile [[threadgroup(0)]],
                       uint3 tg [[threadgroup_position_in_grid]],
                       uint tid [[thread_index_in_threadgroup]],
                       uint sg [[simdgroup_index_in_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]]) {
    matmul<WeightF32>(w, x, y, args, tile, tg, tid, sg, lane);
}

kernel void matmul_f16(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                       device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                       threadgroup float* tile [[threadgroup(0)]],
                       uint3 tg [[threadgroup_position_in_grid]],
                       uint tid [[thread_index_in_threadgroup]],
                       uint sg [[simdgroup_index_in_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]]) {
    matmul<WeightF16>(w, x, y, args, tile, tg, tid, sg, lane);
}

kernel void matmul_bf16(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matmul<WeightBF16>(w, x, y, args, tile, tg, tid, sg, lane);
}

kernel void matmul_q4_0(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matmul<WeightQ4_0>(w, x, y, args, tile, tg, tid, sg, lane);
}

kernel void matmul_q5_0(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matmul<WeightQ5_0>(w, x, y, args, tile, tg, tid, sg, lane);
}

kernel void matmul_q8_0(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matmul<WeightQ8_0>(w, x, y, args, tile, tg, tid, sg, lane);
}

kernel void matmul_q4_k(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matmul<WeightQ4_K>(w, x, y, args, tile, tg, tid, sg, lane);
}

kernel void matmul_q5_k(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matmul<WeightQ5_K>(w, x, y, args, tile, tg, tid, sg, lane);
}

kernel void matmul_q6_k(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matmul<WeightQ6_K>(w, x, y, args, tile, tg, tid, sg, lane);
}
