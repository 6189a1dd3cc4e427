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

/* A run of BK keys' scales [BK][KVH] (a slot's heads adjacent) as [KVH][BK] (a head's keys adjacent, as the block
 * kernels load them): 16 keys of a head gathered from KVH loaded vectors by masked permutes, KVH a constant in each
 * of split_scales' cases (the masks and indices then constants; KVH <= 4). */
static inline __attribute__((always_inline)) void split_kvh(const float *ks, const float *vs, float *kscs,
                                                            float *vscs, const int KVH) {
    for (int j0 = 0; j0 < BK; j0 += 16) {
        __m512 kin[4], vin[4];
        for (int t = 0; t < KVH; t++) {
            kin[t] = _mm512_loadu_ps(ks + j0 * KVH + 16 * t);
            vin[t] = _mm512_loadu_ps(vs + j0 * KVH + 16 * t);
        }
        for (int h = 0; h < KVH; h++) {
            __m512 ko = _mm512_setzero_ps(), vo = _mm512_setzero_ps();
            for (int t = 0; t < KVH; t++) {   /* lane i: element i KVH + h of the 16 KVH loaded, in vector t */
                unsigned mask = 0;
                int at[16];
                for (int i = 0; i < 16; i++) {
                    at[i] = (i * KVH + h) & 15;
                    if ((i * KVH + h) >> 4 == t) mask |= 1u << i;
                }
                if (!mask) continue;
                const __m512i idx = _mm512_setr_epi32(at[0], at[1], at[2], at[3], at[4], at[5], at[6], at[7], at[8],
                                                      at[9], at[10], at[11], at[12], at[13], at[14], at[15]);
                ko = _mm512_mask_permutexvar_ps(ko, (__mmask16)mask, idx, kin[t]);
                vo = _mm512_mask_permutexvar_ps(vo, (__mmask16)mask, idx, vin[t]);
            }
            _mm512_storeu_ps(kscs + h * BK + j0, ko);
            _mm512_storeu_ps(vscs + h * BK + j0, vo);
        }
    }
}
