// Attention for prompts (16+ rows, head_dim 64 or 128): flash attention on the tensor cores. A
// block takes 64 queries of one head (a warp each 16) and walks the union of their visible keys
// in tiles of 64: the tile's keys and values staged in shared memory, S = Q·Kᵀ by mma.sync
// m16n8k16 (f16 × f16 → f32, the query rounded to f16 as on the CPU), the causal / sliding-window
// mask, an online softmax per query row (running maximum and sum in f32), and O += P·V with the
// probabilities rounded to f16 (the C fragments of S are the A fragments of P: no shared-memory
// round trip). Nothing is written but the output: the per-head kernels (attn_scores_mma +
// attn_values_mma) wrote a score per query and key to scratch and read it back.
//
// Departure from the CPU arithmetic (lib/cpu/attention_f16.zig): the probabilities are
// exp(s - running max) rounded to f16 and divided by their sum at the end, where the CPU rounds
// exp(s - max) / sum; the output differs by that rounding (test/cuda.test.ts bounds it at 1e-3).
#pragma once
#include "common.cuh"

constexpr int PROMPT_QUERIES = 64;  // queries a block: 4 warps × 16
constexpr int PROMPT_KEYS = 64;     // keys a tile

__device__ __forceinline__ void mma_f16_16816_acc(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

/// Two 8×8 f16 matrices of shared memory, transposed into an m16n8k16 B fragment: lanes 0–15
/// name the rows (keys) k0 .. k0 + 15 of 8 consecutive dimensions.
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t& r0, uint32_t& r1, const __half* row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(a));
}

