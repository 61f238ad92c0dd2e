// Appends keys and values to a layer's KV cache (kv.h's types: f16, Q8_0, Q4_0; K and V may
// differ): row t of k and v (kv_dim f32 values) goes to cell pos0 + t, or (pos0 + t) % cells in
// a ring (sliding-window layers keep only what their window still sees). One thread per 32
// values: a block of a quantized cache is quantized by one thread, as the CPU does it, so the
// bytes are the CPU's; f32 → f16 rounds to nearest even as the CPU does.
#include <metal_stdlib>
#include "args.h"
#include "kv.h"
using namespace metal;

kernel void kv_store(device const float* k [[buffer(0)]], device const float* v [[buffer(1)]],
                     device uchar* k_cache [[buffer(2)]], device uchar* v_cache [[buffer(3)]],
                     constant KvStoreArgs& args [[buffer(4)]],
                     uint3 pos [[thread_position_in_grid]]) {
    const uint c = pos.x;
    const uint t = pos.y;
    if (c * 32 >= args.kv_dim || t >= args.n_tok) return;
    const uint p = args.pos0 + t;
    const ulong cell = args.ring != 0 ? p % args.cells : p;
    const ulong src = ulong(t) * args.kv_dim;
    kv_store_chunk(k + src, k_cache + kv_bytes(args.k_type, cell * args.kv_dim), args.k_type, c,
                   args.kv_dim);
    kv_store_chunk(v + src, v_cache + kv_bytes(args.v_type, cell * args.kv_dim), args.v_type, c,
                   args.kv_dim);
}
