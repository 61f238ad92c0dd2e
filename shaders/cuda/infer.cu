// Every CUDA kernel of libinfer's CUDA backend (lib/cuda/), one module loaded at run time with
// cuModuleLoadData: this file and the headers it includes (matmul.cuh, attend_heads.cuh,
// decode.cuh, attend_decode.cuh, attend_warps.cuh, attend_prompt.cuh). Built by shaders/cuda/build.sh; kernel
// names are extern "C" and listed in lib/cuda/kernels.zig (Kernel). Activations are f32 row-major [rows][cols]; the KV cache is f16
// [cell][kv_head][head_dim]; positions are i32 per row and are read on the device, so that one
// captured decode step (a CUDA graph) replays at any position.
//
// Arithmetic follows the CPU backend (lib/cpu/*.zig) operation for operation where that is cheap,
// so that logits agree to rounding: activations are quantized exactly as the CPU's vec_dot_type
// (integer dots per block), RMSNorm sums squares in f64, RoPE builds its angles with the same f32
// recurrence, and GELU rounds through f16 as ggml's table does. Attention rounds the query to
// f16; the one-pass kernels that run by default (attend_warps.cuh and attend_decode.cuh for
// decode and small batches, attend_prompt.cuh for prompts of head_dim 64/128) use a running maximum, so their probabilities
// differ from the CPU's by rounding; the per-head kernels below (attn_scores/attn_values and their
// MMA forms, for the shapes the others do not take) follow the CPU's three steps (f16
// probabilities after the global max and sum, ggml's expf, the sum in f64).
#include "common.cuh"
#include "quant.cuh"
#include "packed.cuh"
#include "kv_quant.cuh"
#include "kv_turbo.cuh"

// ---- embedding rows --------------------------------------------------------------------------

template <class T>
__device__ __forceinline__ void get_rows_q(const uint8_t* table, int n_cols, const int* ids, float* out) {
  const int units = n_cols >> 5;
  const int u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= units) return;
  const size_t row_bytes = static_cast<size_t>(n_cols / T::BV) * T::BB;
  const int r = blockIdx.y;
  T::dequant(table + static_cast<size_t>(ids[r]) * row_bytes, u, out + static_cast<size_t>(r) * n_cols + 32 * u);
}

template <class T>
__device__ __forceinline__ void get_rows_f(const uint8_t* table, int n_cols, const int* ids, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_cols) return;
  const int r = blockIdx.y;
  out[static_cast<size_t>(r) * n_cols + i] = T::at(table, static_cast<size_t>(ids[r]) * n_cols + i);
}

#define GET_ROWS(NAME, IMPL, T)                                                                      \
  extern "C" __global__ void NAME(const uint8_t* table, int n_cols, const int* ids, float* out) { pdl_begin(); \
    IMPL<T>(table, n_cols, ids, out);                                                                \
  }
GET_ROWS(get_rows_q4_0, get_rows_q, Q4_0)
GET_ROWS(get_rows_q5_0, get_rows_q, Q5_0)
GET_ROWS(get_rows_q8_0, get_rows_q, Q8_0)
GET_ROWS(get_rows_mxfp4, get_rows_q, MXFP4)
GET_ROWS(get_rows_q4_k, get_rows_q, Q4_K)
GET_ROWS(get_rows_q5_k, get_rows_q, Q5_K)
GET_ROWS(get_rows_q6_k, get_rows_q, Q6_K)
GET_ROWS(get_rows_q4_0r, get_rows_q, Q4_0R)
GET_ROWS(get_rows_q8_0r, get_rows_q, Q8_0R)
GET_ROWS(get_rows_q4_kr, get_rows_q, Q4_KR)
GET_ROWS(get_rows_f32, get_rows_f, F32W)
GET_ROWS(get_rows_f16, get_rows_f, F16W)
GET_ROWS(get_rows_bf16, get_rows_f, BF16W)

// ---- f16 copies for the cuBLAS GEMM of long prompts (lib/cuda/cublas.zig) ---------------------

