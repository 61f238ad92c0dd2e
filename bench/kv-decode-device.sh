#!/usr/bin/env bash
# Decode attention through each KV cache type at 4k/16k/32k keys on the GPU machine's 16 CPU
# cores (CPU only), at 8 and 16 threads: bench/kv-decode.ts per thread count. Run from the repo
# root with bun on PATH and zig-out/lib holding libinfer; writes $OUT/kv-decode/threads-N.txt
# and prints them. About 1 minute.
set -u
out="${OUT:?set OUT}/kv-decode"
mkdir -p "$out"
for t in 8 16; do
  timeout 80 bun bench/kv-decode.ts --keys 4096,16384,32768 --rounds 9 --threads "$t" \
    > "$out/threads-$t.txt" 2>&1 || echo "threads $t: exit $?" >> "$out/threads-$t.txt"
  echo "== kv-decode, $t threads"
  cat "$out/threads-$t.txt"
done
