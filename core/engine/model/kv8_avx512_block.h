/* kv8_attention.c's block kernels on AVX512-VNNI: scores by VPDPBUSD on K + 128 (less 128 x sum q), keys across lanes
 * (16 keys' rows transposed in registers for a few rows, a block transposed once into memory for many), the weighted V
 * sums by VPDPWSSD on key pairs (a few rows widen the int8 V rows as they read them, many read a block unpacked once),
 * the softmax steps on 16 lanes, and the segments' merge. Included by kv8_attention.c (after its types), whose drivers
 * and promise (a row's bits the same however its prompt was chunked, cached, decoded or prefilled) kv8_avx2_block.h
 * shares on 8 lanes. */
#include "online_softmax_avx512.h"   /* merge, finish */

/* the most rows that read the int8 rows in place (in groups of RB, each group reading them again from L1); more use
 * the unpacked block. A short prompt chunk beside decodes (2 tokens x G heads: the fairness cap's floor) attended
 * 14 % faster over 5,000 keys in place than unpacked, 4 tokens 2.5 % (30 layers, another 4.5 MB streamed between
 * layers as the weights are) */
#define FEW_MAX (3 * RB)

/* the block's K rows (kslot) transposed to d quads, kt [D/4][BK]: each key's d .. d + 3 as one int32, 16 keys x 16
 * quads at a time in registers. `flip`: as K + 128 (unsigned, VPDPBUSD's side), else as they are (int8: TDPBSSD's) */
static inline void transpose_keys(block8 *b, int D, int flip) {
    const __m512i f = _mm512_set1_epi8(flip ? (char)0x80 : 0);
    for (int j0 = 0; j0 < BK; j0 += 16)
        for (int d = 0; d < D; d += 64) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_xor_si512(_mm512_loadu_si512(b->kslot[j0 + i] + d), f);
            transpose16(r);   /* r[p]: d quad (d + 4p ..) of the 16 keys */
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(b->kt + (int64_t)(d / 4 + p) * BK + j0, r[p]);
        }
}

/* One block of one KV head. Few rows take its keys' rows and scales from unpack_keys' pass (kv8_attention.c) and
 * read the int8 rows in place; many rows (`transposed`) take them from head_keys (kv8_attention.c) and unpack K + 128
 * as uint8 transposed to kt [D/4][BK] and V as key pairs (vp). */
static void unpack_block(const keys8 *kv, int g, int kb, int transposed, block8 *b) {
    const int D = kv->D;
    if (!transposed) {   /* few rows read the int8 rows in place, where unpack_keys found them */
        b->head = g - b->g0;
        return;
    }
    head_keys(kv, g, kb, 0, b);
    transpose_keys(b, D, 1);
    for (int jp = 0; jp < BK / 2; jp++) {
        const int8_t *va = b->vslot[2 * jp], *vb = b->vslot[2 * jp + 1];
        for (int d = 0; d < D; d += 16) {
            const __m512i a = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(va + d)));
            const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(vb + d)));
            _mm512_storeu_si512(b->vp + ((int64_t)jp * D + d) * 2,
                                _mm512_mask_blend_epi16(0xAAAAAAAAu, a, _mm512_slli_epi32(c, 16)));
        }
    }
}

/* R (<= RB) rows' exact scores against the block's first `keys` keys (a multiple of 16) on the int8 K rows in place
 * (a decode step's G query heads read the same keys): 16 keys' rows (64 d of each) flipped to K + 128 and
 * transposed in each 128-bit lane only (transpose4x4: four keys' d quad 4 L + c side by side in lane L), each of
 * those then one VPDPBUSD per row against the row's quads 4 L + c (qq: each quad repeated in its lane), into a sum
 * per row and group of four keys; the four lanes' sums of each key are added once at the end (lane_sums). Each key's
 * row is loaded and shuffled once for the R rows. Against a full transpose (transpose16, then one sum per row and a
 * lane per key) this is 32 shuffles fewer a 16 keys and 6 R more, and each sum a chain of 4 VPDPBUSD instead of 16:
 * a decode row's attention 7-9 % faster in L2 (the shuffles and those chains bounded its scores), the bits the same
 * (integer sums). (K + 128) . q - 128 sum q. */
