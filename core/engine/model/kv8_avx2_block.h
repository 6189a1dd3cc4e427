/* kv8_attention.c's block kernels on AVX2: the same integer sums as its AVX-512 ones, on 8 lanes. Included by
 * kv8_attention.c (after its types) where the kernels are built without AVX-512.
 *
 * Why: on a CPU with AVX2 only (AMD Zen 3 here) a decode step at 4,096 tokens of context read 189 MB of fp32 K/V at
 * ~14 GB/s, the DRAM's pace: 0.40x the tok/s at 128. int8 rows are 3.8x fewer bytes. Without VPDPBUSD a score is
 * the sum over D of k x q with both widened to int16 (VPMADDWD, 16 products an instruction, pairs summed in
 * int32), exact as the AVX-512 sum (K + 128) . q - 128 sum q is; the weighted V sums are VPMADDWD on key pairs,
 * VPDPWSSD's sums. For many rows (a prompt's chunk) K is unpacked once a block as int16 d pairs, transposed to
 * [D/2][BK] (a row's (q_d, q_d+1) broadcast against 16 keys' pairs: no horizontal sums; a 2,048-token chunk's
 * attention ~16 % faster than on K as [BK][D] with each key's lanes reduced), and V as key pairs (2 bytes a value:
 * the buffer's ku and vp halves); for few (up to FEW_MAX: a decode step's G query heads, a short chunk's tokens x
 * G) the int8 rows are widened as they are read instead, RB rows at a time (the unpacked copy's stores and reloads
 * cost more than widening again: decode attention at 4,096 tokens ~18 % faster), each key's K row once for the RB
 * rows, its lanes reduced as they are summed (another ~7-12 %). The integer sums are the same either way. Every
 * fp32 step (softmax, output update, segment merge) runs in one compiled function, so a row's result is the same
 * bits however its prompt was chunked, cached, decoded or prefilled (kv8_attention.c's promise), on this build. */

#include "online_softmax_avx2.h"   /* exp1, hsum8, lanes_below, merge, finish */

#define NG8 (BK / 8)   /* 8-key groups a block */
/* the most rows that read the int8 rows in place (in groups of RB, each group widening them again): a short prompt
 * chunk beside decodes (2-4 tokens x G heads) attended ~8-26 % faster over 5,000 keys than with the transposed
 * copy; at 18 rows the two were even */
#define FEW_MAX (3 * RB)

/* r[i][k] becomes r[k][i]: an 8 x 8 transpose of int32 lanes (8 keys' d pairs -> each d pair's 8 keys) */
static inline void transpose8_epi32(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}

/* One block of one KV head: each key's K and V rows and scales (zrow, scales 0, past the last key). Few rows take
 * them from unpack_keys' pass; many rows (`transposed`, the AVX-512 name) from head_keys (both in kv8_attention.c),
 * and unpack K widened to int16 d pairs [D/2][BK] (in ku's bytes) and V as key pairs (vp). */
static void unpack_block(const keys8 *kv, int g, int kb, int transposed, block8 *b) {
    const int D = kv->D;
    if (!transposed) {   /* few rows read the int8 rows in place, where unpack_keys found them */
        b->head = g - b->g0;
        return;
    }
    head_keys(kv, g, kb, 1, b);   /* V's rows into L1, as unpack_keys asks */
    int32_t *kp = (int32_t *)b->ku;
    for (int j0 = 0; j0 < BK; j0 += 8)
        for (int d = 0; d < D; d += 16) {   /* 8 keys x 8 d pairs, transposed: kp[pair][key] */
            __m256i r[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b->kslot[j0 + i] + d)));
            transpose8_epi32(r);
            for (int i = 0; i < 8; i++) _mm256_storeu_si256((__m256i *)(kp + (int64_t)(d / 2 + i) * BK + j0), r[i]);
        }
    for (int jp = 0; jp < BK / 2; jp++) {
        const int8_t *va = b->vslot[2 * jp], *vb = b->vslot[2 * jp + 1];
        int16_t *dst = b->vp + (int64_t)jp * D * 2;
        for (int d = 0; d < D; d += 16) {   /* 16 values of each key, interleaved to pairs (a_d, b_d), d .. d + 15 */
            const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(va + d)));
            const __m256i c = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(vb + d)));
            const __m256i lo = _mm256_unpacklo_epi16(a, c), hi = _mm256_unpackhi_epi16(a, c);
            _mm256_storeu_si256((__m256i *)(dst + 2 * d), _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(dst + 2 * d + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
        }
    }
}

