// Attention for a few query rows (decode and small batches; lib/cuda/attention.zig picks
// attn_decode_w where head_dim is a power of two from 32 to 256 and group × splits < 128,
// attn_decode_g* of attend_decode.cuh elsewhere). A block takes one split of a row's visible keys
// (blockIdx.y; the splits combined by the last to finish, as attn_decode_g* does:
// decode_combine_last). At a short context the decode attention is latency, not bytes: one warp a
// scheduler runs a chain of dependent steps, and each step of attn_decode_g* (one key a thread:
// head_dim × G multiply-adds in a row; a barrier for the tile's maximum, its exponentials, the
// values, their sums over key groups, the outputs, their quantization) costs about a microsecond.
// Here the chain is cut three ways:
//   - a block takes one query head, not the G of its KV head: G blocks a KV head, each with a
//     G-th of the products, the key and value rows read from L2 again by each (at most 64 KB a
//     block: a split's 128 keys and values at head_dim 128); two heads a block measured slower
//     (bench/results/cuda.md);
//   - each of the 4 warps keeps its own running maximum, sum and outputs over its share of the
//     keys (flash-decoding inside the block), so there is one barrier, where the warps' results
//     are combined, instead of several a tile; a key is scored by head_dim / 32 lanes, each
//     holding 32 of the query's dimensions in registers, their sums added by shuffles;
//   - the loads that depend only on positions (the first key and value rows) are issued with
//     the query's, so their latencies overlap rather than follow one another.
// A warp's outputs are whole Q8_0 units, so the o-projection's Q8_0 input is quantized in
// registers (a Q8_K superblock spans two blocks: its own launch). Arithmetic: the CPU's products
// (the query rounded to f16, f32 multiply-adds, ggml_expf) summed in another order;
// probabilities f32, as attn_decode_g* (test/cuda.test.ts bounds the outputs).
#pragma once
#include "attend_decode.cuh"

constexpr int WARPS_DECODE_WARPS = 4;
constexpr int WARPS_DECODE_CHUNK = 32;  // keys a warp takes a step: one probability a lane
constexpr int WARPS_DECODE_LOADS = 4;   // 16-byte loads of a key row a scoring lane takes

/// Key of chunk index i of warp w's step from `base`: the warps take kpp keys in turn.
__device__ __forceinline__ int warps_key(int base, int i, int warp, int kpp_log2) {
  const int kpp = 1 << kpp_log2;
  return base + (((i >> kpp_log2) * WARPS_DECODE_WARPS + warp) << kpp_log2) + (i & (kpp - 1));
}