static inline __attribute__((always_inline)) void dots_rows(const int8_t *const *qi, const int32_t *qsum, const int R,
                                                             const block8 *b, int keys, const int D, int32_t *dots) {
    const int64_t off = (int64_t)b->head * D;   /* the head's rows in each key's slot (unpack_keys) */
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i qq[RB][MAX_D / 16];   /* row r's q quads 4 L + c (+ 16 a 64 d) in 128-bit lane L: [r][d / 16 + c] */
    for (int r = 0; r < R; r++)
        for (int d = 0; d < D; d += 64) {
            const __m512i qz = _mm512_loadu_si512(qi[r] + d);
            qq[r][d / 16 + 0] = _mm512_shuffle_epi32(qz, 0x00);
            qq[r][d / 16 + 1] = _mm512_shuffle_epi32(qz, 0x55);
            qq[r][d / 16 + 2] = _mm512_shuffle_epi32(qz, 0xAA);
            qq[r][d / 16 + 3] = _mm512_shuffle_epi32(qz, 0xFF);
        }
    for (int h = 0; h < keys; h += 16) {
        ask_ahead(b, 8);   /* with one a key pair in values_rows: a block's 192 lines of K (and of V) at head dim 64 */
        __m512i acc[RB][4];
        for (int r = 0; r < R; r++)
            for (int a = 0; a < 4; a++) acc[r][a] = _mm512_setzero_si512();
        for (int d = 0; d < D; d += 64) {
            __m512i t[16];
            for (int i = 0; i < 16; i++)
                t[i] = _mm512_xor_si512(_mm512_loadu_si512(b->kslot[h + i] + off + d), flip);
            transpose4x4(t);   /* t[4 a + c], 128-bit lane L, dword k: key 4 a + k's quad 4 L + c */
            for (int a = 0; a < 4; a++)
                for (int c = 0; c < 4; c++)
                    for (int r = 0; r < R; r++)
                        acc[r][a] = _mm512_dpbusd_epi32(acc[r][a], t[4 * a + c], qq[r][d / 16 + c]);
        }
        for (int r = 0; r < R; r++)   /* the four lanes' sums of each key, keys in order */
            _mm512_storeu_si512(dots + r * BK + h,
                                _mm512_sub_epi32(lane_sums(acc[r]), _mm512_set1_epi32(128 * qsum[r])));
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
    if (D == 64 && rows == 3) dots_rows(qi, qsum, 3, b, keys, 64, dots);
    else if (D == 64 && rows == 4) dots_rows(qi, qsum, 4, b, keys, 64, dots);
    else if (D == 64 && rows == 2) dots_rows(qi, qsum, 2, b, keys, 64, dots);
    else if (D == 64) dots_rows(qi, qsum, 1, b, keys, 64, dots);
    else dots_rows(qi, qsum, rows, b, keys, D, dots);
}

/* four groups' sums at once (dword 4 h of the result: p[h]'s), each added in the pairs _mm512_reduce_add_ps adds
 * (the 256-bit halves, then the 128-bit ones, then dwords 2 apart, then 1): the same bits as four of those, in 13
 * instructions instead of ~32 */
static inline __m512 group_sums(const __m512 p[4]) {
    const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(p[0], p[1], 0xEE), _mm512_shuffle_f32x4(p[0], p[1], 0x44));
    const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(p[2], p[3], 0xEE), _mm512_shuffle_f32x4(p[2], p[3], 0x44));
    const __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0xDD), _mm512_shuffle_f32x4(u01, u23, 0x88));
    const __m512 x = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));   /* dword i + dword i ^ 2 */
    return _mm512_add_ps(x, _mm512_permute_ps(x, 0xB1));              /* dword i + dword i ^ 1 */
}

