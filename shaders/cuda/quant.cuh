// ggml's block layouts (bit-exact with lib/quant/*.zig), seen in units of 32 values.
// For each type:
//   BV, BB        values and bytes per block
//   dequant(row, u, y)   y[0..32] = values 32u .. 32u+31 of the row, with the CPU's arithmetic
//   W, load(row, u, w)   the unit's quants as 8 words of 4 bytes (value i in byte i%4 of word i/4)
//   dot(w, x, dx, acc, accm)   adds the unit's dot with 32 int8 activation quants x (scale dx),
//                        the way the CPU's vec_dot combines them; the result is acc - accm
//   mma_word(v)          a word of W as the tensor-core path stages it (Q4_0/Q5_0: signed quants)
//   P, params(w), combine(p, s_lo, s_hi, x_lo, x_hi, dx, acc, accm)   the same from the integer
//                        dots of the unit's two 16-value halves and the halves' activation sums,
//                        for the tensor-core path, which forms those dots with MMA
//   SUPER, ip(w), icombine(p, s_lo, s_hi, x_lo, x_hi, isum, msum)   K-quants with one activation
//                        scale per superblock: the same as integer sums over the superblock
//                        (matmul.cuh mmq), which then meet the float scales once
//   UNIT_SCALE           combine is fma(float(s_lo + s_hi), d·dx, acc) with params(w).d: one
//                        scale a unit and no activation sums (matmul.cuh mmqn)
// Activations are quantized like the CPU's vec_dot_type: Q8_0 blocks for Q4_0/Q5_0/Q8_0, Q8_K
// superblocks for the K-quants (one scale per 256 values, repeated per 32-value unit here).
#pragma once
#include "common.cuh"

__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

/// Sum of the 32 activation quants of a unit.
__device__ __forceinline__ int sum_x(const int* x) {
  int s = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) s = dp4a(0x01010101, x[i], s);
  return s;
}

/// Each byte (at most 127) minus the same byte of `bias`, wrapped to a signed byte: the 0x80 of
/// every byte keeps the subtraction from borrowing across bytes and is taken back after. Q4_0's
/// and Q5_0's quants staged for the tensor cores become their signed values (q - 8, q - 16), so
/// their dots need no correction by the activations' sums (the same integer either way).
__device__ __forceinline__ int sub_bytes(uint32_t q, uint32_t bias) {
  return static_cast<int>(((q | 0x80808080u) - bias) ^ 0x80808080u);
}

/// Bit 4 of byte k = bit k of h (k < 4): Q5_0's fifth bits.
__device__ __forceinline__ uint32_t spread4(uint32_t h) {
  return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

struct Q4_0 {
  static constexpr int BV = 32, BB = 18;
  static constexpr bool SUPER = false;
  static constexpr bool UNIT_SCALE = true;
  struct W { int v[8]; float d; };
  __device__ static void load(const uint8_t* row, int u, W& w) {
    const uint8_t* b = row + static_cast<size_t>(u) * BB;
    w.d = ld_f16(b);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const uint32_t q = ld_u32_a2(b + 2 + 4 * i);
      w.v[i] = q & 0x0F0F0F0Fu;
      w.v[4 + i] = (q >> 4) & 0x0F0F0F0Fu;
    }
  }
  __device__ static void dot(const W& w, const int* x, float dx, float& acc, float&) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) s = dp4a(w.v[i], x[i], s);
    s -= 8 * sum_x(x);
    acc = __fmaf_rn(static_cast<float>(s), w.d * dx, acc);
  }
  // The unit's dot from its two 16-value integer halves (tensor-core path, infer.cu mmq), whose
  // staged words are the signed quants (mma_word): no correction by the activations' sums.
  __device__ static int mma_word(int v) { return sub_bytes(v, 0x08080808u); }
  struct P { float d; };
  __device__ static P params(const W& w) { return {w.d}; }
  __device__ static void combine(const P& p, int s_lo, int s_hi, int, int, float dx, float& acc, float&) {
    acc = __fmaf_rn(static_cast<float>(s_lo + s_hi), p.d * dx, acc);
  }
  __device__ static void dequant(const uint8_t* row, int u, float* y) {
    const uint8_t* b = row + static_cast<size_t>(u) * BB;
    const float d = ld_f16(b);
    for (int j = 0; j < 16; j++) {
      const int q = b[2 + j];
      y[j] = static_cast<float>((q & 15) - 8) * d;
      y[j + 16] = static_cast<float>((q >> 4) - 8) * d;
    }
  }
};

