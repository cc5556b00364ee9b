/* Paged attention on the CPU for a step's queries -- a decode's one new token, or each token of a
 * prefill chunk as a query over its own prefix -- float32, keys and values read in place from the
 * block-paged cache.
 *
 * The algorithm is the plain-torch reference's (inflight/model/attention.py): scores q.k * scale,
 * their maximum per query head, weights exp(score - max), and the weighted sum of the value rows
 * divided by the sum of the weights. What the C adds is fusion: a work item (a sequence, or one kv
 * head of it when the batch is too small to share out) reads every key and value row of its context
 * exactly once, straight from its block (slot = block_tables[i][j / block_size] * block_size +
 * j % block_size), for all the query heads that share it (grouped-query attention) -- no index
 * tensors, no intermediate tensors, no per-operator dispatch. A prefill chunk's consecutive tokens go
 * a tile at a time, their queries along the vector lanes (attend_tile), in the same summation order,
 * so a token's output has the same bits in a tile, alone, or as a decode. Work items are spread over
 * the package's threads (parallel.h). Every multiply-add is written out (fma8, fma16, fma1: vec8.h)
 * and the file is built with -ffp-contract=off: a "same order" that left fusing to the compiler held
 * only as long as GCC happened to fuse the same products in every copy of a loop.
 *
 * Built on first use by inflight/model/cpu_attention.py (cc -O3 -march=native -ffp-contract=off -shared
 * -fPIC -fopenmp).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "parallel.h"
#include "vec16.h"

/* the softmax's exp: exp8's steps (vec8.h) as fused multiply-adds, at either width */
INFLIGHT_DEFINE_EXP(exp8_fused, v8, v8i, splat, select8, fma8)
#if defined(__AVX512F__)
INFLIGHT_DEFINE_EXP(exp16_fused, v16, v16i, splat16, select16, fma16)
#endif

/* q.k: eight partial sums in one register, added up in a fixed order (the same for every call) */
static inline float dot(const float *q, const float *k, int64_t n) {
    v8 acc = {0.f};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = fma8(load8(q + i), load8(k + i), acc);
    float s = sum8(acc);
    for (; i < n; i++) s = fma1(q[i], k[i], s);
    return s;
}

/* the four sums of a..d, each added up exactly as sum8 adds (so a score is the same whichever way it
 * was computed), in three vector steps instead of four separate horizontal sums */
static inline void sum8x4(v8 a, v8 b, v8 c, v8 d, float *s) {
    /* lanes i and i+4 of each: [a0+a4 .. a3+a7, b0+b4 .. b3+b7], the same for c and d */
    v8 ab = pick8(a, b, 0, 1, 2, 3, 8, 9, 10, 11) + pick8(a, b, 4, 5, 6, 7, 12, 13, 14, 15);
    v8 cd = pick8(c, d, 0, 1, 2, 3, 8, 9, 10, 11) + pick8(c, d, 4, 5, 6, 7, 12, 13, 14, 15);
    /* neighbours: [a(0,4)+a(1,5), a(2,6)+a(3,7), c.., c.., b.., b.., d.., d..] */
    v8 p = pick8(ab, cd, 0, 2, 8, 10, 4, 6, 12, 14) + pick8(ab, cd, 1, 3, 9, 11, 5, 7, 13, 15);
    s[0] = p[0] + p[1], s[1] = p[4] + p[5], s[2] = p[2] + p[3], s[3] = p[6] + p[7];
}

/* the same for four keys at once: four independent chains the CPU overlaps, each summed like dot */
static inline void dot4(const float *q, const float *k0, const float *k1, const float *k2, const float *k3,
                        int64_t n, float *s) {
    v8 a0 = {0.f}, a1 = {0.f}, a2 = {0.f}, a3 = {0.f};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8 x = load8(q + i);
        a0 = fma8(x, load8(k0 + i), a0);
        a1 = fma8(x, load8(k1 + i), a1);
        a2 = fma8(x, load8(k2 + i), a2);
        a3 = fma8(x, load8(k3 + i), a3);
    }
    sum8x4(a0, a1, a2, a3, s);
    for (; i < n; i++) s[0] = fma1(q[i], k0[i], s[0]), s[1] = fma1(q[i], k1[i], s[1]), s[2] = fma1(q[i], k2[i], s[2]), s[3] = fma1(q[i], k3[i], s[3]);
}

/* two query heads that share a kv head against four keys: every key load serves both, so the loop
 * does eight multiply-adds for six loads instead of four for five (each score summed like dot) */
