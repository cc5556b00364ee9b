/* Paged decode attention on the CPU: one new query token per sequence, float32, keys and values read
 * in place from the block-paged cache.
 *
 * The algorithm is the plain-torch reference's (inflight/model/attention.py): scores q.k * scale,
 * their maximum per query head, weights exp(score - max), and the weighted sum of the value rows
 * divided by the sum of the weights. What the C adds is fusion: each (sequence, kv head) pair is one
 * work item that reads every key and value row of its context exactly once, straight from its block
 * (slot = block_tables[i][j / block_size] * block_size + j % block_size), for all the query heads
 * that share it (grouped-query attention) -- no index tensors, no intermediate tensors, no per-operator
 * dispatch. Work items are spread over OpenMP threads when the compiler supports it.
 *
 * Built on first use by inflight/model/cpu_attention.py (cc -O3 -march=native -shared -fPIC -fopenmp).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Eight floats in one vector register (GCC/Clang vector extensions: AVX on x86, NEON on ARM, plain
 * scalar code elsewhere); loads through memcpy, which compiles to one unaligned vector load. */
typedef float v8 __attribute__((vector_size(32)));
static inline v8 load8(const float *p) { v8 x; memcpy(&x, p, sizeof x); return x; }
static inline float sum8(v8 a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }

/* q.k: eight partial sums in one register, added up in a fixed order (the same for every call) */
static inline float dot(const float *q, const float *k, int64_t n) {
    v8 acc = {0.f};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc += load8(q + i) * load8(k + i);
    float s = sum8(acc);
    for (; i < n; i++) s += q[i] * k[i];
    return s;
}

/* the same for four keys at once: four independent chains the CPU overlaps, each summed like dot */
static inline void dot4(const float *q, const float *k0, const float *k1, const float *k2, const float *k3,
                        int64_t n, float *s) {
    v8 a0 = {0.f}, a1 = {0.f}, a2 = {0.f}, a3 = {0.f};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8 x = load8(q + i);
        a0 += x * load8(k0 + i);
        a1 += x * load8(k1 + i);
        a2 += x * load8(k2 + i);
        a3 += x * load8(k3 + i);
    }
    s[0] = sum8(a0), s[1] = sum8(a1), s[2] = sum8(a2), s[3] = sum8(a3);
    for (; i < n; i++) s[0] += q[i] * k0[i], s[1] += q[i] * k1[i], s[2] += q[i] * k2[i], s[3] += q[i] * k3[i];
}

#define PREFETCH 16  /* keys ahead: one block of the usual size */

/* ask the memory system for a row of D floats (one request per 64-byte cache line) */
static inline void prefetch_row(const float *row, int64_t D) {
    for (int64_t i = 0; i < D; i += 16) __builtin_prefetch(row + i, 0, 3);
}

/* One (sequence, kv head) pair: the G query heads of group g of sequence i. w holds G * L scores. */
static void attend_group(const float *q, const float *k_cache, const float *v_cache, const int32_t *table,
                         int64_t L, int64_t g, int64_t G, int64_t num_kv_heads, int64_t D, int64_t block_size,
                         float scale, float *w, float *out) {
#define SLOT(j) ((int64_t)table[(j) / block_size] * block_size + (j) % block_size)
#define KEY(j) (k_cache + (SLOT(j) * num_kv_heads + g) * D)
#define VALUE(j) (v_cache + (SLOT(j) * num_kv_heads + g) * D)
    for (int64_t p = 0; p < PREFETCH && p < L; p++) prefetch_row(KEY(p), D);
    int64_t j = 0;
    for (; j + 4 <= L; j += 4) {  /* scores, four keys at a time: each key row read once for the G heads */
        const float *k0 = KEY(j), *k1 = KEY(j + 1), *k2 = KEY(j + 2), *k3 = KEY(j + 3);
        /* the blocks are scattered, so the hardware can't guess the next one: ask for the key rows
         * PREFETCH positions ahead, and for these positions' value rows (read by the second pass) */
        for (int64_t p = j + PREFETCH; p < j + PREFETCH + 4 && p < L; p++) prefetch_row(KEY(p), D);
        for (int64_t p = j; p < j + 4; p++) prefetch_row(VALUE(p), D);
        for (int64_t h = 0; h < G; h++) {
            float s[4];
            dot4(q + h * D, k0, k1, k2, k3, D, s);
            for (int l = 0; l < 4; l++) w[h * L + j + l] = s[l] * scale;
        }
    }
    for (; j < L; j++)
        for (int64_t h = 0; h < G; h++) w[h * L + j] = dot(q + h * D, KEY(j), D) * scale;
    float total[64];  /* G <= 64, checked by the caller */
    for (int64_t h = 0; h < G; h++) {  /* softmax numerators, normalised at the end */
        float *s = w + h * L, m = -INFINITY, t = 0.f;
        for (int64_t j = 0; j < L; j++) m = s[j] > m ? s[j] : m;
        for (int64_t j = 0; j < L; j++) { s[j] = expf(s[j] - m); t += s[j]; }
        total[h] = t;
    }
    memset(out, 0, (size_t)(G * D) * sizeof(float));
    for (int64_t j = 0; j < L; j++) {  /* values: each row read once, added into every head's output */
        const float *v = VALUE(j);
        for (int64_t h = 0; h < G; h++) {
            float wj = w[h * L + j], *o = out + h * D;
            for (int64_t d = 0; d < D; d++) o[d] += wj * v[d];
        }
    }
    for (int64_t h = 0; h < G; h++)
        for (int64_t d = 0; d < D; d++) out[h * D + d] /= total[h];
#undef KEY
#undef VALUE
#undef SLOT
}

/* q [n, H, D], caches [num_blocks, block_size, kv_heads, D], block_tables [n, max_blocks] int32,
 * context_lens [n] int32, out [n, H, D]; workspace: threads * G * max(context_lens) floats.
 * Returns 0, or -1 (head counts), or -2 - i when sequence i's context length or block table would
 * read outside the cache: checked before anything is read, so a bad table is an error, not a crash. */
int inflight_paged_decode_f32(const float *q, const float *k_cache, const float *v_cache, int64_t num_blocks,
                              const int32_t *block_tables, int64_t max_blocks, const int32_t *context_lens,
                              int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t D, int64_t block_size,
                              float scale, float *workspace, int64_t workspace_per_thread, int threads,
                              float *out) {
    int64_t G = num_heads / num_kv_heads;
    if (G < 1 || G > 64 || num_heads % num_kv_heads) return -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t L = context_lens[i];
        if (L < 1 || L > max_blocks * block_size || L * G > workspace_per_thread) return (int)(-2 - i);
        for (int64_t b = 0; b < (L + block_size - 1) / block_size; b++) {
            int32_t blk = block_tables[i * max_blocks + b];
            if (blk < 0 || blk >= num_blocks) return (int)(-2 - i);
        }
    }
    int64_t items = n * num_kv_heads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(dynamic, 4)
#endif
    for (int64_t item = 0; item < items; item++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        int64_t i = item / num_kv_heads, g = item % num_kv_heads;
        attend_group(q + (i * num_heads + g * G) * D, k_cache, v_cache, block_tables + i * max_blocks,
                     context_lens[i], g, G, num_kv_heads, D, block_size, scale,
                     workspace + tid * workspace_per_thread, out + (i * num_heads + g * G) * D);
    }
    return 0;
}

/* Which build this is: 1 with OpenMP threads, 0 without. */
int inflight_paged_decode_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
