// Matrix × vector(s) and the tensor-core matmul of infer.cu (included there, in this order):
// quantized and float matvecs for decode and small batches, MMQ for prompts and larger batches,
// and the fused matvec of up to three matrices for a decode step.
#pragma once
#include "common.cuh"
#include "quant.cuh"
#include "packed.cuh"

// ---- matrix × vector(s) ------------------------------------------------------------------------
// y[t][o] = W[o] · x[t]. 4 warps a block of 128 threads; `split` warps (1, 2 or 4) share an output
// row, warp part p of a row taking the 32-value units 32p + lane, 32(p + split) + lane, ..., and
// the row's parts summed in part order through shared memory: a 14,336-wide row (an 8B model's
// down projection) is 4 warps' work rather than one warp's 14 units a lane, in turn, so that the
// matrix is read by 4 times as many warps with the same bytes in flight each. NT tokens share each
// weight load (NT = 8 for prefill, split 1).

/// Adds the dots of the units u0, u0 + stride, ... (< units) of one weight row to acc/accm.
/// UB units per lane in flight: a batch's weight loads are unconditional (past the row's end they
/// read its last unit again and are not summed), so no branch separates them and a warp waits for
/// one memory round trip per batch where a guarded load, unpacked inside its branch, waited for
/// each in turn. The units are summed in the same order whatever UB is.
template <class T, int NT, int UB>
__device__ __forceinline__ void matvec_units(const uint8_t* __restrict__ wr, int n_in, int units, int u0, int stride,
                                             const int8_t* __restrict__ xq, const float* __restrict__ xd,
                                             int t0, int n_tok, float (&acc)[NT], float (&accm)[NT]) {
  for (; u0 < units; u0 += stride * UB) {
    typename T::W wt[UB];
#pragma unroll
    for (int k = 0; k < UB; k++) T::load(wr, min(u0 + stride * k, units - 1), wt[k]);
#pragma unroll
    for (int k = 0; k < UB; k++) {
      const int u = u0 + stride * k;
#pragma unroll
      for (int t = 0; t < NT; t++) {
        if (u < units && (NT == 1 || t0 + t < n_tok)) {
          const int4* xp = reinterpret_cast<const int4*>(xq + static_cast<size_t>(t0 + t) * n_in + 32 * u);
          const int4 a = xp[0], b = xp[1];
          const int x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
          T::dot(wt[k], x, xd[static_cast<size_t>(t0 + t) * units + u], acc[t], accm[t]);
        }
      }
    }
  }
}

template <class T, int NT>
__device__ __forceinline__ void matvec_q(const uint8_t* __restrict__ w, int n_out, int n_in,
                                         const int8_t* __restrict__ xq, const float* __restrict__ xd, int n_tok,
                                         float* __restrict__ y, int row_block, int split) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = row_block * ((blockDim.x >> 5) / split) + warp / split, part = warp % split;
  const bool live = row < n_out;
  const int t0 = blockIdx.y * NT;
  const int units = n_in >> 5;
  const size_t row_bytes = static_cast<size_t>(n_in / T::BV) * T::BB;
  const uint8_t* wr = w + static_cast<size_t>(row) * row_bytes;
  float acc[NT], accm[NT];
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t] = accm[t] = 0.0f;
  // One token: batches of 4 units a lane (a 4,096-wide Q4_0 row in one round trip), or of the 1
  // or 2 a short row has (a 1,024-wide row is one unit a lane: 3 more loads would be wasted).
  const int stride = 32 * split, u0 = lane + 32 * part, per_lane = (units + stride - 1) / stride;
  if (live) {
    if (NT > 1) matvec_units<T, NT, 2>(wr, n_in, units, u0, stride, xq, xd, t0, n_tok, acc, accm);
    else if (per_lane >= 3) matvec_units<T, NT, 4>(wr, n_in, units, u0, stride, xq, xd, t0, n_tok, acc, accm);
    else if (per_lane == 2) matvec_units<T, NT, 2>(wr, n_in, units, u0, stride, xq, xd, t0, n_tok, acc, accm);
    else matvec_units<T, NT, 1>(wr, n_in, units, u0, stride, xq, xd, t0, n_tok, acc, accm);
  }
  if (split == 1) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
      const float s = warp_sum(acc[t]) - warp_sum(accm[t]);
      if (live && lane == 0 && (NT == 1 || t0 + t < n_tok)) y[static_cast<size_t>(t0 + t) * n_out + row] = s;
    }
    return;
  }
  __shared__ float parts[4][NT];  // blockDim.x = 128: 4 warps
#pragma unroll
  for (int t = 0; t < NT; t++) {
    const float s = warp_sum(acc[t]) - warp_sum(accm[t]);
    if (lane == 0) parts[warp][t] = s;
  }
  __syncthreads();
  if (live && part == 0 && lane < NT && (NT == 1 || t0 + lane < n_tok)) {
    float s = 0.0f;
    for (int p = 0; p < split; p++) s += parts[warp + p][lane];
    y[static_cast<size_t>(t0 + lane) * n_out + row] = s;
  }
}

/// Pulls this warp's part of its weight row into L2 before the kernel waits for the kernel ahead
/// of it (pdl_begin): weights never depend on it, so their DRAM latency overlaps that kernel's
/// tail instead of following it. 128-byte lines, any block layout.
template <class T>
__device__ __forceinline__ void matvec_prefetch(const uint8_t* w, int n_out, int n_in, int row_block, int split) {
  const int warp = threadIdx.x >> 5;
  const int row = row_block * ((blockDim.x >> 5) / split) + warp / split, part = warp % split;
  if (row >= n_out) return;
  const size_t row_bytes = static_cast<size_t>(n_in / T::BV) * T::BB;
  const uint8_t* wr = w + static_cast<size_t>(row) * row_bytes;
  for (size_t off = ((threadIdx.x & 31) + 32 * part) * 128; off < row_bytes; off += 32 * 128 * split) {
    prefetch_l2(wr + off);
  }
}

