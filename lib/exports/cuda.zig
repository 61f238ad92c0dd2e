//! The CUDA backend's part of the C surface (lib/cuda/: the driver loaded at run time, the
//! kernels of shaders/cuda/ from a fatbin). Device addresses are u64; a call with more than a
//! handful of arguments takes a struct of lib/abi.zig. Without a driver, GPU or kernel file,
//! infer_cuda_init fails with `unsupported` and "CUDA not available: <reason>"; every other call
//! then fails cleanly.
const abi = @import("../abi.zig");
const cuda = @import("../cuda/cuda.zig");
const nccl = @import("../cuda/nccl.zig");
const moe = @import("../cuda/moe.zig");

/// Loads libcuda, takes device `device` and loads the kernels (a fatbin) at path.
export fn infer_cuda_init(path_ptr: [*]const u8, path_len: usize, device: i32) i32 {
    return cuda.init(path_ptr[0..path_len], device);
}

/// Out: the device name (NUL-terminated) and [total bytes, free bytes, multiprocessors,
/// compute capability major*10+minor, driver version, L2 bytes].
export fn infer_cuda_device_info(name: [*]u8, name_len: usize, out: *[6]i64) i32 {
    return cuda.deviceInfo(name, name_len, out);
}

/// Synchronise after every launch (debugging: an asynchronous fault is reported by its kernel).
export fn infer_cuda_set_debug_sync(on: bool) void {
    cuda.setDebugSync(on);
}

/// Starts (on) or stops profiler collection, for Nsight Compute's --profile-from-start off.
export fn infer_cuda_profiler(on: bool) i32 {
    return cuda.profiler(on);
}

/// The activation format a weight type's matmul reads: 0 = Q8_0, 1 = Q8_K, -1 = f32;
/// -2 = a type the CUDA backend does not compute.
export fn infer_cuda_weight_activation(type_id: u32) i32 {
    return if (cuda.weightKind(type_id)) |k| k.activation else -2;
}

/// The type id a weight of ggml type `type_id` with rows of n_in values computes as once
/// infer_cuda_repack has run on it (its GPU layout, or type_id when it keeps the GGUF's).
export fn infer_cuda_repacked_type(type_id: u32, n_in: u64) u32 {
    return cuda.repackedType(type_id, n_in);
}

/// Rewrites a just-uploaded weight (n_rows rows of n_in values) into infer_cuda_repacked_type's
/// layout, in place, in stream order.
export fn infer_cuda_repack(w: u64, type_id: u32, n_rows: u64, n_in: u64) i32 {
    return cuda.repack(w, type_id, n_rows, n_in);
}

export fn infer_cuda_malloc(bytes: u64, out: *u64) i32 {
    return cuda.malloc(bytes, out);
}

export fn infer_cuda_free(ptr: u64) void {
    cuda.free(ptr);
}

/// Out: the granularity (bytes) of reserved ranges and maps; fails with `unsupported` where
/// libcuda or the device lacks virtual memory management (the KV cache is then allocated whole).
export fn infer_cuda_vmm_granularity(out: *u64) i32 {
    return cuda.vmm.granularity(out);
}

/// Reserves `bytes` (a multiple of the granularity) of device address space, nothing mapped.
export fn infer_cuda_vmm_reserve(bytes: u64, out: *u64) i32 {
    return cuda.vmm.reserve(bytes, out);
}

export fn infer_cuda_vmm_address_free(ptr: u64, bytes: u64) void {
    cuda.vmm.addressFree(ptr, bytes);
}

/// Creates `bytes` of physical device memory; out: its handle (mapped with infer_cuda_vmm_map).
export fn infer_cuda_vmm_create(bytes: u64, out: *u64) i32 {
    return cuda.vmm.create(bytes, out);
}

export fn infer_cuda_vmm_release(handle: u64) void {
    cuda.vmm.release(handle);
}

