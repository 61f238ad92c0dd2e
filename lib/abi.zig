//! The structs of the C ABI: what a call takes when its arguments are more than a handful, and
//! the library's settings. ts/native/gen-symbols.ts reads this file and writes each struct's
//! layout (C rules: every field at its natural alignment) into ts/native/symbols.gen.ts, where
//! ts/native/abi.ts packs them field by field, so the two sides cannot drift; the size each
//! `comptime` block asserts is checked by the generator too. Fields are u8/u32/i32/u64/f32/bool
//! or byte arrays; a field's default is the value TypeScript packs when it leaves it out.
const std = @import("std");

/// The library's settings, given once by its host after loading it (infer_configure; the
/// TypeScript side reads them from the environment: ts/config/env.ts). The library reads no
/// environment itself. Until infer_configure runs (the Zig tests), these defaults hold.
pub const Settings = extern struct {
    /// Regions of infer_pages_alloc advised into huge pages where the system allows
    /// (lib/pages.zig; INFER_HUGE_PAGES=0: not).
    huge_pages: bool = true,
    /// CUDA launches with programmatic dependent launch on sm_90+ (lib/cuda/cuda.zig;
    /// INFER_CUDA_PDL=0: every kernel waits for the one before it as a plain stream does).
    cuda_pdl: bool = true,
    /// Bytes of cublas_path used; 0: the usual names only (lib/cuda/cublas.zig).
    cublas_path_len: u16 = 0,
    /// Prompts of at least this many tokens take quantized matmuls as cuBLAS f16 GEMMs where
    /// cuBLAS loads, 0 never (lib/cuda/ops.zig; INFER_CUDA_CUBLAS).
    cuda_cublas_min_tokens: u32 = 128,
    /// A libcublas to try before the usual names (INFER_CUBLAS).
    cublas_path: [path_bytes_max]u8 = @splat(0),
    /// Decode batches of this many tokens (up to 64) and more take the small-tile tensor-core
    /// matmul, 0 never: fewer take matvecs (lib/cuda/ops.zig batchMma; INFER_CUDA_BATCH_MMA).
    cuda_batch_mma_min: u32 = 2,
    /// Prompts' Q4_0 and Q4_K matmuls on AMX tiles where the CPU has them (lib/cpu/matmul_amx.zig;
    /// INFER_AMX=0: AVX-512 VNNI, the same bits).
    cpu_amx: bool = true,

    pub const path_bytes_max = 4096;

    pub fn cublasPath(s: *const Settings) ?[]const u8 {
        return if (s.cublas_path_len == 0) null else s.cublas_path[0..s.cublas_path_len];
    }
};
comptime {
    std.debug.assert(@sizeOf(Settings) == 4112);
}

// ---- the CPU's calls: the pointers stay arguments (TypeScript passes its arrays themselves),
// the shape of the call is a struct -------------------------------------------------------------

/// infer_attention: causal (optionally sliding-window) grouped-query attention of n_tok queries
/// at positions pos0.. over a K/V cache [pos][n_kv_head][head_dim] (rows kv_stride values apart),
/// the keys of ggml type k_type and the values of v_type (0 = F32, 1 = F16, 2 = Q4_0, 8 = Q8_0;
/// a quantized cache needs head_dim and kv_stride multiples of 32), or infer's rotated codes
/// (103 = TQ3, 104 = TQ4; head_dim a power of two in 8..1024, kv_stride a multiple of it);
/// window 0: every earlier key; ring > 0: position p in cell p % ring.
pub const AttentionShape = extern struct {
    k_type: u32,
    v_type: u32,
    n_tok: u64,
    n_head: u64,
    n_kv_head: u64,
    head_dim: u64,
    pos0: u64,
    kv_stride: u64,
    window: u64,
    ring: u64,
    scale: f32,
    /// 0: the single-token order of sums; 1: llama.cpp's batched order (F16 caches; attention.Shape).
    order: u32 = 0,
    /// Address of n_head f32 logits, one per query head, added to each head's softmax
    /// denominator (gpt-oss's attention sinks); 0 = none.
    sinks: u64 = 0,
    /// Address of pos0 + n_tok f32 (one per cell; a linear cache only), 0 = none: each query
    /// head's softmax weight of each key is added to its cell's entry (attention.accumulateMass,
    /// the accumulated attention of the H2O context shift).
    mass: u64 = 0,
};
comptime {
    std.debug.assert(@sizeOf(AttentionShape) == 96);
}

