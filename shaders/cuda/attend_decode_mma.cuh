// Decode attention on the tensor cores (head_dim 64 or 128, up to 8 query heads a KV head; the
// plan in lib/cuda/attention.zig says where it runs). Flash-decoding as attn_decode_g*: a block
// takes one KV head of one row and one split of its visible keys (decode_span: whole 128-key
// tiles), and all G query heads that share that KV head, so each key and value row is read from
// memory once a group. What differs is how a tile is computed and how its bytes arrive:
//   - the tile's key and value rows are copied into shared memory by cp.async, and for every row
//     an earlier step wrote (all but the newest) the copy is issued before the kernel waits for
//     the kernel ahead of it: the DRAM round trip of the cache overlaps that kernel, and bytes in
//     flight cost shared memory, not registers (attn_decode_g* holds a key row a thread in
//     registers: 255 a thread, two blocks fill a multiprocessor's register file, so they cannot
//     start until it is empty; bench/results/cuda.md);
//   - the G heads are the rows of an m16n8k16 A operand (rows G..15 zero): each of the 4 warps
//     takes 32 keys of the tile, S = Q·Kᵀ and O += P·V are 32 mma.sync each, and the warp keeps
//     its own online softmax (running maximum and sum a head), so a tile has one barrier (its
//     bytes have arrived) instead of one a phase; the warps are combined once, at the end.
// The splits are combined by the last block to finish, which quantizes the o-projection's input
// (decode_combine_last, as attn_decode_g*); a single split writes and quantizes its own output.
//
// Departure from the CPU arithmetic (lib/cpu/attention_f16.zig): the products are summed by the
// tensor cores in f32 in their own order, and the probabilities are exp(s - running maximum)
// rounded to f16 (the A operand of P·V) and divided by the sum of those rounded values at the
// end, as the prompt kernels do (attend_prompt.cuh); test/cuda.test.ts bounds the outputs at 1e-3.
#pragma once
#include "attend_decode.cuh"
#include "attend_prompt.cuh"

constexpr int MMA_DECODE_WARPS = 4;
constexpr int MMA_DECODE_KEYS = DECODE_TILE / MMA_DECODE_WARPS;  // keys a warp takes a tile: 32

/// Halves a staged row takes: 16 bytes of padding keep the fragment loads conflict-free.
template <int D>
__host__ __device__ constexpr int mma_decode_stride() {
  return D + 8;
}

/// Dynamic shared memory of attn_decode_mma_d<D>: a tile of key rows and one of value rows.
template <int D>
__host__ __device__ constexpr int mma_decode_shared_bytes() {
  return 2 * DECODE_TILE * mma_decode_stride<D>() * 2;
}

/// Rows [r0, r1) of the tile from key index `tile` of the span: cp.async of each 16-byte piece of
/// the key and value rows that exist, zeros for rows past the span's keys (their probability is
/// 0, and 0 · V must not be NaN from whatever the shared memory held).
template <int D>
__device__ __forceinline__ void mma_decode_stage(const DecodeSpan& span, int tile, int r0, int r1, int kv_dim,
                                                 int cells, int ring, __half* ks, __half* vs) {
  constexpr int STRIDE = mma_decode_stride<D>();
  constexpr int PIECES = D / 8;
  for (int i = r0 * PIECES + threadIdx.x; i < r1 * PIECES; i += blockDim.x) {
    const int r = i / PIECES, c = i % PIECES;
    const int j = tile + r;
    __half* kd = ks + r * STRIDE + 8 * c;
    __half* vd = vs + r * STRIDE + 8 * c;
    if (j < span.s1) {
      const size_t off = static_cast<size_t>(attn_cell(span.begin + j, cells, ring)) * kv_dim + span.kvh * D + 8 * c;
      cp_async16(kd, span.kc + off);
      cp_async16(vd, span.vc + off);
    } else {
      *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
    }
  }
}

/// Bytes of a tile's rows of one head in a quantized cache's blocks (the larger, Q8_0's): where
/// attn_decode_mma_q_d<D> stages them before they are dequantized into the f16 tile.
template <int D>
__host__ __device__ constexpr int mma_decode_raw_bytes() {
  return DECODE_TILE * kv_bytes(KV_Q8_0, D);
}

