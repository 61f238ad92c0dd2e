// infer's rotated K/V codes tq3 and tq4 on the GPU: the bytes lib/cpu/kv_turbo.zig stores. A head
// vector (keys less their layer's anchor, which ts/backend/cuda-kv-anchor.ts sets and uploads) is
// rotated by T = H·D2·H·D1 / d (the CPU's seeded signs and Walsh–Hadamard stage order, each step
// the same f32 operation, so the same bits), then each coordinate gets its Lloyd–Max level and
// the vector one f16 least-squares scale. The sums that pick the scale (Σy², Σy·c, Σc²) run in
// the CPU's order in one thread, without contraction, so the stored bytes equal the CPU's.
//
// Attention reads the codes in the rotated domain (kv_turbo_at): tq_rotate turns the queries
// once (a TQ K cache) and the output back once (a TQ V cache); the cache is never expanded.
#pragma once
#include "kv_quant.cuh"

constexpr int KV_TURBO_DIM_MAX = 1024;

/// Sign i of diagonal `round` (0: D1, 1: D2): kv_turbo.zig's splitmix64 stream from its fixed
/// seed, D1's 1024 values first.
__device__ __forceinline__ float kv_turbo_sign(int round, int i) {
  const unsigned long long state =
      0x747572626f717561ull + static_cast<unsigned long long>(round * KV_TURBO_DIM_MAX + i + 1) * 0x9e3779b97f4a7c15ull;
  unsigned long long z = state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (z & 1) == 0 ? 1.0f : -1.0f;
}

/// In-place unnormalised Walsh–Hadamard transform of x[0..d) in shared memory (kv_turbo.zig
/// fwhtScalar's stages, h = 1, 2, 4, ...); every thread of the block calls it.
__device__ __forceinline__ void kv_turbo_fwht(float* x, int d) {
  for (int h = 1; h < d; h <<= 1) {
    __syncthreads();
    for (int t = threadIdx.x; t < d / 2; t += blockDim.x) {
      const int i = (t / h) * 2 * h + t % h;
      const float a = x[i], b = x[i + h];
      x[i] = __fadd_rn(a, b);
      x[i + h] = __fsub_rn(a, b);
    }
  }
  __syncthreads();
}

/// x = T x (inverse: x = Tᵀ x) in shared memory, as kv_turbo.zig rotate / unrotate.
__device__ __forceinline__ void kv_turbo_rotate(float* x, int d, bool inverse) {
  const float inv_d = 1.0f / static_cast<float>(d);  // a power of two: exact
  if (!inverse) {
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[i] = __fmul_rn(x[i], kv_turbo_sign(0, i));
    kv_turbo_fwht(x, d);
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[i] = __fmul_rn(x[i], kv_turbo_sign(1, i));
    kv_turbo_fwht(x, d);
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[i] = __fmul_rn(x[i], inv_d);
  } else {
    kv_turbo_fwht(x, d);
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[i] = __fmul_rn(x[i], kv_turbo_sign(1, i));
    kv_turbo_fwht(x, d);
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[i] = __fmul_rn(__fmul_rn(x[i], kv_turbo_sign(0, i)), inv_d);
  }
  __syncthreads();
}

/// Rotates (inverse: back) vector blockIdx.x of head_dim values from src into dst (src == dst
/// allowed): queries into the TQ K cache's domain, attention's output out of the V cache's.
extern "C" __global__ void tq_rotate(const float* src, float* dst, int head_dim, int inverse) {
  __shared__ float x[KV_TURBO_DIM_MAX];
  pdl_begin();
  const size_t base = static_cast<size_t>(blockIdx.x) * head_dim;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) x[i] = src[base + i];
  kv_turbo_rotate(x, head_dim, inverse != 0);
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) dst[base + i] = x[i];
}

