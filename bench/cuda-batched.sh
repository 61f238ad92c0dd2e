#!/usr/bin/env bash
# Batched decode on CUDA beside llama.cpp's llama-batched-bench, in one call on a GPU machine (the
# `device` tool): builds the kernels of this tree and llama-batched-bench (CUDA, sm_90, from
# .device/llama-src.tar.xz) meanwhile; runs the CUDA tests; writes the random-weight GGUFs; then
# bench/cuda-decode.ts --batches with each INFER_CUDA_BATCH_MMA of $MMA interleaved in one
# process (0: matvecs below 16 rows and the prompt's tensor-core tile from 16; 2: the decode
# batches' tile from 2 rows), and llama-batched-bench -npp 16 -ntg 128 on the same files. Needs
# .device/bun.xz, .device/llama-src.tar.xz and zig-out/lib carried. Writes to $OUT.
#   MODELS=llama-3.1-8b,qwen3-0.6b QUANTS=Q4_0,Q4_K,Q8_0 BATCHES=1,8,32,64 MMA=0,2 bash bench/cuda-batched.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODELS=${MODELS:-llama-3.1-8b,qwen3-0.6b}; QUANTS=${QUANTS:-Q4_0,Q4_K,Q8_0}; BATCHES=${BATCHES:-1,8,32,64}
MMA=${MMA:-0,2}; TESTS=${TESTS:-1}
T0=$(date +%s); t() { echo "t=$(( $(date +%s) - T0 ))s $*"; }
mkdir -p /tmp/bin && xz -dc .device/bun.xz > /tmp/bin/bun && chmod +x /tmp/bin/bun && export PATH=/tmp/bin:$PATH
export INFER_CACHE=/tmp/ic
LLAMA=
if [ ! -x /tmp/l/llama.cpp/b/bin/llama-batched-bench ]; then
  mkdir -p /tmp/l && tar xJf .device/llama-src.tar.xz -C /tmp/l
  (cd /tmp/l/llama.cpp && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF > /tmp/cmake.log 2>&1 && nice cmake --build b -j16 --target llama-batched-bench \
    > /tmp/build.log 2>&1; echo "llama build rc=$? at $(( $(date +%s) - T0 ))s") > "$OUT/llama-build.txt" 2>&1 &
  LLAMA=$!
fi
WRITERS=()
for m in ${MODELS//,/ }; do for q in ${QUANTS//,/ }; do  # one writer per file, while the kernels build
  timeout 240 bun bench/random-model.ts --models "$m" --quants "$q" > /dev/null 2>&1 & WRITERS+=($!)
done; done
# FATBIN=path: kernels built elsewhere, used where they load (else built here).
if [ -n "${FATBIN:-}" ] && cp "$FATBIN" zig-out/lib/infer.fatbin && bun -e 'import { cudaInit } from "./ts/native/cuda.ts"; cudaInit();'; then
  t "kernels carried" | tee -a "$OUT/log.txt"
else
  bash shaders/cuda/build.sh > /dev/null 2> "$OUT/nvcc.txt"; t "kernels built" | tee -a "$OUT/log.txt"
fi
if [ "$TESTS" != 0 ]; then  # TESTS=matmul: test/cuda.test.ts's matmul tests and test/cuda-batch.test.ts
  FILTER=(); [ "$TESTS" = 1 ] || FILTER=(-t "$TESTS|sequence|batch")
  (timeout 240 bun test test/cuda.test.ts test/cuda-batch.test.ts "${FILTER[@]}" 2>&1 | grep -v "^\s*$" | tail -60) > "$OUT/cuda-test.txt" || true
  grep -E "^ [0-9]+ (pass|fail)|cuda batch|\(fail\)" "$OUT/cuda-test.txt" | tee -a "$OUT/log.txt"
fi
wait "${WRITERS[@]}"; t "models written" | tee -a "$OUT/log.txt"
for q in ${QUANTS//,/ }; do
  timeout 200 bun bench/cuda-decode.ts --models "$MODELS" --quants "$q" --runs 1 --gen 128 --prefill 512 \
    --ctx 1024 --batches "$BATCHES" --batch-mma "$MMA" 2>&1 | grep -v "^\s*$" >> "$OUT/infer.txt" || true
done
t "infer done" | tee -a "$OUT/log.txt"
[ -n "$LLAMA" ] && wait $LLAMA && cat "$OUT/llama-build.txt" | tee -a "$OUT/log.txt"
for m in ${MODELS//,/ }; do for q in ${QUANTS//,/ }; do
  f=$(ls /tmp/ic/bench-models/random-$m-$(echo "$q" | tr 'A-Z' 'a-z')-v*.gguf 2>/dev/null | head -1)
  [ -x /tmp/l/llama.cpp/b/bin/llama-batched-bench ] && [ -f "$f" ] || continue
  timeout 120 /tmp/l/llama.cpp/b/bin/llama-batched-bench -m "$f" -c 16384 -b 2048 -ub 512 -npp 16 -ntg 128 \
    -npl "$BATCHES" -ngl 99 -fa on 2>&1 | grep -E "^\|\s+16 \|" | sed "s|^|$(basename "$f") batched |"
done; done > "$OUT/llama-bench.txt"
t "llama done" | tee -a "$OUT/log.txt"
# The summary: infer's batched tok/s (and GPU µs a step) under each setting, llama.cpp's S_TG.
grep -oE "^[A-Za-z0-9.-]+-shape +Q[0-9A-Z_]+|batch [0-9]+ [^|]*" "$OUT/infer.txt" | tee "$OUT/summary.txt"
awk '{print $1, "B=" $8, "S_TG", $18}' "$OUT/llama-bench.txt" | tee -a "$OUT/summary.txt"
