/* How the kernels share out their work: parallel_for(n, threads, chunk, fn, ctx) calls
 * fn(ctx, begin, end, tid) over [0, n) on up to `threads` threads, either an even split (chunk 0) or
 * chunks of `chunk` items handed out in turn.
 *
 * It runs on the package's own thread pool (thread_pool.c, whose idle threads spin or sleep as the
 * engine says before each step) once inflight/model/thread_pool.py has handed this library the pool
 * through inflight_use_pool; until then, or where the pool can't be built, on OpenMP threads if the
 * library was built with them, else on the calling thread. Which thread takes an item never changes
 * what the item computes.
 */
#ifndef INFLIGHT_PARALLEL_H
#define INFLIGHT_PARALLEL_H
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef void (*inflight_task)(void *ctx, int64_t begin, int64_t end, int tid);
typedef void (*inflight_pool_for_fn)(int64_t n, int threads, int64_t chunk, inflight_task fn, void *ctx);

#ifndef INFLIGHT_POOL_ITSELF
static inflight_pool_for_fn pool_for;

/* the pool's entry point (NULL: back to OpenMP or one thread) */
void inflight_use_pool(void *fn) { pool_for = (inflight_pool_for_fn)fn; }

/* 2 when this library runs on the pool, 1 on OpenMP threads, 0 on the calling thread only */
int inflight_parallel_backend(void) {
    if (pool_for) return 2;
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

static void parallel_for(int64_t n, int threads, int64_t chunk, inflight_task fn, void *ctx) {
    if (n <= 0) return;
    if (threads <= 1) {
        fn(ctx, 0, n, 0);
    } else if (pool_for) {
        pool_for(n, threads, chunk, fn, ctx);
    } else {
#ifdef _OPENMP
        if (chunk > 0) {
            int64_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
            for (int64_t c = 0; c < chunks; c++)
                fn(ctx, c * chunk, (c + 1) * chunk < n ? (c + 1) * chunk : n, omp_get_thread_num());
        } else {
#pragma omp parallel for num_threads(threads) schedule(static, 1)
            for (int t = 0; t < threads; t++)
                if (n * t / threads < n * (t + 1) / threads) fn(ctx, n * t / threads, n * (t + 1) / threads, t);
        }
#else
        fn(ctx, 0, n, 0);
#endif
    }
}
#endif
#endif
