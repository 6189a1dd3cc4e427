/* kv8_attention.c's block kernels on AVX512-VNNI: scores by VPDPBUSD on K + 128 (less 128 x sum q), d across
 * lanes for a few rows and keys across lanes (a block transposed once) for many, the weighted V sums by VPDPWSSD on
 * key pairs, the softmax steps on 16 lanes, and the segments' merge. Included by kv8_attention.c (after its types),
 * whose drivers and promise (a row's bits the same however its prompt was chunked, cached, decoded or prefilled)
 * kv8_avx2_block.h shares on 8 lanes. */
#include "online_softmax_avx512.h"   /* merge, finish */

#define FEW_MAX RB   /* the most rows whose scores read K row by row; more use the transposed block */

/* r[i] = the sum of a[i]'s 16 int32 lanes, for 16 vectors at once (exact: any tree gives the same sums) */
static inline __m512i reduce16_epi32(__m512i a[16]) {
    __m512i b[8], c[4];
    for (int k = 0; k < 8; k++)
        b[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * k], a[2 * k + 1]), _mm512_unpackhi_epi32(a[2 * k], a[2 * k + 1]));
    for (int k = 0; k < 4; k++)
        c[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(b[2 * k], b[2 * k + 1]), _mm512_unpackhi_epi64(b[2 * k], b[2 * k + 1]));
    const __m512i d0 = _mm512_add_epi32(_mm512_shuffle_i32x4(c[0], c[1], 0x44), _mm512_shuffle_i32x4(c[0], c[1], 0xEE));
    const __m512i d1 = _mm512_add_epi32(_mm512_shuffle_i32x4(c[2], c[3], 0x44), _mm512_shuffle_i32x4(c[2], c[3], 0xEE));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(d0, d1, 0x88), _mm512_shuffle_i32x4(d0, d1, 0xDD));
}

/* kv8_attention.c's segment() asks for a block's keys for all its heads before their head_block calls (the AVX2
 * build's few rows read each key's slot once there: kv8_avx2_block.h); here each head's unpack_block reads them */
static inline void unpack_keys(const keys8 *kv, int g0, int g1, int kb, int few, block8 *b) {
    (void)kv; (void)g0; (void)g1; (void)kb; (void)few; (void)b;
}

static void unpack_block(const keys8 *kv, int g, int kb, int transposed, block8 *b) {
    const int D = kv->D, j0 = kb * BK, kn = kv->m - j0 < BK ? kv->m - j0 : BK;
    const int jn = j0 + PREFETCH_BLOCKS * BK, kn_next = kv->m - jn < BK ? kv->m - jn : BK;
    const int8_t *vrow[BK];
    for (int j = 0; j < BK; j++) {
        if (j < kn_next) prefetch_key(kv, g, 1, jn + j, (j & 3) == 0);
        uint8_t *ku = b->ku + (int64_t)j * D;
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        if (j < kn) {
            const int64_t row = kv->slots[j0 + j] * kv->KVH + g;
            const int8_t *k8 = kv->k + row * D;
            for (int d = 0; d < D; d += 64)
                _mm512_storeu_si512(ku + d, _mm512_xor_si512(_mm512_loadu_si512(k8 + d), flip));
            b->ksc[j] = kv->ks[row];
            b->vsc[j] = kv->vs[row];
            vrow[j] = kv->v + row * D;
        } else {
            memset(ku, 0x80, (size_t)D);   /* k = 0 */
            b->ksc[j] = b->vsc[j] = 0.f;
            vrow[j] = NULL;
        }
    }
    if (transposed)   /* 16 keys x 16 d quads at a time */
        for (int j0 = 0; j0 < BK; j0 += 16)
            for (int p0 = 0; p0 < D / 4; p0 += 16) {
                __m512i r[16];
                for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(b->ku + (int64_t)(j0 + i) * D + 4 * p0);
                transpose16(r);
                for (int p = 0; p < 16; p++) _mm512_storeu_si512(b->kt + (int64_t)(p0 + p) * BK + j0, r[p]);
            }
    for (int jp = 0; jp < BK / 2; jp++) {
        const int8_t *va = vrow[2 * jp], *vb = vrow[2 * jp + 1];
        for (int d = 0; d < D; d += 16) {
            const __m512i a = va ? _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(va + d))) : _mm512_setzero_si512();
            const __m512i c = vb ? _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(vb + d))) : _mm512_setzero_si512();
            _mm512_storeu_si512(b->vp + ((int64_t)jp * D + d) * 2,
                                _mm512_mask_blend_epi16(0xAAAAAAAAu, a, _mm512_slli_epi32(c, 16)));
        }
    }
}