/// Dynamic shared memory of attn_decode_mma_q_d<D>: the f16 tiles and a staging tile of blocks
/// for each of K and V.
template <int D>
__host__ __device__ constexpr int mma_decode_q_shared_bytes() {
  return mma_decode_shared_bytes<D>() + 2 * mma_decode_raw_bytes<D>();
}

/// cp.async of 4, 8 or 16 bytes (.ca: the sizes under 16 take it).
template <int N>
__device__ __forceinline__ void cp_async_ca(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(s), "l"(gmem), "n"(N) : "memory");
}

/// mma_decode_stage for one side (K or V) of type `type`: an f16 side straight into its f16 tile
/// (as mma_decode_stage), a quantized one's head bytes into its staging tile `raw` (a row every
/// kv_bytes(type, D) bytes) by cp.async in the largest pieces the head's size allows (a head of
/// 64 or 128 values is 68, 136, 36 or 72 bytes: 4 or 8; each head starts at a multiple of its
/// size). mma_decode_unpack makes the f16 tile of it.
template <int D>
__device__ __forceinline__ void mma_decode_stage_side(const DecodeSpan& span, const void* cache, int type, int tile,
                                                      int r0, int r1, int kv_dim, int cells, int ring, __half* tile16,
                                                      uint8_t* raw) {
  constexpr int STRIDE = mma_decode_stride<D>();
  const int hb = kv_bytes(type, D);
  const int piece = type == KV_F16 ? 16 : (hb % 8 == 0 ? 8 : 4);
  const int pieces = hb / piece;
  for (int i = r0 * pieces + threadIdx.x; i < r1 * pieces; i += blockDim.x) {
    const int r = i / pieces, c = i % pieces;
    const int j = tile + r;
    if (type == KV_F16) {
      __half* dst = tile16 + r * STRIDE + 8 * c;
      if (j < span.s1) cp_async16(dst, kv_head(cache, type, attn_cell(span.begin + j, cells, ring), kv_dim, span.kvh, D) + 16 * c);
      else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    } else if (j < span.s1) {
      const uint8_t* src = kv_head(cache, type, attn_cell(span.begin + j, cells, ring), kv_dim, span.kvh, D) + piece * c;
      uint8_t* dst = raw + r * hb + piece * c;
      if (piece == 8) cp_async_ca<8>(dst, src);
      else cp_async_ca<4>(dst, src);
    }
  }
}

/// The quantized sides' staging tiles (arrived: after cp_async_wait and a barrier) dequantized
/// into their f16 tiles, a thread a block of 32 values; rows past the span's keys zero.
template <int D>
__device__ __forceinline__ void mma_decode_unpack(const DecodeSpan& span, int tile, int kt, int vt, __half* ks,
                                                  __half* vs, const uint8_t* kraw, const uint8_t* vraw) {
  constexpr int STRIDE = mma_decode_stride<D>();
  constexpr int BLOCKS = D / 32;
  for (int i = threadIdx.x; i < DECODE_TILE * BLOCKS; i += blockDim.x) {
    const int r = i / BLOCKS, b = i % BLOCKS;
    const bool live = tile + r < span.s1;
    if (kt != KV_F16) {
      __half* dst = ks + r * STRIDE + 32 * b;
      if (live) kv_block_to_f16(kraw + r * kv_bytes(kt, D) + kv_bytes(kt, 32 * b), kt, dst);
      else kv_block_zero(dst);
    }
    if (vt != KV_F16) {
      __half* dst = vs + r * STRIDE + 32 * b;
      if (live) kv_block_to_f16(vraw + r * kv_bytes(vt, D) + kv_bytes(vt, 32 * b), vt, dst);
      else kv_block_zero(dst);
    }
  }
}

