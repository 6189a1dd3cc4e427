/* kv8_attention.c's row rounding on AVX512-VNNI CPUs (Intel from Ice Lake, AMD from Zen 4): max |x| / 127 and
 * x / s rounded to nearest, ties to even, 16 lanes a step. Included by kv8_attention.c; kv8_avx512_block.h holds the
 * block kernels, kv8_avx2.h the same rule on 8 lanes. */

/* max |x| over n values (n % 16 == 0), NaN when any is NaN or inf */
static inline float abs_max(const float *x, int n) {
    __m512 a = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int d = 0; d < n; d += 16) {
        const __m512 v = _mm512_loadu_ps(x + d);
        bad |= _mm512_fpclass_ps_mask(v, NOT_FINITE);
        a = _mm512_max_ps(a, _mm512_abs_ps(v));
    }
    return bad ? NAN : _mm512_reduce_max_ps(a);
}

/* x / s rounded to nearest (ties to even), 16 at a time as int32 */
static inline __m512i round_div(__m512 x, __m512 s) {
    return _mm512_cvt_roundps_epi32(_mm512_div_ps(x, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* dst[d] = round(x[d] / s) as int8 (|x| <= 127 s), D % 16 == 0; returns the sum of the values */
static inline int32_t round_to_int8(const float *x, int D, float s, int8_t *dst) {
    const __m512 sv = _mm512_set1_ps(s);
    __m512i total = _mm512_setzero_si512();
    for (int d = 0; d < D; d += 16) {
        const __m512i v = round_div(_mm512_loadu_ps(x + d), sv);
        total = _mm512_add_epi32(total, v);
        _mm_storeu_si128((__m128i *)(dst + d), _mm512_cvtsepi32_epi8(v));
    }
    return _mm512_reduce_add_epi32(total);
}
