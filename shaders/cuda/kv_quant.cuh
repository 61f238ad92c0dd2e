// KV caches in ggml's Q8_0 and Q4_0 blocks on the GPU (llama.cpp's -ctk/-ctv q8_0/q4_0): the same
// bytes lib/cpu/kv_quant.zig stores, so a cache means the same thing on either backend. A row of
// kv_dim values is kv_dim / 32 blocks; a KV head's head_dim (a multiple of 32) is whole blocks.
// Storing quantizes as the CPU does (Q8_0: the SIMD quantizer, round half to even; Q4_0:
// quantize_row_q4_0_ref), a warp a block, lane i holding value i. Attention never expands the
// cache: the tensor-core kernels dequantize a tile's blocks into the f16 tile their products
// read (in shared memory), the per-head kernels read value by value (kv_at).
#pragma once
#include "common.cuh"

// ggml type ids, as ts/backend/cuda.ts and lib/cuda/attention.zig name a cache's type.
constexpr int KV_F16 = 1;
constexpr int KV_Q4_0 = 2;
constexpr int KV_Q8_0 = 8;
// infer's rotated codes (lib/cpu/kv_turbo.zig; kv_turbo.cuh stores and rotates them): one coded
// vector per head, an f16 scale then tq4: nibbles; tq3: 2-bit magnitudes, then sign bits.
constexpr int KV_TQ3 = 103;
constexpr int KV_TQ4 = 104;

__host__ __device__ constexpr bool kv_turbo(int type) { return type == KV_TQ3 || type == KV_TQ4; }

/// Bytes of n values of a cache of `type` (n a whole number of blocks for Q8_0 and Q4_0).
__host__ __device__ constexpr int kv_bytes(int type, int n) {
  return type == KV_Q8_0 ? n / 32 * 34 : type == KV_Q4_0 ? n / 32 * 18 : 2 * n;
}

/// kv_bytes for any type: n a whole number of head vectors of head_dim values for TQ3/TQ4.
__host__ __device__ constexpr int kv_bytes(int type, int n, int head_dim) {
  return kv_turbo(type) ? n / head_dim * (2 + head_dim * (type == KV_TQ3 ? 3 : 4) / 8) : kv_bytes(type, n);
}

/// KV head kvh of cell `cell` of a cache whose rows hold kv_dim values.
__device__ __forceinline__ const uint8_t* kv_head(const void* cache, int type, int cell, int kv_dim, int kvh,
                                                  int head_dim) {
  return static_cast<const uint8_t*>(cache) + static_cast<size_t>(cell) * kv_bytes(type, kv_dim, head_dim) +
         kv_bytes(type, kvh * head_dim, head_dim);
}

/// The Lloyd-Max magnitudes of N(0, 1) (kv_turbo.zig magnitudes): tq3's four, then tq4's eight.
__constant__ float kv_turbo_mags[12] = {0.2451f, 0.7560f, 1.3440f, 2.1520f, 0.1284f, 0.3881f,
                                        0.6568f, 0.9424f, 1.2562f, 1.6181f, 2.0690f, 2.7326f};

/// A head vector's f16 scale (TQ3/TQ4: a vector may start at an odd byte).
__device__ __forceinline__ float kv_turbo_scale(const uint8_t* head) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(head[0] | (head[1] << 8))));
}

/// Coordinate d of a TQ3/TQ4 head vector in the rotated domain: ±magnitude times the scale
/// (kv_turbo.zig decodeRotatedScalar, the same f32 product).
__device__ __forceinline__ float kv_turbo_at(const uint8_t* head, int type, int d, int head_dim) {
  int idx, neg;
  if (type == KV_TQ4) {
    const int c = head[2 + (d >> 1)] >> (4 * (d & 1));
    idx = 4 + (c & 7);
    neg = (c >> 3) & 1;
  } else {
    idx = (head[2 + (d >> 2)] >> (2 * (d & 3))) & 3;
    neg = (head[2 + head_dim / 4 + (d >> 3)] >> (d & 7)) & 1;
  }
  const float m = kv_turbo_mags[idx];
  return __fmul_rn(neg ? -m : m, kv_turbo_scale(head));
}

/// Value d of a head (lib/cpu/kv_quant.zig atQ8 / atQ4: the integer times the f16 scale in f32;
/// TQ3/TQ4: the rotated coordinate, kv_turbo_at).
__device__ __forceinline__ float kv_at(const uint8_t* head, int type, int d, int head_dim) {
  if (kv_turbo(type)) return kv_turbo_at(head, type, d, head_dim);
  if (type == KV_Q8_0) {
    const uint8_t* b = head + (d >> 5) * 34;
    return static_cast<float>(static_cast<int8_t>(b[2 + (d & 31)])) * ld_f16(b);
  }
  if (type == KV_Q4_0) {
    const uint8_t* b = head + (d >> 5) * 18;
    const int j = d & 31;
    const int nibble = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
    return static_cast<float>(nibble - 8) * ld_f16(b);
  }
  return ld_f16(head + 2 * d);
}

