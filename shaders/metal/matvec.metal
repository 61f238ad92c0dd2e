// Matrix-vector products for decode (a few tokens): y[t][o] = W[o] · x[t], dequantizing W on the
// fly, for the types matvec_rows.metal leaves (F32, F16, BF16). One simdgroup per output
// row: lane l takes chunks l, l + 32, ... of the row (quant.h), multiplies them with x in
// registers, and simd_sum adds the 32 partial sums. A threadgroup holds
// any number of simdgroups (rows tg.x·n_sg .. + n_sg); grid.y is the token.
#include <metal_stdlib>
#include "args.h"
#include "quant.h"
using namespace metal;

template <typename W>
inline void matvec(device const uchar* w, device const float* x, device float* y,
                   constant MatvecArgs& args, uint3 tg, uint sg, uint n_sg, uint lane) {
    const uint row = tg.x * n_sg + sg;
    const uint tok = tg.y;
    // Whole simdgroups leave together, so the simd_sum below sees every lane of the ones left.
    if (row >= args.n_out || tok >= args.n_tok) return;
    device const uchar* w_row = w + ulong(row) * args.row_bytes;
    device const float* x_row = x + ulong(tok) * args.n_in;
    float sum = 0.0f;
    float v[32];
    for (uint c = lane; c < W::chunks(args.n_in); c += 32) {
        W::chunk(w_row, c, args.n_in, v);
        device const float* xc = x_row + 32 * c;
        const uint n = min(32u, args.n_in - 32 * c);
        for (uint l = 0; l < n; l++) sum += v[l] * xc[l];
    }
    sum = simd_sum(sum);
    if (lane == 0) y[ulong(tok) * args.n_out + row] = sum;
}

kernel void matvec_f32(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                       device float* y [[buffer(2)]], constant MatvecArgs& args [[buffer(3)]],
                       uint3 tg [[threadgroup_position_in_grid]],
                       uint sg [[simdgroup_index_in_threadgroup]],
                       uint n_sg [[simdgroups_per_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]]) {
    matvec<WeightF32>(w, x, y, args, tg, sg, n_sg, lane);
}

kernel void matvec_f16(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                       device float* y [[buffer(2)]], constant MatvecArgs& args [[buffer(3)]],
                       uint3 tg [[threadgroup_position_in_grid]],
                       uint sg [[simdgroup_index_in_threadgroup]],
                       uint n_sg [[simdgroups_per_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]]) {
    matvec<WeightF16>(w, x, y, args, tg, sg, n_sg, lane);
}

kernel void matvec_bf16(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatvecArgs& args [[buffer(3)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint n_sg [[simdgroups_per_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matvec<WeightBF16>(w, x, y, args, tg, sg, n_sg, lane);
}
