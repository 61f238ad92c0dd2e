// Decode matvecs for the quantized types (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K), shaped as
// llama.cpp's Metal kernels are shaped (its design, not its code): decode is bound by reading the
// weights once, so a simdgroup computes R rows at a time (ROWS_* in args.h), each lane loads its
// slice of the activation into registers once per block with float4 loads and reuses it for the
// R rows, the sum of that slice is taken once so a block's offset or minimum costs one multiply
// per row instead of one per value, and whole blocks are spread over the lanes so that each lane
// reads contiguous bytes of a block:
//   32-value blocks: two lanes per block, 16 blocks a pass; lane h of a pair takes quant bytes
//                    8h..8h+7 (Q4_0/Q5_0: values 8h.. and 16 + 8h.., low and high nibbles) or
//                    16h..16h+15 (Q8_0);
//   256-value K blocks: eight lanes per superblock, 4 superblocks a pass; each lane 32 values.
// A threadgroup holds n_sg simdgroups: rows (tg.x · n_sg + sg) · R .. + R; grid.y is the token.
// The dequantization formulas are quant.h's, regrouped; test/metal-kernels.test.ts checks every
// type against the CPU's dequantized weights.
#include <metal_stdlib>
#include "args.h"
#include "quant.h"
using namespace metal;

inline float sum4(float4 v) { return v.x + v.y + v.z + v.w; }

// Four quant bytes as floats: (q >> shift) & mask, or signed. Filled element by element, which
// every compiler that checks these sources takes (a float4 of four scalars is MSL-only syntax).
inline float4 bits4(device const uint8_t* q, uint shift, uint mask) {
    float4 v;
    for (uint c = 0; c < 4; c++) v[c] = float((uint(q[c]) >> shift) & mask);
    return v;
}

inline float4 int4_of(device const int8_t* q) {
    float4 v;
    for (uint c = 0; c < 4; c++) v[c] = float(q[c]);
    return v;
}

// Q4_0 and Q5_0: lane half h holds x[8h .. 8h + 8) in xv[0..1] and x[16 + 8h ..) in xv[2..3].
inline float load_x_q4(device const float* xb, uint h, thread float4* xv) {
    device const float4* lo = (device const float4*)(xb + 8 * h);
    device const float4* hi = (device const float4*)(xb + 16 + 8 * h);
    xv[0] = lo[0];
    xv[1] = lo[1];
    xv[2] = hi[0];
    xv[3] = hi[1];
    return sum4(xv[0]) + sum4(xv[1]) + sum4(xv[2]) + sum4(xv[3]);
}

struct RowsQ4_0 {
    static float load_x(device const float* xb, uint h, thread float4* xv) {
        return load_x_q4(xb, h, xv);
    }
    static float row_dot(device const uchar* row, uint ib, uint h, thread const float4* xv,
                         float sum_x) {
        device const block_q4_0* b = (device const block_q4_0*)row + ib;
        device const uint8_t* q = b->qs + 8 * h;
        float acc = 0.0f;
        for (uint i = 0; i < 2; i++) {
            acc += dot(bits4(q + 4 * i, 0, 15), xv[i]) + dot(bits4(q + 4 * i, 4, 15), xv[2 + i]);
        }
        return float(b->d) * (acc - 8.0f * sum_x);
    }
};

struct RowsQ5_0 {
    static float load_x(device const float* xb, uint h, thread float4* xv) {
        return load_x_q4(xb, h, xv);
    }
    static float row_dot(device const uchar* row, uint ib, uint h, thread const float4* xv,
                         float sum_x) {
        device const block_q5_0* b = (device const block_q5_0*)row + ib;
        device const uint8_t* q = b->qs + 8 * h;
        const uint qh = uint(b->qh[0]) | uint(b->qh[1]) << 8 | uint(b->qh[2]) << 16 |
                        uint(b->qh[3]) << 24;
        const uint lo_bits = qh >> (8 * h), hi_bits = qh >> (16 + 8 * h);
        float acc = 0.0f;
        for (uint i = 0; i < 2; i++) {
            float4 lo, hi;
            for (uint k = 0; k < 4; k++) {
                const uint j = 4 * i + k;
                lo[k] = float(uint(q[j] & 15) | ((lo_bits >> j) & 1) << 4);
                hi[k] = float(uint(q[j] >> 4) | ((hi_bits >> j) & 1) << 4);
            }
            acc += dot(lo, xv[i]) + dot(hi, xv[2 + i]);
        }
        return float(b->d) * (acc - 16.0f * sum_x);
    }
};

// Q8_0: lane half h holds x[16h .. 16h + 16).
struct RowsQ8_0 {
    static float load_x(device const float* xb, uint h, thread float4* xv) {
        device const float4* v = (device const float4*)(xb + 16 * h);
        for (uint i = 0; i < 4; i++) xv[i] = v[i];
        return 0.0f;
    }
    static float row_dot(device const uchar* row, uint ib, uint h, thread const float4* xv,
                         float sum_x) {
        device const block_q8_0* b = (device const block_q8_0*)row + ib;
        device const int8_t* q = b->qs + 16 * h;
        float acc = 0.0f;
        for (uint i = 0; i < 4; i++) {
            acc += dot(int4_of(q + 4 * i), xv[i]);
        }
        return float(b->d) * acc;
    }
};