struct Q5_0 {
  static constexpr int BV = 32, BB = 22;
  static constexpr bool SUPER = false;
  static constexpr bool UNIT_SCALE = true;
  struct W { int v[8]; float d; };
  __device__ static void load(const uint8_t* row, int u, W& w) {
    const uint8_t* b = row + static_cast<size_t>(u) * BB;
    w.d = ld_f16(b);
    const uint32_t qh = ld_u32_a2(b + 2);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const uint32_t q = ld_u32_a2(b + 6 + 4 * i);
      w.v[i] = (q & 0x0F0F0F0Fu) | spread4((qh >> (4 * i)) & 15u);
      w.v[4 + i] = ((q >> 4) & 0x0F0F0F0Fu) | spread4((qh >> (16 + 4 * i)) & 15u);
    }
  }
  __device__ static void dot(const W& w, const int* x, float dx, float& acc, float&) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) s = dp4a(w.v[i], x[i], s);
    s -= 16 * sum_x(x);
    acc = __fmaf_rn(static_cast<float>(s), w.d * dx, acc);
  }
  __device__ static int mma_word(int v) { return sub_bytes(v, 0x10101010u); }
  struct P { float d; };
  __device__ static P params(const W& w) { return {w.d}; }
  __device__ static void combine(const P& p, int s_lo, int s_hi, int, int, float dx, float& acc, float&) {
    acc = __fmaf_rn(static_cast<float>(s_lo + s_hi), p.d * dx, acc);
  }
  __device__ static void dequant(const uint8_t* row, int u, float* y) {
    const uint8_t* b = row + static_cast<size_t>(u) * BB;
    const float d = ld_f16(b);
    const uint32_t qh = ld_u32_a2(b + 2);
    for (int j = 0; j < 32; j++) {
      const int q = b[6 + (j & 15)];
      const int low = j < 16 ? (q & 15) : (q >> 4);
      const int v = low | (static_cast<int>((qh >> j) & 1u) << 4);
      y[j] = static_cast<float>(v - 16) * d;
    }
  }
};

struct Q8_0 {
  static constexpr int BV = 32, BB = 34;
  static constexpr bool SUPER = false;
  static constexpr bool UNIT_SCALE = true;
  struct W { int v[8]; float d; };
  __device__ static void load(const uint8_t* row, int u, W& w) {
    const uint8_t* b = row + static_cast<size_t>(u) * BB;
    w.d = ld_f16(b);
#pragma unroll
    for (int i = 0; i < 8; i++) w.v[i] = ld_u32_a2(b + 2 + 4 * i);
  }
  __device__ static void dot(const W& w, const int* x, float dx, float& acc, float&) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) s = dp4a(w.v[i], x[i], s);
    acc = __fmaf_rn(static_cast<float>(s), w.d * dx, acc);
  }
  __device__ static int mma_word(int v) { return v; }
  struct P { float d; };
  __device__ static P params(const W& w) { return {w.d}; }
  __device__ static void combine(const P& p, int s_lo, int s_hi, int, int, float dx, float& acc, float&) {
    acc = __fmaf_rn(static_cast<float>(s_lo + s_hi), p.d * dx, acc);
  }
  __device__ static void dequant(const uint8_t* row, int u, float* y) {
    const uint8_t* b = row + static_cast<size_t>(u) * BB;
    const float d = ld_f16(b);
    for (int j = 0; j < 32; j++) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
  }
};

