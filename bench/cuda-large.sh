#!/usr/bin/env bash
# The CUDA figures of bench/results/cuda.md beside llama.cpp in one call on a GPU machine (the `device`
# tool): builds the kernels of this tree and llama.cpp (CUDA, sm_90, from node-llama-cpp 3.21.1's
# bundle, .device/llama-src.tar.xz) meanwhile; runs the CUDA tests; writes the random-weight GGUFs;
# then infer's bench/cuda-decode.ts (and, for an A/B in the same call, the AB quants again with
# the environment $VARIANT, e.g. VARIANT=INFER_CUDA_FUSE=0) and llama-bench (flash attention
# on, all layers on the GPU) on the same files, one after the other. Needs .device/bun.xz,
# .device/llama-src.tar.xz and zig-out/lib carried. Writes to $OUT; every step has a timeout, so
# a slow one leaves the others' results.
#   MODELS=qwen3-4b,llama-3.1-8b QUANTS=Q4_0,Q4_K,Q8_0 AB=Q4_0 VARIANT=INFER_CUDA_FUSE=0 RUNS=1 \
#     LLAMA_BENCH=1 TESTS=1 bash bench/cuda-large.sh
# (LLAMA_BENCH=0: infer alone, no llama.cpp build; AB=: no A/B; TESTS=0: no CUDA tests;
# PREFILL_BATCH=512: infer's prompt in chunks of 512 rows, as llama-bench's micro-batches; default
# one chunk of 2,048; SKIP_BUILD=1: the kernels already built in this tree.) Measures:
# decode after 16 tokens and after 4,096, a 2,048-token prefill, and decode of 8 and 32 sequences
# at once; llama.cpp: llama-bench -p 2048 -n 128, -n 128 -d 4096, llama-batched-bench -npl 8,32.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LLAMA_BENCH=${LLAMA_BENCH:-1}; MODELS=${MODELS:-qwen3-4b,llama-3.1-8b}; QUANTS=${QUANTS:-Q4_0,Q4_K,Q8_0}; AB=${AB-}; VARIANT=${VARIANT:-INFER_CUDA_FUSE=0}; RUNS=${RUNS:-1}; TESTS=${TESTS:-1}
T0=$(date +%s); t() { echo "t=$(( $(date +%s) - T0 ))s $*"; }
mkdir -p /tmp/bin && xz -dc .device/bun.xz > /tmp/bin/bun && chmod +x /tmp/bin/bun && export PATH=/tmp/bin:$PATH
export INFER_CACHE=/tmp/ic
# (A machine still warm from an earlier call keeps /tmp: its llama.cpp build and models are reused.)
[ -x /tmp/l/llama.cpp/b/bin/llama-batched-bench ] && [ "$LLAMA_BENCH" = 1 ] && LLAMA_BENCH=built
[ "$LLAMA_BENCH" = 1 ] && mkdir -p /tmp/l && tar xJf .device/llama-src.tar.xz -C /tmp/l
[ "$LLAMA_BENCH" = 1 ] && (cd /tmp/l/llama.cpp && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF > /tmp/cmake.log 2>&1 && nice cmake --build b -j16 --target llama-bench llama-batched-bench \
  > /tmp/build.log 2>&1; echo "llama build rc=$? at $(( $(date +%s) - T0 ))s") > "$OUT/llama-build.txt" 2>&1 &
LLAMA=$!; [ "$LLAMA_BENCH" = 1 ] || LLAMA=
[ "${SKIP_BUILD:-0}" = 1 ] || bash shaders/cuda/build.sh > /dev/null 2> "$OUT/nvcc.txt"; t "kernels built" | tee -a "$OUT/log.txt"
if [ "$TESTS" = 1 ]; then
  (timeout 300 bun test test/cuda.test.ts test/cuda-batch.test.ts 2>&1 | grep -v "^\s*$" | tail -80) > "$OUT/cuda-test.txt" || true
  grep -E "^ [0-9]+ (pass|fail)" "$OUT/cuda-test.txt" | tee -a "$OUT/log.txt"
fi
WRITERS=()
for m in ${MODELS//,/ }; do for q in ${QUANTS//,/ }; do  # one writer per file, in parallel
  timeout 240 bun bench/random-model.ts --models "$m" --quants "$q" > /dev/null 2>&1 & WRITERS+=($!)
done; done; wait "${WRITERS[@]}"
t "models written" | tee -a "$OUT/log.txt"
bench() { timeout 200 bun bench/cuda-decode.ts --models "$MODELS" --quants "$1" --runs "$RUNS" --gen 128 \
  --prefill 2048 --prefill-batch "${PREFILL_BATCH:-2048}" --depth 4096 --ctx 4352 --batches 8,32 2>&1 | grep -v "^\s*$"; }
for q in ${AB//,/ }; do
  ( export "$VARIANT"; bench "$q" ) | sed "s/^/variant $q: /" >> "$OUT/infer.txt" || true
done
for q in ${QUANTS//,/ }; do bench "$q" | sed "s/^/new $q: /" >> "$OUT/infer.txt" || true; done
t "infer done" | tee -a "$OUT/log.txt"
[ -n "$LLAMA" ] && wait $LLAMA && cat "$OUT/llama-build.txt" | tee -a "$OUT/log.txt"
FILES=()
for m in ${MODELS//,/ }; do for q in ${QUANTS//,/ }; do
  FILES+=(/tmp/ic/bench-models/random-$m-$(echo "$q" | tr 'A-Z' 'a-z')-v*.gguf)
done; done
for f in "${FILES[@]}"; do
  [ -x /tmp/l/llama.cpp/b/bin/llama-bench ] && [ -f "$f" ] || continue
  name=$(basename "$f")
  timeout 90 /tmp/l/llama.cpp/b/bin/llama-bench -m "$f" -p 2048 -n 128 -r 2 -ngl 99 -fa 1 -o md 2>/dev/null \
    | grep -E "pp2048|tg128" | sed "s|^|$name |"
  timeout 90 /tmp/l/llama.cpp/b/bin/llama-bench -m "$f" -p 0 -n 128 -d 4096 -r 1 -ngl 99 -fa 1 -o md 2>/dev/null \
    | grep -E "tg128" | sed "s|^|$name |"
  timeout 120 /tmp/l/llama.cpp/b/bin/llama-batched-bench -m "$f" -c 8192 -b 2048 -ub 512 -npp 16 -ntg 128 \
    -npl 8,32 -ngl 99 -fa on 2>&1 | grep -E "^\|\s+16 \|" | sed "s|^|$name batched |"
done > "$OUT/llama-bench.txt"
t "llama-bench done" | tee -a "$OUT/log.txt"
