// The KV cache's types, as the CPU (lib/cpu/kv_quant.zig) and CUDA store them: f16, or ggml's
// Q8_0 / Q4_0 blocks (blocks.h), every 32 consecutive values of a cell's row sharing an f16
// scale (a KV head's head_dim is then a whole number of blocks). A cache is bound as bytes and
// its type (KV_* below, ggml's type ids) travels in the kernel's arguments: one branch, uniform
// over the whole dispatch, instead of a kernel per pair of K and V types.
// Storing quantizes a 32-value block in one thread exactly as the CPU does (Q8_0: d = amax/127,
// codes rounded half to even, ggml's SIMD quantizer; Q4_0: ggml's quantize_row_q4_0_ref), so the
// bytes are the CPU's. Reading dequantizes only what the reader holds (a lane's dims, a tile's
// rows), never the whole cache.
#ifndef INFER_METAL_KV_H
#define INFER_METAL_KV_H

#include "blocks.h"

#define KV_F16 1
#define KV_Q4_0 2
#define KV_Q8_0 8

// Bytes of `values` consecutive values (a multiple of 32 for the block types) of a cache.
inline ulong kv_bytes(uint type, ulong values) {
    if (type == KV_Q8_0) return values / QK8_0 * sizeof(block_q8_0);
    if (type == KV_Q4_0) return values / QK4_0 * sizeof(block_q4_0);
    return values * 2;
}

// Value d of a row of the cache (row: the bytes of its first value, a block boundary).
inline float kv_value(device const uchar* row, uint type, uint d) {
    if (type == KV_Q8_0) {
        device const block_q8_0* b = (device const block_q8_0*)row + d / QK8_0;
        return float(b->qs[d % QK8_0]) * float(b->d);
    }
    if (type == KV_Q4_0) {
        device const block_q4_0* b = (device const block_q4_0*)row + d / QK4_0;
        const uint j = d % QK4_0;
        const int code = j < 16 ? int(b->qs[j] & 15) : int(b->qs[j - 16] >> 4);
        return float(code - 8) * float(b->d);
    }
    return float(((device const half*)row)[d]);
}

// Values d .. d + n - 1 of a row of a block type (n ≤ 32 and d a multiple of n, so they lie in
// one block: its scale is read once).
inline void kv_values_in_block(device const uchar* row, uint type, uint d, uint n,
                               thread float* out) {
    if (type == KV_Q8_0) {
        device const block_q8_0* b = (device const block_q8_0*)row + d / QK8_0;
        const float scale = float(b->d);
        for (uint i = 0; i < n; i++) out[i] = float(b->qs[(d + i) % QK8_0]) * scale;
    } else {
        device const block_q4_0* b = (device const block_q4_0*)row + d / QK4_0;
        const float scale = float(b->d);
        for (uint i = 0; i < n; i++) {
            const uint j = (d + i) % QK4_0;
            const int code = j < 16 ? int(b->qs[j] & 15) : int(b->qs[j - 16] >> 4);
            out[i] = float(code - 8) * scale;
        }
    }
}

inline void kv_quantize_q8_0(device const float* x, device block_q8_0* b) {
    float amax = 0.0f;
    bool nan = false;
    for (uint i = 0; i < QK8_0; i++) {
        amax = max(amax, fabs(x[i]));
        nan = nan || isnan(x[i]);
    }
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    // a block holding a NaN keeps d = NaN, as the CPU does, so a NaN is not hidden as a code
    b->d = nan ? half(NAN) : half(d);
    for (uint i = 0; i < QK8_0; i++) {
        const float r = rint(x[i] * id);
        b->qs[i] = int8_t(int(clamp(r, -128.0f, 127.0f)));
    }
}

inline void kv_quantize_q4_0(device const float* x, device block_q4_0* b) {
    float amax = 0.0f;
    float vmax = 0.0f;
    for (uint i = 0; i < QK4_0; i++) {
        if (fabs(x[i]) > amax) {
            amax = fabs(x[i]);
            vmax = x[i];
        }
    }
    const float d = vmax / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = half(d);
    for (uint j = 0; j < 16; j++) {
        // the product and the offset in two statements: ggml rounds x·id before adding 8.5, and
        // a fused multiply-add would move a code that sits on a boundary
        const float s0 = x[j] * id;
        const float s1 = x[j + 16] * id;
        const uint q0 = uint(min(15.0f, trunc(s0 + 8.5f)));
        const uint q1 = uint(min(15.0f, trunc(s1 + 8.5f)));
        b->qs[j] = uchar(q0 | (q1 << 4));
    }
}

// Stores values [32c, 32c + 32) of a row of n values (src) into the cache row dst as `type`:
// one block for Q8_0 / Q4_0 (n a multiple of 32), up to 32 halves for f16.
inline void kv_store_chunk(device const float* src, device uchar* dst, uint type, uint c, uint n) {
    if (type == KV_Q8_0) {
        kv_quantize_q8_0(src + c * QK8_0, (device block_q8_0*)dst + c);
    } else if (type == KV_Q4_0) {
        kv_quantize_q4_0(src + c * QK4_0, (device block_q4_0*)dst + c);
    } else {
        device half* h = (device half*)dst;
        for (uint i = c * 32; i < min(n, c * 32 + 32); i++) h[i] = half(src[i]);
    }
}

#endif