/// The tile's rows [r0, r1) of both sides: mma_decode_stage for f16 caches (QUANT false), else
/// mma_decode_stage_side for each.
template <int D, bool QUANT>
__device__ __forceinline__ void mma_decode_stage_kv(const DecodeSpan& span, int tile, int r0, int r1, int kv_dim,
                                                    int cells, int ring, __half* ks, __half* vs, int kt, int vt,
                                                    uint8_t* kraw, uint8_t* vraw) {
  if constexpr (QUANT) {
    mma_decode_stage_side<D>(span, span.kc, kt, tile, r0, r1, kv_dim, cells, ring, ks, kraw);
    mma_decode_stage_side<D>(span, span.vc, vt, tile, r0, r1, kv_dim, cells, ring, vs, vraw);
  } else {
    mma_decode_stage<D>(span, tile, r0, r1, kv_dim, cells, ring, ks, vs);
  }
}

template <int D, bool QUANT>
__device__ __forceinline__ void attn_decode_mma_body(const float* q, const __half* kc, const __half* vc,
                                                     const unsigned long long* kv_table, const int* positions,
                                                     int n_head, int n_kv_head, int window, int cells, int ring,
                                                     float scale, int n_split, float* out, float* part_ml,
                                                     float* partial, unsigned int* arrived, int qmode, int8_t* xq,
                                                     float* xd, int kt, int vt, const float* sinks) {
  constexpr int STRIDE = mma_decode_stride<D>();
  constexpr int KD = D / 16;  // k-steps of Q·Kᵀ
  constexpr int ND = D / 8;   // 8-dimension n-tiles of the output
  constexpr int W = MMA_DECODE_WARPS;
  extern __shared__ __align__(16) unsigned char mma_decode_smem[];
  __half* ks = reinterpret_cast<__half*>(mma_decode_smem);
  __half* vs = ks + DECODE_TILE * STRIDE;
  uint8_t* kraw = reinterpret_cast<uint8_t*>(vs + DECODE_TILE * STRIDE);  // QUANT only
  uint8_t* vraw = kraw + mma_decode_raw_bytes<D>();
  __shared__ float warp_m[W][8], warp_l[W][8];
  const DecodeSpan span = decode_span(kc, vc, kv_table, positions, n_kv_head, window, n_split);
  if (span.split >= span.active) return;  // no keys: the whole block, before any wait
  const int kv_dim = n_kv_head * D;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = lane >> 2, tig = lane & 3;  // this lane's head (row of S and O) and column pair
  const int G = n_head / n_kv_head;

  // The first tile's rows that earlier steps wrote, before the wait: with one row of one sequence
  // (batch-1 decode) the kernel ahead (the KV store) writes only position positions[0], the
  // newest; rows of a batch or of other sequences are copied after the wait.
  const int first_n = min(DECODE_TILE, span.s1 - span.s0);
  int early_rows = 0;
  if (kv_table == nullptr && gridDim.x == static_cast<unsigned>(n_kv_head))
    early_rows = max(0, min(first_n, positions[0] - span.begin - span.s0));
  mma_decode_stage_kv<D, QUANT>(span, span.s0, 0, early_rows, kv_dim, cells, ring, ks, vs, kt, vt, kraw, vraw);
  pdl_begin();
  mma_decode_stage_kv<D, QUANT>(span, span.s0, early_rows, DECODE_TILE, kv_dim, cells, ring, ks, vs, kt, vt, kraw,
                                vraw);
  cp_async_commit();

  // The query rows (f16, as the CPU rounds them) as A fragments held for the whole walk: row
  // `group` is head h0 + group, rows 8..15 (a1, a3) zero.
  const int h0 = span.kvh * G;
  const size_t row0 = static_cast<size_t>(span.t) * n_head + h0;  // the group's first query row
  uint32_t qa[KD][2];
  {
    const float* qr = q + (row0 + min(group, G - 1)) * D;
#pragma unroll
    for (int kk = 0; kk < KD; kk++) {
      const int c = kk * 16 + 2 * tig;
      const float2 lo = *reinterpret_cast<const float2*>(qr + c), hi = *reinterpret_cast<const float2*>(qr + c + 8);
      qa[kk][0] = group < G ? pack_f16x2(lo.x, lo.y) : 0u;
      qa[kk][1] = group < G ? pack_f16x2(hi.x, hi.y) : 0u;
    }
  }
  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // this warp's running maximum of row `group`, this lane's sum

  for (int tile = span.s0; tile < span.s1; tile += DECODE_TILE) {
    if (tile != span.s0) {  // a split of several tiles: the next one once every warp is done
      __syncthreads();
      mma_decode_stage_kv<D, QUANT>(span, tile, 0, DECODE_TILE, kv_dim, cells, ring, ks, vs, kt, vt, kraw, vraw);
      cp_async_commit();
    }
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (QUANT) {
      mma_decode_unpack<D>(span, tile, kt, vt, ks, vs, kraw, vraw);
      __syncthreads();
    }
    const int k0 = warp * MMA_DECODE_KEYS;  // the warp's keys in the tile
    if (tile + k0 >= span.s1) continue;     // none (the last tile of a span)
    // S (16 × 32) = Q · Kᵀ: 4 n-tiles of 8 keys.
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      const __half* kr = ks + (k0 + 8 * n + group) * STRIDE + 2 * tig;
#pragma unroll
      for (int kk = 0; kk < KD; kk++) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + 16 * kk);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 16 * kk + 8);
        mma_f16_16816_acc(s[n], qa[kk][0], 0u, qa[kk][1], 0u, b0, b1);
      }
    }
    // Scale, mask the keys past the span, the row's maximum over the quad's 32 keys.
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < 4; n++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int j = tile + k0 + 8 * n + 2 * tig + e;
        s[n][e] = j < span.s1 ? s[n][e] * scale : -INFINITY;
        mx = fmaxf(mx, s[n][e]);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
    const float mn = fmaxf(m, mx);  // finite: the warp has a key here
    const float alpha = ggml_expf(m - mn);  // 0 on the warp's first keys (m = -inf)
    m = mn;
    l *= alpha;