template <typename B, uint R>
inline void matvec_rows_q32(device const uchar* w, device const float* x, device float* y,
                            constant MatvecArgs& args, uint3 tg, uint sg, uint n_sg, uint lane) {
    const uint first = (tg.x * n_sg + sg) * R;
    const uint tok = tg.y;
    // Whole simdgroups leave together, so the simd_sums below see every lane of the ones left.
    if (first >= args.n_out || tok >= args.n_tok) return;
    device const float* x_row = x + ulong(tok) * args.n_in;
    const uint nb = args.n_in / 32, h = lane % 2;
    float acc[R];
    for (uint r = 0; r < R; r++) acc[r] = 0.0f;
    for (uint ib = lane / 2; ib < nb; ib += 16) {
        float4 xv[4];
        const float sum_x = B::load_x(x_row + 32 * ib, h, xv);
        for (uint r = 0; r < R && first + r < args.n_out; r++) {
            acc[r] += B::row_dot(w + ulong(first + r) * args.row_bytes, ib, h, xv, sum_x);
        }
    }
    for (uint r = 0; r < R && first + r < args.n_out; r++) {
        const float sum = simd_sum(acc[r]);
        if (lane == 0) y[ulong(tok) * args.n_out + first + r] = sum;
    }
}

// Q4_K: lane s of a superblock's eight takes the 16 quant bytes 32p + 16h .. (p = s / 2,
// h = s % 2): low nibbles are values 64p + 16h + i of sub-block 2p, high nibbles values
// 64p + 32 + 16h + i of sub-block 2p + 1.
struct RowsQ4_K {
    static void load_x(device const float* xb, uint s, thread float4* xv, thread float* sums) {
        const uint p = s / 2, h = s % 2;
        device const float4* lo = (device const float4*)(xb + 64 * p + 16 * h);
        device const float4* hi = (device const float4*)(xb + 64 * p + 32 + 16 * h);
        sums[0] = sums[1] = 0.0f;
        for (uint i = 0; i < 4; i++) {
            xv[i] = lo[i];
            xv[4 + i] = hi[i];
            sums[0] += sum4(xv[i]);
            sums[1] += sum4(xv[4 + i]);
        }
    }
    static float row_dot(device const uchar* row, uint ib, uint s, thread const float4* xv,
                         thread const float* sums) {
        device const block_q4_k* b = (device const block_q4_k*)row + ib;
        const uint p = s / 2, h = s % 2;
        device const uint8_t* q = b->qs + 32 * p + 16 * h;
        float sc0, m0, sc1, m1;
        scale_min_k4(b->scales, 2 * p, sc0, m0);
        scale_min_k4(b->scales, 2 * p + 1, sc1, m1);
        float lo = 0.0f, hi = 0.0f;
        for (uint i = 0; i < 4; i++) {
            lo += dot(bits4(q + 4 * i, 0, 15), xv[i]);
            hi += dot(bits4(q + 4 * i, 4, 15), xv[4 + i]);
        }
        return float(b->d) * (sc0 * lo + sc1 * hi) - float(b->dmin) * (m0 * sums[0] + m1 * sums[1]);
    }
};

// Q5_K: Q4_K's lanes, each value's fifth bit in qh[16h + i]: bit 2p for the low nibbles, 2p + 1
// for the high ones.
struct RowsQ5_K {
    static void load_x(device const float* xb, uint s, thread float4* xv, thread float* sums) {
        RowsQ4_K::load_x(xb, s, xv, sums);
    }
    static float row_dot(device const uchar* row, uint ib, uint s, thread const float4* xv,
                         thread const float* sums) {
        device const block_q5_k* b = (device const block_q5_k*)row + ib;
        const uint p = s / 2, h = s % 2;
        device const uint8_t* q = b->qs + 32 * p + 16 * h;
        device const uint8_t* qh = b->qh + 16 * h;
        float sc0, m0, sc1, m1;
        scale_min_k4(b->scales, 2 * p, sc0, m0);
        scale_min_k4(b->scales, 2 * p + 1, sc1, m1);
        float lo = 0.0f, hi = 0.0f;
        for (uint i = 0; i < 4; i++) {
            float4 vl, vh;
            for (uint c = 0; c < 4; c++) {
                const uint l = 4 * i + c;
                vl[c] = float(uint(q[l] & 15) | ((uint(qh[l]) >> (2 * p)) & 1) << 4);
                vh[c] = float(uint(q[l] >> 4) | ((uint(qh[l]) >> (2 * p + 1)) & 1) << 4);
            }
            lo += dot(vl, xv[i]);
            hi += dot(vh, xv[4 + i]);
        }
        return float(b->d) * (sc0 * lo + sc1 * hi) - float(b->dmin) * (m0 * sums[0] + m1 * sums[1]);
    }
};

