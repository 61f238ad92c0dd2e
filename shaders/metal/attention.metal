// Causal grouped-query attention (Vaswani et al. 2017; Ainslie et al. 2023) with an optional
// sliding window, over the KV cache (f16, Q8_0 or Q4_0: kv.h, each lane dequantizing the values
// it reads). One threadgroup per (query head, token): the query at position p = pos0 + t sees keys j in [begin, p], begin = p + 1 - window when a window is set;
// its KV head is head / (n_head / n_kv_head); position j lives in cell j (or j % cells in a ring).
// Simdgroup s takes keys begin + s, begin + s + n_sg, ...: the 32 lanes split head_dim, simd_sum
// gives the score, and an online softmax (Milakov & Gimelshein 2018) keeps a running max m, sum l
// and the weighted values in registers. The simdgroups then merge their (m, l, values) through
// threadgroup memory: n_sg · (head_dim + 2) floats.
#include <metal_stdlib>
#include "args.h"
#include "kv.h"
using namespace metal;

#define ATTENTION_PER_LANE (ATTENTION_HEAD_DIM_MAX / 32)

kernel void attention(device const float* q [[buffer(0)]], device const uchar* k_cache [[buffer(1)]],
                      device const uchar* v_cache [[buffer(2)]], device float* out [[buffer(3)]],
                      constant AttentionArgs& args [[buffer(4)]],
                      threadgroup float* shared [[threadgroup(0)]],
                      uint3 tg [[threadgroup_position_in_grid]],
                      uint tid [[thread_index_in_threadgroup]],
                      uint3 tg_size [[threads_per_threadgroup]],
                      uint sg [[simdgroup_index_in_threadgroup]],
                      uint n_sg [[simdgroups_per_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]]) {
    const uint head = tg.x;
    const uint tok = tg.y;
    const uint head_dim = args.head_dim;
    const uint p = args.pos0 + tok;
    const uint begin = args.window > 0 && p + 1 > args.window ? p + 1 - args.window : 0;
    const uint kv_head = head / (args.n_head / args.n_kv_head);
    const ulong kv_dim = ulong(args.n_kv_head) * head_dim;
    device const float* qh = q + (ulong(tok) * args.n_head + head) * head_dim;

    float qv[ATTENTION_PER_LANE];
    float acc[ATTENTION_PER_LANE];
    for (uint i = 0; i < ATTENTION_PER_LANE; i++) {
        const uint d = lane + 32 * i;
        qv[i] = d < head_dim ? qh[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -FLT_MAX;
    float l = 0.0f;
    // j depends on the simdgroup only, so every lane of it takes the same trips round the loop.
    for (uint j = begin + sg; j <= p; j += n_sg) {
        const uint cell = args.ring != 0 ? j % args.cells : j;
        const ulong at = ulong(cell) * kv_dim + ulong(kv_head) * head_dim;
        device const uchar* kr = k_cache + kv_bytes(args.k_type, at);
        device const uchar* vr = v_cache + kv_bytes(args.v_type, at);
        float s = 0.0f;
        for (uint i = 0; i < ATTENTION_PER_LANE; i++) {
            const uint d = lane + 32 * i;
            if (d < head_dim) s += qv[i] * kv_value(kr, args.k_type, d);
        }
        s = simd_sum(s) * args.scale;
        const float m_new = max(m, s);
        const float correction = exp(m - m_new);
        const float weight = exp(s - m_new);
        l = l * correction + weight;
        for (uint i = 0; i < ATTENTION_PER_LANE; i++) {
            const uint d = lane + 32 * i;
            if (d < head_dim) acc[i] = acc[i] * correction + weight * kv_value(vr, args.v_type, d);
        }
        m = m_new;
    }

    threadgroup float* maxes = shared;
    threadgroup float* sums = shared + n_sg;
    threadgroup float* values = shared + 2 * n_sg;
    if (lane == 0) {
        maxes[sg] = m;
        sums[sg] = l;
    }
    for (uint i = 0; i < ATTENTION_PER_LANE; i++) {
        const uint d = lane + 32 * i;
        if (d < head_dim) values[sg * head_dim + d] = acc[i];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float m_all = -FLT_MAX;
    for (uint s = 0; s < n_sg; s++) m_all = max(m_all, maxes[s]);
    float l_all = 0.0f;
    for (uint s = 0; s < n_sg; s++) l_all += sums[s] * exp(maxes[s] - m_all);
    device float* oh = out + (ulong(tok) * args.n_head + head) * head_dim;
    const uint n_threads = tg_size.x * tg_size.y * tg_size.z;
    for (uint d = tid; d < head_dim; d += n_threads) {
        float o = 0.0f;
        for (uint s = 0; s < n_sg; s++) o += values[s * head_dim + d] * exp(maxes[s] - m_all);
        oh[d] = o / l_all;
    }
}
