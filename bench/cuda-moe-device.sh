#!/usr/bin/env bash
# qwen3moe on CUDA, in one call of a GPU machine (about 4 minutes; llama.cpp's build not included):
# test/cuda-moe.test.ts (CUDA against the CPU on small random MoE GGUFs), then random-weight GGUFs
# of Qwen3-30B-A3B's shape (embedding 2048, 32/4 heads of 128, 128 experts of 768, 8 chosen; the
# router F32; $LAYERS of its 48 layers, so that the files write in the time) in Q4_0 and Q4_K,
# bench/cuda-decode.ts on them (batch-1 decode, 512-token prefill under each grouped expert
# kernel: the tile matvec and the tensor-core tiles, batch-8 and batch-32 decode), and beside
# it llama-bench and llama-batched-bench from /tmp/l/llama.cpp/b/bin where they are built.
# Run from the repo root with bun on PATH, zig-out/lib holding libinfer-*.so and infer.fatbin
# (else the kernels are built here with nvcc), $OUT an empty folder; details in $OUT/cuda-moe/.
#   LAYERS=16 QUANTS=Q4_0,Q4_K bash bench/cuda-moe-device.sh
set -u
OUT=${OUT:-/tmp/out}; D="$OUT/cuda-moe"; mkdir -p "$D"
LAYERS=${LAYERS:-16}; QUANTS=${QUANTS:-Q4_0,Q4_K}
export INFER_CACHE=${INFER_CACHE:-/tmp/ic}
T0=$(date +%s); t() { echo "t=$(( $(date +%s) - T0 ))s $*" | tee -a "$D/log.txt"; }
[ -f zig-out/lib/infer.fatbin ] || { timeout 120 bash shaders/cuda/build.sh > /dev/null 2> "$D/nvcc.txt"; t "kernels built"; }
# the files are written while the tests run (bench/random-model.ts: random valid blocks, fast)
WRITERS=()
for q in ${QUANTS//,/ }; do
  timeout 150 bun bench/random-model.ts --models qwen3-30b-a3b --layers "$LAYERS" --quants "$q" \
    > "$D/write-$q.txt" 2>&1 & WRITERS+=($!)
done
timeout 240 bun test test/cuda-moe.test.ts > "$D/test.txt" 2>&1; echo "test rc=$?" >> "$D/test.txt"
grep -E "prompt logits|batch of 3|tensor-core tiles|^ *[0-9]+ (pass|fail|skip)|\(fail\)|rc=" "$D/test.txt" | tee -a "$D/log.txt"
t "tests done"
wait "${WRITERS[@]}"; t "models written"
FILES=()
for q in ${QUANTS//,/ }; do
  f=$(ls "$INFER_CACHE"/bench-models/random-qwen3-30b-a3b-"$LAYERS"l-"$(echo "$q" | tr 'A-Z' 'a-z')"-v*.gguf 2>/dev/null | head -1)
  [ -f "$f" ] && FILES+=("$f") || echo "no file for $q: $(tail -3 "$D/write-$q.txt")" | tee -a "$D/log.txt"
done
LIST=$(IFS=,; echo "${FILES[*]}")
[ -n "$LIST" ] && timeout 180 bun bench/cuda-decode.ts --file "$LIST" --runs 2 --gen 64 --prefill 512 --ctx 1024 \
  --batches 8,32 --moe-grouped matvec,mma > "$D/infer.txt" 2>&1
t "infer done (rc=$?)"
B=/tmp/l/llama.cpp/b/bin
for f in "${FILES[@]}"; do
  if [ -x $B/llama-bench ]; then
    timeout 60 $B/llama-bench -m "$f" -p 512 -n 64 -r 2 -ngl 99 -fa 1 2>&1 | grep -E "^\| .*(pp|tg)" | sed "s|^|$(basename "$f") |"
  fi
  if [ -x $B/llama-batched-bench ]; then
    timeout 60 $B/llama-batched-bench -m "$f" -c 4096 -b 2048 -ub 512 -npp 16 -ntg 64 -npl 1,8,32 -ngl 99 -fa on 2>&1 \
      | grep -E "^\|\s+16 \|" | sed "s|^|$(basename "$f") batched |"
  fi
done > "$D/llama.txt"
t "llama.cpp done"
# summary: infer's rows (decode, prefill, batch 8 and 32), llama.cpp's pp/tg and S_TG at B = 1, 8, 32
grep -E "shape|tok/s|batch 8" "$D/infer.txt" | grep -v "^#" | head -20 | tee -a "$D/log.txt"
cat "$D/llama.txt" | tee -a "$D/log.txt"
t "done"
