// Attention for a few query rows (decode, batches under 16 rows) where attn_decode_w
// (attend_warps.cuh, a block per query head) does not run: flash-decoding. A block takes
// one KV head of one row and one split of its visible keys, and all G query heads that share that
// KV head, so each key and value row is read once per group rather than once per query head. Per
// tile of 128 keys: a thread scores one key for the G heads (16-byte loads of the f16 key row,
// the query rounded to f16 as on the CPU), the tile's maximum rescales the running sums (online
// softmax), and the threads then sum p_j V_j, each owning 8 dimensions of one V row of a key
// group. A split writes its unnormalised output with its maximum and sum of exponentials; the
// split that finishes last combines them in split order (attn_combine_last's pattern).
//
// With a table (kv_table != null, the server's batched decode), row t reads its own sequence's
// cache at kv_table[2t] (keys) and kv_table[2t + 1] (values), so one launch serves every
// sequence of the batch; kc and vc are then unused.
//
// Departure from the CPU arithmetic (lib/cpu/attention_f16.zig, which the other attention kernels
// follow): the probabilities stay f32 rather than being rounded to f16 after a global max and
// sum, which one pass cannot know; the output differs from the CPU's by that rounding, about
// 1e-4 of its scale (test/cuda.test.ts bounds it at 1e-3).
#pragma once
#include "common.cuh"

constexpr int DECODE_THREADS = 128;
constexpr int DECODE_TILE = 128;           // keys scored per tile: one a thread
constexpr int DECODE_HEAD_DIM_MAX = 256;   // head_dim a multiple of 8 up to this
constexpr int DECODE_GROUP_MAX = 8;        // query heads per KV head
constexpr int DECODE_VEARLY = 16;          // value rows a thread requests before the softmax
constexpr int DECODE_VROWS = 4;            // value rows in flight past those (head_dim > 128)

__device__ __forceinline__ void unpack_half8(const uint4& raw, float (&v)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 f = __half22float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

/// What a block of attn_decode_* attends: row t's KV head kvh, the keys [s0, s1) of its split
/// among the visible ones (from position `begin`), in the caches kc and vc (the row's own, from
/// the table, when there is one). `active`: the row's splits that have keys (the first ones;
/// the others return at once, and the active ones combine among themselves).
struct DecodeSpan {
  int t, kvh, split, begin, s0, s1, active;
  const __half* kc;
  const __half* vc;
};

/// The span of row t's KV head kvh (attn_decode_w's blocks take one query head of it).
__device__ __forceinline__ DecodeSpan decode_span_at(int t, int kvh, const __half* kc, const __half* vc,
                                                     const unsigned long long* kv_table, const int* positions,
                                                     int window, int n_split) {
  DecodeSpan r;
  r.t = t;
  r.kvh = kvh;
  r.split = blockIdx.y;
  r.kc = kv_table != nullptr ? reinterpret_cast<const __half*>(kv_table[2 * r.t]) : kc;
  r.vc = kv_table != nullptr ? reinterpret_cast<const __half*>(kv_table[2 * r.t + 1]) : vc;
  const int p = positions[r.t];
  r.begin = (window > 0 && p + 1 > window) ? p + 1 - window : 0;
  const int len = p + 1 - r.begin;
  // Whole 128-key tiles a split: a split of len / n_split keys a little over a tile would take a
  // second pass of the kernel's chain of round trips and barriers for a sliver of keys (at 4,100
  // to 4,224 keys over 32 splits, every split did). The splits past the last tile are empty.
  const int tiles = (len + DECODE_TILE - 1) / DECODE_TILE;
  const int per = (tiles + n_split - 1) / n_split;
  const int chunk = per * DECODE_TILE;
  r.active = (tiles + per - 1) / per;
  r.s0 = min(len, r.split * chunk);
  r.s1 = min(len, r.s0 + chunk);
  return r;
}

__device__ __forceinline__ DecodeSpan decode_span(const __half* kc, const __half* vc,
                                                  const unsigned long long* kv_table, const int* positions,
                                                  int n_kv_head, int window, int n_split) {
  return decode_span_at(blockIdx.x / n_kv_head, blockIdx.x % n_kv_head, kc, vc, kv_table, positions, window,
                        n_split);
}

/// With qmode >= 0, the group's n outputs (staged in shared memory by every thread of the block,
/// at the row's flat index base) quantized as the quantize kernel that would follow quantizes
/// them (mode 0: Q8_0 units, 1: Q8_K superblocks; lib/cuda/attention.zig checks that n and base are
/// whole units): the o-projection's input written by the attention itself, one kernel fewer a
/// layer. The same quant_unit_q8_0 / quant_super_q8_k, so the same bytes.
__device__ __forceinline__ void quantize_group(const float* vals, int n, int qmode, int8_t* xq, float* xd,
                                               size_t base) {
  if (qmode < 0) return;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (qmode == 0) {
    for (int u = warp; u < (n >> 5); u += warps) quant_unit_q8_0(vals[u * 32 + lane], xq + base + u * 32, xd + base / 32 + u);
  } else {
    for (int sb = warp; sb < (n >> 8); sb += warps) {
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; k++) v[k] = vals[sb * 256 + lane + 32 * k];
      quant_super_q8_k(v, xq + base + sb * 256, xd + base / 32 + sb * 8);
    }
  }
}