/// Maps physical memory `handle` of `bytes` at ptr (inside a reserved range), read-write. One
/// handle may be mapped at several ranges, which then share its memory.
export fn infer_cuda_vmm_map(ptr: u64, bytes: u64, handle: u64) i32 {
    return cuda.vmm.map(ptr, bytes, handle);
}

/// Waits for the stream, then unmaps [ptr, ptr + bytes).
export fn infer_cuda_vmm_unmap(ptr: u64, bytes: u64) i32 {
    return cuda.vmm.unmap(ptr, bytes);
}

export fn infer_cuda_host_alloc(bytes: u64, out: *u64) i32 {
    return cuda.hostAlloc(bytes, out);
}

export fn infer_cuda_host_free(ptr: u64) void {
    cuda.hostFree(ptr);
}

/// Stream-ordered host -> device copy; `src` may be reused as soon as this returns.
export fn infer_cuda_upload(dst: u64, src: [*]const u8, bytes: u64) i32 {
    return cuda.upload(dst, src, bytes);
}

/// Waits for queued work, then copies device -> host.
export fn infer_cuda_download(dst: [*]u8, src: u64, bytes: u64) i32 {
    return cuda.download(dst, src, bytes);
}

export fn infer_cuda_copy(dst: u64, src: u64, bytes: u64) i32 {
    return cuda.copy(dst, src, bytes);
}

export fn infer_cuda_fill32(dst: u64, value: u32, count: u64) i32 {
    return cuda.fill32(dst, value, count);
}

export fn infer_cuda_sync() i32 {
    return cuda.sync();
}

/// Records the launches that follow (until capture_end) into a CUDA graph instead of running them.
export fn infer_cuda_capture_begin() i32 {
    return cuda.captureBegin();
}

export fn infer_cuda_capture_end(out_exec: *u64) i32 {
    return cuda.captureEnd(out_exec);
}

export fn infer_cuda_capture_abort() void {
    cuda.captureAbort();
}

export fn infer_cuda_graph_launch(exec: u64) i32 {
    return cuda.graphLaunch(exec);
}

export fn infer_cuda_graph_destroy(exec: u64) void {
    cuda.graphDestroy(exec);
}

/// dst[i] = row ids[i] (i < n_ids, ids on the device) of a table of rows of n_cols values.
export fn infer_cuda_get_rows(type_id: u32, table: u64, n_cols: u64, n_ids: u64, ids: u64, dst: u64) i32 {
    return cuda.ops.getRows(type_id, table, n_cols, n_ids, ids, dst);
}

/// Quantizes f32 rows for a quantized matmul: mode 0 = Q8_0, 1 = Q8_K (q: int8, d: f32 per 32).
export fn infer_cuda_quantize(x: u64, n_rows: u64, n_cols: u64, mode: u32, q: u64, d: u64) i32 {
    return cuda.ops.quantize(x, n_rows, n_cols, mode, q, d);
}

/// y[t][o] = W[o] · x[t]; quantized W reads xq/xd (infer_cuda_quantize), float W reads x.
export fn infer_cuda_matmul(args: *const abi.CudaMatmulArgs) i32 {
    return cuda.ops.matmul(args.*);
}

/// out = rms_norm(x) · weight per row (weight 0: none); out may alias x.
export fn infer_cuda_rms_norm(x: u64, weight: u64, n_rows: u64, n_cols: u64, eps: f32, out: u64) i32 {
    return cuda.ops.rmsNorm(x, weight, n_rows, n_cols, eps, out);
}

export fn infer_cuda_rms_norm_add(x: u64, weight: u64, n_rows: u64, n_cols: u64, eps: f32, residual: u64) i32 {
    return cuda.ops.rmsNormAdd(x, weight, n_rows, n_cols, eps, residual);
}

/// In-place RoPE as infer_rope; positions (i32 per token) and freq factors (0: none) on the device.
export fn infer_cuda_rope(args: *const abi.CudaRopeArgs) i32 {
    return cuda.ops.rope(args.*);
}