/* n (<= RB) query rows' softmax steps over a block, from their exact scores dots [RB][BK]: for each row r that sees
 * seen[r] >= 1 keys of it, its running max mx[r] and sum sum[r] updated, and need[r] = 1 with the block's weights
 * rounded to int16 (wq + r BK, zeros past `seen`), their scale ws[r] and the factor corr[r] its output is scaled by
 * first, for block_values and row_output; else (no weight left, or a NaN score or V scale: the row's output NaN, as
 * in fp32) the row's output finished here, need[r] = 0 and zeros in its wq. The rows go phase by phase (scores and
 * max, exp and sums, the scalar step, int16 weights): a row alone is one chain of dependent steps (block max -> exp
 * -> sums -> scale), and side by side the rows' chains overlap; a row's four group sums are reduced together
 * (group_sums). Each row's arithmetic is its own, the same whatever rows share the call. */
__attribute__((noinline, noclone))
static void block_weights(const int32_t *dots, const float *qc, const block8 *b, const int *seen, int n, int D,
                          float *mx, float *sum, float *o, int16_t *wq, float *ws, float *corr, int *need) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), zero = _mm512_setzero_ps();
    const float *ksc = b->kscs + b->head * BK, *vsc = b->vscs + b->head * BK;   /* the head's scales */
    __m512 s[RB][NG], w[RB][NG];
    __mmask16 mk[RB][NG], bad[RB];
    float mnew[RB], total[RB], wmax[RB];
    int groups[RB];
    for (int r = 0; r < n; r++) {   /* scores, the block max */
        if (!seen[r]) continue;
        groups[r] = (seen[r] + 15) / 16;   /* groups past `seen` hold no key: weight 0, no work */
        const __m512 qcv = _mm512_set1_ps(qc[r]);
        __m512 top = ninf;
        bad[r] = 0;
        for (int h = 0; h < NG; h++) {
            const int left = seen[r] - 16 * h;
            mk[r][h] = left >= 16 ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
            if (h >= groups[r]) continue;
            const __m512 d = _mm512_cvtepi32_ps(_mm512_loadu_si512(dots + r * BK + 16 * h));
            s[r][h] = _mm512_mask_mul_ps(ninf, mk[r][h], _mm512_mul_ps(d, qcv), _mm512_loadu_ps(ksc + 16 * h));
            bad[r] |= _mm512_mask_fpclass_ps_mask(mk[r][h], s[r][h], 0x81);
            top = _mm512_max_ps(top, s[r][h]);
        }
        const float bm = _mm512_reduce_max_ps(top);
        mnew[r] = bm > mx[r] ? bm : mx[r];
    }
    for (int r = 0; r < n; r++) {   /* p = exp(s - max), w = p x V scale; the sum of p, the largest w */
        if (!seen[r]) continue;
        const __m512 mv = _mm512_set1_ps(mnew[r]);
        __m512 wtop = zero, p[NG];
        for (int h = 0; h < NG; h++) {
            if (h >= groups[r]) { w[r][h] = p[h] = zero; continue; }
            p[h] = _mm512_maskz_mov_ps(mk[r][h], exp512(_mm512_sub_ps(s[r][h], mv)));
            /* masked: a later key's V scale (NaN for a NaN row) must not reach this row's weights */
            w[r][h] = _mm512_maskz_mul_ps(mk[r][h], p[h], _mm512_loadu_ps(vsc + 16 * h));
            bad[r] |= _mm512_mask_fpclass_ps_mask(mk[r][h], w[r][h], NOT_FINITE);
            wtop = _mm512_max_ps(wtop, w[r][h]);
        }
        const __m512 g = group_sums(p);   /* dword 4 h: group h's sum */
        float t = _mm512_cvtss_f32(g) + _mm_cvtss_f32(_mm512_extractf32x4_ps(g, 1));   /* groups in order (the asm: */
        __asm__("" : "+v"(t));                                   /* GCC, free to reassociate here, would pair them) */
        t += _mm_cvtss_f32(_mm512_extractf32x4_ps(g, 2));
        __asm__("" : "+v"(t));
        total[r] = t + _mm_cvtss_f32(_mm512_extractf32x4_ps(g, 3));
        wmax[r] = _mm512_reduce_max_ps(wtop);
    }
    for (int r = 0; r < n; r++) {   /* the running max, sum and output scale; the weights as int16 */
        int16_t *wr = wq + r * BK;
        need[r] = 0;
        if (!seen[r]) { memset(wr, 0, sizeof(int16_t) * BK); continue; }
        float *orow = o + (int64_t)r * D;
        if (bad[r] || mnew[r] != mnew[r]) {
            if (mx[r] == -INFINITY) mx[r] = 0.f;   /* kept by the merge */
            sum[r] = NAN;
            for (int d = 0; d < D; d++) orow[d] = NAN;
            memset(wr, 0, sizeof(int16_t) * BK);
            continue;
        }
        /* exp512(0) is exactly 1: a block that does not raise the max (most, past the first) skips the exp */
        const float c = mx[r] == -INFINITY ? 0.f : mnew[r] == mx[r] ? 1.f
                      : _mm512_cvtss_f32(exp512(_mm512_set1_ps(mx[r] - mnew[r])));
        sum[r] = sum[r] * c + total[r];
        mx[r] = mnew[r];
        if (!(wmax[r] > 0.f)) {   /* no weight left after the V scales (zero rows): the output scaled only */
            const __m512 cv = _mm512_set1_ps(c);
            for (int d = 0; d < D; d += 16) _mm512_storeu_ps(orow + d, _mm512_mul_ps(_mm512_loadu_ps(orow + d), cv));
            memset(wr, 0, sizeof(int16_t) * BK);
            continue;
        }
        const __m512 inv = _mm512_set1_ps(32767.f / wmax[r]);   /* w x inv <= 32767 (rounding in the order of 1 ulp) */
        for (int h = 0; h < NG; h++)
            _mm256_storeu_si256((__m256i *)(wr + 16 * h), _mm512_cvtsepi32_epi16(_mm512_cvt_roundps_epi32(
                _mm512_mul_ps(w[r][h], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
        ws[r] = wmax[r] / 32767.f;
        corr[r] = c;
        need[r] = 1;
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

/* values_d for R (<= RB) rows on the block's int8 V rows in place, widened and paired as read (each key pair's
 * 64 d once for the R rows: the unpacked copy's stores, and a reload of it for each row, go), R x 4 sums; the
 * pairs' lanes hold d 0-3, 8-11, .. (lo) and 4-7, 12-15, .. (hi) of each 32 d, put in order once at the end */
static inline __attribute__((always_inline)) void values_rows(const int16_t *wq, const int R, const block8 *b,
                                                              int pairs, int D, int32_t *acc) {
    const int64_t off = (int64_t)b->head * D;   /* the head's rows in each key's slot (unpack_keys) */
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int d0 = 0; d0 < D; d0 += 64) {
        __m512i a[RB][4];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < 4; c++) a[r][c] = _mm512_setzero_si512();
        for (int jp = 0; jp < pairs; jp++) {
            ask_ahead(b, 1);
            const int8_t *va = b->vslot[2 * jp] + off + d0, *vb = b->vslot[2 * jp + 1] + off + d0;
            __m512i pv[4];
            for (int h = 0; h < 2; h++) {   /* d0 + 32 h .. + 31 */
                const __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(va + 32 * h)));
                const __m512i y = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(vb + 32 * h)));
                pv[2 * h] = _mm512_unpacklo_epi16(x, y);
                pv[2 * h + 1] = _mm512_unpackhi_epi16(x, y);
            }
            for (int r = 0; r < R; r++) {
                int32_t pair;
                memcpy(&pair, wq + r * BK + 2 * jp, sizeof pair);
                const __m512i bw = _mm512_set1_epi32(pair);
                for (int c = 0; c < 4; c++) a[r][c] = _mm512_dpwssd_epi32(a[r][c], bw, pv[c]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int h = 0; h < 2; h++) {
                int32_t *dst = acc + (int64_t)r * D + d0 + 32 * h;
                _mm512_storeu_si512(dst, _mm512_permutex2var_epi32(a[r][2 * h], first, a[r][2 * h + 1]));
                _mm512_storeu_si512(dst + 16, _mm512_permutex2var_epi32(a[r][2 * h], second, a[r][2 * h + 1]));
            }
    }
}