/// out (f16, n_rows × n_cols row-major) = the weight's values, each 32-value unit dequantized with
/// the CPU's arithmetic (T::dequant) and rounded to f16. A block takes 256 consecutive units (a
/// thread each), stages them in shared memory and stores them as the one contiguous 16 KB run they
/// are in the output: each thread storing its own 64 bytes would be 32 scattered stores a warp
/// instruction (measured: an 8B model's weights took ~40 ms this way, ~10× their bytes' time).
template <class T>
__device__ __forceinline__ void dequant_f16(const uint8_t* w, int n_rows, int n_cols, __half* out) {
  constexpr int UNITS = 256;  // = blockDim.x
  __shared__ uint4 staged[UNITS * 4];
  const int units = n_cols >> 5;
  const size_t total = static_cast<size_t>(n_rows) * units;
  const size_t row_bytes = static_cast<size_t>(n_cols / T::BV) * T::BB;
  for (size_t first = static_cast<size_t>(blockIdx.x) * UNITS; first < total;
       first += static_cast<size_t>(gridDim.x) * UNITS) {
    const size_t i = first + threadIdx.x;
    if (i < total) {
      float y[32];
      T::dequant(w + (i / units) * row_bytes, static_cast<int>(i % units), y);
#pragma unroll
      for (int k = 0; k < 4; k++) {
        __half2 h[4];
#pragma unroll
        for (int j = 0; j < 4; j++) h[j] = __floats2half2_rn(y[8 * k + 2 * j], y[8 * k + 2 * j + 1]);
        staged[threadIdx.x * 4 + k] = *reinterpret_cast<const uint4*>(h);
      }
    }
    __syncthreads();
    const int n = 4 * static_cast<int>(total - first < UNITS ? total - first : UNITS);
    uint4* dst = reinterpret_cast<uint4*>(out + first * 32);
    for (int j = threadIdx.x; j < n; j += UNITS) dst[j] = staged[j];
    __syncthreads();
  }
}

#define DEQUANT_F16(NAME, T)                                                                       \
  extern "C" __global__ void NAME(const uint8_t* w, int n_rows, int n_cols, __half* out) {         \
    pdl_begin();                                                                                   \
    dequant_f16<T>(w, n_rows, n_cols, out);                                                        \
  }
DEQUANT_F16(dequant_f16_q4_0, Q4_0)
DEQUANT_F16(dequant_f16_q5_0, Q5_0)
DEQUANT_F16(dequant_f16_q8_0, Q8_0)
DEQUANT_F16(dequant_f16_mxfp4, MXFP4)
DEQUANT_F16(dequant_f16_q4_k, Q4_K)
DEQUANT_F16(dequant_f16_q5_k, Q5_K)
DEQUANT_F16(dequant_f16_q6_k, Q6_K)
DEQUANT_F16(dequant_f16_q4_0r, Q4_0R)
DEQUANT_F16(dequant_f16_q8_0r, Q8_0R)
DEQUANT_F16(dequant_f16_q4_kr, Q4_KR)

/// out[i] = x[i] rounded to f16, i < n (grid-stride).
extern "C" __global__ void f32_to_f16(const float* x, long long n, __half* out) {
  pdl_begin();
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(x[i]);
}

/// out[i] = x[i] rounded to bf16 (to nearest, ties to even), i < n (grid-stride).
extern "C" __global__ void f32_to_bf16(const float* x, long long n, __nv_bfloat16* out) {
  pdl_begin();
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(x[i]);
}

/// y[i] = Σ_z part[z·n + i] over `splits` planes, in plane order (the K-splits of mmq_*, whose
/// partial sums lib/cuda/ops.zig gives each a plane). Grid-stride.
extern "C" __global__ void sum_splits(const float* part, int splits, long long n, float* y) {
  pdl_begin();
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float s = part[i];
    for (int z = 1; z < splits; z++) s += part[z * n + i];
    y[i] = s;
  }
}

// ---- activation quantization -------------------------------------------------------------------

/// Q8_0 as lib/quant/q8_0.zig's quantize: per 32 values d = amax/127 (stored as f16),
/// q = round_half_even(x * (127/amax)). The calling warp holds one unit, value `lane` in v.
__device__ __forceinline__ void quant_unit_q8_0(float v, int8_t* q, float* d) {
  const int lane = threadIdx.x & 31;
  const float amax = warp_max(fabsf(v));
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  q[lane] = static_cast<int8_t>(max(-128, min(127, __float2int_rn(v * id))));
  if (lane == 0) *d = round_f16(amax / 127.0f);
}

