// Batched matrix products for prompts (many tokens): y[t][o] = W[o] · x[t]. A threadgroup computes
// a tile of tile_out rows × tile_tok tokens: for each 32-value chunk of the inputs it dequantizes
// the tile's weight rows and copies the tile's activations into threadgroup memory (quant.h),
// waits at a barrier, accumulates the products, and waits again before the next chunk overwrites
// the tile. Each thread owns outputs tid, tid + n_threads, ... of the tile (at most
// MATMUL_ACC_MAX). Threadgroup memory: (tile_out + tile_tok) · 32 floats.
#include <metal_stdlib>
#include "args.h"
#include "quant.h"
using namespace metal;

template <typename W>
inline void matmul(device const uchar* w, device const float* x, device float* y,
                   constant MatmulArgs& args, threadgroup float* tile, uint3 tg, uint tid,
                   uint n_threads) {
    const uint o0 = tg.x * args.tile_out;
    const uint t0 = tg.y * args.tile_tok;
    threadgroup float* w_tile = tile;
    threadgroup float* x_tile = tile + args.tile_out * 32;
    const uint n_acc = args.tile_out * args.tile_tok;
    float acc[MATMUL_ACC_MAX];
    for (uint k = 0; k < MATMUL_ACC_MAX; k++) acc[k] = 0.0f;
    for (uint c = 0; c < W::chunks(args.n_in); c++) {
        for (uint r = tid; r < args.tile_out; r += n_threads) {
            float v[32];
            if (o0 + r < args.n_out) {
                W::chunk(w + ulong(o0 + r) * args.row_bytes, c, args.n_in, v);
            } else {
                for (uint l = 0; l < 32; l++) v[l] = 0.0f;
            }
            for (uint l = 0; l < 32; l++) w_tile[r * 32 + l] = v[l];
        }
        for (uint i = tid; i < args.tile_tok * 32; i += n_threads) {
            const uint t = t0 + i / 32;
            const uint col = 32 * c + i % 32;
            x_tile[i] = t < args.n_tok && col < args.n_in ? x[ulong(t) * args.n_in + col] : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint i = tid, k = 0; i < n_acc; i += n_threads, k++) {
            threadgroup const float* wr = w_tile + (i % args.tile_out) * 32;
            threadgroup const float* xr = x_tile + (i / args.tile_out) * 32;
            float sum = 0.0f;
            for (uint l = 0; l < 32; l++) sum += wr[l] * xr[l];
            acc[k] += sum;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (uint i = tid, k = 0; i < n_acc; i += n_threads, k++) {
        const uint o = o0 + i % args.tile_out;
        const uint t = t0 + i / args.tile_out;
        if (o < args.n_out && t < args.n_tok) y[ulong(t) * args.n_out + o] = acc[k];
    }
}

kernel void matmul_f32(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                       device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                       threadgroup float* tile [[threadgroup(0)]],
                       uint3 tg [[threadgroup_position_in_grid]],
                       uint tid [[thread_index_in_threadgroup]],
                       uint3 tg_size [[threads_per_threadgroup]]) {
    matmul<WeightF32>(w, x, y, args, tile, tg, tid, tg_size.x * tg_size.y * tg_size.z);
}

kernel void matmul_f16(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                       device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                       threadgroup float* tile [[threadgroup(0)]],
                       uint3 tg [[threadgroup_position_in_grid]],
                       uint tid [[thread_index_in_threadgroup]],
                       uint3 tg_size [[threads_per_threadgroup]]) {
    matmul<WeightF16>(w, x, y, args, tile, tg, tid, tg_size.x * tg_size.y * tg_size.z);
}

kernel void matmul_bf16(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint3 tg_size [[threads_per_threadgroup]]) {
    matmul<WeightBF16>(w, x, y, args, tile, tg, tid, tg_size.x * tg_size.y * tg_size.z);
}

kernel void matmul_q4_0(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint3 tg_size [[threads_per_threadgroup]]) {
    matmul<WeightQ4_0>(w, x, y, args, tile, tg, tid, tg_size.x * tg_size.y * tg_size.z);
}

kernel void matmul_q5_0(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint3 tg_size [[threads_per_threadgroup]]) {
    matmul<WeightQ5_0>(w, x, y, args, tile, tg, tid, tg_size.x * tg_size.y * tg_size.z);
}

kernel void matmul_q8_0(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint3 tg_size [[threads_per_threadgroup]]) {
    matmul<WeightQ8_0>(w, x, y, args, tile, tg, tid, tg_size.x * tg_size.y * tg_size.z);
}

kernel void matmul_q4_k(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint3 tg_size [[threads_per_threadgroup]]) {
    matmul<WeightQ4_K>(w, x, y, args, tile, tg, tid, tg_size.x * tg_size.y * tg_size.z);
}

kernel void matmul_q5_k(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint3 tg_size [[threads_per_threadgroup]]) {
    matmul<WeightQ5_K>(w, x, y, args, tile, tg, tid, tg_size.x * tg_size.y * tg_size.z);
}

kernel void matmul_q6_k(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatmulArgs& args [[buffer(3)]],
                        threadgroup float* tile [[threadgroup(0)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint3 tg_size [[threads_per_threadgroup]]) {
    matmul<WeightQ6_K>(w, x, y, args, tile, tg, tid, tg_size.x * tg_size.y * tg_size.z);
}
