/* The online softmax's segment merge on 16 lanes, shared by kv8_attention.c and fma_attention.c on AVX-512 (their
 * AVX-512 headers include it; online_softmax_avx2.h is the 8-lane one). Each translation unit gets its own single
 * compiled merge and finish (noinline: the module's flags let the compiler reassociate, and two inlined copies
 * could round apart). */
#include "native_simd.h"   /* exp512 */

/* a row's segment (mx, sum, o) into its running total (amx, asum, ao), segments in key order */
__attribute__((noinline, noclone))
static void merge(float *amx, float *asum, float *ao, float mx, float sum, const float *o, int D) {
    if (mx == -INFINITY) return;
    const float top = mx > *amx ? mx : *amx;
    const float a = *amx == -INFINITY ? 0.f : _mm512_cvtss_f32(exp512(_mm512_set1_ps(*amx - top)));
    const float c = _mm512_cvtss_f32(exp512(_mm512_set1_ps(mx - top)));
    const __m512 av = _mm512_set1_ps(a), cv = _mm512_set1_ps(c);
    for (int d = 0; d < D; d += 16)
        _mm512_storeu_ps(ao + d, _mm512_fmadd_ps(_mm512_loadu_ps(ao + d), av, _mm512_mul_ps(_mm512_loadu_ps(o + d), cv)));
    *asum = *asum * a + sum * c;
    *amx = top;
}

__attribute__((noinline, noclone))
static void finish(const float *ao, float asum, float *dst, int D) {
    const __m512 inv = _mm512_set1_ps(1.f / asum);
    for (int d = 0; d < D; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_loadu_ps(ao + d), inv));
}
