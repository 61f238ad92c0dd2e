// One-token matvecs of the GPU layouts (packed.cuh) whose weights stream through shared memory:
// each block takes row blocks of 4R rows (a warp R rows; R = 2 by default, lib/cuda/ops.zig
// pipeStages), and while its warps compute one row block from shared memory, the next two are on
// their way (cp.async, 3 stages). Included by matmul.cuh after matvec_q, whose unit loop it shares.
//
// Why: the register-fed matvec (matvec_q) holds one row's loads in flight per warp — a 4,096-wide
// Q4_0 row, 2.3 KB — so it reaches 56% of the H200's bandwidth on an 8B model's gate/up where
// Q8_0, twice the bytes per round trip, reaches 71%, and more units a lane cost registers in every
// use of the kernel. Here the bytes in flight are shared
// memory (two stages of a row block), not registers, and the first stages are requested before
// the kernel waits for the one ahead of it (weights never depend on it). R rows a warp share each
// load of the activation, which a 4-bit row otherwise reads at twice its own bytes.
//
// Each row is summed as matvec_q sums a row of one warp (split 1): the same units per lane in the
// same order, from shared memory instead of global; Q4_K (by halves, rows_halves) sums four units
// as integers first. A row of the fused q/k/v or gate/up launch (matvec_pipe_multi_*) is computed
// as the single matvec computes it, bit for bit. Rows of 6,144 values and more (down
// projections; the single matvec only) are split among the block's 4 warps instead, a row block
// R rows (SPLIT): a warp alone on such a row was slower than the register-fed kernel, split 4
// ways it is faster (an 8B model's Q4_K down projection 12.5 -> 10.7 µs on an H200).
#pragma once

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/// Whether T sums one token by half superblocks (T::HALVES, packed.cuh Q4_KR): rows_halves.
template <class T>
__device__ constexpr bool by_halves(decltype(T::HALVES)*) { return T::HALVES; }
template <class T>
__device__ constexpr bool by_halves(...) { return false; }

/// The activation's 16-byte words as rows_halves reads them from shared memory: word k (0..7) of
/// half h at 8h + (k ^ (h & 7)). Lanes read halves h, h + 1, ... at once, 128 bytes apart, so
/// unswizzled every lane of a quarter warp would hit the same four banks.
__device__ __forceinline__ int x_slot(int i) { return i ^ ((i >> 3) & 7); }

/// One warp's dots of R consecutive weight rows (wr: the first, in shared memory) for a type
/// that sums a half superblock (4 units) a lane: lane l of warp part p (of `split`) takes halves
/// 32p + l, 32(p + split) + l, ..., decodes each row's head once for the 4 units and sums them
/// as integers (T::dot_unit, T::finish_half). The
/// activation comes from shared memory (xs, laid out by x_slot): read from global memory, a
/// lane's 128 contiguous bytes made every load of the warp touch 32 cache lines, and the
/// kernel ran at the L1's pace (8B Q4_K step 2,140 -> 2,586 µs on an H200,
/// bench/results/cuda.md).
template <class T, int R>
__device__ __forceinline__ void rows_halves(const uint8_t* wr, size_t row_bytes, int halves, int part, int split,
                                            const int4* xs, const float* __restrict__ xd, float (&acc)[R],
                                            float (&accm)[R]) {
  const int lane = threadIdx.x & 31;
  for (int h = lane + 32 * part; h < halves; h += 32 * split) {
    typename T::Half w[R];
#pragma unroll
    for (int r = 0; r < R; r++) T::load_half(wr + r * row_bytes, h, w[r]);
    int isum[R], msum[R];
#pragma unroll
    for (int r = 0; r < R; r++) isum[r] = msum[r] = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int4 a = xs[x_slot(8 * h + 2 * k)], b = xs[x_slot(8 * h + 2 * k + 1)];
      const int x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      const int xsum = sum_x(x);
#pragma unroll
      for (int r = 0; r < R; r++) T::dot_unit(w[r], k, x, xsum, isum[r], msum[r]);
    }
    const float dx = xd[4 * h];  // Q8_K: the superblock's scale, repeated per unit
#pragma unroll
    for (int r = 0; r < R; r++) T::finish_half(w[r], isum[r], msum[r], dx, acc[r], accm[r]);
  }
}