#pragma unroll
    for (int n = 0; n < ND; n++) {
      o[n][0] *= alpha;
      o[n][1] *= alpha;
    }
    // P = exp(S - m) in f16; each k-step of 16 keys is two n-tiles of S, laid out as A.
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        p[e] = __half2float(__float2half_rn(ggml_expf(s[2 * kk + (e >> 1)][e & 1] - mn)));
        l += p[e];
      }
      const uint32_t a0 = pack_f16x2(p[0], p[1]), a2 = pack_f16x2(p[2], p[3]);
      // O (16 × D) += P (16 × 16 keys) · V (16 keys × D).
      const __half* vr = vs + (k0 + 16 * kk + (lane & 15)) * STRIDE;
#pragma unroll
      for (int n = 0; n < ND; n++) {
        uint32_t b0, b1;
        ldmatrix_x2_trans(b0, b1, vr + 8 * n);
        mma_f16_16816_acc(o[n], a0, 0u, a2, 0u, b0, b1);
      }
    }
  }

  // The warps' results combined: each warp's maximum and sum a head, then its outputs rescaled
  // to the block's maximum into shared memory (the key tile's, no longer read), summed in warp order.
  l += __shfl_xor_sync(FULL_MASK, l, 1);
  l += __shfl_xor_sync(FULL_MASK, l, 2);
  if (tig == 0) {
    warp_m[warp][group] = m;
    warp_l[warp][group] = l;
  }
  __syncthreads();  // also: every warp is done with the tiles
  float* red = reinterpret_cast<float*>(ks);  // [W][8][D]
  float* staging = reinterpret_cast<float*>(vs);
  if (group < G) {
    float mb = warp_m[0][group];
#pragma unroll
    for (int w = 1; w < W; w++) mb = fmaxf(mb, warp_m[w][group]);
    const float f = m == -INFINITY ? 0.0f : ggml_expf(m - mb);
#pragma unroll
    for (int n = 0; n < ND; n++)
      *reinterpret_cast<float2*>(red + (warp * 8 + group) * D + 8 * n + 2 * tig) = make_float2(o[n][0] * f, o[n][1] * f);
  }
  __syncthreads();
  const bool single = span.active == 1;
  for (int i = tid; i < G * D; i += blockDim.x) {
    const int g = i / D, dim = i % D;
    float mb = warp_m[0][g];
#pragma unroll
    for (int w = 1; w < W; w++) mb = fmaxf(mb, warp_m[w][g]);
    float sum = 0.0f, o_sum = 0.0f;
#pragma unroll
    for (int w = 0; w < W; w++) {
      sum += warp_m[w][g] == -INFINITY ? 0.0f : warp_l[w][g] * ggml_expf(warp_m[w][g] - mb);
      o_sum += red[(w * 8 + g) * D + dim];
    }
    if (single && sinks) {
      // gpt-oss's sink (attend_decode.cuh decode_combine_last): one more logit in the denominator.
      const float sk = sinks[h0 + g], mx = fmaxf(mb, sk), f = ggml_expf(mb - mx);
      const float v = (o_sum * f) / (sum * f + ggml_expf(sk - mx));
      out[(row0 + g) * D + dim] = v;
      staging[i] = v;
    } else if (single) {
      out[(row0 + g) * D + dim] = o_sum / sum;
      staging[i] = o_sum / sum;
    } else {
      partial[((row0 + g) * n_split + span.split) * D + dim] = o_sum;
      if (dim == 0) {
        part_ml[((row0 + g) * n_split + span.split) * 2] = mb;
        part_ml[((row0 + g) * n_split + span.split) * 2 + 1] = sum;
      }
    }
  }
  if (single) {
    quantize_group(staging, G * D, qmode, xq, xd, row0 * D);
    return;
  }
  decode_combine_last<DECODE_GROUP_MAX>(G, D, n_split, span.active, span.t * n_kv_head + span.kvh, row0, part_ml,
                                        partial, arrived, out, staging, qmode, xq, xd, sinks ? sinks + h0 : nullptr);
}

