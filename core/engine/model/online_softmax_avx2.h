/* The online softmax's 8-lane steps that kv8_attention.c and fma_attention.c share on AVX2 (CPUs without AVX-512):
 * lane masks, one-value exp and horizontal sums, and merging a row's segments in key order. Included by their AVX2
 * headers (kv8_avx2_block.h, fma_avx2.h); each translation unit gets its own single compiled merge and finish
 * (noinline: the module's flags let the compiler reassociate, and two inlined copies could round apart). */
#include "native_simd.h"   /* exp256, hmax8 */

static inline float exp1(float x) { return _mm256_cvtss_f32(exp256(_mm256_set1_ps(x))); }

static inline float hsum8(__m256 a) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

/* lanes of a group whose keys are seen: lane i < left, as a float mask */
static inline __m256 lanes_below(int left) {
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

/* a row's segment (mx, sum, o) into its running total (amx, asum, ao), segments in key order */
__attribute__((noinline, noclone))
static void merge(float *amx, float *asum, float *ao, float mx, float sum, const float *o, int D) {
    if (mx == -INFINITY) return;   /* the segment showed the row nothing */
    const float top = mx > *amx ? mx : *amx;
    const float a = *amx == -INFINITY ? 0.f : exp1(*amx - top);
    const float c = exp1(mx - top);
    const __m256 av = _mm256_set1_ps(a), cv = _mm256_set1_ps(c);
    for (int d = 0; d < D; d += 8)
        _mm256_storeu_ps(ao + d, _mm256_fmadd_ps(_mm256_loadu_ps(ao + d), av, _mm256_mul_ps(_mm256_loadu_ps(o + d), cv)));
    *asum = *asum * a + sum * c;
    *amx = top;
}

__attribute__((noinline, noclone))
static void finish(const float *ao, float asum, float *dst, int D) {
    const __m256 inv = _mm256_set1_ps(1.f / asum);
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_loadu_ps(ao + d), inv));
}