/* R (<= RB) rows' exact scores against the block's first `keys` keys (a multiple of 4), two keys at a time: each
 * key's int8 K row widened once for all R rows (a decode step's G query heads read the same keys), each q chunk read
 * once for both keys, each row's sum one chain of adds (the empty asm: GCC otherwise summed the products as a tree,
 * every product live at once, and spilled them to the stack: a 4,096-key decode 5-8 % slower), the two keys' lanes
 * folded by VPHADDD, then four keys' */
static inline __attribute__((always_inline)) void dots_rows(const int8_t *const *qi, const int R, const block8 *b,
                                                             int keys, const int D, int32_t *dots) {
    const int64_t off = (int64_t)b->head * D;   /* the head's rows in each key's slot (unpack_keys) */
    __m256i qv[RB][MAX_D / 16];
    for (int r = 0; r < R; r++)
        for (int d = 0; d < D; d += 16) qv[r][d / 16] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qi[r] + d)));
    for (int h = 0; h < keys; h += 4) {
        ask_ahead(b, 2);   /* with one a key pair in values_rows: a block's 192 lines of K (and of V) at head dim 64 */
        __m256i t[2][RB];
        for (int p2 = 0; p2 < 2; p2++) {
            const int8_t *k0p = b->kslot[h + 2 * p2] + off, *k1p = b->kslot[h + 2 * p2 + 1] + off;
            __m256i a0[RB], a1[RB];
            for (int d = 0; d < D; d += 16) {
                const __m256i k0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k0p + d)));
                const __m256i k1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k1p + d)));
                for (int r = 0; r < R; r++) {
                    const __m256i q = _mm256_load_si256(&qv[r][d / 16]);
                    if (d == 0) {
                        a0[r] = _mm256_madd_epi16(k0, q);
                        a1[r] = _mm256_madd_epi16(k1, q);
                    } else {
                        a0[r] = _mm256_add_epi32(a0[r], _mm256_madd_epi16(k0, q));
                        a1[r] = _mm256_add_epi32(a1[r], _mm256_madd_epi16(k1, q));
                    }
                    __asm__("" : "+x"(a0[r]), "+x"(a1[r]));   /* one chain a sum (above) */
                }
            }
            for (int r = 0; r < R; r++) t[p2][r] = _mm256_hadd_epi32(a0[r], a1[r]);
        }
        for (int r = 0; r < R; r++) {
            const __m256i u = _mm256_hadd_epi32(t[0][r], t[1][r]);   /* keys h .. h + 3, each in both halves */
            _mm_storeu_si128((__m128i *)(dots + r * BK + h),
                             _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)));
        }
    }
}

/* RB rows' exact scores against the block's first `keys` keys (a multiple of 16) on the transposed key pairs: per d
 * pair, each row's (q_d, q_d+1) broadcast times 16 keys' pairs, so a lane sums one key and no reduction is left.
 * The 16 keys' pairs are loaded into registers once for the RB rows, and each product is added into its sum in
 * place (asm): as written in C, GCC read them from memory again for every row (eight 32-byte loads where two do,
 * on a CPU that loads two a cycle: a 512-token chunk over 4,096 keys' attention 6-8 % slower) and copied each
 * sum after its add. */
