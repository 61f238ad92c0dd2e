// Attention for a few query rows (decode) with the keys split over threadgroups: flash-decoding
// (Dao et al. 2023), shaped as llama.cpp's kernel_flash_attn_ext_vec and infer's CUDA
// attend_decode.cuh are (their design, not their code). A threadgroup (g, split, t) takes row t's
// query heads g·group .. g·group + group - 1, which share one KV head, and the split-th of n_split
// equal spans of the keys the row sees, so each key and value row is read once per group rather
// than once per query head, and a long context fills the GPU with threadgroups instead of one per
// head. Simdgroup s walks keys s0 + s, s0 + s + n_sg, ...: lane l holds dims [l·PL, l·PL + PL) of
// each of the group's query heads and of the running output (read as half4 where head_dim allows;
// from a Q8_0 / Q4_0 cache a lane's dims lie in one block, whose scale it reads once),
// simd_sum gives each head's score, and an online softmax (Milakov & Gimelshein 2018) keeps a
// running max m and sum l per head. The simdgroups merge through threadgroup memory
// (n_sg · group · (head_dim + 2) floats); with one split the result is normalised and written to
// out, otherwise (m, l, unnormalised values) go to partials and attention_decode_combine merges
// the splits. An empty span (more splits than keys) leaves m = -FLT_MAX, l = 0, which the combine
// weighs by exp(-FLT_MAX - m) = 0.
#include <metal_stdlib>
#include "args.h"
#include "kv.h"
using namespace metal;

// Lane `lane`'s PL dims of a cache row: from a block type, the PL values of one block (head_dim is
// a multiple of 32 and PL divides 32); from f16, half4 loads when head_dim is a multiple of 4
// (then a half4 lies wholly inside or outside the row), else one value at a time; zeros past
// head_dim.
template <uint PL>
inline void load_lane_dims(device const uchar* bytes, uint type, uint lane, uint head_dim,
                           bool wide, thread float* out) {
    const uint base = lane * PL;
    device const half* row = (device const half*)bytes;
    if (type != KV_F16) {
        if (base < head_dim) {
            kv_values_in_block(bytes, type, base, PL, out);
        } else {
            for (uint i = 0; i < PL; i++) out[i] = 0.0f;
        }
    } else if (PL % 4 == 0 && wide) {
        device const half4* row4 = (device const half4*)(row + base);
        for (uint c = 0; c < PL / 4; c++) {
            if (base + 4 * c < head_dim) {
                const half4 h = row4[c];
                out[4 * c] = float(h.x);
                out[4 * c + 1] = float(h.y);
                out[4 * c + 2] = float(h.z);
                out[4 * c + 3] = float(h.w);
            } else {
                for (uint e = 0; e < 4; e++) out[4 * c + e] = 0.0f;
            }
        }
    } else {
        for (uint i = 0; i < PL; i++) out[i] = base + i < head_dim ? float(row[base + i]) : 0.0f;
    }
}