template <int D, bool QUANT>
__device__ __forceinline__ void attn_prompt_body(const float* q, const __half* kc, const __half* vc, const int* positions,
                                                 int n_tok, int n_head, int n_kv_head, int window, int cells, int ring,
                                                 float scale, float* out, int kt, int vt, const float* sinks) {
  constexpr int STRIDE = D + 8;  // halves per staged row: 16 bytes of padding keep fragment loads conflict-free
  constexpr int KD = D / 16;     // k-steps of Q·Kᵀ
  constexpr int ND = D / 8;      // 8-dimension n-tiles of the output
  __shared__ __align__(16) __half ks[PROMPT_KEYS * STRIDE];
  __shared__ __align__(16) __half vs[PROMPT_KEYS * STRIDE];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = lane >> 2, tig = lane & 3;
  const int t0 = blockIdx.x * PROMPT_QUERIES, h = blockIdx.y;
  const int kvh = h / (n_head / n_kv_head);
  const int nq = min(PROMPT_QUERIES, n_tok - t0);
  const int kv_dim = n_kv_head * D;
  // The block's keys: the union of its queries' visible ranges.
  int lo, hi;
  attn_tile_range(positions, t0, nq, window, lo, hi);
  // This lane's two query rows (16w + group, + 8) and their visible ranges.
  const int qa = t0 + warp * 16 + group, qb = qa + 8;
  int begin_a = 0, len_a = 0, begin_b = 0, len_b = 0;
  if (qa < n_tok) attn_range(positions, qa, window, begin_a, len_a);
  if (qb < n_tok) attn_range(positions, qb, window, begin_b, len_b);
  // Q fragments (f16), rows qa / qb, held for the whole walk.
  uint32_t qf[KD][4];
  {
    const float* ra = q + (static_cast<size_t>(min(qa, n_tok - 1)) * n_head + h) * D;
    const float* rb = q + (static_cast<size_t>(min(qb, n_tok - 1)) * n_head + h) * D;
#pragma unroll
    for (int kk = 0; kk < KD; kk++) {
      const int c = kk * 16 + 2 * tig;
      const float2 a0 = *reinterpret_cast<const float2*>(ra + c), a2 = *reinterpret_cast<const float2*>(ra + c + 8);
      const float2 b0 = *reinterpret_cast<const float2*>(rb + c), b2 = *reinterpret_cast<const float2*>(rb + c + 8);
      qf[kk][0] = pack_f16x2(a0.x, a0.y);
      qf[kk][1] = pack_f16x2(b0.x, b0.y);
      qf[kk][2] = pack_f16x2(a2.x, a2.y);
      qf[kk][3] = pack_f16x2(b2.x, b2.y);
    }
  }
  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  for (int k0 = lo; k0 < hi; k0 += PROMPT_KEYS) {
    __syncthreads();  // the previous tile is no longer read
    if constexpr (QUANT) {
      // Caches of types kt and vt (kv_quant.cuh): a thread dequantizes a block of 32 values of a
      // key or value row into the f16 tile.
      constexpr int BLOCKS = D / 32;
      for (int i = tid; i < PROMPT_KEYS * BLOCKS; i += 128) {
        const int r = i / BLOCKS, b = i % BLOCKS;
        const int j = k0 + r;
        __half* kd = ks + r * STRIDE + 32 * b;
        __half* vd = vs + r * STRIDE + 32 * b;
        if (j < hi) {
          const int cell = attn_cell(j, cells, ring);
          kv_block_to_f16(kv_head(kc, kt, cell, kv_dim, kvh, D) + kv_bytes(kt, 32 * b), kt, kd);
          kv_block_to_f16(kv_head(vc, vt, cell, kv_dim, kvh, D) + kv_bytes(vt, 32 * b), vt, vd);
        } else {
          kv_block_zero(kd);
          kv_block_zero(vd);
        }
      }
    } else {
    constexpr int CHUNKS = PROMPT_KEYS * D / 8;  // 16-byte pieces of the K (and V) tile
#pragma unroll
    for (int i = tid; i < CHUNKS; i += 128) {
      const int r = i / (D / 8), c = i % (D / 8);
      const int j = k0 + r;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;  // keys past hi: zeros (their P is 0, and 0 · V must not be NaN)
      if (j < hi) {
        const size_t off = static_cast<size_t>(attn_cell(j, cells, ring)) * kv_dim + kvh * D + 8 * c;
        kv = *reinterpret_cast<const uint4*>(kc + off);
        vv = *reinterpret_cast<const uint4*>(vc + off);
      }
      *reinterpret_cast<uint4*>(ks + r * STRIDE + 8 * c) = kv;
      *reinterpret_cast<uint4*>(vs + r * STRIDE + 8 * c) = vv;
    }
    }
    __syncthreads();
    // S (16 × 64) = Q · Kᵀ, 8 n-tiles of 8 keys.
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      const __half* kr = ks + (8 * n + group) * STRIDE + 2 * tig;
#pragma unroll
      for (int kk = 0; kk < KD; kk++) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + 16 * kk);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 16 * kk + 8);
        mma_f16_16816_acc(s[n], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b0, b1);
      }
    }
    // Scale and mask (key j of row a is visible for begin_a <= j < begin_a + len_a); row maxima.
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int n = 0; n < 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int j = k0 + 8 * n + 2 * tig + (e & 1);
        const bool row_b = e >= 2;
        const int b = row_b ? begin_b : begin_a, len = row_b ? len_b : len_a;
        const float v = (j >= b && j < b + len) ? s[n][e] * scale : -INFINITY;
        s[n][e] = v;
        if (row_b) mx_b = fmaxf(mx_b, v);
        else mx_a = fmaxf(mx_a, v);
      }
    }
    mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL_MASK, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(FULL_MASK, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL_MASK, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(FULL_MASK, mx_b, 2));
    const float new_a = fmaxf(m_a, mx_a), new_b = fmaxf(m_b, mx_b);
    // A row that has seen no visible key yet keeps everything at zero (base 0, exp(-inf) = 0).
    const float base_a = new_a == -INFINITY ? 0.0f : new_a, base_b = new_b == -INFINITY ? 0.0f : new_b;
    const float alpha_a = __expf(m_a - base_a), alpha_b = __expf(m_b - base_b);
    m_a = new_a;
    m_b = new_b;
    l_a *= alpha_a;
    l_b *= alpha_b;