/// With more than one split with keys (n_active of the launch's n_split, which lays out the
/// partials), after a block wrote its split's partial outputs (unnormalised, with the split's
/// maximum and sum of exponentials in part_ml): the split that finishes last for this group
/// (counted in arrived[group]) combines them in split order (attn_combine_last's pattern),
/// writes the outputs, quantizes them where qmode asks, and leaves the counter zero. `staging`:
/// G * head_dim floats of shared memory the block no longer reads.
template <int GM>
__device__ __forceinline__ void decode_combine_last(int G, int head_dim, int n_split, int n_active, int group, size_t row0,
                                                    const float* part_ml, const float* partial,
                                                    unsigned int* arrived, float* out, float* staging, int qmode,
                                                    int8_t* xq, float* xd, const float* sinks = nullptr) {
  __shared__ bool last;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  __threadfence();  // this thread's partial values before the count
  __syncthreads();
  if (tid == 0) last = atomicAdd(arrived + group, 1u) == static_cast<unsigned int>(n_active - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  INFER_BLOCK_MARK(8);
  // Each split's weight exp(m_k - M) and the denominator, once per head; then every output sums
  // its splits with their loads in flight together (the partials are in L2).
  __shared__ float weight[GM][64];
  __shared__ float denom[GM];
  for (int g = warp; g < G; g += warps) {
    const float* ml = part_ml + (row0 + g) * n_split * 2;
    const float m0 = lane < n_active ? __ldcg(ml + 2 * lane) : -INFINITY;
    const float m1 = lane + 32 < n_active ? __ldcg(ml + 2 * (lane + 32)) : -INFINITY;
    const float l0 = lane < n_active ? __ldcg(ml + 2 * lane + 1) : 0.0f;
    const float l1 = lane + 32 < n_active ? __ldcg(ml + 2 * (lane + 32) + 1) : 0.0f;
    float M = warp_max(fmaxf(m0, m1));
    // gpt-oss's sink (head g's sinks[g]): one more logit in the denominator, with no value.
    if (sinks) M = fmaxf(M, sinks[g]);
    const float w0 = ggml_expf(m0 - M), w1 = ggml_expf(m1 - M);  // 0 for an empty split
    weight[g][lane] = w0;
    weight[g][lane + 32] = w1;
    float d = warp_sum(w0 * l0 + w1 * l1);
    if (sinks) d += ggml_expf(sinks[g] - M);
    if (lane == 0) denom[g] = d;
  }
  __syncthreads();
  INFER_BLOCK_MARK(9);
  // Four consecutive outputs a thread (head_dim is a multiple of 8; partial, part of the scratch
  // after 2 * rows * n_split values, and out are 16-byte aligned), so that a whole group's loads
  // are in flight at once: 128 threads for G = 4 heads of 128.
  for (int i = 4 * tid; i < G * head_dim; i += 4 * blockDim.x) {
    const int g = i / head_dim, dim = i % head_dim;
    const float4* src = reinterpret_cast<const float4*>(partial + (row0 + g) * n_split * head_dim + dim);
    float4 num = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 16
    for (int k = 0; k < n_active; k++) {
      const float4 x = __ldcg(src + static_cast<size_t>(k) * (head_dim / 4));
      const float w = weight[g][k];
      num.x += w * x.x;
      num.y += w * x.y;
      num.z += w * x.z;
      num.w += w * x.w;
    }
    const float d = denom[g];
    const float4 o = make_float4(num.x / d, num.y / d, num.z / d, num.w / d);
    *reinterpret_cast<float4*>(out + (row0 + g) * head_dim + dim) = o;
    *reinterpret_cast<float4*>(staging + i) = o;
  }
  if (tid == 0) arrived[group] = 0;
  INFER_BLOCK_MARK(10);
  quantize_group(staging, G * head_dim, qmode, xq, xd, row0 * head_dim);
  INFER_BLOCK_MARK(11);
}

/// GM: the group size the registers are laid out for (1, 2, 4 or 8); the group G <= GM.
template <int GM>
__device__ __forceinline__ void attn_decode_body(const float* q, const __half* kc, const __half* vc,
                                                 const unsigned long long* kv_table,
                                                 const int* positions, int n_head, int n_kv_head, int head_dim,
                                                 int window, int cells, int ring, float scale, int n_split,
                                                 float* out, float* part_ml, float* partial,
                                                 unsigned int* arrived, int qmode, int8_t* xq, float* xd) {
  __shared__ __align__(16) float qs[GM * DECODE_HEAD_DIM_MAX];
  __shared__ float ps[GM * DECODE_TILE];
  __shared__ float tile_max[GM];
  __shared__ float warp_l[DECODE_THREADS / 32][GM];
  __shared__ float split_m[GM];
  __shared__ __align__(16) float red[GM * 1024];
  const int G = n_head / n_kv_head;
  const DecodeSpan span = decode_span(kc, vc, kv_table, positions, n_kv_head, window, n_split);
  if (span.split >= span.active) return;  // no keys: the whole block
  const int t = span.t, kvh = span.kvh, split = span.split, begin = span.begin, s0 = span.s0, s1 = span.s1;
  const bool single = span.active == 1;  // the outputs written here, no combine
  kc = span.kc;
  vc = span.vc;
  const int h0 = kvh * G;
  const int kv_dim = n_kv_head * head_dim;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // The G query heads of this KV head are contiguous in the row.
  const float* qr = q + (static_cast<size_t>(t) * n_head + h0) * head_dim;
  // Heads G .. GM - 1 (a group smaller than the layout) are zeros: the loops below run over GM
  // heads without branches, those heads' scores and probabilities zero.
  for (int i = tid; i < GM * head_dim; i += DECODE_THREADS) qs[i] = i < G * head_dim ? round_f16(qr[i]) : 0.0f;
  const int L = head_dim >> 3;          // threads per V row, 8 dimensions each
  const int KG = DECODE_THREADS / L;    // key groups
  const int kg = tid / L, c = tid % L;
  // Value rows requested before the softmax: all of a tile's at head_dim 128 (8B: 17.6 against
  // 18.7 µs a launch at 4,096 keys); none at 64, where it measured slower (1B: 12.9 against 12.7;
  // bench/cuda-probe.cu on an H200).
  const int early = head_dim >= 128 ? DECODE_VEARLY : 0;
  float acc[GM][8], m[GM], l[GM];
#pragma unroll
  for (int g = 0; g < GM; g++) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; e++) acc[g][e] = 0.0f;
  }
  __syncthreads();
  INFER_MARK(2);
  INFER_BLOCK_MARK(2);
  for (int tile = s0; tile < s1; tile += DECODE_TILE) {
    const int tn = min(DECODE_TILE, s1 - tile);
    float s[GM];
#pragma unroll
    for (int g = 0; g < GM; g++) s[g] = -INFINITY;
    if (tid < tn) {
      const uint4* kr = reinterpret_cast<const uint4*>(
          kc + static_cast<size_t>(attn_cell(begin + tile + tid, cells, ring)) * kv_dim + kvh * head_dim);
      float d[GM];
#pragma unroll
      for (int g = 0; g < GM; g++) d[g] = 0.0f;
      // KB chunks of the key row in flight (all of a 128-dim row where registers allow), then
      // their products.
      constexpr int KB = GM <= 4 ? 16 : 8;
      for (int i0 = 0; i0 < L; i0 += KB) {
        uint4 raw[KB];
#pragma unroll
        for (int u = 0; u < KB; u++)
          if (i0 + u < L) raw[u] = __ldg(kr + i0 + u);
#pragma unroll
        for (int u = 0; u < KB; u++) {
          if (i0 + u < L) {
            float k8[8];
            unpack_half8(raw[u], k8);
#pragma unroll
            for (int g = 0; g < GM; g++) {
              const float4 qa = *reinterpret_cast<const float4*>(qs + g * head_dim + 8 * (i0 + u));
              const float4 qb = *reinterpret_cast<const float4*>(qs + g * head_dim + 8 * (i0 + u) + 4);
              float x = d[g];
              x = __fmaf_rn(k8[0], qa.x, x);
              x = __fmaf_rn(k8[1], qa.y, x);
              x = __fmaf_rn(k8[2], qa.z, x);
              x = __fmaf_rn(k8[3], qa.w, x);
              x = __fmaf_rn(k8[4], qb.x, x);
              x = __fmaf_rn(k8[5], qb.y, x);
              x = __fmaf_rn(k8[6], qb.z, x);
              x = __fmaf_rn(k8[7], qb.w, x);
              d[g] = x;
            }
          }
        }
      }
#pragma unroll
      for (int g = 0; g < GM; g++) s[g] = d[g] * scale;
    }
    // The tile's value rows this thread sums (all of them up to head_dim 128), requested now so
    // that their round trip overlaps the softmax's barriers rather than following them.
    auto value_row = [&](int j) {
      return __ldg(reinterpret_cast<const uint4*>(
                       vc + static_cast<size_t>(attn_cell(begin + tile + j, cells, ring)) * kv_dim + kvh * head_dim) + c);
    };
    uint4 vearly[DECODE_VEARLY];
    if (kg < KG) {
#pragma unroll
      for (int u = 0; u < DECODE_VEARLY; u++)
        if (u < early && kg + u * KG < tn) vearly[u] = value_row(kg + u * KG);
    }
#pragma unroll
    for (int g = 0; g < GM; g++) ps[g * DECODE_TILE + tid] = s[g];
    __syncthreads();
    INFER_MARK(3);
    INFER_BLOCK_MARK(3);
    for (int g = warp; g < G; g += DECODE_THREADS / 32) {
      const float* r = ps + g * DECODE_TILE;
      const float v = warp_max(fmaxf(fmaxf(r[lane], r[lane + 32]), fmaxf(r[lane + 64], r[lane + 96])));
      if (lane == 0) tile_max[g] = v;
    }
    __syncthreads();
    float alpha[GM];
#pragma unroll
    for (int g = 0; g < GM; g++) {
      const float mn = g < G ? fmaxf(m[g], tile_max[g]) : 0.0f;  // finite: the tile has a key
      alpha[g] = ggml_expf(m[g] - mn);                           // 0 on the first tile (m = -inf)
      m[g] = mn;
      const float pv = tid < tn && g < G ? ggml_expf(s[g] - mn) : 0.0f;
      l[g] = l[g] * alpha[g] + pv;
      ps[g * DECODE_TILE + tid] = pv;
    }
    __syncthreads();
    INFER_MARK(4);
    INFER_BLOCK_MARK(4);
#pragma unroll
    for (int g = 0; g < GM; g++)
#pragma unroll
      for (int e = 0; e < 8; e++) acc[g][e] *= alpha[g];
    // p_j V_j of value row j (its 16 bytes at c) into the outputs of the group's heads.
    auto add_value = [&](const uint4& raw, int j) {
      float v8[8];
      unpack_half8(raw, v8);
#pragma unroll
      for (int g = 0; g < GM; g++) {
        const float pj = ps[g * DECODE_TILE + j];
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] = __fmaf_rn(pj, v8[e], acc[g][e]);
      }
    };
    if (kg < KG) {
#pragma unroll
      for (int u = 0; u < DECODE_VEARLY; u++)
        if (u < early && kg + u * KG < tn) add_value(vearly[u], kg + u * KG);
      // The rest (every row below head_dim 128, the rows past the first 16 above it):
      // DECODE_VROWS in flight, then their products.
      for (int j0 = kg + early * KG; j0 < tn; j0 += DECODE_VROWS * KG) {
        uint4 raw[DECODE_VROWS];
#pragma unroll
        for (int u = 0; u < DECODE_VROWS; u++)
          if (j0 + u * KG < tn) raw[u] = value_row(j0 + u * KG);
#pragma unroll
        for (int u = 0; u < DECODE_VROWS; u++)
          if (j0 + u * KG < tn) add_value(raw[u], j0 + u * KG);
      }
    }
    __syncthreads();  // ps is rewritten by the next tile
    INFER_MARK(5);
    INFER_BLOCK_MARK(5);
  }
  // The split's sums over the block: l by warps, the outputs over the key groups.
