/* fma_attention.c's primitives on AVX2 (CPUs without AVX-512: AMD Zen 2 and 3, Intel before Ice Lake): one order's
 * arithmetic (scores with d across lanes, values in key order) on 8 lanes. Included by fma_attention.c, whose
 * drivers (segment, attention, fma_decode) and promise it keeps: a query row's result is the same bits however its
 * prompt was chunked or cached, decoded or prefilled, whatever rows share its work item.
 *
 * Why: with AVX2 only, a prompt chunk over an fp32 or bf16 pool ran torch's flash attention, whose blocks start
 * where a call's keys start, so a row's bits moved with the chunking: with int8 weights and an fp32 pool, cache on
 * == cache off held for 49 of 50 prompts on an AMD Zen 3. This build has no transposed path (keys across lanes):
 * every chunk runs the lanes one, as NativeLlama.one_order's do on AVX-512. */
#include "online_softmax_avx2.h"   /* exp1, hsum8, lanes_below, merge, finish */

/* 8 values of a pool row (K or V, fp32 or bf16) at element `at`, as fp32: a bf16 value widens exactly */
static inline __m256 load8(const void *base, int bf16, int64_t at) {
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + at))), 16));
    return _mm256_loadu_ps((const float *)base + at);
}

/* r[i] = the sum of a[i]'s 8 lanes, for 8 vectors at once; the same tree of adds for every i */
static inline __m256 reduce8(const __m256 a[8]) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* block kb's keys of KV head g, K and V rows copied as fp32 [FK][D] (rows past the last key left as they are:
 * their offsets are -1), for many rows to read from L1/L2 */
static void pack_rows(const void *k, const void *v, int bf16, const int64_t *slots, int m, int kb, int g, int KVH,
                      int D, float *kb_out, float *vb) {
    const int j0 = kb * FK, kn = m - j0 < FK ? m - j0 : FK;
    for (int j = 0; j < kn; j++) {
        const int64_t at = (slots[j0 + j] * KVH + g) * (int64_t)D;
        for (int d0 = 0; d0 < D; d0 += 8) {
            _mm256_storeu_ps(kb_out + (int64_t)j * D + d0, load8(k, bf16, at + d0));
            _mm256_storeu_ps(vb + (int64_t)j * D + d0, load8(v, bf16, at + d0));
        }
    }
}

/* Scores of up to RB_L query rows (rows with seen[r] > 0) against 8 keys: key i's row at src + at[i] (at[i] < 0:
 * no key, score 0, masked later) -> s[r * FK + i]. Each score is 8 lanes of partial sums over d (lane l: d = l,
 * l + 8, ... in order, the first a product, then FMAs) reduced by reduce8's tree; a key's row is loaded once for
 * all the rows, 2 keys at a time (8 sums in registers). Compiled once (noinline), for packed blocks and the pool
 * read in place alike, so a row's scores depend neither on which the caller took nor on the other rows. */
__attribute__((noinline, noclone))
static void scores8(const float *const *qr, const int *seen, const void *src, int bf16, const int64_t *at, int D,
                    float *s) {
    __m256 part[RB_L][8];
    for (int i0 = 0; i0 < 8; i0 += 2) {
        __m256 a[2][RB_L];
        for (int i = 0; i < 2; i++) {
            const __m256 k0 = at[i0 + i] < 0 ? _mm256_setzero_ps() : load8(src, bf16, at[i0 + i]);
            for (int r = 0; r < RB_L; r++) a[i][r] = _mm256_mul_ps(_mm256_loadu_ps(qr[r]), k0);
        }
        for (int d = 8; d < D; d += 8)
            for (int i = 0; i < 2; i++) {
                const __m256 kd = at[i0 + i] < 0 ? _mm256_setzero_ps() : load8(src, bf16, at[i0 + i] + d);
                for (int r = 0; r < RB_L; r++) a[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(qr[r] + d), kd, a[i][r]);
            }
        for (int i = 0; i < 2; i++)
            for (int r = 0; r < RB_L; r++) part[r][i0 + i] = a[i][r];
    }
    for (int r = 0; r < RB_L; r++)
        if (seen[r] > 0) _mm256_storeu_ps(s + r * FK, reduce8(part[r]));
}

