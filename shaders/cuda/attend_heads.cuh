// The per-query-head attention kernels of infer.cu (included there, in this order): attn_scores +
// attn_values for rows the one-pass kernels do not take (a group of more than 8 query heads, a
// head_dim that is not a multiple of 8 or is over 256), and their tensor-core forms for prompts
// whose head_dim attn_prompt_* does not take (Gemma 3's 256: attn_scores_mma + attn_values_mma),
// which follow the CPU backend's three-step arithmetic. attn_row, attn_range and attn_cell serve the one-pass kernels too.
#pragma once
#include "common.cuh"

// ---- attention ---------------------------------------------------------------------------------
// Two launches, each over (query row = token * n_head + head, split of the visible keys):
//   attn_scores   s_j = scale * (f16(q) · K_j) for the split's keys into scores[row][j - begin],
//                 and the split's max
//   attn_values   M = max of the splits' maxima, S = Σ_j ggml_expf(s_j - M) over all visible keys
//                 (f64), p_j = f16(ggml_expf(s_j - M) * (float)(1/S)); the split's Σ p_j V_j;
//                 with n_split > 1 the row's last split to finish sums the splits in order
// which is lib/cpu/attention_f16.zig's arithmetic (llama.cpp's CPU graph) in another summation
// order. kt and vt are the caches' types (kv_quant.cuh: a quantized cache is read value by value,
// q rounded to f16 as for an f16 one). A query at position p sees keys max(0, p + 1 - window) .. p (all of them: window 0).

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
                int n_split, int kt) {
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
    const int cell = attn_cell(r.begin + jj, cells, ring);
    float s = 0.0f;
    if (kt == KV_F16) {
      const __half* kr = kc + static_cast<size_t>(cell) * kv_dim + r.kvh * head_dim;
#pragma unroll 4
      for (int d = lane; d < head_dim; d += 32) s = __fmaf_rn(__half2float(kr[d]), qs[d], s);
    } else {  // a quantized cache (kv_quant.cuh), value by value
      const uint8_t* kr = kv_head(kc, kt, cell, kv_dim, r.kvh, head_dim);
      for (int d = lane; d < head_dim; d += 32) s = __fmaf_rn(kv_at(kr, kt, d, head_dim), qs[d], s);
    }
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
                                                  int head_dim, int cells, int ring, int n_split, float* dst,
                                                  int vt, const float* sinks) {
  __shared__ float ps[ATTN_TILE];
  __shared__ float red[ATTN_THREADS * 4];
  const int G = head_dim <= ATTN_THREADS ? ATTN_THREADS / head_dim : 1;
  const int g = head_dim <= ATTN_THREADS ? threadIdx.x / head_dim : 0;
  const int d0 = head_dim <= ATTN_THREADS ? threadIdx.x % head_dim : threadIdx.x;
  float M = -INFINITY;
#pragma unroll 8
  for (int s = 0; s < n_split; s++) M = fmaxf(M, split_max[static_cast<size_t>(r.row) * n_split + s]);
  // gpt-oss's sink: one more logit in the denominator, with no value (lib/cpu/attention.zig).
  if (sinks) M = fmaxf(M, sinks[r.h]);
  const float* sr = scores + static_cast<size_t>(r.row) * score_stride;
  double sum = sinks && threadIdx.x == 0 ? static_cast<double>(ggml_expf(sinks[r.h] - M)) : 0.0;
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
    if (g < G && vt != KV_F16) {  // a quantized cache (kv_quant.cuh), value by value
      for (int i = g; i < tn; i += G) {
        const uint8_t* vr = kv_head(vc, vt, attn_cell(r.begin + tile + i, cells, ring), kv_dim, r.kvh, head_dim);
        const float p = ps[i];
#pragma unroll
        for (int k = 0; k < 4; k++) {
          const int d = d0 + k * ATTN_THREADS;
          if ((head_dim > ATTN_THREADS || k == 0) && d < head_dim) acc[k] = __fmaf_rn(p, kv_at(vr, vt, d, head_dim), acc[k]);
        }
      }
    } else if (g < G) {
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
                int n_split, float* out, float* partial, unsigned int* arrived, int vt, const float* sinks) {
  pdl_begin();
  const AttnRow r = attn_row(positions, n_head, n_kv_head, window, n_split);
  float* dst = n_split == 1 ? out + static_cast<size_t>(r.row) * head_dim
                            : partial + (static_cast<size_t>(r.row) * n_split + blockIdx.y) * head_dim;
  if (r.s0 >= r.s1) {  // an empty split (short context): contributes zeros
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) dst[d] = 0.0f;
  } else {
    attn_values_split(r, scores, score_stride, split_max, vc, n_kv_head, head_dim, cells, ring, n_split, dst, vt,
                      sinks);
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
