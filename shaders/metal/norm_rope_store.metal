// One step's attention inputs in one dispatch, as the CUDA backend's norm_rope_store fuses them:
// the query and key heads' RMSNorm (Gemma 3, Qwen 3; has_norm 0: none), their RoPE, the queries
// times q_scale (1: none; Gemma scales them before attention), and the keys and values stored to
// the cache at cell pos0 + t (mod cells in a ring), as f16 or kv.h's Q8_0 / Q4_0 blocks.
// Unfused this is up to six dispatches, each behind a barrier on the one before: rms_norm ×2,
// rope ×2, scale, kv_store.
// Threadgroup (b, t): b < heads_q is query head b of token t, the next heads_k its key heads (and
// their value heads). Each step is the unfused kernels' arithmetic, operation for operation: the
// scale is norm.h's rms_scale over as many threads as planRmsNorm gives a head, the pairs turn as
// rope.h turns them, so on one device the fused step equals the unfused one bit for bit
// (test/metal-kernels.test.ts). After rms_scale's barrier each thread reads and writes only its
// own elements (whole RoPE pairs, then dims past n_rot), so x is updated in place without a
// second barrier. A quantized key cache needs a block's 32 turned values in one thread: after a
// device-memory barrier, thread c quantizes block c of the key head from x (the keys are not
// scaled), as kv_store does; values are quantized straight from v.
#include <metal_stdlib>
#include "args.h"
#include "kv.h"
#include "norm.h"
#include "rope.h"
using namespace metal;

inline float normed_at(device const float* x, device const float* weight, float scale,
                       uint has_norm, uint i) {
    return has_norm != 0 ? (x[i] * scale) * weight[i] : x[i];
}

kernel void norm_rope_store(device float* q [[buffer(0)]], device float* k [[buffer(1)]],
                            device const float* v [[buffer(2)]],
                            device const float* q_norm [[buffer(3)]],
                            device const float* k_norm [[buffer(4)]],
                            device const int* positions [[buffer(5)]],
                            device const float* freq_factors [[buffer(6)]],
                            device uchar* k_cache [[buffer(7)]],
                            device uchar* v_cache [[buffer(8)]],
                            constant NormRopeStoreArgs& args [[buffer(9)]],
                            threadgroup float* partial [[threadgroup(0)]],
                            uint3 tg [[threadgroup_position_in_grid]],
                            uint tid [[thread_index_in_threadgroup]],
                            uint3 tg_size [[threads_per_threadgroup]],
                            uint sg [[simdgroup_index_in_threadgroup]],
                            uint n_sg [[simdgroups_per_threadgroup]],
                            uint lane [[thread_index_in_simdgroup]]) {
    const bool is_q = tg.x < args.heads_q;
    const uint head = is_q ? tg.x : tg.x - args.heads_q;
    const uint t = tg.y;
    const uint head_dim = args.head_dim;
    const uint n_threads = tg_size.x;
    device float* x = is_q ? q + (ulong(t) * args.heads_q + head) * head_dim
                           : k + (ulong(t) * args.heads_k + head) * head_dim;
    device const float* weight = is_q ? q_norm : k_norm;
    float scale = 1.0f;
    if (args.has_norm != 0) {
        scale = rms_scale(x, head_dim, args.eps, partial, tid, n_threads, sg, n_sg, lane);
    }
    const float out_scale = is_q ? args.q_scale : 1.0f;
    const uint p = args.pos0 + t;
    const uint cell = args.ring != 0 ? p % args.cells : p;
    const ulong at = (ulong(cell) * args.heads_k + head) * head_dim;
    const bool k_f16 = args.k_type == KV_F16;
    device half* kc = (device half*)(k_cache + kv_bytes(KV_F16, at));
    const int position = positions[t];
    for (uint i = tid; i < args.n_rot / 2; i += n_threads) {
        const uint a = rope_first(i, args.n_rot, args.mode);
        const uint b = rope_second(i, args.n_rot, args.mode);
        const float x0 = normed_at(x, weight, scale, args.has_norm, a);
        const float x1 = normed_at(x, weight, scale, args.has_norm, b);
        const float theta = rope_theta(position, i, args.n_rot, args.freq_base, args.freq_scale,
                                       args.has_freq_factors, freq_factors);
        const float c = cos(theta);
        const float s = sin(theta);
        const float y0 = rope_turned_first(x0, x1, c, s);
        const float y1 = rope_turned_second(x0, x1, c, s);
        x[a] = y0 * out_scale;
        x[b] = y1 * out_scale;
        if (!is_q && k_f16) {
            kc[a] = half(y0);
            kc[b] = half(y1);
        }
    }
    for (uint i = args.n_rot + tid; i < head_dim; i += n_threads) {
        const float y = normed_at(x, weight, scale, args.has_norm, i);
        x[i] = y * out_scale;
        if (!is_q && k_f16) kc[i] = half(y);
    }
    if (is_q) return;
    if (!k_f16) {
        threadgroup_barrier(mem_flags::mem_device);
        device uchar* kq = k_cache + kv_bytes(args.k_type, at);
        for (uint c = tid; c < head_dim / 32; c += n_threads) {
            kv_store_chunk(x, kq, args.k_type, c, head_dim);
        }
    }
    device const float* vr = v + (ulong(t) * args.heads_k + head) * head_dim;
    if (args.v_type != KV_F16) {
        device uchar* vq = v_cache + kv_bytes(args.v_type, at);
        for (uint c = tid; c < head_dim / 32; c += n_threads) {
            kv_store_chunk(vr, vq, args.v_type, c, head_dim);
        }
        return;
    }
    device half* vc = (device half*)(v_cache + kv_bytes(KV_F16, at));
    for (uint i = tid; i < head_dim; i += n_threads) vc[i] = half(vr[i]);
}
