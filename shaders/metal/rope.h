// One RoPE pair, shared by rope.metal and norm_rope_store.metal so that both turn a pair with the
// same arithmetic. Pair i (< n_rot/2) turns by
//   theta_i = pos · freq_scale · freq_base^(-2i/n_rot) / freq_factors[i]
// normal mode: the pair (2i, 2i+1); NeoX mode (2): the pair (i, i + n_rot/2). theta is formed as
// lib/cpu/rope.zig (and ggml's CPU rope cache) forms it: (float)pos multiplied i times by
// powf(base, -2/n_rot), not pos · pow(base, -2i/n_rot), whose rounding differs by ulps of an
// angle that reaches thousands of radians at long positions.
#ifndef INFER_METAL_ROPE_H
#define INFER_METAL_ROPE_H

inline float rope_theta(int position, uint i, uint n_rot, float freq_base, float freq_scale,
                        uint has_freq_factors, device const float* freq_factors) {
    const float theta_scale = pow(freq_base, -2.0f / float(n_rot));
    float theta = float(position);
    for (uint k = 0; k < i; k++) theta *= theta_scale;
    if (has_freq_factors != 0) theta = theta / freq_factors[i];
    return freq_scale * theta;
}

inline uint rope_first(uint i, uint n_rot, uint mode) { return mode == 2 ? i : 2 * i; }
inline uint rope_second(uint i, uint n_rot, uint mode) {
    return mode == 2 ? i + n_rot / 2 : 2 * i + 1;
}

// The pair (x0, x1) turned by theta: (x0 c - x1 s, x0 s + x1 c).
inline float rope_turned_first(float x0, float x1, float c, float s) { return x0 * c - x1 * s; }
inline float rope_turned_second(float x0, float x1, float c, float s) { return x0 * s + x1 * c; }

#endif
