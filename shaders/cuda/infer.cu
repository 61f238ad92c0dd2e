// Every CUDA kernel of libinfer's CUDA backend (lib/cuda/), one module loaded at run time with
// cuModuleLoadData. Built by shaders/cuda/build.sh; kernel names are extern "C" and listed in
// lib/cuda/kernels.zig. Activations are f32 row-major [rows][cols]; the KV cache is f16
// [cell][kv_head][head_dim]; positions are i32 per row and are read on the device, so that one
// captured decode step (a CUDA graph) replays at any position.
//
// Arithmetic follows the CPU backend (lib/cpu/*.zig) operation for operation where that is cheap,
// so that logits agree to rounding: activations are quantized exactly as the CPU's vec_dot_type
// (integer dots per block), RMSNorm sums squares in f64, RoPE builds its angles with the same f32
// recurrence, and GELU rounds through f16 as ggml's table does. Attention rounds the query to
// f16; the one-pass kernels that run by default (attend_decode.cuh for decode and small batches,
// attend_prompt.cuh for prompts of head_dim 64/128) use a running maximum, so their probabilities
// differ from the CPU's by rounding; the per-head kernels below (attn_scores/attn_values and their
// MMA forms, INFER_CUDA_ATTN=heads and the shapes the others do not take) follow the CPU's three
// steps (f16 probabilities after the global max and sum, ggml's expf, the sum in f64).
#include "common.cuh"
#include "quant.cuh"

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
GET_ROWS(get_rows_q4_k, get_rows_q, Q4_K)
GET_ROWS(get_rows_q5_k, get_rows_q, Q5_K)
GET_ROWS(get_rows_q6_k, get_rows_q, Q6_K)
GET_ROWS(get_rows_f32, get_rows_f, F32W)
GET_ROWS(get_rows_f16, get_rows_f, F16W)
GET_ROWS(get_rows_bf16, get_rows_f, BF16W)

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

/// Q8_K as lib/quant/q8_k.zig's quantize: per 256 values, max = the first value of largest
/// magnitude, iscale = -127/max, q = min(round_half_even(x * iscale), 127), d = 1/iscale (f32).
/// The calling warp holds one superblock, values lane*8 .. lane*8+7 in v; d is written per 32.
__device__ __forceinline__ void quant_super_q8_k(const float* v, int8_t* q, float* d) {
  const int lane = threadIdx.x & 31;
  float best = -1.0f, best_v = 0.0f;
  int best_i = 0;
#pragma unroll
  for (int k = 0; k < 8; k++) {
    if (fabsf(v[k]) > best) {
      best = fabsf(v[k]);
      best_v = v[k];
      best_i = lane * 8 + k;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(FULL_MASK, best, o);
    const float ov = __shfl_xor_sync(FULL_MASK, best_v, o);
    const int oi = __shfl_xor_sync(FULL_MASK, best_i, o);
    if (ob > best || (ob == best && oi < best_i)) {
      best = ob;
      best_v = ov;
      best_i = oi;
    }
  }
  if (best == 0.0f) {
#pragma unroll
    for (int k = 0; k < 8; k++) q[lane * 8 + k] = 0;
    if (lane < 8) d[lane] = 0.0f;
    return;
  }
  const float iscale = -127.0f / best_v;
#pragma unroll
  for (int k = 0; k < 8; k++) q[lane * 8 + k] = static_cast<int8_t>(min(__float2int_rn(v[k] * iscale), 127));
  if (lane < 8) d[lane] = 1.0f / iscale;
}

/// One warp per unit; x is n_units*32 contiguous values.
extern "C" __global__ void quantize_q8_0(const float* x, int n_units, int8_t* q, float* d) {
  pdl_begin();
  const int unit = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (unit >= n_units) return;
  const size_t base = static_cast<size_t>(unit) * 32;
  quant_unit_q8_0(x[base + (threadIdx.x & 31)], q + base, d + unit);
}

/// One warp per superblock of 256 values.
extern "C" __global__ void quantize_q8_k(const float* x, int n_super, int8_t* q, float* d) {
  pdl_begin();
  const int sb = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (sb >= n_super) return;
  const float* xs = x + static_cast<size_t>(sb) * 256;
  float v[8];
#pragma unroll
  for (int k = 0; k < 8; k++) v[k] = xs[lane * 8 + k];
  quant_super_q8_k(v, q + static_cast<size_t>(sb) * 256, d + static_cast<size_t>(sb) * 8);
}

// ---- matrix × vector(s) ------------------------------------------------------------------------
// y[t][o] = W[o] · x[t]. One warp per output row, 4 rows per block of 128 threads; each lane takes
// 32-value units lane, lane+32, ...; NT tokens share each weight load (NT = 8 for prefill).

template <class T, int NT>
__device__ __forceinline__ void matvec_q(const uint8_t* __restrict__ w, int n_out, int n_in,
                                         const int8_t* __restrict__ xq, const float* __restrict__ xd, int n_tok,
                                         float* __restrict__ y, int row_block) {
  const int lane = threadIdx.x & 31;
  const int row = row_block * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= n_out) return;
  const int t0 = blockIdx.y * NT;
  const int units = n_in >> 5;
  const size_t row_bytes = static_cast<size_t>(n_in / T::BV) * T::BB;
  const uint8_t* wr = w + static_cast<size_t>(row) * row_bytes;
  float acc[NT], accm[NT];
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t] = accm[t] = 0.0f;
#pragma unroll 2
  for (int u = lane; u < units; u += 32) {
    typename T::W wt;
    T::load(wr, u, wt);
#pragma unroll
    for (int t = 0; t < NT; t++) {
      if (NT == 1 || t0 + t < n_tok) {
        const int4* xp = reinterpret_cast<const int4*>(xq + static_cast<size_t>(t0 + t) * n_in + 32 * u);
        const int4 a = xp[0], b = xp[1];
        const int x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        T::dot(wt, x, xd[static_cast<size_t>(t0 + t) * units + u], acc[t], accm[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; t++) {
    const float s = warp_sum(acc[t]) - warp_sum(accm[t]);
    if (lane == 0 && (NT == 1 || t0 + t < n_tok)) y[static_cast<size_t>(t0 + t) * n_out + row] = s;
  }
}

/// Pulls the weight row of this warp into L2 before the kernel waits for the kernel ahead of it
/// (pdl_begin): weights never depend on it, so their DRAM latency overlaps that kernel's tail
/// instead of following it. 128-byte lines, any block layout.
template <class T>
__device__ __forceinline__ void matvec_prefetch(const uint8_t* w, int n_out, int n_in, int row_block) {
  const int row = row_block * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= n_out) return;
  const size_t row_bytes = static_cast<size_t>(n_in / T::BV) * T::BB;
  const uint8_t* wr = w + static_cast<size_t>(row) * row_bytes;
  for (size_t off = (threadIdx.x & 31) * 128; off < row_bytes; off += 32 * 128) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(wr + off));
  }
}