#define ATTN_DECODE_MMA(NAME, D)                                                                               \
  extern "C" __global__ void __launch_bounds__(MMA_DECODE_WARPS * 32)                                          \
      NAME(const float* q, const __half* kc, const __half* vc, const unsigned long long* kv_table,             \
           const int* positions, int n_head, int n_kv_head, int head_dim, int window, int cells, int ring,     \
           float scale, int n_split, float* out, float* part_ml, float* partial, unsigned int* arrived,        \
           int qmode, int8_t* xq, float* xd, const float* sinks) {                                             \
    (void)head_dim; /* D: the launch checked it */                                                             \
    attn_decode_mma_body<D, false>(q, kc, vc, kv_table, positions, n_head, n_kv_head, window, cells, ring,     \
                                   scale, n_split, out, part_ml, partial, arrived, qmode, xq, xd, KV_F16,      \
                                   KV_F16, sinks);                                                             \
  }
ATTN_DECODE_MMA(attn_decode_mma_d64, 64)
ATTN_DECODE_MMA(attn_decode_mma_d128, 128)

// The same over caches of types kt and vt (kv_quant.cuh; either may be f16): each tile's blocks
// staged by cp.async, then dequantized into the f16 tiles the products read.
#define ATTN_DECODE_MMA_Q(NAME, D)                                                                             \
  extern "C" __global__ void __launch_bounds__(MMA_DECODE_WARPS * 32)                                          \
      NAME(const float* q, const __half* kc, const __half* vc, const unsigned long long* kv_table,             \
           const int* positions, int n_head, int n_kv_head, int head_dim, int window, int cells, int ring,     \
           float scale, int n_split, float* out, float* part_ml, float* partial, unsigned int* arrived,        \
           int qmode, int8_t* xq, float* xd, int kt, int vt, const float* sinks) {                             \
    (void)head_dim; /* D: the launch checked it */                                                             \
    attn_decode_mma_body<D, true>(q, kc, vc, kv_table, positions, n_head, n_kv_head, window, cells, ring,      \
                                  scale, n_split, out, part_ml, partial, arrived, qmode, xq, xd, kt, vt, sinks); \
  }
ATTN_DECODE_MMA_Q(attn_decode_mma_q_d64, 64)
ATTN_DECODE_MMA_Q(attn_decode_mma_q_d128, 128)
