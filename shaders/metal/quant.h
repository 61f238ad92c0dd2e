// Dequantization of one 32-value chunk of a weight row, per format: the one place the GPU reads
// the block layouts of blocks.h. Chunk c holds row values [32c, 32c + 32): a whole block for the
// 32-value formats, sub-block c % 8 of superblock c / 8 for the K-quants, 32 plain values (zero
// past n_in) for F32 / F16 / BF16. The formulas follow lib/quant/*.zig (ggml's dequantize_row_*),
// multiplication order included; test/metal-kernels.test.ts compares them with infer_dequantize.
#ifndef INFER_METAL_QUANT_H
#define INFER_METAL_QUANT_H

#include "blocks.h"

struct WeightF32 {
    static uint chunks(uint n_in) { return (n_in + 31) / 32; }
    static void chunk(device const uchar* row, uint c, uint n_in, thread float* out) {
        device const float* v = (device const float*)row;
        for (uint l = 0; l < 32; l++) out[l] = 32 * c + l < n_in ? v[32 * c + l] : 0.0f;
    }
};

struct WeightF16 {
    static uint chunks(uint n_in) { return (n_in + 31) / 32; }
    static void chunk(device const uchar* row, uint c, uint n_in, thread float* out) {
        device const half* v = (device const half*)row;
        for (uint l = 0; l < 32; l++) out[l] = 32 * c + l < n_in ? float(v[32 * c + l]) : 0.0f;
    }
};

// bfloat is Metal 3.1 and later; its bits are the top half of an f32, so read them as such.
struct WeightBF16 {
    static uint chunks(uint n_in) { return (n_in + 31) / 32; }
    static void chunk(device const uchar* row, uint c, uint n_in, thread float* out) {
        device const ushort* v = (device const ushort*)row;
        for (uint l = 0; l < 32; l++) {
            out[l] = 32 * c + l < n_in ? as_type<float>(uint(v[32 * c + l]) << 16) : 0.0f;
        }
    }
};

struct WeightQ4_0 {
    static uint chunks(uint n_in) { return n_in / QK4_0; }
    static void chunk(device const uchar* row, uint c, uint n_in, thread float* out) {
        device const block_q4_0* b = (device const block_q4_0*)row + c;
        const float d = float(b->d);
        for (uint j = 0; j < 16; j++) {
            out[j] = float(int(b->qs[j] & 15) - 8) * d;
            out[j + 16] = float(int(b->qs[j] >> 4) - 8) * d;
        }
    }
};

struct WeightQ5_0 {
    static uint chunks(uint n_in) { return n_in / QK5_0; }
    static void chunk(device const uchar* row, uint c, uint n_in, thread float* out) {
        device const block_q5_0* b = (device const block_q5_0*)row + c;
        const float d = float(b->d);
        const uint qh = uint(b->qh[0]) | uint(b->qh[1]) << 8 | uint(b->qh[2]) << 16 |
                        uint(b->qh[3]) << 24;
        for (uint j = 0; j < 16; j++) {
            const uint lo = uint(b->qs[j] & 15) | ((qh >> j) & 1) << 4;
            const uint hi = uint(b->qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
            out[j] = float(int(lo) - 16) * d;
            out[j + 16] = float(int(hi) - 16) * d;
        }
    }
};

struct WeightQ8_0 {
    static uint chunks(uint n_in) { return n_in / QK8_0; }
    static void chunk(device const uchar* row, uint c, uint n_in, thread float* out) {
        device const block_q8_0* b = (device const block_q8_0*)row + c;
        const float d = float(b->d);
        for (uint j = 0; j < 32; j++) out[j] = float(b->qs[j]) * d;
    }
};

// Scale and min of sub-block j (0..7) from the 12 packed bytes (ggml's get_scale_min_k4).
inline void scale_min_k4(device const uint8_t* s, uint j, thread float& sc, thread float& m) {
    if (j < 4) {
        sc = float(s[j] & 63);
        m = float(s[j + 4] & 63);
    } else {
        sc = float((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        m = float((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

struct WeightQ4_K {
    static uint chunks(uint n_in) { return n_in / 32; }
    static void chunk(device const uchar* row, uint c, uint n_in, thread float* out) {
        device const block_q4_k* b = (device const block_q4_k*)row + c / 8;
        const uint j = c % 8;
        float sc, m;
        scale_min_k4(b->scales, j, sc, m);
        const float d = float(b->d) * sc;
        const float dm = float(b->dmin) * m;
        device const uint8_t* q = b->qs + 32 * (j / 2);
        const uint shift = 4 * (j % 2);
        for (uint l = 0; l < 32; l++) out[l] = d * float((q[l] >> shift) & 15) - dm;
    }
};

struct WeightQ5_K {
    static uint chunks(uint n_in) { return n_in / 32; }
    static void chunk(device const uchar* row, uint c, uint n_in, thread float* out) {
        device const block_q5_k* b = (device const block_q5_k*)row + c / 8;
        const uint j = c % 8;
        float sc, m;
        scale_min_k4(b->scales, j, sc, m);
        const float d = float(b->d) * sc;
        const float dm = float(b->dmin) * m;
        device const uint8_t* q = b->qs + 32 * (j / 2);
        const uint shift = 4 * (j % 2);
        for (uint l = 0; l < 32; l++) {
            const uint v = ((q[l] >> shift) & 15) | ((uint(b->qh[l]) >> j) & 1) << 4;
            out[l] = d * float(v) - dm;
        }
    }
};

struct WeightQ6_K {
    static uint chunks(uint n_in) { return n_in / 32; }
    static void chunk(device const uchar* row, uint c, uint n_in, thread float* out) {
        device const block_q6_k* b = (device const block_q6_k*)row + c / 8;
        const uint j = c % 8;        // 32-value group of the superblock
        const uint half_ = j / 4;    // which 128-value half
        const uint k = j % 4;        // group within the half
        device const uint8_t* ql = b->ql + 64 * half_ + 32 * (k & 1);
        device const uint8_t* qh = b->qh + 32 * half_;
        const float d = float(b->d);
        for (uint l = 0; l < 32; l++) {
            const uint low = k < 2 ? uint(ql[l] & 15) : uint(ql[l] >> 4);
            const int q = int(low | ((uint(qh[l]) >> (2 * k)) & 3) << 4) - 32;
            const float scale = d * float(b->scales[2 * j + l / 16]);
            out[l] = scale * float(q);
        }
    }
};

#endif
