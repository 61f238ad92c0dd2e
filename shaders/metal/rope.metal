// Rotary position embedding (Su et al. 2021), in place on x[n_tok][n_heads][head_dim], one thread
// per rotated pair: pair i (< n_rot/2) of the head at grid (i, head, token), turned as rope.h
// says. Dimensions past n_rot are untouched.
#include <metal_stdlib>
#include "args.h"
#include "rope.h"
using namespace metal;

kernel void rope(device float* x [[buffer(0)]], device const int* positions [[buffer(1)]],
                 device const float* freq_factors [[buffer(2)]],
                 constant RopeArgs& args [[buffer(3)]], uint3 pos [[thread_position_in_grid]]) {
    const uint i = pos.x;
    const uint head = pos.y;
    const uint tok = pos.z;
    const uint n_pairs = args.n_rot / 2;
    if (i >= n_pairs || head >= args.n_heads || tok >= args.n_tok) return;
    const float theta = rope_theta(positions[tok], i, args.n_rot, args.freq_base, args.freq_scale,
                                   args.has_freq_factors, freq_factors);
    const float c = cos(theta);
    const float s = sin(theta);
    device float* h = x + (ulong(tok) * args.n_heads + head) * args.head_dim;
    const uint a = rope_first(i, args.n_rot, args.mode);
    const uint b = rope_second(i, args.n_rot, args.mode);
    const float x0 = h[a];
    const float x1 = h[b];
    h[a] = rope_turned_first(x0, x1, c, s);
    h[b] = rope_turned_second(x0, x1, c, s);
}
