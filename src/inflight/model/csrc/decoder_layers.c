/* Every decoder layer of one serving step, in one call from Python.
 *
 * A decoder layer is nine kernels: RMSNorm (with the residual add), the q|k|v projection, rotary +
 * the write of K/V into the cache, attention, the output projection, RMSNorm again, the gate|up
 * projection, SwiGLU, the down projection. Each already runs in C (layer_ops.c, skinny_gemm.c,
 * paged_decode.c). Called one by one from Python, each call also pays its wrapper: checks, a new
 * output tensor, a dozen pointers fetched and converted by ctypes -- 10-40 us, at a decode step's
 * size as much as the kernel itself, 36 times a step for four layers.
 *
 * This file adds no arithmetic. It calls those same compiled kernels (their entry points, handed in
 * by inflight/model/layer_driver.py) in the order the Python layer does, with the same arguments,
 * on buffers carved once per step, so its results are the op-by-op path's to the bit. What it saves
 * is the Python between them, and the torch operators around them: the embedding and the rotary
 * tables are looked up here (row copies), and the final norm and the LM head come with it where the
 * LM head would run in C too. (After a step has streamed the weights and the KV cache through the
 * CPU's caches, the interpreter's own code and objects come back from memory: a few torch calls
 * between two steps then cost ten times what they cost warm.)
 *
 * Built on first use by inflight/model/layer_driver.py (cc -O2 -shared -fPIC); no threads of its own:
 * each kernel shares out its work as it always does (parallel.h).
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef void (*gemm_fn)(const float *x, int64_t M, int64_t K, const float *panels, int64_t N, const float *bias,
                        float *out, int threads);
typedef void (*norm_fn)(const float *x, float *residual, const float *weight, int64_t rows, int64_t dim, float eps,
                        float *out, int threads);
typedef void (*silu_fn)(const float *x, int64_t rows, int64_t inter, float *out, int threads);
typedef int (*rotary_fn)(float *qkv, int64_t T, int64_t H, int64_t KV, int64_t D, const float *cos, const float *sin,
                         float *k_cache, float *v_cache, int64_t num_slots, const int64_t *slot_mapping, int threads);
typedef int (*attention_fn)(const float *q, const float *k_cache, const float *v_cache, int64_t num_blocks,
                            const int32_t *block_tables, int64_t max_blocks, const int32_t *context_lens, int64_t n,
                            int64_t num_heads, int64_t num_kv_heads, int64_t D, int64_t block_size, float scale,
                            float *workspace, int64_t workspace_per_thread, int threads, float *out);

/* One layer's weights (the projections as skinny_gemm.py's packed panels; a bias NULL where the
 * model has none) and its two caches [num_blocks, block_size, KV, D]. */
struct layer {
    const float *input_norm, *qkv, *qkv_bias, *o, *o_bias, *post_norm, *gate_up, *gate_up_bias, *down, *down_bias;
    float *k_cache, *v_cache;
};

