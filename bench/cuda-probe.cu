// Times single kernels of shaders/cuda/infer.cu on a GPU machine, apart from the library: each
// kernel launched n times back to back in a CUDA graph with programmatic dependent launch (as
// lib/cuda launches a decode step's kernels), so the time a launch is the kernel's latency plus
// the boundary between two dependent kernels; and the phases of one launch's first block
// (INFER_MARK in the kernels, SM clock cycles). The decode step's small kernels are latency, not
// bandwidth: bench/cuda-step-parts.ts --alone says how long, this says where. Built and run
// there (no Bun, no libinfer):
//   nvcc -O3 -std=c++17 -fmad=false -arch=sm_90 -DINFER_TRACE bench/cuda-probe.cu -o /tmp/probe && /tmp/probe
#include <cstdio>
#include <cstdlib>
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

/// Decode attention of one token over `pos + 1` keys: n_head query heads over n_kv KV heads of 128.
static void attention(const char* label, int n_head, int n_kv, int pos, int split) {
  const int d = 128, cells = 4096, kv_dim = n_kv * d;
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
  const int group = n_head / n_kv;
  for (const bool warps : {false, true}) {
    char name[128];
    std::snprintf(name, sizeof name, "%s attention (%s), %d keys, split %d", label, warps ? "warps" : "groups", pos + 1,
                  split);
    if (warps) {  // attn_decode_w: a query head a block; its output quantized as Q8_0 (qmode 0) or not (-1)
      for (const int qmode : {-1, 0}) {
        char wname[160];
        std::snprintf(wname, sizeof wname, "%s, qmode %d", name, qmode);
        probe(wname, [&] {
          launch(attn_decode_w, dim3(n_head, split), WARPS_DECODE_WARPS * 32, 0, q, kc, vc,
                 static_cast<const unsigned long long*>(nullptr), positions, n_head, n_kv, d, 0, cells, 0, 0.088f, split,
                 out, part_ml, partial, arrived, qmode, xq, xd);
        });
      }
      continue;
    }
    auto kernel = group == 1 ? attn_decode_g1 : group == 2 ? attn_decode_g2 : group <= 4 ? attn_decode_g4 : attn_decode_g8;
    for (const int qmode : {0, 1}) {
      char gname[160];
      std::snprintf(gname, sizeof gname, "%s, qmode %d", name, qmode);
      probe(gname, [&] {
        launch(kernel, dim3(n_kv, split), DECODE_THREADS, 0, q, kc, vc, static_cast<const unsigned long long*>(nullptr),
               positions, n_head, n_kv, d, 0, cells, 0, 0.088f, split, out, part_ml, partial, arrived, qmode, xq, xd);
      });
    }
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
  float* x = device<float>(1);
  probe("empty kernel (scale of 1 value)", [&] { launch(scale, dim3(1), 32, 0, x, 1, 1.0f); });
  for (int pos : {18, 90, 127}) attention("8B (32/8 heads)", 32, 8, pos, 1);
  attention("8B (32/8 heads)", 32, 8, 255, 1);
  attention("8B (32/8 heads)", 32, 8, 1000, 8);
  attention("8B (32/8 heads)", 32, 8, 4095, 32);
  for (int pos : {18, 90}) attention("0.6B (16/8 heads)", 16, 8, pos, 1);
  add_norm(4096);
  add_norm(1024);
  return 0;
}