/// infer_rope: x[n_tok][n_heads][head_dim]; mode 0 = normal (pairs 2i, 2i+1), 2 = NeoX (pairs
/// i, i + n_rot/2); theta_i = pos · freq_scale · freq_base^(-2i/n_rot); dims from n_rot kept.
/// attn_factor multiplies the cosines and sines (ggml's mscale: LongRoPE's attention factor), so
/// the rotated dims come out scaled by it; 1 for a plain rotation. ext_factor != 0 turns on YaRN
/// as ggml's rope_yarn (gpt-oss): the correction dims from n_ctx_orig, beta_fast and beta_slow,
/// the angles blended by ext_factor, and the mscale times 1 + 0.1·ln(1/freq_scale).
pub const RopeShape = extern struct {
    n_tok: u64,
    n_heads: u64,
    head_dim: u64,
    n_rot: u64,
    freq_base: f32,
    freq_scale: f32,
    mode: u32,
    attn_factor: f32,
    ext_factor: f32 = 0,
    beta_fast: f32 = 32,
    beta_slow: f32 = 1,
    n_ctx_orig: u32 = 0,
};
comptime {
    std.debug.assert(@sizeOf(RopeShape) == 64);
}

/// infer_moe_ffn: n_tok tokens' mixture-of-experts FFN over the n_used experts each chose. The
/// gate, up and down tables hold n_expert addresses each (expert e's matrix: gate and up n_ff x
/// n_embd, down n_embd x n_ff), all experts of a table in one matmul type (the *_type ids, as
/// infer_matmul takes them: repacked layouts included).
pub const MoeShape = extern struct {
    gate_type: u32,
    up_type: u32,
    down_type: u32,
    n_embd: u64,
    n_ff: u64,
    n_expert: u64,
    n_used: u64,
    n_tok: u64 = 1,
};
comptime {
    std.debug.assert(@sizeOf(MoeShape) == 56);
}

/// infer_altup_predict and infer_altup_correct: Gemma 3n's n_streams AltUp streams (at most
/// 16), each n_rows x n_cols f32 values at an address of a table; `active` is the stream the block
/// ran on (correct only).
pub const AltUpShape = extern struct {
    n_streams: u64,
    n_rows: u64,
    n_cols: u64,
    active: u64 = 0,
};
comptime {
    std.debug.assert(@sizeOf(AltUpShape) == 32);
}

// ---- the CUDA backend's calls: device addresses and counts as u64 ------------------------------
// `mode` of a quantized output: 0 = Q8_0 blocks, 1 = Q8_K superblocks, into q (int8) and d (one
// f32 scale per 32 values).

/// infer_cuda_matmul: y[t][o] = W[o] · x[t] for t < n_tok; a quantized W (type_id) reads the
/// activations from xq/xd (infer_cuda_quantize, in its activation format), a float W from x.
pub const CudaMatmulArgs = extern struct {
    w: u64,
    type_id: u32,
    n_out: u64,
    n_in: u64,
    x: u64,
    xq: u64,
    xd: u64,
    n_tok: u64,
    y: u64,
};
comptime {
    std.debug.assert(@sizeOf(CudaMatmulArgs) == 72);
}