struct step {
    /* the head: token ids -> rows of the embedding (vocab_rows of them), positions -> rows of the
     * rotary tables (rope_rows of them), into x and cos/sin */
    const int64_t *ids, *positions;
    const float *embed, *rope_cos, *rope_sin;
    int64_t vocab_rows, rope_rows;
    gemm_fn gemm;
    norm_fn norm;
    silu_fn silu;
    rotary_fn rotary;
    attention_fn attention;
    const struct layer *layers;
    int64_t num_layers, T, hidden, H, KV, D, inter;
    float eps, scale;
    float *cos, *sin;                 /* [T, D], filled from the tables */
    const int64_t *slot_mapping;      /* [T] */
    int64_t num_blocks, block_size;
    /* attention's queries: n = T rows over these tables (a decode step's sequences, or every token
     * of a step with prompts as a query over its own prefix) */
    const int32_t *block_tables;      /* [T, max_blocks] */
    int64_t max_blocks;
    const int32_t *context_lens;      /* [T] */
    float *workspace;
    int64_t workspace_per_thread;
    int threads;
    /* x: the embeddings, then the residual stream's running sum; y: the last layer's output */
    float *x, *y;
    float *h, *qkv_out, *q, *attn;    /* scratch: [T, hidden], [T, (H + 2 KV) D], [T, H D] x 2 */
    float *gate_up_out, *act;         /* scratch: [T, 2 inter], [T, inter] */
    double *seconds;                  /* NULL, or += per part: [0] linear layers, [1] attention, [2] the fused ops */
    int64_t failed_layer;             /* out: the layer whose kernel refused, when the return is not 0 */
    /* the tail, when lm_head is not NULL: the rows the logits are wanted for (`rows`, R of them; NULL:
     * every row), the final norm, the LM head -> logits [R, vocab] */
    const float *final_norm, *lm_head, *lm_bias;
    int64_t vocab, R;
    const int64_t *rows;
    float *tail_y, *tail_x, *tail_h, *logits;  /* scratch [R, hidden] x 3 (y and x: only with rows), out */
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the part's clock, only when asked for (a time split), else nothing */
#define TIMED(part, call)                                          \
    do {                                                           \
        double t0_ = s->seconds ? now() : 0.0;                     \
        call;                                                      \
        if (s->seconds) s->seconds[part] += now() - t0_;           \
    } while (0)

/* The final norm and the LM head over the rows wanted (the op-by-op path's x[rows], residual[rows]:
 * copies, so the running sum's rows are updated in the copy, not in place). */
static void tail(struct step *s) {
    const int64_t hidden = s->hidden, R = s->R;
    const float *y = s->y;
    float *x = s->x;
    if (s->rows) {
        for (int64_t r = 0; r < R; r++) {
            memcpy(s->tail_y + r * hidden, s->y + s->rows[r] * hidden, (size_t)hidden * sizeof(float));
            memcpy(s->tail_x + r * hidden, s->x + s->rows[r] * hidden, (size_t)hidden * sizeof(float));
        }
        y = s->tail_y, x = s->tail_x;
    }
    TIMED(2, s->norm(y, x, s->final_norm, R, hidden, s->eps, s->tail_h, s->threads));
    TIMED(0, s->gemm(s->tail_h, R, hidden, s->lm_head, s->vocab, s->lm_bias, s->logits, s->threads));
}

/* Returns 0; or the rotary pass's refusal (-1 - t: token t's slot is outside the cache), or the
 * attention kernel's (-1, or -2 - i), both checked by the kernels before they write anything, with
 * `failed_layer` set; or, before anything is written, INT32_MIN when a row asked for logits is not
 * a row of the step, INT32_MIN + 1 when a token id or a position is outside its table. */
int inflight_decoder_layers_f32(struct step *s) {
    const int64_t T = s->T, hidden = s->hidden, H = s->H, KV = s->KV, D = s->D, inter = s->inter;
    const int64_t width = (H + 2 * KV) * D, slots = s->num_blocks * s->block_size;
    if (s->lm_head && s->rows)
        for (int64_t r = 0; r < s->R; r++)
            if (s->rows[r] < 0 || s->rows[r] >= T) return INT32_MIN;
    for (int64_t t = 0; t < T; t++)
        if (s->ids[t] < 0 || s->ids[t] >= s->vocab_rows || s->positions[t] < 0 || s->positions[t] >= s->rope_rows)
            return INT32_MIN + 1;
    /* the embedding's rows and the rotary tables' rows (F.embedding and index_select: copies) */
    for (int64_t t = 0; t < T; t++) {
        memcpy(s->x + t * hidden, s->embed + s->ids[t] * hidden, (size_t)hidden * sizeof(float));
        memcpy(s->cos + t * D, s->rope_cos + s->positions[t] * D, (size_t)D * sizeof(float));
        memcpy(s->sin + t * D, s->rope_sin + s->positions[t] * D, (size_t)D * sizeof(float));
    }
    for (int64_t l = 0; l < s->num_layers; l++) {
        const struct layer *w = s->layers + l;
        int rc = 0;
        /* the residual stream as vLLM keeps it: the first layer's norm reads the embeddings (which
         * become the running sum), each later one adds the layer before's output to it first */
        TIMED(2, s->norm(l == 0 ? s->x : s->y, l == 0 ? NULL : s->x, w->input_norm, T, hidden, s->eps, s->h, s->threads));
        TIMED(0, s->gemm(s->h, T, hidden, w->qkv, width, w->qkv_bias, s->qkv_out, s->threads));
        TIMED(2, rc = s->rotary(s->qkv_out, T, H, KV, D, s->cos, s->sin, w->k_cache, w->v_cache, slots,
                                s->slot_mapping, s->threads));
        if (rc != 0) { s->failed_layer = l; return rc; }
        /* the rotated queries, contiguous [T, H, D] as the kernel takes them (the op-by-op path's
         * q.contiguous(): a copy, the same floats) */
        TIMED(1, {
            for (int64_t t = 0; t < T; t++) memcpy(s->q + t * H * D, s->qkv_out + t * width, (size_t)(H * D) * sizeof(float));
            rc = s->attention(s->q, w->k_cache, w->v_cache, s->num_blocks, s->block_tables, s->max_blocks,
                              s->context_lens, T, H, KV, D, s->block_size, s->scale, s->workspace,
                              s->workspace_per_thread, s->threads, s->attn);
        });
        if (rc != 0) { s->failed_layer = l; return rc; }
        TIMED(0, s->gemm(s->attn, T, H * D, w->o, hidden, w->o_bias, s->y, s->threads));
        TIMED(2, s->norm(s->y, s->x, w->post_norm, T, hidden, s->eps, s->h, s->threads));
        TIMED(0, s->gemm(s->h, T, hidden, w->gate_up, 2 * inter, w->gate_up_bias, s->gate_up_out, s->threads));
        TIMED(2, s->silu(s->gate_up_out, T, inter, s->act, s->threads));
        TIMED(0, s->gemm(s->act, T, inter, w->down, hidden, w->down_bias, s->y, s->threads));
    }
    if (s->lm_head) tail(s);
    return 0;
}
