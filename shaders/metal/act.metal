// Element-wise ops, one thread per value: the gated activations of the feed-forward block
// (Shazeer 2020: out = act(gate) · up with GELU-tanh or SiLU), residual adds, scaling, and the
// broadcast add of a bias row. The CPU reads GELU from an f16 table as llama.cpp does
// (lib/cpu/act.zig); here it is computed in f32, so the two differ by that table's rounding.
#include <metal_stdlib>
#include "args.h"
using namespace metal;

constant float gelu_sqrt_2_over_pi = 0.79788456080286535587989211986876f;
constant float gelu_coef_a = 0.044715f;

kernel void gelu_mul(device const float* gate [[buffer(0)]], device const float* up [[buffer(1)]],
                     device float* out [[buffer(2)]], constant EltwiseArgs& args [[buffer(3)]],
                     uint i [[thread_position_in_grid]]) {
    if (i >= args.n) return;
    const float g = gate[i];
    const float inner = gelu_sqrt_2_over_pi * g * (1.0f + gelu_coef_a * g * g);
    out[i] = 0.5f * g * (1.0f + tanh(inner)) * up[i];
}

kernel void silu_mul(device const float* gate [[buffer(0)]], device const float* up [[buffer(1)]],
                     device float* out [[buffer(2)]], constant EltwiseArgs& args [[buffer(3)]],
                     uint i [[thread_position_in_grid]]) {
    if (i >= args.n) return;
    const float g = gate[i];
    out[i] = g / (1.0f + exp(-g)) * up[i];
}

kernel void add(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]],
                device float* out [[buffer(2)]], constant EltwiseArgs& args [[buffer(3)]],
                uint i [[thread_position_in_grid]]) {
    if (i >= args.n) return;
    out[i] = a[i] + b[i];
}

kernel void scale(device float* x [[buffer(0)]], constant EltwiseArgs& args [[buffer(1)]],
                  uint i [[thread_position_in_grid]]) {
    if (i >= args.n) return;
    x[i] = x[i] * args.scale;
}

kernel void add_row_bias(device float* x [[buffer(0)]], device const float* bias [[buffer(1)]],
                         constant EltwiseArgs& args [[buffer(2)]],
                         uint i [[thread_position_in_grid]]) {
    if (i >= args.n) return;
    x[i] = x[i] + bias[i % args.n_cols];
}
