// Times single kernels of shaders/cuda/infer.cu on a GPU machine, apart from the library: each
// kernel launched n times back to back in a CUDA graph with programmatic dependent launch (as
// lib/cuda launches a decode step's kernels), so the time a launch is the kernel's latency plus
// the boundary between two dependent kernels; and the phases of one launch's first block
// (INFER_MARK in the kernels, SM clock cycles). The decode step's small kernels are latency, not
// bandwidth: bench/cuda-step-parts.ts --alone says how long, this says where. Built and run
// there (no Bun, no libinfer):
//   nvcc -O3 -std=c++17 -fmad=false -arch=sm_90 -DINFER_TRACE bench/cuda-probe.cu -o /tmp/probe && /tmp/probe
// Environment: PROBE_LONG=1 the decode attention at 1,001-4,096 keys only; PROBE_HOT=1 its
// launches on one cache (in L2 after the first) rather than four in turn (from HBM);
// PROBE_BLOCKS=1 when every block of one cold launch reached each INFER_BLOCK_MARK;
// PROBE_STREAM=1 how fast a cold 16 MiB read goes in the attention's shapes of work;
// PROBE_ONCE=1 plain launches without timing (for ncu).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#ifndef INFER_TRACE
#define INFER_TRACE 1
#endif
#include "../shaders/cuda/infer.cu"

#define CHECK(x)                                                                        \
  do {                                                                                  \
    cudaError_t e = (x);                                                                \
    if (e != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

static cudaStream_t stream;

template <class... P, class... A>
static void launch(void (*kernel)(P...), dim3 grid, int block, int shared, A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = shared;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...));
}

static int clock_khz;

/// µs a launch of `one` (which launches one kernel), n of them in a graph, best of 5 replays;
/// then the marks of the last launch's first block.
template <class F>
static void probe(const char* name, F one, int n = 64) {
  if (std::getenv("PROBE_ONCE")) {  // for ncu: a few plain launches, no graph, no timing
    for (int i = 0; i < 4; i++) one();
    CHECK(cudaStreamSynchronize(stream));
    std::printf("%s: launched\n", name);
    return;
  }
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < n; i++) one();
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int r = 0; r < 6; r++) {
    long long zero[64] = {};
    CHECK(cudaMemcpyToSymbol(infer_trace, zero, sizeof zero));
    CHECK(cudaEventRecord(a, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0 && ms < best) best = ms;
  }
  long long marks[64];
  CHECK(cudaMemcpyFromSymbol(marks, infer_trace, sizeof marks));
  std::printf("%-44s %7.2f us a launch |", name, 1000.0f * best / n);
  long long prev = 0;
  int first = -1;
  for (int k = 0; k < 64; k++) {
    if (marks[k] == 0) continue;
    if (first < 0) first = k;
    else std::printf(" %d-%d %.2f", first, k, (marks[k] - prev) / (clock_khz / 1000.0));
    prev = marks[k];
    first = k;
  }
  std::printf(" (us between marks)\n");
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
}

