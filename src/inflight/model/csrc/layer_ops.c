/* The small operators between a decoder layer's matrix multiplies, fused, float32, on the CPU.
 *
 * In plain torch each of these is five to ten operators, each a dispatch, an allocation and a pass
 * over memory; at a decode step's size (tens of rows of a few hundred floats) that overhead, not the
 * arithmetic, is the cost. Each function here is one pass with the same arithmetic as the torch
 * reference in inflight/model/fused_ops.py, operation for operation, in the same order, so that
 * the results agree to the last bit except where noted: the sum of squares of RMSNorm (added in
 * double here, in float by torch) and exp in SiLU (torch has its own vector code) move a value by a
 * few units in the last place at most. Every row is computed on its own, in a fixed order, so a
 * row's result never depends on what else is in the batch.
 *
 * The names are vLLM's: fused_add_rms_norm, silu_and_mul, and a rotary embedding fused with
 * reshape_and_cache (the write of this step's keys and values into their cache slots).
 *
 * Built without floating-point contraction (-ffp-contract=off): a*b + c*d must be two rounded
 * products and a rounded sum, as torch computes it, not a fused multiply-add.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "parallel.h"
#include "vec16.h"

/* rows this large or larger are shared out over the threads (parallel.h); below, waking threads costs more */
#define PARALLEL_FLOATS 65536
/* ... and for SwiGLU, whose exp and division cost about 1 ns a float on one core (a decode step's
 * 64 rows x 688: 45 us alone), from this many outputs on */
#define SILU_PARALLEL_FLOATS 8192

/* A row's last n % 8 floats go through the same vector code (vec8.h) in a zero-padded register, so
 * every element is computed the same way wherever it sits in the row. */

/* Sum of the squares of n floats, each square rounded to float as torch's x.pow(2) does, added in
 * double in eight lanes and then the lanes in a fixed order: the same for every row and batch, and
 * exact enough that the result's error is its last rounding, not the row's length. */
typedef double v4d __attribute__((vector_size(32)));
static inline double sum_squares(const float *x, int64_t n) {
    v4d lo = {0.}, hi = {0.};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8 a = load8(x + i), sq = a * a;
        lo += (v4d){sq[0], sq[1], sq[2], sq[3]};
        hi += (v4d){sq[4], sq[5], sq[6], sq[7]};
    }
    if (i < n) {
        v8 a = load_tail(x + i, n - i), sq = a * a;
        lo += (v4d){sq[0], sq[1], sq[2], sq[3]};
        hi += (v4d){sq[4], sq[5], sq[6], sq[7]};
    }
    v4d t = lo + hi;
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* silu(g) * u for eight lanes: g / (1 + exp(-g)) * u */
static inline v8 silu_mul8(v8 g, v8 u) { return g / (splat(1.f) + exp8(-g)) * u; }
#if defined(__AVX512F__)
/* ... and for sixteen (AVX-512): lane for lane the same arithmetic, so the same bits */
static inline v16 silu_mul16(v16 g, v16 u) { return g / (splat16(1.f) + exp16(-g)) * u; }
#endif

/* RMSNorm of `rows` rows of `dim`: out = weight * (h * (1 / sqrt(mean(h^2) + eps))), where h is x,
 * or, with a residual, residual + x -- which is also stored back into residual (the running sum of
 * the residual stream that the next layer adds to). */
struct norm_args {
    const float *x, *weight;
    float *residual, *out;
    int64_t dim;
    float eps;
};

static void norm_rows(void *ctx, int64_t r0, int64_t r1, int tid) {
    const struct norm_args *a = ctx;
    int64_t dim = a->dim;
    (void)tid;
    for (int64_t r = r0; r < r1; r++) {
        const float *h = a->x + r * dim;
        if (a->residual) {
            float *res = a->residual + r * dim;
            for (int64_t i = 0; i < dim; i++) res[i] = res[i] + h[i];
            h = res;
        }
        float mean = (float)(sum_squares(h, dim) / (double)dim);
        float inv = 1.0f / sqrtf(mean + a->eps);
        float *o = a->out + r * dim;
        for (int64_t i = 0; i < dim; i++) o[i] = a->weight[i] * (h[i] * inv);
    }
}

void inflight_rms_norm_f32(const float *x, float *residual, const float *weight, int64_t rows, int64_t dim,
                           float eps, float *out, int threads) {
    struct norm_args a = {x, weight, residual, out, dim, eps};
    parallel_for(rows, rows * dim >= PARALLEL_FLOATS ? threads : 1, 0, norm_rows, &a);
}

