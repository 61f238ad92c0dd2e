// Greedy sampling on the device (included by infer.cu). The argmax of the logits becomes the
// next decode step's token id in device memory, where that step's embedding lookup reads it, so
// the host can queue the next step before it has seen this one's token (ts/engine/engine.ts).
#pragma once
#include "common.cuh"

/// A key whose unsigned order is the host's argmax order: larger values first, then the lower
/// index (`x[i] > x[best]` keeps the first maximum). -0 counts as +0, as the comparison does, and
/// a NaN gets the lowest key, as the comparison never picks one after index 0.
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
  uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  if (v != v) bits = 0;
  return (static_cast<unsigned long long>(bits) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
}

__device__ __forceinline__ unsigned long long max_u64(unsigned long long a, unsigned long long b) {
  return a > b ? a : b;
}

/// *out = argmax of x[0..n). Each block reduces a strided share of x (float4 loads) and merges its
/// key into *best with a 64-bit atomicMax; the last block to finish (counted in *done) reads the
/// winner, writes the index and zeroes *best and *done for the next launch. One launch, so the
/// decode graph gains one node.
extern "C" __global__ void __launch_bounds__(256)
    argmax_f32(const float* x, int n, unsigned long long* best, unsigned int* done, int* out) {
  pdl_begin();
  unsigned long long k = 0;
  const int stride = gridDim.x * blockDim.x, first = blockIdx.x * blockDim.x + threadIdx.x;
  const int n4 = (reinterpret_cast<uintptr_t>(x) & 15) == 0 ? n >> 2 : 0;
  for (int i = first; i < n4; i += stride) {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    k = max_u64(k, max_u64(max_u64(argmax_key(v.x, 4 * i), argmax_key(v.y, 4 * i + 1)),
                           max_u64(argmax_key(v.z, 4 * i + 2), argmax_key(v.w, 4 * i + 3))));
  }
  for (int i = 4 * n4 + first; i < n; i += stride) k = max_u64(k, argmax_key(x[i], i));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) k = max_u64(k, __shfl_xor_sync(FULL_MASK, k, o));
  __shared__ unsigned long long warp_best[8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_best[warp] = k;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < (blockDim.x >> 5); w++) k = max_u64(k, warp_best[w]);
  atomicMax(best, k);
  __threadfence();  // this block's atomicMax is visible before its count
  if (atomicAdd(done, 1u) == gridDim.x - 1) {
    const unsigned long long winner = atomicExch(best, 0ull);
    *out = static_cast<int>(0xffffffffu - static_cast<uint32_t>(winner));
    *done = 0;
  }
}

/// One token's attention inputs in one launch: the query and key heads' RMSNorm (Qwen 3; skipped
/// when wq is null), their RoPE, and the keys' and values' store into the f16 cache at cell
/// positions[0] (mod cells for a ring). Block b < heads_q takes query head b, the next heads_k
/// blocks the key heads (and their value heads); kt and vt are the caches' types (kv_quant.cuh).
/// Each step is rms_norm2's, rope2's and
/// kv_store's arithmetic, operation for operation (256 threads, as rms_norm2 sums its squares),
/// so the fused decode step equals the unfused one bit for bit.
extern "C" __global__ void __launch_bounds__(256)
    norm_rope_store(float* q, int heads_q, float* k, int heads_k, const float* v, const float* wq,
                    const float* wk, float eps, int head_dim, int n_rot, const int* positions,
                    float theta_scale, float freq_scale, int neox, const float* ff, float mscale, float ext,
                    float low, float high, void* kc, void* vc,
                    int cells, int ring, int kt, int vt) {
  pdl_begin();
  const bool is_q = static_cast<int>(blockIdx.x) < heads_q;
  const int h = is_q ? blockIdx.x : blockIdx.x - heads_q;
  float* x = (is_q ? q : k) + static_cast<size_t>(h) * head_dim;
  if (wq) {
    const float* w = is_q ? wq : wk;
    const float scale = rms_scale(x, head_dim, eps);
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
      const float v = x[i] * scale;
      x[i] = w ? v * w[i] : v;
    }
    __syncthreads();
  }
  const int pos = positions[0];
  for (int i = threadIdx.x; i < (n_rot >> 1); i += blockDim.x)
    rope_pair_i(x, i, pos, n_rot, theta_scale, freq_scale, neox, ff, RopeYarn{mscale, ext, low, high});
  if (is_q) return;
  __syncthreads();
  const int cell = ring ? pos % cells : pos;
  if (cell < 0 || cell >= cells) return;
  const float* vh = v + static_cast<size_t>(h) * head_dim;
  if (kt == KV_F16 && vt == KV_F16) {
    const size_t dst = static_cast<size_t>(cell) * heads_k * head_dim + static_cast<size_t>(h) * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
      static_cast<__half*>(kc)[dst + i] = __float2half_rn(x[i]);
      static_cast<__half*>(vc)[dst + i] = __float2half_rn(vh[i]);
    }
    return;
  }
  const int kv_dim = heads_k * head_dim;
  kv_store_values(x, head_dim, kt, const_cast<uint8_t*>(kv_head(kc, kt, cell, kv_dim, h, head_dim)));
  kv_store_values(vh, head_dim, vt, const_cast<uint8_t*>(kv_head(vc, vt, cell, kv_dim, h, head_dim)));
}