/// infer_cuda_matmul_multi: two or three one-token matmuls over the same quantized input in one
/// launch (n2 = 0: two).
pub const CudaMatmulMultiArgs = extern struct {
    type_id: u32,
    n_in: u64,
    xq: u64,
    xd: u64,
    w0: u64,
    n0: u64,
    y0: u64,
    w1: u64,
    n1: u64,
    y1: u64,
    w2: u64,
    n2: u64,
    y2: u64,
};
comptime {
    std.debug.assert(@sizeOf(CudaMatmulMultiArgs) == 104);
}

/// infer_cuda_rms_norm_quant: out = rms_norm(x) · weight per row (weight 0: none), quantized.
pub const CudaRmsNormQuantArgs = extern struct {
    x: u64,
    weight: u64,
    n_rows: u64,
    n_cols: u64,
    eps: f32,
    out: u64,
    mode: u32,
    q: u64,
    d: u64,
};
comptime {
    std.debug.assert(@sizeOf(CudaRmsNormQuantArgs) == 72);
}

/// infer_cuda_add_rms_norm_quant: sum = a + b (sum may be a), out = rms_norm(sum) · weight,
/// quantized.
pub const CudaAddRmsNormQuantArgs = extern struct {
    a: u64,
    b: u64,
    sum: u64,
    weight: u64,
    n_rows: u64,
    n_cols: u64,
    eps: f32,
    out: u64,
    mode: u32,
    q: u64,
    d: u64,
};
comptime {
    std.debug.assert(@sizeOf(CudaAddRmsNormQuantArgs) == 88);
}

/// infer_cuda_moe_matmul: matvecs indexed by expert id (lib/cuda/moe.zig matmul), one or two
/// matrices of the same type and shape over the same slots (w1 = y1 = 0: one).
pub const CudaMoeMatmulArgs = extern struct {
    type_id: u32,
    n_out: u64,
    n_in: u64,
    expert_bytes: u64,
    n_expert: u64,
    xq: u64,
    xd: u64,
    x_div: u64,
    ids: u64,
    n_slots: u64,
    groups: u64,
    w0: u64,
    y0: u64,
    w1: u64,
    y1: u64,
    /// With groups: the slots a tile of its table holds (moe_group's tile: 8, or 32 with mma).
    tile: u32,
    /// With groups: 1 = the tensor-core tiles (moe_mmq_*), 0 = the tile matvec (moe_mv8_*).
    mma: u32,
};
comptime {
    std.debug.assert(@sizeOf(CudaMoeMatmulArgs) == 128);
}

/// infer_cuda_act_mul_quant: out = act(gate) · up (kind 0 = GELU, 1 = SiLU), quantized.
pub const CudaActMulQuantArgs = extern struct {
    kind: u32,
    gate: u64,
    up: u64,
    n_rows: u64,
    n_cols: u64,
    out: u64,
    mode: u32,
    q: u64,
    d: u64,
    /// kind 2 (gpt-oss's clamped SwiGLU, moe_swiglu_oai): each row's expert's gate and up biases
    /// (rows of n_cols per expert; 0: none) and the rows' expert ids.
    bias_gate: u64 = 0,
    bias_up: u64 = 0,
    ids: u64 = 0,
};
comptime {
    std.debug.assert(@sizeOf(CudaActMulQuantArgs) == 96);
}

/// infer_cuda_rope: in-place RoPE as infer_rope; positions (i32 per token) and freq_factors (0:
/// none) on the device.
pub const CudaRopeArgs = extern struct {
    x: u64,
    n_tok: u64,
    n_heads: u64,
    head_dim: u64,
    n_rot: u64,
    positions: u64,
    freq_base: f32,
    freq_scale: f32,
    mode: u32,
    freq_factors: u64,
    /// ggml's mscale (LongRoPE's attention factor; 1: none) and YaRN as lib/cpu/rope.zig takes
    /// them (ext_factor 0: none; the correction dims from the betas and n_ctx_orig).
    attn_factor: f32 = 1,
    ext_factor: f32 = 0,
    beta_fast: f32 = 32,
    beta_slow: f32 = 1,
    n_ctx_orig: u32 = 0,
};
comptime {
    std.debug.assert(@sizeOf(CudaRopeArgs) == 96);
}

