#!/usr/bin/env bash
# q8_0/q4_0 KV caches on CUDA in one call of a GPU machine (run from the repo root, with bun on
# PATH, zig-out/lib holding libinfer-*.so and infer.fatbin built from this tree, $OUT empty):
# test/cuda-kv-quant.test.ts (CUDA against the CPU), then decode tok/s at 4k, 16k and 32k tokens
# of context for f16, q8_0 and q4_0 caches on the 8B shape (Q4_0 weights, bench/random-model.ts)
# by bench/cuda-kv-decode.ts, and beside it llama-bench with the same cache types where
# /tmp/l/llama.cpp/b/bin/llama-bench exists (built with CUDA). About 4 minutes; every step has
# a timeout, so a slow one leaves the others' results. Details in $OUT/cuda-kv/.
OUT=${OUT:-/tmp/out}; D="$OUT/cuda-kv"; mkdir -p "$D"
export INFER_CACHE=${INFER_CACHE:-/tmp/ic}
T0=$(date +%s); t() { echo "t=$(( $(date +%s) - T0 ))s $*" | tee -a "$D/log.txt"; }
TYPES=${TYPES:-f16,q8_0,q4_0}; DEPTHS=${DEPTHS:-4096,16384,32768}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$D/gpu.txt" 2>&1 || true
# The 8B model written meanwhile (a file already there is kept).
timeout 150 bun bench/random-model.ts --models llama-3.1-8b --quants Q4_0 > "$D/model.txt" 2>&1 & WRITER=$!
(timeout 100 bun test test/cuda-kv-quant.test.ts 2>&1 | grep -v "^\s*$" | tail -120) > "$D/test.txt" || true
t "tests: $(grep -E "^ [0-9]+ (pass|fail|skip)" "$D/test.txt" | tr '\n' ' ')"
wait $WRITER; t "model written (rc $?)"
MODEL=$(ls "$INFER_CACHE"/bench-models/random-llama-3.1-8b-q4_0-v*.gguf 2>/dev/null | head -1)
if [ -n "$MODEL" ]; then
  timeout 120 bun bench/cuda-kv-decode.ts --file "$MODEL" --types "$TYPES" --depths "$DEPTHS" --gen 32 \
    > "$D/infer.txt" 2>&1 || echo "infer bench rc=$?" >> "$D/infer.txt"
  t "infer bench done"
  LB=/tmp/l/llama.cpp/b/bin/llama-bench
  if [ -x "$LB" ]; then
    for ty in ${TYPES//,/ }; do
      timeout 40 "$LB" -m "$MODEL" -ngl 99 -fa 1 -ctk "$ty" -ctv "$ty" -p 0 -n 32 -d "$DEPTHS" -r 1 -o md 2>&1 \
        | grep -E "tg32|error" | sed "s|^|$ty |"
    done > "$D/llama-bench.txt"
    t "llama-bench done"
  else
    echo "no $LB: llama.cpp not built" > "$D/llama-bench.txt"
  fi
fi
echo "== cuda-kv summary =="
cat "$D/log.txt"
grep -E "tok/s" "$D/infer.txt" 2>/dev/null
grep -E "tg32|error|not built" "$D/llama-bench.txt" 2>/dev/null | sed 's/  */ /g'
grep -E "\(fail\)|error:" "$D/test.txt" 2>/dev/null | head -10
