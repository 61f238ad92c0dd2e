// Rotary position embedding (Su et al. 2021), in place on x[n_tok][n_heads][head_dim], one thread
// per rotated pair: pair i (< n_rot/2) of the head at grid (i, head, token) turns by
//   theta_i = pos · freq_scale · freq_base^(-2i/n_rot) / freq_factors[i]
// normal mode: the pair (2i, 2i+1); NeoX mode (2): the pair (i, i + n_rot/2). Dimensions past
// n_rot are untouched. theta is formed as lib/cpu/rope.zig (and ggml's CPU rope cache) forms it:
// (float)pos multiplied i times by powf(base, -2/n_rot), not pos · pow(base, -2i/n_rot), whose
// rounding differs by ulps of an angle that reaches thousands of radians at long positions.
#include <metal_stdlib>
#include "args.h"
using namespace metal;

kernel void rope(device float* x [[buffer(0)]], device const int* positions [[buffer(1)]],
                 device const float* freq_factors [[buffer(2)]],
                 constant RopeArgs& args [[buffer(3)]], uint3 pos [[thread_position_in_grid]]) {
    const uint i = pos.x;
    const uint head = pos.y;
    const uint tok = pos.z;
    const uint n_pairs = args.n_rot / 2;
    if (i >= n_pairs || head >= args.n_heads || tok >= args.n_tok) return;
    const float theta_scale = pow(args.freq_base, -2.0f / float(args.n_rot));
    float theta = float(positions[tok]);
    for (uint k = 0; k < i; k++) theta *= theta_scale;
    if (args.has_freq_factors != 0) theta = theta / freq_factors[i];
    theta = args.freq_scale * theta;
    const float c = cos(theta);
    const float s = sin(theta);
    device float* h = x + (ulong(tok) * args.n_heads + head) * args.head_dim;
    const uint a = args.mode == 2 ? i : 2 * i;
    const uint b = args.mode == 2 ? i + n_pairs : 2 * i + 1;
    const float x0 = h[a];
    const float x1 = h[b];
    h[a] = x0 * c - x1 * s;
    h[b] = x0 * s + x1 * c;
}