/// infer_cuda_rope2: the RoPE of queries (xa, heads_a heads) and keys (xb, heads_b) in one launch.
pub const CudaRope2Args = extern struct {
    xa: u64,
    heads_a: u64,
    xb: u64,
    heads_b: u64,
    n_tok: u64,
    head_dim: u64,
    n_rot: u64,
    positions: u64,
    freq_base: f32,
    freq_scale: f32,
    mode: u32,
    freq_factors: u64,
    /// ggml's mscale (LongRoPE's attention factor; 1: none) and YaRN as lib/cpu/rope.zig takes
    /// them (ext_factor 0: none; the correction dims from the betas and n_ctx_orig).
    attn_factor: f32 = 1,
    ext_factor: f32 = 0,
    beta_fast: f32 = 32,
    beta_slow: f32 = 1,
    n_ctx_orig: u32 = 0,
};
comptime {
    std.debug.assert(@sizeOf(CudaRope2Args) == 112);
}

/// infer_cuda_kv_store: rows of k and v (kv_dim values each) into the cache at cell
/// positions[t] (mod cells when ring). k_type, v_type: the caches' ggml types, F16 (1), Q4_0 (2)
/// or Q8_0 (8; kv_dim whole 32-value blocks), as for every CUDA cache below.
pub const CudaKvStoreArgs = extern struct {
    k: u64,
    v: u64,
    kv_dim: u64,
    n_tok: u64,
    k_cache: u64,
    v_cache: u64,
    positions: u64,
    cells: u64,
    ring: bool,
    k_type: u32 = 1,
    v_type: u32 = 1,
};
comptime {
    std.debug.assert(@sizeOf(CudaKvStoreArgs) == 80);
}

/// infer_cuda_kv_store_turbo: rows t < n_tok of x (kv_heads · head_dim values each) coded into a
/// tq3 (cache_type 103) / tq4 (104) cache at cell positions[t] (positions 0: first_cell + t), mod
/// cells when ring, each head vector less the anchor's (a row of kv_heads · head_dim values; 0: none).
pub const CudaKvStoreTurboArgs = extern struct {
    x: u64,
    n_tok: u64,
    kv_heads: u64,
    head_dim: u64,
    cache: u64,
    positions: u64,
    first_cell: u64,
    cells: u64,
    anchor: u64,
    cache_type: u32,
    ring: bool,
};
comptime {
    std.debug.assert(@sizeOf(CudaKvStoreTurboArgs) == 80);
}

/// infer_cuda_kv_shift: the context shift of one cache (ts/backend/backend.ts shiftKv, compactKv).
/// Row i < n_rows moves from cell from[i] (from: i32 cells on the device), or with from = 0 from
/// cell (first + i) mod cells, to cell to + i; its key is rotated by to + i - from[i] positions
/// (from = 0: by `move`) with the layer's RoPE (the fields as CudaRopeArgs takes them; attn_factor
/// divides YaRN's mscale out), the values' bytes are copied. Through `scratch` (kvShiftScratch
/// bytes), so a move may overwrite cells other rows come from. k_type, v_type: CudaKvStoreArgs's.
pub const CudaKvShiftArgs = extern struct {
    k_cache: u64,
    v_cache: u64,
    kv_heads: u64,
    head_dim: u64,
    n_rows: u64,
    from: u64,
    first: u64,
    cells: u64,
    to: u64,
    move: i64,
    scratch: u64,
    n_rot: u64,
    freq_factors: u64,
    freq_base: f32,
    freq_scale: f32,
    mode: u32,
    k_type: u32 = 1,
    v_type: u32 = 1,
    attn_factor: f32 = 1,
    ext_factor: f32 = 0,
    beta_fast: f32 = 32,
    beta_slow: f32 = 1,
    n_ctx_orig: u32 = 0,
};
comptime {
    std.debug.assert(@sizeOf(CudaKvShiftArgs) == 144);
}