static inline __attribute__((always_inline)) void dots_pairs(const int8_t *const *qi, const block8 *b, int keys,
                                                              const int D, int32_t *dots) {
    int32_t qp[RB][MAX_D / 2];   /* each row's q widened to int16, read as d pairs */
    for (int r = 0; r < RB; r++)
        for (int d = 0; d < D; d += 16)
            _mm256_storeu_si256((__m256i *)(qp[r] + d / 2), _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qi[r] + d))));
    const int32_t *kp = (const int32_t *)b->ku;
    for (int h = 0; h < keys; h += 16) {
        __m256i a0[RB], a1[RB];
        for (int r = 0; r < RB; r++) a0[r] = a1[r] = _mm256_setzero_si256();
        for (int dp = 0; dp < D / 2; dp++) {
            __m256i k0 = _mm256_loadu_si256((const __m256i *)(kp + (int64_t)dp * BK + h));
            __m256i k1 = _mm256_loadu_si256((const __m256i *)(kp + (int64_t)dp * BK + h + 8));
            __asm__("" : "+x"(k0), "+x"(k1));   /* loaded once for the RB rows (below) */
            for (int r = 0; r < RB; r++) {
                const __m256i qb = _mm256_set1_epi32(qp[r][dp]);
                __m256i t0, t1;
                __asm__("vpmaddwd %[k0], %[q], %[t0]\n\tvpaddd %[t0], %[a0], %[a0]\n\t"
                        "vpmaddwd %[k1], %[q], %[t1]\n\tvpaddd %[t1], %[a1], %[a1]"
                        : [a0] "+x"(a0[r]), [a1] "+x"(a1[r]), [t0] "=&x"(t0), [t1] "=&x"(t1)
                        : [k0] "x"(k0), [k1] "x"(k1), [q] "x"(qb));
            }
        }
        for (int r = 0; r < RB; r++) {
            _mm256_storeu_si256((__m256i *)(dots + r * BK + h), a0[r]);
            _mm256_storeu_si256((__m256i *)(dots + r * BK + h + 8), a1[r]);
        }
    }
}

/* scores for up to RB rows of a segment() (qsum unused: the int16 products need no offset), on the int8 rows (few)
 * or the transposed pairs (`transposed`; past the last row, head_block repeats its first: unused) */
__attribute__((noinline, noclone))
static void block_dots(const int8_t *const *qi, const int32_t *qsum, int rows, const block8 *b, int transposed,
                       int keys, int D, int32_t *dots) {
    (void)qsum;
    if (transposed) {
        if (D == 64) dots_pairs(qi, b, keys, 64, dots);
        else if (D == 128) dots_pairs(qi, b, keys, 128, dots);
        else dots_pairs(qi, b, keys, D, dots);
        return;
    }
    if (D == 64 && rows == 3) dots_rows(qi, 3, b, keys, 64, dots);
    else if (D == 64 && rows == 4) dots_rows(qi, 4, b, keys, 64, dots);
    else if (D == 64 && rows == 2) dots_rows(qi, 2, b, keys, 64, dots);
    else if (D == 64) dots_rows(qi, 1, b, keys, 64, dots);
    else dots_rows(qi, rows, b, keys, D, dots);
}

/* n (<= RB) query rows' softmax steps over a block: for each row r, the AVX-512 block_weights' contract
 * (kv8_avx512_block.h), 8 keys a step, on dots + r BK, qc[r], seen[r], mx[r], sum[r], o + r D, wq + r BK, ws[r],
 * corr[r]; need[r] says whether the row takes a weighted sum of V (a row with seen[r] == 0 is not touched). Only the
 * group holding a row's last seen key is masked (the others are whole); a NaN or inf score or V scale shows in the
 * sums of p and of w (p <= 1 and a V scale is finite or NaN, so a finite w sums finite), checked once a block
 * instead of a compare a group. The rows go phase by phase (scores and max, exp and sums, the scalar step, int16
 * weights): a row alone was one chain of dependent steps (block max -> exp -> sums -> scale), ~200 cycles of latency
 * for ~80 of work; side by side the rows' chains overlap. Each row's arithmetic is its own, the same whatever rows
 * share the call. */
