// Flash attention for prompts (Dao et al. 2022) on the simdgroup matrix units: causal
// grouped-query attention with an optional sliding window over the KV cache, with the masks
// and cell addressing of attention.metal (the query at position p = pos0 + t sees keys j in
// [begin, p]; position j lives in cell j, or j % cells in a ring), for many queries at once.
//
// One threadgroup per (query head, tile of ATTENTION_PROMPT_QUERIES = 32 queries); simdgroup sg
// owns queries 8sg .. 8sg + 7 of the tile, its 8 × head_dim block of Q held as 8×8 matrices for
// the whole kernel. The threadgroup walks the keys its queries see in blocks of 16: all threads
// stage a block's K and V rows (f16: exact copies of an f16 cache, a Q8_0 / Q4_0 cache's blocks
// dequantized and rounded to f16 as llama.cpp's flash attention stages them; zero past the last
// position) in threadgroup memory, then each simdgroup whose queries see any key of the block
// computes the 8 × 16 scores S = Q·K^T on matrices, applies the masks and the online softmax (Milakov &
// Gimelshein 2018) row by row (lanes 0..7, one query each: running max m and sum l), and
// updates its output O = diag(correction)·O + P·V, again on matrices. At the end O / l is
// written out one 8×8 block at a time through the simdgroup's scratch, with bounds checks.
// K and V are read once per 32 queries instead of once per query as attention.metal does.
//
// Threadgroup memory: per simdgroup 192 floats (scores / probabilities 8 × 16, a diagonal 8 × 8),
// then the K and V blocks: 16 × dp halves each, dp = head_dim rounded up to 8.
#include <metal_stdlib>
#include "args.h"
#include "kv.h"
using namespace metal;

inline uint attention_begin(uint p, uint window) {
    return window > 0 && p + 1 > window ? p + 1 - window : 0;
}

