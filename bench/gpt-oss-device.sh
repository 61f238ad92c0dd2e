#!/usr/bin/env bash
# gpt-oss on CUDA, in one call of a GPU machine (under 2 minutes): the op tests of what gpt-oss
# adds (MXFP4 matmuls and embeddings, YaRN RoPE, attention with sinks under every decode-kernel
# choice; test/cuda.test.ts) and the model tests (test/cuda-moe.test.ts: gpt-oss-20b's shape
# scaled down and MXFP4 qwen3moe experts against the CPU, prompt logits, 16 greedy steps, graph
# against eager, a batch of three). Correctness only: no gpt-oss-20b-shaped timing yet.
# Run from the repo root with bun on PATH, zig-out/lib holding libinfer-*.so and infer.fatbin
# (else the kernels are built here with nvcc), $OUT an empty folder; details in $OUT/gpt-oss/.
#   bash bench/gpt-oss-device.sh
set -u
OUT=${OUT:-/tmp/out}; D="$OUT/gpt-oss"; mkdir -p "$D"
T0=$(date +%s); t() { echo "t=$(( $(date +%s) - T0 ))s $*" | tee -a "$D/log.txt"; }
[ -f zig-out/lib/infer.fatbin ] || { timeout 120 bash shaders/cuda/build.sh > /dev/null 2> "$D/nvcc.txt"; t "kernels built"; }
timeout 100 bun test test/cuda.test.ts -t "MXFP4|YaRN|sinks" > "$D/ops.txt" 2>&1; echo "ops rc=$?" >> "$D/ops.txt"
grep -E "MXFP4|YaRN|sinks|^ *[0-9]+ (pass|fail|skip)|\(fail\)|rc=" "$D/ops.txt" | tee -a "$D/log.txt"
t "op tests done"
timeout 100 bun test test/cuda-moe.test.ts -t "MXFP4|gpt-oss" > "$D/models.txt" 2>&1
echo "models rc=$?" >> "$D/models.txt"
grep -E "prompt logits|batch of 3|^ *[0-9]+ (pass|fail|skip)|\(fail\)|rc=" "$D/models.txt" | tee -a "$D/log.txt"
t "model tests done"
