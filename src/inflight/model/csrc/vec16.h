/* Sixteen floats in one vector register, where the CPU has AVX-512 (-march=native turns __AVX512F__
 * on): the 16-wide forms of vec8.h's operations, for the kernels' widest loops. Every operation here
 * works lane by lane exactly as its 8-wide twin does (exp16 is exp8's arithmetic, step for step), so
 * a result never depends on which width computed it; where lanes are summed, the kernels keep
 * vec8.h's order themselves. Without AVX-512 this header defines nothing and the kernels run their
 * 8-wide code. `c_build` hashes it with every kernel, as it does vec8.h. */
#ifndef INFLIGHT_VEC16_H
#define INFLIGHT_VEC16_H
#include "vec8.h"
#if defined(__AVX512F__)
#include <immintrin.h>
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
static inline v16 load16(const float *p) { v16 x; memcpy(&x, p, sizeof x); return x; }
static inline void store16(float *p, v16 x) { memcpy(p, &x, sizeof x); }
static inline v16 splat16(float a) { return (v16){a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a}; }
static inline v16 select16(v16i mask, v16 a, v16 b) { return (v16)((mask & (v16i)a) | (~mask & (v16i)b)); }

#if INFLIGHT_SHUFFLEVECTOR
#define pick16(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define pick16(a, b, ...) __builtin_shuffle(a, b, (v16i){__VA_ARGS__})
#endif
/* a and b side by side; and the even lanes of p plus its odd lanes (GCC 11's __builtin_shuffle cannot
 * change a vector's width, so these two say it with copies there) */
static inline v16 join2x8(v8 a, v8 b) {
#if INFLIGHT_SHUFFLEVECTOR
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#else
    v16 x;
    memcpy(&x, &a, sizeof a), memcpy((char *)&x + sizeof a, &b, sizeof b);
    return x;
#endif
}
static inline v8 evens_plus_odds(v16 p) {
#if INFLIGHT_SHUFFLEVECTOR
    return __builtin_shufflevector(p, p, 0, 2, 4, 6, 8, 10, 12, 14) + __builtin_shufflevector(p, p, 1, 3, 5, 7, 9, 11, 13, 15);
#else
    v16 t = pick16(p, p, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    v8 evens, odds;
    memcpy(&evens, &t, sizeof evens), memcpy(&odds, (char *)&t + sizeof evens, sizeof odds);
    return evens + odds;
#endif
}

/* fma8 (vec8.h), sixteen lanes at a time, fused exactly where fma8 is: every CPU with AVX-512 has
 * FMA, but a build for AVX-512 without -mfma (not -march=native) has fma8 unfused, and the two widths
 * must round alike */
#if defined(__FMA__)
static inline v16 fma16(v16 a, v16 b, v16 c) { return (v16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
#else
static inline v16 fma16(v16 a, v16 b, v16 c) { return a * b + c; }
#endif

/* exp8 (vec8.h), sixteen lanes at a time: the same body, so the same constants and operations */
static inline v16 madd16(v16 a, v16 b, v16 c) { return a * b + c; }
INFLIGHT_DEFINE_EXP(exp16, v16, v16i, splat16, select16, madd16)
#endif
#endif
