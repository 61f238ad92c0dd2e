#!/usr/bin/env bash
# bench/results/cpu.md's thread-scaling table in one call on a machine of many cores (the `device`
# tool's GPU machine, its CPU only): builds a CPU-only llama-bench (-DGGML_NATIVE=ON, -DGGML_CUDA=OFF)
# in the background while the random-weight GGUFs are written, then runs bench/cpu-threads.ts.
# Needs carried: .device/cpu16/bun.xz (Bun, xz-compressed), .device/cpu16/lib (the libinfer builds
# and libbench-bandwidth), .device/cpu16/llama-src.tar.xz; optional .device/cpu16/before (another
# libinfer build, run as "before"). Writes to $OUT.
#   PLAN="qwen3-0.6b/Q4_0/8,16" EXTRA="--deep 4096" bash bench/cpu-threads.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.device/cpu16
set -e; T0=$(date +%s); mkdir -p /tmp/bin && xz -dc $D/bun.xz > /tmp/bin/bun && chmod +x /tmp/bin/bun
export PATH=/tmp/bin:$PATH INFER_CACHE=/tmp/ic
mkdir -p zig-out/lib && cp $D/lib/* zig-out/lib/
(lscpu; echo; numactl -H 2>/dev/null || cat /sys/devices/system/node/online; echo;
 grep -E "MemTotal|Hugepagesize" /proc/meminfo; cat /sys/kernel/mm/transparent_hugepage/enabled) > $OUT/lscpu.txt 2>&1
grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node|L3" $OUT/lscpu.txt || true
LB=/tmp/l/llama.cpp/b/bin/llama-bench
# A llama-bench carried from an earlier call (built -march=native there) runs only on a like CPU.
if [ -x "$D/llama-bench" ] && { $D/llama-bench --help > /dev/null 2>&1 || [ ! -f $D/llama-src.tar.xz ]; }; then
  LB=$PWD/$D/llama-bench; else
  mkdir -p /tmp/l && tar xJf $D/llama-src.tar.xz -C /tmp/l
  (cd /tmp/l/llama.cpp && cmake -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
     -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/cmake.log 2>&1 &&
   cmake --build b -j16 --target llama-bench > /tmp/build.log 2>&1; echo "llama build rc=$? at $(( $(date +%s) - T0 ))s") > $OUT/llama-build.txt 2>&1 &
  B=$!
fi
bun -e 'import { ensureRandomModel, findShape } from "./bench/random-model.ts";
  const plan = process.env.PLAN ?? "qwen3-0.6b/Q4_0/8,16";
  for (const part of plan.split(";")) { const [m, qs] = part.split("/"); for (const q of qs.split(",")) ensureRandomModel(findShape(m), q); }'
echo "models written at $(( $(date +%s) - T0 ))s"
if [ -n "${B:-}" ]; then wait $B || true; cat $OUT/llama-build.txt; tail -3 /tmp/build.log; fi
[ -x "$LB" ] && cp "$LB" $OUT/llama-bench || true
if [ -n "${STEP_PARTS:-}" ]; then
  bun bench/cpu-step-parts.ts $STEP_PARTS > $OUT/step-parts.txt 2>&1 || true; tail -25 $OUT/step-parts.txt
fi
BEFORE=; [ -d $D/before ] && BEFORE="--baseline-lib $PWD/$D/before/libinfer-$(bun -e 'import { libraryFileNames } from "./ts/native/cpu.ts"; console.log(libraryFileNames()[0].replace(/^libinfer-|\.so$/g, ""))').so"
set +e
bun bench/cpu-threads.ts --plan "${PLAN:-qwen3-0.6b/Q4_0/8,16}" --llama-bench "$LB" $BEFORE ${EXTRA:-} \
  --json $OUT/cpu-threads.json --md $OUT/cpu-threads.md 2> >(tee $OUT/cpu-threads.log >&2)
echo "t=$(( $(date +%s) - T0 ))s"
