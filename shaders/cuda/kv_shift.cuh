// The context shift (lib/cuda/kv_shift.zig): rows of one cache move to other cells, their keys
// rotated by the move with the layer's RoPE, as ts/backend/cpu.ts shiftKv / compactKv do it:
// each key dequantized to f32 (kv_at: lib/cpu/kv_quant.zig's load), rotated by rope_pair_i (the
// CPU's angles and FMAs, at the negative position of the move), stored again as kv_store stores a
// key (f16 round to nearest even; Q8_0 / Q4_0 as lib/cpu/kv_quant.zig quantizes). Values move as
// their bytes. Gather into scratch, then scatter, so that overlapping moves are safe. A block
// per (row, KV head), a thread per value of the head.
#pragma once
#include "kv_quant.cuh"

/// Row blockIdx.x's KV head blockIdx.y from cell from[row] (from null: (first + row) mod cells),
/// its key as f32 rotated by to + row - from[row] (from null: move) positions into ks
/// ([row][kv_heads][head_dim]), its value's bytes into vs (rows of kv_bytes(vt, kv_dim)).
extern "C" __global__ void kv_shift_gather(const void* kc, const void* vc, int kv_heads, int head_dim,
                                           const int* from, int first, int cells, int to, int move, float* ks,
                                           uint8_t* vs, int kt, int vt, int n_rot, float theta_scale,
                                           float freq_scale, int neox, const float* ff, float mscale, float ext,
                                           float low, float high) {
  __shared__ float head[512];
  pdl_begin();
  const int row = blockIdx.x, h = blockIdx.y, kv_dim = kv_heads * head_dim;
  const int cell = from ? from[row] : (first + row) % cells;
  const int pos = from ? to + row - cell : move;
  const uint8_t* k = kv_head(kc, kt, cell, kv_dim, h, head_dim);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) head[d] = kv_at(k, kt, d, head_dim);
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < (n_rot >> 1))
    rope_pair_i(head, threadIdx.x, pos, n_rot, theta_scale, freq_scale, neox, ff, RopeYarn{mscale, ext, low, high});
  __syncthreads();
  float* dst = ks + (static_cast<size_t>(row) * kv_heads + h) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) dst[d] = head[d];
  const int head_bytes = kv_bytes(vt, head_dim);
  const uint8_t* v = kv_head(vc, vt, cell, kv_dim, h, head_dim);
  uint8_t* vd = vs + static_cast<size_t>(row) * kv_bytes(vt, kv_dim) + kv_bytes(vt, h * head_dim);
  for (int b = threadIdx.x; b < head_bytes; b += blockDim.x) vd[b] = v[b];
}

/// Row blockIdx.x's KV head blockIdx.y of kv_shift_gather's scratch into cell to + row: the key
/// stored as kv_store stores one (blockDim.x a multiple of 32, every thread calls kv_store_values),
/// the value's bytes copied.
extern "C" __global__ void kv_shift_scatter(void* kc, void* vc, int kv_heads, int head_dim, int to,
                                            const float* ks, const uint8_t* vs, int kt, int vt) {
  pdl_begin();
  const int row = blockIdx.x, h = blockIdx.y, kv_dim = kv_heads * head_dim, cell = to + row;
  const float* src = ks + (static_cast<size_t>(row) * kv_heads + h) * head_dim;
  uint8_t* k = const_cast<uint8_t*>(kv_head(kc, kt, cell, kv_dim, h, head_dim));
  if (kt == KV_F16) {
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) reinterpret_cast<__half*>(k)[d] = __float2half_rn(src[d]);
  } else {
    kv_store_values(src, head_dim, kt, k);
  }
  const int head_bytes = kv_bytes(vt, head_dim);
  const uint8_t* vsrc = vs + static_cast<size_t>(row) * kv_bytes(vt, kv_dim) + kv_bytes(vt, h * head_dim);
  uint8_t* v = const_cast<uint8_t*>(kv_head(vc, vt, cell, kv_dim, h, head_dim));
  for (int b = threadIdx.x; b < head_bytes; b += blockDim.x) v[b] = vsrc[b];
}