// Q6_K: lane s of a superblock's eight takes half f = s / 4 and values l0 .. l0 + 8
// (l0 = 8 (s % 4)) of each of that half's four 32-value groups k: value 128f + 32k + l, its low
// four bits in ql[64f + 32 (k % 2) + l] (low nibble for k < 2), its top two in bits 2k of
// qh[32f + l], and one scale per group (l0 .. l0 + 8 lies inside one 16-value scale).
struct RowsQ6_K {
    static void load_x(device const float* xb, uint s, thread float4* xv, thread float* sums) {
        const uint f = s / 4, l0 = 8 * (s % 4);
        for (uint k = 0; k < 4; k++) {
            device const float4* v = (device const float4*)(xb + 128 * f + 32 * k + l0);
            xv[2 * k] = v[0];
            xv[2 * k + 1] = v[1];
            sums[k] = sum4(xv[2 * k]) + sum4(xv[2 * k + 1]);
        }
    }
    static float row_dot(device const uchar* row, uint ib, uint s, thread const float4* xv,
                         thread const float* sums) {
        device const block_q6_k* b = (device const block_q6_k*)row + ib;
        const uint f = s / 4, l0 = 8 * (s % 4);
        device const uint8_t* ql = b->ql + 64 * f + l0;
        device const uint8_t* qh = b->qh + 32 * f + l0;
        float by_group = 0.0f;
        for (uint k = 0; k < 4; k++) {
            device const uint8_t* qlk = ql + 32 * (k % 2);
            const uint shift = k < 2 ? 0 : 4;
            float acc = 0.0f;
            for (uint i = 0; i < 2; i++) {
                float4 q;
                for (uint c = 0; c < 4; c++) {
                    const uint l = 4 * i + c;
                    const uint high = (uint(qh[l]) >> (2 * k)) & 3;
                    q[c] = float(((uint(qlk[l]) >> shift) & 15) | high << 4);
                }
                acc += dot(q, xv[2 * k + i]);
            }
            const float scale = float(b->scales[8 * f + 2 * k + l0 / 16]);
            by_group += scale * (acc - 32.0f * sums[k]);
        }
        return float(b->d) * by_group;
    }
};

template <typename B, uint R>
inline void matvec_rows_k(device const uchar* w, device const float* x, device float* y,
                          constant MatvecArgs& args, uint3 tg, uint sg, uint n_sg, uint lane) {
    const uint first = (tg.x * n_sg + sg) * R;
    const uint tok = tg.y;
    if (first >= args.n_out || tok >= args.n_tok) return;
    device const float* x_row = x + ulong(tok) * args.n_in;
    const uint nb = args.n_in / 256, s = lane % 8;
    float acc[R];
    for (uint r = 0; r < R; r++) acc[r] = 0.0f;
    for (uint ib = lane / 8; ib < nb; ib += 4) {
        float4 xv[8];
        float sums[4];
        B::load_x(x_row + 256 * ib, s, xv, sums);
        for (uint r = 0; r < R && first + r < args.n_out; r++) {
            acc[r] += B::row_dot(w + ulong(first + r) * args.row_bytes, ib, s, xv, sums);
        }
    }
    for (uint r = 0; r < R && first + r < args.n_out; r++) {
        const float sum = simd_sum(acc[r]);
        if (lane == 0) y[ulong(tok) * args.n_out + first + r] = sum;
    }
}

kernel void matvec_q4_0(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatvecArgs& args [[buffer(3)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint n_sg [[simdgroups_per_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matvec_rows_q32<RowsQ4_0, MATVEC_ROWS_Q4_0>(w, x, y, args, tg, sg, n_sg, lane);
}

kernel void matvec_q5_0(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatvecArgs& args [[buffer(3)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint n_sg [[simdgroups_per_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matvec_rows_q32<RowsQ5_0, MATVEC_ROWS_Q5_0>(w, x, y, args, tg, sg, n_sg, lane);
}

kernel void matvec_q8_0(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatvecArgs& args [[buffer(3)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint n_sg [[simdgroups_per_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matvec_rows_q32<RowsQ8_0, MATVEC_ROWS_Q8_0>(w, x, y, args, tg, sg, n_sg, lane);
}

kernel void matvec_q4_k(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatvecArgs& args [[buffer(3)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint n_sg [[simdgroups_per_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matvec_rows_k<RowsQ4_K, MATVEC_ROWS_Q4_K>(w, x, y, args, tg, sg, n_sg, lane);
}

kernel void matvec_q5_k(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatvecArgs& args [[buffer(3)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint n_sg [[simdgroups_per_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matvec_rows_k<RowsQ5_K, MATVEC_ROWS_Q5_K>(w, x, y, args, tg, sg, n_sg, lane);
}

kernel void matvec_q6_k(device const uchar* w [[buffer(0)]], device const float* x [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MatvecArgs& args [[buffer(3)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint sg [[simdgroup_index_in_threadgroup]],
                        uint n_sg [[simdgroups_per_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    matvec_rows_k<RowsQ6_K, MATVEC_ROWS_Q6_K>(w, x, y, args, tg, sg, n_sg, lane);
}
