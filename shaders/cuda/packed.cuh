// Weight layouts for the GPU, made once at upload (repack_* below; lib/cuda/cuda.zig repack) for
// rows whose width is a multiple of 256. In ggml's layouts a lane's 32-value unit is not one
// aligned load: Q4_0's 18-byte and Q8_0's 34-byte blocks sit at 2-byte alignment (a load per two
// bytes), and Q4_K keeps two units' nibbles interleaved in one 32-byte run that two lanes both
// read. Here every group of 8 units (256 values) is a 16-byte head — Q4_0/Q8_0: the 8 units' f16
// scales; Q4_K: the superblock's d, dmin and 12 scale bytes, unchanged — then the 8 units' quants,
// 16 bytes each for 4 bits (low nibbles values 0..15, high nibbles 16..31, as a Q4_0 block) or 32
// for Q8_0. A group has the bytes of the blocks it came from (144, 272, 144), so a row has the
// GGUF's byte count, row offsets stay as they were, and the same integers are summed in the same
// order: the results are bit for bit those of the GGUF layout. Each struct offers the interface
// of quant.cuh (load, dot, mma_word, params, combine, dequant) plus repack(group).
#pragma once
#include "common.cuh"
#include "quant.cuh"

/// Unpacks a 16-byte run of 32 nibbles (low nibbles values 0..15, high 16..31) into w.v.
__device__ __forceinline__ void nibbles(const uint4 q, int (&v)[8]) {
  const uint32_t qs[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    v[i] = qs[i] & 0x0F0F0F0Fu;
    v[4 + i] = (qs[i] >> 4) & 0x0F0F0F0Fu;
  }
}

/// Copies a group of `bytes` bytes (a multiple of 16, 16-byte aligned) into thread-local memory.
template <int BYTES>
__device__ __forceinline__ void load_group(const uint8_t* g, uint8_t (&s)[BYTES]) {
#pragma unroll
  for (int i = 0; i < BYTES / 16; i++) reinterpret_cast<uint4*>(s)[i] = reinterpret_cast<const uint4*>(g)[i];
}

/// 8 blocks of an f16 scale and QB bytes of quants (Q4_0: 16, Q8_0: 32) into a head of the 8
/// scales and the 8 runs of quants, in place.
template <int QB>
__device__ __forceinline__ void repack_scaled_blocks(uint8_t* g) {
  constexpr int B = 2 + QB;
  uint8_t s[8 * B];
  load_group(g, s);
  for (int j = 0; j < 8; j++) {
    g[2 * j] = s[B * j];
    g[2 * j + 1] = s[B * j + 1];
    for (int b = 0; b < QB; b++) g[16 + QB * j + b] = s[B * j + 2 + b];
  }
}

/// The arithmetic of a GGUF type, which its GPU layout keeps: only where the bytes sit differs.
template <class Base>
struct SameArithmetic {
  static constexpr bool SUPER = Base::SUPER;
  static constexpr bool UNIT_SCALE = Base::UNIT_SCALE;
  using W = typename Base::W;
  using P = typename Base::P;
  __device__ static void dot(const W& w, const int* x, float dx, float& acc, float& accm) {
    Base::dot(w, x, dx, acc, accm);
  }
  __device__ static int mma_word(int v) { return Base::mma_word(v); }
  __device__ static P params(const W& w) { return Base::params(w); }
  __device__ static void combine(const P& p, int s_lo, int s_hi, int x_lo, int x_hi, float dx, float& acc,
                                 float& accm) {
    Base::combine(p, s_lo, s_hi, x_lo, x_hi, dx, acc, accm);
  }
  __device__ static int ip(const W& w) { return Base::ip(w); }
  __device__ static void icombine(int p, int s_lo, int s_hi, int x_lo, int x_hi, int& isum, int& msum) {
    Base::icombine(p, s_lo, s_hi, x_lo, x_hi, isum, msum);
  }
};

