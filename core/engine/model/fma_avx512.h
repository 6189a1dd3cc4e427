/* fma_attention.c's primitives on AVX-512: blocks packed as rows or transposed (keys across lanes, the fastest
 * prefill: "fma"), scores with d across lanes reduced by one fixed tree (scores16: one order, "one_order" and
 * fma_decode), values in key order, the softmax step and the segments' merge, 16 lanes a step. Included by
 * fma_attention.c, whose drivers fma_avx2.h shares on 8 lanes (the lanes path only). */
#include "online_softmax_avx512.h"   /* merge, finish */

/* (one order) block kb's keys of KV head g, K and V rows copied as fp32 [FK][D] (rows past the last key left as
 * they are: their offsets are -1), for many rows to read from L1/L2 */
static void pack_rows(const void *k, const void *v, int bf16, const int64_t *slots, int m, int kb, int g, int KVH,
                      int D, float *kb_out, float *vb) {
    const int j0 = kb * FK, kn = m - j0 < FK ? m - j0 : FK;
    for (int j = 0; j < kn; j++) {
        const int64_t at = (slots[j0 + j] * KVH + g) * (int64_t)D;
        for (int d0 = 0; d0 < D; d0 += 16) {
            _mm512_storeu_ps(kb_out + (int64_t)j * D + d0, load16(k, bf16, at + d0));
            _mm512_storeu_ps(vb + (int64_t)j * D + d0, load16(v, bf16, at + d0));
        }
    }
}

/* (keys across lanes) block kb's keys of KV head g: kt [D][FK] (transposed, 16 keys x 16 d at a time) and vb
 * [FK][D], zeros past the last key */
static void pack_transposed(const void *k, const void *v, int bf16, const int64_t *slots, int m, int kb, int g, int KVH,
                       int D, float *kt, float *vb) {
    const int j0 = kb * FK, kn = m - j0 < FK ? m - j0 : FK;
    for (int jg = 0; jg < FK; jg += 16) {
        int64_t at[16];
        for (int i = 0; i < 16; i++) at[i] = jg + i < kn ? (slots[j0 + jg + i] * KVH + g) * (int64_t)D : -1;
        for (int d0 = 0; d0 < D; d0 += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                const __m512 x = at[i] < 0 ? _mm512_setzero_ps() : load16(k, bf16, at[i] + d0);
                r[i] = _mm512_castps_si512(x);
                _mm512_storeu_ps(vb + (int64_t)(jg + i) * D + d0, at[i] < 0 ? _mm512_setzero_ps()
                                                                            : load16(v, bf16, at[i] + d0));
            }
            transpose16(r);
            for (int dd = 0; dd < 16; dd++)
                _mm512_store_ps(kt + (int64_t)(d0 + dd) * FK + jg, _mm512_castsi512_ps(r[dd]));
        }
    }
}

