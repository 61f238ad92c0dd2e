// RMS normalisation (Zhang & Sennrich 2019), one threadgroup per row:
//   out = (x · 1/sqrt(mean(x²) + eps)) · weight, or residual += that (Gemma's post-norms).
// The scale is norm.h's rms_scale. `out` may alias `x`: every thread writes only the elements it
// read. The group position is a uint3 like the group size: MSL requires the position and size
// attributes of one kernel to have one component count.
#include <metal_stdlib>
#include "args.h"
#include "norm.h"
using namespace metal;

kernel void rms_norm(device const float* x [[buffer(0)]], device const float* weight [[buffer(1)]],
                     device float* out [[buffer(2)]], constant RmsNormArgs& args [[buffer(3)]],
                     threadgroup float* partial [[threadgroup(0)]],
                     uint3 tg [[threadgroup_position_in_grid]],
                     uint tid [[thread_index_in_threadgroup]],
                     uint3 tg_size [[threads_per_threadgroup]],
                     uint sg [[simdgroup_index_in_threadgroup]],
                     uint n_sg [[simdgroups_per_threadgroup]],
                     uint lane [[thread_index_in_simdgroup]]) {
    const uint row = tg.x;
    device const float* xr = x + ulong(row) * args.n_cols;
    device float* yr = out + ulong(row) * args.n_cols;
    const uint n_threads = tg_size.x;
    const float scale = rms_scale(xr, args.n_cols, args.eps, partial, tid, n_threads, sg, n_sg, lane);
    for (uint i = tid; i < args.n_cols; i += n_threads) {
        const float scaled = xr[i] * scale;
        yr[i] = args.has_weight != 0 ? scaled * weight[i] : scaled;
    }
}

kernel void rms_norm_add(device const float* x [[buffer(0)]],
                         device const float* weight [[buffer(1)]],
                         device float* residual [[buffer(2)]],
                         constant RmsNormArgs& args [[buffer(3)]],
                         threadgroup float* partial [[threadgroup(0)]],
                         uint3 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]],
                         uint3 tg_size [[threads_per_threadgroup]],
                         uint sg [[simdgroup_index_in_threadgroup]],
                         uint n_sg [[simdgroups_per_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]]) {
    const uint row = tg.x;
    device const float* xr = x + ulong(row) * args.n_cols;
    device float* rr = residual + ulong(row) * args.n_cols;
    const uint n_threads = tg_size.x;
    const float scale = rms_scale(xr, args.n_cols, args.eps, partial, tid, n_threads, sg, n_sg, lane);
    for (uint i = tid; i < args.n_cols; i += n_threads) rr[i] += (xr[i] * scale) * weight[i];
}