/// Rows of k and v into the cache (f16, q8_0 or q4_0) at cell positions[t] (mod cells when ring).
export fn infer_cuda_kv_store(args: *const abi.CudaKvStoreArgs) i32 {
    return cuda.ops.kvStore(args.*);
}

/// The context shift of one cache: rows moved down, their keys re-rotated (abi.CudaKvShiftArgs).
export fn infer_cuda_kv_shift(args: *const abi.CudaKvShiftArgs) i32 {
    return cuda.ops.kvShift(args.*);
}

/// Bytes of scratch infer_cuda_kv_shift needs for n_rows rows of a cache.
export fn infer_cuda_kv_shift_scratch(kv_heads: u64, head_dim: u64, n_rows: u64, v_type: u32) u64 {
    return cuda.ops.kvShiftScratch(kv_heads, head_dim, n_rows, v_type);
}

/// Rows coded into a tq3/tq4 cache, less a per-layer anchor row (abi.CudaKvStoreTurboArgs).
export fn infer_cuda_kv_store_turbo(args: *const abi.CudaKvStoreTurboArgs) i32 {
    return cuda.ops.kvStoreTurbo(args.*);
}

/// f32 values of scratch infer_cuda_attention needs.
export fn infer_cuda_attention_scratch(n_tok: u64, n_head: u64, head_dim: u64, cells: u64, n_split: u64) u64 {
    return cuda.ops.attentionScratch(n_tok, n_head, head_dim, cells, n_split);
}

/// Causal (optionally sliding-window) GQA over f16 caches, split n_split ways over the keys: one
/// sequence's cache, or rows of different sequences through a table of caches (the server's
/// batched decode), optionally quantizing its output (lib/abi.zig CudaAttentionArgs).
export fn infer_cuda_attention(args: *const abi.CudaAttentionArgs) i32 {
    return cuda.ops.attention(args.*);
}

/// Prompts of at least min_tokens tokens (0: none) take quantized matmuls as cuBLAS f16 GEMMs
/// (lib/cuda/ops.zig gemmF16); "unsupported" when cuBLAS does not load.
export fn infer_cuda_set_cublas(min_tokens: u32) i32 {
    return cuda.ops.setCublas(min_tokens);
}

/// The prompt length from which matmuls run as cuBLAS GEMMs (0: never; cuBLAS may still be
/// missing, in which case MMQ runs).
export fn infer_cuda_cublas_min_tokens() u32 {
    return cuda.ops.cublasMinTokens();
}

/// Decode batches of at least min_tokens tokens (to 64; 0: none) take the small-tile tensor-core
/// matmul (lib/cuda/ops.zig batchMma); fewer take matvecs. Benches compare the two in one process.
export fn infer_cuda_set_batch_mma(min_tokens: u32) i32 {
    return cuda.ops.setBatchMma(min_tokens);
}

/// The decode attention's kernels (0 auto, 1 warps, 2 groups, 3 mma: lib/cuda/attention.zig
/// DecodeAttention): the tests run each attention case under each.
export fn infer_cuda_set_decode_attention(mode: u32) i32 {
    return cuda.ops.setDecodeAttention(mode);
}

/// Whether infer_cuda_attention takes these shapes and cache types with a table of caches.
export fn infer_cuda_attention_rows_fit(n_head: u64, n_kv_head: u64, head_dim: u64, k_type: u32, v_type: u32, sinks: bool) bool {
    return cuda.ops.attentionRowsFit(n_head, n_kv_head, head_dim, k_type, v_type, sinks);
}

/// Keys and values of rows of different sequences into their caches (the table of
/// infer_cuda_attention).
export fn infer_cuda_kv_store_rows(k: u64, v: u64, kv_dim: u64, n_tok: u64, kv_table: u64, positions: u64, cells: u64, ring: bool, k_type: u32, v_type: u32) i32 {
    return cuda.ops.kvStoreRows(k, v, kv_dim, n_tok, kv_table, positions, cells, ring, k_type, v_type);
}