/* SwiGLU's middle: x [rows, 2 * inter] holds gate | up; out [rows, inter] = silu(gate) * up, with
 * silu(g) = g / (1 + exp(-g)). */
struct silu_args {
    const float *x;
    int64_t inter;
    float *out;
};

static void silu_rows(void *ctx, int64_t r0, int64_t r1, int tid) {
    const struct silu_args *a = ctx;
    int64_t inter = a->inter;
    (void)tid;
    for (int64_t r = r0; r < r1; r++) {
        const float *gate = a->x + r * 2 * inter, *up = gate + inter;
        float *o = a->out + r * inter;
        int64_t i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= inter; i += 16) store16(o + i, silu_mul16(load16(gate + i), load16(up + i)));
#endif
        for (; i + 8 <= inter; i += 8) store8(o + i, silu_mul8(load8(gate + i), load8(up + i)));
        if (i < inter) {
            v8 y = silu_mul8(load_tail(gate + i, inter - i), load_tail(up + i, inter - i));
            memcpy(o + i, &y, (size_t)(inter - i) * sizeof(float));
        }
    }
}

void inflight_silu_and_mul_f32(const float *x, int64_t rows, int64_t inter, float *out, int threads) {
    struct silu_args a = {x, inter, out};
    parallel_for(rows, rows * inter >= SILU_PARALLEL_FLOATS ? threads : 1, 0, silu_rows, &a);
}

/* One token's rotary embedding, in place on `heads` rows of D floats (Hugging Face's rotate-half
 * convention): x[i] * cos[i] + rotate_half(x)[i] * sin[i], rotate_half(x) = (-x[D/2:], x[:D/2]). */
static inline void rotate(float *x, int64_t heads, int64_t D, const float *cos, const float *sin) {
    int64_t half = D / 2;
    for (int64_t h = 0; h < heads; h++, x += D) {
        for (int64_t i = 0; i < half; i++) {
            float x1 = x[i], x2 = x[i + half];
            x[i] = x1 * cos[i] + (-x2) * sin[i];
            x[i + half] = x2 * cos[i + half] + x1 * sin[i + half];
        }
    }
}

/* A step's projections qkv [T, (H + 2 * KV) * D] (q heads, then k heads, then v heads per token):
 * rotate q and k in place with cos/sin [T, D], then copy each token's k and v rows into slot
 * slot_mapping[t] of caches [num_slots, KV, D]. Returns 0, or -1 - t when token t's slot lies
 * outside the cache: every slot is checked before anything is written. */
struct rotary_args {
    float *qkv;
    int64_t H, KV, D;
    const float *cos, *sin;
    float *k_cache, *v_cache;
    const int64_t *slot_mapping;
};

static void rotary_tokens(void *ctx, int64_t t0, int64_t t1, int tid) {
    const struct rotary_args *a = ctx;
    int64_t D = a->D, width = (a->H + 2 * a->KV) * D, kv_row = a->KV * D;
    (void)tid;
    for (int64_t t = t0; t < t1; t++) {
        float *row = a->qkv + t * width;
        rotate(row, a->H + a->KV, D, a->cos + t * D, a->sin + t * D);  /* q and k heads are adjacent */
        memcpy(a->k_cache + a->slot_mapping[t] * kv_row, row + a->H * D, (size_t)kv_row * sizeof(float));
        memcpy(a->v_cache + a->slot_mapping[t] * kv_row, row + (a->H + a->KV) * D, (size_t)kv_row * sizeof(float));
    }
}

int inflight_rotary_and_cache_f32(float *qkv, int64_t T, int64_t H, int64_t KV, int64_t D, const float *cos,
                                  const float *sin, float *k_cache, float *v_cache, int64_t num_slots,
                                  const int64_t *slot_mapping, int threads) {
    for (int64_t t = 0; t < T; t++)
        if (slot_mapping[t] < 0 || slot_mapping[t] >= num_slots) return (int)(-1 - t);
    struct rotary_args a = {qkv, H, KV, D, cos, sin, k_cache, v_cache, slot_mapping};
    parallel_for(T, T * (H + 2 * KV) * D >= PARALLEL_FLOATS ? threads : 1, 0, rotary_tokens, &a);
    return 0;
}
