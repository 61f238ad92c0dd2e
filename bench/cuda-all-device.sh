#!/usr/bin/env bash
# The CUDA work that has not yet run on a GPU (docs/cuda.md, "Not yet run on a GPU"), checked and
# timed in two calls of a GPU machine (the `device` tool), each under 10 minutes:
#   A: test/cuda.test.ts, cuda-batch, speculation, cuda-kv-quant, cuda-shift, cuda-kv-turbo-host,
#      tensor-parallel, cuda-paged, kv-pages, cuda-moe (three groups at once); the 8B shape's batched decode under the
#      m16n8k16 (102) and m16n8k32 (2) kernels; prompt lookup on repeated and open text; the MoE
#      prompt and batches under the matvec and tensor-core expert tiles; the server under 1, 8 and
#      32 clients; gpt-oss-20b's shape (12 layers); llama-batched-bench where built by then.
#   B (within 30 s of A, the machine still warm): the peers — llama-batched-bench, llama-lookup,
#      llama-bench and llama-batched-bench on the MoE files, llama-server under the same load.
#   C (optional): the host's 16 CPU cores only, beside a CPU-only llama-bench built there: decode
#      at 16 and 8 threads (bench/cpu-threads.ts), then prefill 512 (bench/cpu-prefill-device.sh);
#      .device/before/ (another libinfer build) runs as "before" where carried.
# llama.cpp (CUDA, sm_90) builds in the background from A's start; the random-weight GGUFs are
# written meanwhile (bench/random-model.ts). Staged in .device/ (ignored) and carried: bun.xz
# (xz -9 of node_modules/bun/bin/bun.exe), nm.tar.xz (node_modules' @huggingface, ajv, fast-uri,
# fast-deep-equal, json-schema-traverse, require-from-string), lib/ (the stripped libinfer-*.so),
# infer.fatbin (shaders/cuda/build.sh), llama-src.tar.xz, this script. From the repo root:
#   LIMIT=540 bash .device/cuda-all-device.sh A; then LIMIT=230 bash .device/cuda-all-device.sh B (LIMIT=450 … C)
# (LEAN=1: no gpt-oss file; NOLLAMA=1: no llama.cpp build.) Results under $OUT.
set -u
PHASE=${1:-A}; T0=$(date +%s); LIMIT=${LIMIT:-540}
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
say() { echo "[$PHASE $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/v.log"; }
cap() { local want=$1 l; l=$(( $(left) - 6 )); [ $l -lt $want ] && want=$l; [ $want -lt 3 ] && want=3; echo $want; }
[ -x /tmp/bin/bun ] || { mkdir -p /tmp/bin && xz -dc .device/bun.xz > /tmp/bin/bun && chmod +x /tmp/bin/bun; }
export PATH=/tmp/bin:$PATH INFER_CACHE=/tmp/ic
mkdir -p node_modules zig-out/lib /tmp/ic && tar xJf .device/nm.tar.xz -C node_modules && cp .device/lib/*.so .device/infer.fatbin zig-out/lib/
say "setup: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1)"
LB=/tmp/l/llama.cpp/b/bin
if [ -z "${NOLLAMA:-}" ] && [ ! -f /tmp/llama-build.started ]; then
  touch /tmp/llama-build.started; mkdir -p /tmp/l && tar xJf .device/llama-src.tar.xz -C /tmp/l
  setsid bash -c "cd /tmp/l/llama.cpp && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/llama-cmake.log 2>&1 && nice -n 5 cmake --build b -j12 --target llama-bench llama-server llama-lookup llama-batched-bench > /tmp/llama-build.log 2>&1; echo \$? > /tmp/llama-build.rc" < /dev/null > /dev/null 2>&1 &
fi
W() { local tag=$1; shift; [ -f /tmp/ic/w-$tag.started ] && return; touch /tmp/ic/w-$tag.started
  setsid bash -c "timeout 420 bun bench/random-model.ts $* > /tmp/ic/w-$tag.log 2>&1; echo \$? > /tmp/ic/w-$tag.rc" < /dev/null > /dev/null 2>&1 & }
W l8-q40 --models llama-3.1-8b --quants Q4_0; W l8-q4k --models llama-3.1-8b --quants Q4_K
W moe-q40 --models qwen3-30b-a3b --layers 16 --quants Q4_0; [ -n "${LEAN:-}" ] || W oss --models gpt-oss-20b --layers 12 --quants MXFP4_MOE
waitfor() { local f=$1 max=$2 s=0; while [ ! -f "$f" ] && [ $s -lt $max ]; do sleep 2; s=$((s+2)); done; [ -f "$f" ]; }
F() { ls /tmp/ic/bench-models/random-$1-v*.gguf 2>/dev/null | head -1; }
sum() { grep -E "^ *[0-9]+ (pass|fail|skip)|\(fail\)|^rc=|^Ran" "$1" | sort -u | head -40 | sed "s|^|$(basename $1 .txt): |"; }
show() { for f in "$@"; do [ -f $f ] && { echo "== $(basename $f)"; grep -v "^\s*$" $f | grep -v "^{" | tail -${N:-30}; }; done; }

if [ "$PHASE" = A ]; then
  ( s=$(date +%s); timeout 200 bun test test/cuda.test.ts test/cuda-batch.test.ts > $OUT/t1.txt 2>&1; echo "rc=$? in $(( $(date +%s) - s ))s" >> $OUT/t1.txt ) & P1=$!
  ( s=$(date +%s); timeout 230 bun test test/speculation.test.ts test/cuda-kv-quant.test.ts test/cuda-shift.test.ts test/cuda-kv-turbo-host.test.ts test/tensor-parallel.test.ts test/cuda-paged.test.ts test/kv-pages.test.ts > $OUT/t2.txt 2>&1; echo "rc=$? in $(( $(date +%s) - s ))s" >> $OUT/t2.txt ) & P2=$!
  ( s=$(date +%s); timeout 200 bun test test/cuda-moe.test.ts > $OUT/t3.txt 2>&1; echo "rc=$? in $(( $(date +%s) - s ))s" >> $OUT/t3.txt ) & P3=$!
  wait $P1 $P2 $P3; say "tests done"; for f in $OUT/t?.txt; do sum $f; done | tee -a $OUT/v.log
  waitfor /tmp/ic/w-l8-q40.rc $(cap 120); waitfor /tmp/ic/w-l8-q4k.rc $(cap 60)
  timeout $(cap 110) bun bench/cuda-decode.ts --models llama-3.1-8b --quants Q4_0,Q4_K --runs 1 --gen 64 --prefill 512 --ctx 1024 --batches 1,8,32,64 --batch-mma 102,2 > $OUT/mmq-8b.txt 2>&1; say "mmq 8b rc=$?"
  M8=$(F llama-3.1-8b-q4_0)
  [ -n "$M8" ] && { timeout $(cap 50) bun bench/speculative.ts --backend cuda --model "$M8" --tasks repeated --runs 3 > $OUT/spec-rep.txt 2>&1; say "spec repeated rc=$?"; }
  waitfor /tmp/ic/w-moe-q40.rc $(cap 30); MOE=$(F qwen3-30b-a3b-16l-q4_0)
  [ -n "$MOE" ] && { timeout $(cap 60) bun bench/cuda-decode.ts --file "$MOE" --runs 2 --gen 64 --prefill 512 --ctx 1024 --batches 8,32 --moe-grouped matvec,mma > $OUT/moe.txt 2>&1; say "moe rc=$?"; }
  M8K=$(F llama-3.1-8b-q4_k)
  [ -n "$M8K" ] && [ $(left) -gt 60 ] && { timeout $(cap 90) bun bench/serve-load.ts --model "$M8K" --backend cuda --clients 1,8,32 --requests 2 > $OUT/serve-infer.txt 2>&1; say "serve infer rc=$?"; }
  if [ -f /tmp/llama-build.rc ]; then
    for m in llama-3.1-8b-q4_0 llama-3.1-8b-q4_k; do f=$(F $m); [ -n "$f" ] && [ $(left) -gt 25 ] || continue
      timeout $(cap 40) $LB/llama-batched-bench -m "$f" -c 16384 -b 2048 -ub 512 -npp 16 -ntg 128 -npl 1,8,32,64 -ngl 99 -fa on 2>&1 | grep -E "^\|\s+16 \|" | sed "s|^|$m |"; done > $OUT/llama-batched.txt; say "batched peers done"
    [ -n "$MOE" ] && [ $(left) -gt 40 ] && timeout $(cap 40) $LB/llama-bench -m "$MOE" -p 512 -n 64 -r 2 -ngl 99 -fa 1 2>&1 | grep -E "^\| .*(pp|tg)|error" > $OUT/moe-llama.txt
  fi
  LBL=; [ -x $LB/llama-lookup ] && LBL="--peer $LB/llama-lookup"
  [ -n "$M8" ] && [ $(left) -gt 50 ] && { timeout $(cap 70) bun bench/speculative.ts --backend cuda --model "$M8" --tasks open --runs 3 ${LBL:-} > $OUT/spec-open.txt 2>&1; say "spec open rc=$?"; }
  OSS=$(F gpt-oss-20b-12l-mxfp4_moe)
  [ -n "$OSS" ] && [ $(left) -gt 40 ] && { timeout $(cap 60) bun bench/cuda-decode.ts --file "$OSS" --runs 2 --gen 64 --prefill 512 --ctx 1024 --batches 8 > $OUT/oss.txt 2>&1; say "oss rc=$?"; }
  say "llama build: $(cat /tmp/llama-build.rc 2>/dev/null || echo running); writers: $(cat /tmp/ic/w-*.rc 2>/dev/null | tr '\n' ' ')"
  N=16 show $OUT/mmq-8b.txt; N=8 show $OUT/spec-rep.txt $OUT/moe.txt $OUT/serve-infer.txt $OUT/spec-open.txt $OUT/oss.txt; N=20 show $OUT/llama-batched.txt $OUT/moe-llama.txt
fi

if [ "$PHASE" = B ]; then
  waitfor /tmp/llama-build.rc $(cap 120); say "llama build rc=$(cat /tmp/llama-build.rc 2>/dev/null) $(tail -c 200 /tmp/llama-build.log | tail -1)"
  for m in qwen3-0.6b-q4_0 qwen3-0.6b-q4_k llama-3.1-8b-q4_0 llama-3.1-8b-q4_k; do f=$(F $m); [ -n "$f" ] || continue
    timeout $(cap 40) $LB/llama-batched-bench -m "$f" -c 16384 -b 2048 -ub 512 -npp 16 -ntg 128 -npl 1,8,32,64 -ngl 99 -fa on 2>&1 | grep -E "^\|\s+16 \|" | sed "s|^|$m |"; done > $OUT/llama-batched.txt; say "batched peers done"
  M8=$(F llama-3.1-8b-q4_0)
  timeout $(cap 60) bun bench/speculative.ts --backend cuda --model "$M8" --tasks repeated --runs 3 --peer $LB/llama-lookup > $OUT/spec-peer.txt 2>&1; say "spec peer rc=$?"
  MOE=$(F qwen3-30b-a3b-16l-q4_0); OSS=$(F gpt-oss-20b-12l-mxfp4_moe)
  for f in $MOE $OSS; do timeout $(cap 40) $LB/llama-bench -m "$f" -p 512 -n 64 -r 2 -ngl 99 -fa 1 2>&1 | grep -E "^\| .*(pp|tg)|error" | sed "s|^|$(basename $f) |";
    timeout $(cap 40) $LB/llama-batched-bench -m "$f" -c 8192 -npp 16 -ntg 64 -npl 1,8,32 -ngl 99 -fa on 2>&1 | grep -E "^\|\s+16 \|" | sed "s|^|$(basename $f) batched |"; done > $OUT/moe-llama.txt; say "moe peers done"
  M8K=$(F llama-3.1-8b-q4_k)
  [ $(left) -gt 40 ] && { timeout $(cap 110) bun bench/serve-load.ts --model "$M8K" --backend cuda --clients 1,8,32 --requests 2 --no-infer --llama-server $LB/llama-server > $OUT/serve-llama.txt 2>&1; say "serve llama rc=$?"; }
  N=40 show $OUT/llama-batched.txt $OUT/moe-llama.txt; N=8 show $OUT/spec-peer.txt $OUT/serve-llama.txt
fi
if [ "$PHASE" = C ]; then # the host's 16 cores, no GPU: decode at 16 and 8 threads, then prefill 512
  LC=/tmp/lc/llama.cpp; BP=
  if [ ! -x $LC/b/bin/llama-bench ]; then mkdir -p /tmp/lc && tar xJf .device/llama-src.tar.xz -C /tmp/lc
    ( cd $LC && cmake -B b -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /tmp/lc.log 2>&1 &&
      cmake --build b -j16 --target llama-bench >> /tmp/lc.log 2>&1 ) & BP=$!; fi
  bun -e 'import { ensureRandomModel, findShape } from "./bench/random-model.ts";
    for (const q of ["Q4_0", "Q4_K", "Q8_0"]) ensureRandomModel(findShape("qwen3-0.6b")!, q);' > $OUT/c-models.txt 2>&1
  [ -n "$BP" ] && wait $BP; say "cpu llama-bench: $(ls $LC/b/bin/llama-bench 2>&1)"
  BL=; [ -f .device/before/libinfer-x86_64_v4_vnni.so ] && BL="--baseline-lib $PWD/.device/before/libinfer-x86_64_v4_vnni.so"
  timeout $(cap 230) bun bench/cpu-threads.ts --plan "qwen3-0.6b/Q4_0,Q4_K/16,8" --modes decode --runs 2 \
    --llama-bench $LC/b/bin/llama-bench --md $OUT/cpu-decode.md > $OUT/cpu-decode.txt 2> $OUT/cpu-decode.log; say "cpu decode rc=$?"
  BUDGET_S=$(( $(left) - 8 )) BASELINE_LIB=${BL#--baseline-lib } bash bench/cpu-prefill-device.sh > $OUT/cpu-prefill.txt 2>&1; say "cpu prefill done"
  cat $OUT/cpu-decode.md; tail -25 $OUT/cpu-prefill.txt; for f in $OUT/prefill/*.md; do [ -f $f ] && cat $f; done
fi
say "end"