/// MXFP4 (gpt-oss's experts; lib/quant/mxfp4.zig): 17 bytes, an E8M0 scale byte e and 16 bytes
/// of E2M1 codes (value j < 16 in qs[j] & 15, j + 16 in qs[j] >> 4), read through ggml's
/// kvalues_mxfp4 (twice the E2M1 values, integers) at half the scale: value = kvalue · 2^(e-128).
/// Blocks are 1-byte aligned, so a unit is read a byte at a time. The dot is the CPU's
/// (dotGgmlScalar): the block's exact integer sum, fma(sum, scale · dx, acc).
struct MXFP4 {
  static constexpr int BV = 32, BB = 17;
  static constexpr bool SUPER = false;
  static constexpr bool UNIT_SCALE = true;
  struct W { int v[8]; float d; };
  /// 2^(e - 128) as an f32, exactly (e = 0 and 1 are subnormals): ggml_e8m0_to_fp32_half.
  __device__ static float scale_half(uint32_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
  }
  /// Four codes (the low nibble of each byte of q) as four signed kvalues bytes: bytes 0..7 of
  /// the table {0, 1, 2, 3, 4, 6, 8, 12} and {0, -1, -2, -3, -4, -6, -8, -12} picked by the low
  /// three bits, the half by the sign bit.
  __device__ static int kvalues4(uint32_t q) {
    const uint32_t sel = (q & 0xFu) | ((q >> 4) & 0xF0u) | ((q >> 8) & 0xF00u) | ((q >> 12) & 0xF000u);
    const uint32_t pos = __byte_perm(0x03020100u, 0x0C080604u, sel & 0x7777u);
    const uint32_t neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, sel & 0x7777u);
    return static_cast<int>(__byte_perm(pos, neg, 0x3210u | ((sel & 0x8888u) >> 1)));
  }
  __device__ static uint32_t ld_u32_a1(const uint8_t* p) {
    return p[0] | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
           (static_cast<uint32_t>(p[3]) << 24);
  }
  __device__ static void load(const uint8_t* row, int u, W& w) {
    const uint8_t* b = row + static_cast<size_t>(u) * BB;
    w.d = scale_half(b[0]);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const uint32_t q = ld_u32_a1(b + 1 + 4 * i);
      w.v[i] = kvalues4(q & 0x0F0F0F0Fu);
      w.v[4 + i] = kvalues4((q >> 4) & 0x0F0F0F0Fu);
    }
  }
  __device__ static void dot(const W& w, const int* x, float dx, float& acc, float&) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) s = dp4a(w.v[i], x[i], s);
    acc = __fmaf_rn(static_cast<float>(s), w.d * dx, acc);
  }
  // The tensor-core path (moe.cuh moe_mmq): the kvalues bytes are the MMA's signed quants; the
  // halves' sums add to the block's exact integer sum, combined as dot combines it.
  __device__ static int mma_word(int v) { return v; }
  struct P { float d; };
  __device__ static P params(const W& w) { return {w.d}; }
  __device__ static void combine(const P& p, int s_lo, int s_hi, int, int, float dx, float& acc, float&) {
    acc = __fmaf_rn(static_cast<float>(s_lo + s_hi), p.d * dx, acc);
  }
  __device__ static void dequant(const uint8_t* row, int u, float* y) {
    const uint8_t* b = row + static_cast<size_t>(u) * BB;
    const float d = scale_half(b[0]);
    for (int j = 0; j < 16; j++) {
      const int q = b[1 + j];
      const int lo = static_cast<int8_t>(kvalues4(q & 15)), hi = static_cast<int8_t>(kvalues4(q >> 4));
      y[j] = __fmul_rn(static_cast<float>(lo), d);
      y[j + 16] = __fmul_rn(static_cast<float>(hi), d);
    }
  }
};

/// Scale and min of sub-block j (0..7) of a Q4_K/Q5_K superblock (ggml's get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/// d·scale and dmin·min of sub-block j of the Q4_K/Q5_K superblock at b (its head as stored:
/// d, dmin, the 12 scale bytes), rounded as ggml's dequantization rounds them.
__device__ __forceinline__ void sub_block_scales(const uint8_t* b, int j, float& d1, float& m1) {
  int sc, m;
  scale_min_k4(b + 4, j, sc, m);
  d1 = ld_f16(b) * static_cast<float>(sc);
  m1 = ld_f16(b + 2) * static_cast<float>(m);
}