/// The order in which quant_super_q8_k picks its maximum: |v| first (NaN as 0, as `|v| > best`
/// never holds for it; a superblock of only NaNs so quantizes to zeros), then the lower index;
/// the sign rides in the lowest bit, which only the winner's own value reads back.
__device__ __forceinline__ unsigned long long q8k_key(float v, int i) {
  const float a = fabsf(v);
  const uint32_t bits = a == a ? __float_as_uint(a) : 0u;
  return (static_cast<unsigned long long>(bits) << 32) | (static_cast<uint32_t>(255 - i) << 1) |
         (__float_as_uint(v) >> 31);
}

__device__ __forceinline__ unsigned long long q8k_max(unsigned long long a, unsigned long long b) {
  return a > b ? a : b;
}

/// Q8_K as lib/quant/q8_k.zig's quantize: per 256 values, max = the first value of largest
/// magnitude, iscale = -127/max, q = min(round_half_even(x * iscale), 127), d = 1/iscale (f32).
/// The calling warp holds one superblock, values lane + 32j (j < 8) in v: callers read them from
/// shared memory, where 8 consecutive floats a lane put the warp's loads 8 to a bank (an 8B
/// model's add + norm + quantize took 8.4 µs so, 6.3 this way on an H200),
/// and each of the 8 quant stores is a coalesced 32 bytes. d is written per 32. The maximum is
/// one 64-bit key (q8k_key) taken by a tree over the lane's 8 values and a shuffle tree over
/// the lanes.
__device__ __forceinline__ void quant_super_q8_k(const float* v, int8_t* q, float* d) {
  const int lane = threadIdx.x & 31;
  unsigned long long k[8];
#pragma unroll
  for (int j = 0; j < 8; j++) k[j] = q8k_key(v[j], lane + 32 * j);
  unsigned long long key = q8k_max(q8k_max(q8k_max(k[0], k[1]), q8k_max(k[2], k[3])),
                                   q8k_max(q8k_max(k[4], k[5]), q8k_max(k[6], k[7])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) key = q8k_max(key, __shfl_xor_sync(FULL_MASK, key, o));
  const float best = __uint_as_float(static_cast<uint32_t>(key >> 32));
  if (best != 0.0f) {
    const float best_v = (key & 1) ? -best : best;
    const float iscale = -127.0f / best_v;
#pragma unroll
    for (int j = 0; j < 8; j++) q[lane + 32 * j] = static_cast<int8_t>(min(__float2int_rn(v[j] * iscale), 127));
    if (lane < 8) d[lane] = 1.0f / iscale;
  } else {
#pragma unroll
    for (int j = 0; j < 8; j++) q[lane + 32 * j] = 0;
    if (lane < 8) d[lane] = 0.0f;
  }
}

/// One warp per unit; x is n_units*32 contiguous values.
extern "C" __global__ void quantize_q8_0(const float* x, int n_units, int8_t* q, float* d) {
  pdl_begin();
  const int unit = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (unit >= n_units) return;
  const size_t base = static_cast<size_t>(unit) * 32;
  quant_unit_q8_0(x[base + (threadIdx.x & 31)], q + base, d + unit);
}

/// quant_super_q8_k's bytes from a block of 256 threads, thread t holding value t of the
/// superblock: the same maximum (one key order, so any tree finds it) by a warp's shuffles and
/// the 8 warps' keys in shared memory, the same per-value arithmetic. A warp holding a superblock
/// does 8 values a lane one after the other; where a launch has few superblocks (an 8B model's
/// 14,336 gated activations are 56) a block each has 8 times the threads at work.
__device__ __forceinline__ void quant_block_q8_k(float v, int8_t* q, float* d) {
  __shared__ unsigned long long warp_keys[8];
  const int t = threadIdx.x, lane = t & 31;
  unsigned long long key = q8k_key(v, t);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) key = q8k_max(key, __shfl_xor_sync(FULL_MASK, key, o));
  if (lane == 0) warp_keys[t >> 5] = key;
  __syncthreads();
  key = warp_keys[0];
#pragma unroll
  for (int w = 1; w < 8; w++) key = q8k_max(key, warp_keys[w]);
  const float best = __uint_as_float(static_cast<uint32_t>(key >> 32));
  if (best != 0.0f) {
    const float best_v = (key & 1) ? -best : best;
    const float iscale = -127.0f / best_v;
    q[t] = static_cast<int8_t>(min(__float2int_rn(v * iscale), 127));
    if (t < 8) d[t] = 1.0f / iscale;
  } else {
    q[t] = 0;
    if (t < 8) d[t] = 0.0f;
  }
}