#pragma unroll
  for (int g = 0; g < GM; g++) {
    if (g < G) {
      const float v = warp_sum(l[g]);
      if (lane == 0) warp_l[warp][g] = v;
      if (tid == 0) split_m[g] = m[g];  // the same in every thread
    }
  }
  if (kg < KG) {
#pragma unroll
    for (int g = 0; g < GM; g++)
      if (g < G) {
        float* r = red + (g * KG + kg) * head_dim + 8 * c;
#pragma unroll
        for (int e = 0; e < 8; e++) r[e] = acc[g][e];
      }
  }
  __syncthreads();
  INFER_MARK(6);
  INFER_BLOCK_MARK(6);
  const size_t row0 = static_cast<size_t>(t) * n_head + h0;  // the group's first query row
  for (int i = tid; i < G * head_dim; i += DECODE_THREADS) {
    const int g = i / head_dim, dim = i % head_dim;
    float o = 0.0f;
    for (int k = 0; k < KG; k++) o += red[(g * KG + k) * head_dim + dim];
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < DECODE_THREADS / 32; w++) sum += warp_l[w][g];
    if (single) {
      out[(row0 + g) * head_dim + dim] = o / sum;
      qs[i] = o / sum;
    } else {
      partial[((row0 + g) * n_split + split) * head_dim + dim] = o;
      if (dim == 0) {
        part_ml[((row0 + g) * n_split + split) * 2] = split_m[g];  // -inf for an empty split, with sum 0
        part_ml[((row0 + g) * n_split + split) * 2 + 1] = sum;
      }
    }
  }
  if (single) {
    INFER_MARK(7);
    quantize_group(qs, G * head_dim, qmode, xq, xd, row0 * head_dim);
    INFER_MARK(8);
    return;
  }
  decode_combine_last<GM>(G, head_dim, n_split, span.active, t * n_kv_head + kvh, row0, part_ml, partial, arrived, out, qs, qmode, xq,
                          xd);
}

