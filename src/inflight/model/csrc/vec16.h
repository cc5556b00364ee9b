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
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
static inline v16 load16(const float *p) { v16 x; memcpy(&x, p, sizeof x); return x; }
static inline void store16(float *p, v16 x) { memcpy(p, &x, sizeof x); }
static inline v16 splat16(float a) { return (v16){a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a}; }
static inline v16 select16(v16i mask, v16 a, v16 b) { return (v16)((mask & (v16i)a) | (~mask & (v16i)b)); }

/* exp8 (vec8.h), sixteen lanes at a time: the same constants and the same operations in the same order */
static inline v16 exp16(v16 x) {
    v16i overflow = x > splat16(88.72283935546875f);
    x = select16(x < splat16(88.72283935546875f), x, splat16(88.72283935546875f));
    x = select16(x > splat16(-86.6f), x, splat16(-86.6f));
    v16 fx = x * splat16(1.44269504088896341f) + splat16(0.5f);
    v16i n = __builtin_convertvector(fx, v16i);
    n += (v16i)(__builtin_convertvector(n, v16) > fx);
    v16 fn = __builtin_convertvector(n, v16);
    x = x - fn * splat16(0.693359375f) - fn * splat16(-2.12194440e-4f);
    v16 y = splat16(1.9875691500e-4f);
    y = y * x + splat16(1.3981999507e-3f);
    y = y * x + splat16(8.3334519073e-3f);
    y = y * x + splat16(4.1665795894e-2f);
    y = y * x + splat16(1.6666665459e-1f);
    y = y * x + splat16(5.0000001201e-1f);
    y = y * (x * x) + x + splat16(1.f);
    v16i bits = (n + 126) << 23;
    v16 half_scale;
    memcpy(&half_scale, &bits, sizeof half_scale);
    return select16(overflow, splat16(__builtin_inff()), y * half_scale * splat16(2.f));
}
#endif
#endif