struct Q4_K {
  static constexpr int BV = 256, BB = 144;
  static constexpr bool SUPER = true;
  static constexpr bool UNIT_SCALE = false;
  struct W { int v[8]; float d, dmin; int sc, m; };
  __device__ static void load(const uint8_t* row, int u, W& w) {
    const uint8_t* b = row + static_cast<size_t>(u >> 3) * BB;
    const int j = u & 7;
    w.d = ld_f16(b);
    w.dmin = ld_f16(b + 2);
    scale_min_k4(b + 4, j, w.sc, w.m);
    const uint4* p = reinterpret_cast<const uint4*>(b + 16 + 32 * (j >> 1));
    const uint4 a = p[0], c = p[1];
    const uint32_t q[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
    const int shift = (j & 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; i++) w.v[i] = (q[i] >> shift) & 0x0F0F0F0Fu;
  }
  __device__ static void dot(const W& w, const int* x, float dx, float& acc, float& accm) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) s = dp4a(w.v[i], x[i], s);
    acc = __fmaf_rn(static_cast<float>(w.sc * s), w.d * dx, acc);
    accm = __fmaf_rn(static_cast<float>(w.m * sum_x(x)), w.dmin * dx, accm);
  }
  __device__ static int mma_word(int v) { return v; }
  struct P { float d, dmin; int sc, m; };
  __device__ static P params(const W& w) { return {w.d, w.dmin, w.sc, w.m}; }
  __device__ static void combine(const P& p, int s_lo, int s_hi, int x_lo, int x_hi, float dx, float& acc,
                                 float& accm) {
    acc = __fmaf_rn(static_cast<float>(p.sc * (s_lo + s_hi)), p.d * dx, acc);
    accm = __fmaf_rn(static_cast<float>(p.m * (x_lo + x_hi)), p.dmin * dx, accm);
  }
  // SUPER (the tensor-core path with one activation scale per superblock, as Q8_K has): the
  // unit's 6-bit scale and min packed for the staging (ip), their integer products summed over
  // the superblock (icombine), the sums then meeting d·dx and dmin·dx once a superblock, as the
  // CPU's dot does (lib/quant/q4_k.zig dotGgmlScalar).
  __device__ static int ip(const W& w) { return w.sc | (w.m << 16); }
  __device__ static void icombine(int p, int s_lo, int s_hi, int x_lo, int x_hi, int& isum, int& msum) {
    isum += (p & 0xFFFF) * (s_lo + s_hi);
    msum += (p >> 16) * (x_lo + x_hi);
  }
  __device__ static void dequant(const uint8_t* row, int u, float* y) {
    const uint8_t* b = row + static_cast<size_t>(u >> 3) * BB;
    const int j = u & 7;
    float d1, m1;
    sub_block_scales(b, j, d1, m1);
    const uint8_t* qs = b + 16 + 32 * (j >> 1);
    const int shift = (j & 1) * 4;
    for (int l = 0; l < 32; l++) y[l] = d1 * static_cast<float>((qs[l] >> shift) & 15) - m1;
  }
};

struct Q5_K {
  static constexpr int BV = 256, BB = 176;
  static constexpr bool SUPER = true;
  static constexpr bool UNIT_SCALE = false;
  struct W { int v[8]; float d, dmin; int sc, m; };
  __device__ static void load(const uint8_t* row, int u, W& w) {
    const uint8_t* b = row + static_cast<size_t>(u >> 3) * BB;
    const int j = u & 7, c = j >> 1, hi = j & 1;
    w.d = ld_f16(b);
    w.dmin = ld_f16(b + 2);
    scale_min_k4(b + 4, j, w.sc, w.m);
    const uint4* ph = reinterpret_cast<const uint4*>(b + 16);
    const uint4* pq = reinterpret_cast<const uint4*>(b + 48 + 32 * c);
    const uint4 h0 = ph[0], h1 = ph[1], q0 = pq[0], q1 = pq[1];
    const uint32_t qh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
    const uint32_t qs[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    const int hb = 2 * c + hi;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      w.v[i] = ((qs[i] >> (4 * hi)) & 0x0F0F0F0Fu) | (((qh[i] >> hb) & 0x01010101u) << 4);
    }
  }
  __device__ static void dot(const W& w, const int* x, float dx, float& acc, float& accm) {
    Q4_K::W k;
#pragma unroll
    for (int i = 0; i < 8; i++) k.v[i] = w.v[i];
    k.d = w.d;
    k.dmin = w.dmin;
    k.sc = w.sc;
    k.m = w.m;
    Q4_K::dot(k, x, dx, acc, accm);
  }
  __device__ static int mma_word(int v) { return v; }
  using P = Q4_K::P;
  __device__ static P params(const W& w) { return {w.d, w.dmin, w.sc, w.m}; }
  __device__ static void combine(const P& p, int s_lo, int s_hi, int x_lo, int x_hi, float dx, float& acc,
                                 float& accm) {
    Q4_K::combine(p, s_lo, s_hi, x_lo, x_hi, dx, acc, accm);
  }
  __device__ static int ip(const W& w) { return w.sc | (w.m << 16); }
  __device__ static void icombine(int p, int s_lo, int s_hi, int x_lo, int x_hi, int& isum, int& msum) {
    Q4_K::icombine(p, s_lo, s_hi, x_lo, x_hi, isum, msum);
  }
  __device__ static void dequant(const uint8_t* row, int u, float* y) {
    const uint8_t* b = row + static_cast<size_t>(u >> 3) * BB;
    const int j = u & 7, c = j >> 1, hi = j & 1;
    float d1, m1;
    sub_block_scales(b, j, d1, m1);
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + 48 + 32 * c;
    for (int l = 0; l < 32; l++) {
      const int v = ((qs[l] >> (4 * hi)) & 15) | (((qh[l] >> (2 * c + hi)) & 1) << 4);
      y[l] = d1 * static_cast<float>(v) - m1;
    }
  }
};

