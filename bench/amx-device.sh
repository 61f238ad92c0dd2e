#!/usr/bin/env bash
# The AMX prompt path (lib/cpu/matmul_amx.zig) on the GPU machine's CPU (Intel Emerald Rapids, AMX-INT8;
# no GPU used), in about 3 minutes: the AMX kernels against the stored rows' arithmetic, bit for bit
# (test/amx.test.ts), then prefill 512 at 16 and 8 threads, infer (AMX) / infer INFER_AMX=0 ("before":
# AVX-512 VNNI) / llama-bench, Qwen3-0.6B shape in Q4_0, Q8_0, Q4_K, then the Llama-3.1-8B shape as
# far as the time allows. Run from the repo root with bun on PATH, zig-out/lib holding the libinfer
# builds, .device/llama-src.tar.xz (for llama-bench unless /tmp/lc/llama.cpp/b/bin/llama-bench exists)
# and $OUT: prints a summary, details in $OUT/amx/.
#   OUT=/tmp/out bash bench/amx-device.sh            (BUDGET_S=175 by default)
set -u
OUT=${OUT:-/tmp/out}; R=$OUT/amx; mkdir -p "$R"
export INFER_CACHE=${INFER_CACHE:-/tmp/ic}
T0=$(date +%s); BUDGET=${BUDGET_S:-175}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
at() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

lscpu > "$R/lscpu.txt" 2>&1
at "cpu: $(grep -m1 'Model name' "$R/lscpu.txt" | sed 's/.*: *//'); flags: $(grep -o 'amx[a-z0-9_]*' "$R/lscpu.txt" | sort -u | tr '\n' ' ')"

# llama-bench: the coordinator's, else a CPU-only native build in the background.
LB=/tmp/lc/llama.cpp/b/bin/llama-bench; B=
if [ ! -x "$LB" ] && [ -f .device/llama-src.tar.xz ]; then
  LB=/tmp/amx-llama/llama.cpp/b/bin/llama-bench
  ( mkdir -p /tmp/amx-llama && tar xJf .device/llama-src.tar.xz -C /tmp/amx-llama && cd /tmp/amx-llama/llama.cpp &&
    timeout 150 cmake -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release &&
    timeout 150 cmake --build b -j16 --target llama-bench ) > "$R/llama-build.txt" 2>&1 &
  B=$!
fi

# Which build loads and whether its prompts take AMX.
timeout 30 bun -e 'import { libraryFileNames } from "./ts/native/cpu.ts"; import { native } from "./ts/native/lib.ts";
  console.log(`library ${libraryFileNames()[0]}, AMX path in use: ${native().infer_cpu_amx() === 1 ? "yes" : "NO"}`);' \
  2>&1 | tee "$R/library.txt"

# The AMX kernels against the stored rows (Q4_0, Q4_K; full tiles, tails, half tiles), bit for bit.
timeout 90 bun test test/amx.test.ts > "$R/test.txt" 2>&1; rc=$?
at "test/amx.test.ts rc=$rc: $(grep -E '^ *[0-9]+ (pass|fail)' "$R/test.txt" | tr -s ' \n' ' ')"

# Random-weight models while llama.cpp builds.
timeout "$(left)" bun -e 'import { ensureRandomModel, findShape } from "./bench/random-model.ts";
  for (const q of ["Q4_0", "Q8_0", "Q4_K"]) ensureRandomModel(findShape("qwen3-0.6b")!, q);' > "$R/models.txt" 2>&1
at "models written"
if [ -n "$B" ]; then wait $B; at "llama-bench build rc=$? ($(tail -1 "$R/llama-build.txt"))"; fi
[ -x "$LB" ] || { at "no llama-bench: infer only"; LB=; }

bench() { # name plan
  local s; s=$(left); [ "$s" -gt 15 ] || { at "skipped $1: out of time"; return; }
  timeout "$s" bun bench/cpu-threads.ts --plan "$2" --modes prefill --no-bandwidth --baseline-env INFER_AMX=0 \
    ${LB:+--llama-bench "$LB"} --json "$R/$1.json" --md "$R/$1.md" > "$R/$1.txt" 2> "$R/$1.log"
  at "$1 rc=$?"; grep -E "prefill (infer|before|llama)" "$R/$1.log" | sed 's/^/  /'
}
bench qwen3 "qwen3-0.6b/Q4_0,Q8_0,Q4_K/16,8"
bench llama8b "llama-3.1-8b/Q4_0,Q4_K/16"
at "done (details in $R)"