/* A row's exact scores (int32) against the block's first `keys` keys (a multiple of 16), d across lanes: 16 lanes
 * of sums over D a key, reduced 16 keys at once (a few rows: no transpose to pay for); (K + 128) . q - 128 sum q */
static inline __attribute__((always_inline)) void dots_lanes(const int8_t *qi, int32_t qsum, const block8 *b,
                                                              int keys, const int D, int32_t *dots) {
    __m512i qv[MAX_D / 64];
    for (int d = 0; d < D; d += 64) qv[d / 64] = _mm512_loadu_si512(qi + d);
    const __m512i shift = _mm512_set1_epi32(128 * qsum);
    for (int h = 0; h < keys; h += 16) {
        __m512i part[16];
        for (int i = 0; i < 16; i++) {
            const uint8_t *kr = b->ku + (int64_t)(h + i) * D;
            __m512i a = _mm512_setzero_si512();
            for (int d = 0; d < D; d += 64) a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512(kr + d), qv[d / 64]);
            part[i] = a;
        }
        _mm512_storeu_si512(dots + h, _mm512_sub_epi32(reduce16_epi32(part), shift));
    }
}

/* RB rows' exact scores against the block's 32 keys, keys across lanes (the transposed block, read once for the
 * rows): dots [RB][BK]; a row past `rows` repeats the first (its sums unused) */
static inline __attribute__((always_inline)) void dots_transposed(const int8_t *const *qi, const int32_t *qsum,
                                                                   const block8 *b, const int D, int32_t *dots) {
    __m512i acc[RB][NG];
    for (int r = 0; r < RB; r++)
        for (int h = 0; h < NG; h++) acc[r][h] = _mm512_setzero_si512();
    for (int p = 0; p < D / 4; p++) {
        __m512i k[NG];
        for (int h = 0; h < NG; h++) k[h] = _mm512_loadu_si512(b->kt + (int64_t)p * BK + 16 * h);
        for (int r = 0; r < RB; r++) {
            int32_t quad;
            memcpy(&quad, qi[r] + 4 * p, sizeof quad);
            const __m512i qp = _mm512_set1_epi32(quad);
            for (int h = 0; h < NG; h++) acc[r][h] = _mm512_dpbusd_epi32(acc[r][h], k[h], qp);
        }
    }
    for (int r = 0; r < RB; r++) {
        const __m512i shift = _mm512_set1_epi32(128 * qsum[r]);
        for (int h = 0; h < NG; h++) _mm512_storeu_si512(dots + r * BK + 16 * h, _mm512_sub_epi32(acc[r][h], shift));
    }
}

/* scores for the rows of a segment(): one at a time (d across lanes) or RB at a time (transposed keys); exact
 * integers either way, so the same scores */
__attribute__((noinline, noclone))
static void block_dots(const int8_t *const *qi, const int32_t *qsum, int rows, const block8 *b, int transposed,
                       int keys, int D, int32_t *dots) {
    if (transposed) {
        if (D == 64) dots_transposed(qi, qsum, b, 64, dots);
        else if (D == 128) dots_transposed(qi, qsum, b, 128, dots);
        else dots_transposed(qi, qsum, b, D, dots);
        return;
    }
    for (int r = 0; r < rows; r++) {
        if (D == 64) dots_lanes(qi[r], qsum[r], b, keys, 64, dots + r * BK);
        else if (D == 128) dots_lanes(qi[r], qsum[r], b, keys, 128, dots + r * BK);
        else dots_lanes(qi[r], qsum[r], b, keys, D, dots + r * BK);
    }
}