/* (keys across lanes) scores of RB_T rows against the block's FK keys: s[r][FK], each an FMA chain over d in order */
static inline void scores_transposed(const float *const *qr, const float *kt, int D, float *s) {
    __m512 a[RB_T][2];
    for (int r = 0; r < RB_T; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
    for (int d = 0; d < D; d++) {
        const __m512 k0 = _mm512_load_ps(kt + (int64_t)d * FK), k1 = _mm512_load_ps(kt + (int64_t)d * FK + 16);
        for (int r = 0; r < RB_T; r++) {
            const __m512 x = _mm512_set1_ps(qr[r][d]);
            a[r][0] = _mm512_fmadd_ps(x, k0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(x, k1, a[r][1]);
        }
    }
    for (int r = 0; r < RB_T; r++) {
        _mm512_store_ps(s + r * FK, a[r][0]);
        _mm512_store_ps(s + r * FK + 16, a[r][1]);
    }
}

/* Scores of up to RB_L query rows (qr[r], rows with seen[r] > 0) against 16 keys: key i's row at src + at[i] (fp32,
 * or bf16 when bf16; at[i] < 0: no key, score 0, masked later) -> s[r * FK + i]. Each score is 16 lanes of partial
 * sums over d (lane l: d = l, l + 16, ... in order, the first a product, then FMAs) reduced by reduce16's fixed
 * tree. Each key's row is loaded (and widened) once for all the rows, 4 keys at a time. Compiled once (noinline)
 * and the same code for a packed block and the pool read in place, so a row's scores do not depend on which the
 * caller took, nor on the other rows; lanes over d, not keys, so no transpose. */
__attribute__((noinline, noclone))
static void scores16(const float *const *qr, const int *seen, const void *src, int bf16, const int64_t *at, int D,
                     float *s) {
    __m512 part[RB_L][16];
    for (int i0 = 0; i0 < 16; i0 += 4) {
        __m512 a[4][RB_L];
        for (int i = 0; i < 4; i++) {
            const __m512 k0 = at[i0 + i] < 0 ? _mm512_setzero_ps() : load16(src, bf16, at[i0 + i]);
            for (int r = 0; r < RB_L; r++) a[i][r] = _mm512_mul_ps(_mm512_loadu_ps(qr[r]), k0);
        }
        for (int d = 16; d < D; d += 16)
            for (int i = 0; i < 4; i++) {
                const __m512 kd = at[i0 + i] < 0 ? _mm512_setzero_ps() : load16(src, bf16, at[i0 + i] + d);
                for (int r = 0; r < RB_L; r++) a[i][r] = _mm512_fmadd_ps(_mm512_loadu_ps(qr[r] + d), kd, a[i][r]);
            }
        for (int i = 0; i < 4; i++)
            for (int r = 0; r < RB_L; r++) part[r][i0 + i] = a[i][r];
    }
    for (int r = 0; r < RB_L; r++)
        if (seen[r] > 0) _mm512_storeu_ps(s + r * FK, reduce16(part[r]));
}

/* (one order) scores of the rows that see the block (seen[r] > 0) against its FK keys: s[r][FK] */
static inline void scores_lanes(const float *const *qr, const int *seen, const void *src, int bf16,
                                const int64_t *at, int D, float *s) {
    for (int jg = 0; jg < FK; jg += 16) scores16(qr, seen, src, bf16, at + jg, D, s + jg);
}

/* o[r] = o[r] * corr[r] + sum over the block's keys in order of p[r][j] * v[j] (v[j] at src + at[j], zeros where
 * at[j] < 0), rb rows (RB_T or RB_L: a constant once inlined), 64 (or fewer) of D at a time */
static inline __attribute__((always_inline)) void block_values(float *const *o, const float *p, const float *corr,
                                                               const void *src, int bf16, const int64_t *at, int D,
                                                               const int rb) {
    for (int d0 = 0; d0 < D; d0 += 64) {
        const int nv = (D - d0) / 16 < 4 ? (D - d0) / 16 : 4;
        __m512 a[RB][4];
        for (int r = 0; r < rb; r++)
            for (int c = 0; c < 4; c++) a[r][c] = _mm512_setzero_ps();
        for (int j = 0; j < FK; j++) {
            for (int c = 0; c < nv; c++) {
                const __m512 vv = at[j] < 0 ? _mm512_setzero_ps() : load16(src, bf16, at[j] + d0 + 16 * c);
                for (int r = 0; r < rb; r++) a[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(p[r * FK + j]), vv, a[r][c]);
            }
        }
        for (int r = 0; r < rb; r++)
            for (int c = 0; c < nv; c++) {
                float *dst = o[r] + d0 + 16 * c;
                _mm512_storeu_ps(dst, _mm512_fmadd_ps(_mm512_loadu_ps(dst), _mm512_set1_ps(corr[r]), a[r][c]));
            }
    }
}

/* one row's softmax step over a block: scores s[FK] (unscaled), keys past `seen` masked; updates mx, sum, writes
 * p[FK] and the factor the row's output is scaled by first */
static inline void softmax_step(const float *s, int seen, float scale, float *mx, float *sum, float *p, float *corr) {
    const __mmask16 m0 = seen >= 16 ? 0xFFFF : (__mmask16)((1u << seen) - 1u);
    const __mmask16 m1 = seen >= 32 ? 0xFFFF : seen <= 16 ? 0 : (__mmask16)((1u << (seen - 16)) - 1u);
    const __m512 ninf = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(scale);
    const __m512 s0 = _mm512_mask_mul_ps(ninf, m0, _mm512_loadu_ps(s), sc);
    const __m512 s1 = _mm512_mask_mul_ps(ninf, m1, _mm512_loadu_ps(s + 16), sc);
    const float bm = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
    const float mnew = bm > *mx ? bm : *mx;
    const __m512 mv = _mm512_set1_ps(mnew);
    const __m512 p0 = _mm512_maskz_mov_ps(m0, exp512(_mm512_sub_ps(s0, mv)));
    const __m512 p1 = _mm512_maskz_mov_ps(m1, exp512(_mm512_sub_ps(s1, mv)));
    _mm512_storeu_ps(p, p0);
    _mm512_storeu_ps(p + 16, p1);
    const float c = *mx == -INFINITY ? 0.f : _mm512_cvtss_f32(exp512(_mm512_set1_ps(*mx - mnew)));
    *sum = *sum * c + (_mm512_reduce_add_ps(p0) + _mm512_reduce_add_ps(p1));
    *mx = mnew;
    *corr = c;
}

/* The two orders, as segment() asks for them (lanes: one order, d across lanes; else keys across lanes). */

/* block kb packed for many rows: as fp32 rows (lanes) or transposed */
static inline void pack_block(int lanes, const void *k, const void *v, int bf16, const int64_t *slots, int m, int kb,
                              int g, int KVH, int D, float *kp, float *vb) {
    if (lanes) pack_rows(k, v, bf16, slots, m, kb, g, KVH, D, kp, vb);
    else pack_transposed(k, v, bf16, slots, m, kb, g, KVH, D, kp, vb);
}

/* a register block's scores: d across lanes from src + at[j], or keys across lanes from the transposed block kp */
static inline void block_scores(int lanes, const float *const *qr, const int *seen, const void *src, int bf16,
                                const int64_t *at, const float *kp, int D, float *s) {
    if (lanes) scores_lanes(qr, seen, src, bf16, at, D, s);
    else scores_transposed(qr, kp, D, s);
}

/* a register block's outputs (RB_L rows with lanes, else RB_T) */
static inline void block_outputs(int lanes, float *const *o, const float *p, const float *corr, const void *src,
                                 int bf16, const int64_t *at, int D) {
    if (lanes) block_values(o, p, corr, src, bf16, at, D, RB_L);
    else block_values(o, p, corr, src, bf16, at, D, RB_T);
}