template <uint DMAX>
inline void attention_prompt(device const float* q, device const uchar* k_cache,
                             device const uchar* v_cache, device float* out,
                             constant AttentionArgs& args, threadgroup float* shared, uint3 tg,
                             uint tid, uint sg, uint lane) {
    const uint head = tg.x;
    const uint t0 = tg.y * ATTENTION_PROMPT_QUERIES;
    const uint head_dim = args.head_dim;
    const uint dp = (head_dim + 7) / 8 * 8;
    const uint kv_head = head / (args.n_head / args.n_kv_head);
    const ulong kv_dim = ulong(args.n_kv_head) * head_dim;
    const ulong q_stride = ulong(args.n_head) * head_dim;
    threadgroup float* scores = shared + sg * 192;  // 8 × 16, row-major
    threadgroup float* diag = scores + 128;         // 8 × 8
    threadgroup half* k_block = (threadgroup half*)(shared + 4 * 192);
    threadgroup half* v_block = k_block + 16 * dp;

    // This simdgroup's queries: rows t0 + 8sg + r for r < rows (none past n_tok).
    const uint first = t0 + 8 * sg;
    const uint rows = first < args.n_tok ? min(8u, args.n_tok - first) : 0u;
    const uint tile_rows = min(uint(ATTENTION_PROMPT_QUERIES), args.n_tok - t0);
    const uint p_last = args.pos0 + t0 + tile_rows - 1;  // the tile's last position

    simdgroup_float8x8 qm[DMAX / 8];
    simdgroup_float8x8 om[DMAX / 8];
    for (uint i = 0; i < dp / 8; i++) {
        for (uint e = lane; e < 64; e += 32) {
            const uint r = e / 8, d = 8 * i + e % 8;
            scores[e] = r < rows && d < head_dim ? q[(first + r) * q_stride + head * head_dim + d]
                                                 : 0.0f;
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
        simdgroup_load(qm[i], scores, 8);
        simdgroup_barrier(mem_flags::mem_threadgroup);
        om[i] = make_filled_simdgroup_matrix<float, 8>(0.0f);
    }
    // Lane r < 8 follows query r: its position, first key, running max and sum.
    const uint p = args.pos0 + first + min(lane, 7u);
    const uint begin = attention_begin(p, args.window);
    float m = -FLT_MAX;
    float l = 0.0f;
    const uint sg_begin = attention_begin(args.pos0 + first, args.window);
    const uint sg_last = args.pos0 + first + rows - 1;

    for (uint jb = attention_begin(args.pos0 + t0, args.window); jb <= p_last; jb += 16) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint e = tid; e < 16 * dp; e += ATTENTION_PROMPT_THREADS) {
            const uint j = jb + e / dp, d = e % dp;
            half kv_k = half(0.0f), kv_v = half(0.0f);
            if (j <= p_last && d < head_dim) {
                const uint cell = args.ring != 0 ? j % args.cells : j;
                const ulong at = cell * kv_dim + kv_head * head_dim;
                kv_k = half(kv_value(k_cache + kv_bytes(args.k_type, at), args.k_type, d));
                kv_v = half(kv_value(v_cache + kv_bytes(args.v_type, at), args.v_type, d));
            }
            k_block[e] = kv_k;
            v_block[e] = kv_v;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // Uniform per simdgroup: skip a block none of its queries sees (causal, window).
        if (rows == 0 || jb > sg_last || jb + 16 <= sg_begin) continue;
        simdgroup_float8x8 s[2];
        for (uint c = 0; c < 2; c++) {
            s[c] = make_filled_simdgroup_matrix<float, 8>(0.0f);
            for (uint i = 0; i < dp / 8; i++) {
                simdgroup_half8x8 kt;
                simdgroup_load(kt, k_block + 8 * c * dp + 8 * i, dp, 0, true);
                simdgroup_multiply_accumulate(s[c], qm[i], kt, s[c]);
            }
            simdgroup_store(s[c], scores + 8 * c, 16);
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
        if (lane < 8) {
            threadgroup float* row = scores + 16 * lane;
            const bool live = lane < rows;
            float m_new = m;
            for (uint c = 0; c < 16; c++) {
                const uint j = jb + c;
                if (live && j >= begin && j <= p) m_new = max(m_new, row[c] * args.scale);
            }
            const float correction = exp(m - m_new);
            float sum = 0.0f;
            for (uint c = 0; c < 16; c++) {
                const uint j = jb + c;
                const float w = live && j >= begin && j <= p ? exp(row[c] * args.scale - m_new)
                                                             : 0.0f;
                row[c] = w;
                sum += w;
            }
            l = l * correction + sum;
            m = m_new;
            for (uint c = 0; c < 8; c++) diag[8 * lane + c] = c == lane ? correction : 0.0f;
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
        simdgroup_float8x8 scale_rows, pm[2];
        simdgroup_load(scale_rows, diag, 8);
        simdgroup_load(pm[0], scores, 16);
        simdgroup_load(pm[1], scores + 8, 16);
        for (uint i = 0; i < dp / 8; i++) {
            simdgroup_multiply(om[i], scale_rows, om[i]);
            for (uint c = 0; c < 2; c++) {
                simdgroup_half8x8 vm;
                simdgroup_load(vm, v_block + 8 * c * dp + 8 * i, dp);
                simdgroup_multiply_accumulate(om[i], pm[c], vm, om[i]);
            }
        }
    }
    if (rows == 0) return;
    // out = diag(1 / l)·O, an 8×8 block at a time through the scratch.
    simdgroup_barrier(mem_flags::mem_threadgroup);
    if (lane < 8) {
        for (uint c = 0; c < 8; c++) diag[8 * lane + c] = c == lane && l > 0.0f ? 1.0f / l : 0.0f;
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_float8x8 inv_l;
    simdgroup_load(inv_l, diag, 8);
    for (uint i = 0; i < dp / 8; i++) {
        simdgroup_float8x8 o;
        simdgroup_multiply(o, inv_l, om[i]);
        simdgroup_store(o, scores, 8);
        simdgroup_barrier(mem_flags::mem_threadgroup);
        for (uint e = lane; e < 64; e += 32) {
            const uint r = e / 8, d = 8 * i + e % 8;
            if (r < rows && d < head_dim) {
                out[(first + r) * q_stride + head * head_dim + d] = scores[e];
            }
        }
        simdgroup_barrier(mem_flags::mem_threadgroup);
    }
}

kernel void attention_prompt_d128(device const float* q [[buffer(0)]],
                                  device const uchar* k_cache [[buffer(1)]],
                                  device const uchar* v_cache [[buffer(2)]],
                                  device float* out [[buffer(3)]],
                                  constant AttentionArgs& args [[buffer(4)]],
                                  threadgroup float* shared [[threadgroup(0)]],
                                  uint3 tg [[threadgroup_position_in_grid]],
                                  uint tid [[thread_index_in_threadgroup]],
                                  uint sg [[simdgroup_index_in_threadgroup]],
                                  uint lane [[thread_index_in_simdgroup]]) {
    attention_prompt<128>(q, k_cache, v_cache, out, args, shared, tg, tid, sg, lane);
}

kernel void attention_prompt_d256(device const float* q [[buffer(0)]],
                                  device const uchar* k_cache [[buffer(1)]],
                                  device const uchar* v_cache [[buffer(2)]],
                                  device float* out [[buffer(3)]],
                                  constant AttentionArgs& args [[buffer(4)]],
                                  threadgroup float* shared [[threadgroup(0)]],
                                  uint3 tg [[threadgroup_position_in_grid]],
                                  uint tid [[thread_index_in_threadgroup]],
                                  uint sg [[simdgroup_index_in_threadgroup]],
                                  uint lane [[thread_index_in_simdgroup]]) {
    attention_prompt<256>(q, k_cache, v_cache, out, args, shared, tg, tid, sg, lane);
}