struct Q4_0R : SameArithmetic<Q4_0> {
  static constexpr int BV = 256, BB = 144;
  __device__ static void load(const uint8_t* row, int u, W& w) {
    const uint8_t* g = row + static_cast<size_t>(u >> 3) * BB;
    const int j = u & 7;
    w.d = ld_f16(g + 2 * j);
    nibbles(*reinterpret_cast<const uint4*>(g + 16 + 16 * j), w.v);
  }
  __device__ static void dequant(const uint8_t* row, int u, float* y) {
    const uint8_t* g = row + static_cast<size_t>(u >> 3) * BB;
    const int j = u & 7;
    const float d = ld_f16(g + 2 * j);
    const uint8_t* qs = g + 16 + 16 * j;
    for (int l = 0; l < 16; l++) {
      y[l] = static_cast<float>((qs[l] & 15) - 8) * d;
      y[l + 16] = static_cast<float>((qs[l] >> 4) - 8) * d;
    }
  }
  __device__ static void repack(uint8_t* g) { repack_scaled_blocks<16>(g); }
};

struct Q8_0R : SameArithmetic<Q8_0> {
  static constexpr int BV = 256, BB = 272;
  __device__ static void load(const uint8_t* row, int u, W& w) {
    const uint8_t* g = row + static_cast<size_t>(u >> 3) * BB;
    const int j = u & 7;
    w.d = ld_f16(g + 2 * j);
    const uint4* q = reinterpret_cast<const uint4*>(g + 16 + 32 * j);
    const uint4 a = q[0], b = q[1];
    w.v[0] = a.x; w.v[1] = a.y; w.v[2] = a.z; w.v[3] = a.w;
    w.v[4] = b.x; w.v[5] = b.y; w.v[6] = b.z; w.v[7] = b.w;
  }
  __device__ static void dequant(const uint8_t* row, int u, float* y) {
    const uint8_t* g = row + static_cast<size_t>(u >> 3) * BB;
    const int j = u & 7;
    const float d = ld_f16(g + 2 * j);
    const uint8_t* qs = g + 16 + 32 * j;
    for (int l = 0; l < 32; l++) y[l] = static_cast<float>(static_cast<int8_t>(qs[l])) * d;
  }
  __device__ static void repack(uint8_t* g) { repack_scaled_blocks<32>(g); }
};