/// A block of 256 threads per superblock of 256 values (quant_block_q8_k): n_super blocks.
extern "C" __global__ void quantize_q8_k(const float* x, int n_super, int8_t* q, float* d) {
  pdl_begin();
  const size_t base = static_cast<size_t>(blockIdx.x) * 256;
  quant_block_q8_k(x[base + threadIdx.x], q + base, d + static_cast<size_t>(blockIdx.x) * 8);
}

#include "matmul.cuh"

// ---- RMSNorm ---------------------------------------------------------------------------------
// One block per row. lib/cpu/norm.zig: squares in f32 summed in f64, mean rounded to f32,
// scale = 1/sqrtf(mean + eps), y = (x * scale) * w.

__device__ __forceinline__ float rms_scale(const float* x, int n_cols, float eps) {
  double s = 0.0;
  for (int i = threadIdx.x; i < n_cols; i += blockDim.x) s += static_cast<double>(x[i] * x[i]);
  s = block_sum_d(s);
  const float mean = static_cast<float>(s / static_cast<double>(n_cols));
  return 1.0f / sqrtf(mean + eps);
}

extern "C" __global__ void rms_norm(const float* x, const float* w, int n_cols, float eps, float* out) {
  pdl_begin();
  const size_t base = static_cast<size_t>(blockIdx.x) * n_cols;
  const float scale = rms_scale(x + base, n_cols, eps);
  for (int i = threadIdx.x; i < n_cols; i += blockDim.x) {
    const float v = x[base + i] * scale;
    out[base + i] = w ? v * w[i] : v;
  }
}

/// residual += (x * scale) * w (Gemma's post-norms fused with the residual add).
extern "C" __global__ void rms_norm_add(const float* x, const float* w, int n_cols, float eps, float* residual) {
  pdl_begin();
  const size_t base = static_cast<size_t>(blockIdx.x) * n_cols;
  const float scale = rms_scale(x + base, n_cols, eps);
  for (int i = threadIdx.x; i < n_cols; i += blockDim.x) residual[base + i] += (x[base + i] * scale) * w[i];
}

/// Quantizes row `base` of n_cols values, value i being f(i) (mode 0: Q8_0 units, one warp each;
/// mode 1: Q8_K superblocks), and writes the values to out as well.
template <class F>
__device__ __forceinline__ void store_quantized_row(F f, size_t base, int n_cols, float* out, int mode, int8_t* q,
                                                    float* d) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (mode == 0) {
    for (int u = warp; u < (n_cols >> 5); u += warps) {
      const int i = u * 32 + lane;
      const float v = f(i);
      out[base + i] = v;
      quant_unit_q8_0(v, q + base + u * 32, d + base / 32 + u);
    }
  } else {
    for (int sb = warp; sb < (n_cols >> 8); sb += warps) {
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const int i = sb * 256 + lane + 32 * k;
        v[k] = f(i);
        out[base + i] = v[k];
      }
      quant_super_q8_k(v, q + base + sb * 256, d + base / 32 + sb * 8);
    }
  }
}

/// Before pdl_begin: the norm's weights (which no kernel writes) into shared memory, and the row
/// the kernel will read first pulled into L2, so that after the wait only the kernel-before's
/// output is a round trip away.
__device__ __forceinline__ void stage_norm(const float* w, float* wrow, int n_cols, const float* row) {
  if (w) {
#pragma unroll 4
    for (int i = threadIdx.x; i < n_cols; i += blockDim.x) wrow[i] = w[i];
  }
  for (int i = 32 * threadIdx.x; i < n_cols; i += 32 * blockDim.x) prefetch_l2(row + i);
}