__attribute__((noinline, noclone))
static void block_weights(const int32_t *dots, const float *qc, const block8 *b, const int *seen, int n, int D,
                          float *mx, float *sum, float *o, int16_t *wq, float *ws, float *corr, int *need) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
    const float *ksc = b->kscs + b->head * BK, *vsc = b->vscs + b->head * BK;   /* the head's scales */
    __m256 s[RB][NG8], w[RB][NG8], mk[RB], wtop[RB];
    float mnew[RB], bsum[RB], wsum[RB], wmax[RB];
    int groups[RB], whole[RB];
    for (int r = 0; r < n; r++) {   /* scores, the block max */
        groups[r] = (seen[r] + 7) / 8;   /* groups past `seen` hold no key: weight 0, no work */
        whole[r] = seen[r] / 8;
        mk[r] = lanes_below(seen[r] - 8 * whole[r]);   /* the partial group's seen lanes (h == whole) */
        const __m256 qcv = _mm256_set1_ps(qc[r]);
        __m256 top = ninf;
        for (int h = 0; h < groups[r]; h++) {
            const __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(dots + r * BK + 8 * h))),
                                                         qcv), _mm256_loadu_ps(ksc + 8 * h));
            s[r][h] = h < whole[r] ? v : _mm256_blendv_ps(ninf, v, mk[r]);
            top = _mm256_max_ps(top, s[r][h]);
        }
        const float bm = hmax8(top);
        mnew[r] = bm > mx[r] ? bm : mx[r];
    }
    for (int r = 0; r < n; r++) {   /* p = exp(s - max), w = p x V scale; lane sums of p and w, lane maxes of w */
        const __m256 mv = _mm256_set1_ps(mnew[r]);
        __m256 lanes = zero, wall = zero, top = zero;
        for (int h = 0; h < groups[r]; h++) {
            __m256 p = exp256(_mm256_sub_ps(s[r][h], mv));
            __m256 wh = _mm256_mul_ps(p, _mm256_loadu_ps(vsc + 8 * h));
            if (h == whole[r]) {   /* masked: a later key's V scale (NaN for a NaN row) must not reach this row */
                p = _mm256_and_ps(mk[r], p);
                wh = _mm256_and_ps(mk[r], wh);
            }
            lanes = h ? _mm256_add_ps(lanes, p) : p;
            wall = _mm256_add_ps(wall, wh);
            top = _mm256_max_ps(top, wh);
            w[r][h] = wh;
        }
        bsum[r] = hsum8(lanes);
        wsum[r] = hsum8(wall);
        wtop[r] = top;
    }
    for (int r = 0; r < n; r++) {   /* the running max, sum and output scale; whether V is weighed at all */
        need[r] = 0;
        if (!seen[r]) continue;
        if (bsum[r] != bsum[r] || !(wsum[r] <= 3.4028235e38f)) {   /* a NaN or inf score (p NaN), a NaN V scale */
            if (mx[r] == -INFINITY) mx[r] = 0.f;   /* kept by the merge */
            sum[r] = NAN;
            for (int d = 0; d < D; d++) o[(int64_t)r * D + d] = NAN;
            continue;
        }
        /* exp(0) is exactly 1: a block that does not raise the max (most, past the first) skips the exp */
        const float c = mx[r] == -INFINITY ? 0.f : mnew[r] == mx[r] ? 1.f : exp1(mx[r] - mnew[r]);
        sum[r] = sum[r] * c + bsum[r];
        mx[r] = mnew[r];
        wmax[r] = hmax8(wtop[r]);
        if (!(wmax[r] > 0.f)) {   /* no weight left after the V scales (zero rows): the output scaled only */
            const __m256 cv = _mm256_set1_ps(c);
            float *orow = o + (int64_t)r * D;
            for (int d = 0; d < D; d += 8) _mm256_storeu_ps(orow + d, _mm256_mul_ps(_mm256_loadu_ps(orow + d), cv));
            continue;
        }
        ws[r] = wmax[r] / 32767.f;
        corr[r] = c;
        need[r] = 1;
    }
    for (int r = 0; r < n; r++) {   /* the weights as int16 against the block's largest (zeros for a row without) */
        int16_t *wr = wq + r * BK;
        if (!need[r]) { memset(wr, 0, sizeof(int16_t) * BK); continue; }
        const __m256 inv = _mm256_set1_ps(32767.f / wmax[r]);   /* w x inv <= 32767 (rounding ~1 ulp) */
        for (int h = 0; h < NG8; h++) {
            if (h >= groups[r]) { _mm_storeu_si128((__m128i *)(wr + 8 * h), _mm_setzero_si128()); continue; }
            const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(w[r][h], inv));   /* MXCSR: nearest, ties to even */
            _mm_storeu_si128((__m128i *)(wr + 8 * h), _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
        }
    }
}