template <class T>
static T* device(size_t n, float fill_scale = 0.0f) {
  T* p;
  CHECK(cudaMalloc(&p, n * sizeof(T)));
  std::vector<T> h(n);
  for (size_t i = 0; i < n; i++) {
    const float v = fill_scale * static_cast<float>(static_cast<int>((i * 2654435761u) % 2001) - 1000) / 1000.0f;
    if constexpr (sizeof(T) == 2) h[i] = __float2half(v);
    else h[i] = static_cast<T>(v);
  }
  CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

/// Decode attention of one token over `pos + 1` keys: n_head query heads over n_kv KV heads of d.
static void attention(const char* label, int n_head, int n_kv, int d, int pos, int split) {
  const int cells = 4096, kv_dim = n_kv * d;
  float* q = device<float>(n_head * d, 1.0f);
  // Launches take 4 caches in turn, 134 MB at the 8B's shape: their rows come from HBM, not L2,
  // as in a decode step, where a layer's weights pass through L2 between two attentions.
  // PROBE_HOT: one cache, in L2 after the first launch (what a prefetch before the kernel gives).
  const int CACHES = std::getenv("PROBE_HOT") ? 1 : 4;
  __half* kcs[4];
  __half* vcs[4];
  for (int i = 0; i < CACHES; i++) {
    kcs[i] = device<__half>(static_cast<size_t>(cells) * kv_dim, 0.5f);
    vcs[i] = device<__half>(static_cast<size_t>(cells) * kv_dim, 0.5f);
  }
  int turn = 0;
  int* positions = device<int>(1);
  CHECK(cudaMemcpy(positions, &pos, 4, cudaMemcpyHostToDevice));
  float* out = device<float>(n_head * d);
  float* part_ml = device<float>(n_head * split * 2);
  float* partial = device<float>(static_cast<size_t>(n_head) * split * d);
  unsigned* arrived = device<unsigned>(n_head);
  int8_t* xq = device<int8_t>(n_head * d);
  float* xd = device<float>(n_head * d / 32);
  const int group = n_head / n_kv;
  const auto* table = static_cast<const unsigned long long*>(nullptr);
  char name[160];
  auto named = [&](const char* kind, int qmode) {
    std::snprintf(name, sizeof name, "%s %s, %d keys, split %d, qmode %d", label, kind, pos + 1, split, qmode);
    return name;
  };
  // attn_decode_w: a query head a block; its output quantized as Q8_0 (qmode 0) or not (-1).
  if (d >= 32) {
    probe(named("warps", 0), [&] {
      const __half* kc = kcs[turn % CACHES];
      const __half* vc = vcs[turn++ % CACHES];
      launch(attn_decode_w, dim3(n_head, split), WARPS_DECODE_WARPS * 32, 0, q, kc, vc, table, positions, n_head, n_kv,
             d, 0, cells, 0, 0.088f, split, out, part_ml, partial, arrived, 0, xq, xd);
    });
  }
  // attn_decode_mma_d*: a KV head a block, the products on the tensor cores, the tiles by cp.async.
  if ((d == 64 || d == 128) && group <= 8) {
    auto mma = d == 64 ? attn_decode_mma_d64 : attn_decode_mma_d128;
    const int shared = d == 64 ? mma_decode_shared_bytes<64>() : mma_decode_shared_bytes<128>();
    CHECK(cudaFuncSetAttribute(mma, cudaFuncAttributeMaxDynamicSharedMemorySize, shared));
    for (const int qmode : {0, 1}) {
      probe(named("mma", qmode), [&] {
        const __half* kc = kcs[turn % CACHES];
        const __half* vc = vcs[turn++ % CACHES];
        launch(mma, dim3(n_kv, split), MMA_DECODE_WARPS * 32, shared, q, kc, vc, table, positions, n_head, n_kv, d, 0,
               cells, 0, 0.088f, split, out, part_ml, partial, arrived, qmode, xq, xd);
      });
    }
  }
  auto groups = group == 1 ? attn_decode_g1 : group == 2 ? attn_decode_g2 : group <= 4 ? attn_decode_g4 : attn_decode_g8;
  {
    for (const int qmode : {0, 1}) {
      probe(named("groups", qmode), [&] {
        const __half* kc = kcs[turn % CACHES];
        const __half* vc = vcs[turn++ % CACHES];
        launch(groups, dim3(n_kv, split), DECODE_THREADS, 0, q, kc, vc, table, positions, n_head,
               n_kv, d, 0, cells, 0, 0.088f, split, out, part_ml, partial, arrived, qmode, xq, xd);
      });
    }
  }
}

/// PROBE_BLOCKS: one launch of attn_decode_g* on a cold L2 (a 256 MB memset before it), and when
/// its blocks reached each INFER_BLOCK_MARK (global timer, µs from the first block's start):
/// minimum, median, 90th percentile and maximum over the blocks.
static void block_phases(const char* label, int n_head, int n_kv, int d, int pos, int split) {
  const int cells = 4096, kv_dim = n_kv * d, group = n_head / n_kv;
  float* q = device<float>(n_head * d, 1.0f);
  __half* kc = device<__half>(static_cast<size_t>(cells) * kv_dim, 0.5f);
  __half* vc = device<__half>(static_cast<size_t>(cells) * kv_dim, 0.5f);
  int* positions = device<int>(1);
  CHECK(cudaMemcpy(positions, &pos, 4, cudaMemcpyHostToDevice));
  float* out = device<float>(n_head * d);
  float* part_ml = device<float>(n_head * split * 2);
  float* partial = device<float>(static_cast<size_t>(n_head) * split * d);
  unsigned* arrived = device<unsigned>(n_head);
  int8_t* xq = device<int8_t>(n_head * d);
  float* xd = device<float>(n_head * d / 32);
  char* flush;
  CHECK(cudaMalloc(&flush, 256 << 20));
  auto groups = group == 1 ? attn_decode_g1 : group == 2 ? attn_decode_g2 : group <= 4 ? attn_decode_g4 : attn_decode_g8;
  const int blocks = n_kv * split;
  for (int rep = 0; rep < 3; rep++) {
    CHECK(cudaMemsetAsync(flush, rep, 256 << 20, stream));
    static unsigned long long zero[2048][12];
    CHECK(cudaMemcpyToSymbol(infer_block_trace, zero, sizeof zero));
    launch(groups, dim3(n_kv, split), DECODE_THREADS, 0, q, kc, vc, static_cast<const unsigned long long*>(nullptr),
           positions, n_head, n_kv, d, 0, cells, 0, 0.088f, split, out, part_ml, partial, arrived, 0, xq, xd);
    CHECK(cudaStreamSynchronize(stream));
    static unsigned long long tr[2048][12];
    CHECK(cudaMemcpyFromSymbol(tr, infer_block_trace, sizeof tr));
    unsigned long long t0 = ~0ull;
    for (int b = 0; b < blocks; b++) t0 = std::min(t0, tr[b][0]);
    std::printf("%s, %d keys, split %d, launch %d (µs: min / median / p90 / max over %d blocks):\n", label, pos + 1,
                split, rep, blocks);
    for (int k = 0; k < 12; k++) {
      std::vector<double> v;
      for (int b = 0; b < blocks; b++)
        if (tr[b][k] != 0) v.push_back((tr[b][k] - t0) / 1000.0);
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      std::printf("  mark %d: %6.2f %6.2f %6.2f %6.2f\n", k, v[0], v[v.size() / 2], v[v.size() * 9 / 10], v.back());
    }
  }
}

/// PROBE_STREAM: how fast a cold 16 MiB read goes with the decode attention's shapes of work:
/// each thread's 16-byte loads all issued, then summed (kept by a store). `stride` bytes between
/// a block's 256-byte rows (256: contiguous; 2,048: one KV head of 8 in an f16 cache of 128-dim
/// heads), `rows` rows a block.
__global__ void stream_rows(const char* base, int rows, int stride, int heads, float* sink) {
  const int head = blockIdx.x % heads, chunk = blockIdx.x / heads;
  const char* at = base + static_cast<size_t>(chunk) * rows * stride + head * 256;
  float acc = 0.0f;
  uint4 v[32];
#pragma unroll
  for (int i = 0; i < 32; i++) {
    const int c = threadIdx.x + i * blockDim.x;  // 16-byte pieces: 16 a row
    v[i] = c / 16 < rows ? __ldg(reinterpret_cast<const uint4*>(at + static_cast<size_t>(c / 16) * stride) + c % 16) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int i = 0; i < 32; i++) acc += __int_as_float(v[i].x ^ v[i].y ^ v[i].z ^ v[i].w);
  if (acc == 1.2345f) sink[0] = acc;
}

static void stream_probe() {
  char* buf;
  CHECK(cudaMalloc(&buf, 64 << 20));
  CHECK(cudaMemset(buf, 1, 64 << 20));
  char* flush;
  CHECK(cudaMalloc(&flush, 256 << 20));
  float* sink = device<float>(1);
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  struct Shape { const char* what; int blocks, threads, rows, stride, heads; };
  // 16 MiB each: 8 heads x 32 splits x 128 rows of 256 bytes, and the same bytes other ways.
  for (const Shape& sh : {Shape{"KV pattern: 256 blocks of 128 threads, 128 rows at 2 KB stride", 256, 128, 256, 2048, 8},
                          Shape{"contiguous: 256 blocks of 128 threads, 256 rows at 256 B", 256, 128, 256, 256, 1},
                          Shape{"KV pattern: 1024 blocks of 32 threads", 1024, 32, 64, 2048, 8},
                          Shape{"contiguous: 1024 blocks of 32 threads", 1024, 32, 64, 256, 1},
                          Shape{"KV pattern: 512 blocks of 64 threads", 512, 64, 128, 2048, 8}}) {
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
      CHECK(cudaMemsetAsync(flush, r, 256 << 20, stream));
      CHECK(cudaEventRecord(a, stream));
      stream_rows<<<sh.blocks, sh.threads, 0, stream>>>(buf, sh.rows, sh.stride, sh.heads, sink);
      CHECK(cudaEventRecord(b, stream));
      CHECK(cudaEventSynchronize(b));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      best = std::min(best, ms);
    }
    const double bytes = static_cast<double>(sh.blocks) * sh.threads * 32 * 16;
    std::printf("%-70s %6.2f us, %.2f TB/s (%.1f MB)\n", sh.what, best * 1000, bytes / (best * 1e-3) / 1e12, bytes / 1e6);
  }
}