/// One warp's dots of R consecutive weight rows (wr: the first, in shared memory here) with the
/// quantized activation into sum[0..R): the warp's part `part` of `split` parts of each row, the
/// units (or halves) a lane as matvec_q takes them for a row with that split, in the same order
/// (split 1: the whole row, as matvec_q computes a row it does not split). R rows share each
/// activation load (and, for Q4_0/Q4_K, its byte sums): a 4-bit row reads twice its own bytes of
/// activation, once per row at R = 1.
template <class T, int R, bool H>
__device__ __forceinline__ void warp_rows_dot(const uint8_t* wr, size_t row_bytes, int n_in, int part, int split,
                                              const int8_t* xq, const float* xd, const int4* xs, float (&sum)[R]) {
  const int lane = threadIdx.x & 31, units = n_in >> 5, u0 = lane + 32 * part, stride = 32 * split;
  if constexpr (H) {
    float acc[R], accm[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = accm[r] = 0.0f;
    rows_halves<T, R>(wr, row_bytes, n_in >> 7, part, split, xs, xd, acc, accm);
#pragma unroll
    for (int r = 0; r < R; r++) sum[r] = warp_sum(acc[r]) - warp_sum(accm[r]);
    return;
  }
  if (R == 1) {
    const int per_lane = (units + stride - 1) / stride;
    float acc[1] = {0.0f}, accm[1] = {0.0f};
    if (per_lane >= 3) matvec_units<T, 1, 4>(wr, n_in, units, u0, stride, xq, xd, 0, 1, acc, accm);
    else if (per_lane == 2) matvec_units<T, 1, 2>(wr, n_in, units, u0, stride, xq, xd, 0, 1, acc, accm);
    else matvec_units<T, 1, 1>(wr, n_in, units, u0, stride, xq, xd, 0, 1, acc, accm);
    sum[0] = warp_sum(acc[0]) - warp_sum(accm[0]);
    return;
  }
  float acc[R], accm[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = accm[r] = 0.0f;
  const uint8_t* rows[R];
#pragma unroll
  for (int r = 0; r < R; r++) rows[r] = wr + r * row_bytes;
  rows_units<T, R, 1>(rows, units, u0, stride, xq, xd, acc, accm);
#pragma unroll
  for (int r = 0; r < R; r++) sum[r] = warp_sum(acc[r]) - warp_sum(accm[r]);
}

/// A row block: its first row's bytes, where its outputs go, how many rows it has (1..4R, or
/// 1..R for rows split among the warps).
struct PipeRows {
  const uint8_t* w;
  float* y;
  int rows;
};

constexpr int PIPE_STAGES = 3;  // lib/cuda/ops.zig pipe_stages: shared memory 3 × 4R rows
/// A compile-time value as a type (for pipe_variant's generic lambdas).
template <auto V>
struct Const {
  static constexpr decltype(V) value = V;
};

/// Rows of a row block: 4R (a warp R rows), or R with the rows split among the 4 warps (SPLIT).
template <int R, bool SPLIT>
__host__ __device__ constexpr int pipe_block_rows() { return SPLIT ? R : 4 * R; }

/// Row blocks blockIdx.x, blockIdx.x + gridDim.x, ... of `blocks` (pipe_block_rows each), src(rb)
/// naming each. Without SPLIT warp w sums rows Rw..Rw+R-1 of a row block alone; with SPLIT every
/// warp sums its quarter of all R rows (rows of 6,144 values and more: lib/cuda/ops.zig
/// pipeStages) and the quarters are added in warp order, as matvec_q adds a row's parts.
template <class T, int R, bool H, bool SPLIT, class Src>
__device__ __forceinline__ void matvec_pipe(int blocks, int n_in, const int8_t* xq, const float* xd, Src src) {
  constexpr int S = PIPE_STAGES;
  extern __shared__ __align__(16) uint8_t staged[];
  const size_t row_bytes = static_cast<size_t>(n_in / T::BV) * T::BB;  // a multiple of 16
  const size_t stage_bytes = pipe_block_rows<R, SPLIT>() * row_bytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int first = blockIdx.x;
  const int mine = first < blocks ? (blocks - first + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x) : 0;
  // Row block k of this block into stage k % S; a group is committed even when empty, so that
  // group k is always the k-th.
  auto issue = [&](int k) {
    if (k < mine) {
      const PipeRows r = src(first + k * static_cast<int>(gridDim.x));
      uint8_t* to = staged + (k % S) * stage_bytes;
      const int chunks = static_cast<int>(r.rows * row_bytes / 16);
      for (int c = threadIdx.x; c < chunks; c += blockDim.x) cp_async16(to + 16 * static_cast<size_t>(c), r.w + 16 * static_cast<size_t>(c));
    }
    cp_async_commit();
  };
#pragma unroll
  for (int k = 0; k < S - 1; k++) issue(k);
  pdl_begin();
  // Rows summed by halves (the host's choice: lib/cuda/ops.zig pipe_halves_min) read the
  // activation from shared memory, after the stages (the host adds n_in bytes); the loop's first
  // barrier publishes it.
  const int4* xs = reinterpret_cast<const int4*>(staged + S * stage_bytes);
  if constexpr (H) {
    int4* to = reinterpret_cast<int4*>(staged + S * stage_bytes);
    const int4* from = reinterpret_cast<const int4*>(xq);
    for (int i = threadIdx.x; i < (n_in >> 4); i += blockDim.x) to[x_slot(i)] = from[i];
  }
  for (int k = 0; k < mine; k++) {
    issue(k + S - 1);
    cp_async_wait<S - 1>();  // groups 0..k have landed (this thread's copies)
    __syncthreads();         // ... and every thread's
    const PipeRows r = src(first + k * static_cast<int>(gridDim.x));
    if constexpr (SPLIT) {
      // The warps' quarters, after the stages and the activation (the host adds 16R bytes): a
      // static array would count in every variant of the kernel, and 16 bytes past the size the
      // host pads a block to (ops.zig reserving) leave a multiprocessor one block fewer.
      float(*parts)[R] = reinterpret_cast<float(*)[R]>(staged + S * stage_bytes + (H ? n_in : 0));
      float sum[R];
      warp_rows_dot<T, R, H>(staged + (k % S) * stage_bytes, row_bytes, n_in, warp, 4, xq, xd, xs, sum);
      if (lane == 0) {
#pragma unroll
        for (int i = 0; i < R; i++) parts[warp][i] = sum[i];
      }
      __syncthreads();
      if (static_cast<int>(threadIdx.x) < r.rows) {
        const int i = threadIdx.x;
        r.y[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + parts[3][i];
      }
    } else if (R * warp < r.rows) {
      float sum[R];
      warp_rows_dot<T, R, H>(staged + (k % S) * stage_bytes + R * warp * row_bytes, row_bytes, n_in, 0, 1, xq, xd, xs,
                             sum);
#pragma unroll
      for (int i = 0; i < R; i++) {
        if (lane == 0 && R * warp + i < r.rows) r.y[R * warp + i] = sum[i];
      }
    }
    __syncthreads();  // stage k % S (and the parts) are rewritten by the next iteration
  }
}

/// One matrix: row blocks of pipe_block_rows rows.
template <class T, int R, bool H, bool SPLIT>
__device__ __forceinline__ void matvec_pipe_one(const uint8_t* w, int n_out, int n_in, const int8_t* xq,
                                                const float* xd, float* y) {
  constexpr int B = pipe_block_rows<R, SPLIT>();
  const size_t block_bytes = B * static_cast<size_t>(n_in / T::BV) * T::BB;
  matvec_pipe<T, R, H, SPLIT>((n_out + B - 1) / B, n_in, xq, xd,
                    [&](int rb) { return PipeRows{w + rb * block_bytes, y + B * rb, min(B, n_out - B * rb)}; });
}
/// Up to three matrices of one input (q/k/v, gate/up): row blocks [0, b0) of matrix 0, the next b1
/// of matrix 1, the rest of matrix 2, as matvec_multi.
template <class T, int R, bool H>
__device__ __forceinline__ void matvec_pipe_three(const uint8_t* w0, int n0, float* y0, const uint8_t* w1, int n1,
                                                  float* y1, const uint8_t* w2, int n2, float* y2, int n_in,
                                                  const int8_t* xq, const float* xd) {
  constexpr int B = 4 * R;
  const size_t block_bytes = B * static_cast<size_t>(n_in / T::BV) * T::BB;
  const int b0 = (n0 + B - 1) / B, b1 = (n1 + B - 1) / B, b2 = (n2 + B - 1) / B;
  matvec_pipe<T, R, H, false>(b0 + b1 + b2, n_in, xq, xd, [&](int rb) {
    if (rb < b0) return PipeRows{w0 + rb * block_bytes, y0 + B * rb, min(B, n0 - B * rb)};
    rb -= b0;
    if (rb < b1) return PipeRows{w1 + rb * block_bytes, y1 + B * rb, min(B, n1 - B * rb)};
    rb -= b1;
    return PipeRows{w2 + rb * block_bytes, y2 + B * rb, min(B, n2 - B * rb)};
  });
}

/// The kernels' rows a warp (1, 2, 4) and whether T's rows are summed by halves (the host's
/// choice, lib/cuda/ops.zig pipe_halves_min; only types with T::HALVES), each a kernel of its own.
template <class T, class F>
__device__ __forceinline__ void pipe_variant(int rows_per_warp, int halves, F f) {
  constexpr bool HV = by_halves<T>(nullptr);
  if (HV && halves) {
    if (rows_per_warp == 4) f(Const<4>{}, Const<HV>{});
    else if (rows_per_warp == 2) f(Const<2>{}, Const<HV>{});
    else f(Const<1>{}, Const<HV>{});
  } else {
    if (rows_per_warp == 4) f(Const<4>{}, Const<false>{});
    else if (rows_per_warp == 2) f(Const<2>{}, Const<false>{});
    else f(Const<1>{}, Const<false>{});
  }
}

// SPLIT: the rows split among the warps, a kernel of its own (as a branch of one kernel, the
// split variants cost the 0.6B's unsplit matvecs 2.7% of its decode, of which this gets 1.4%
// back, the 8B's Q4_0 +1%; the 8B's Q4_K decode lost 2.4% by it, not yet explained).
#define MATVEC_PIPE(NAME, T, SPLIT)                                                                            \
  extern "C" __global__ void __launch_bounds__(128)                                                            \
      NAME(const uint8_t* w, int n_out, int n_in, const int8_t* xq, const float* xd, float* y, int rows_per_warp,  \
           int halves) {                                                                                        \
    pipe_variant<T>(rows_per_warp, halves, [&](auto r, auto h) {                                               \
      matvec_pipe_one<T, decltype(r)::value, decltype(h)::value, SPLIT>(w, n_out, n_in, xq, xd, y);            \
    });                                                                                                        \
  }
#define MATVEC_PIPE_MULTI(NAME, T)                                                                               \
  extern "C" __global__ void __launch_bounds__(128)                                                              \
      NAME(const uint8_t* w0, int n0, float* y0, const uint8_t* w1, int n1, float* y1, const uint8_t* w2, int n2,   \
           float* y2, int n_in, const int8_t* xq, const float* xd, int rows_per_warp, int halves) {               \
    pipe_variant<T>(rows_per_warp, halves, [&](auto r, auto h) {                                                 \
      matvec_pipe_three<T, decltype(r)::value, decltype(h)::value>(w0, n0, y0, w1, n1, y1, w2, n2, y2, n_in, xq, xd); \
    });                                                                                                          \
  }
MATVEC_PIPE(matvec_pipe_q4_0r, Q4_0R, false)
MATVEC_PIPE(matvec_pipe_q8_0r, Q8_0R, false)
MATVEC_PIPE(matvec_pipe_q4_kr, Q4_KR, false)
MATVEC_PIPE(matvec_pipe_split_q4_0r, Q4_0R, true)
MATVEC_PIPE(matvec_pipe_split_q8_0r, Q8_0R, true)
MATVEC_PIPE(matvec_pipe_split_q4_kr, Q4_KR, true)
MATVEC_PIPE_MULTI(matvec_pipe_multi_q4_0r, Q4_0R)
MATVEC_PIPE_MULTI(matvec_pipe_multi_q8_0r, Q8_0R)
MATVEC_PIPE_MULTI(matvec_pipe_multi_q4_kr, Q4_KR)