/* One query row's softmax step over a block, from its exact scores dots [BK], keys 0 .. seen - 1 of it (seen >= 1):
 * its running max and sum updated; returns 1 with the block's weights rounded to int16 (wq [BK], zeros past
 * `seen`), their scale *ws and the factor *corr its output is scaled by first, for block_values and row_output;
 * else (no weight left, or a NaN score or V scale: the row's output NaN, as in fp32) finishes the row's output
 * itself and returns 0. */
__attribute__((noinline, noclone))
static int row_weights(const int32_t *dots, float qc, const block8 *b, int seen, int D, float *mx, float *sum,
                       float *o, int16_t *wq, float *ws, float *corr) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), qcv = _mm512_set1_ps(qc), zero = _mm512_setzero_ps();
    const int groups = (seen + 15) / 16;   /* groups past `seen` hold no key: weight 0, no work */
    __mmask16 mk[NG];
    __m512 s[NG], p[NG], w[NG];
    __mmask16 bad = 0;
    __m512 top = ninf;
    for (int h = 0; h < NG; h++) {
        const int left = seen - 16 * h;
        mk[h] = left >= 16 ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
        if (h >= groups) continue;
        s[h] = _mm512_mask_mul_ps(ninf, mk[h], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(dots + 16 * h)), qcv),
                                  _mm512_loadu_ps(b->ksc + 16 * h));
        bad |= _mm512_mask_fpclass_ps_mask(mk[h], s[h], 0x81);
        top = _mm512_max_ps(top, s[h]);
    }
    const float bm = _mm512_reduce_max_ps(top);
    const float mnew = bm > *mx ? bm : *mx;
    const __m512 mv = _mm512_set1_ps(mnew);
    __m512 wtop = zero;
    for (int h = 0; h < NG; h++) {
        if (h >= groups) { p[h] = w[h] = zero; continue; }
        p[h] = _mm512_maskz_mov_ps(mk[h], exp512(_mm512_sub_ps(s[h], mv)));
        /* masked: a later key's V scale (NaN for a NaN row) must not reach this row's weights */
        w[h] = _mm512_maskz_mul_ps(mk[h], p[h], _mm512_loadu_ps(b->vsc + 16 * h));
        bad |= _mm512_mask_fpclass_ps_mask(mk[h], w[h], NOT_FINITE);
        wtop = _mm512_max_ps(wtop, w[h]);
    }
    if (bad || mnew != mnew) {
        if (*mx == -INFINITY) *mx = 0.f;   /* kept by the merge */
        *sum = NAN;
        for (int d = 0; d < D; d++) o[d] = NAN;
        return 0;
    }
    /* exp512(0) is exactly 1: a block that does not raise the max (most, past the first) skips the exp */
    const float c = *mx == -INFINITY ? 0.f : mnew == *mx ? 1.f : _mm512_cvtss_f32(exp512(_mm512_set1_ps(*mx - mnew)));
    float total = 0.f;
    for (int h = 0; h < groups; h++) total += _mm512_reduce_add_ps(p[h]);   /* groups in order */
    *sum = *sum * c + total;
    *mx = mnew;
    const float wmax = _mm512_reduce_max_ps(wtop);
    if (!(wmax > 0.f)) {   /* no weight left after the V scales (zero rows): the output scaled only */
        const __m512 cv = _mm512_set1_ps(c);
        for (int d = 0; d < D; d += 16) _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), cv));
        return 0;
    }
    const __m512 inv = _mm512_set1_ps(32767.f / wmax);   /* w x inv <= 32767 (rounding in the order of 1 ulp) */
    for (int h = 0; h < NG; h++)
        _mm256_storeu_si256((__m256i *)(wq + 16 * h), _mm512_cvtsepi32_epi16(_mm512_cvt_roundps_epi32(
            _mm512_mul_ps(w[h], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    *ws = wmax / 32767.f;
    *corr = c;
    return 1;
}

/* n (<= RB) rows' softmax steps over a block, kv8_avx2_block.h's block_weights contract: row_weights for each row
 * that sees a key of it, zeros in wq for a row without weights (adds nothing to the V sums) */
static void block_weights(const int32_t *dots, const float *qc, const block8 *b, const int *seen, int n, int D,
                          float *mx, float *sum, float *o, int16_t *wq, float *ws, float *corr, int *need) {
    for (int r = 0; r < n; r++) {
        need[r] = seen[r] && row_weights(dots + r * BK, qc[r], b, seen[r], D, &mx[r], &sum[r], o + (int64_t)r * D,
                                         wq + r * BK, &ws[r], &corr[r]);
        if (!need[r]) memset(wq + r * BK, 0, sizeof(int16_t) * BK);
    }
}

/* One row's block output into o [D]: o x corr + (the exact weighted sum acc) x ws */
__attribute__((noinline, noclone))
static void row_output(const int32_t *acc, float ws, float corr, int D, float *o) {
    const __m512 wsv = _mm512_set1_ps(ws), cv = _mm512_set1_ps(corr);
    for (int d = 0; d < D; d += 16)
        _mm512_storeu_ps(o + d, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(acc + d)), wsv,
                                                _mm512_mul_ps(_mm512_loadu_ps(o + d), cv)));
}

/* acc [R][D] = exact sums over the block's first `pairs` key pairs of wq [R][BK] x V, for R rows (RB together: the
 * V pairs loaded once for them, 16 independent sums; else a row at a time) */
static inline __attribute__((always_inline)) void values_d(const int16_t *wq, int R, const block8 *b, int pairs,
                                                           const int D, int32_t *acc) {
    for (int d0 = 0; d0 < D; d0 += 64) {   /* D % 64 == 0 */
        if (R == RB) {
            __m512i a[RB][4];
            for (int r = 0; r < RB; r++)
                for (int c = 0; c < 4; c++) a[r][c] = _mm512_setzero_si512();
            for (int jp = 0; jp < pairs; jp++) {
                const int16_t *vp = b->vp + ((int64_t)jp * D + d0) * 2;
                const __m512i v0 = _mm512_loadu_si512(vp), v1 = _mm512_loadu_si512(vp + 32);
                const __m512i v2 = _mm512_loadu_si512(vp + 64), v3 = _mm512_loadu_si512(vp + 96);
                for (int r = 0; r < RB; r++) {
                    int32_t pair;
                    memcpy(&pair, wq + r * BK + 2 * jp, sizeof pair);
                    const __m512i bw = _mm512_set1_epi32(pair);
                    a[r][0] = _mm512_dpwssd_epi32(a[r][0], bw, v0);
                    a[r][1] = _mm512_dpwssd_epi32(a[r][1], bw, v1);
                    a[r][2] = _mm512_dpwssd_epi32(a[r][2], bw, v2);
                    a[r][3] = _mm512_dpwssd_epi32(a[r][3], bw, v3);
                }
            }
            for (int r = 0; r < RB; r++)
                for (int c = 0; c < 4; c++) _mm512_storeu_si512(acc + (int64_t)r * D + d0 + 16 * c, a[r][c]);
            continue;
        }
        for (int r = 0; r < R; r++) {
            __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
            for (int jp = 0; jp < pairs; jp++) {
                int32_t pair;
                memcpy(&pair, wq + r * BK + 2 * jp, sizeof pair);
                const __m512i bw = _mm512_set1_epi32(pair);
                const int16_t *vp = b->vp + ((int64_t)jp * D + d0) * 2;
                for (int c = 0; c < 4; c++) a[c] = _mm512_dpwssd_epi32(a[c], bw, _mm512_loadu_si512(vp + 32 * c));
            }
            for (int c = 0; c < 4; c++) _mm512_storeu_si512(acc + (int64_t)r * D + d0 + 16 * c, a[c]);
        }
    }
}

static void block_values(const int16_t *wq, int R, const block8 *b, int transposed, int pairs, int D, int32_t *acc) {
    (void)transposed;   /* the AVX2 build's few rows read V in place; here V is always unpacked */
    if (D == 64) values_d(wq, R, b, pairs, 64, acc);
    else if (D == 128) values_d(wq, R, b, pairs, 128, acc);
    else values_d(wq, R, b, pairs, D, acc);
}
