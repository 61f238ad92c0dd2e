// Helpers shared by every kernel: warp/block reductions, unaligned loads, f16/bf16 rounding.
// Built with -fmad=false (shaders/cuda/build.sh): a*b+c stays two roundings, as the Zig CPU
// kernels compute it; where the CPU fuses (Zig's @mulAdd) the kernels call __fmaf_rn explicitly.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define FULL_MASK 0xffffffffu

// INFER_MARK(k): with -DINFER_TRACE (bench/cuda-probe.cu only), thread 0 of block 0 records the
// SM clock at mark k of the kernel into infer_trace (the probe prints each phase's cycles); a
// no-op in the library's kernels. The marks follow one thread: where a block's own latency goes,
// not what leaving a phase out would save a launch.
#ifdef INFER_TRACE
__device__ long long infer_trace[64];
#define INFER_MARK(k)                                                            \
  do {                                                                           \
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) infer_trace[k] = clock64(); \
  } while (0)
// INFER_BLOCK_MARK(k): thread 0 of every block records the global timer (ns) at mark k into
// infer_block_trace (the probe's PROBE_BLOCKS: when each block of one launch reached each phase).
__device__ unsigned long long infer_block_trace[2048][12];
#define INFER_BLOCK_MARK(k)                                                                       \
  do {                                                                                            \
    if (threadIdx.x == 0) {                                                                       \
      unsigned long long t_;                                                                      \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                                      \
      infer_block_trace[(blockIdx.y * gridDim.x + blockIdx.x) & 2047][k] = t_;                    \
    }                                                                                             \
  } while (0)
#else
#define INFER_MARK(k) \
  do {                \
  } while (0)
#define INFER_BLOCK_MARK(k) \
  do {                      \
  } while (0)
#endif

/// The first statement of every kernel. lib/cuda launches kernels with programmatic dependent
/// launch on sm_90+ (the kernel may start while the one before it in the stream still runs), so
/// each kernel first waits for its predecessor's results (griddepcontrol.wait, a no-op when the
/// launch had no such dependency), then lets its own successor start launching: the successor's
/// blocks take free SM slots and wait in turn, and the launch latency between kernels overlaps
/// the running kernel. Every kernel waiting before it touches memory that a kernel writes keeps
/// the order transitive; before the wait a kernel may read only what no kernel writes (weights)
/// and pull anything into L2 (prefetch_l2: a hint, which cannot read stale data). Letting the
/// successor launch before the wait (a chain of kernels resident ahead) was measured slower: 8B
/// Q4_0 decode 431 vs 435 tok/s, 0.6B 1,166 vs 1,276 on an H200.
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/// Pulls the 128-byte line holding p into L2 (no value is read; no fault on any address).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ double block_sum_d(double v) {
  __shared__ double partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : 0.0;
  return warp_sum_d(v);
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : -INFINITY;
  return warp_max(v);
}

/// An f16 stored at a 2-byte aligned address.
__device__ __forceinline__ float ld_f16(const uint8_t* p) {
  return __half2float(*reinterpret_cast<const __half*>(p));
}

/// Four bytes at a 2-byte aligned address (GGUF blocks of 18, 22, 34 and 210 bytes).
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
}

__device__ __forceinline__ float round_f16(float x) { return __half2float(__float2half_rn(x)); }

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

/// ggml_v_expf (AVX-512), operation for operation, as lib/cpu/attention_f16.zig's expV.
__device__ __forceinline__ float ggml_expf(float x) {
  const float r = 0x1.8p23f;
  const float z = __fmaf_rn(x, 0x1.715476p+0f, r);
  const float n = __fsub_rn(z, r);
  const float b = __fmaf_rn(-n, 0x1.7f7d1cp-20f, __fmaf_rn(-n, 0x1.62e4p-1f, x));
  const float u = __fmul_rn(b, b);
  const float j = __fmaf_rn(
      __fmaf_rn(__fmaf_rn(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, __fmaf_rn(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
      __fmaf_rn(0x1.ffffecp-1f, b, 1.0f));
  if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
  return ldexpf(j, static_cast<int>(n));
}