/// Adds the dots of units u0, u0 + stride, ... (< units) of R weight rows (wr[r]) with one
/// token's activation to acc/accm[r]: the R rows share each activation load. UB units a lane in
/// flight, loaded unconditionally as in matvec_units; each row's units summed in ascending order.
template <class T, int R, int UB>
__device__ __forceinline__ void rows_units(const uint8_t* const (&wr)[R], int units, int u0, int stride,
                                           const int8_t* __restrict__ xq, const float* __restrict__ xd,
                                           float (&acc)[R], float (&accm)[R]) {
  for (; u0 < units; u0 += stride * UB) {
    typename T::W wt[UB][R];
#pragma unroll
    for (int k = 0; k < UB; k++) {
#pragma unroll
      for (int r = 0; r < R; r++) T::load(wr[r], min(u0 + stride * k, units - 1), wt[k][r]);
    }
#pragma unroll
    for (int k = 0; k < UB; k++) {
      const int u = u0 + stride * k;
      if (u < units) {
        const int4* xp = reinterpret_cast<const int4*>(xq + 32 * static_cast<size_t>(u));
        const int4 a = xp[0], b = xp[1];
        const int x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        const float dx = xd[u];
#pragma unroll
        for (int r = 0; r < R; r++) T::dot(wt[k][r], x, dx, acc[r], accm[r]);
      }
    }
  }
}

