/* A linear layer for a few rows, float32, on the CPU: out[m, n] = x[m, :] . w[n, :] (+ bias[n]).
 *
 * A decode step's matrix multiplies have one row per running sequence: a few dozen, and a handful at
 * the end of a run ("skinny" GEMMs, in vLLM's words). By then the step's attention has streamed the
 * KV cache through the CPU's caches and pushed the weights out, so the weights come from memory and
 * each is used only a few times. The BLAS, tuned for large products, is slow at this shape. Here each
 * group of four weight rows is read once and multiplied by every row of x, two rows of x at a time,
 * with the eight running sums in registers.
 *
 * Every output is the same sum in the same order -- eight lanes over k (a last k % 8 through the same
 * code, zero-padded), the lanes added by sum8, then the bias -- however many rows x has, wherever
 * the output sits in its block and whichever thread computes it. So a row's result never depends on
 * what else is in the batch.
 *
 * Built on first use by inflight/model/skinny_gemm.py (cc -O3 -march=native -shared -fPIC -fopenmp); its
 * threads are the package's pool (parallel.h).
 */
#include <stdint.h>
#include <string.h>

#include "parallel.h"
#include "vec8.h"

/* products this large or larger (rows x columns x k) are shared out over the threads: in a serving
 * step the weights come from memory, and two cores read it faster than one; below, waking a sleeping
 * thread costs more than it saves */
#define PARALLEL_MACS (1 << 18)
/* output columns per work item: four weight rows at a time, sixteen times */
#define CHUNK 64

/* x rows m and m+1 (two, or one when m1 is NULL) against weight rows n..n+3 */
static inline void four_columns(const float *x0, const float *x1, const float *w, int64_t K, float *o0,
                                float *o1) {
    const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
    v8 a0 = {0.f}, a1 = {0.f}, a2 = {0.f}, a3 = {0.f}, b0 = {0.f}, b1 = {0.f}, b2 = {0.f}, b3 = {0.f};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        v8 c0 = load8(w0 + k), c1 = load8(w1 + k), c2 = load8(w2 + k), c3 = load8(w3 + k), r = load8(x0 + k);
        a0 += r * c0, a1 += r * c1, a2 += r * c2, a3 += r * c3;
        if (x1) {
            r = load8(x1 + k);
            b0 += r * c0, b1 += r * c1, b2 += r * c2, b3 += r * c3;
        }
    }
    if (k < K) {
        int64_t t = K - k;
        v8 c0 = load_tail(w0 + k, t), c1 = load_tail(w1 + k, t), c2 = load_tail(w2 + k, t),
           c3 = load_tail(w3 + k, t), r = load_tail(x0 + k, t);
        a0 += r * c0, a1 += r * c1, a2 += r * c2, a3 += r * c3;
        if (x1) {
            r = load_tail(x1 + k, t);
            b0 += r * c0, b1 += r * c1, b2 += r * c2, b3 += r * c3;
        }
    }
    o0[0] = sum8(a0), o0[1] = sum8(a1), o0[2] = sum8(a2), o0[3] = sum8(a3);
    if (x1) o1[0] = sum8(b0), o1[1] = sum8(b1), o1[2] = sum8(b2), o1[3] = sum8(b3);
}

/* one column n for one row: the same sum as four_columns makes */
static inline float one_column(const float *x, const float *w, int64_t K) {
    v8 a = {0.f};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) a += load8(x + k) * load8(w + k);
    if (k < K) a += load_tail(x + k, K - k) * load_tail(w + k, K - k);
    return sum8(a);
}

static void columns(const float *x, int64_t M, int64_t K, const float *w, const float *bias, int64_t n0,
                    int64_t n1, float *out, int64_t N) {
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) {
        int64_t m = 0;
        for (; m + 2 <= M; m += 2)
            four_columns(x + m * K, x + (m + 1) * K, w + n * K, K, out + m * N + n, out + (m + 1) * N + n);
        if (m < M) four_columns(x + m * K, NULL, w + n * K, K, out + m * N + n, NULL);
    }
    for (; n < n1; n++)
        for (int64_t m = 0; m < M; m++) out[m * N + n] = one_column(x + m * K, w + n * K, K);
    if (bias)
        for (int64_t m = 0; m < M; m++)
            for (int64_t j = n0; j < n1; j++) out[m * N + j] += bias[j];
}

struct gemm_args {
    const float *x, *w, *bias;
    int64_t M, K, N;
    float *out;
};

static void gemm_chunks(void *ctx, int64_t c0, int64_t c1, int tid) {
    const struct gemm_args *a = ctx;
    (void)tid;
    for (int64_t c = c0; c < c1; c++) {
        int64_t n0 = c * CHUNK, n1 = n0 + CHUNK < a->N ? n0 + CHUNK : a->N;
        columns(a->x, a->M, a->K, a->w, a->bias, n0, n1, a->out, a->N);
    }
}

/* x [M, K], w [N, K] (nn.Linear's layout), bias [N] or NULL, out [M, N]; all contiguous */
void inflight_skinny_gemm_f32(const float *x, int64_t M, int64_t K, const float *w, int64_t N, const float *bias,
                              float *out, int threads) {
    struct gemm_args a = {x, w, bias, M, K, N, out};
    parallel_for((N + CHUNK - 1) / CHUNK, M * N * K >= PARALLEL_MACS ? threads : 1, 0, gemm_chunks, &a);
}