struct Q6_K {
  static constexpr int BV = 256, BB = 210;
  static constexpr bool SUPER = false;
  static constexpr bool UNIT_SCALE = false;
  struct W { int v[8]; float d; int sc0, sc1; };
  __device__ static void load(const uint8_t* row, int u, W& w) {
    const uint8_t* b = row + static_cast<size_t>(u >> 3) * BB;
    const int k8 = u & 7, h = k8 >> 2, k = k8 & 3;
    const uint8_t* ql = b + 64 * h + 32 * (k & 1);
    const uint8_t* qh = b + 128 + 32 * h;
    const int nib = (k >> 1) * 4, hs = 2 * k;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const uint32_t l = ld_u32_a2(ql + 4 * i), hh = ld_u32_a2(qh + 4 * i);
      w.v[i] = ((l >> nib) & 0x0F0F0F0Fu) | (((hh >> hs) & 0x03030303u) << 4);
    }
    w.sc0 = static_cast<int8_t>(b[192 + 8 * h + 2 * k]);
    w.sc1 = static_cast<int8_t>(b[192 + 8 * h + 2 * k + 1]);
    w.d = ld_f16(b + 208);
  }
  __device__ static void dot(const W& w, const int* x, float dx, float& acc, float&) {
    int a = 0, c = 0, xa = 0, xc = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      a = dp4a(w.v[i], x[i], a);
      xa = dp4a(0x01010101, x[i], xa);
      c = dp4a(w.v[4 + i], x[4 + i], c);
      xc = dp4a(0x01010101, x[4 + i], xc);
    }
    const int s = w.sc0 * (a - 32 * xa) + w.sc1 * (c - 32 * xc);
    acc = __fmaf_rn(w.d * dx, static_cast<float>(s), acc);
  }
  __device__ static int mma_word(int v) { return v; }
  struct P { float d; int sc0, sc1; };
  __device__ static P params(const W& w) { return {w.d, w.sc0, w.sc1}; }
  __device__ static void combine(const P& p, int s_lo, int s_hi, int x_lo, int x_hi, float dx, float& acc, float&) {
    const int s = p.sc0 * (s_lo - 32 * x_lo) + p.sc1 * (s_hi - 32 * x_hi);
    acc = __fmaf_rn(p.d * dx, static_cast<float>(s), acc);
  }
  __device__ static void dequant(const uint8_t* row, int u, float* y) {
    const uint8_t* b = row + static_cast<size_t>(u >> 3) * BB;
    const int k8 = u & 7, h = k8 >> 2, k = k8 & 3;
    const uint8_t* ql = b + 64 * h + 32 * (k & 1);
    const uint8_t* qh = b + 128 + 32 * h;
    const float d = ld_f16(b + 208);
    for (int l = 0; l < 32; l++) {
      const int q = ((ql[l] >> ((k >> 1) * 4)) & 15) | (((qh[l] >> (2 * k)) & 3) << 4);
      const float scale = d * static_cast<float>(static_cast<int8_t>(b[192 + 8 * h + 2 * k + (l >> 4)]));
      y[l] = scale * static_cast<float>(q - 32);
    }
  }
};

// Float weights: element loads (ggml types F32 = 0, F16 = 1, BF16 = 30).
struct F32W {
  __device__ static float at(const uint8_t* w, size_t i) { return reinterpret_cast<const float*>(w)[i]; }
  __device__ static float act(float x) { return x; }
};
struct F16W {
  __device__ static float at(const uint8_t* w, size_t i) { return __half2float(reinterpret_cast<const __half*>(w)[i]); }
  __device__ static float act(float x) { return x; }  // f32 activations, as lib/quant/f16.zig
};
struct BF16W {
  __device__ static float at(const uint8_t* w, size_t i) {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(w)[i]);
  }
  __device__ static float act(float x) { return round_bf16(x); }
};
