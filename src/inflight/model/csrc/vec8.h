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
/* a * b + c, written out. Where the CPU fuses a multiply and an add into one rounding (x86's FMA,
 * every aarch64 core), it is one fused multiply-add; elsewhere a product rounded, then a sum. The
 * kernels that promise a result independent of its batch (the attention kernel, the skinny GEMM) say
 * every multiply-add with these and are built with -ffp-contract=off: left to itself, GCC fuses
 * `a += x * y` in some copies of a loop and not in others (inlined twice, or unrolled), and then a
 * token's output depends on which path computed it -- a unit in the last place, but not its bits. */
#if defined(__FMA__) && defined(__AVX__)
#include <immintrin.h>
static inline v8 fma8(v8 a, v8 b, v8 c) { return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
static inline float fma1(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
#elif defined(__aarch64__)
static inline v8 fma8(v8 a, v8 b, v8 c) {
    v8 r;
    for (int i = 0; i < 8; i++) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
    return r;
}
static inline float fma1(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
#else
static inline v8 fma8(v8 a, v8 b, v8 c) { return a * b + c; }
static inline float fma1(float a, float b, float c) { return a * b + c; }
#endif
/* lanes picked from two vectors by index (0-7 a's, 8-15 b's). __builtin_shufflevector is clang's and
 * GCC's from 12 on; GCC 11 (Ubuntu 22.04's, so Colab's) has only __builtin_shuffle, which takes the
 * indices as a vector of the result's width. (vec16.h's pick16 is the same at 16 lanes.) Before, the
 * attention kernel did not build with GCC 11, and Colab ran the torch reference instead. The tests
 * build GCC 11's form with any compiler (-DINFLIGHT_NO_SHUFFLEVECTOR) and hold it to the same bits. */
#if !defined(INFLIGHT_NO_SHUFFLEVECTOR) && (defined(__clang__) || __GNUC__ >= 12)
#define INFLIGHT_SHUFFLEVECTOR 1
#define pick8(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define INFLIGHT_SHUFFLEVECTOR 0
#define pick8(a, b, ...) __builtin_shuffle(a, b, (v8i){__VA_ARGS__})
#endif
/* x, as a register the compiler must keep: an empty asm that "changes" it. GCC otherwise folds a
 * vector it loaded once into every multiply-add that uses it, as a memory operand -- free in its cost
 * model, but each is one more load, and a loop of loads and multiply-adds then waits on the loads.
 * Only on x86-64 with AVX, where a v8 is one ymm register (a v16, built only with AVX-512, one zmm):
 * without AVX a v8 is two xmm registers and "+v" is an impossible constraint (a build error), and
 * elsewhere there is no memory operand to fold into, so it is a no-op. The value is untouched and no
 * instruction is emitted: no result changes. */
#if defined(__x86_64__) && defined(__AVX__)
#define IN_REGISTER(x) __asm__("" : "+v"(x))
#else
#define IN_REGISTER(x) ((void)0)
#endif
/* the eight lanes added in one fixed order, the same for every call */
static inline float sum8(v8 a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }

/* exp of eight finite floats, Cephes' single-precision method (within about 2 units in the last
 * place): x = n ln2 + r with |r| <= ln2 / 2, a degree-6 polynomial for e^r, and 2^n built in the
 * exponent bits (as 2^(n-1) * 2, so that n = 128 still has an exponent). Past expf's overflow point
 * the answer is infinity, as torch's is; below -86.6 it is about 1e-38 rather than a subnormal (silu
 * adds it to 1; a softmax weight that small is nothing next to the largest, which is 1). */
/* (one body for every vector width: vec16.h makes exp16 from it, the same operations lane for lane.
 * MADD(a, b, c) is each step's a * b + c: madd8 / madd16, a product rounded then a sum, for SwiGLU's
 * pass (layer_ops.c), whose SiLU keeps torch's bits; fma8 / fma16 for the attention kernel's softmax.) */
#define INFLIGHT_DEFINE_EXP(NAME, V, VI, SPLAT, SELECT, MADD)                                        \
    static inline V NAME(V x) {                                                                      \
        VI overflow = x > SPLAT(88.72283935546875f);                                                 \
        x = SELECT(x < SPLAT(88.72283935546875f), x, SPLAT(88.72283935546875f));                     \
        x = SELECT(x > SPLAT(-86.6f), x, SPLAT(-86.6f));                                             \
        V fx = MADD(x, SPLAT(1.44269504088896341f), SPLAT(0.5f));                                     \
        VI n = __builtin_convertvector(fx, VI);            /* truncates towards zero ... */          \
        n += (VI)(__builtin_convertvector(n, V) > fx);     /* ... so step down where fx < 0: floor */ \
        V fn = __builtin_convertvector(n, V);                                                        \
        x = MADD(fn, SPLAT(2.12194440e-4f), MADD(fn, SPLAT(-0.693359375f), x));  /* x - fn c1 - fn c2 */ \
        V y = SPLAT(1.9875691500e-4f);                                                               \
        y = MADD(y, x, SPLAT(1.3981999507e-3f));                                                     \
        y = MADD(y, x, SPLAT(8.3334519073e-3f));                                                     \
        y = MADD(y, x, SPLAT(4.1665795894e-2f));                                                     \
        y = MADD(y, x, SPLAT(1.6666665459e-1f));                                                     \
        y = MADD(y, x, SPLAT(5.0000001201e-1f));                                                     \
        y = MADD(y, x * x, x) + SPLAT(1.f);                                                          \
        VI bits = (n + 126) << 23;                                                                   \
        V half_scale;                                                                                \
        memcpy(&half_scale, &bits, sizeof half_scale);                                               \
        return SELECT(overflow, SPLAT(__builtin_inff()), y * half_scale * SPLAT(2.f));               \
    }
static inline v8 madd8(v8 a, v8 b, v8 c) { return a * b + c; }
INFLIGHT_DEFINE_EXP(exp8, v8, v8i, splat, select8, madd8)

#endif
