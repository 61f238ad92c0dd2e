#!/usr/bin/env bash
# Prefill on the GPU machine's CPU (Intel Emerald Rapids, 16 vCPUs; no GPU used), in about 4 minutes:
# prefill 512 at 16 and 8 threads, infer / infer "before" (BASELINE_LIB, a libinfer built from the
# commit before the change measured; optional) / llama-bench (CPU-only, -DGGML_NATIVE=ON: ggml's AMX
# kernels on this CPU), Qwen3-0.6B shape in Q4_0, Q8_0, Q4_K, then the Llama-3.2-1B shape in Q8_0
# and the Llama-3.1-8B shape in Q4_0 and Q8_0 as far as the time allows. Run from the repo root with
# bun on PATH, zig-out/lib holding the libinfer builds, .device/llama-src.tar.xz (for llama-bench
# unless /tmp/lc/llama.cpp/b/bin/llama-bench exists) and $OUT: prints a summary, details in
# $OUT/prefill/.
#   OUT=/tmp/out [BASELINE_LIB=.device/x/libinfer-before.so] bash bench/cpu-prefill-device.sh
#   (BUDGET_S=230 by default)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/prefill; mkdir -p "$R"
export INFER_CACHE=${INFER_CACHE:-/tmp/ic}
T0=$(date +%s); BUDGET=${BUDGET_S:-230}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
at() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

lscpu > "$R/lscpu.txt" 2>&1
at "cpu: $(grep -m1 'Model name' "$R/lscpu.txt" | sed 's/.*: *//'), $(nproc) cpus"

# llama-bench: the coordinator's, else a CPU-only native build in the background.
LB=/tmp/lc/llama.cpp/b/bin/llama-bench; B=
if [ ! -x "$LB" ] && [ -f .device/llama-src.tar.xz ]; then
  LB=/tmp/prefill-llama/llama.cpp/b/bin/llama-bench
  ( mkdir -p /tmp/prefill-llama && tar xJf .device/llama-src.tar.xz -C /tmp/prefill-llama && cd /tmp/prefill-llama/llama.cpp &&
    timeout 150 cmake -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release &&
    timeout 150 cmake --build b -j16 --target llama-bench ) > "$R/llama-build.txt" 2>&1 &
  B=$!
fi

timeout 30 bun -e 'import { libraryFileNames } from "./ts/native/cpu.ts"; console.log(`library ${libraryFileNames()[0]}`);' \
  2>&1 | tee "$R/library.txt"

# The repacked matmuls (Q8_0's prompt tiles among them) against the rows as stored, bit for bit.
timeout 90 bun test test/repack.test.ts > "$R/test.txt" 2>&1; rc=$?
at "test/repack.test.ts rc=$rc: $(grep -E '^ *[0-9]+ (pass|fail)' "$R/test.txt" | tr -s ' \n' ' ')"

# Random-weight models while llama.cpp builds.
timeout "$(left)" bun -e 'import { ensureRandomModel, findShape } from "./bench/random-model.ts";
  for (const q of ["Q4_0", "Q8_0", "Q4_K"]) ensureRandomModel(findShape("qwen3-0.6b")!, q);
  ensureRandomModel(findShape("llama-3.2-1b")!, "Q8_0");' > "$R/models.txt" 2>&1
at "models written"
if [ -n "$B" ]; then wait $B; at "llama-bench build rc=$? ($(tail -1 "$R/llama-build.txt"))"; fi
[ -x "$LB" ] || { at "no llama-bench: infer only"; LB=; }
BASE=${BASELINE_LIB:-}
[ -z "$BASE" ] || [ -f "$BASE" ] || { at "no $BASE: no 'before' runs"; BASE=; }

bench() { # name plan
  local s; s=$(left); [ "$s" -gt 15 ] || { at "skipped $1: out of time"; return; }
  timeout "$s" bun bench/cpu-threads.ts --plan "$2" --modes prefill --no-bandwidth \
    ${BASE:+--baseline-lib "$BASE"} ${LB:+--llama-bench "$LB"} --json "$R/$1.json" --md "$R/$1.md" > "$R/$1.txt" 2> "$R/$1.log"
  at "$1 rc=$?"; grep -E "prefill (infer|before|llama)" "$R/$1.log" | sed 's/^/  /'
}
bench qwen3 "qwen3-0.6b/Q4_0,Q8_0,Q4_K/16,8"
bench llama1b "llama-3.2-1b/Q8_0/16,8"
bench llama8b "llama-3.1-8b/Q4_0,Q8_0/16"
at "done (details in $R)"