/// rms_norm, then the result quantized for the matmuls that read it (rms_norm + quantize_*).
/// The row and the weights are staged in shared memory (2 * n_cols floats), so the quantizing
/// pass waits on no global load.
extern "C" __global__ void rms_norm_q(const float* x, const float* w, int n_cols, float eps, float* out, int mode,
                                      int8_t* q, float* d) {
  extern __shared__ float row[];
  float* wrow = row + n_cols;
  const size_t base = static_cast<size_t>(blockIdx.x) * n_cols;
  stage_norm(w, wrow, n_cols, x + base);
  pdl_begin();
  double s = 0.0;
#pragma unroll 4
  for (int i = threadIdx.x; i < n_cols; i += blockDim.x) {
    const float v = x[base + i];
    row[i] = v;
    s += static_cast<double>(v * v);
  }
  s = block_sum_d(s);  // as rms_scale, term for term; its barriers also publish row[] and wrow[]
  const float mean = static_cast<float>(s / static_cast<double>(n_cols));
  const float scale = 1.0f / sqrtf(mean + eps);
  store_quantized_row([&](int i) { const float v = row[i] * scale; return w ? v * wrow[i] : v; }, base, n_cols, out,
                      mode, q, d);
}

/// sum = a + b (may alias a), then rms_norm(sum) quantized: add + rms_norm + quantize_*.
/// Dynamic shared memory: 2 * n_cols floats (the sums, the weights). Every load of a and b comes
/// before the first store to sum, so the loads are in flight together (a store to sum, which
/// may be a, would otherwise hold back the next load).
extern "C" __global__ void add_rms_norm_q(const float* a, const float* b, float* sum, const float* w, int n_cols,
                                          float eps, float* out, int mode, int8_t* q, float* d) {
  INFER_MARK(10);
  extern __shared__ float row[];
  float* wrow = row + n_cols;
  const size_t base = static_cast<size_t>(blockIdx.x) * n_cols;
  stage_norm(w, wrow, n_cols, a + base);
  pdl_begin();
  INFER_MARK(11);
  double s = 0.0;
#pragma unroll 4
  for (int i = threadIdx.x; i < n_cols; i += blockDim.x) {
    const float v = a[base + i] + b[base + i];
    row[i] = v;
    s += static_cast<double>(v * v);
  }
  for (int i = threadIdx.x; i < n_cols; i += blockDim.x) sum[base + i] = row[i];  // this thread's own
  INFER_MARK(12);
  s = block_sum_d(s);
  INFER_MARK(13);
  const float mean = static_cast<float>(s / static_cast<double>(n_cols));
  const float scale = 1.0f / sqrtf(mean + eps);
  store_quantized_row([&](int i) { const float v = row[i] * scale; return w ? v * wrow[i] : v; }, base, n_cols, out,
                      mode, q, d);
  INFER_MARK(14);
}

/// In-place rms_norm of two tensors of rows of n_cols (Qwen 3's query and key head norms) in one
/// launch: blocks [0, rows_a) take xa with wa, the rest xb with wb; each row as rms_norm does it.
extern "C" __global__ void rms_norm2(float* xa, const float* wa, int rows_a, float* xb, const float* wb, int n_cols,
                                     float eps) {
  pdl_begin();
  const bool first = static_cast<int>(blockIdx.x) < rows_a;
  float* x = first ? xa + static_cast<size_t>(blockIdx.x) * n_cols
                   : xb + static_cast<size_t>(blockIdx.x - rows_a) * n_cols;
  const float* w = first ? wa : wb;
  const float scale = rms_scale(x, n_cols, eps);
  for (int i = threadIdx.x; i < n_cols; i += blockDim.x) {
    const float v = x[i] * scale;
    x[i] = w ? v * w[i] : v;
  }
}

// ---- RoPE ------------------------------------------------------------------------------------
// One block per (token, head), one thread per rotated pair. lib/cpu/rope.zig: theta starts at
// (float)pos and is multiplied by theta_scale once per pair; angle = freq_scale * (theta / ff);
// with YaRN (ext != 0) blended with the extrapolated theta / ff by rope_yarn_ramp over the
// correction dims [low, high]; cos and sin times mscale (1 without YaRN or an attention factor:
// exact, so a plain rotation is unchanged).
struct RopeYarn {
  float mscale, ext, low, high;
};

