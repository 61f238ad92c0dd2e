// The constant arguments of each kernel, bound with setBytes at the index the kernel declares.
// Every field is 4 bytes (uint32_t, int32_t or float) so the layout has no padding and
// ts/backend/metal/plan.ts can pack it field by field; test/metal-plan.test.ts parses this file
// and checks that the plan packs exactly these fields, in this order.
#ifndef INFER_METAL_ARGS_H
#define INFER_METAL_ARGS_H

// y[t][o] = W[o] · x[t], o < n_out, t < n_tok; W rows are row_bytes apart, x and y rows dense.
typedef struct {
    uint32_t n_in;
    uint32_t n_out;
    uint32_t n_tok;
    uint32_t row_bytes;
} MatvecArgs;

// Rows each simdgroup of matvec_rows.metal computes, per weight type (the plan sizes grids by it).
#define MATVEC_ROWS_Q4_0 4
#define MATVEC_ROWS_Q5_0 4
#define MATVEC_ROWS_Q8_0 2
#define MATVEC_ROWS_Q4_K 2
#define MATVEC_ROWS_Q5_K 2
#define MATVEC_ROWS_Q6_K 2

// The batched form (matmul.metal): each threadgroup of MATMUL_THREADS (4 simdgroups) computes
// a tile of MATMUL_TILE_OUT rows × MATMUL_TILE_TOK tokens on simdgroup matrices.
#define MATMUL_TILE_OUT 64
#define MATMUL_TILE_TOK 32
#define MATMUL_THREADS 128
typedef struct {
    uint32_t n_in;
    uint32_t n_out;
    uint32_t n_tok;
    uint32_t row_bytes;
} MatmulArgs;

// dst[i] = row ids[i] of a table of n_rows rows of n_cols values (row_bytes apart).
typedef struct {
    uint32_t n_cols;
    uint32_t row_bytes;
    uint32_t n_ids;
    uint32_t n_rows;
} GetRowsArgs;

// One row of n_cols per threadgroup; has_weight 0 means no weight (the buffer is not read).
typedef struct {
    uint32_t n_cols;
    float eps;
    uint32_t has_weight;
} RmsNormArgs;

// x[n_tok][n_heads][head_dim]; mode 0 = normal pairs (2i, 2i+1), 2 = NeoX (i, i + n_rot/2).
typedef struct {
    uint32_t n_tok;
    uint32_t n_heads;
    uint32_t head_dim;
    uint32_t n_rot;
    float freq_base;
    float freq_scale;
    uint32_t mode;
    uint32_t has_freq_factors;
} RopeArgs;

// Element-wise ops over n values; `scale` is the factor of `scale`, cols the bias length.
typedef struct {
    uint32_t n;
    uint32_t n_cols;
    float scale;
} EltwiseArgs;

// Rows t < n_tok of k and v (kv_dim values) into the caches at the cell of position pos0 + t;
// k_type and v_type are the caches' types (kv.h: KV_F16, KV_Q8_0, KV_Q4_0).
typedef struct {
    uint32_t kv_dim;
    uint32_t n_tok;
    uint32_t pos0;
    uint32_t cells;
    uint32_t ring;
    uint32_t k_type;
    uint32_t v_type;
} KvStoreArgs;

// Queries t < n_tok at positions pos0 + t over cache cells of n_kv_head·head_dim values of
// k_type / v_type (kv.h);
// head_dim at most ATTENTION_HEAD_DIM_MAX (each lane keeps head_dim / 32 accumulators).
#define ATTENTION_HEAD_DIM_MAX 512
// attention_prompt.metal: queries per threadgroup (8 per simdgroup), its threads, and the
// largest head_dim its kernels hold (attention_prompt_d128 / _d256).
#define ATTENTION_PROMPT_QUERIES 32
#define ATTENTION_PROMPT_THREADS 128
#define ATTENTION_PROMPT_HEAD_DIM_MAX 256
typedef struct {
    uint32_t n_tok;
    uint32_t n_head;
    uint32_t n_kv_head;
    uint32_t head_dim;
    uint32_t pos0;
    uint32_t window;
    uint32_t cells;
    uint32_t ring;
    float scale;
    uint32_t k_type;
    uint32_t v_type;
} AttentionArgs;

// Decode attention with splits (attention_decode.metal): a threadgroup takes `group` query heads
// that share one KV head and one of n_split spans of a row's visible keys. Each kernel variant
// holds head_dim up to its D (lane l keeps dims [l·D/32, (l+1)·D/32)) for up to its group maximum
// of query heads: q and the running output take 2 · group · D/32 registers a lane, 64 at most.
#define ATTENTION_DECODE_GROUP_D64 8
#define ATTENTION_DECODE_GROUP_D128 8
#define ATTENTION_DECODE_GROUP_D256 4
#define ATTENTION_DECODE_GROUP_D512 2
typedef struct {
    uint32_t n_tok;
    uint32_t n_head;
    uint32_t n_kv_head;
    uint32_t head_dim;
    uint32_t pos0;
    uint32_t window;
    uint32_t cells;
    uint32_t ring;
    float scale;
    uint32_t group;
    uint32_t n_split;
    uint32_t k_type;
    uint32_t v_type;
} AttentionDecodeArgs;

// The splits' partial results (row, head, split: max, sum, head_dim unnormalised values) combined.
typedef struct {
    uint32_t n_tok;
    uint32_t n_head;
    uint32_t head_dim;
    uint32_t n_split;
} AttentionCombineArgs;

// One step's query and key heads: RMSNorm per head (has_norm), RoPE, queries times q_scale, and
// keys and values stored to the caches (k_type, v_type: kv.h) at cell pos0 + t (mod cells in a
// ring).
typedef struct {
    uint32_t n_tok;
    uint32_t heads_q;
    uint32_t heads_k;
    uint32_t head_dim;
    uint32_t has_norm;
    float eps;
    uint32_t n_rot;
    float freq_base;
    float freq_scale;
    uint32_t mode;
    uint32_t has_freq_factors;
    float q_scale;
    uint32_t pos0;
    uint32_t cells;
    uint32_t ring;
    uint32_t k_type;
    uint32_t v_type;
} NormRopeStoreArgs;

#endif