/// Before pdl_begin: the key and value rows of this block's first tile pulled into L2. All but the
/// newest were written by earlier steps and have since been pushed out by the weights streaming
/// through; the hint overlaps their DRAM round trip with the kernel before (the positions and
/// the table are the host's uploads, in place before the step began).
__device__ __forceinline__ void attn_decode_prefetch_span(const DecodeSpan& span, int n_kv_head, int head_dim,
                                                          int cells, int ring) {
  const int j = span.s0 + static_cast<int>(threadIdx.x);
  if (j >= min(span.s1, span.s0 + DECODE_TILE)) return;
  const size_t row =
      static_cast<size_t>(attn_cell(span.begin + j, cells, ring)) * n_kv_head * head_dim + span.kvh * head_dim;
  for (int b = 0; b < 2 * head_dim; b += 128) {
    prefetch_l2(reinterpret_cast<const char*>(span.kc + row) + b);
    prefetch_l2(reinterpret_cast<const char*>(span.vc + row) + b);
  }
}

__device__ __forceinline__ void attn_decode_prefetch(const __half* kc, const __half* vc,
                                                     const unsigned long long* kv_table, const int* positions,
                                                     int n_kv_head, int head_dim, int window, int cells, int ring,
                                                     int n_split) {
  attn_decode_prefetch_span(decode_span(kc, vc, kv_table, positions, n_kv_head, window, n_split), n_kv_head, head_dim,
                            cells, ring);
}

