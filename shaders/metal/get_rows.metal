// Embedding lookup: dst[i] = row ids[i] of a weight table, dequantized (quant.h). Thread x of the
// grid dequantizes chunk x (32 values) of row ids[y]; an id outside the table writes nothing
// (the host checks ids before it dispatches).
#include <metal_stdlib>
#include "args.h"
#include "quant.h"
using namespace metal;

template <typename W>
inline void get_rows(device const uchar* table, device const int* ids, device float* dst,
                     constant GetRowsArgs& args, uint3 pos) {
    const uint c = pos.x;
    const uint i = pos.y;
    if (i >= args.n_ids || c >= W::chunks(args.n_cols)) return;
    const int id = ids[i];
    if (id < 0 || uint(id) >= args.n_rows) return;
    float v[32];
    W::chunk(table + ulong(id) * args.row_bytes, c, args.n_cols, v);
    device float* out = dst + ulong(i) * args.n_cols + 32 * c;
    const uint n = min(32u, args.n_cols - 32 * c);
    for (uint l = 0; l < n; l++) out[l] = v[l];
}

kernel void get_rows_f32(device const uchar* table [[buffer(0)]], device const int* ids [[buffer(1)]],
                         device float* dst [[buffer(2)]], constant GetRowsArgs& args [[buffer(3)]],
                         uint3 pos [[thread_position_in_grid]]) {
    get_rows<WeightF32>(table, ids, dst, args, pos);
}

kernel void get_rows_f16(device const uchar* table [[buffer(0)]], device const int* ids [[buffer(1)]],
                         device float* dst [[buffer(2)]], constant GetRowsArgs& args [[buffer(3)]],
                         uint3 pos [[thread_position_in_grid]]) {
    get_rows<WeightF16>(table, ids, dst, args, pos);
}

kernel void get_rows_bf16(device const uchar* table [[buffer(0)]], device const int* ids [[buffer(1)]],
                          device float* dst [[buffer(2)]], constant GetRowsArgs& args [[buffer(3)]],
                          uint3 pos [[thread_position_in_grid]]) {
    get_rows<WeightBF16>(table, ids, dst, args, pos);
}

kernel void get_rows_q4_0(device const uchar* table [[buffer(0)]], device const int* ids [[buffer(1)]],
                          device float* dst [[buffer(2)]], constant GetRowsArgs& args [[buffer(3)]],
                          uint3 pos [[thread_position_in_grid]]) {
    get_rows<WeightQ4_0>(table, ids, dst, args, pos);
}

kernel void get_rows_q5_0(device const uchar* table [[buffer(0)]], device const int* ids [[buffer(1)]],
                          device float* dst [[buffer(2)]], constant GetRowsArgs& args [[buffer(3)]],
                          uint3 pos [[thread_position_in_grid]]) {
    get_rows<WeightQ5_0>(table, ids, dst, args, pos);
}

kernel void get_rows_q8_0(device const uchar* table [[buffer(0)]], device const int* ids [[buffer(1)]],
                          device float* dst [[buffer(2)]], constant GetRowsArgs& args [[buffer(3)]],
                          uint3 pos [[thread_position_in_grid]]) {
    get_rows<WeightQ8_0>(table, ids, dst, args, pos);
}

kernel void get_rows_q4_k(device const uchar* table [[buffer(0)]], device const int* ids [[buffer(1)]],
                          device float* dst [[buffer(2)]], constant GetRowsArgs& args [[buffer(3)]],
                          uint3 pos [[thread_position_in_grid]]) {
    get_rows<WeightQ4_K>(table, ids, dst, args, pos);
}

kernel void get_rows_q5_k(device const uchar* table [[buffer(0)]], device const int* ids [[buffer(1)]],
                          device float* dst [[buffer(2)]], constant GetRowsArgs& args [[buffer(3)]],
                          uint3 pos [[thread_position_in_grid]]) {
    get_rows<WeightQ5_K>(table, ids, dst, args, pos);
}

kernel void get_rows_q6_k(device const uchar* table [[buffer(0)]], device const int* ids [[buffer(1)]],
                          device float* dst [[buffer(2)]], constant GetRowsArgs& args [[buffer(3)]],
                          uint3 pos [[thread_position_in_grid]]) {
    get_rows<WeightQ6_K>(table, ids, dst, args, pos);
}