__device__ __forceinline__ void attn_decode_w_body(const DecodeSpan& span, int h, const float* q, int n_head,
                                                   int n_kv_head, int head_dim, int cells, int ring, float scale,
                                                   int n_split, float* out, float* part_ml, float* partial,
                                                   unsigned int* arrived, int qmode, int8_t* xq, float* xd) {
  constexpr int W = WARPS_DECODE_WARPS;
  constexpr int CH = WARPS_DECODE_CHUNK;
  constexpr int U = WARPS_DECODE_LOADS;
  __shared__ float pw[W][CH];                 // a warp's scores, then its probabilities
  __shared__ float wm[W], wl[W];              // each warp's maximum and sum of exponentials
  __shared__ __align__(16) float red[1024];   // each warp's outputs, per row group
  const __half* kc = span.kc;
  const __half* vc = span.vc;
  const size_t kv_dim = static_cast<size_t>(n_kv_head) * head_dim;
  const size_t kv_off = static_cast<size_t>(span.kvh) * head_dim;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hd_log2 = __ffs(head_dim) - 1;
  const int tpk_log2 = hd_log2 - 5;  // lanes a key: head_dim / 32, each 8U = 32 dimensions
  const int tpk = 1 << tpk_log2, kpp_log2 = 5 - tpk_log2;
  const int key_lane = lane >> tpk_log2, sub = lane & (tpk - 1);
  const int l_log2 = hd_log2 - 3, rw = 32 >> l_log2;  // value rows: head_dim / 8 lanes a row, rw at once
  const int vrow = lane >> l_log2, vcol = lane & ((1 << l_log2) - 1);

  auto row_of = [&](const __half* cache, int key) {
    return reinterpret_cast<const uint4*>(cache + attn_cell(span.begin + key, cells, ring) * kv_dim + kv_off);
  };
  // Passes of 32 / tpk keys this warp has in the step from `base` (none: nor in later steps).
  auto passes_from = [&](int base) {
    const int ahead = span.s1 - base - (warp << kpp_log2);
    return ahead <= 0 ? 0 : min(tpk, (ahead + (W << kpp_log2) - 1) / (W << kpp_log2));
  };
  // Chunk index `lane` holds a key (a prefix of the chunk: keys grow with the index).
  auto lane_valid = [&](int base, int passes) {
    return lane < (passes << kpp_log2) && warps_key(base, lane, warp, kpp_log2) < span.s1;
  };
  uint4 kraw[2][U];
  bool kok[2];
  auto load_keys = [&](int base, int passes, int p0) {  // two passes' key rows
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int key = warps_key(base, ((p0 + r) << kpp_log2) + key_lane, warp, kpp_log2);
      kok[r] = p0 + r < passes && key < span.s1;
      if (kok[r]) {
        const uint4* kr = row_of(kc, key);
#pragma unroll
        for (int u = 0; u < U; u++) kraw[r][u] = __ldg(kr + (u << tpk_log2) + sub);
      }
    }
  };
  uint4 vraw[4];
  auto load_values = [&](int base, int nv, int i0) {  // value rows i0, i0 + rw, ... (4)
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int i = i0 + u * rw;
      if (i < nv) vraw[u] = __ldg(row_of(vc, warps_key(base, i, warp, kpp_log2)) + vcol);
    }
  };

  // The first step's key and value rows, then the query: their loads in flight together.
  int base = span.s0;
  int passes = passes_from(base);
  int nv = __popc(__ballot_sync(FULL_MASK, lane_valid(base, passes)));
  if (passes > 0) {
    load_keys(base, passes, 0);
    load_values(base, nv, vrow);
  }
  // The query's dimensions this lane scores: (u * tpk + sub) * 8 .. + 7, so that the tpk lanes
  // of a key read 16 * tpk contiguous bytes a load.
  const float* qr = q + (static_cast<size_t>(span.t) * n_head + h) * head_dim;
  float4 qraw[U][2];
#pragma unroll
  for (int u = 0; u < U; u++) {
    const float4* src = reinterpret_cast<const float4*>(qr + (u * tpk + sub) * 8);
    qraw[u][0] = src[0];
    qraw[u][1] = src[1];
  }
  float qv[U][8];
#pragma unroll
  for (int u = 0; u < U; u++) {
    const float4 a = qraw[u][0], b = qraw[u][1];
    qv[u][0] = round_f16(a.x), qv[u][1] = round_f16(a.y), qv[u][2] = round_f16(a.z), qv[u][3] = round_f16(a.w);
    qv[u][4] = round_f16(b.x), qv[u][5] = round_f16(b.y), qv[u][6] = round_f16(b.z), qv[u][7] = round_f16(b.w);
  }
  INFER_MARK(2);
  float m = -INFINITY, lsum = 0.0f, acc[8];
#pragma unroll
  for (int e = 0; e < 8; e++) acc[e] = 0.0f;
  while (passes > 0) {
    float mx = -INFINITY;
    __syncwarp();  // the previous step's probabilities are read
    for (int p0 = 0; p0 < passes; p0 += 2) {
      if (p0 > 0) load_keys(base, passes, p0);
#pragma unroll
      for (int r = 0; r < 2; r++) {
        if (p0 + r >= passes) break;  // the same in every lane
        float d = 0.0f;
        if (kok[r]) {
#pragma unroll
          for (int u = 0; u < U; u++) {
            float k8[8];
            unpack_half8(kraw[r][u], k8);
#pragma unroll
            for (int e = 0; e < 8; e++) d = __fmaf_rn(k8[e], qv[u][e], d);
          }
        }
        for (int o = 1; o < tpk; o <<= 1) d += __shfl_xor_sync(FULL_MASK, d, o);
        if (kok[r]) {
          const float s = d * scale;
          mx = fmaxf(mx, s);
          if (sub == 0) pw[warp][((p0 + r) << kpp_log2) + key_lane] = s;
        }
      }
    }
    INFER_MARK(3);
    // The step's maximum over the warp's keys (every lane of a key holds its score).
    for (int o = tpk; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o));
    const bool valid = lane_valid(base, passes);
    __syncwarp();  // the scores are written
    const float mn = fmaxf(m, mx);            // finite: the warp has a key this step
    const float alpha = ggml_expf(m - mn);    // 0 on the warp's first step (m = -inf)
    m = mn;
    const float pv = valid ? ggml_expf(pw[warp][lane] - mn) : 0.0f;
    pw[warp][lane] = pv;
    lsum = lsum * alpha + pv;