#define ATTN_DECODE(NAME, GM)                                                                                   \
  extern "C" __global__ void __launch_bounds__(DECODE_THREADS)                                                 \
      NAME(const float* q, const __half* kc, const __half* vc, const unsigned long long* kv_table,               \
           const int* positions, int n_head, int n_kv_head,                                                     \
           int head_dim, int window, int cells, int ring, float scale, int n_split, float* out, float* part_ml, \
           float* partial, unsigned int* arrived, int qmode, int8_t* xq, float* xd) {                             \
    INFER_MARK(0);                                                                                               \
    INFER_BLOCK_MARK(0);                                                                                         \
    attn_decode_prefetch(kc, vc, kv_table, positions, n_kv_head, head_dim, window, cells, ring, n_split);         \
    pdl_begin();                                                                                                 \
    INFER_MARK(1);                                                                                               \
    INFER_BLOCK_MARK(1);                                                                                         \
    attn_decode_body<GM>(q, kc, vc, kv_table, positions, n_head, n_kv_head, head_dim, window, cells, ring, scale, n_split, \
                         out, part_ml, partial, arrived, qmode, xq, xd);                                         \
    INFER_BLOCK_MARK(7);                                                                                         \
  }
ATTN_DECODE(attn_decode_g1, 1)
ATTN_DECODE(attn_decode_g2, 2)
ATTN_DECODE(attn_decode_g4, 4)
ATTN_DECODE(attn_decode_g8, 8)

/// kv_store for rows of several sequences: row t's keys and values into the caches named by
/// kv_table[2t] and kv_table[2t + 1] (as attn_decode_* reads them), at positions[t].
extern "C" __global__ void kv_store_rows(const float* k, const float* v, int kv_dim,
                                         const unsigned long long* kv_table, const int* positions, int cells,
                                         int ring, int kt, int vt) {
  pdl_begin();
  const int t = blockIdx.y;
  void* kc = reinterpret_cast<void*>(kv_table[2 * t]);
  void* vc = reinterpret_cast<void*>(kv_table[2 * t + 1]);
  store_kv_value(k, v, kv_dim, kc, vc, positions, cells, ring, kt, vt);
}
