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

/* A run of BK keys' scales [BK][KVH] as [KVH][BK] (kv8_avx512.h's split_kvh on 8 lanes: 8 keys of a head gathered
 * from KVH loaded vectors by permutes and blends, KVH a constant in each of split_scales' cases; KVH <= 4) */
static inline __attribute__((always_inline)) void split_kvh(const float *ks, const float *vs, float *kscs,
                                                            float *vscs, const int KVH) {
    for (int j0 = 0; j0 < BK; j0 += 8) {
        __m256 kin[4], vin[4];
        for (int t = 0; t < KVH; t++) {
            kin[t] = _mm256_loadu_ps(ks + j0 * KVH + 8 * t);
            vin[t] = _mm256_loadu_ps(vs + j0 * KVH + 8 * t);
        }
        for (int h = 0; h < KVH; h++) {
            __m256 ko = _mm256_setzero_ps(), vo = _mm256_setzero_ps();
            for (int t = 0; t < KVH; t++) {   /* lane i: element i KVH + h of the 8 KVH loaded, in vector t */
                int at[8], take[8], any = 0;
                for (int i = 0; i < 8; i++) {
                    at[i] = (i * KVH + h) & 7;
                    take[i] = (i * KVH + h) >> 3 == t ? -1 : 0;
                    any |= take[i];
                }
                if (!any) continue;
                const __m256i idx = _mm256_setr_epi32(at[0], at[1], at[2], at[3], at[4], at[5], at[6], at[7]);
                const __m256 sel = _mm256_castsi256_ps(_mm256_setr_epi32(take[0], take[1], take[2], take[3], take[4],
                                                                         take[5], take[6], take[7]));
                ko = _mm256_blendv_ps(ko, _mm256_permutevar8x32_ps(kin[t], idx), sel);
                vo = _mm256_blendv_ps(vo, _mm256_permutevar8x32_ps(vin[t], idx), sel);
            }
            _mm256_storeu_ps(kscs + h * BK + j0, ko);
            _mm256_storeu_ps(vscs + h * BK + j0, vo);
        }
    }
}