template <uint PL, uint GM>
inline void attention_decode_impl(device const float* q, device const uchar* k_cache,
                                  device const uchar* v_cache, device float* out,
                                  device float* partials, constant AttentionDecodeArgs& args,
                                  threadgroup float* shared, uint3 tg, uint tid, uint n_threads,
                                  uint sg, uint n_sg, uint lane) {
    const uint group = args.group;
    const uint head0 = tg.x * group;
    const uint split = tg.y;
    const uint tok = tg.z;
    const uint head_dim = args.head_dim;
    const uint p = args.pos0 + tok;
    const uint begin = args.window > 0 && p + 1 > args.window ? p + 1 - args.window : 0;
    const uint len = p + 1 - begin;
    const uint chunk = (len + args.n_split - 1) / args.n_split;
    const uint s0 = begin + min(len, split * chunk);
    const uint s1 = begin + min(len, split * chunk + chunk);
    const uint kv_head = head0 / (args.n_head / args.n_kv_head);
    const ulong kv_dim = ulong(args.n_kv_head) * head_dim;
    const bool wide = head_dim % 4 == 0;
    const uint base = lane * PL;

    float qv[GM][PL];
    float acc[GM][PL];
    float m[GM];
    float l[GM];
    for (uint h = 0; h < GM; h++) {
        device const float* qh = q + (ulong(tok) * args.n_head + head0 + min(h, group - 1)) * head_dim;
        for (uint i = 0; i < PL; i++) {
            qv[h][i] = h < group && base + i < head_dim ? qh[base + i] : 0.0f;
            acc[h][i] = 0.0f;
        }
        m[h] = -FLT_MAX;
        l[h] = 0.0f;
    }
    // j depends on the simdgroup only, so every lane of it takes the same trips round the loop.
    for (uint j = s0 + sg; j < s1; j += n_sg) {
        const uint cell = args.ring != 0 ? j % args.cells : j;
        const ulong at = ulong(cell) * kv_dim + ulong(kv_head) * head_dim;
        float kv[PL];
        load_lane_dims<PL>(k_cache + kv_bytes(args.k_type, at), args.k_type, lane, head_dim, wide,
                           kv);
        float correction[GM];
        float weight[GM];
        for (uint h = 0; h < GM; h++) {
            correction[h] = 1.0f;
            weight[h] = 0.0f;
            if (h >= group) continue;
            float s = 0.0f;
            for (uint i = 0; i < PL; i++) s += qv[h][i] * kv[i];
            s = simd_sum(s) * args.scale;
            const float m_new = max(m[h], s);
            correction[h] = exp(m[h] - m_new);
            weight[h] = exp(s - m_new);
            l[h] = l[h] * correction[h] + weight[h];
            m[h] = m_new;
        }
        load_lane_dims<PL>(v_cache + kv_bytes(args.v_type, at), args.v_type, lane, head_dim, wide,
                           kv);
        for (uint h = 0; h < GM && h < group; h++) {
            for (uint i = 0; i < PL; i++) acc[h][i] = acc[h][i] * correction[h] + weight[h] * kv[i];
        }
    }

    // Simdgroup sg's head h: shared[(sg · group + h) · stride ..] = m, l, values.
    const uint stride = head_dim + 2;
    for (uint h = 0; h < GM && h < group; h++) {
        threadgroup float* mine = shared + (sg * group + h) * stride;
        if (lane == 0) {
            mine[0] = m[h];
            mine[1] = l[h];
        }
        for (uint i = 0; i < PL; i++) {
            if (base + i < head_dim) mine[2 + base + i] = acc[h][i];
        }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint e = tid; e < group * head_dim; e += n_threads) {
        const uint h = e / head_dim;
        const uint d = e % head_dim;
        float m_all = -FLT_MAX;
        for (uint s = 0; s < n_sg; s++) m_all = max(m_all, shared[(s * group + h) * stride]);
        float l_all = 0.0f;
        float o = 0.0f;
        for (uint s = 0; s < n_sg; s++) {
            threadgroup const float* theirs = shared + (s * group + h) * stride;
            const float w = exp(theirs[0] - m_all);
            l_all += theirs[1] * w;
            o += theirs[2 + d] * w;
        }
        const ulong row = ulong(tok) * args.n_head + head0 + h;
        if (args.n_split == 1) {
            out[row * head_dim + d] = o / l_all;
        } else {
            device float* part = partials + (row * args.n_split + split) * stride;
            if (d == 0) {
                part[0] = m_all;
                part[1] = l_all;
            }
            part[2 + d] = o;
        }
    }
}

kernel void attention_decode_d64(device const float* q [[buffer(0)]],
                                 device const uchar* k_cache [[buffer(1)]],
                                 device const uchar* v_cache [[buffer(2)]],
                                 device float* out [[buffer(3)]],
                                 device float* partials [[buffer(4)]],
                                 constant AttentionDecodeArgs& args [[buffer(5)]],
                                 threadgroup float* shared [[threadgroup(0)]],
                                 uint3 tg [[threadgroup_position_in_grid]],
                                 uint tid [[thread_index_in_threadgroup]],
                                 uint3 tg_size [[threads_per_threadgroup]],
                                 uint sg [[simdgroup_index_in_threadgroup]],
                                 uint n_sg [[simdgroups_per_threadgroup]],
                                 uint lane [[thread_index_in_simdgroup]]) {
    attention_decode_impl<2, ATTENTION_DECODE_GROUP_D64>(q, k_cache, v_cache, out, partials, args,
        shared, tg, tid, tg_size.x, sg, n_sg, lane);
}