/// add + rms_norm + quantize (Q8_0) of one row of n values, as the decode step launches it.
static void add_norm(int n) {
  float* a = device<float>(n, 1.0f);
  float* b = device<float>(n, 1.0f);
  float* w = device<float>(n, 1.0f);
  float* out = device<float>(n);
  int8_t* q = device<int8_t>(n);
  float* dq = device<float>(n / 32);
  CHECK(cudaFuncSetAttribute(add_rms_norm_q, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * n));
  char name[128];
  std::snprintf(name, sizeof name, "add + rms_norm + quantize, %d values", n);
  probe(name, [&] { launch(add_rms_norm_q, dim3(1), 1024, 8 * n, a, b, a, w, n, 1e-6f, out, 0, q, dq); });
}

int main() {
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  std::printf("SM clock %.0f MHz (marks in us at that clock)\n", clock_khz / 1000.0);
  if (std::getenv("PROBE_STREAM")) {
    stream_probe();
    return 0;
  }
  if (std::getenv("PROBE_BLOCKS")) {
    block_phases("8B (32/8 heads of 128)", 32, 8, 128, 4095, 32);
    block_phases("8B (32/8 heads of 128)", 32, 8, 128, 1000, 8);
    block_phases("0.6B (16/8 heads of 128)", 16, 8, 128, 4095, 32);
    return 0;
  }
  if (const char* only = std::getenv("PROBE_LONG")) {  // the long contexts alone
    (void)only;
    for (const auto& [pos, split] : {std::pair{1000, 8}, {2047, 16}, {4095, 32}})
      attention("8B (32/8 heads of 128)", 32, 8, 128, pos, split);
    attention("0.6B (16/8 heads of 128)", 16, 8, 128, 4095, 32);
    return 0;
  }
  float* x = device<float>(1);
  probe("empty kernel (scale of 1 value)", [&] { launch(scale, dim3(1), 32, 0, x, 1, 1.0f); });
  // The splits the decode plan takes (ts/backend/cuda-attention.ts: ~128 keys a split, at most 64,
  // whole tiles each).
  for (const auto& [pos, split] : {std::pair{18, 1}, {127, 1}, {255, 2}, {1000, 8}, {2047, 16}, {4095, 32}, {4095, 64}})
    attention("8B (32/8 heads of 128)", 32, 8, 128, pos, split);
  for (const auto& [pos, split] : {std::pair{127, 1}, {1000, 8}, {4095, 32}}) attention("1B (32/8 heads of 64)", 32, 8, 64, pos, split);
  for (const auto& [pos, split] : {std::pair{127, 1}, {1000, 8}, {4095, 32}}) attention("0.6B (16/8 heads of 128)", 16, 8, 128, pos, split);
  add_norm(4096);
  add_norm(1024);
  return 0;
}