#pragma unroll
    for (int n = 0; n < ND; n++) {
      o[n][0] *= alpha_a;
      o[n][1] *= alpha_a;
      o[n][2] *= alpha_b;
      o[n][3] *= alpha_b;
    }
    // P = exp(S - max) in f16; each k-step of 16 keys is two n-tiles of S, laid out as A.
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      float p[2][4];
#pragma unroll
      for (int half = 0; half < 2; half++) {
        const float* sv = s[2 * kk + half];
        p[half][0] = __half2float(__float2half_rn(__expf(sv[0] - base_a)));
        p[half][1] = __half2float(__float2half_rn(__expf(sv[1] - base_a)));
        p[half][2] = __half2float(__float2half_rn(__expf(sv[2] - base_b)));
        p[half][3] = __half2float(__float2half_rn(__expf(sv[3] - base_b)));
        l_a += p[half][0] + p[half][1];
        l_b += p[half][2] + p[half][3];
      }
      const uint32_t a0 = pack_f16x2(p[0][0], p[0][1]), a1 = pack_f16x2(p[0][2], p[0][3]);
      const uint32_t a2 = pack_f16x2(p[1][0], p[1][1]), a3 = pack_f16x2(p[1][2], p[1][3]);
      // O (16 × D) += P (16 × 16 keys) · V (16 keys × D).
      const __half* vr = vs + (16 * kk + (lane & 15)) * STRIDE;
#pragma unroll
      for (int n = 0; n < ND; n++) {
        uint32_t b0, b1;
        ldmatrix_x2_trans(b0, b1, vr + 8 * n);
        mma_f16_16816_acc(o[n], a0, a1, a2, a3, b0, b1);
      }
    }
  }
  // The rows' sums over the quad's columns, then O / l.
  l_a += __shfl_xor_sync(FULL_MASK, l_a, 1);
  l_a += __shfl_xor_sync(FULL_MASK, l_a, 2);
  l_b += __shfl_xor_sync(FULL_MASK, l_b, 1);
  l_b += __shfl_xor_sync(FULL_MASK, l_b, 2);
  float inv_a = 1.0f / l_a, inv_b = 1.0f / l_b;
  if (sinks) {
    // gpt-oss's sink: one more logit in the head's denominator, with no value (the maximum
    // raised to it where it is larger, the sum and outputs rescaled to that).
    const float sk = sinks[h];
    const float mxa = fmaxf(m_a, sk), mxb = fmaxf(m_b, sk);
    const float fa = expf(m_a - mxa), fb = expf(m_b - mxb);
    inv_a = fa / (l_a * fa + expf(sk - mxa));
    inv_b = fb / (l_b * fb + expf(sk - mxb));
  }
#pragma unroll
  for (int n = 0; n < ND; n++) {
    const int c = 8 * n + 2 * tig;
    if (qa < n_tok) {
      *reinterpret_cast<float2*>(out + (static_cast<size_t>(qa) * n_head + h) * D + c) =
          make_float2(o[n][0] * inv_a, o[n][1] * inv_a);
    }
    if (qb < n_tok) {
      *reinterpret_cast<float2*>(out + (static_cast<size_t>(qb) * n_head + h) * D + c) =
          make_float2(o[n][2] * inv_b, o[n][3] * inv_b);
    }
  }
}

#define ATTN_PROMPT(NAME, D)                                                                                    \
  extern "C" __global__ void __launch_bounds__(128)                                                            \
      NAME(const float* q, const __half* kc, const __half* vc, const int* positions, int n_tok, int n_head,     \
           int n_kv_head, int window, int cells, int ring, float scale, float* out, const float* sinks) {      \
    pdl_begin();                                                                                                \
    attn_prompt_body<D, false>(q, kc, vc, positions, n_tok, n_head, n_kv_head, window, cells, ring, scale, out, \
                               KV_F16, KV_F16, sinks);                                                          \
  }
ATTN_PROMPT(attn_prompt_d64, 64)
ATTN_PROMPT(attn_prompt_d128, 128)

// The same over caches of types kt and vt (kv_quant.cuh; either may be f16).
#define ATTN_PROMPT_Q(NAME, D)                                                                                  \
  extern "C" __global__ void __launch_bounds__(128)                                                            \
      NAME(const float* q, const __half* kc, const __half* vc, const int* positions, int n_tok, int n_head,     \
           int n_kv_head, int window, int cells, int ring, float scale, float* out, int kt, int vt,             \
           const float* sinks) {                                                                                \
    pdl_begin();                                                                                                \
    attn_prompt_body<D, true>(q, kc, vc, positions, n_tok, n_head, n_kv_head, window, cells, ring, scale, out,  \
                              kt, vt, sinks);                                                                   \
  }
ATTN_PROMPT_Q(attn_prompt_q_d64, 64)
ATTN_PROMPT_Q(attn_prompt_q_d128, 128)
