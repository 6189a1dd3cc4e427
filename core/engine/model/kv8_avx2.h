/* kv8_attention.c's row rounding on AVX2 (CPUs without AVX-512: AMD Zen 2 and 3, Intel before Ice Lake): the same
 * rule and bits as its AVX-512 functions (max |x| / 127, x / s rounded to nearest, ties to even), 8 lanes a step.
 * Included by kv8_attention.c; kv8_avx2_block.h holds the block kernels. */
#include <immintrin.h>

/* max |x| over n values (n % 8 == 0), NaN when any is NaN or inf (native_simd.h's abs_max8) */
static inline float abs_max(const float *x, int n) { return abs_max8(x, n); }

/* dst[d] = round(x[d] / s) as int8 (|x| <= 127 s), D % 16 == 0; returns the sum of the values */
static inline int32_t round_to_int8(const float *x, int D, float s, int8_t *dst) {
    const __m256 sv = _mm256_set1_ps(s);
    __m256i total = _mm256_setzero_si256();
    for (int d = 0; d < D; d += 16) {
        const __m256i a = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + d), sv));   /* MXCSR: to even */
        const __m256i b = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + d + 8), sv));
        total = _mm256_add_epi32(total, _mm256_add_epi32(a, b));
        const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
        const __m128i z = _mm_packs_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
        _mm_storeu_si128((__m128i *)(dst + d), _mm_packs_epi16(w, z));
    }
    int32_t lanes[8], sum = 0;
    _mm256_storeu_si256((__m256i *)lanes, total);
    for (int i = 0; i < 8; i++) sum += lanes[i];
    return sum;
}