static inline void dot4x2(const float *qa, const float *qb, const float *k0, const float *k1, const float *k2,
                          const float *k3, int64_t n, float *sa, float *sb) {
    v8 a0 = {0.f}, a1 = {0.f}, a2 = {0.f}, a3 = {0.f}, b0 = {0.f}, b1 = {0.f}, b2 = {0.f}, b3 = {0.f};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8 x = load8(qa + i), y = load8(qb + i), k;
        k = load8(k0 + i), a0 = fma8(x, k, a0), b0 = fma8(y, k, b0);
        k = load8(k1 + i), a1 = fma8(x, k, a1), b1 = fma8(y, k, b1);
        k = load8(k2 + i), a2 = fma8(x, k, a2), b2 = fma8(y, k, b2);
        k = load8(k3 + i), a3 = fma8(x, k, a3), b3 = fma8(y, k, b3);
    }
    sum8x4(a0, a1, a2, a3, sa);
    sum8x4(b0, b1, b2, b3, sb);
    for (; i < n; i++) {
        sa[0] = fma1(qa[i], k0[i], sa[0]), sa[1] = fma1(qa[i], k1[i], sa[1]), sa[2] = fma1(qa[i], k2[i], sa[2]), sa[3] = fma1(qa[i], k3[i], sa[3]);
        sb[0] = fma1(qb[i], k0[i], sb[0]), sb[1] = fma1(qb[i], k1[i], sb[1]), sb[2] = fma1(qb[i], k2[i], sb[2]), sb[3] = fma1(qb[i], k3[i], sb[3]);
    }
}

#if defined(__AVX512F__)
/* Where the CPU has AVX-512 (-march=native turns __AVX512F__ on), two keys share a 16-float register:
 * lanes 0-7 hold one key's eight partial sums, lanes 8-15 the next key's, each lane the same chain of
 * multiply-adds as dot's, so every score keeps its bits; half the instructions for the products, and
 * the horizontal sums of eight keys are a few vector steps (sum8x8) that end in one vector of eight
 * scores. tests/test_cpu_attention.py checks this file built with and without AVX-512 bit for bit. */
/* eight floats at a and eight at b, side by side */
static inline v16 join8(const float *a, const float *b) {
    return join2x8(load8(a), load8(b));
}

/* the sums of the eight keys' partials in A = [k0 | k1], B = [k2 | k3], C, D, each added up exactly
 * as sum8 adds: ((p0 + p4) + (p1 + p5)) + ((p2 + p6) + (p3 + p7)) */