/* One row's block output into o [D]: o x corr + (the exact weighted sum acc) x ws */
__attribute__((noinline, noclone))
static void row_output(const int32_t *acc, float ws, float corr, int D, float *o) {
    const __m256 wsv = _mm256_set1_ps(ws), cv = _mm256_set1_ps(corr);
    for (int d = 0; d < D; d += 8)
        _mm256_storeu_ps(o + d, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(acc + d))), wsv,
                                                _mm256_mul_ps(_mm256_loadu_ps(o + d), cv)));
}

/* acc [R][D] = exact sums over the block's first `pairs` key pairs of wq [R][BK] x V, a row at a time, 64 d of it
 * in 8 registers (the V pairs of the block stay in L1 for the next row) */
static inline __attribute__((always_inline)) void values_d(const int16_t *wq, int R, const block8 *b, int pairs,
                                                           const int D, int32_t *acc) {
    for (int r = 0; r < R; r++)
        for (int d0 = 0; d0 < D; d0 += 64) {
            __m256i a[8];
            for (int c = 0; c < 8; c++) a[c] = _mm256_setzero_si256();
            for (int jp = 0; jp < pairs; jp++) {
                int32_t pair;
                memcpy(&pair, wq + r * BK + 2 * jp, sizeof pair);
                const __m256i bw = _mm256_set1_epi32(pair);
                const int16_t *vp = b->vp + ((int64_t)jp * D + d0) * 2;
                for (int c = 0; c < 8; c++)
                    a[c] = _mm256_add_epi32(a[c], _mm256_madd_epi16(bw, _mm256_loadu_si256((const __m256i *)(vp + 16 * c))));
            }
            for (int c = 0; c < 8; c++) _mm256_storeu_si256((__m256i *)(acc + (int64_t)r * D + d0 + 8 * c), a[c]);
        }
}

/* values_d for R (<= RB) rows on the block's int8 V rows, widened and paired as read, 16 d at a time for all R rows
 * (the pairs' lanes hold d 0-3, 8-11 and 4-7, 12-15; put in order once at the end) */
static inline __attribute__((always_inline)) void values_rows(const int16_t *wq, const int R, const block8 *b,
                                                              int pairs, int D, int32_t *acc) {
    const int64_t off = (int64_t)b->head * D;   /* the head's rows in each key's slot (unpack_keys) */
    for (int d = 0; d < D; d += 16) {
        __m256i lo[RB], hi[RB];
        for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_si256();
        for (int jp = 0; jp < pairs; jp++) {
            if (d == 0) ask_ahead(b, 1);
            const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b->vslot[2 * jp] + off + d)));
            const __m256i c = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b->vslot[2 * jp + 1] + off + d)));
            const __m256i pl = _mm256_unpacklo_epi16(a, c), ph = _mm256_unpackhi_epi16(a, c);
            for (int r = 0; r < R; r++) {
                int32_t pair;
                memcpy(&pair, wq + r * BK + 2 * jp, sizeof pair);
                const __m256i bw = _mm256_set1_epi32(pair);
                lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(bw, pl));
                hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(bw, ph));
            }
        }
        for (int r = 0; r < R; r++) {
            _mm256_storeu_si256((__m256i *)(acc + (int64_t)r * D + d), _mm256_permute2x128_si256(lo[r], hi[r], 0x20));
            _mm256_storeu_si256((__m256i *)(acc + (int64_t)r * D + d + 8), _mm256_permute2x128_si256(lo[r], hi[r], 0x31));
        }
    }
}