kernel void attention_decode_d128(device const float* q [[buffer(0)]],
                                  device const uchar* k_cache [[buffer(1)]],
                                  device const uchar* v_cache [[buffer(2)]],
                                  device float* out [[buffer(3)]],
                                  device float* partials [[buffer(4)]],
                                  constant AttentionDecodeArgs& args [[buffer(5)]],
                                  threadgroup float* shared [[threadgroup(0)]],
                                  uint3 tg [[threadgroup_position_in_grid]],
                                  uint tid [[thread_index_in_threadgroup]],
                                  uint3 tg_size [[threads_per_threadgroup]],
                                  uint sg [[simdgroup_index_in_threadgroup]],
                                  uint n_sg [[simdgroups_per_threadgroup]],
                                  uint lane [[thread_index_in_simdgroup]]) {
    attention_decode_impl<4, ATTENTION_DECODE_GROUP_D128>(q, k_cache, v_cache, out, partials, args,
        shared, tg, tid, tg_size.x, sg, n_sg, lane);
}

kernel void attention_decode_d256(device const float* q [[buffer(0)]],
                                  device const uchar* k_cache [[buffer(1)]],
                                  device const uchar* v_cache [[buffer(2)]],
                                  device float* out [[buffer(3)]],
                                  device float* partials [[buffer(4)]],
                                  constant AttentionDecodeArgs& args [[buffer(5)]],
                                  threadgroup float* shared [[threadgroup(0)]],
                                  uint3 tg [[threadgroup_position_in_grid]],
                                  uint tid [[thread_index_in_threadgroup]],
                                  uint3 tg_size [[threads_per_threadgroup]],
                                  uint sg [[simdgroup_index_in_threadgroup]],
                                  uint n_sg [[simdgroups_per_threadgroup]],
                                  uint lane [[thread_index_in_simdgroup]]) {
    attention_decode_impl<8, ATTENTION_DECODE_GROUP_D256>(q, k_cache, v_cache, out, partials, args,
        shared, tg, tid, tg_size.x, sg, n_sg, lane);
}

kernel void attention_decode_d512(device const float* q [[buffer(0)]],
                                  device const uchar* k_cache [[buffer(1)]],
                                  device const uchar* v_cache [[buffer(2)]],
                                  device float* out [[buffer(3)]],
                                  device float* partials [[buffer(4)]],
                                  constant AttentionDecodeArgs& args [[buffer(5)]],
                                  threadgroup float* shared [[threadgroup(0)]],
                                  uint3 tg [[threadgroup_position_in_grid]],
                                  uint tid [[thread_index_in_threadgroup]],
                                  uint3 tg_size [[threads_per_threadgroup]],
                                  uint sg [[simdgroup_index_in_threadgroup]],
                                  uint n_sg [[simdgroups_per_threadgroup]],
                                  uint lane [[thread_index_in_simdgroup]]) {
    attention_decode_impl<16, ATTENTION_DECODE_GROUP_D512>(q, k_cache, v_cache, out, partials, args,
        shared, tg, tid, tg_size.x, sg, n_sg, lane);
}

// Row t's head h from its splits: m = max m_s, l = sum l_s exp(m_s - m), out = sum o_s exp(m_s - m) / l.
kernel void attention_decode_combine(device const float* partials [[buffer(0)]],
                                     device float* out [[buffer(1)]],
                                     constant AttentionCombineArgs& args [[buffer(2)]],
                                     uint3 tg [[threadgroup_position_in_grid]],
                                     uint tid [[thread_index_in_threadgroup]],
                                     uint3 tg_size [[threads_per_threadgroup]]) {
    const ulong row = ulong(tg.y) * args.n_head + tg.x;
    const uint stride = args.head_dim + 2;
    device const float* parts = partials + row * args.n_split * stride;
    float m_all = -FLT_MAX;
    for (uint s = 0; s < args.n_split; s++) m_all = max(m_all, parts[s * stride]);
    float l_all = 0.0f;
    for (uint s = 0; s < args.n_split; s++) l_all += parts[s * stride + 1] * exp(parts[s * stride] - m_all);
    for (uint d = tid; d < args.head_dim; d += tg_size.x) {
        float o = 0.0f;
        for (uint s = 0; s < args.n_split; s++) o += parts[s * stride + 2 + d] * exp(parts[s * stride] - m_all);
        out[row * args.head_dim + d] = o / l_all;
    }
}
