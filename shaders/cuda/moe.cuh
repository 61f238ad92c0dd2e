// Mixture-of-experts layers (included by infer.cu after matmul.cuh): the router's choice on the
// device and matvecs indexed by expert id, as ggml's mul_mat_id. A token's k chosen experts are
// its k "slots" (slot s = token · k + rank); the ids never leave the GPU, so a decode step with
// experts is one CUDA graph like a dense one.
//   moe_route:  per token, softmax → top k (→ divided by their sum), or top k → softmax.
//   moe_group:  the slots sorted by expert, cut into tiles of up to 8 or 32 slots of one expert.
//   moe_mv_*:   one slot a grid row: its expert's matrix × its activation row (decode, small batches).
//   moe_mv8_*:  one tile a grid row: an expert's rows read once for up to 8 slots.
//   moe_mmq_*:  one tile a grid row on the tensor cores (matmul.cuh mmqn_tile): an expert's rows
//               read once for up to 8 or 32 gathered slots (prompts, batches), as ggml's
//               mul_mat_id with MMQ.
//   moe_sum:    out[t] = Σ_j w_j · y[t·k + j], in rank order.
#pragma once
#include "common.cuh"
#include "matmul.cuh"

/// Per token (block of 32 threads, blockIdx.x = token), as ts/model/moe.ts route computes it on
/// the host: gating 0 = a softmax over every logit (exp in f64 rounded to f32, the sum in f64, one
/// multiplication by its f32 inverse), the k largest probabilities (ties to the lower index),
/// with `norm` each divided by the f32 of their f64 sum (at least 2^-14, ggml's guard); gating 1 =
/// the k largest logits, then a softmax over those k (gpt-oss). Shared memory: n_expert floats.
extern "C" __global__ void __launch_bounds__(32) moe_route(const float* logits, int n_expert, int k, int gating,
                                                         int norm, int* ids, float* weights) {
  extern __shared__ float p[];
  pdl_begin();
  const int lane = threadIdx.x;
  const float* l = logits + static_cast<size_t>(blockIdx.x) * n_expert;
  int* id = ids + static_cast<size_t>(blockIdx.x) * k;
  float* wt = weights + static_cast<size_t>(blockIdx.x) * k;
  if (gating == 0) {
    float mx = -INFINITY;
    for (int i = lane; i < n_expert; i += 32) mx = fmaxf(mx, l[i]);
    mx = warp_max(mx);
    double sum = 0.0;
    for (int i = lane; i < n_expert; i += 32) {
      const float e = static_cast<float>(exp(static_cast<double>(l[i]) - static_cast<double>(mx)));
      p[i] = e;
      sum += e;
    }
    const float inverse = static_cast<float>(1.0 / warp_sum_d(sum));
    for (int i = lane; i < n_expert; i += 32) p[i] = __fmul_rn(p[i], inverse);
  } else {
    for (int i = lane; i < n_expert; i += 32) p[i] = l[i];
  }
  __syncwarp();
  // k passes of a warp argmax; the chosen one's value is taken out of the running.
  for (int j = 0; j < k; j++) {
    float best = -INFINITY;
    int at = n_expert;
    for (int i = lane; i < n_expert; i += 32) {
      if (p[i] > best || (at == n_expert && p[i] == best)) { best = p[i]; at = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float b = __shfl_xor_sync(FULL_MASK, best, o);
      const int i = __shfl_xor_sync(FULL_MASK, at, o);
      if (b > best || (b == best && i < at)) { best = b; at = i; }
    }
    if (lane == 0) {
      id[j] = at;
      wt[j] = best;
      p[at] = -INFINITY;
    }
    __syncwarp();
  }
  if (lane != 0) return;
  if (gating == 0 && norm) {
    double total = 0.0;
    for (int j = 0; j < k; j++) total += wt[j];
    const float divisor = fmaxf(static_cast<float>(total), 6.103515625e-5f);
    for (int j = 0; j < k; j++) wt[j] = __fdiv_rn(wt[j], divisor);
  } else if (gating == 1) {
    const float mx = wt[0];
    double sum = 0.0;
    for (int j = 0; j < k; j++) {
      wt[j] = static_cast<float>(exp(static_cast<double>(wt[j]) - static_cast<double>(mx)));
      sum += wt[j];
    }
    const float inverse = static_cast<float>(1.0 / sum);
    for (int j = 0; j < k; j++) wt[j] = __fmul_rn(wt[j], inverse);
  }
}

/// The slots of ids[0 .. n_slots) grouped by expert, for moe_mv8_* and moe_mmq_*: table[0] = the
/// number of tiles; tile i at table[1 + 3i] = {expert, first, count} (count ≤ tile_slots) indexes
/// the sorted slot list at table[1 + 3 · max_tiles ..], each expert's slots ascending (a warp an
/// expert, 32 slots a ballot). One block; shared memory: 2 · n_expert ints.
extern "C" __global__ void __launch_bounds__(1024) moe_group(const int* ids, int n_slots, int n_expert,
                                                           int tile_slots, int max_tiles, int* table) {
  extern __shared__ int counts[];
  int* offsets = counts + n_expert;
  pdl_begin();
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int s = threadIdx.x; s < n_slots; s += blockDim.x) atomicAdd(&counts[ids[s]], 1);
  __syncthreads();
  int* tiles = table + 1;
  int* list = table + 1 + 3 * max_tiles;
  if (threadIdx.x == 0) {
    int first = 0, n = 0;
    for (int e = 0; e < n_expert; e++) {
      offsets[e] = first;
      for (int c = 0; c < counts[e]; c += tile_slots) {
        tiles[3 * n] = e;
        tiles[3 * n + 1] = first + c;
        tiles[3 * n + 2] = min(tile_slots, counts[e] - c);
        n++;
      }
      first += counts[e];
    }
    table[0] = n;
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  for (int e = threadIdx.x >> 5; e < n_expert; e += blockDim.x >> 5) {
    int at = offsets[e];
    const int end = at + counts[e];
    for (int s0 = 0; s0 < n_slots && at < end; s0 += 32) {
      const int s = s0 + lane;
      const bool mine = s < n_slots && ids[s] == e;
      const unsigned m = __ballot_sync(FULL_MASK, mine);
      if (mine) list[at + __popc(m & ((1u << lane) - 1u))] = s;
      at += __popc(m);
    }
  }
}

/// One slot a grid row (blockIdx.y), one or two matrices (blockIdx.z: w0/y0, w1/y1, the gate and
/// up projections sharing their input): y[s] = W[ids[s]] · x[s / x_div] for the slot's expert,
/// rows summed as the one-token matvec sums them (matvec_rows, 2 rows a warp, `split` warps a
/// row). The expert is known only after the wait, so nothing is prefetched ahead of it.
template <class T>
__device__ __forceinline__ void moe_mv(const uint8_t* w0, const uint8_t* w1, long long expert_bytes, int n_expert,
                                       int n_out, int n_in, const int8_t* xq, const float* xd, int x_div,
                                       const int* ids, float* y0, float* y1, int split) {
  pdl_begin();
  const int s = blockIdx.y, e = ids[s];
  if (e < 0 || e >= n_expert) return;
  const uint8_t* w = (blockIdx.z == 0 ? w0 : w1) + static_cast<size_t>(e) * expert_bytes;
  float* y = (blockIdx.z == 0 ? y0 : y1) + static_cast<size_t>(s) * n_out;
  const size_t row = static_cast<size_t>(s / x_div);
  const int8_t* xr = xq + row * n_in;
  const float* dr = xd + row * (n_in >> 5);
  const int per_block = 8 / split;
  for_row_blocks((n_out + per_block - 1) / per_block, split,
                 [&](int rb) { matvec_rows<T, 2>(w, n_out, n_in, xr, dr, y, rb, split); });
}

/// One tile of moe_group's table a grid row (blockIdx.y; rows past the tile count return): its
/// expert's rows, a warp a row, each weight load shared by the tile's up to 8 slots, whose
/// activation rows are s / x_div and outputs y[s]. The units a lane sums, and their order, are
/// matvec_q's with split 1.
template <class T>
__device__ __forceinline__ void moe_mv8(const uint8_t* w0, const uint8_t* w1, long long expert_bytes, int n_out,
                                        int n_in, const int8_t* xq, const float* xd, int x_div, const int* table,
                                        int max_tiles, float* y0, float* y1) {
  pdl_begin();
  if (static_cast<int>(blockIdx.y) >= table[0]) return;
  const int* tile = table + 1 + 3 * blockIdx.y;
  const int e = tile[0], count = tile[2];
  const int* slots = table + 1 + 3 * max_tiles + tile[1];
  const int lane = threadIdx.x & 31, row = blockIdx.x * 4 + (threadIdx.x >> 5);
  if (row >= n_out) return;
  const int units = n_in >> 5;
  const size_t row_bytes = static_cast<size_t>(n_in / T::BV) * T::BB;
  const uint8_t* wr = (blockIdx.z == 0 ? w0 : w1) + static_cast<size_t>(e) * expert_bytes + row * row_bytes;
  float* y = blockIdx.z == 0 ? y0 : y1;
  int slot[8];
  size_t xrow[8];
#pragma unroll
  for (int t = 0; t < 8; t++) {
    slot[t] = slots[min(t, count - 1)];
    xrow[t] = static_cast<size_t>(slot[t] / x_div);
  }
  float acc[8], accm[8];
#pragma unroll
  for (int t = 0; t < 8; t++) acc[t] = accm[t] = 0.0f;
  constexpr int UB = 2;
  for (int u0 = lane; u0 < units; u0 += 32 * UB) {
    typename T::W wt[UB];
#pragma unroll
    for (int b = 0; b < UB; b++) T::load(wr, min(u0 + 32 * b, units - 1), wt[b]);
#pragma unroll
    for (int b = 0; b < UB; b++) {
      const int u = u0 + 32 * b;
      if (u >= units) continue;
#pragma unroll
      for (int t = 0; t < 8; t++) {
        if (t >= count) continue;
        const int4* xp = reinterpret_cast<const int4*>(xq + xrow[t] * n_in + 32 * u);
        const int4 a = xp[0], c = xp[1];
        const int x[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
        T::dot(wt[b], x, xd[xrow[t] * units + u], acc[t], accm[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < 8; t++) {
    const float v = warp_sum(acc[t]) - warp_sum(accm[t]);
    if (lane == 0 && t < count) y[static_cast<size_t>(slot[t]) * n_out + row] = v;
  }
}

/// One tile of moe_group's table (tiles of up to NTOK slots) a grid row (blockIdx.y; rows past
/// the tile count return), 64 of its expert's weight rows a block (blockIdx.x), matrix blockIdx.z
/// (w0/y0, w1/y1): mmqn_tile over the tile's slots, whose activation rows are s / x_div and
/// outputs y[s]. A slot's sums do not depend on its tile or the tile's other slots, so the
/// results do not depend on how the slots were grouped.
template <class T, int NTOK>
__device__ __forceinline__ void moe_mmq(const uint8_t* w0, const uint8_t* w1, long long expert_bytes, int n_out,
                                        int n_in, const int8_t* xq, const float* xd, int x_div, const int* table,
                                        int max_tiles, float* y0, float* y1) {
  __shared__ int x_rows[NTOK], y_rows[NTOK];
  pdl_begin();
  if (static_cast<int>(blockIdx.y) >= table[0]) return;
  const int* tile = table + 1 + 3 * blockIdx.y;
  const int e = tile[0], count = tile[2];
  const int* slots = table + 1 + 3 * max_tiles + tile[1];
  if (threadIdx.x < NTOK) {
    const int s = slots[min(static_cast<int>(threadIdx.x), count - 1)];
    x_rows[threadIdx.x] = s / x_div;
    y_rows[threadIdx.x] = s;
  }
  __syncthreads();
  const uint8_t* w = (blockIdx.z == 0 ? w0 : w1) + static_cast<size_t>(e) * expert_bytes;
  float* y = blockIdx.z == 0 ? y0 : y1;
  mmqn_tile<T, NTOK>(
      w, n_out, n_in, xq, xd, blockIdx.x * 64, 0, 0, n_in >> 5, count,
      [&](int t) { return x_rows[t]; },
      [&](int t, int r, float v) { y[static_cast<size_t>(y_rows[t]) * n_out + r] = v; });
}

#define MOE_MV(NAME, T)                                                                                        \
  extern "C" __global__ void __launch_bounds__(128)                                                            \
      moe_mv_##NAME(const uint8_t* w0, const uint8_t* w1, long long expert_bytes, int n_expert, int n_out,      \
                    int n_in, const int8_t* xq, const float* xd, int x_div, const int* ids, float* y0, float* y1, \
                    int split) {                                                                               \
    moe_mv<T>(w0, w1, expert_bytes, n_expert, n_out, n_in, xq, xd, x_div, ids, y0, y1, split);                  \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(128)                                                            \
      moe_mv8_##NAME(const uint8_t* w0, const uint8_t* w1, long long expert_bytes, int n_out, int n_in,         \
                     const int8_t* xq, const float* xd, int x_div, const int* table, int max_tiles, float* y0,   \
                     float* y1) {                                                                              \
    moe_mv8<T>(w0, w1, expert_bytes, n_out, n_in, xq, xd, x_div, table, max_tiles, y0, y1);                     \
  }                                                                                                            \
  MOE_MMQ(moe_mmq_##NAME##_n8, T, 8)                                                                           \
  MOE_MMQ(moe_mmq_##NAME##_n32, T, 32)
#define MOE_MMQ(NAME, T, NTOK)                                                                                 \
  extern "C" __global__ void __launch_bounds__(128)                                                            \
      NAME(const uint8_t* w0, const uint8_t* w1, long long expert_bytes, int n_out, int n_in, const int8_t* xq, \
           const float* xd, int x_div, const int* table, int max_tiles, float* y0, float* y1) {                 \
    moe_mmq<T, NTOK>(w0, w1, expert_bytes, n_out, n_in, xq, xd, x_div, table, max_tiles, y0, y1);               \
  }
MOE_MV(q4_0, Q4_0)
MOE_MV(q5_0, Q5_0)
MOE_MV(q8_0, Q8_0)
MOE_MV(mxfp4, MXFP4)
MOE_MV(q4_k, Q4_K)
MOE_MV(q5_k, Q5_K)
MOE_MV(q6_k, Q6_K)
MOE_MV(q4_0r, Q4_0R)
MOE_MV(q8_0r, Q8_0R)
MOE_MV(q4_kr, Q4_KR)

/// out[t][c] = ((w_0 · y[t·k][c]) + w_1 · y[t·k + 1][c]) + …, each product rounded to f32 and
/// added in rank order, as the host's scatterScaled and sumGroups compute it. With `bias` (gpt-oss's
/// down biases, a row of n_cols per expert), slot s's row is y[s] + bias[ids[s]] first, rounded as
/// the host's addBias rounds it.
extern "C" __global__ void moe_sum(const float* y, const float* weights, int k, int n_cols, long long n,
                                   const float* bias, const int* ids, float* out) {
  pdl_begin();
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long t = i / n_cols, c = i % n_cols;
    const float* w = weights + t * k;
    const float* r = y + t * k * n_cols + c;
    float acc = 0.0f;
    for (int j = 0; j < k; j++) {
      float v = r[static_cast<long long>(j) * n_cols];
      if (bias) v = __fadd_rn(v, bias[static_cast<long long>(ids[t * k + j]) * n_cols + c]);
      const float p = __fmul_rn(w[j], v);
      acc = j == 0 ? p : __fadd_rn(acc, p);
    }
    out[i] = acc;
  }
}

/// gpt-oss's clamped SwiGLU (ggml's swiglu_oai: alpha 1.702, limit 7), as lib/cpu/act.zig
/// swigluOai computes it: min(g, 7) / (1 + exp(1.702 · -min(g, 7))) · (clamp(u, ±7) + 1).
__device__ __forceinline__ float swiglu_oai(float g, float u) {
  const float x = fminf(g, 7.0f);
  const float y = fminf(fmaxf(u, -7.0f), 7.0f);
  const float glu = __fdiv_rn(x, __fadd_rn(1.0f, expf(__fmul_rn(1.702f, -x))));
  return __fmul_rn(glu, __fadd_rn(y, 1.0f));
}

/// out[i] = swiglu_oai(gate[i] + bg, up[i] + bu) over n values, rows of n_cols; with biases (a row
/// of n_cols per expert) bg and bu are row s's expert's, ids[s], each sum rounded as the host's
/// addBias rounds it; without (bias_gate null), the plain activation (Backend.swigluOaiMul).
extern "C" __global__ void moe_swiglu_oai(const float* gate, const float* up, const float* bias_gate,
                                          const float* bias_up, const int* ids, int n_cols, long long n,
                                          float* out) {
  pdl_begin();
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float g = gate[i], u = up[i];
  if (bias_gate) {
    const long long s = i / n_cols, c = i % n_cols;
    const long long at = static_cast<long long>(ids[s]) * n_cols + c;
    g = __fadd_rn(g, bias_gate[at]);
    u = __fadd_rn(u, bias_up[at]);
  }
  out[i] = swiglu_oai(g, u);
}

/// moe_swiglu_oai, then the product quantized for the down matvec (mode 0: one warp per 32
/// values; mode 1: a block of 256 threads per 256), as infer.cu's act_mul_q does for SiLU: the
/// decode step's graph fuses the two (ts/backend/cuda-fuse.ts), bit for bit.
extern "C" __global__ void moe_swiglu_oai_q(const float* gate, const float* up, int n_groups, float* out, int mode,
                                            int8_t* q, float* d, const float* bias_gate, const float* bias_up,
                                            const int* ids, int n_cols) {
  pdl_begin();
  const size_t i = mode == 0 ? static_cast<size_t>((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * 32 + (threadIdx.x & 31)
                             : static_cast<size_t>(blockIdx.x) * 256 + threadIdx.x;
  const int group = mode == 0 ? static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) >> 5) : blockIdx.x;
  if (group >= n_groups) return;
  float g = gate[i], u = up[i];
  if (bias_gate) {
    const size_t at = static_cast<size_t>(ids[i / n_cols]) * n_cols + i % n_cols;
    g = __fadd_rn(g, bias_gate[at]);
    u = __fadd_rn(u, bias_up[at]);
  }
  const float v = swiglu_oai(g, u);
  out[i] = v;
  if (mode == 0) quant_unit_q8_0(v, q + static_cast<size_t>(group) * 32, d + group);
  else quant_block_q8_k(v, q + static_cast<size_t>(blockIdx.x) * 256, d + static_cast<size_t>(blockIdx.x) * 8);
}
