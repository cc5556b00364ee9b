/* Eight floats in one vector register, and the few operations on them the kernels share.
 *
 * GCC/Clang vector extensions: AVX on x86, NEON on ARM, plain scalar code elsewhere. Loads and stores
 * go through memcpy, which compiles to one unaligned vector load or store. Included by the kernels in
 * this folder; `c_build` hashes it with each of them, so editing it rebuilds them all.
 */
#ifndef INFLIGHT_VEC8_H
#define INFLIGHT_VEC8_H
#include <stdint.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
static inline v8 load8(const float *p) { v8 x; memcpy(&x, p, sizeof x); return x; }
/* the first n < 8 floats at p, the other lanes zero: a row's tail through the same vector code */
static inline v8 load_tail(const float *p, int64_t n) { v8 x = {0.f}; memcpy(&x, p, (size_t)n * sizeof(float)); return x; }
static inline void store8(float *p, v8 x) { memcpy(p, &x, sizeof x); }
static inline v8 splat(float a) { return (v8){a, a, a, a, a, a, a, a}; }
/* lanes of a where the mask (all ones or all zeros per lane, as comparisons give) is set, else b */
static inline v8 select8(v8i mask, v8 a, v8 b) { return (v8)((mask & (v8i)a) | (~mask & (v8i)b)); }
/* the eight lanes added in one fixed order, the same for every call */
static inline float sum8(v8 a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }

/* exp of eight finite floats, Cephes' single-precision method (within about 2 units in the last
 * place): x = n ln2 + r with |r| <= ln2 / 2, a degree-6 polynomial for e^r, and 2^n built in the
 * exponent bits (as 2^(n-1) * 2, so that n = 128 still has an exponent). Past expf's overflow point
 * the answer is infinity, as torch's is; below -86.6 it is about 1e-38 rather than a subnormal (silu
 * adds it to 1; a softmax weight that small is nothing next to the largest, which is 1). */
static inline v8 exp8(v8 x) {
    v8i overflow = x > splat(88.72283935546875f);
    x = select8(x < splat(88.72283935546875f), x, splat(88.72283935546875f));
    x = select8(x > splat(-86.6f), x, splat(-86.6f));
    v8 fx = x * splat(1.44269504088896341f) + splat(0.5f);
    v8i n = __builtin_convertvector(fx, v8i);            /* truncates towards zero ... */
    n += (v8i)(__builtin_convertvector(n, v8) > fx);    /* ... so step down where fx < 0: floor */
    v8 fn = __builtin_convertvector(n, v8);
    x = x - fn * splat(0.693359375f) - fn * splat(-2.12194440e-4f);
    v8 y = splat(1.9875691500e-4f);
    y = y * x + splat(1.3981999507e-3f);
    y = y * x + splat(8.3334519073e-3f);
    y = y * x + splat(4.1665795894e-2f);
    y = y * x + splat(1.6666665459e-1f);
    y = y * x + splat(5.0000001201e-1f);
    y = y * (x * x) + x + splat(1.f);
    v8i bits = (n + 126) << 23;
    v8 half_scale;
    memcpy(&half_scale, &bits, sizeof half_scale);
    return select8(overflow, splat(__builtin_inff()), y * half_scale * splat(2.f));
}

#endif