export fn infer_cuda_gelu_mul(gate: u64, up: u64, n: u64, out: u64) i32 {
    return cuda.ops.geluMul(gate, up, n, out);
}

export fn infer_cuda_silu_mul(gate: u64, up: u64, n: u64, out: u64) i32 {
    return cuda.ops.siluMul(gate, up, n, out);
}

export fn infer_cuda_add(a: u64, b: u64, n: u64, out: u64) i32 {
    return cuda.ops.add(a, b, n, out);
}

export fn infer_cuda_scale(x: u64, n: u64, s: f32) i32 {
    return cuda.ops.scale(x, n, s);
}

export fn infer_cuda_add_row_bias(x: u64, bias: u64, n_rows: u64, n_cols: u64) i32 {
    return cuda.ops.addRowBias(x, bias, n_rows, n_cols);
}

/// rms_norm then quantize of its output (the two calls fused; equal bit for bit).
export fn infer_cuda_rms_norm_quant(args: *const abi.CudaRmsNormQuantArgs) i32 {
    return cuda.ops.rmsNormQuant(args.*);
}

/// sum = a + b, out = rms_norm(sum) · weight, quantized (add + rms_norm + quantize fused).
export fn infer_cuda_add_rms_norm_quant(args: *const abi.CudaAddRmsNormQuantArgs) i32 {
    return cuda.ops.addRmsNormQuant(args.*);
}

/// In-place rms_norm of two tensors (query and key head norms) in one launch.
export fn infer_cuda_rms_norm2(xa: u64, wa: u64, rows_a: u64, xb: u64, wb: u64, rows_b: u64, n_cols: u64, eps: f32) i32 {
    return cuda.ops.rmsNorm2(xa, wa, rows_a, xb, wb, rows_b, n_cols, eps);
}

/// Two or three one-token matmuls over the same quantized input in one launch (n2 = 0: two).
export fn infer_cuda_matmul_multi(args: *const abi.CudaMatmulMultiArgs) i32 {
    return cuda.ops.matmulMulti(args.*);
}

/// gelu_mul (kind 0) or silu_mul (kind 1), then quantize of the product.
export fn infer_cuda_act_mul_quant(args: *const abi.CudaActMulQuantArgs) i32 {
    return cuda.ops.actMulQuant(args.*);
}

/// RoPE of queries and keys in one launch.
export fn infer_cuda_rope2(args: *const abi.CudaRope2Args) i32 {
    return cuda.ops.rope2(args.*);
}

/// Queues device -> host into pinned memory (infer_cuda_host_alloc) and records event `slot`.
export fn infer_cuda_download_async(dst: u64, src: u64, bytes: u64, slot: u32) i32 {
    return cuda.downloadAsync(dst, src, bytes, slot);
}

/// Waits for the work queued before event `slot` was last recorded.
export fn infer_cuda_event_wait(slot: u32) i32 {
    return cuda.eventWait(slot);
}

/// One token: q/k head norms (wq = wk = 0: none), RoPE of both, k/v into the f16 cache.
export fn infer_cuda_norm_rope_store(args: *const abi.CudaNormRopeStoreArgs) i32 {
    return cuda.ops.normRopeStore(args.*);
}

/// Mixture of experts (lib/cuda/moe.zig): per token the k experts of its router logits (gating
/// 0: softmax, top k, norm: divided by their sum; 1: top k, softmax over them) into ids/weights.
export fn infer_cuda_moe_route(logits: u64, n_tok: u64, n_expert: u64, k: u64, gating: u32, norm: bool, ids: u64, weights: u64) i32 {
    return moe.route(logits, n_tok, n_expert, k, gating, norm, ids, weights);
}