#pragma unroll
    for (int e = 0; e < 8; e++) acc[e] *= alpha;
    __syncwarp();
    INFER_MARK(4);
    // Values: rows vrow, vrow + rw, ... of the chunk, 4 in flight (the first 4 loaded ahead).
    for (int i0 = vrow; i0 < nv; i0 += 4 * rw) {
      if (i0 != vrow) load_values(base, nv, i0);
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const int i = i0 + u * rw;
        if (i < nv) {
          float v8[8];
          unpack_half8(vraw[u], v8);
          const float pj = pw[warp][i];
#pragma unroll
          for (int e = 0; e < 8; e++) acc[e] = __fmaf_rn(pj, v8[e], acc[e]);
        }
      }
    }
    INFER_MARK(5);
    base += W * CH;
    passes = passes_from(base);
    nv = __popc(__ballot_sync(FULL_MASK, lane_valid(base, passes)));
    if (passes > 0) {
      load_keys(base, passes, 0);
      load_values(base, nv, vrow);
    }
  }
  // Each warp's maximum, sum, and outputs by row group (a warp without keys: -inf, 0, zeros).
  const float warp_l = warp_sum(lsum);
  if (lane == 0) wm[warp] = m, wl[warp] = warp_l;
  float4* r = reinterpret_cast<float4*>(red + (warp * rw + vrow) * head_dim + 8 * vcol);
  r[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  r[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  __syncthreads();
  INFER_MARK(6);
  // The outputs, 32 a warp a turn (one Q8_0 unit): the warps' sums weighted by exp(m_w - M).
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < W; w++) M = fmaxf(M, wm[w]);
  float weight[W], den = 0.0f;
#pragma unroll
  for (int w = 0; w < W; w++) {
    // 0 for a warp without keys; all of them for an empty split (M = -inf: outputs and sum 0).
    weight[w] = M == -INFINITY ? 0.0f : ggml_expf(wm[w] - M);
    den = __fmaf_rn(weight[w], wl[w], den);
  }
  const size_t row = static_cast<size_t>(span.t) * n_head + h;
  for (int c = warp; c < (head_dim >> 5); c += W) {
    const int dim = c * 32 + lane;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < W; w++) {
      float t = 0.0f;
      for (int k = 0; k < rw; k++) t += red[(w * rw + k) * head_dim + dim];
      o = __fmaf_rn(weight[w], t, o);
    }
    if (span.active > 1) {  // the split's unnormalised outputs, its maximum and sum of exponentials
      const size_t at = row * n_split + span.split;
      partial[at * head_dim + dim] = o;
      if (dim == 0) part_ml[at * 2] = M, part_ml[at * 2 + 1] = den;
      continue;
    }
    o = o / den;
    out[row * head_dim + dim] = o;
    if (qmode == 0) quant_unit_q8_0(o, xq + row * head_dim + c * 32, xd + row * head_dim / 32 + c);
  }
  INFER_MARK(7);
  if (span.active > 1)
    decode_combine_last<1>(1, head_dim, n_split, span.active, static_cast<int>(row), row, part_ml, partial, arrived, out, red, qmode,
                           xq, xd);
}

/// Before pdl_begin: row t and query head h of block x (a query head a block, blockIdx.y the
/// split), and the first key and value rows pulled into L2 as attn_decode_g* pulls them.
extern "C" __global__ void __launch_bounds__(WARPS_DECODE_WARPS * 32)
    attn_decode_w(const float* q, const __half* kc, const __half* vc, const unsigned long long* kv_table,
                  const int* positions, int n_head, int n_kv_head, int head_dim, int window, int cells, int ring,
                  float scale, int n_split, float* out, float* part_ml, float* partial, unsigned int* arrived,
                  int qmode, int8_t* xq, float* xd) {
  INFER_MARK(0);
  const int t = blockIdx.x / n_head, h = blockIdx.x % n_head;
  const DecodeSpan span =
      decode_span_at(t, h / (n_head / n_kv_head), kc, vc, kv_table, positions, window, n_split);
  if (span.split >= span.active) return;  // no keys
  attn_decode_prefetch_span(span, n_kv_head, head_dim, cells, ring);
  pdl_begin();
  INFER_MARK(1);
  attn_decode_w_body(span, h, q, n_head, n_kv_head, head_dim, cells, ring, scale, n_split, out, part_ml, partial,
                     arrived, qmode, xq, xd);
}
