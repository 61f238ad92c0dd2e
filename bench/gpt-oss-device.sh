#!/usr/bin/env bash
# gpt-oss on CUDA, in one call of a GPU machine (about 7 minutes with all 24 layers; llama.cpp's
# build not included): the op tests of what gpt-oss adds (MXFP4 matmuls and embeddings, YaRN
# RoPE, attention with sinks under every decode-kernel choice; test/cuda.test.ts) and the model
# tests (test/cuda-moe.test.ts: gpt-oss-20b's shape scaled down and MXFP4 qwen3moe experts against
# the CPU, prompt logits, 16 greedy steps, graph against eager, a batch of three), then a
# random-weight GGUF of gpt-oss-20b's shape (bench/random-model.ts: MXFP4 experts, the rest Q8_0,
# as the released GGUF; $LAYERS of its 24 layers, 12.1 GB at 24, written while the tests run:
# about 2 minutes of one core), bench/cuda-decode.ts on it (batch-1 decode, 512-token prefill,
# batch-8 decode) and beside it llama-bench and llama-batched-bench from /tmp/l/llama.cpp/b/bin
# where they are built. Every step under `timeout`, within $BUDGET seconds in all; a summary last.
# Run from the repo root with bun on PATH, zig-out/lib holding libinfer-*.so and infer.fatbin
# (else the kernels are built here with nvcc), $OUT an empty folder; details in $OUT/gpt-oss/.
#   LAYERS=24 BUDGET=570 bash bench/gpt-oss-device.sh
set -u
OUT=${OUT:-/tmp/out}; D="$OUT/gpt-oss"; mkdir -p "$D"
LAYERS=${LAYERS:-24}; BUDGET=${BUDGET:-570}
export INFER_CACHE=${INFER_CACHE:-/tmp/ic}
T0=$(date +%s); t() { echo "t=$(( $(date +%s) - T0 ))s $*" | tee -a "$D/log.txt"; }
# seconds left of the budget, at most $1
left() { local s=$(( BUDGET - ($(date +%s) - T0) )); [ "$s" -gt "$1" ] && s=$1; [ "$s" -gt 5 ] && echo "$s" || echo 5; }
[ -f zig-out/lib/infer.fatbin ] || { timeout 120 bash shaders/cuda/build.sh > /dev/null 2> "$D/nvcc.txt"; t "kernels built"; }
# the file is written while the tests run (random valid blocks; one core)
( s=$(date +%s); timeout "$(left 330)" bun bench/random-model.ts --models gpt-oss-20b --layers "$LAYERS" \
  --quants MXFP4_MOE > "$D/write.txt" 2>&1; echo "write rc=$? in $(( $(date +%s) - s ))s" >> "$D/write.txt" ) & WRITER=$!
timeout 100 bun test test/cuda.test.ts -t "MXFP4|YaRN|sinks" > "$D/ops.txt" 2>&1; echo "ops rc=$?" >> "$D/ops.txt"
grep -E "MXFP4|YaRN|sinks|^ *[0-9]+ (pass|fail|skip)|\(fail\)|rc=" "$D/ops.txt" | tee -a "$D/log.txt"
t "op tests done"
timeout 100 bun test test/cuda-moe.test.ts -t "MXFP4|gpt-oss" > "$D/models.txt" 2>&1
echo "models rc=$?" >> "$D/models.txt"
grep -E "prompt logits|batch of 3|^ *[0-9]+ (pass|fail|skip)|\(fail\)|rc=" "$D/models.txt" | tee -a "$D/log.txt"
t "model tests done"
wait "$WRITER"; t "model written: $(tail -1 "$D/write.txt")"
F=$(ls "$INFER_CACHE"/bench-models/random-gpt-oss-20b-"$LAYERS"l-mxfp4_moe-v*.gguf 2>/dev/null | head -1)
if [ -z "$F" ]; then t "no gpt-oss-20b-shaped file: $(tail -3 "$D/write.txt")"; exit 1; fi
echo "file $(basename "$F") $(stat -c %s "$F") bytes" | tee -a "$D/log.txt"
timeout "$(left 180)" bun bench/cuda-decode.ts --file "$F" --runs 2 --gen 64 --prefill 512 --ctx 1024 \
  --batches 8 > "$D/infer.txt" 2>&1
t "infer done (rc=$?)"
B=/tmp/l/llama.cpp/b/bin
if [ -x $B/llama-bench ]; then
  timeout "$(left 90)" $B/llama-bench -m "$F" -p 512 -n 64 -r 2 -ngl 99 -fa 1 > "$D/llama-bench.txt" 2>&1
  t "llama-bench done (rc=$?)"
fi
if [ -x $B/llama-batched-bench ]; then
  timeout "$(left 90)" $B/llama-batched-bench -m "$F" -c 4096 -b 2048 -ub 512 -npp 16 -ntg 64 -npl 1,8 -ngl 99 \
    -fa on > "$D/llama-batched.txt" 2>&1
  t "llama-batched-bench done (rc=$?)"
fi
# summary: infer's row (decode, prefill, batch 8), llama.cpp's pp/tg and S_TG at B = 1 and 8
echo "== summary ($(basename "$F")) ==" | tee -a "$D/log.txt"
grep -E "tok/s" "$D/infer.txt" | grep -v "^#" | head -5 | tee -a "$D/log.txt"
grep -hE "^\| .*(pp|tg)[0-9]" "$D/llama-bench.txt" 2>/dev/null | sed "s|^|llama-bench |" | tee -a "$D/log.txt"
grep -hE "^\|\s+16 \|" "$D/llama-batched.txt" 2>/dev/null | sed "s|^|llama-batched-bench |" | tee -a "$D/log.txt"
t "done"