template <class T, int NT>
__device__ __forceinline__ void matvec_f(const uint8_t* __restrict__ w, int n_out, int n_in,
                                         const float* __restrict__ x, int n_tok, float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= n_out) return;
  const int t0 = blockIdx.y * NT;
  const size_t base = static_cast<size_t>(row) * n_in;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t] = 0.0f;
  for (int i = lane; i < n_in; i += 32) {
    const float wv = T::at(w, base + i);
#pragma unroll
    for (int t = 0; t < NT; t++) {
      if (NT == 1 || t0 + t < n_tok) {
        acc[t] = __fmaf_rn(wv, T::act(x[static_cast<size_t>(t0 + t) * n_in + i]), acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; t++) {
    const float s = warp_sum(acc[t]);
    if (lane == 0 && (NT == 1 || t0 + t < n_tok)) y[static_cast<size_t>(t0 + t) * n_out + row] = s;
  }
}

#define MATVEC_Q(NAME, T, NT)                                                                              \
  extern "C" __global__ void __launch_bounds__(128) NAME(const uint8_t* w, int n_out, int n_in, const int8_t* xq, \
                                                         const float* xd, int n_tok, float* y) { \
    matvec_prefetch<T>(w, n_out, n_in, blockIdx.x);                                                      \
    pdl_begin();                                                                                          \
    matvec_q<T, NT>(w, n_out, n_in, xq, xd, n_tok, y, blockIdx.x);                                          \
  }
#define MATVEC_F(NAME, T, NT)                                                                           \
  extern "C" __global__ void __launch_bounds__(128) NAME(const uint8_t* w, int n_out, int n_in, const float* x, \
                                                         int n_tok, float* y) { pdl_begin(); \
    matvec_f<T, NT>(w, n_out, n_in, x, n_tok, y);                                                        \
  }
MATVEC_Q(matvec_q4_0_1, Q4_0, 1)
MATVEC_Q(matvec_q4_0_8, Q4_0, 8)
MATVEC_Q(matvec_q5_0_1, Q5_0, 1)
MATVEC_Q(matvec_q5_0_8, Q5_0, 8)
MATVEC_Q(matvec_q8_0_1, Q8_0, 1)
MATVEC_Q(matvec_q8_0_8, Q8_0, 8)
MATVEC_Q(matvec_q4_k_1, Q4_K, 1)
MATVEC_Q(matvec_q4_k_8, Q4_K, 8)
MATVEC_Q(matvec_q5_k_1, Q5_K, 1)
MATVEC_Q(matvec_q5_k_8, Q5_K, 8)
MATVEC_Q(matvec_q6_k_1, Q6_K, 1)
MATVEC_Q(matvec_q6_k_8, Q6_K, 8)
MATVEC_F(matvec_f32_1, F32W, 1)
MATVEC_F(matvec_f32_8, F32W, 8)
MATVEC_F(matvec_f16_1, F16W, 1)
MATVEC_F(matvec_f16_8, F16W, 8)
MATVEC_F(matvec_bf16_1, BF16W, 1)
MATVEC_F(matvec_bf16_8, BF16W, 8)

// ---- quantized matmul on the tensor cores, for prompts -------------------------------------------
// y[t][o] = W[o] · x[t] for many tokens. A block of 4 warps computes 32 weight rows × 64 tokens;
// weights and activations are staged in shared memory 8 units (256 values) at a time, each unit's
// quants as 8 words. Warp w owns tokens 16w..16w+15: per unit, mma.sync m16n8k16 (s8 × s8 → s32)
// gives the exact integer dot of each 16-value half for 16 tokens × 8 rows, four times over the
// 32 rows, and T::combine folds them into the output's FMA chain with the unit's scales, unit
// after unit. Every weight byte is read from memory once per 64 tokens (matvec_8: once per 8).
// Tiles: ROWS weight rows × TOKS tokens a block (TOKS / 16 warps, each 16 tokens × all ROWS
// rows), UNITS units staged at a time: mmq_* 32 × 64 × 8 for batches, mmq_*_64x128 (64 × 128 × 4,
// every weight byte read half as often and every activation byte half as often) for prompts of
// 256 tokens and more (lib/cuda/cuda.zig mmq_tiles: +12–26% on a 2,048-token prompt of the 8B
// shape; at 32 tokens the larger tile leaves most of the GPU idle and runs at half the speed).
__device__ __forceinline__ void mma_s8_16816(int (&c)[4], int a0, int a1, int b0) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

template <class T, int ROWS, int TOKS, int UNITS>
__device__ __forceinline__ void mmq(const uint8_t* __restrict__ w, int n_out, int n_in, const int8_t* __restrict__ xq,
                                    const float* __restrict__ xd, int n_tok, float* __restrict__ y) {
  constexpr int STRIDE = UNITS * 8 + 4;  // words per staged row; the 4 spread 8 rows over all 32 banks
  constexpr int J = ROWS / 8;            // 8-row MMA tiles per warp
  constexpr int THREADS = TOKS * 2;
  __shared__ int w_words[ROWS * STRIDE];
  __shared__ typename T::P w_params[ROWS * UNITS];
  __shared__ int x_words[TOKS * STRIDE];
  __shared__ float x_scales[TOKS * UNITS];
  __shared__ int2 x_sums[TOKS * UNITS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = lane >> 2, tig = lane & 3;  // the MMA fragment coordinates of this lane
  const int row0 = blockIdx.x * ROWS, tok0 = blockIdx.y * TOKS;
  const int units = n_in >> 5;
  const size_t row_bytes = static_cast<size_t>(n_in / T::BV) * T::BB;
  float acc[J][4], accm[J][4];
#pragma unroll
  for (int j = 0; j < J; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[j][e] = accm[j][e] = 0.0f;

  // Staging: every thread's loads of a step issued together (unrolled, then stored), so that a
  // step waits for one memory round trip rather than one per (row, unit) pair in turn.
  constexpr int WP = ROWS * UNITS / THREADS, XP = TOKS * UNITS / THREADS;
  static_assert(WP * THREADS == ROWS * UNITS && XP * THREADS == TOKS * UNITS, "staging pairs per thread");
  for (int u0 = 0; u0 < units; u0 += UNITS) {
    const int n_units = min(UNITS, units - u0);
    typename T::W wts[WP];
    int4 xa[XP], xb[XP];
    float xds[XP];
#pragma unroll
    for (int k = 0; k < WP; k++) {
      const int i = tid + k * THREADS, r = i / UNITS, uu = i % UNITS;
      wts[k] = {};
      if (row0 + r < n_out && uu < n_units) T::load(w + static_cast<size_t>(row0 + r) * row_bytes, u0 + uu, wts[k]);
    }
#pragma unroll
    for (int k = 0; k < XP; k++) {
      const int i = tid + k * THREADS, t = i / UNITS, uu = i % UNITS;
      xa[k] = xb[k] = make_int4(0, 0, 0, 0);
      xds[k] = 0.0f;
      if (tok0 + t < n_tok && uu < n_units) {
        const int4* p = reinterpret_cast<const int4*>(xq + static_cast<size_t>(tok0 + t) * n_in + 32 * (u0 + uu));
        xa[k] = p[0];
        xb[k] = p[1];
        xds[k] = xd[static_cast<size_t>(tok0 + t) * units + u0 + uu];
      }
    }
#pragma unroll
    for (int k = 0; k < WP; k++) {
      const int i = tid + k * THREADS, r = i / UNITS, uu = i % UNITS;
#pragma unroll
      for (int e = 0; e < 8; e++) w_words[r * STRIDE + uu * 8 + e] = T::mma_word(wts[k].v[e]);
      w_params[i] = T::params(wts[k]);
    }
#pragma unroll
    for (int k = 0; k < XP; k++) {
      const int i = tid + k * THREADS, t = i / UNITS, uu = i % UNITS;
      const int4 a = xa[k], b = xb[k];
      const float d = xds[k];
      int* dst = x_words + t * STRIDE + uu * 8;
      dst[0] = a.x; dst[1] = a.y; dst[2] = a.z; dst[3] = a.w;
      dst[4] = b.x; dst[5] = b.y; dst[6] = b.z; dst[7] = b.w;
      x_scales[i] = d;
      const int lo = dp4a(0x01010101, a.w, dp4a(0x01010101, a.z, dp4a(0x01010101, a.y, dp4a(0x01010101, a.x, 0))));
      const int hi = dp4a(0x01010101, b.w, dp4a(0x01010101, b.z, dp4a(0x01010101, b.y, dp4a(0x01010101, b.x, 0))));
      x_sums[i] = make_int2(lo, hi);
    }
    __syncthreads();
    const int t_a = warp * 16 + group;  // this lane's tokens: t_a and t_a + 8
    for (int uu = 0; uu < n_units; uu++) {
      const int* xa = x_words + t_a * STRIDE + uu * 8 + tig;
      const int* xb = xa + 8 * STRIDE;
      const int a_lo0 = xa[0], a_lo1 = xb[0], a_hi0 = xa[4], a_hi1 = xb[4];
      const float dx[2] = {x_scales[t_a * UNITS + uu], x_scales[(t_a + 8) * UNITS + uu]};
      const int2 sx[2] = {x_sums[t_a * UNITS + uu], x_sums[(t_a + 8) * UNITS + uu]};
#pragma unroll
      for (int j = 0; j < J; j++) {
        const int* wb = w_words + (8 * j + group) * STRIDE + uu * 8 + tig;
        int c_lo[4], c_hi[4];
        mma_s8_16816(c_lo, a_lo0, a_lo1, wb[0]);
        mma_s8_16816(c_hi, a_hi0, a_hi1, wb[4]);
        // c[0], c[1]: token t_a, rows 8j + 2 tig + 0/1; c[2], c[3]: token t_a + 8.
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = 8 * j + 2 * tig + (e & 1), h = e >> 1;
          T::combine(w_params[r * UNITS + uu], c_lo[e], c_hi[e], sx[h].x, sx[h].y, dx[h], acc[j][e], accm[j][e]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < J; j++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int t = tok0 + warp * 16 + group + 8 * (e >> 1), r = row0 + 8 * j + 2 * tig + (e & 1);
      if (t < n_tok && r < n_out) y[static_cast<size_t>(t) * n_out + r] = acc[j][e] - accm[j][e];
    }
  }
}

#define MMQ(NAME, T, ROWS, TOKS, UNITS)                                                                      \
  extern "C" __global__ void __launch_bounds__(TOKS * 2) NAME(const uint8_t* w, int n_out, int n_in,           \
                                                              const int8_t* xq, const float* xd, int n_tok, \
                                                              float* y) {                                  \
    pdl_begin();                                                                                           \
    mmq<T, ROWS, TOKS, UNITS>(w, n_out, n_in, xq, xd, n_tok, y);                                           \
  }
#define MMQ_TYPES(SUFFIX, ROWS, TOKS, UNITS)          \
  MMQ(mmq_q4_0##SUFFIX, Q4_0, ROWS, TOKS, UNITS)      \
  MMQ(mmq_q5_0##SUFFIX, Q5_0, ROWS, TOKS, UNITS)      \
  MMQ(mmq_q8_0##SUFFIX, Q8_0, ROWS, TOKS, UNITS)      \
  MMQ(mmq_q4_k##SUFFIX, Q4_K, ROWS, TOKS, UNITS)      \
  MMQ(mmq_q5_k##SUFFIX, Q5_K, ROWS, TOKS, UNITS)      \
  MMQ(mmq_q6_k##SUFFIX, Q6_K, ROWS, TOKS, UNITS)
MMQ_TYPES(, 32, 64, 8)
MMQ_TYPES(_64x128, 64, 128, 4)

// Up to three matrices with the same type, input and one token (q/k/v, gate/up) in one launch:
// row blocks [0, b0) go to matrix 0, the next b1 to matrix 1, the rest to matrix 2. Each row is
// computed exactly as matvec_*_1 computes it.
template <class T>
__device__ __forceinline__ void matvec_multi(const uint8_t* w0, int n0, float* y0, const uint8_t* w1, int n1,
                                             float* y1, const uint8_t* w2, int n2, float* y2, int n_in,
                                             const int8_t* xq, const float* xd) {
  const int rows_per_block = blockDim.x >> 5;
  const int b0 = (n0 + rows_per_block - 1) / rows_per_block, b1 = (n1 + rows_per_block - 1) / rows_per_block;
  const int rb = blockIdx.x;
  if (rb < b0) matvec_prefetch<T>(w0, n0, n_in, rb);
  else if (rb < b0 + b1) matvec_prefetch<T>(w1, n1, n_in, rb - b0);
  else matvec_prefetch<T>(w2, n2, n_in, rb - b0 - b1);
  pdl_begin();
  if (rb < b0) matvec_q<T, 1>(w0, n0, n_in, xq, xd, 1, y0, rb);
  else if (rb < b0 + b1) matvec_q<T, 1>(w1, n1, n_in, xq, xd, 1, y1, rb - b0);
  else matvec_q<T, 1>(w2, n2, n_in, xq, xd, 1, y2, rb - b0 - b1);
}

#define MATVEC_MULTI(NAME, T)                                                                                   \
  extern "C" __global__ void __launch_bounds__(128)                                                            \
      NAME(const uint8_t* w0, int n0, float* y0, const uint8_t* w1, int n1, float* y1, const uint8_t* w2, int n2, \
           float* y2, int n_in, const int8_t* xq, const float* xd) { \
    matvec_multi<T>(w0, n0, y0, w1, n1, y1, w2, n2, y2, n_in, xq, xd);                                         \
  }
MATVEC_MULTI(matvec_multi_q4_0, Q4_0)
MATVEC_MULTI(matvec_multi_q5_0, Q5_0)
MATVEC_MULTI(matvec_multi_q8_0, Q8_0)
MATVEC_MULTI(matvec_multi_q4_k, Q4_K)
MATVEC_MULTI(matvec_multi_q5_k, Q5_K)
MATVEC_MULTI(matvec_multi_q6_k, Q6_K)

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
        const int i = sb * 256 + lane * 8 + k;
        v[k] = f(i);
        out[base + i] = v[k];
      }
      quant_super_q8_k(v, q + base + sb * 256, d + base / 32 + sb * 8);
    }
  }
}

/// rms_norm, then the result quantized for the matmuls that read it (rms_norm + quantize_*).
/// The row and the weights are staged in shared memory (2 * n_cols floats) by the first pass, so
/// the quantizing pass waits on no global load.
extern "C" __global__ void rms_norm_q(const float* x, const float* w, int n_cols, float eps, float* out, int mode,
                                      int8_t* q, float* d) {
  pdl_begin();
  extern __shared__ float row[];
  float* wrow = row + n_cols;
  const size_t base = static_cast<size_t>(blockIdx.x) * n_cols;
  double s = 0.0;
  for (int i = threadIdx.x; i < n_cols; i += blockDim.x) {
    const float v = x[base + i];
    row[i] = v;
    if (w) wrow[i] = w[i];
    s += static_cast<double>(v * v);
  }
  s = block_sum_d(s);  // as rms_scale, term for term; its barriers also publish row[] and wrow[]
  const float mean = static_cast<float>(s / static_cast<double>(n_cols));
  const float scale = 1.0f / sqrtf(mean + eps);
  store_quantized_row([&](int i) { const float v = row[i] * scale; return w ? v * wrow[i] : v; }, base, n_cols, out,
                      mode, q, d);
}

/// sum = a + b (may alias a), then rms_norm(sum) quantized: add + rms_norm + quantize_*.
/// Dynamic shared memory: 2 * n_cols floats (the sums, the weights).
extern "C" __global__ void add_rms_norm_q(const float* a, const float* b, float* sum, const float* w, int n_cols,
                                          float eps, float* out, int mode, int8_t* q, float* d) {
  pdl_begin();
  extern __shared__ float row[];
  float* wrow = row + n_cols;
  const size_t base = static_cast<size_t>(blockIdx.x) * n_cols;
  double s = 0.0;
  for (int i = threadIdx.x; i < n_cols; i += blockDim.x) {
    const float v = a[base + i] + b[base + i];
    row[i] = v;
    if (w) wrow[i] = w[i];
    sum[base + i] = v;
    s += static_cast<double>(v * v);
  }
  s = block_sum_d(s);
  const float mean = static_cast<float>(s / static_cast<double>(n_cols));
  const float scale = 1.0f / sqrtf(mean + eps);
  store_quantized_row([&](int i) { const float v = row[i] * scale; return w ? v * wrow[i] : v; }, base, n_cols, out,
                      mode, q, d);
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
// (float)pos and is multiplied by theta_scale once per pair; angle = freq_scale * (theta / ff).

__device__ __forceinline__ void rope_pair_i(float* head, int i, int pos, int n_rot, float theta_scale,
                                            float freq_scale, int neox, const float* ff) {
  const int half = n_rot >> 1;
  float theta = static_cast<float>(pos);
  for (int k = 0; k < i; k++) theta *= theta_scale;
  const float angle = freq_scale * (theta / (ff ? ff[i] : 1.0f));
  const float c = cosf(angle), s = sinf(angle);
  const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
  const float a = head[ia], b = head[ib];
  head[ia] = __fmaf_rn(a, c, -__fmul_rn(b, s));
  head[ib] = __fmaf_rn(a, s, __fmul_rn(b, c));
}

__device__ __forceinline__ void rope_pair(float* head, int pos, int n_rot, float theta_scale, float freq_scale,
                                          int neox, const float* ff) {
  if (static_cast<int>(threadIdx.x) < (n_rot >> 1))
    rope_pair_i(head, threadIdx.x, pos, n_rot, theta_scale, freq_scale, neox, ff);
}

extern "C" __global__ void rope(float* x, int n_heads, int head_dim, int n_rot, const int* positions,
                                float theta_scale, float freq_scale, int neox, const float* ff) {
  pdl_begin();
  const int t = blockIdx.x / n_heads;
  rope_pair(x + static_cast<size_t>(blockIdx.x) * head_dim, positions[t], n_rot, theta_scale, freq_scale, neox, ff);
}

/// The queries' and the keys' RoPE in one launch (same positions and parameters).
extern "C" __global__ void rope2(float* xa, int heads_a, float* xb, int heads_b, int head_dim, int n_rot,
                                 const int* positions, float theta_scale, float freq_scale, int neox, const float* ff) {
  pdl_begin();
  const int per_token = heads_a + heads_b;
  const int t = blockIdx.x / per_token, h = blockIdx.x % per_token;
  float* head = h < heads_a ? xa + (static_cast<size_t>(t) * heads_a + h) * head_dim
                            : xb + (static_cast<size_t>(t) * heads_b + (h - heads_a)) * head_dim;
  rope_pair(head, positions[t], n_rot, theta_scale, freq_scale, neox, ff);
}

// ---- KV cache ----------------------------------------------------------------------------------

/// Row t of k and v (kv_dim values each) into cell positions[t] (mod cells for a ring), as f16.
extern "C" __global__ void kv_store(const float* k, const float* v, int kv_dim, __half* kc, __half* vc,
                                    const int* positions, int cells, int ring) {
  pdl_begin();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= kv_dim) return;
  const int t = blockIdx.y;
  const int pos = positions[t];
  const int cell = ring ? pos % cells : pos;
  if (cell < 0 || cell >= cells) return;
  const size_t src = static_cast<size_t>(t) * kv_dim + i, dst = static_cast<size_t>(cell) * kv_dim + i;
  kc[dst] = __float2half_rn(k[src]);
  vc[dst] = __float2half_rn(v[src]);
}

// ---- attention ---------------------------------------------------------------------------------
// Two launches, each over (query row = token * n_head + head, split of the visible keys):
//   attn_scores   s_j = scale * (f16(q) · K_j) for the split's keys into scores[row][j - begin],
//                 and the split's max
//   attn_values   M = max of the splits' maxima, S = Σ_j ggml_expf(s_j - M) over all visible keys
//                 (f64), p_j = f16(ggml_expf(s_j - M) * (float)(1/S)); the split's Σ p_j V_j;
//                 with n_split > 1 the row's last split to finish sums the splits in order
// which is lib/cpu/attention_f16.zig's arithmetic (llama.cpp's CPU graph) in another summation
// order. A query at position p sees keys max(0, p + 1 - window) .. p (all of them: window 0).

struct AttnRow {
  int row, t, h, kvh, begin, len, s0, s1;
};

__device__ __forceinline__ AttnRow attn_row(const int* positions, int n_head, int n_kv_head, int window,
                                            int n_split) {
  AttnRow r;
  r.row = blockIdx.x;
  r.t = r.row / n_head;
  r.h = r.row % n_head;
  r.kvh = r.h / (n_head / n_kv_head);
  const int p = positions[r.t];
  r.begin = (window > 0 && p + 1 > window) ? p + 1 - window : 0;
  r.len = p + 1 - r.begin;
  const int chunk = (r.len + n_split - 1) / n_split;
  r.s0 = min(r.len, static_cast<int>(blockIdx.y) * chunk);
  r.s1 = min(r.len, r.s0 + chunk);
  return r;
}

__device__ __forceinline__ int attn_cell(int j, int cells, int ring) { return ring ? j % cells : j; }

constexpr int ATTN_THREADS = 128;
constexpr int HEAD_DIM_MAX = 512;
constexpr int ATTN_TILE = 256;

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
    attn_scores(const float* q, const __half* kc, const int* positions, int n_head, int n_kv_head, int head_dim,
                int window, int cells, int ring, float scale, float* scores, int score_stride, float* split_max,
                int n_split) {
  pdl_begin();
  __shared__ float qs[HEAD_DIM_MAX];
  const AttnRow r = attn_row(positions, n_head, n_kv_head, window, n_split);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    qs[d] = round_f16(q[static_cast<size_t>(r.row) * head_dim + d]);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int kv_dim = n_kv_head * head_dim;
  float m = -INFINITY;
  // Unrolled so that several keys' loads are in flight at once (each key's sum keeps its order).
#pragma unroll 4
  for (int jj = r.s0 + warp; jj < r.s1; jj += warps) {
    const __half* kr = kc + static_cast<size_t>(attn_cell(r.begin + jj, cells, ring)) * kv_dim + r.kvh * head_dim;
    float s = 0.0f;
#pragma unroll 4
    for (int d = lane; d < head_dim; d += 32) s = __fmaf_rn(__half2float(kr[d]), qs[d], s);
    s = warp_sum(s) * scale;
    if (lane == 0) scores[static_cast<size_t>(r.row) * score_stride + jj] = s;
    m = fmaxf(m, s);
  }
  m = block_max(m);
  if (threadIdx.x == 0) split_max[static_cast<size_t>(r.row) * n_split + blockIdx.y] = m;
}

/// The sum over a split's keys of p_j V_j into dst (attn_values' body). Thread layout: head_dim
/// <= 128: G groups of head_dim threads, group g takes keys i ≡ g (mod G); head_dim > 128: one
/// group, each thread takes dims tid, tid + 128, ... (at most 4).
__device__ __forceinline__ void attn_values_split(const AttnRow& r, const float* scores, int score_stride,
                                                  const float* split_max, const __half* vc, int n_kv_head,
                                                  int head_dim, int cells, int ring, int n_split, float* dst) {
  __shared__ float ps[ATTN_TILE];
  __shared__ float red[ATTN_THREADS * 4];
  const int G = head_dim <= ATTN_THREADS ? ATTN_THREADS / head_dim : 1;
  const int g = head_dim <= ATTN_THREADS ? threadIdx.x / head_dim : 0;
  const int d0 = head_dim <= ATTN_THREADS ? threadIdx.x % head_dim : threadIdx.x;
  float M = -INFINITY;
#pragma unroll 8
  for (int s = 0; s < n_split; s++) M = fmaxf(M, split_max[static_cast<size_t>(r.row) * n_split + s]);
  const float* sr = scores + static_cast<size_t>(r.row) * score_stride;
  double sum = 0.0;
  for (int jj = threadIdx.x; jj < r.len; jj += blockDim.x) sum += static_cast<double>(ggml_expf(sr[jj] - M));
  sum = block_sum_d(sum);
  const float inv = static_cast<float>(1.0 / sum);
  const int kv_dim = n_kv_head * head_dim;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int tile = r.s0; tile < r.s1; tile += ATTN_TILE) {
    const int tn = min(ATTN_TILE, r.s1 - tile);
    __syncthreads();  // the previous tile's ps is no longer read
    for (int i = threadIdx.x; i < tn; i += blockDim.x) ps[i] = round_f16(__fmul_rn(ggml_expf(sr[tile + i] - M), inv));
    __syncthreads();
    if (g < G) {
      // Unrolled: the loads of several V rows in flight at once, summed in key order as before.
#pragma unroll 8
      for (int i = g; i < tn; i += G) {
        const __half* vr =
            vc + static_cast<size_t>(attn_cell(r.begin + tile + i, cells, ring)) * kv_dim + r.kvh * head_dim;
        const float p = ps[i];
#pragma unroll
        for (int k = 0; k < 4; k++) {
          const int d = d0 + k * ATTN_THREADS;
          if ((head_dim > ATTN_THREADS || k == 0) && d < head_dim) acc[k] = __fmaf_rn(p, __half2float(vr[d]), acc[k]);
        }
      }
    }
  }
  if (G > 1) {
    __syncthreads();
    if (g < G) red[threadIdx.x] = acc[0];
    __syncthreads();
    if (g == 0) {
      float s = 0.0f;
      for (int k = 0; k < G; k++) s += red[k * head_dim + d0];
      dst[d0] = s;
    }
  } else if (g == 0) {  // head_dim not dividing 128 leaves threads with g == 1 idle
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int d = d0 + k * ATTN_THREADS;
      if ((head_dim > ATTN_THREADS || k == 0) && d < head_dim) dst[d] = acc[k];
    }
  }
}

/// The split that finishes a row last sums the row's partial outputs, in split order (what a
/// separate combine launch did): each block counts itself in arrived[row] after its partial is
/// visible device-wide; the last one reads them from L2 and leaves the counter zero again.
__device__ __forceinline__ void attn_combine_last(int row, int n_split, int head_dim, const float* partial,
                                                  float* out, unsigned int* arrived) {
  __shared__ bool last;
  __threadfence();  // this thread's partial values before the count
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(arrived + row, 1u) == static_cast<unsigned int>(n_split - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float s = 0.0f;
    // The splits' loads in flight together; still summed in split order.
#pragma unroll 8
    for (int k = 0; k < n_split; k++) s += __ldcg(partial + (static_cast<size_t>(row) * n_split + k) * head_dim + d);
    out[static_cast<size_t>(row) * head_dim + d] = s;
  }
  if (threadIdx.x == 0) arrived[row] = 0;
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
    attn_values(const float* scores, int score_stride, const float* split_max, const __half* vc,
                const int* positions, int n_head, int n_kv_head, int head_dim, int window, int cells, int ring,
                int n_split, float* out, float* partial, unsigned int* arrived) {
  pdl_begin();
  const AttnRow r = attn_row(positions, n_head, n_kv_head, window, n_split);
  float* dst = n_split == 1 ? out + static_cast<size_t>(r.row) * head_dim
                            : partial + (static_cast<size_t>(r.row) * n_split + blockIdx.y) * head_dim;
  if (r.s0 >= r.s1) {  // an empty split (short context): contributes zeros
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) dst[d] = 0.0f;
  } else {
    attn_values_split(r, scores, score_stride, split_max, vc, n_kv_head, head_dim, cells, ring, n_split, dst);
  }
  if (n_split > 1) attn_combine_last(r.row, n_split, head_dim, partial, out, arrived);
}

// Prompts (16+ rows, one split, head_dim a multiple of 16 up to 256): the same three steps'
// arithmetic per query (q and p rounded to f16, ggml's expf, the sum of exponentials in f64), the
// two products on the tensor cores, which take exactly those f16 operands: mma.sync m16n8k16
// (f16 × f16 → f32). A block takes 16 queries of one head, so K and V are read once per 16
// queries. attn_scores_mma: each warp takes 8 keys at a time, S(16 × 8) = Q(16 × d) · Kᵀ, the
// query fragments held in registers; attn_values_mma: 64 keys at a time, the f16 probabilities
// and the V rows staged in shared memory, out(16 × d) += P(16 × 16) · V(16 × d) per 16 keys, the
// warps splitting the dimensions.
constexpr int ATTN_QT = 16;
constexpr int ATTN_MMA_DIM_MAX = 256;
constexpr int ATTN_VALUES_KEYS = 64;  // keys staged per step of attn_values_mma

/// The visible keys of query t: [begin, begin + len) of positions.
__device__ __forceinline__ void attn_range(const int* positions, int t, int window, int& begin, int& len) {
  const int p = positions[t];
  begin = (window > 0 && p + 1 > window) ? p + 1 - window : 0;
  len = p + 1 - begin;
}

__device__ __forceinline__ void mma_f16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

/// Union of the visible key ranges of queries t0 .. t0 + nq - 1.
__device__ __forceinline__ void attn_tile_range(const int* positions, int t0, int nq, int window, int& lo, int& hi) {
  lo = 0x7fffffff;
  hi = 0;
  for (int qi = 0; qi < nq; qi++) {
    int b, l;
    attn_range(positions, t0 + qi, window, b, l);
    lo = min(lo, b);
    hi = max(hi, b + l);
  }
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
    attn_scores_mma(const float* q, const __half* kc, const int* positions, int n_tok, int n_head, int n_kv_head,
                    int head_dim, int window, int cells, int ring, float scale, float* scores, int score_stride,
                    float* split_max) {
  pdl_begin();
  __shared__ float warp_max[ATTN_THREADS / 32][ATTN_QT];
  const int t0 = blockIdx.x * ATTN_QT, h = blockIdx.y, kvh = h / (n_head / n_kv_head);
  const int nq = min(ATTN_QT, n_tok - t0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, group = lane >> 2, tig = lane & 3;
  // This lane's queries (fragment rows): group and group + 8.
  const int qa = group, qb = group + 8;
  int begin_a = 0, len_a = 0, begin_b = 0, len_b = 0;
  if (qa < nq) attn_range(positions, t0 + qa, window, begin_a, len_a);
  if (qb < nq) attn_range(positions, t0 + qb, window, begin_b, len_b);
  // Query fragments for every 16-dimension step, rounded to f16 as the CPU rounds q.
  uint32_t qf[ATTN_MMA_DIM_MAX / 16][4];
  const float* q_a = q + (static_cast<size_t>(t0 + min(qa, nq - 1)) * n_head + h) * head_dim;
  const float* q_b = q + (static_cast<size_t>(t0 + min(qb, nq - 1)) * n_head + h) * head_dim;
#pragma unroll
  for (int ks = 0; ks < ATTN_MMA_DIM_MAX / 16; ks++) {
    if (16 * ks < head_dim) {
      const int d = 16 * ks + 2 * tig;
      qf[ks][0] = pack_half2(q_a[d], q_a[d + 1]);
      qf[ks][1] = pack_half2(q_b[d], q_b[d + 1]);
      qf[ks][2] = pack_half2(q_a[d + 8], q_a[d + 9]);
      qf[ks][3] = pack_half2(q_b[d + 8], q_b[d + 9]);
    }
  }
  int lo, hi;
  attn_tile_range(positions, t0, nq, window, lo, hi);
  const int kv_dim = n_kv_head * head_dim;
  float m_a = -INFINITY, m_b = -INFINITY;
  for (int j0 = lo + 8 * warp; j0 < hi; j0 += 8 * (ATTN_THREADS / 32)) {
    // B fragment: key j0 + group, dimensions 16 ks + 2 tig (+1) and + 8 (+9).
    const int jk = min(j0 + group, hi - 1);
    const __half* kr = kc + static_cast<size_t>(attn_cell(jk, cells, ring)) * kv_dim + kvh * head_dim;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < ATTN_MMA_DIM_MAX / 16; ks++) {
      if (16 * ks < head_dim) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + 16 * ks + 2 * tig);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 16 * ks + 2 * tig + 8);
        mma_f16_16816(c, qf[ks], b0, b1);
      }
    }
    // c[0], c[1]: query qa, keys j0 + 2 tig (+1); c[2], c[3]: query qb.
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int j = j0 + 2 * tig + (e & 1);
      const bool is_a = e < 2;
      const int qi = is_a ? qa : qb, b = is_a ? begin_a : begin_b, l = is_a ? len_a : len_b;
      if (qi < nq && j >= b && j < b + l) {
        const float v = c[e] * scale;
        scores[(static_cast<size_t>(t0 + qi) * n_head + h) * score_stride + (j - b)] = v;
        if (is_a) m_a = fmaxf(m_a, v);
        else m_b = fmaxf(m_b, v);
      }
    }
  }
  // The lanes of one group share their queries: reduce over tig, then over warps.
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    m_a = fmaxf(m_a, __shfl_xor_sync(FULL_MASK, m_a, o));
    m_b = fmaxf(m_b, __shfl_xor_sync(FULL_MASK, m_b, o));
  }
  if (tig == 0) {
    warp_max[warp][qa] = m_a;
    warp_max[warp][qb] = m_b;
  }
  __syncthreads();
  if (threadIdx.x < nq) {
    float m = -INFINITY;
    for (int w = 0; w < ATTN_THREADS / 32; w++) m = fmaxf(m, warp_max[w][threadIdx.x]);
    split_max[static_cast<size_t>(t0 + threadIdx.x) * n_head + h] = m;
  }
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
    attn_values_mma(const float* scores, int score_stride, const float* split_max, const __half* vc,
                    const int* positions, int n_tok, int n_head, int n_kv_head, int head_dim, int window, int cells,
                    int ring, float* out) {
  pdl_begin();
  __shared__ __half ps[ATTN_QT][ATTN_VALUES_KEYS + 8];
  __shared__ __align__(16) __half vs[ATTN_VALUES_KEYS][ATTN_MMA_DIM_MAX + 8];
  __shared__ float inv_sum[ATTN_QT], row_max[ATTN_QT];
  __shared__ int q_begin[ATTN_QT], q_len[ATTN_QT];
  const int t0 = blockIdx.x * ATTN_QT, h = blockIdx.y, kvh = h / (n_head / n_kv_head);
  const int nq = min(ATTN_QT, n_tok - t0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, group = lane >> 2, tig = lane & 3;
  for (int qi = warp; qi < ATTN_QT; qi += ATTN_THREADS / 32) {
    if (qi >= nq) {
      if (lane == 0) q_begin[qi] = q_len[qi] = 0, inv_sum[qi] = 0.0f, row_max[qi] = 0.0f;
      continue;
    }
    int b, l;
    attn_range(positions, t0 + qi, window, b, l);
    const size_t row = static_cast<size_t>(t0 + qi) * n_head + h;
    const float M = split_max[row];
    const float* sr = scores + row * score_stride;
    double sum = 0.0;
    for (int jj = lane; jj < l; jj += 32) sum += static_cast<double>(ggml_expf(sr[jj] - M));
    sum = warp_sum_d(sum);
    if (lane == 0) {
      inv_sum[qi] = static_cast<float>(1.0 / sum);
      row_max[qi] = M;
      q_begin[qi] = b;
      q_len[qi] = l;
    }
  }
  __syncthreads();
  int lo = 0x7fffffff, hi = 0;
  for (int qi = 0; qi < nq; qi++) {
    lo = min(lo, q_begin[qi]);
    hi = max(hi, q_begin[qi] + q_len[qi]);
  }
  const int kv_dim = n_kv_head * head_dim;
  const int n_tiles = head_dim / 8;  // 8-dimension output tiles, split over the warps
  float acc[ATTN_MMA_DIM_MAX / 8 / (ATTN_THREADS / 32)][4];
#pragma unroll
  for (int i = 0; i < ATTN_MMA_DIM_MAX / 8 / (ATTN_THREADS / 32); i++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[i][e] = 0.0f;
  for (int j0 = lo; j0 < hi; j0 += ATTN_VALUES_KEYS) {
    __syncthreads();  // the previous chunk read
    for (int i = tid; i < ATTN_QT * ATTN_VALUES_KEYS; i += blockDim.x) {
      const int qi = i / ATTN_VALUES_KEYS, kj = i % ATTN_VALUES_KEYS, j = j0 + kj;
      float p = 0.0f;
      if (qi < nq && j >= q_begin[qi] && j < q_begin[qi] + q_len[qi]) {
        const size_t row = static_cast<size_t>(t0 + qi) * n_head + h;
        p = __fmul_rn(ggml_expf(scores[row * score_stride + (j - q_begin[qi])] - row_max[qi]), inv_sum[qi]);
      }
      ps[qi][kj] = __float2half_rn(p);
    }
    // One V row per warp at a time, 16 bytes per lane (rows are 32-byte aligned: head_dim % 16 == 0).
    for (int kj = warp; kj < ATTN_VALUES_KEYS; kj += ATTN_THREADS / 32) {
      const int j = j0 + kj;
      const uint4* src = reinterpret_cast<const uint4*>(vc + static_cast<size_t>(attn_cell(min(j, hi - 1), cells, ring)) * kv_dim +
                                                        kvh * head_dim);
      for (int c = lane; c < head_dim / 8; c += 32) {
        *reinterpret_cast<uint4*>(&vs[kj][8 * c]) = j < hi ? src[c] : make_uint4(0, 0, 0, 0);
      }
    }
    __syncthreads();
    const int k_steps = min(ATTN_VALUES_KEYS, hi - j0 + 15) / 16;
    for (int kk = 0; kk < k_steps; kk++) {
      const int k0 = 16 * kk;
      // A fragment: P rows group / group + 8, keys k0 + 2 tig (+1) and k0 + 2 tig + 8 (+9).
      uint32_t a[4];
      a[0] = *reinterpret_cast<const uint32_t*>(&ps[group][k0 + 2 * tig]);
      a[1] = *reinterpret_cast<const uint32_t*>(&ps[group + 8][k0 + 2 * tig]);
      a[2] = *reinterpret_cast<const uint32_t*>(&ps[group][k0 + 2 * tig + 8]);
      a[3] = *reinterpret_cast<const uint32_t*>(&ps[group + 8][k0 + 2 * tig + 8]);
#pragma unroll
      for (int i = 0; i < ATTN_MMA_DIM_MAX / 8 / (ATTN_THREADS / 32); i++) {
        const int tile = warp + i * (ATTN_THREADS / 32);
        if (tile < n_tiles) {
          // B fragment: keys k0 + 2 tig (+1) and + 8 (+9), dimension 8 tile + group.
          const int d = 8 * tile + group;
          __half2 b0 = __halves2half2(vs[k0 + 2 * tig][d], vs[k0 + 2 * tig + 1][d]);
          __half2 b1 = __halves2half2(vs[k0 + 2 * tig + 8][d], vs[k0 + 2 * tig + 9][d]);
          mma_f16_16816(acc[i], a, *reinterpret_cast<uint32_t*>(&b0), *reinterpret_cast<uint32_t*>(&b1));
        }
      }
    }
  }
  // c[0], c[1]: query group, dimensions 8 tile + 2 tig (+1); c[2], c[3]: query group + 8.
#pragma unroll
  for (int i = 0; i < ATTN_MMA_DIM_MAX / 8 / (ATTN_THREADS / 32); i++) {
    const int tile = warp + i * (ATTN_THREADS / 32);
    if (tile >= n_tiles) continue;
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int qi = group + 8 * (e >> 1), d = 8 * tile + 2 * tig + (e & 1);
      if (qi < nq) out[(static_cast<size_t>(t0 + qi) * n_head + h) * head_dim + d] = acc[i][e];
    }
  }
}

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

/// gelu_mul / silu_mul, then the product quantized (mode 0: one warp per 32 values; mode 1: one
/// warp per 256). n_groups units or superblocks of contiguous values.
template <int SILU>
__device__ __forceinline__ float gated_act(float g, float u) {
  if (SILU) return (g / (1.0f + expf(-g))) * u;
  return gelu_f16_table(g) * u;
}

template <int SILU>
__device__ __forceinline__ void act_mul_q(const float* gate, const float* up, int n_groups, float* out, int mode,
                                          int8_t* q, float* d) {
  const int group = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (group >= n_groups) return;
  if (mode == 0) {
    const size_t i = static_cast<size_t>(group) * 32 + lane;
    const float v = gated_act<SILU>(gate[i], up[i]);
    out[i] = v;
    quant_unit_q8_0(v, q + static_cast<size_t>(group) * 32, d + group);
  } else {
    const size_t base = static_cast<size_t>(group) * 256 + lane * 8;
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
      v[k] = gated_act<SILU>(gate[base + k], up[base + k]);
      out[base + k] = v[k];
    }
    quant_super_q8_k(v, q + static_cast<size_t>(group) * 256, d + static_cast<size_t>(group) * 8);
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
#include "attend_prompt.cuh"
