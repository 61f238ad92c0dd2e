// The quant block layouts the Metal kernels read, as ggml stores them in GGUF (ggml-common.h):
// one header for three compilers. Metal includes it with `half` native; the Linux emulation
// (compat/metal_emu.h) includes it as C++ with its own `half`; lib/metal/blocks_test.zig
// @cImport-s it as C, where a half is its 16 bits, and checks every size and field offset
// against the extern structs of lib/quant/*.zig, so the GPU and CPU layouts cannot drift.
#ifndef INFER_METAL_BLOCKS_H
#define INFER_METAL_BLOCKS_H

#if defined(__METAL_VERSION__) || defined(INFER_METAL_EMULATION)
typedef half infer_half;
#else
#include <stdint.h>
typedef uint16_t infer_half; // the bits of an IEEE binary16; C has no portable half type
#endif

#define QK4_0 32
#define QK5_0 32
#define QK8_0 32
#define QK_K 256
#define K_SCALE_SIZE 12

// 32 values: ((qs[j] & 15) - 8)·d for j < 16, ((qs[j - 16] >> 4) - 8)·d after.
typedef struct {
    infer_half d;
    uint8_t qs[QK4_0 / 2];
} block_q4_0;

// 32 values: (low nibble | bit j of qh << 4) - 16, times d; nibbles ordered as Q4_0.
typedef struct {
    infer_half d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
} block_q5_0;

// 32 values: qs[j]·d.
typedef struct {
    infer_half d;
    int8_t qs[QK8_0];
} block_q8_0;

// 256 values in 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes; each 64-value
// chunk c uses qs[32c..32c+32): low nibbles for sub-block 2c, high nibbles for 2c + 1.
typedef struct {
    infer_half d;
    infer_half dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_k;

// Q4_K plus a fifth bit: bit 2c (low) or 2c + 1 (high) of qh[l] for value l of chunk c.
typedef struct {
    infer_half d;
    infer_half dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_k;

// 256 values of 6 bits (4 in ql, 2 in qh), offset 32, with an 8-bit scale per 16 values.
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    infer_half d;
} block_q6_k;

// The CPU's activation format for K-quant dots; no Metal kernel reads it (the GPU kernels take
// f32 activations), but it belongs to the shared layout set.
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_k;

#endif