/* scores of the rows that see the block (seen[r] > 0) against its FK keys: s[r][FK] */
static inline void scores_lanes(const float *const *qr, const int *seen, const void *src, int bf16,
                                const int64_t *at, int D, float *s) {
    for (int jg = 0; jg < FK; jg += 8) scores8(qr, seen, src, bf16, at + jg, D, s + jg);
}

/* o[r] = o[r] * corr[r] + sum over the block's keys in order of p[r][j] * v[j] (v[j] at src + at[j], zeros where
 * at[j] < 0), rb rows, 16 of D at a time (8 sums in registers) */
static inline __attribute__((always_inline)) void block_values(float *const *o, const float *p, const float *corr,
                                                               const void *src, int bf16, const int64_t *at, int D,
                                                               const int rb) {
    for (int d0 = 0; d0 < D; d0 += 16) {   /* D % 16 == 0 */
        __m256 a[RB][2];
        for (int r = 0; r < rb; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
        for (int j = 0; j < FK; j++) {
            const __m256 v0 = at[j] < 0 ? _mm256_setzero_ps() : load8(src, bf16, at[j] + d0);
            const __m256 v1 = at[j] < 0 ? _mm256_setzero_ps() : load8(src, bf16, at[j] + d0 + 8);
            for (int r = 0; r < rb; r++) {
                const __m256 w = _mm256_set1_ps(p[r * FK + j]);
                a[r][0] = _mm256_fmadd_ps(w, v0, a[r][0]);
                a[r][1] = _mm256_fmadd_ps(w, v1, a[r][1]);
            }
        }
        for (int r = 0; r < rb; r++)
            for (int c = 0; c < 2; c++) {
                float *dst = o[r] + d0 + 8 * c;
                _mm256_storeu_ps(dst, _mm256_fmadd_ps(_mm256_loadu_ps(dst), _mm256_set1_ps(corr[r]), a[r][c]));
            }
    }
}

/* one row's softmax step over a block: scores s[FK] (unscaled), keys past `seen` masked; updates mx, sum, writes
 * p[FK] and the factor the row's output is scaled by first */
static inline void softmax_step(const float *s, int seen, float scale, float *mx, float *sum, float *p, float *corr) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), sc = _mm256_set1_ps(scale);
    __m256 mk[FK / 8], sv[FK / 8], top = ninf;
    for (int h = 0; h < FK / 8; h++) {
        mk[h] = lanes_below(seen - 8 * h);
        sv[h] = _mm256_blendv_ps(ninf, _mm256_mul_ps(_mm256_loadu_ps(s + 8 * h), sc), mk[h]);
        top = _mm256_max_ps(top, sv[h]);
    }
    const float bm = hmax8(top);
    const float mnew = bm > *mx ? bm : *mx;
    const __m256 mv = _mm256_set1_ps(mnew);
    __m256 total = _mm256_setzero_ps();
    for (int h = 0; h < FK / 8; h++) {
        const __m256 ph = _mm256_and_ps(mk[h], exp256(_mm256_sub_ps(sv[h], mv)));
        _mm256_storeu_ps(p + 8 * h, ph);
        total = _mm256_add_ps(total, ph);
    }
    const float c = *mx == -INFINITY ? 0.f : exp1(*mx - mnew);
    *sum = *sum * c + hsum8(total);
    *mx = mnew;
    *corr = c;
}

/* segment()'s calls, as fma_avx512.h names them: this build has one order only (attention() sets lanes), so the
 * block is packed as rows, scored d across lanes, RB_L rows a register block */
static inline void pack_block(int lanes, const void *k, const void *v, int bf16, const int64_t *slots, int m, int kb,
                              int g, int KVH, int D, float *kp, float *vb) {
    (void)lanes;
    pack_rows(k, v, bf16, slots, m, kb, g, KVH, D, kp, vb);
}

static inline void block_scores(int lanes, const float *const *qr, const int *seen, const void *src, int bf16,
                                const int64_t *at, const float *kp, int D, float *s) {
    (void)lanes; (void)kp;
    scores_lanes(qr, seen, src, bf16, at, D, s);
}

static inline void block_outputs(int lanes, float *const *o, const float *p, const float *corr, const void *src,
                                 int bf16, const int64_t *at, int D) {
    (void)lanes;
    block_values(o, p, corr, src, bf16, at, D, RB_L);
}