/// The slots at ids sorted by expert into a table of infer_cuda_moe_group_ints ints, in tiles of
/// up to `tile` slots (8 or 32).
export fn infer_cuda_moe_group(ids: u64, n_slots: u64, n_expert: u64, tile: u64, table: u64) i32 {
    return moe.group(ids, n_slots, n_expert, tile, table);
}

export fn infer_cuda_moe_group_ints(n_slots: u64, n_expert: u64) u64 {
    return moe.groupTableInts(n_slots, n_expert);
}

/// Whether experts of ggml type (or GPU layout) type_id have matvecs on the GPU.
export fn infer_cuda_moe_supports(type_id: u32) bool {
    return moe.supports(type_id);
}

/// Matvecs indexed by expert id: y[s] = W[ids[s]] · x[s / x_div].
export fn infer_cuda_moe_matmul(args: *const abi.CudaMoeMatmulArgs) i32 {
    return moe.matmul(args.*);
}

/// out[t] = Σ_j weights[t·k + j] · y[t·k + j], in rank order.
export fn infer_cuda_moe_sum(y: u64, weights: u64, k: u64, n_cols: u64, n_tok: u64, bias: u64, ids: u64, out: u64) i32 {
    return moe.sum(y, weights, k, n_cols, n_tok, bias, ids, out);
}

/// gpt-oss's clamped SwiGLU of n_rows rows of n_cols, each row's gate and up plus its expert's
/// biases (bias_gate = 0: none).
export fn infer_cuda_moe_swiglu_oai(gate: u64, up: u64, bias_gate: u64, bias_up: u64, ids: u64, n_rows: u64, n_cols: u64, out: u64) i32 {
    return moe.swigluOai(gate, up, bias_gate, bias_up, ids, n_rows, n_cols, out);
}

/// out[0] = argmax of n f32 values (greedy sampling on the device); scratch: 16 zeroed bytes.
export fn infer_cuda_argmax(x: u64, n: u64, scratch: u64, out: u64) i32 {
    return cuda.ops.argmax(x, n, scratch, out);
}

test {
    _ = cuda;
    _ = cuda.ops;
    _ = moe;
}
// ---- NCCL (lib/cuda/nccl.zig): several GPUs of one host ----------------------------------------

/// Loads libnccl.so.2 (once); `unsupported` with one line where it is missing.
export fn infer_nccl_load() i32 {
    return nccl.load();
}

/// NCCL's version code (major*10000 + minor*100 + patch).
export fn infer_nccl_version(out: *i32) i32 {
    return nccl.version(out);
}

/// One communicator per device 0 .. devices - 1, all in this process, into comms_out.
export fn infer_nccl_comms_init(devices: u32, comms_out: [*]u64) i32 {
    return nccl.initAll(comms_out[0..devices]);
}

/// A unique id (128 bytes) for infer_nccl_comm_init_rank, made by rank 0 of a process per GPU.
export fn infer_nccl_unique_id(out: *[128]u8) i32 {
    return nccl.uniqueId(out);
}

/// This process's communicator: rank `rank` of `ranks` under unique id `id`.
export fn infer_nccl_comm_init_rank(id: *const [128]u8, ranks: u32, rank: u32, comm_out: *u64) i32 {
    return nccl.initRank(id, ranks, rank, comm_out);
}

export fn infer_nccl_comm_destroy(comm: u64) i32 {
    return nccl.destroy(comm);
}

/// Collectives of several ranks issued from one thread go between a group's start and end.
export fn infer_nccl_group_start() i32 {
    return nccl.groupStart();
}

export fn infer_nccl_group_end() i32 {
    return nccl.groupEnd();
}

export fn infer_nccl_all_reduce(args: *const abi.NcclCollectiveArgs) i32 {
    return nccl.allReduceSum(args.comm, args.stream, args.send, args.recv, args.count, args.kind);
}

export fn infer_nccl_all_gather(args: *const abi.NcclCollectiveArgs) i32 {
    return nccl.allGather(args.comm, args.stream, args.send, args.recv, args.count, args.kind);
}
