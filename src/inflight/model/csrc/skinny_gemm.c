/* A linear layer for a few rows, float32, on the CPU: out[m, n] = x[m, :] . w[n, :] (+ bias[n]).
 *
 * A decode step's matrix multiplies have one row per running sequence: a few dozen, and a handful at
 * the end of a run ("skinny" GEMMs, in vLLM's words). By then the step's attention has streamed the
 * KV cache through the CPU's caches and pushed the weights out, so the weights come from memory and
 * each is used only a few times. The BLAS, tuned for large products, is slow at this shape (it packs
 * the weights again at every call, which here costs about as much as the product). This kernel reads
 * weights packed once (skinny_gemm.py keeps the packed copy beside each weight), each panel once per
 * call, with the output tile in registers.
 *
 * Built on first use by inflight/model/skinny_gemm.py (cc -O3 -march=native -shared -fPIC -fopenmp); its
 * threads are the package's pool (parallel.h).
 */
#include <stdint.h>
#include <string.h>

#include "parallel.h"
#include "vec16.h"

/* products this large or larger (rows x columns x k) are shared out over the threads: in a serving
 * step the weights come from memory, and two cores read it faster than one; below, waking a sleeping
 * thread costs more than it saves */
#define PARALLEL_MACS (1 << 18)
/* The weights as panels of 16 columns, k-major.
 *
 * A dot product per output (four weight rows and two x rows per step of k, then a horizontal sum per
 * output, this kernel's first form) does six loads for eight multiply-adds, then shuffles. A BLAS's
 * way is an outer product: with the weights rearranged once into panels of 16 output columns laid out k by k
 * (panel[k][0..15] = w[n0..n0+15][k]), one step of k loads two vectors of weights, broadcasts one
 * float of each of six x rows, and does twelve multiply-adds into twelve registers that hold a 6 x 16
 * tile of the output -- eight loads for twelve, no horizontal sums, and the panel (16 x K floats)
 * stays in the L1 cache while every row of x passes it.
 *
 * Every output is one chain of multiply-adds over k in order, started at zero, in its own lane: the
 * same whatever the tile, the row count or the thread, so a row's result still never depends on what
 * else is in the batch. The multiply-adds are written out (fma8, fma16: vec8.h) and the file is built
 * with -ffp-contract=off, so that the compiler cannot fuse them in one tile's loop and not another's. */
#define PANEL 16
#define TILE_ROWS 6

/* rows m0..m0+R-1 of x against one panel: out[m][n0 .. n0 + cols) */
static inline void panel_tile(const float *x, int64_t K, const float *panel, int64_t R, int64_t cols,
                              const float *bias, float *out, int64_t N) {
    v8 a[TILE_ROWS][2];
    for (int r = 0; r < TILE_ROWS; r++) a[r][0] = a[r][1] = splat(0.f);
    /* R is a compile-time constant in each call below, so the compiler keeps the tile in registers */
    for (int64_t k = 0; k < K; k++) {
        v8 w0 = load8(panel + k * PANEL), w1 = load8(panel + k * PANEL + 8);
        for (int r = 0; r < R; r++) {
            v8 xr = splat(x[r * K + k]);
            a[r][0] = fma8(xr, w0, a[r][0]), a[r][1] = fma8(xr, w1, a[r][1]);
        }
    }
    if (cols == PANEL) {  /* a whole panel: the rows straight from the registers (plus the bias) */
        v8 b0 = bias ? load8(bias) : splat(0.f), b1 = bias ? load8(bias + 8) : splat(0.f);
        for (int r = 0; r < R; r++) {
            if (bias) store8(out + r * N, a[r][0] + b0), store8(out + r * N + 8, a[r][1] + b1);
            else store8(out + r * N, a[r][0]), store8(out + r * N + 8, a[r][1]);
        }
        return;
    }
    for (int r = 0; r < R; r++) {  /* the last panel's columns up to N */
        float tmp[PANEL];
        store8(tmp, a[r][0]), store8(tmp + 8, a[r][1]);
        for (int64_t j = 0; j < cols; j++) out[r * N + j] = bias ? tmp[j] + bias[j] : tmp[j];
    }
}