__device__ __forceinline__ void rope_pair_i(float* head, int i, int pos, int n_rot, float theta_scale,
                                            float freq_scale, int neox, const float* ff, const RopeYarn& y) {
  const int half = n_rot >> 1;
  float theta = static_cast<float>(pos);
  for (int k = 0; k < i; k++) theta *= theta_scale;
  const float extrapolated = theta / (ff ? ff[i] : 1.0f);
  float angle = freq_scale * extrapolated;
  if (y.ext != 0.0f) {
    const float r = (static_cast<float>(i) - y.low) / fmaxf(0.001f, y.high - y.low);
    const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, r))) * y.ext;
    angle = angle * (1.0f - mix) + extrapolated * mix;
  }
  const float c = cosf(angle) * y.mscale, s = sinf(angle) * y.mscale;
  const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
  const float a = head[ia], b = head[ib];
  head[ia] = __fmaf_rn(a, c, -__fmul_rn(b, s));
  head[ib] = __fmaf_rn(a, s, __fmul_rn(b, c));
}

__device__ __forceinline__ void rope_pair(float* head, int pos, int n_rot, float theta_scale, float freq_scale,
                                          int neox, const float* ff, const RopeYarn& y) {
  if (static_cast<int>(threadIdx.x) < (n_rot >> 1))
    rope_pair_i(head, threadIdx.x, pos, n_rot, theta_scale, freq_scale, neox, ff, y);
}

extern "C" __global__ void rope(float* x, int n_heads, int head_dim, int n_rot, const int* positions,
                                float theta_scale, float freq_scale, int neox, const float* ff, float mscale,
                                float ext, float low, float high) {
  pdl_begin();
  const int t = blockIdx.x / n_heads;
  rope_pair(x + static_cast<size_t>(blockIdx.x) * head_dim, positions[t], n_rot, theta_scale, freq_scale, neox, ff,
            RopeYarn{mscale, ext, low, high});
}

/// The queries' and the keys' RoPE in one launch (same positions and parameters).
extern "C" __global__ void rope2(float* xa, int heads_a, float* xb, int heads_b, int head_dim, int n_rot,
                                 const int* positions, float theta_scale, float freq_scale, int neox, const float* ff,
                                 float mscale, float ext, float low, float high) {
  pdl_begin();
  const int per_token = heads_a + heads_b;
  const int t = blockIdx.x / per_token, h = blockIdx.x % per_token;
  float* head = h < heads_a ? xa + (static_cast<size_t>(t) * heads_a + h) * head_dim
                            : xb + (static_cast<size_t>(t) * heads_b + (h - heads_a)) * head_dim;
  rope_pair(head, positions[t], n_rot, theta_scale, freq_scale, neox, ff, RopeYarn{mscale, ext, low, high});
}

// ---- KV cache ----------------------------------------------------------------------------------

/// Value i of row t = blockIdx.y of k and v (kv_dim values each) into cell positions[t] (mod cells
/// for a ring) of kc and vc, caches of types kt and vt (kv_quant.cuh: a warp stores a block of 32;
/// kv_dim is whole blocks, so a warp is all in or all out) (kv_store and kv_store_rows).
__device__ __forceinline__ void store_kv_value(const float* k, const float* v, int kv_dim, void* kc, void* vc,
                                               const int* positions, int cells, int ring, int kt, int vt) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= kv_dim) return;
  const int t = blockIdx.y;
  const int pos = positions[t];
  const int cell = ring ? pos % cells : pos;
  if (cell < 0 || cell >= cells) return;
  const size_t src = static_cast<size_t>(t) * kv_dim + i, dst = static_cast<size_t>(cell) * kv_dim + i;
  if (kt == KV_F16 && vt == KV_F16) {
    static_cast<__half*>(kc)[dst] = __float2half_rn(k[src]);
    static_cast<__half*>(vc)[dst] = __float2half_rn(v[src]);
    return;
  }
  const int b0 = i & ~31;  // the warp's block
  // A TQ3/TQ4 half is kv_store_turbo's (kv_turbo.cuh: a block a head vector), launched beside.
  if (!kv_turbo(kt))
    kv_store_block(k[src], kt, static_cast<uint8_t*>(kc) + static_cast<size_t>(cell) * kv_bytes(kt, kv_dim) + kv_bytes(kt, b0));
  if (!kv_turbo(vt))
    kv_store_block(v[src], vt, static_cast<uint8_t*>(vc) + static_cast<size_t>(cell) * kv_bytes(vt, kv_dim) + kv_bytes(vt, b0));
}

