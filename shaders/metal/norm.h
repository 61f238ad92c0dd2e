// The RMSNorm scale of one row, shared by norm.metal and norm_rope_store.metal so that the fused
// kernel sums the squares in the same order (same threads, lanes and simdgroups) as rms_norm.
// Squares are summed per thread, then per simdgroup (simd_sum), then across simdgroups through
// threadgroup memory (one float per simdgroup) after a barrier; every thread of the group must
// call it. The CPU sums in f64 (lib/cpu/norm.zig); f32 here.
#ifndef INFER_METAL_NORM_H
#define INFER_METAL_NORM_H

inline float rms_scale(device const float* x, uint n_cols, float eps, threadgroup float* partial,
                       uint tid, uint n_threads, uint sg, uint n_sg, uint lane) {
    float sum = 0.0f;
    for (uint i = tid; i < n_cols; i += n_threads) sum += x[i] * x[i];
    sum = simd_sum(sum);
    if (lane == 0) partial[sg] = sum;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = 0.0f;
    for (uint s = 0; s < n_sg; s++) total += partial[s];
    return 1.0f / sqrt(total / float(n_cols) + eps);
}

#endif