static inline v8 sum8x8(v16 A, v16 B, v16 C, v16 D) {
    v16 ab = pick16(A, B, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
             pick16(A, B, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    v16 cd = pick16(C, D, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
             pick16(C, D, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    /* per key [p0+p4, p1+p5, p2+p6, p3+p7]: pair the neighbours */
    v16 p = pick16(ab, cd, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
            pick16(ab, cd, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    /* per key [(p0+p4)+(p1+p5), (p2+p6)+(p3+p7)]: the last step */
    return evens_plus_odds(p);
}

/* two query heads against eight keys k, k + row, ..., k + 7 row (n a multiple of 8): sa, sb */
static inline void dot8x2(const float *qa, const float *qb, const float *k, int64_t row, int64_t n, v8 *sa, v8 *sb) {
    v16 a0 = {0.f}, a1 = {0.f}, a2 = {0.f}, a3 = {0.f}, b0 = {0.f}, b1 = {0.f}, b2 = {0.f}, b3 = {0.f};
    for (int64_t i = 0; i < n; i += 8) {
        v8 xa8 = load8(qa + i), xb8 = load8(qb + i);
        v16 x = join2x8(xa8, xa8), y = join2x8(xb8, xb8);
        v16 kk;
        kk = join8(k + i, k + row + i), a0 = fma16(x, kk, a0), b0 = fma16(y, kk, b0);
        kk = join8(k + 2 * row + i, k + 3 * row + i), a1 = fma16(x, kk, a1), b1 = fma16(y, kk, b1);
        kk = join8(k + 4 * row + i, k + 5 * row + i), a2 = fma16(x, kk, a2), b2 = fma16(y, kk, b2);
        kk = join8(k + 6 * row + i, k + 7 * row + i), a3 = fma16(x, kk, a3), b3 = fma16(y, kk, b3);
    }
    *sa = sum8x8(a0, a1, a2, a3);
    *sb = sum8x8(b0, b1, b2, b3);
}
#endif

/* ask the memory system for n floats from p (one request per 64-byte cache line) */
static inline void prefetch_span(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i, 0, 3);
}

/* One work item: kv heads g0..g1-1 of one sequence, i.e. query heads g0*G..g1*G-1; w holds
 * (g1 - g0) * G * (L + 1) floats: the scores, then each head's sum of weights.
 *
 * At a large batch memory sets the pace, so the loops follow the cache's layout. A token's row holds
 * all kv heads side by side, so an item that takes all of a sequence's kv heads reads each block as
 * one contiguous run (block_size x kv_heads x D floats) that the hardware prefetcher can stream; an
 * item per (sequence, kv head) reads D floats and skips the other heads' rows. The loops walk the
 * block table block by block, so finding a row is an addition (no division per key), and ask for the
 * next block before it is needed: the blocks are scattered, which no prefetcher can guess -- except
 * where the item before it on the same thread was the same prompt's previous token, which has just
 * brought every one of those blocks into cache (asking again cost a tenth of a prompt's attention).
 *
 * The query heads of a kv group are scored two at a time (dot4x2): each key row loaded serves both,
 * and four scores' horizontal sums are one vector step (sum8x4). Both add up every score exactly as
 * dot does, so the results are bit for bit what one head at a time gives.
 *
 * For a prompt's token that comes alone (runs of them go to attend_tile) the keys are already in cache
 * and the arithmetic sets the pace, so none of it is left to scalar code: the softmax is eight lanes
 * at a time (exp8_fused), and a head's output stays in registers while the value rows of a block stream
 * past, instead of being loaded and stored back for every row. Each head's arithmetic (which products
 * are summed, in what order) is the same however the heads are grouped and whatever else is in the
 * batch. */
static void attend(const float *q, const float *k_cache, const float *v_cache, const int32_t *table,
                   int64_t L, int64_t g0, int64_t g1, int64_t G, int64_t num_kv_heads, int64_t D,
                   int64_t block_size, float scale, int prefetch, float *w, float *out) {
    const int64_t heads = (g1 - g0) * G, span = (g1 - g0) * D;  /* floats of one token's row we read */
    const int64_t row = num_kv_heads * D, block = block_size * row;  /* strides in the cache */
    const int64_t blocks = (L + block_size - 1) / block_size;
#define FIRST_ROW(cache, b) ((cache) + (int64_t)table[b] * block + g0 * D)
#define PREFETCH_BLOCK(cache, b)                                                                  \
    if (prefetch && (b) < blocks) {                                                                           \
        int64_t n_ = (L - (b) * block_size < block_size ? L - (b) * block_size : block_size);     \
        if (span == row) prefetch_span(FIRST_ROW(cache, b), n_ * row);                            \
        else for (int64_t r = 0; r < n_; r++) prefetch_span(FIRST_ROW(cache, b) + r * row, span); \
    }
    PREFETCH_BLOCK(k_cache, 0);
    for (int64_t b = 0; b < blocks; b++) {  /* scores: each key row read once for the G heads that share it */
        PREFETCH_BLOCK(k_cache, b + 1);
        const float *kb = FIRST_ROW(k_cache, b);
        int64_t j0 = b * block_size, rows = L - j0 < block_size ? L - j0 : block_size, r = 0;
#if defined(__AVX512F__)
        if (D % 8 == 0)
            for (; r + 8 <= rows; r += 8) {  /* eight keys at a time, two heads at a time, 16 lanes */
                for (int64_t g = 0; g < g1 - g0; g++) {
                    const float *k = kb + r * row + g * D;
                    int64_t h = g * G;
                    for (; h + 2 <= (g + 1) * G; h += 2) {
                        v8 sa, sb;
                        dot8x2(q + h * D, q + (h + 1) * D, k, row, D, &sa, &sb);
                        store8(w + h * L + j0 + r, sa * splat(scale));
                        store8(w + (h + 1) * L + j0 + r, sb * splat(scale));
                    }
                    if (h < (g + 1) * G) {  /* an odd group size: the last head alone, four keys at a time */
                        float s4[8];
                        dot4(q + h * D, k, k + row, k + 2 * row, k + 3 * row, D, s4);
                        dot4(q + h * D, k + 4 * row, k + 5 * row, k + 6 * row, k + 7 * row, D, s4 + 4);
                        for (int l = 0; l < 8; l++) w[h * L + j0 + r + l] = s4[l] * scale;
                    }
                }
            }
#endif
        for (; r + 4 <= rows; r += 4) {
            for (int64_t g = 0; g < g1 - g0; g++) {
                const float *k = kb + r * row + g * D;
                int64_t h = g * G;
                for (; h + 2 <= (g + 1) * G; h += 2) {  /* the group's heads two at a time */
                    float sa[4], sb[4];
                    dot4x2(q + h * D, q + (h + 1) * D, k, k + row, k + 2 * row, k + 3 * row, D, sa, sb);
                    for (int l = 0; l < 4; l++) w[h * L + j0 + r + l] = sa[l] * scale, w[(h + 1) * L + j0 + r + l] = sb[l] * scale;
                }
                if (h < (g + 1) * G) {  /* an odd group size: the last head alone */
                    float s[4];
                    dot4(q + h * D, k, k + row, k + 2 * row, k + 3 * row, D, s);
                    for (int l = 0; l < 4; l++) w[h * L + j0 + r + l] = s[l] * scale;
                }
            }
        }
        for (; r < rows; r++)
            for (int64_t h = 0; h < heads; h++) w[h * L + j0 + r] = dot(q + h * D, kb + r * row + h / G * D, D) * scale;
    }
    float *total = w + heads * L;  /* each head's sum of weights */
    for (int64_t h = 0; h < heads; h++) {  /* softmax numerators, normalised at the end */
        float *s = w + h * L, m = -INFINITY;
        int64_t j = 0;
        v8 mx = splat(-INFINITY);  /* the maximum: in any order, it is exact */
        for (; j + 8 <= L; j += 8) { v8 x = load8(s + j); mx = select8(x > mx, x, mx); }
        for (int l = 0; l < 8; l++) m = mx[l] > m ? mx[l] : m;
        for (; j < L; j++) m = s[j] > m ? s[j] : m;
        v8 sum = {0.f}, top = splat(m);
        for (j = 0; j + 8 <= L; j += 8) { v8 e = exp8_fused(load8(s + j) - top); store8(s + j, e); sum += e; }
        if (j < L) {  /* the last L % 8 scores through the same code, in a zero-padded register */
            v8 e = exp8_fused(load_tail(s + j, L - j) - top);
            for (int64_t l = 0; l < L - j; l++) s[j + l] = e[l], sum[l] += e[l];
        }
        total[h] = sum8(sum);
    }
    memset(out, 0, (size_t)(heads * D) * sizeof(float));
    PREFETCH_BLOCK(v_cache, 0);
    for (int64_t b = 0; b < blocks; b++) {  /* values: each block read from memory once, then from L1 per head */
        PREFETCH_BLOCK(v_cache, b + 1);
        const float *vb = FIRST_ROW(v_cache, b);
        int64_t j0 = b * block_size, rows = L - j0 < block_size ? L - j0 : block_size;
        for (int64_t h = 0; h < heads; h++) {
            const float *vh = vb + h / G * D, *wh = w + h * L + j0;
            float *o = out + h * D;
            int64_t d = 0;
#if defined(__AVX512F__)
            for (; d + 64 <= D; d += 64) {  /* the same 64 outputs in four 16-float registers: each lane's chain unchanged */
                v16 a0 = load16(o + d), a1 = load16(o + d + 16), a2 = load16(o + d + 32), a3 = load16(o + d + 48);
                for (int64_t r = 0; r < rows; r++) {
                    const float *v = vh + r * row + d;
                    v16 wj = splat16(wh[r]);
                    a0 = fma16(wj, load16(v), a0), a1 = fma16(wj, load16(v + 16), a1), a2 = fma16(wj, load16(v + 32), a2), a3 = fma16(wj, load16(v + 48), a3);
                }
                store16(o + d, a0), store16(o + d + 16, a1), store16(o + d + 32, a2), store16(o + d + 48, a3);
            }
#endif
            for (; d + 64 <= D; d += 64) {  /* 64 of the head's outputs stay in eight registers over the rows */
                v8 a0 = load8(o + d), a1 = load8(o + d + 8), a2 = load8(o + d + 16), a3 = load8(o + d + 24);
                v8 a4 = load8(o + d + 32), a5 = load8(o + d + 40), a6 = load8(o + d + 48), a7 = load8(o + d + 56);
                for (int64_t r = 0; r < rows; r++) {
                    const float *v = vh + r * row + d;
                    v8 wj = splat(wh[r]);
                    a0 = fma8(wj, load8(v), a0), a1 = fma8(wj, load8(v + 8), a1), a2 = fma8(wj, load8(v + 16), a2), a3 = fma8(wj, load8(v + 24), a3);
                    a4 = fma8(wj, load8(v + 32), a4), a5 = fma8(wj, load8(v + 40), a5), a6 = fma8(wj, load8(v + 48), a6), a7 = fma8(wj, load8(v + 56), a7);
                }
                store8(o + d, a0), store8(o + d + 8, a1), store8(o + d + 16, a2), store8(o + d + 24, a3);
                store8(o + d + 32, a4), store8(o + d + 40, a5), store8(o + d + 48, a6), store8(o + d + 56, a7);
            }
            for (; d < D; d++)  /* a head size that isn't a multiple of 64: the rest one float at a time */
                for (int64_t r = 0; r < rows; r++) o[d] = fma1(wh[r], vh[r * row + d], o[d]);
        }
    }
    for (int64_t h = 0; h < heads; h++)
        for (int64_t d = 0; d < D; d++) out[h * D + d] /= total[h];
#undef PREFETCH_BLOCK
#undef FIRST_ROW
}

/* ---- A prompt's tokens together: the queries along the vector lanes ----
 *
 * A prefill chunk brings a prompt's tokens as consecutive queries over one block table; each reads the
 * keys the one before it read, plus one. One query at a time, a score is a dot product that ends in a
 * horizontal sum of eight lanes, and those sums (with their shuffles, scaling and stores) cost about as
 * many instructions as the multiply-adds. Here up to TL queries that share a kv head -- the group's
 * query heads for TL / G consecutive tokens -- sit side by side in the lanes (the queries transposed,
 * Qt[d][lane]), and each key is one broadcast per element against all of them: a score matrix product
 * with nothing horizontal left.
 *
 * The summation order stays dot's, so every score, weight and output has the bits the query would get
 * alone (or as a decode): lane l of dot's accumulator is the chain of products of elements l, l+8,
 * l+16, ... and sum8 adds the eight in the tree ((0+4)+(1+5))+((2+6)+(3+7)). Here each of those eight
 * "element classes" is its own vector of partial sums (one lane per query), and the tree adds whole
 * vectors. The softmax keeps its order the same way (the sum of weights in eight classes of key
 * positions, added in sum8's tree), and each output is the chain over key positions in order.
 * Each query's causal length is its own: the keys past it (the later tokens of the tile) are scored
 * for its lane but masked out of its maximum and sum of weights, and its chain of values stops at its
 * own length -- so nothing past it, not even an inf or NaN, reaches its output.
 * tests/test_cpu_attention.py holds every token of a tile to the bits of the same token alone. */
#if defined(__AVX512F__)
#define TL 16
#define NV 4
typedef v16 vt;
typedef v16i vti;
#define LOADT load16
#define STORET store16
#define SPLATT splat16
#define SELECTT select16
#define EXPT exp16_fused
#define FMAT fma16
#else
#define TL 8
#define NV 2
typedef v8 vt;
typedef v8i vti;
#define LOADT load8
#define STORET store8
#define SPLATT splat
#define SELECTT select8
#define EXPT exp8_fused
#define FMAT fma8
#endif

/* up to TL queries of one kv head over one block table: lane i is query q[i], output out[i], causal
 * length len[i] (0 for a lane left empty) */
struct tile {
    int nq;
    const float *q[TL];
    float *out[TL];
    int32_t len[TL];
};

/* floats of workspace a tile over Lmax keys needs: the queries transposed, the scores, the sums */
static inline int64_t tile_workspace(int64_t Lmax, int64_t D) { return TL * (D + Lmax + 1); }

/* the partial sums of element classes c and c + 4 of four keys k0..k3 against the tile's queries: the
 * products of elements c, c+8, c+16, ... in that order (what lane c of dot's accumulator holds for each
 * key) in A, those of c+4, c+12, ... in B -- eight independent chains, enough to keep the multiply-add
 * units busy through each one's latency */
#define CLASSES4(c, A, B)                                                                         \
    do {                                                                                          \
        A[0] = A[1] = A[2] = A[3] = B[0] = B[1] = B[2] = B[3] = (vt){0.f};                        \
        for (int64_t d = (c); d < D; d += 8) {                                                    \
            vt x = LOADT(Qt + d * TL), y = LOADT(Qt + (d + 4) * TL);                              \
            IN_REGISTER(x); IN_REGISTER(y);                                                       \
            A[0] = FMAT(x, SPLATT(k0[d]), A[0]), A[1] = FMAT(x, SPLATT(k1[d]), A[1]), A[2] = FMAT(x, SPLATT(k2[d]), A[2]), A[3] = FMAT(x, SPLATT(k3[d]), A[3]); \
            B[0] = FMAT(y, SPLATT(k0[d + 4]), B[0]), B[1] = FMAT(y, SPLATT(k1[d + 4]), B[1]), B[2] = FMAT(y, SPLATT(k2[d + 4]), B[2]),      \
                B[3] = FMAT(y, SPLATT(k3[d + 4]), B[3]);                                                    \
        }                                                                                         \
    } while (0)

/* the scores of four keys (k0..k3; the same pointer four times for a single key) for every lane, scaled,
 * into s[0..3][lanes]: the eight classes added in sum8's tree, whole vectors at a time */
static inline void score4(const float *Qt, const float *k0, const float *k1, const float *k2, const float *k3,
                          int64_t D, float scale, int nkeys, float *s) {
    vt a[4], b[4], p[4], q[4], t[4];
    CLASSES4(0, a, b);
    for (int i = 0; i < 4; i++) p[i] = a[i] + b[i];
    CLASSES4(1, a, b);
    for (int i = 0; i < 4; i++) p[i] = p[i] + (a[i] + b[i]);
    CLASSES4(2, a, b);
    for (int i = 0; i < 4; i++) t[i] = a[i] + b[i];
    CLASSES4(3, a, b);
    for (int i = 0; i < 4; i++) q[i] = t[i] + (a[i] + b[i]);
    for (int i = 0; i < nkeys; i++) STORET(s + i * TL, (p[i] + q[i]) * SPLATT(scale));
}
#undef CLASSES4

/* ---- The tile's values: out[lane] = sum over its keys j, in order, of w[j][lane] * v[j], / its total ----
 *
 * Four lanes at a time (their weights broadcast from the score rows), NV vectors of the head at a time,
 * in registers over the rows. Each lane's chain stops at its own length, as it does alone: the keys all
 * four lanes see, block by block, then the few (under a tile's tokens) that only the longer ones see,
 * lane by lane -- a weight of zero times a value is not always zero (an inf or NaN there would spread),
 * and +0 would turn a -0. The value vectors of a row are loaded once into registers (IN_REGISTER), not
 * again as a memory operand of each lane's multiply-add (GCC folded them into all four: with four
 * vectors a pass, 16 loads for 16 multiply-adds). */

/* o[l][k] += w[r][l] * v[r][k TL ..] for rows r = 0 .. rows - 1 of v (stride row), in order; w: the
 * block's weights, TL floats a row, the group's first lane at w[0] */
static inline __attribute__((always_inline)) void value_rows(const float *v, int64_t row, int64_t rows, const float *w,
                                                             vt o[4][NV], const int nv) {
    for (int64_t r = 0; r < rows; r++, v += row, w += TL) {
        vt x[NV];
        for (int k = 0; k < nv; k++) { vt y = LOADT(v + k * TL); IN_REGISTER(y); x[k] = y; }
        for (int l = 0; l < 4; l++) {
            vt wl = SPLATT(w[l]);
            for (int k = 0; k < nv; k++) o[l][k] = FMAT(wl, x[k], o[l][k]);
        }
    }
}

/* lanes l0 .. l0 + 3, head elements d .. d + nv TL - 1: the keys past the group's shortest, lane by lane */
static inline __attribute__((always_inline)) void value_tail(const struct tile *t, int l0, int64_t lo, int64_t hi,
                                                             const float *s, const float *v_cache, const int32_t *table,
                                                             int64_t kvh, int64_t row, int64_t block, int64_t block_size,
                                                             int64_t D, int64_t d, vt o[4][NV], const int nv) {
    for (int64_t j = lo; j < hi; j++) {
        const float *v = v_cache + (int64_t)table[j / block_size] * block + j % block_size * row + kvh * D + d;
        for (int l = 0; l < 4 && l0 + l < t->nq; l++)
            if (j < t->len[l0 + l])
                for (int k = 0; k < nv; k++) o[l][k] = FMAT(SPLATT(s[j * TL + l0 + l]), LOADT(v + k * TL), o[l][k]);
    }
}

/* Each lane group and NV vectors of the head a pass of its own, the sums in registers over every row
 * of the context: 16 sums with AVX-512's 32 registers (four lanes x four vectors), 8 with AVX2's 16
 * (four lanes x two: with four vectors two sums were spilled to the stack and carried through it every
 * row). Block by block instead, the sums kept in the output rows between blocks so that a block's rows
 * serve every pass from L1, measured 0.9x this on the Xeon (results/README.md) and no faster on an
 * AVX2 EPYC. */
static void tile_values(const struct tile *t, const float *s, const float *total, const float *v_cache,
                        const int32_t *table, int64_t kvh, int64_t row, int64_t block, int64_t block_size, int64_t D) {
    for (int l0 = 0; l0 < t->nq; l0 += 4) {
        int64_t lo = INT64_MAX, hi = 0;
        for (int l = l0; l < l0 + 4 && l < t->nq; l++) lo = t->len[l] < lo ? t->len[l] : lo, hi = t->len[l] > hi ? t->len[l] : hi;
        for (int64_t d = 0; d < D;) {
            const int nv = d + NV * TL <= D ? NV : 1;
            vt o[4][NV];
            for (int l = 0; l < 4; l++)
                for (int k = 0; k < NV; k++) o[l][k] = (vt){0.f};
            for (int64_t b = 0; b * block_size < lo; b++) {
                const float *vb = v_cache + (int64_t)table[b] * block + kvh * D + d;
                int64_t j0 = b * block_size, rows = lo - j0 < block_size ? lo - j0 : block_size;
                if (nv == NV) value_rows(vb, row, rows, s + j0 * TL + l0, o, NV);
                else value_rows(vb, row, rows, s + j0 * TL + l0, o, 1);
            }
            if (nv == NV) value_tail(t, l0, lo, hi, s, v_cache, table, kvh, row, block, block_size, D, d, o, NV);
            else value_tail(t, l0, lo, hi, s, v_cache, table, kvh, row, block, block_size, D, d, o, 1);
            for (int l = 0; l < 4 && l0 + l < t->nq; l++)
                for (int k = 0; k < nv; k++) STORET(t->out[l0 + l] + d + k * TL, o[l][k] / SPLATT(total[l0 + l]));
            d += nv * TL;
        }
    }
}

/* the tile's attention, keys 0..Lmax-1 of kv head kvh through `table` (every lane's own length is at
 * most Lmax, and its blocks are the first of the table's); w: tile_workspace(Lmax, D) floats */
static void attend_tile(const struct tile *t, int64_t Lmax, const float *k_cache, const float *v_cache,
                        const int32_t *table, int64_t kvh, int64_t num_kv_heads, int64_t D, int64_t block_size,
                        float scale, float *w) {
    const int64_t row = num_kv_heads * D, block = block_size * row, blocks = (Lmax + block_size - 1) / block_size;
    float *Qt = w, *s = w + D * TL, *total = s + Lmax * TL;
    for (int64_t d = 0; d < D; d++)
        for (int l = 0; l < TL; l++) Qt[d * TL + l] = l < t->nq ? t->q[l][d] : 0.f;
    for (int64_t b = 0; b < blocks; b++) {  /* scores: s[j][lane], four keys at a time */
        const float *kb = k_cache + (int64_t)table[b] * block + kvh * D;
        int64_t j0 = b * block_size, rows = Lmax - j0 < block_size ? Lmax - j0 : block_size, r = 0;
        for (; r + 4 <= rows; r += 4)
            score4(Qt, kb + r * row, kb + (r + 1) * row, kb + (r + 2) * row, kb + (r + 3) * row, D, scale, 4,
                   s + (j0 + r) * TL);
        for (; r < rows; r++) {
            const float *k = kb + r * row;
            score4(Qt, k, k, k, k, D, scale, 1, s + (j0 + r) * TL);
        }
    }
    vti len;
    for (int l = 0; l < TL; l++) len[l] = t->len[l];
    vti j = {0};
    vt zero = {0.f}, ninf = SPLATT(-INFINITY), m4[4] = {ninf, ninf, ninf, ninf};
    for (int64_t i = 0; i < Lmax; i++, j += 1) {  /* each lane's maximum over its own keys, in four */
        vt x = SELECTT(j < len, LOADT(s + i * TL), ninf);  /* running maxima (exact in any order) */
        m4[i & 3] = SELECTT(x > m4[i & 3], x, m4[i & 3]);
    }
    vt m = SELECTT(m4[0] > m4[1], m4[0], m4[1]), m23 = SELECTT(m4[2] > m4[3], m4[2], m4[3]);
    m = SELECTT(m > m23, m, m23);
    j = (vti){0};
    vt c[8];  /* the sums of weights by key position mod 8, as the lanes of sum8's accumulator */
    for (int k = 0; k < 8; k++) c[k] = zero;
    int64_t i = 0;
    for (; i + 8 <= Lmax; i += 8, j += 8)  /* eight positions at a time: eight independent exps and sums */
        for (int k = 0; k < 8; k++) {
            vt e = SELECTT(j + k < len, EXPT(LOADT(s + (i + k) * TL) - m), zero);
            STORET(s + (i + k) * TL, e);
            c[k] += e;
        }
    for (int k = 0; i < Lmax; i++, k++, j += 1) {
        vt e = SELECTT(j < len, EXPT(LOADT(s + i * TL) - m), zero);
        STORET(s + i * TL, e);
        c[k] += e;
    }
    STORET(total, ((c[0] + c[4]) + (c[1] + c[5])) + ((c[2] + c[6]) + (c[3] + c[7])));
    tile_values(t, s, total, v_cache, table, kvh, row, block, block_size, D);
}

struct decode_args {
    const float *q, *k_cache, *v_cache;
    const int32_t *block_tables;
    int64_t max_blocks;
    const int32_t *context_lens;
    int64_t num_heads, num_kv_heads, D, block_size;
    float scale;
    float *workspace;
    int64_t workspace_per_thread;
    float *out;
    int64_t per_item;  /* kv heads per work item: all of a sequence's, or one */
    const int64_t *runs;  /* run k is queries runs[k] .. runs[k + 1] - 1 (a prompt's consecutive tokens); NULL: query k */
};

/* run k of queries, kv heads g0..g0 + per_item - 1: a lone query as before (attend), a run of a prompt's
 * tokens as tiles of TL / G tokens (attend_tile) */
static void run_items(void *ctx, int64_t i0, int64_t i1, int tid) {
    const struct decode_args *a = ctx;
    int64_t groups = a->num_kv_heads / a->per_item, G = a->num_heads / a->num_kv_heads;
    float *w = a->workspace + tid * a->workspace_per_thread;
    for (int64_t item = i0; item < i1; item++) {
        int64_t k = item / groups, g0 = item % groups * a->per_item;
        int64_t first = a->runs ? a->runs[k] : k, last = a->runs ? a->runs[k + 1] : k + 1;
        const int32_t *table = a->block_tables + first * a->max_blocks;
        if (last - first == 1) {
            /* the item before it, on this thread, read the same blocks (a prompt's previous token): they
             * are in cache, and asking for them again only costs time */
            int hot = item > i0 && groups == 1 && first > 0 && a->context_lens[first] == a->context_lens[first - 1] + 1 &&
                      table[0] == table[-a->max_blocks];
            attend(a->q + (first * a->num_heads + g0 * G) * a->D, a->k_cache, a->v_cache, table,
                   a->context_lens[first], g0, g0 + a->per_item, G, a->num_kv_heads, a->D, a->block_size, a->scale,
                   !hot, w, a->out + (first * a->num_heads + g0 * G) * a->D);
            continue;
        }
        /* a run's contexts grow by one a query, so its last is the longest: its table holds the blocks
         * every other one's begin with */
        int64_t Lmax = a->context_lens[last - 1];
        table = a->block_tables + (last - 1) * a->max_blocks;
        for (int64_t g = g0; g < g0 + a->per_item; g++) {
            struct tile t = {0};
            for (int64_t i = first; i < last; i++)
                for (int64_t h = g * G; h < (g + 1) * G; h++, t.nq++) {
                    t.q[t.nq] = a->q + (i * a->num_heads + h) * a->D;
                    t.out[t.nq] = a->out + (i * a->num_heads + h) * a->D;
                    t.len[t.nq] = a->context_lens[i];
                }
            attend_tile(&t, Lmax, a->k_cache, a->v_cache, table, g, a->num_kv_heads, a->D, a->block_size, a->scale, w);
        }
    }
}

/* q [n, H, D], caches [num_blocks, block_size, kv_heads, D], block_tables [n, max_blocks] int32,
 * context_lens [n] int32, out [n, H, D]; workspace: threads x workspace_per_thread floats, at least H *
 * (max(context_lens) + 1) each (a lone query's scores and sums), and room for a tile (tile_workspace) for
 * the prompts' runs to be tiled (cpu_attention.workspace_per_thread gives both).
 * Returns 0, or -1 (head counts), or -2 - i when sequence i's context length or block table would
 * read outside the cache: checked before anything is read, so a bad table is an error, not a crash. */
int inflight_paged_decode_f32(const float *q, const float *k_cache, const float *v_cache, int64_t num_blocks,
                              const int32_t *block_tables, int64_t max_blocks, const int32_t *context_lens,
                              int64_t n, int64_t num_heads, int64_t num_kv_heads, int64_t D, int64_t block_size,
                              float scale, float *workspace, int64_t workspace_per_thread, int threads,
                              float *out) {
    int64_t G = num_heads / num_kv_heads;
    if (G < 1 || G > 64 || num_heads % num_kv_heads) return -1;
    /* a lone query's work item may take all its heads: room for H x (L + 1) floats */
    for (int64_t i = 0; i < n; i++) {
        int64_t L = context_lens[i];
        if (L < 1 || L > max_blocks * block_size || (L + 1) * num_heads > workspace_per_thread)
            return (int)(-2 - i);
        for (int64_t b = 0; b < (L + block_size - 1) / block_size; b++) {
            int32_t blk = block_tables[i * max_blocks + b];
            if (blk < 0 || blk >= num_blocks) return (int)(-2 - i);
        }
    }
    /* runs of a prompt's consecutive tokens (each query one position past the one before it, its blocks
     * the same as far as the earlier one reaches), up to a tile's TL / G tokens; a head size in whole
     * vectors and room in the workspace for the tile, else every query is a run of its own */
    int64_t *runs = malloc((size_t)(n + 1) * sizeof *runs), nruns = 0, per_tile = TL / G;
    int tiles = runs && D % TL == 0 && per_tile >= 2;  /* (no memory for the list: one query per run) */
    for (int64_t i = 0; runs && i < n; i++) {
        int64_t start = nruns ? runs[nruns - 1] : -1;
        int join = tiles && i > 0 && i - start < per_tile && context_lens[i] == context_lens[i - 1] + 1 &&
                   tile_workspace(context_lens[i], D) <= workspace_per_thread &&
                   !memcmp(block_tables + i * max_blocks, block_tables + (i - 1) * max_blocks,
                           (size_t)((context_lens[i - 1] + block_size - 1) / block_size) * sizeof(int32_t));
        if (!join) runs[nruns++] = i;
    }
    if (runs) runs[nruns] = n;
    else nruns = n;
    /* whole sequences per work item when there are enough of them to share out (contiguous reads);
     * otherwise one item per (sequence, kv head), so a small batch still keeps every thread busy */
    int64_t per_item = nruns >= 4 * (int64_t)threads ? num_kv_heads : 1;
    struct decode_args a = {q, k_cache, v_cache, block_tables, max_blocks, context_lens, num_heads, num_kv_heads, D,
                            block_size, scale, workspace, workspace_per_thread, out, per_item, runs};
    parallel_for(nruns * (num_kv_heads / per_item), threads, 2, run_items, &a);
    free(runs);
    return 0;
}