/// Row t of k and v into cell positions[t] of one cache.
extern "C" __global__ void kv_store(const float* k, const float* v, int kv_dim, void* kc, void* vc,
                                    const int* positions, int cells, int ring, int kt, int vt) {
  pdl_begin();
  store_kv_value(k, v, kv_dim, kc, vc, positions, cells, ring, kt, vt);
}

#include "kv_shift.cuh"
#include "attend_heads.cuh"

// ---- element-wise ----------------------------------------------------------------------------

/// ggml_gelu_f32 as lib/cpu/act.zig's geluTanh (its f16 table entry, rounded through f16).
__device__ __forceinline__ float gelu_f16_table(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  const float h = round_f16(x);
  const float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
  const float coef_a = 0.044715f;
  const float inner = sqrt_2_over_pi * h * __fmaf_rn(coef_a * h, h, 1.0f);
  return round_f16(0.5f * h * (1.0f + tanhf(inner)));
}

extern "C" __global__ void gelu_mul(const float* gate, const float* up, int n, float* out) {
  pdl_begin();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = gelu_f16_table(gate[i]) * up[i];
}

extern "C" __global__ void silu_mul(const float* gate, const float* up, int n, float* out) {
  pdl_begin();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float g = gate[i];
    out[i] = (g / (1.0f + expf(-g))) * up[i];
  }
}

extern "C" __global__ void add(const float* a, const float* b, int n, float* out) {
  pdl_begin();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

extern "C" __global__ void scale(float* x, int n, float s) {
  pdl_begin();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}

extern "C" __global__ void add_row_bias(float* x, const float* bias, int n, int n_cols) {
  pdl_begin();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += bias[i % n_cols];
}

/// gelu_mul / silu_mul, then the product quantized (mode 0: one warp per 32 values; mode 1: a
/// block of 256 threads per 256). n_groups units or superblocks of contiguous values.
template <int SILU>
__device__ __forceinline__ float gated_act(float g, float u) {
  if (SILU) return (g / (1.0f + expf(-g))) * u;
  return gelu_f16_table(g) * u;
}

template <int SILU>
__device__ __forceinline__ void act_mul_q(const float* gate, const float* up, int n_groups, float* out, int mode,
                                          int8_t* q, float* d) {
  if (mode == 0) {
    const int group = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (group >= n_groups) return;
    const size_t i = static_cast<size_t>(group) * 32 + lane;
    const float v = gated_act<SILU>(gate[i], up[i]);
    out[i] = v;
    quant_unit_q8_0(v, q + static_cast<size_t>(group) * 32, d + group);
  } else {
    // A block of 256 threads per superblock (the host's grid: n_groups blocks).
    const size_t base = static_cast<size_t>(blockIdx.x) * 256;
    const size_t i = base + threadIdx.x;
    const float v = gated_act<SILU>(gate[i], up[i]);
    out[i] = v;
    quant_block_q8_k(v, q + base, d + static_cast<size_t>(blockIdx.x) * 8);
  }
}

extern "C" __global__ void gelu_mul_q(const float* gate, const float* up, int n_groups, float* out, int mode,
                                      int8_t* q, float* d) {
  pdl_begin();
  act_mul_q<0>(gate, up, n_groups, out, mode, q, d);
}

extern "C" __global__ void silu_mul_q(const float* gate, const float* up, int n_groups, float* out, int mode,
                                      int8_t* q, float* d) {
  pdl_begin();
  act_mul_q<1>(gate, up, n_groups, out, mode, q, d);
}

#include "decode.cuh"
#include "attend_decode.cuh"
#include "attend_warps.cuh"
#include "attend_prompt.cuh"
#include "attend_decode_mma.cuh"
#include "moe.cuh"