/// One token, R rows a warp (matvec_q's rows with split parts, R consecutive rows for each warp
/// where matvec_q has one): the R rows share each activation load — a 4-bit row reads twice its
/// own bytes of activation, once per row at R = 1 — and a lane has R times the weight bytes in
/// flight. Each row is summed as matvec_q sums it (the same units a lane in the same order, parts
/// added in part order), bit for bit. Row block b is rows [4R/split · b, 4R/split · (b + 1)).
template <class T, int R>
__device__ __forceinline__ void matvec_rows(const uint8_t* __restrict__ w, int n_out, int n_in,
                                            const int8_t* __restrict__ xq, const float* __restrict__ xd,
                                            float* __restrict__ y, int row_block, int split) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = row_block * (4 / split) * R + (warp / split) * R, part = warp % split;
  const int units = n_in >> 5;
  const size_t row_bytes = static_cast<size_t>(n_in / T::BV) * T::BB;
  float acc[R], accm[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = accm[r] = 0.0f;
  if (row0 < n_out) {
    const uint8_t* wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = w + static_cast<size_t>(min(row0 + r, n_out - 1)) * row_bytes;
    rows_units<T, R, 2>(wr, units, lane + 32 * part, 32 * split, xq, xd, acc, accm);
  }
  if (split == 1) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      const float s = warp_sum(acc[r]) - warp_sum(accm[r]);
      if (lane == 0 && row0 + r < n_out) y[row0 + r] = s;
    }
    return;
  }
  __shared__ float parts[4][R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const float s = warp_sum(acc[r]) - warp_sum(accm[r]);
    if (lane == 0) parts[warp][r] = s;
  }
  __syncthreads();
  if (part == 0 && lane < R && row0 + lane < n_out) {
    float s = 0.0f;
    for (int p = 0; p < split; p++) s += parts[warp + p][lane];
    y[row0 + lane] = s;
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

/// Row blocks b, b + gridDim.x, ... of `blocks` for block b: several when lib/cuda launches a
/// one-token matvec as one wave of blocks (lib/cuda/ops.zig matvecGrid, the default), one each
/// when the grid has a block per row block (batches; INFER_CUDA_MATVEC_CTAS=0). Only the first
/// row block's weights are prefetched ahead of the wait. The `parts` of a split row are rewritten
/// by the next row block only after every warp read them.
template <class F>
__device__ __forceinline__ void for_row_blocks(int blocks, int split, F f) {
  for (int rb = blockIdx.x; rb < blocks; rb += gridDim.x) {
    f(rb);
    if (split > 1 && rb + static_cast<int>(gridDim.x) < blocks) __syncthreads();
  }
}

#define MATVEC_Q(NAME, T, NT)                                                                                \
  extern "C" __global__ void __launch_bounds__(128) NAME(const uint8_t* w, int n_out, int n_in, const int8_t* xq,   \
                                                         const float* xd, int n_tok, float* y, int split,           \
                                                         int rows_per_warp) {                                       \
    if (NT == 1 && rows_per_warp == 2) {                                                                    \
      matvec_prefetch<T>(w, n_out, n_in, 2 * blockIdx.x, split);                                            \
      matvec_prefetch<T>(w, n_out, n_in, 2 * blockIdx.x + 1, split);                                        \
      pdl_begin();                                                                                          \
      const int per_block = 8 / split;                                                                      \
      for_row_blocks((n_out + per_block - 1) / per_block, split,                                            \
                     [&](int rb) { matvec_rows<T, 2>(w, n_out, n_in, xq, xd, y, rb, split); });             \
      return;                                                                                               \
    }                                                                                                       \
    matvec_prefetch<T>(w, n_out, n_in, blockIdx.x, split);                                                 \
    pdl_begin();                                                                                            \
    const int per_block = 4 / split;                                                                        \
    for_row_blocks((n_out + per_block - 1) / per_block, split,                                              \
                   [&](int rb) { matvec_q<T, NT>(w, n_out, n_in, xq, xd, n_tok, y, rb, split); });          \
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
MATVEC_Q(matvec_mxfp4_1, MXFP4, 1)
MATVEC_Q(matvec_mxfp4_8, MXFP4, 8)
MATVEC_Q(matvec_q4_k_1, Q4_K, 1)
MATVEC_Q(matvec_q4_k_8, Q4_K, 8)
MATVEC_Q(matvec_q5_k_1, Q5_K, 1)
MATVEC_Q(matvec_q5_k_8, Q5_K, 8)
MATVEC_Q(matvec_q6_k_1, Q6_K, 1)
MATVEC_Q(matvec_q6_k_8, Q6_K, 8)
MATVEC_Q(matvec_q4_0r_1, Q4_0R, 1)
MATVEC_Q(matvec_q4_0r_8, Q4_0R, 8)
MATVEC_Q(matvec_q8_0r_1, Q8_0R, 1)
MATVEC_Q(matvec_q8_0r_8, Q8_0R, 8)
MATVEC_Q(matvec_q4_kr_1, Q4_KR, 1)
MATVEC_Q(matvec_q4_kr_8, Q4_KR, 8)
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
// 256 tokens and more (lib/cuda/ops.zig mmq_tiles: +12–26% on a 2,048-token prompt of the 8B
// shape; at 32 tokens the larger tile leaves most of the GPU idle and runs at half the speed),
// but for Q4_K and Q5_K, which keep the small tile: it stages a whole superblock (SUPER below).
__device__ __forceinline__ void mma_s8_16816(int (&c)[4], int a0, int a1, int b0) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

template <bool B, class A, class C>
struct pick { using type = A; };
template <class A, class C>
struct pick<false, A, C> { using type = C; };

template <class T, int ROWS, int TOKS, int UNITS>
__device__ __forceinline__ void mmq(const uint8_t* __restrict__ w, int n_out, int n_in, const int8_t* __restrict__ xq,
                                    const float* __restrict__ xd, int n_tok, float* __restrict__ y) {
  constexpr int STRIDE = UNITS * 8 + 4;  // words per staged row; the 4 spread 8 rows over all 32 banks
  constexpr int J = ROWS / 8;            // 8-row MMA tiles per warp
  constexpr int THREADS = TOKS * 2;
  // K-quants (T::SUPER) with a stage of one whole superblock (UNITS = 8): the units' integer dots
  // times their 6-bit scales (and the mins times the activation sums) add up as integers over
  // the superblock, then meet d·dx and dmin·dx in one FMA each, as the CPU's dot does; per unit
  // that is two integer multiply-adds where the float combine took about ten instructions, the
  // cost that held the Q4_K prompt at a third of Q4_0's speed.
  constexpr bool SUPER = T::SUPER;
  static_assert(!SUPER || UNITS == 8, "a stage of a K-quant is one whole superblock");
  __shared__ int w_words[ROWS * STRIDE];
  __shared__ typename pick<SUPER, int, typename T::P>::type w_params[ROWS * UNITS];
  __shared__ float2 w_dm[SUPER ? ROWS : 1];  // the superblock's d and dmin, per row
  __shared__ int x_words[TOKS * STRIDE];
  __shared__ float x_scales[TOKS * UNITS];
  __shared__ int2 x_sums[TOKS * UNITS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = lane >> 2, tig = lane & 3;  // the MMA fragment coordinates of this lane
  const int row0 = blockIdx.x * ROWS, tok0 = blockIdx.y * TOKS;
  const int units = n_in >> 5;
  // K-split z of gridDim.z (lib/cuda/ops.zig mmqSplits) takes a run of whole steps and writes its
  // partial sums to plane z of y; a split past the last unit writes zeros.
  const int steps_per_split = ((units + UNITS - 1) / UNITS + gridDim.z - 1) / gridDim.z;
  const int u_begin = min(units, static_cast<int>(blockIdx.z) * steps_per_split * UNITS);
  const int u_end = min(units, u_begin + steps_per_split * UNITS);
  y += static_cast<size_t>(blockIdx.z) * n_tok * n_out;
  const size_t row_bytes = static_cast<size_t>(n_in / T::BV) * T::BB;
  float acc[J][4], accm[J][4];
#pragma unroll
  for (int j = 0; j < J; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[j][e] = accm[j][e] = 0.0f;

  // Staging: every thread's loads of a step issued together (unrolled, then stored), so that a
  // step waits for one memory round trip rather than one per (row, unit) pair in turn. The loads
  // are unconditional (rows, tokens and units past the ends read the last ones again: their
  // products are never written or never summed); a guarded load is unpacked inside its branch,
  // which serializes the loads.
  constexpr int WP = ROWS * UNITS / THREADS, XP = TOKS * UNITS / THREADS;
  static_assert(WP * THREADS == ROWS * UNITS && XP * THREADS == TOKS * UNITS, "staging pairs per thread");
  for (int u0 = u_begin; u0 < u_end; u0 += UNITS) {
    const int n_units = min(UNITS, u_end - u0);
    typename T::W wts[WP];
    int4 xa[XP], xb[XP];
    float xds[XP];
#pragma unroll
    for (int k = 0; k < WP; k++) {
      const int i = tid + k * THREADS, r = min(row0 + i / UNITS, n_out - 1), uu = min(i % UNITS, n_units - 1);
      T::load(w + static_cast<size_t>(r) * row_bytes, u0 + uu, wts[k]);
    }
#pragma unroll
    for (int k = 0; k < XP; k++) {
      const int i = tid + k * THREADS, t = min(tok0 + i / UNITS, n_tok - 1), uu = min(i % UNITS, n_units - 1);
      const int4* p = reinterpret_cast<const int4*>(xq + static_cast<size_t>(t) * n_in + 32 * (u0 + uu));
      xa[k] = p[0];
      xb[k] = p[1];
      xds[k] = xd[static_cast<size_t>(t) * units + u0 + uu];
    }
#pragma unroll
    for (int k = 0; k < WP; k++) {
      const int i = tid + k * THREADS, r = i / UNITS, uu = i % UNITS;
#pragma unroll
      for (int e = 0; e < 8; e++) w_words[r * STRIDE + uu * 8 + e] = T::mma_word(wts[k].v[e]);
      if constexpr (SUPER) {
        w_params[i] = T::ip(wts[k]);
        if (uu == 0) w_dm[r] = make_float2(wts[k].d, wts[k].dmin);
      } else {
        w_params[i] = T::params(wts[k]);
      }
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
    int isum[J][4], msum[J][4];  // SUPER: this superblock's integer sums
#pragma unroll
    for (int j = 0; j < J; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) isum[j][e] = msum[j][e] = 0;
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
          if constexpr (SUPER) {
            T::icombine(w_params[r * UNITS + uu], c_lo[e], c_hi[e], sx[h].x, sx[h].y, isum[j][e], msum[j][e]);
          } else {
            T::combine(w_params[r * UNITS + uu], c_lo[e], c_hi[e], sx[h].x, sx[h].y, dx[h], acc[j][e], accm[j][e]);
          }
        }
      }
    }
    if constexpr (SUPER) {
      // One activation scale per superblock: unit 0's stands for all 8.
      const float dx[2] = {x_scales[t_a * UNITS], x_scales[(t_a + 8) * UNITS]};
#pragma unroll
      for (int j = 0; j < J; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float2 dm = w_dm[8 * j + 2 * tig + (e & 1)];
          acc[j][e] = __fmaf_rn(static_cast<float>(isum[j][e]), dm.x * dx[e >> 1], acc[j][e]);
          accm[j][e] = __fmaf_rn(static_cast<float>(msum[j][e]), dm.y * dx[e >> 1], accm[j][e]);
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
MMQ(mmq_q4_0, Q4_0, 32, 64, 8)
MMQ(mmq_q5_0, Q5_0, 32, 64, 8)
MMQ(mmq_q8_0, Q8_0, 32, 64, 8)
MMQ(mmq_q4_k, Q4_K, 32, 64, 8)
MMQ(mmq_q5_k, Q5_K, 32, 64, 8)
MMQ(mmq_q6_k, Q6_K, 32, 64, 8)
MMQ(mmq_q4_0r, Q4_0R, 32, 64, 8)
MMQ(mmq_q8_0r, Q8_0R, 32, 64, 8)
MMQ(mmq_q4_kr, Q4_KR, 32, 64, 8)
MMQ(mmq_q4_0_64x128, Q4_0, 64, 128, 4)
MMQ(mmq_q5_0_64x128, Q5_0, 64, 128, 4)
MMQ(mmq_q8_0_64x128, Q8_0, 64, 128, 4)
MMQ(mmq_q6_k_64x128, Q6_K, 64, 128, 4)
MMQ(mmq_q4_0r_64x128, Q4_0R, 64, 128, 4)
MMQ(mmq_q8_0r_64x128, Q8_0R, 64, 128, 4)

// ---- small batches on the tensor cores (batched decode) ------------------------------------------
// mmq with the roles turned round for 2 to 64 tokens: the weights are the MMA's 16-row A side and
// the tokens its 8-wide B side, so a tile of 8, 16, 32 or 64 tokens (NTOK) wastes no MMA and no
// activation staging on tokens that are not there, where mmq's 16-token A rows and 64-token tile
// did 2 to 8 times the work of a decode step's batch. A block takes 64 weight rows × NTOK tokens:
// 4 warps of 16 rows each up to 32 tokens, 8 warps (two per 16 rows, 32 tokens each) at 64, so
// that a 64-row batch reads every weight byte once at the register cost of 32 tokens. Each
// staged step is loaded into registers while the step before it is computed from shared memory,
// so a block keeps a step of weights in flight all along.
// Per unit and 8 tokens a warp issues one m16n8k32 MMA (the unit's whole 32-value dot) and, for
// one-scale types (T::UNIT_SCALE), three full-rate float instructions an output: the MMA's
// accumulator starts at 1.5·2^23, so the sum comes out as the bits of the float 1.5·2^23 + s
// and one subtraction gives float(s) exactly (|s| < 2^22: at most 32 · 128 · 127), where a
// conversion runs at a quarter of the float rate. Then fma(float(s), d·dx, acc), unit after
// unit, as T::combine and the CPU do: the same bits as mmq. K-quants (T::SUPER) add sc·s and
// m·Σx as integers over the superblock and meet d·dx and dmin·dx once (mmq's icombine); Q6_K,
// two scales a unit, takes two m16n8k16 MMAs and T::combine. Fragments are read by ldmatrix:
// one load for a warp's 16 rows of a unit, one for two 8-token tiles.
__device__ __forceinline__ void mma_s8_16832(int (&c)[4], const int (&a)[4], int b0, int b1, int c0) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c0));
}

/// Four 8×8 matrices of 16-bit elements (8 rows of 16 bytes each) from shared memory: lane l
/// gives the address of row l % 8 of matrix l / 8 and gets, of each matrix i, row l / 4's
/// 4-byte word l % 4 in r[i]: the MMA fragments of 8 × 16 int8 values.
__device__ __forceinline__ void ldmatrix_x4(int (&r)[4], const int* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
/// Two matrices (lanes 0..15 give the addresses) into r[0], r[1].
__device__ __forceinline__ void ldmatrix_x2(int (&r)[4], const int* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

// mmqn_tile is one block's work: weight rows row0 .. row0 + 63 × tokens tok0 .. tok0 + NTOK - 1
// (those below n_tok) over units [u_begin, u_end); token t reads activation row x_row(t) and its
// result for weight row r goes to store(t, r, value). mmqn tiles the batch in order; moe.cuh's
// moe_mmq tiles each expert's gathered slots (the gather is in the staging loads: ldmatrix reads
// the staged rows as the dense path's).
template <class T, int NTOK, class XRow, class Store>
__device__ __forceinline__ void mmqn_tile(const uint8_t* __restrict__ w, int n_out, int n_in,
                                          const int8_t* __restrict__ xq, const float* __restrict__ xd, int row0,
                                          int tok0, int u_begin, int u_end, int n_tok, XRow x_row, Store store) {
  constexpr int UNITS = 8, ROWS = 64;
  constexpr int TG = NTOK > 32 ? NTOK / 32 : 1;  // groups of 4 warps, each group up to 32 tokens
  constexpr int THREADS = 128 * TG, NT8 = NTOK / TG / 8;  // 8-token MMA tiles a warp
  constexpr int STRIDE = UNITS * 8 + 4;  // words a staged row: ldmatrix's 8 rows meet all 32 banks
  constexpr bool SUPER = T::SUPER, SCALED = T::UNIT_SCALE, HALVES = !SUPER && !SCALED;
  static_assert(NT8 == 1 || NT8 % 2 == 0, "8-token tiles are read two at a time");
  using Param = typename pick<SCALED, float, typename pick<SUPER, int, typename T::P>::type>::type;
  __shared__ __align__(16) int w_words[ROWS * STRIDE];
  __shared__ Param w_params[ROWS * UNITS];  // [row][unit]
  __shared__ float2 w_dm[SUPER ? ROWS : 1];
  __shared__ __align__(16) int x_words[NTOK * STRIDE];
  __shared__ __align__(8) float x_scales[UNITS * NTOK];      // [unit][token]
  __shared__ __align__(8) int x_sums[SUPER ? UNITS * NTOK : 1];  // [unit][token]: the unit's Σx
  __shared__ int2 x_halves[HALVES ? UNITS * NTOK : 1];        // [unit][token]: its halves' Σx
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = lane >> 2, tig = lane & 3;
  const int warp_rows = 16 * (warp & 3), warp_toks = 32 * (warp >> 2);
  const int units = n_in >> 5;
  const size_t row_bytes = static_cast<size_t>(n_in / T::BV) * T::BB;
  constexpr int WP = ROWS * UNITS / THREADS;
  constexpr int XPAIRS = NTOK * UNITS, XP = (XPAIRS + THREADS - 1) / THREADS;
  static_assert(WP * THREADS == ROWS * UNITS, "staging pairs per thread");
  typename T::W wts[WP];
  int4 xa[XP], xb[XP];
  float xds[XP];
  // Loads one step (unconditional, clamped to the last row, token and unit as in mmq): the
  // weights, then the activations.
  auto load_w = [&](int u0) {
    const int n_units = min(UNITS, u_end - u0);
#pragma unroll
    for (int k = 0; k < WP; k++) {
      const int i = tid + k * THREADS, r = min(row0 + i / UNITS, n_out - 1), uu = min(i % UNITS, n_units - 1);
      T::load(w + static_cast<size_t>(r) * row_bytes, u0 + uu, wts[k]);
    }
  };
  auto load_x = [&](int u0) {
    const int n_units = min(UNITS, u_end - u0);
#pragma unroll
    for (int k = 0; k < XP; k++) {
      const int i = min(tid + k * THREADS, XPAIRS - 1);
      const int t = x_row(min(tok0 + i / UNITS, n_tok - 1)), uu = min(i % UNITS, n_units - 1);
      const int4* p = reinterpret_cast<const int4*>(xq + static_cast<size_t>(t) * n_in + 32 * (u0 + uu));
      xa[k] = p[0];
      xb[k] = p[1];
      xds[k] = xd[static_cast<size_t>(t) * units + u0 + uu];
    }
  };
  float acc[NT8][4], accm[NT8][4];
#pragma unroll
  for (int n = 0; n < NT8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[n][e] = accm[n][e] = 0.0f;
  // The first step's weights are requested before the wait for the kernel ahead (pdl_begin):
  // no kernel writes them, so their latency overlaps that kernel's tail.
  if (u_begin < u_end) load_w(u_begin);
  pdl_begin();
  if (u_begin < u_end) load_x(u_begin);
  const int r_a = warp_rows + group;  // this lane's rows: r_a and r_a + 8
  // ldmatrix rows: A, lanes 8..15 rows 8..15 (a1), lanes 16..31 the unit's second 16 bytes (a2,
  // a3); B, lanes 8..15 the second 16 bytes (b1), lanes 16..31 the next 8 tokens.
  const int a_off = (warp_rows + (lane & 7) + 8 * ((lane >> 3) & 1)) * STRIDE + 4 * (lane >> 4);
  const int b_off = (warp_toks + (NT8 > 1 ? 8 * (lane >> 4) : 0) + (lane & 7)) * STRIDE + 4 * ((lane >> 3) & 1);
  for (int u0 = u_begin; u0 < u_end; u0 += UNITS) {
    const int n_units = min(UNITS, u_end - u0);
#pragma unroll
    for (int k = 0; k < WP; k++) {
      const int i = tid + k * THREADS, r = i / UNITS, uu = i % UNITS;
      const int* v = wts[k].v;
      int4* dst = reinterpret_cast<int4*>(w_words + r * STRIDE + uu * 8);
      dst[0] = make_int4(T::mma_word(v[0]), T::mma_word(v[1]), T::mma_word(v[2]), T::mma_word(v[3]));
      dst[1] = make_int4(T::mma_word(v[4]), T::mma_word(v[5]), T::mma_word(v[6]), T::mma_word(v[7]));
      if constexpr (SCALED) {
        w_params[i] = T::params(wts[k]).d;
      } else if constexpr (SUPER) {
        w_params[i] = T::ip(wts[k]);
        if (uu == 0) w_dm[r] = make_float2(wts[k].d, wts[k].dmin);
      } else {
        w_params[i] = T::params(wts[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < XP; k++) {
      const int i = tid + k * THREADS;
      if (XPAIRS % THREADS == 0 || i < XPAIRS) {
        const int t = i / UNITS, uu = i % UNITS;
        const int4 a = xa[k], b = xb[k];
        int4* dst = reinterpret_cast<int4*>(x_words + t * STRIDE + uu * 8);
        dst[0] = a;
        dst[1] = b;
        x_scales[uu * NTOK + t] = xds[k];
        if constexpr (!SCALED) {
          const int lo = dp4a(0x01010101, a.w, dp4a(0x01010101, a.z, dp4a(0x01010101, a.y, dp4a(0x01010101, a.x, 0))));
          const int hi = dp4a(0x01010101, b.w, dp4a(0x01010101, b.z, dp4a(0x01010101, b.y, dp4a(0x01010101, b.x, 0))));
          if constexpr (SUPER) x_sums[uu * NTOK + t] = lo + hi;
          else x_halves[uu * NTOK + t] = make_int2(lo, hi);
        }
      }
    }
    __syncthreads();
    if (u0 + UNITS < u_end) {  // the next step in flight while this one is computed
      load_w(u0 + UNITS);
      load_x(u0 + UNITS);
    }
    int isum[SUPER ? NT8 : 1][4], msum[SUPER ? NT8 : 1][4];
#pragma unroll
    for (int n = 0; n < (SUPER ? NT8 : 1); n++)
#pragma unroll
      for (int e = 0; e < 4; e++) isum[n][e] = msum[n][e] = 0;
#pragma unroll
    for (int uu = 0; uu < UNITS; uu++) {
      if (uu >= n_units) break;
      int a[4];
      ldmatrix_x4(a, w_words + a_off + uu * 8);
      const Param p0 = w_params[r_a * UNITS + uu], p1 = w_params[(r_a + 8) * UNITS + uu];
#pragma unroll
      for (int m = 0; m < (NT8 + 1) / 2; m++) {
        int b[4];
        if constexpr (NT8 == 1) ldmatrix_x2(b, x_words + b_off + uu * 8);
        else ldmatrix_x4(b, x_words + b_off + 16 * m * STRIDE + uu * 8);
#pragma unroll
        for (int h = 0; h < (NT8 == 1 ? 1 : 2); h++) {
          const int n = 2 * m + h;
          const int t = warp_toks + 8 * n + 2 * tig;  // c[0], c[2]: token t; c[1], c[3]: t + 1
          // c[0], c[1]: row r_a; c[2], c[3]: row r_a + 8.
          if constexpr (SCALED) {
            int c[4];
            mma_s8_16832(c, a, b[2 * h], b[2 * h + 1], 0x4B400000);
            const float2 dx = *reinterpret_cast<const float2*>(x_scales + uu * NTOK + t);
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const float s = __fsub_rn(__int_as_float(c[e]), 12582912.0f);
              const float k = __fmul_rn(e < 2 ? p0 : p1, (e & 1) ? dx.y : dx.x);
              acc[n][e] = __fmaf_rn(s, k, acc[n][e]);
            }
          } else if constexpr (SUPER) {
            int c[4];
            mma_s8_16832(c, a, b[2 * h], b[2 * h + 1], 0);
            const int2 xs = *reinterpret_cast<const int2*>(x_sums + uu * NTOK + t);
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const int p = e < 2 ? p0 : p1;
              isum[n][e] += (p & 0xFFFF) * c[e];
              msum[n][e] += (p >> 16) * ((e & 1) ? xs.y : xs.x);
            }
          } else {
            int c_lo[4], c_hi[4];
            mma_s8_16816(c_lo, a[0], a[1], b[2 * h]);
            mma_s8_16816(c_hi, a[2], a[3], b[2 * h + 1]);
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const int2 sx = x_halves[uu * NTOK + t + (e & 1)];
              T::combine(e < 2 ? p0 : p1, c_lo[e], c_hi[e], sx.x, sx.y, x_scales[uu * NTOK + t + (e & 1)], acc[n][e],
                         accm[n][e]);
            }
          }
        }
      }
    }
    if constexpr (SUPER) {
      // One activation scale per superblock: unit 0's stands for all 8.
      const float2 dm[2] = {w_dm[r_a], w_dm[r_a + 8]};
#pragma unroll
      for (int n = 0; n < NT8; n++) {
        const float2 dx = *reinterpret_cast<const float2*>(x_scales + warp_toks + 8 * n + 2 * tig);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float d = (e & 1) ? dx.y : dx.x;
          acc[n][e] = __fmaf_rn(static_cast<float>(isum[n][e]), dm[e >> 1].x * d, acc[n][e]);
          accm[n][e] = __fmaf_rn(static_cast<float>(msum[n][e]), dm[e >> 1].y * d, accm[n][e]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int n = 0; n < NT8; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int t = tok0 + warp_toks + 8 * n + 2 * tig + (e & 1), r = row0 + r_a + 8 * (e >> 1);
      if (t < n_tok && r < n_out) store(t, r, acc[n][e] - accm[n][e]);
    }
  }
}

/// The batch's tokens in order, tiles of NTOK (grid y), split over K by grid z (plane z of y).
template <class T, int NTOK>
__device__ __forceinline__ void mmqn(const uint8_t* __restrict__ w, int n_out, int n_in, const int8_t* __restrict__ xq,
                                     const float* __restrict__ xd, int n_tok, float* __restrict__ y) {
  constexpr int UNITS = 8;
  const int tok0 = blockIdx.y * NTOK, units = n_in >> 5;
  const int steps_per_split = ((units + UNITS - 1) / UNITS + gridDim.z - 1) / gridDim.z;
  const int u_begin = min(units, static_cast<int>(blockIdx.z) * steps_per_split * UNITS);
  const int u_end = min(units, u_begin + steps_per_split * UNITS);
  y += static_cast<size_t>(blockIdx.z) * n_tok * n_out;
  mmqn_tile<T, NTOK>(
      w, n_out, n_in, xq, xd, blockIdx.x * 64, tok0, u_begin, u_end, n_tok, [](int t) { return t; },
      [y, n_out](int t, int r, float v) { y[static_cast<size_t>(t) * n_out + r] = v; });
}

// The same with two m16n8k16 MMAs a unit and T::combine's float sums, tiles of 8, 16 and 32
// tokens: kept while benches compare the two (lib/cuda/ops.zig batchMmaK16).
template <class T, int NTOK, int UNITS>
__device__ __forceinline__ void mmqn_k16(const uint8_t* __restrict__ w, int n_out, int n_in,
                                         const int8_t* __restrict__ xq, const float* __restrict__ xd, int n_tok,
                                         float* __restrict__ y) {
  constexpr int THREADS = 128, ROWS = 64, NT8 = NTOK / 8;
  constexpr int STRIDE = UNITS * 8 + 4;  // as mmq: 8 rows' fragment loads over all 32 banks
  constexpr bool SUPER = T::SUPER;
  static_assert(!SUPER || UNITS == 8, "a stage of a K-quant is one whole superblock");
  __shared__ int w_words[ROWS * STRIDE];
  __shared__ typename pick<SUPER, int, typename T::P>::type w_params[ROWS * UNITS];
  __shared__ float2 w_dm[SUPER ? ROWS : 1];
  __shared__ int x_words[NTOK * STRIDE];
  __shared__ float x_scales[NTOK * UNITS];
  __shared__ int2 x_sums[NTOK * UNITS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = lane >> 2, tig = lane & 3;
  const int row0 = blockIdx.x * ROWS, tok0 = blockIdx.y * NTOK;
  const int units = n_in >> 5;
  const int steps_per_split = ((units + UNITS - 1) / UNITS + gridDim.z - 1) / gridDim.z;
  const int u_begin = min(units, static_cast<int>(blockIdx.z) * steps_per_split * UNITS);
  const int u_end = min(units, u_begin + steps_per_split * UNITS);
  y += static_cast<size_t>(blockIdx.z) * n_tok * n_out;
  const size_t row_bytes = static_cast<size_t>(n_in / T::BV) * T::BB;
  constexpr int WP = ROWS * UNITS / THREADS;
  constexpr int XPAIRS = NTOK * UNITS, XP = (XPAIRS + THREADS - 1) / THREADS;
  static_assert(WP * THREADS == ROWS * UNITS, "staging pairs per thread");
  typename T::W wts[WP];
  int4 xa[XP], xb[XP];
  float xds[XP];
  // Loads one step (unconditional, clamped to the last row, token and unit as in mmq): the
  // weights, then the activations.
  auto load_w = [&](int u0) {
    const int n_units = min(UNITS, u_end - u0);
#pragma unroll
    for (int k = 0; k < WP; k++) {
      const int i = tid + k * THREADS, r = min(row0 + i / UNITS, n_out - 1), uu = min(i % UNITS, n_units - 1);
      T::load(w + static_cast<size_t>(r) * row_bytes, u0 + uu, wts[k]);
    }
  };
  auto load_x = [&](int u0) {
    const int n_units = min(UNITS, u_end - u0);
#pragma unroll
    for (int k = 0; k < XP; k++) {
      const int i = min(tid + k * THREADS, XPAIRS - 1);
      const int t = min(tok0 + i / UNITS, n_tok - 1), uu = min(i % UNITS, n_units - 1);
      const int4* p = reinterpret_cast<const int4*>(xq + static_cast<size_t>(t) * n_in + 32 * (u0 + uu));
      xa[k] = p[0];
      xb[k] = p[1];
      xds[k] = xd[static_cast<size_t>(t) * units + u0 + uu];
    }
  };
  float acc[NT8][4], accm[NT8][4];
#pragma unroll
  for (int n = 0; n < NT8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[n][e] = accm[n][e] = 0.0f;
  // The first step's weights are requested before the wait for the kernel ahead (pdl_begin):
  // no kernel writes them, so their latency overlaps that kernel's tail.
  if (u_begin < u_end) load_w(u_begin);
  pdl_begin();
  if (u_begin < u_end) load_x(u_begin);
  const int r_a = warp * 16 + group;  // this lane's rows: r_a and r_a + 8
  for (int u0 = u_begin; u0 < u_end; u0 += UNITS) {
    const int n_units = min(UNITS, u_end - u0);
#pragma unroll
    for (int k = 0; k < WP; k++) {
      const int i = tid + k * THREADS, r = i / UNITS, uu = i % UNITS;
#pragma unroll
      for (int e = 0; e < 8; e++) w_words[r * STRIDE + uu * 8 + e] = T::mma_word(wts[k].v[e]);
      if constexpr (SUPER) {
        w_params[i] = T::ip(wts[k]);
        if (uu == 0) w_dm[r] = make_float2(wts[k].d, wts[k].dmin);
      } else {
        w_params[i] = T::params(wts[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < XP; k++) {
      const int i = tid + k * THREADS;
      if (XPAIRS % THREADS == 0 || i < XPAIRS) {
        const int t = i / UNITS, uu = i % UNITS;
        const int4 a = xa[k], b = xb[k];
        int* dst = x_words + t * STRIDE + uu * 8;
        dst[0] = a.x; dst[1] = a.y; dst[2] = a.z; dst[3] = a.w;
        dst[4] = b.x; dst[5] = b.y; dst[6] = b.z; dst[7] = b.w;
        x_scales[i] = xds[k];
        const int lo = dp4a(0x01010101, a.w, dp4a(0x01010101, a.z, dp4a(0x01010101, a.y, dp4a(0x01010101, a.x, 0))));
        const int hi = dp4a(0x01010101, b.w, dp4a(0x01010101, b.z, dp4a(0x01010101, b.y, dp4a(0x01010101, b.x, 0))));
        x_sums[i] = make_int2(lo, hi);
      }
    }
    __syncthreads();
    if (u0 + UNITS < u_end) {  // the next step in flight while this one is computed
      load_w(u0 + UNITS);
      load_x(u0 + UNITS);
    }
    int isum[NT8][4], msum[NT8][4];
#pragma unroll
    for (int n = 0; n < NT8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) isum[n][e] = msum[n][e] = 0;
    for (int uu = 0; uu < n_units; uu++) {
      const int* wa = w_words + r_a * STRIDE + uu * 8 + tig;
      const int a_lo0 = wa[0], a_lo1 = wa[8 * STRIDE], a_hi0 = wa[4], a_hi1 = wa[8 * STRIDE + 4];
      const auto p0 = w_params[r_a * UNITS + uu], p1 = w_params[(r_a + 8) * UNITS + uu];
#pragma unroll
      for (int n = 0; n < NT8; n++) {
        const int* xw = x_words + (8 * n + group) * STRIDE + uu * 8 + tig;
        int c_lo[4], c_hi[4];
        mma_s8_16816(c_lo, a_lo0, a_lo1, xw[0]);
        mma_s8_16816(c_hi, a_hi0, a_hi1, xw[4]);
        // c[0], c[1]: row r_a, tokens 8n + 2 tig + 0/1; c[2], c[3]: row r_a + 8.
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int t = 8 * n + 2 * tig + (e & 1);
          const int2 sx = x_sums[t * UNITS + uu];
          if constexpr (SUPER) {
            T::icombine(e < 2 ? p0 : p1, c_lo[e], c_hi[e], sx.x, sx.y, isum[n][e], msum[n][e]);
          } else {
            T::combine(e < 2 ? p0 : p1, c_lo[e], c_hi[e], sx.x, sx.y, x_scales[t * UNITS + uu], acc[n][e], accm[n][e]);
          }
        }
      }
    }
    if constexpr (SUPER) {
      const float2 dm[2] = {w_dm[r_a], w_dm[r_a + 8]};
#pragma unroll
      for (int n = 0; n < NT8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float dx = x_scales[(8 * n + 2 * tig + (e & 1)) * UNITS];
          acc[n][e] = __fmaf_rn(static_cast<float>(isum[n][e]), dm[e >> 1].x * dx, acc[n][e]);
          accm[n][e] = __fmaf_rn(static_cast<float>(msum[n][e]), dm[e >> 1].y * dx, accm[n][e]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int n = 0; n < NT8; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int t = tok0 + 8 * n + 2 * tig + (e & 1), r = row0 + r_a + 8 * (e >> 1);
      if (t < n_tok && r < n_out) y[static_cast<size_t>(t) * n_out + r] = acc[n][e] - accm[n][e];
    }
  }
}

// The launch bounds of the 32-token tiles: BOUNDS32 for mmqn's, K16_BOUNDS32 for mmqn_k16's.
// mmqn_k16's Q4_K and Q5_K in the GGUF layout ask for 3 blocks a multiprocessor: ptxas fits them
// in 168 registers with no spill, where left alone it takes 201 and 210 (2 blocks); Q4_KR at 3
// would spill, so it keeps its 199. mmqn's K-quant tiles (216, 233 and 203 registers) would
// spill at 3 blocks, so they keep 2. (__launch_bounds__(128, 1) is not the same as (128): ptxas
// then spends up to 210 registers where it took 130.)
#define MMQN(NAME, T, NTOK, BOUNDS)                                                                          \
  extern "C" __global__ void BOUNDS NAME(const uint8_t* w, int n_out, int n_in, const int8_t* xq,            \
                                         const float* xd, int n_tok, float* y) {                             \
    mmqn<T, NTOK>(w, n_out, n_in, xq, xd, n_tok, y);                                                         \
  }
#define MMQN_K16(NAME, T, NTOK, BOUNDS)                                                                      \
  extern "C" __global__ void BOUNDS NAME(const uint8_t* w, int n_out, int n_in, const int8_t* xq,            \
                                         const float* xd, int n_tok, float* y) {                             \
    mmqn_k16<T, NTOK, 8>(w, n_out, n_in, xq, xd, n_tok, y);                                                  \
  }
#define MMQN_ALL(SUFFIX, T, BOUNDS32, K16_BOUNDS32)                                                          \
  MMQN(mmqn_##SUFFIX##_n8, T, 8, __launch_bounds__(128))                                                     \
  MMQN(mmqn_##SUFFIX##_n16, T, 16, __launch_bounds__(128))                                                   \
  MMQN(mmqn_##SUFFIX##_n32, T, 32, BOUNDS32) MMQN(mmqn_##SUFFIX##_n64, T, 64, __launch_bounds__(256))       \
  MMQN_K16(mmqn_k16_##SUFFIX##_n8, T, 8, __launch_bounds__(128))                                             \
  MMQN_K16(mmqn_k16_##SUFFIX##_n16, T, 16, __launch_bounds__(128))                                           \
  MMQN_K16(mmqn_k16_##SUFFIX##_n32, T, 32, K16_BOUNDS32)
#define MMQN_PLAIN __launch_bounds__(128)
#define MMQN_3_BLOCKS __launch_bounds__(128, 3)
MMQN_ALL(q4_0, Q4_0, MMQN_PLAIN, MMQN_PLAIN)
MMQN_ALL(q5_0, Q5_0, MMQN_PLAIN, MMQN_PLAIN)
MMQN_ALL(q8_0, Q8_0, MMQN_PLAIN, MMQN_PLAIN)
MMQN_ALL(q4_k, Q4_K, MMQN_PLAIN, MMQN_3_BLOCKS)
MMQN_ALL(q5_k, Q5_K, MMQN_PLAIN, MMQN_3_BLOCKS)
MMQN_ALL(q6_k, Q6_K, MMQN_PLAIN, MMQN_PLAIN)
MMQN_ALL(q4_0r, Q4_0R, MMQN_PLAIN, MMQN_PLAIN)
MMQN_ALL(q8_0r, Q8_0R, MMQN_PLAIN, MMQN_PLAIN)
MMQN_ALL(q4_kr, Q4_KR, MMQN_PLAIN, MMQN_PLAIN)

// Up to three matrices with the same type, input and one token (q/k/v, gate/up) in one launch:
// row blocks [0, b0) go to matrix 0, the next b1 to matrix 1, the rest to matrix 2. Each row is
// computed exactly as matvec_*_1 computes it (the same split for the same n_in).
template <class T>
__device__ __forceinline__ void matvec_multi(const uint8_t* w0, int n0, float* y0, const uint8_t* w1, int n1,
                                             float* y1, const uint8_t* w2, int n2, float* y2, int n_in,
                                             const int8_t* xq, const float* xd, int split) {
  const int rows_per_block = (blockDim.x >> 5) / split;
  const int b0 = (n0 + rows_per_block - 1) / rows_per_block, b1 = (n1 + rows_per_block - 1) / rows_per_block;
  const int b2 = (n2 + rows_per_block - 1) / rows_per_block;
  const int first = blockIdx.x;
  if (first < b0) matvec_prefetch<T>(w0, n0, n_in, first, split);
  else if (first < b0 + b1) matvec_prefetch<T>(w1, n1, n_in, first - b0, split);
  else matvec_prefetch<T>(w2, n2, n_in, first - b0 - b1, split);
  pdl_begin();
  for_row_blocks(b0 + b1 + b2, split, [&](int rb) {
    if (rb < b0) matvec_q<T, 1>(w0, n0, n_in, xq, xd, 1, y0, rb, split);
    else if (rb < b0 + b1) matvec_q<T, 1>(w1, n1, n_in, xq, xd, 1, y1, rb - b0, split);
    else matvec_q<T, 1>(w2, n2, n_in, xq, xd, 1, y2, rb - b0 - b1, split);
  });
}

#define MATVEC_MULTI(NAME, T)                                                                                   \
  extern "C" __global__ void __launch_bounds__(128)                                                            \
      NAME(const uint8_t* w0, int n0, float* y0, const uint8_t* w1, int n1, float* y1, const uint8_t* w2, int n2, \
           float* y2, int n_in, const int8_t* xq, const float* xd, int split) { \
    matvec_multi<T>(w0, n0, y0, w1, n1, y1, w2, n2, y2, n_in, xq, xd, split);                                  \
  }
MATVEC_MULTI(matvec_multi_q4_0, Q4_0)
MATVEC_MULTI(matvec_multi_q5_0, Q5_0)
MATVEC_MULTI(matvec_multi_q8_0, Q8_0)
MATVEC_MULTI(matvec_multi_mxfp4, MXFP4)
MATVEC_MULTI(matvec_multi_q4_k, Q4_K)
MATVEC_MULTI(matvec_multi_q5_k, Q5_K)
MATVEC_MULTI(matvec_multi_q6_k, Q6_K)
MATVEC_MULTI(matvec_multi_q4_0r, Q4_0R)
MATVEC_MULTI(matvec_multi_q8_0r, Q8_0R)
MATVEC_MULTI(matvec_multi_q4_kr, Q4_KR)
#include "matvec_pipe.cuh"