/// infer_cuda_norm_rope_store: one token's q/k head norms (wq = wk = 0: none), RoPE of both, and
/// k/v into the cache (of k_type, v_type: CudaKvStoreArgs).
pub const CudaNormRopeStoreArgs = extern struct {
    q: u64,
    heads_q: u64,
    k: u64,
    heads_k: u64,
    v: u64,
    wq: u64,
    wk: u64,
    eps: f32,
    head_dim: u64,
    n_rot: u64,
    positions: u64,
    freq_base: f32,
    freq_scale: f32,
    mode: u32,
    freq_factors: u64,
    k_cache: u64,
    v_cache: u64,
    cells: u64,
    ring: bool,
    k_type: u32 = 1,
    v_type: u32 = 1,
    /// ggml's mscale (LongRoPE's attention factor; 1: none) and YaRN as lib/cpu/rope.zig takes
    /// them (ext_factor 0: none; the correction dims from the betas and n_ctx_orig).
    attn_factor: f32 = 1,
    ext_factor: f32 = 0,
    beta_fast: f32 = 32,
    beta_slow: f32 = 1,
    n_ctx_orig: u32 = 0,
};
comptime {
    std.debug.assert(@sizeOf(CudaNormRopeStoreArgs) == 168);
}

/// infer_cuda_attention: causal (optionally sliding-window) GQA of n_tok query rows over f16
/// caches of `cells` rows, the keys split n_split ways. One sequence's cache (k_cache, v_cache),
/// or (kv_table != 0) rows of different sequences, row t over the caches at kv_table[2t] (keys)
/// and kv_table[2t + 1] (values): a device table of 2 · n_tok addresses (the server's batched
/// decode). `scratch` holds infer_cuda_attention_scratch(...) f32 values; with n_split > 1,
/// `arrived` holds n_tok · n_head zeroed u32 counters (left zero). quant_mode 0 or 1: the output
/// also quantized into quant_q, quant_d (the o-projection's input), in the kernel's epilogue
/// where it can; -1: not. k_type, v_type: the caches' types (CudaKvStoreArgs).
pub const CudaAttentionArgs = extern struct {
    q: u64,
    k_cache: u64 = 0,
    v_cache: u64 = 0,
    kv_table: u64 = 0,
    out: u64,
    positions: u64,
    n_tok: u64,
    n_head: u64,
    n_kv_head: u64,
    head_dim: u64,
    window: u64,
    cells: u64,
    ring: bool,
    scale: f32,
    scratch: u64,
    scratch_floats: u64,
    n_split: u64,
    arrived: u64,
    quant_mode: i32 = -1,
    quant_q: u64 = 0,
    quant_d: u64 = 0,
    k_type: u32 = 1,
    v_type: u32 = 1,
    /// gpt-oss's attention sinks: n_head f32 logits, one more in each head's softmax denominator
    /// (0: none). Prompts of head_dim 64/128 take flash attention, decode the tensor-core kernel
    /// where it fits, every other shape attn_scores + attn_values.
    sinks: u64 = 0,
};
comptime {
    std.debug.assert(@sizeOf(CudaAttentionArgs) == 176);
}

/// infer_nccl_all_reduce and infer_nccl_all_gather: one rank's collective on its communicator
/// (infer_nccl_comms_init) and stream; `count` elements of `kind` (0 = f32, 1 = f16) from send
/// (all-gather: each rank's count, into recv of ranks × count). send may equal recv.
pub const NcclCollectiveArgs = extern struct {
    comm: u64,
    stream: u64,
    send: u64,
    recv: u64,
    count: u64,
    kind: u32 = 0,
};
comptime {
    std.debug.assert(@sizeOf(NcclCollectiveArgs) == 48);
}
