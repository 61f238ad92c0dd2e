// Appends keys and values to a layer's f16 KV cache: row t of k and v (kv_dim f32 values) goes to
// cell pos0 + t, or (pos0 + t) % cells in a ring (sliding-window layers keep only what their
// window still sees). One thread per value; f32 → f16 rounds to nearest even as the CPU does.
#include <metal_stdlib>
#include "args.h"
using namespace metal;

kernel void kv_store(device const float* k [[buffer(0)]], device const float* v [[buffer(1)]],
                     device half* k_cache [[buffer(2)]], device half* v_cache [[buffer(3)]],
                     constant KvStoreArgs& args [[buffer(4)]],
                     uint3 pos [[thread_position_in_grid]]) {
    const uint i = pos.x;
    const uint t = pos.y;
    if (i >= args.kv_dim || t >= args.n_tok) return;
    const uint p = args.pos0 + t;
    const uint cell = args.ring != 0 ? p % args.cells : p;
    const ulong dst = ulong(cell) * args.kv_dim + i;
    const ulong src = ulong(t) * args.kv_dim + i;
    k_cache[dst] = half(k[src]);
    v_cache[dst] = half(v[src]);
}