/// Codes head kvh = blockIdx.x % kv_heads of row t = blockIdx.x / kv_heads of x (kv_heads ·
/// head_dim values a row), less the anchor's head (null: none), into its cell of a TQ3/TQ4
/// cache: positions[t] (mod cells for a ring), or first_cell + t where positions is null.
/// kv_turbo.zig encodeOffset, the same bytes.
extern "C" __global__ void kv_store_turbo(const float* src, int kv_heads, int head_dim, uint8_t* cache, int type,
                                          const int* positions, int first_cell, int cells, int ring,
                                          const float* anchor) {
  __shared__ float y[KV_TURBO_DIM_MAX];
  __shared__ float level[KV_TURBO_DIM_MAX];
  __shared__ uint8_t code[KV_TURBO_DIM_MAX];
  __shared__ float inv_rms_s, sum_sq_s;
  pdl_begin();
  const int t = blockIdx.x / kv_heads, kvh = blockIdx.x % kv_heads, d = head_dim;
  const int pos = positions != nullptr ? positions[t] : first_cell + t;
  const int cell = ring ? pos % cells : pos;
  if (cell < 0 || cell >= cells) return;  // the whole block leaves alike
  const size_t row = static_cast<size_t>(t) * kv_heads * d + static_cast<size_t>(kvh) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = src[row + i];
    y[i] = anchor != nullptr ? __fsub_rn(v, anchor[kvh * d + i]) : v;
  }
  kv_turbo_rotate(y, d, false);
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int i = 0; i < d; i++) s = __fadd_rn(s, __fmul_rn(y[i], y[i]));
    const float rms = __fsqrt_rn(__fdiv_rn(s, static_cast<float>(d)));
    inv_rms_s = rms > 0.0f ? __fdiv_rn(1.0f, rms) : 0.0f;
    sum_sq_s = s;
  }
  __syncthreads();
  const bool tq4 = type == KV_TQ4;
  const float* mags = kv_turbo_mags + (tq4 ? 4 : 0);
  const int n_mags = tq4 ? 8 : 4;
  const float inv_rms = inv_rms_s;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = y[i];
    const float u = fabsf(__fmul_rn(v, inv_rms));
    int idx = 0;
    for (int b = 0; b + 1 < n_mags; b++) idx += u > __fadd_rn(mags[b], mags[b + 1]) * 0.5f;
    const bool negative = v < 0.0f;
    level[i] = negative ? -mags[idx] : mags[idx];
    code[i] = static_cast<uint8_t>(idx | (negative ? (tq4 ? 8 : 4) : 0));
  }
  __syncthreads();
  uint8_t* dst = cache + static_cast<size_t>(cell) * kv_bytes(type, kv_heads * d, d) + kv_bytes(type, kvh * d, d);
  if (tq4) {
    for (int j = threadIdx.x; j < d / 2; j += blockDim.x) dst[2 + j] = static_cast<uint8_t>(code[2 * j] | (code[2 * j + 1] << 4));
  } else {
    for (int j = threadIdx.x; j < d / 4; j += blockDim.x) {
      int m = 0;
      for (int f = 0; f < 4; f++) m |= (code[4 * j + f] & 3) << (2 * f);
      dst[2 + j] = static_cast<uint8_t>(m);
    }
    for (int j = threadIdx.x; j < d / 8; j += blockDim.x) {
      int g = 0;
      for (int f = 0; f < 8; f++) g |= ((code[8 * j + f] >> 2) & 1) << f;
      dst[2 + d / 4 + j] = static_cast<uint8_t>(g);
    }
  }
  if (threadIdx.x == 0) {
    float yc = 0.0f, cc = 0.0f;
    for (int i = 0; i < d; i++) {
      yc = __fadd_rn(yc, __fmul_rn(y[i], level[i]));
      cc = __fadd_rn(cc, __fmul_rn(level[i], level[i]));
    }
    const float s = sum_sq_s;
    // Zig's NaN as f16 (0x7e00), so that a non-finite key stores the CPU's bytes too.
    const unsigned short bits = isfinite(s) ? __half_as_ushort(__float2half_rn(__fdiv_rn(yc, cc))) : 0x7e00;
    dst[0] = static_cast<uint8_t>(bits & 0xff);
    dst[1] = static_cast<uint8_t>(bits >> 8);
  }
}
