#!/usr/bin/env bash
# The CUDA comparison of bench/results/cuda.md in one call on a GPU machine (the `device` tool): builds
# the kernels and llama.cpp (CUDA, sm_90; its source from node-llama-cpp 3.21.1's bundle, packed
# as .device/llama-src.tar.xz), runs the CUDA tests while llama.cpp compiles, then infer's
# bench/cuda-decode.ts and llama-bench on the same random-weight GGUFs, one after the other.
# Needs .device/bun.xz (Bun, xz-compressed) and zig-out/lib (libinfer) carried; writes to $OUT.
#   bash bench/cuda-vs-llama.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
set -e; T0=$(date +%s); mkdir -p /tmp/bin && xz -dc .device/bun.xz > /tmp/bin/bun && chmod +x /tmp/bin/bun && export PATH=/tmp/bin:$PATH; export INFER_CACHE=/tmp/ic
mkdir -p /tmp/l && tar xJf .device/llama-src.tar.xz -C /tmp/l
(cd /tmp/l/llama.cpp && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF > /tmp/cmake.log 2>&1 && cmake --build b -j16 --target llama-bench > /tmp/build.log 2>&1; echo "llama build rc=$? at $(( $(date +%s) - T0 ))s") > $OUT/llama-build.txt 2>&1 &
B=$!
bash shaders/cuda/build.sh >/dev/null
(timeout 200 bun test test/cuda.test.ts 2>&1 | grep -v "^\s*$" | tail -75) > $OUT/cuda-test.txt || true; grep -E "^ [0-9]+ (pass|fail)" $OUT/cuda-test.txt || true
bun -e 'import { ensureRandomModel, randomShapes } from "./bench/random-model.ts"; for (const k of ["qwen3-0.6b","llama-3.2-1b"]) for (const q of ["Q4_0","Q8_0","Q4_K"]) ensureRandomModel(randomShapes.find(s => s.key === k), q);' 2>&1 | tail -2
wait $B; cat $OUT/llama-build.txt; echo "t=$(( $(date +%s) - T0 ))s"
timeout 300 bun bench/cuda-decode.ts --models qwen3-0.6b,llama-3.2-1b --quants Q4_0,Q8_0,Q4_K --runs 3 --gen 128 --prefill 512 --check 32 > $OUT/infer-bench.txt 2>&1 || true; grep -v "^{" $OUT/infer-bench.txt | tail -8
for f in /tmp/ic/bench-models/*.gguf; do [ -x /tmp/l/llama.cpp/b/bin/llama-bench ] || break; timeout 60 /tmp/l/llama.cpp/b/bin/llama-bench -m $f -p 512 -n 128 -r 3 -ngl 99 -fa 1 -o md 2>/dev/null | grep -E "pp512|tg128" | sed "s|^|$(basename $f) |"; done | tee $OUT/llama-bench.txt
echo "t=$(( $(date +%s) - T0 ))s"