#if defined(__AVX512F__)
/* Where the CPU has 512-bit vectors (AVX-512: -march=native turns __AVX512F__ on), a panel's row of
 * 16 weights is one register. Two panels side by side make a tile of up to 8 rows x 32 columns in
 * sixteen registers: one step of k loads two vectors of weights, broadcasts one float of each of 8 x
 * rows, and does sixteen 16-wide multiply-adds -- twice the 8-wide tile's arithmetic per instruction,
 * and on a core with full-width AVX-512 units (the book's CPU) twice its rate. (Wider tiles of rows
 * spill registers; this one was the fastest of 6-14 rows measured.) Each lane still holds one
 * output's chain of multiply-adds over k in order, from zero: the bits of the 8-wide tile, which
 * tests/test_skinny_gemm.py checks against this file built without AVX-512. */
#define PAIR_ROWS 8

/* rows m0..m0+R-1 of x against panels p0 and p0 + 1 (whole: 32 columns); R <= PAIR_ROWS */
static inline void pair_tile(const float *x, int64_t K, const float *panel, int64_t R, const float *bias,
                             float *out, int64_t N) {
    const float *next = panel + K * PANEL;
    v16 a[PAIR_ROWS][2];
    for (int r = 0; r < PAIR_ROWS; r++) a[r][0] = a[r][1] = (v16){0.f};
    for (int64_t k = 0; k < K; k++) {
        v16 w0 = load16(panel + k * PANEL), w1 = load16(next + k * PANEL);
        for (int r = 0; r < R; r++) {
            v16 xr = splat16(x[r * K + k]);
            a[r][0] = fma16(xr, w0, a[r][0]), a[r][1] = fma16(xr, w1, a[r][1]);
        }
    }
    /* the tile's rows straight from the registers: two 16-float stores a row (plus the bias, one add an
     * output, as before) */
    if (bias) {
        v16 b0 = load16(bias), b1 = load16(bias + PANEL);
        for (int r = 0; r < R; r++) store16(out + r * N, a[r][0] + b0), store16(out + r * N + PANEL, a[r][1] + b1);
    } else {
        for (int r = 0; r < R; r++) store16(out + r * N, a[r][0]), store16(out + r * N + PANEL, a[r][1]);
    }
}

#define PAIR_CASE(R) case R: pair_tile(x + m * K, K, panel, R, b, out + m * N + n0, N); break;
#endif

#define TILE_CASE(R) case R: panel_tile(x + m * K, K, panel, R, cols, b, out + m * N + n0, N); break;

struct packed_args {
    const float *x, *panels, *bias;
    int64_t M, K, N;
    float *out;
};

static void packed_panels(void *ctx, int64_t p0, int64_t p1, int tid) {
    const struct packed_args *a = ctx;
    const int64_t M = a->M, K = a->K, N = a->N;
    const float *x = a->x;
    float *out = a->out;
    (void)tid;
    for (int64_t p = p0; p < p1; p++) {
        const float *panel = a->panels + p * K * PANEL, *b = a->bias ? a->bias + p * PANEL : NULL;
        int64_t n0 = p * PANEL, cols = N - n0 < PANEL ? N - n0 : PANEL;
#if defined(__AVX512F__)
        if (p + 1 < p1 && N - n0 >= 2 * PANEL) {  /* this panel and the next, both whole: one pair */
            for (int64_t m = 0; m < M; m += PAIR_ROWS) {
                switch (M - m < PAIR_ROWS ? M - m : PAIR_ROWS) {
                    PAIR_CASE(1) PAIR_CASE(2) PAIR_CASE(3) PAIR_CASE(4)
                    PAIR_CASE(5) PAIR_CASE(6) PAIR_CASE(7) PAIR_CASE(8)
                }
            }
            p++;
            continue;
        }
#endif
        for (int64_t m = 0; m < M; m += TILE_ROWS) {
            switch (M - m < TILE_ROWS ? M - m : TILE_ROWS) {
                TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6)
            }
        }
    }
}

/* floats per vector register the tiles use: 16 where built with AVX-512, else 8 (skinny_gemm.py sets
 * how many rows the kernel takes from it: the 16-wide tile outruns the BLAS at every size measured) */
int inflight_gemm_lanes(void) {
#if defined(__AVX512F__)
    return 16;
#else
    return 8;
#endif
}

/* x [M, K]; panels [ceil(N / 16), K, 16] (the weights packed, zeros past column N); bias [N] or NULL;
 * out [M, N] */
void inflight_packed_gemm_f32(const float *x, int64_t M, int64_t K, const float *panels, int64_t N,
                              const float *bias, float *out, int threads) {
    struct packed_args a = {x, panels, bias, M, K, N, out};
    int64_t np = (N + PANEL - 1) / PANEL;
    parallel_for(np, M * N * K >= PARALLEL_MACS ? threads : 1, 0, packed_panels, &a);
}