struct Q4_KR : SameArithmetic<Q4_K> {
  static constexpr int BV = 256, BB = 144;
  /// Sub-block j's 6-bit scale and min from the head's 12 scale bytes (words s1..s3 of the head),
  /// as scale_min_k4 reads them, with shifts instead of indexed bytes (no local memory).
  __device__ static void scale_min(uint32_t s1, uint32_t s2, uint32_t s3, int j, int& sc, int& m) {
    const int sh = 8 * (j & 3);
    const int b0 = (s1 >> sh) & 255, b1 = (s2 >> sh) & 255, b2 = (s3 >> sh) & 255;
    if (j < 4) {
      sc = b0 & 63;
      m = b1 & 63;
    } else {
      sc = (b2 & 15) | ((b0 >> 6) << 4);
      m = (b2 >> 4) | ((b1 >> 6) << 4);
    }
  }
  __device__ static void load(const uint8_t* row, int u, W& w) {
    const uint8_t* g = row + static_cast<size_t>(u >> 3) * BB;
    const int j = u & 7;
    const uint4 head = *reinterpret_cast<const uint4*>(g);
    w.d = __half2float(__ushort_as_half(static_cast<unsigned short>(head.x & 0xFFFFu)));
    w.dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(head.x >> 16)));
    scale_min(head.y, head.z, head.w, j, w.sc, w.m);
    nibbles(*reinterpret_cast<const uint4*>(g + 16 + 16 * j), w.v);
  }
  __device__ static void dequant(const uint8_t* row, int u, float* y) {
    const uint8_t* g = row + static_cast<size_t>(u >> 3) * BB;
    const int j = u & 7;
    float d1, m1;
    sub_block_scales(g, j, d1, m1);
    const uint8_t* qs = g + 16 + 16 * j;
    for (int l = 0; l < 16; l++) {
      y[l] = d1 * static_cast<float>(qs[l] & 15) - m1;
      y[l + 16] = d1 * static_cast<float>(qs[l] >> 4) - m1;
    }
  }
  // One token's dot by half superblocks (matvec_pipe.cuh rows_halves): a lane takes units 4h..4h+3,
  // decodes the head once, sums the four units' scaled dots as integers (the Q8_K activation
  // has one scale for the superblock) and meets d·dx and dmin·dx once. Unit by unit it was a head
  // decode, two conversions and two float FMAs for every 32 values: the 8B Q4_K step ran 20%
  // longer than Q4_0's for the same bytes.
  static constexpr bool HALVES = true;
  /// Half h of a superblock: d, dmin, its four units' 6-bit scales and mins a byte each, and
  /// their 64 bytes of nibbles.
  struct Half {
    float d, dmin;
    uint32_t sc, m;
    uint4 q[4];
  };
  __device__ static void load_half(const uint8_t* row, int h, Half& w) {
    const uint8_t* g = row + static_cast<size_t>(h >> 1) * BB;
    const uint4 head = *reinterpret_cast<const uint4*>(g);
    w.d = __half2float(__ushort_as_half(static_cast<unsigned short>(head.x & 0xFFFFu)));
    w.dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(head.x >> 16)));
    // scale_min for j = 4h'..4h'+3, a byte a unit: the low half's are the low 6 bits of bytes
    // 0..3 and 4..7; the high half's take their low 4 bits from bytes 8..11 and their top 2 from
    // the top 2 bits of bytes 0..3 (scales) and 4..7 (mins).
    if (h & 1) {
      w.sc = (head.w & 0x0F0F0F0Fu) | ((head.y & 0xC0C0C0C0u) >> 2);
      w.m = ((head.w >> 4) & 0x0F0F0F0Fu) | ((head.z & 0xC0C0C0C0u) >> 2);
    } else {
      w.sc = head.y & 0x3F3F3F3Fu;
      w.m = head.z & 0x3F3F3F3Fu;
    }
    const uint4* q = reinterpret_cast<const uint4*>(g + 16 + 64 * (h & 1));
#pragma unroll
    for (int k = 0; k < 4; k++) w.q[k] = q[k];
  }
  /// Unit k (0..3) of the half with its activation x (8 words) and their byte sum xs.
  __device__ static void dot_unit(const Half& w, int k, const int* x, int xs, int& isum, int& msum) {
    int v[8];
    nibbles(w.q[k], v);
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) s = dp4a(v[i], x[i], s);
    isum += static_cast<int>((w.sc >> (8 * k)) & 255u) * s;
    msum += static_cast<int>((w.m >> (8 * k)) & 255u) * xs;
  }
  __device__ static void finish_half(const Half& w, int isum, int msum, float dx, float& acc, float& accm) {
    acc = __fmaf_rn(static_cast<float>(isum), w.d * dx, acc);
    accm = __fmaf_rn(static_cast<float>(msum), w.dmin * dx, accm);
  }
  /// A Q4_K superblock into this layout, in place: the head stays; ggml keeps sub-blocks 2c and
  /// 2c + 1 in the low and high nibbles of the same 32 bytes, here each has its own 16.
  __device__ static void repack(uint8_t* g) {
    uint8_t s[BB];
    load_group(g, s);
    for (int j = 0; j < 8; j++) {
      const uint8_t* q = s + 16 + 32 * (j >> 1);
      const int shift = 4 * (j & 1);
      for (int b = 0; b < 16; b++) {
        g[16 + 16 * j + b] = static_cast<uint8_t>(((q[b] >> shift) & 15) | (((q[b + 16] >> shift) & 15) << 4));
      }
    }
  }
};

#define REPACK(NAME, T)                                                          \
  extern "C" __global__ void NAME(uint8_t* w, long long groups) {                \
    pdl_begin();                                                                 \
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; \
    if (i < groups) T::repack(w + i * T::BB);                                    \
  }
REPACK(repack_q4_0, Q4_0R)
REPACK(repack_q8_0, Q8_0R)
REPACK(repack_q4_k, Q4_KR)