/// The 32 values of the block at `src` (16-byte aligned for f16) as f16 into dst (16-byte
/// aligned): the tile the tensor-core kernels' fragments read.
__device__ __forceinline__ void kv_block_to_f16(const uint8_t* src, int type, __half* dst) {
  if (type == KV_F16) {
#pragma unroll
    for (int i = 0; i < 4; i++) reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    return;
  }
  const float d = ld_f16(src);
  uint32_t packed[16];
  if (type == KV_Q8_0) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const uint32_t w = ld_u32_a2(src + 2 + 4 * i);
      const float v0 = static_cast<float>(static_cast<int8_t>(w)) * d;
      const float v1 = static_cast<float>(static_cast<int8_t>(w >> 8)) * d;
      const float v2 = static_cast<float>(static_cast<int8_t>(w >> 16)) * d;
      const float v3 = static_cast<float>(static_cast<int8_t>(w >> 24)) * d;
      const __half2 a = __floats2half2_rn(v0, v1), b = __floats2half2_rn(v2, v3);
      packed[2 * i] = *reinterpret_cast<const uint32_t*>(&a);
      packed[2 * i + 1] = *reinterpret_cast<const uint32_t*>(&b);
    }
  } else {  // Q4_0: byte j holds value j (low nibble) and value j + 16 (high)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const uint32_t w = ld_u32_a2(src + 2 + 4 * i);
#pragma unroll
      for (int h = 0; h < 2; h++) {  // h = 0: values 4i..4i+3; h = 1: values 16+4i..
        const int s = 4 * h;
        const float v0 = static_cast<float>(static_cast<int>((w >> s) & 15) - 8) * d;
        const float v1 = static_cast<float>(static_cast<int>((w >> (8 + s)) & 15) - 8) * d;
        const float v2 = static_cast<float>(static_cast<int>((w >> (16 + s)) & 15) - 8) * d;
        const float v3 = static_cast<float>(static_cast<int>((w >> (24 + s)) & 15) - 8) * d;
        const __half2 a = __floats2half2_rn(v0, v1), b = __floats2half2_rn(v2, v3);
        packed[8 * h + 2 * i] = *reinterpret_cast<const uint32_t*>(&a);
        packed[8 * h + 2 * i + 1] = *reinterpret_cast<const uint32_t*>(&b);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; i++)
    reinterpret_cast<uint4*>(dst)[i] = make_uint4(packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]);
}

/// Zeros for the 32 values of a tile row's block past the keys (their probability is 0, and
/// 0 · V must not be NaN from whatever the shared memory held).
__device__ __forceinline__ void kv_block_zero(__half* dst) {
#pragma unroll
  for (int i = 0; i < 4; i++) reinterpret_cast<uint4*>(dst)[i] = make_uint4(0, 0, 0, 0);
}

/// Stores one block of 32 values (warp-collective: lane i holds value i, every lane of the warp
/// calls it) at dst, 2-byte aligned: f16, or quantized as lib/cpu/kv_quant.zig storeQ8 / storeQ4.
__device__ __forceinline__ void kv_store_block(float x, int type, uint8_t* dst) {
  const int lane = threadIdx.x & 31;
  if (type == KV_Q8_0) {
    // lib/quant/q8_0.zig quantize (ggml's AVX2 quantize_row_q8_0): d = amax / 127, the values
    // times 127 / amax rounded half to even; a NaN in the block makes the scale NaN.
    const float amax = warp_max(fabsf(x));
    const bool nan = __any_sync(FULL_MASK, x != x);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const float q = fminf(fmaxf(rintf(x * id), -128.0f), 127.0f);
    dst[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(x != x ? 0.0f : q));
    if (lane == 0) *reinterpret_cast<__half*>(dst) = nan ? __float2half_rn(NAN) : __float2half_rn(amax / 127.0f);
    return;
  }
  if (type == KV_Q4_0) {
    // lib/quant/q4_0.zig quantizeRef: the value of largest magnitude (the first of equals) over
    // -8 is the scale; the values times its inverse plus 8.5, truncated, at most 15.
    float amax = fabsf(x), max = x;
    int at = lane;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float a2 = __shfl_xor_sync(FULL_MASK, amax, o), m2 = __shfl_xor_sync(FULL_MASK, max, o);
      const int at2 = __shfl_xor_sync(FULL_MASK, at, o);
      if (a2 > amax || (a2 == amax && at2 < at)) {
        amax = a2;
        max = m2;
        at = at2;
      }
    }
    if (amax == 0.0f) max = 0.0f;  // the reference keeps 0 unless some |v| > 0
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float q = fminf(15.0f, truncf(x * id + 8.5f));
    const float hi = __shfl_down_sync(FULL_MASK, q, 16);
    if (lane < 16) dst[2 + lane] = static_cast<uint8_t>(static_cast<int>(q) | (static_cast<int>(hi) << 4));
    if (lane == 0) *reinterpret_cast<__half*>(dst) = __float2half_rn(d);
    return;
  }
  reinterpret_cast<__half*>(dst)[lane] = __float2half_rn(x);
}

/// The n values of src (whole blocks) into the cache at `row` (a head's first byte): warp w of
/// the block stores blocks w, w + warps, ... (every thread of the block calls it).
__device__ __forceinline__ void kv_store_values(const float* src, int n, int type, uint8_t* row) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int b = warp; b < n / 32; b += warps) kv_store_block(src[32 * b + lane], type, row + kv_bytes(type, 32 * b));
}
