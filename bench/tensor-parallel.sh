#!/usr/bin/env bash
# Tensor parallelism (--gpus N) on a machine of several GPUs, in one call of the `device` tool:
# the measurement of issue 51. For N = 1, then 2 and 4 where the machine has them: the 8B shape's
# batch-1 decode and batch-32 aggregate decode (bench/cuda-decode.ts --gpus N --batches 32), and
# a 70B shape in Q4_0 and Q8_0 (Q8_0, ~75 GB, does not fit one H100), beside llama.cpp's
# llama-bench -sm layer and -sm row on the same GPUs and files. Goals: batch-1 decode not slower
# than 1 GPU; batch 32 at least 1.6x on 2 GPUs. Greedy tokens with N GPUs against 1 GPU: bench
# --check compares the CUDA backend with the CPU; test/tensor-parallel.test.ts the split
# arithmetic on CPU ranks. Until the CUDA backend is wired for N > 1, each --gpus N > 1 run
# stops with its one-line refusal, which lands in the output as it is.
# Needs .device/bun.xz, .device/llama-src.tar.xz and zig-out/lib carried, NCCL 2 on the loader
# path (libnccl.so.2), and disk for the 70B files (~40 + ~75 GB). Writes to $OUT.
#   GPUS=1,2,4 QUANTS=Q4_0,Q8_0 BIG=1 bash bench/tensor-parallel.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
QUANTS=${QUANTS:-Q4_0,Q8_0}; BIG=${BIG:-1}
HAVE=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
GPUS=${GPUS:-$(for n in 1 2 4 8; do [ "$n" -le "$HAVE" ] && printf "%s," "$n"; done | sed 's/,$//')}
T0=$(date +%s); t() { echo "t=$(( $(date +%s) - T0 ))s $*"; }
t "$HAVE GPUs; runs over ${GPUS}" | tee "$OUT/log.txt"
[ "$HAVE" -ge 2 ] || { echo "tensor-parallel.sh: needs 2 GPUs or more, found $HAVE" | tee -a "$OUT/log.txt"; exit 1; }
mkdir -p /tmp/bin && xz -dc .device/bun.xz > /tmp/bin/bun && chmod +x /tmp/bin/bun && export PATH=/tmp/bin:$PATH
export INFER_CACHE=/tmp/ic
bun -e 'import { ncclVersion } from "./ts/native/cuda.ts";
  try { console.log(`NCCL ${ncclVersion()}`); } catch (err) { console.log((err as Error).message); }' |
  tee -a "$OUT/log.txt"
LLAMA=
if [ ! -x /tmp/l/llama.cpp/b/bin/llama-bench ]; then
  mkdir -p /tmp/l && tar xJf .device/llama-src.tar.xz -C /tmp/l
  (cd /tmp/l/llama.cpp && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF > /tmp/cmake.log 2>&1 && nice cmake --build b -j16 --target llama-bench \
    > /tmp/build.log 2>&1; echo "llama build rc=$? at $(( $(date +%s) - T0 ))s") > "$OUT/llama-build.txt" 2>&1 &
  LLAMA=$!
fi
MODELS=llama-3.1-8b; [ "$BIG" = 1 ] && MODELS=$MODELS,llama-3.1-70b
for m in ${MODELS//,/ }; do for q in ${QUANTS//,/ }; do
  timeout 1200 bun bench/random-model.ts --models "$m" --quants "$q" > /dev/null 2>&1 || echo "write $m $q failed"
done; done | tee -a "$OUT/log.txt"
bash shaders/cuda/build.sh > /dev/null 2> "$OUT/nvcc.txt"; t "kernels built, models written" | tee -a "$OUT/log.txt"
(timeout 300 bun test test/tensor-parallel.test.ts 2>&1 | tail -30) > "$OUT/tp-test.txt"
for n in ${GPUS//,/ }; do for q in ${QUANTS//,/ }; do
  # --check 16 on the 8B shape: greedy tokens and prompt logits against the CPU backend.
  timeout 900 bun bench/cuda-decode.ts --models llama-3.1-8b --quants "$q" --gpus "$n" --runs 3 --gen 128 \
    --ctx 2048 --batches 32 --check 16 2>&1 | grep -v "^\s*$" | sed "s|^|gpus=$n |" >> "$OUT/infer.txt"
  [ "$BIG" = 1 ] && timeout 900 bun bench/cuda-decode.ts --models llama-3.1-70b --quants "$q" --gpus "$n" \
    --runs 1 --gen 64 --ctx 1024 --batches 32 2>&1 | grep -v "^\s*$" | sed "s|^|gpus=$n |" >> "$OUT/infer.txt"
done; t "infer --gpus $n done" | tee -a "$OUT/log.txt"; done
[ -n "$LLAMA" ] && wait $LLAMA && tee -a "$OUT/log.txt" < "$OUT/llama-build.txt"
for n in ${GPUS//,/ }; do
  devices=$(seq -s, 0 $((n - 1)))
  for f in /tmp/ic/bench-models/random-llama-3.1-*.gguf; do for sm in layer row; do
    [ -x /tmp/l/llama.cpp/b/bin/llama-bench ] || continue
    CUDA_VISIBLE_DEVICES=$devices timeout 600 /tmp/l/llama.cpp/b/bin/llama-bench -m "$f" -ngl 99 -fa 1 \
      -sm "$sm" -p 512 -n 128 -r 3 -o md 2>&1 | grep -E "^\| " | sed "s|^|gpus=$n sm=$sm $(basename "$f") |"
  done; done
done > "$OUT/llama-bench.txt"
t "llama done" | tee -a "$OUT/log.txt"
grep -E "gpus=[0-9]+ .*(shape|batch 32|not implemented|NCCL|refused|unsupported)" "$OUT/infer.txt" | tee "$OUT/summary.txt"
grep -E "tg128" "$OUT/llama-bench.txt" | tee -a "$OUT/summary.txt"
