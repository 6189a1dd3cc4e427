/* Attention over an int8 KV pool: K and V stored as int8 with one fp32 scale per (slot, KV head) row, attended
 * to in exact integer sums on AVX512-VNNI.
 *
 * Why: a decode step reads every K and V row of its context once per layer. In fp32 that is 189 MB a step at
 * 4,096 tokens of the default model, and on a 2-core CPU the step was memory-bound (decode at 4,096 tokens ran at
 * 0.37x the speed at 128). int8 rows with their scales are 3.8x fewer bytes (llama.cpp's q8_0 cache and LMDeploy's
 * int8 KV store them alike, per token and head), and a pool of the same GiB holds 3.8x the tokens.
 *
 * Storing (kv8_store): a row x of D values gets scale s = max|x| / 127 and values round(x / s) (nearest, ties to
 * even; a zero row scale 0; a row with NaN or inf scale NaN, values 0): the bits KVPool.set_kv gives in torch.
 *
 * Attending: a query row is rounded once to int8 (scale max|q| / 127, as K's rows; quantize_q: as SageAttention
 * quantizes Q and K). A score is the exact int32 sum of q x k over D (VPDPBUSD: 64 products an instruction, on
 * K + 128 as unsigned bytes, less 128 x the sum of q) times (q scale x softmax scale) times the key's scale. int8
 * queries made a 4,096-token chunk ~20 % faster than int16 ones (VPDPWSSD) and moved greedy agreement with HF by one
 * prompt of 50 (benchmarks/README.md, "int8 KV pool").
 * Softmax runs online over blocks of BK keys aligned to absolute positions 0, BK, 2 BK, ...; in a block each weight
 * p_j x (V scale of key j) is rounded to int16 against the block's largest, and the block's output is the exact
 * int32 sum over its keys of weight x v (VPDPWSSD on key pairs), scaled once into fp32. Integer sums have no order,
 * and every fp32 step runs in one compiled function (noinline: the module's flags let the compiler reassociate, and
 * two inlined copies could round apart), so a row's result is the same bits whichever rows share its call, however
 * its prompt was chunked or cached, decoded or prefilled (the promise fma_attention.c keeps in fp32).
 *
 * Layouts: q rows [n][H][D] fp32 (row stride qs floats); k, v [slots][KVH][D] int8, ks, vs [slots][KVH] fp32, key j
 * at slot slots[j]; out [n][H][D] fp32; query i at position m - n + i. D % 64 == 0, D <= 256, H % KVH == 0, m >= n.
 * Returns -1 when out of memory, -2 where built without AVX512-VNNI, -3 for shapes it cannot run. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "native_simd.h"
#include "native_kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#define KV8_AVX512 1
#define KV8_AVX2 0
#elif defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)   /* AVX-512 without VNNI: fp32 pool */
#define KV8_AVX512 0
#define KV8_AVX2 1      /* the same integer sums on 8 lanes (kv8_avx2.h) */
#else
#define KV8_AVX512 0
#define KV8_AVX2 0
#endif

#if KV8_AVX512 || KV8_AVX2

#define BK 64           /* keys per block (64: a 4,096-token chunk 15-20 % faster than with 32, the per-block
                         * softmax steps over more keys) */
#define NG (BK / 16)    /* 16-key groups a block */
#define FQ 32           /* query positions per work item of a long chunk */
#define SEG_BLOCKS 8    /* key blocks per segment: the work items of decode rows and short chunks */
#define SEG (SEG_BLOCKS * BK)
#define MAX_D 256
#define PREFETCH_BLOCKS 1   /* key blocks ahead whose rows are asked for */
#define RB 4                /* rows whose scores are summed together on transposed keys */
#define NOT_FINITE 0x99  /* fpclass: QNaN, +inf, -inf, SNaN */

int kv8_ready(void) { return 1; }

#if KV8_AVX512
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

#else
#include "kv8_avx2.h"
#endif

/* one row of D values into int8 + its scale (the module docstring's rule) */
__attribute__((noinline, noclone))
static void store_row(const float *x, int D, int8_t *dst, float *scale) {
    const float a = abs_max(x, D), s = a / 127.f;
    if (!(s > 0.f)) {   /* NaN (a value not finite), zero, or below fp32's range */
        memset(dst, 0, (size_t)D);
        *scale = s != s ? NAN : 0.f;
        return;
    }
    round_to_int8(x, D, s, dst);
    *scale = s;
}

int kv8_store(const float *src, int64_t ss, int8_t *buf, float *scales, const int64_t *slots, int R, int KVH, int D) {
    if (D % 32 || D <= 0 || D > MAX_D || KVH <= 0) return -3;
    #pragma omp parallel for schedule(static) if (R * KVH >= 256)
    for (int64_t it = 0; it < (int64_t)R * KVH; it++) {
        const int64_t r = it / KVH, g = it % KVH, row = slots[r] * KVH + g;
        store_row(src + r * ss + g * D, D, buf + row * D, scales + row);
    }
    return 0;
}

/* a query row to int8 (scale max|q| / 127, as K's rows) and the sum of those values (VPDPBUSD multiplies K + 128,
 * unsigned: the scores subtract 128 x that sum); returns the scale x the softmax scale (NaN for a row not finite,
 * 0 for a zero row: its scores are then all 0) */
__attribute__((noinline, noclone))
static float quantize_q(const float *q, int D, float scale, int8_t *dst, int32_t *qsum) {
    const float a = abs_max(q, D), s = a / 127.f;
    *qsum = 0;
    if (!(s > 0.f)) {
        memset(dst, 0, (size_t)D);
        return s != s ? NAN : 0.f;
    }
    *qsum = round_to_int8(q, D, s, dst);
    return s * scale;
}

/* every query row of q ([n][H][D], row stride qs) to int8 qi [n][H][D], its factor qc and sum qsum [n][H] */
static void quantize_queries(const float *q, int64_t qs, int n, int H, int D, float scale, int8_t *qi, float *qc,
                             int32_t *qsum) {
    #pragma omp parallel for schedule(static) if (n * H >= 256)
    for (int64_t it = 0; it < (int64_t)n * H; it++)
        qc[it] = quantize_q(q + (it / H) * qs + (it % H) * D, D, scale, qi + it * D, qsum + it);
}

/* The keys of one request in one pool layer. */
typedef struct {
    const int8_t *k, *v;
    const float *ks, *vs;
    const int64_t *slots;
    int m, KVH, D, G, H;
} keys8;

/* The queries of a call: int8 rows qi [n][H][D], each row's factor qc (quantize_q) and sum qsum [n][H]. */
typedef struct {
    const int8_t *qi;
    const float *qc;
    const int32_t *qsum;
} queries8;

/* One block of one KV head, unpacked once for all the rows that read it: K + 128 as uint8 [BK][D] (and, for many
 * rows, transposed), V as key pairs [BK/2][D][2] int16 (lane 2t, 2t + 1 of a 16-d chunk: keys 2jp, 2jp + 1 at one
 * d), the scales; zeros past the last key. */
typedef struct {
    uint8_t *ku;   /* K + 128 (unsigned, for VPDPBUSD) [BK][D] */
    int16_t *vp;
    int32_t *kt;   /* ku transposed for many rows: [D/4][BK], each 4 values (d .. d + 3) of one key */
    int32_t dots[RB * BK];   /* a register block of rows' scores */
    int16_t wq[RB * BK];     /* their softmax weights as int16 */
    int32_t *acc;            /* their exact weighted sums of V: [RB][D] */
    float ksc[BK], vsc[BK];
} block8;

/* ask for key j's K and V rows of head g (and its scales, where `scales`: a line holds 16 of them) a block before
 * its unpack_block: a key at a time, as a block is unpacked (a burst of a block's prefetches was dropped) */
static inline void prefetch_key(const keys8 *kv, int g, int j, int scales) {
    const int D = kv->D;
    const int64_t next = kv->slots[j] * kv->KVH + g;
    for (int d = 0; d < D; d += 64) {
        __builtin_prefetch(kv->k + next * D + d, 0, 2);
        __builtin_prefetch(kv->v + next * D + d, 0, 2);
    }
    if (scales) {
        __builtin_prefetch(kv->ks + next, 0, 2);
        __builtin_prefetch(kv->vs + next, 0, 2);
    }
}

#if KV8_AVX512
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

static void unpack_block(const keys8 *kv, int g, int kb, int transposed, block8 *b) {
    const int D = kv->D, j0 = kb * BK, kn = kv->m - j0 < BK ? kv->m - j0 : BK;
    const int jn = j0 + PREFETCH_BLOCKS * BK, kn_next = kv->m - jn < BK ? kv->m - jn : BK;
    const int8_t *vrow[BK];
    for (int j = 0; j < BK; j++) {
        if (j < kn_next) prefetch_key(kv, g, jn + j, (j & 3) == 0);
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

static void block_values(const int16_t *wq, int R, const block8 *b, int pairs, int D, int32_t *acc) {
    if (D == 64) values_d(wq, R, b, pairs, 64, acc);
    else if (D == 128) values_d(wq, R, b, pairs, 128, acc);
    else values_d(wq, R, b, pairs, D, acc);
}
#else
#include "kv8_avx2_block.h"
#endif

/* One block for the rows of KV head g (its G query heads at positions pos0 .. pos0 + qn - 1, queries i0 ..: row
 * rr is head g * G + rr / qn at query i0 + rr % qn): their running max, sum and output (st: [rows][D] outputs, then
 * rows maxes, rows sums) updated. */
static void head_block(const keys8 *kv, int g, int kb, const queries8 *Q, int64_t pos0, int i0, int qn, block8 *b,
                       float *st) {
    const int D = kv->D, G = kv->G, H = kv->H, rows = G * qn;
    float *o = st, *mx = st + (size_t)rows * D, *sum = mx + rows;
    const int64_t j0 = (int64_t)kb * BK;
    const int transposed = KV8_AVX512 && rows > RB;   /* many rows: the transpose pays (AVX-512; AVX2 has none) */
    unpack_block(kv, g, kb, transposed, b);
    for (int r0 = 0; r0 < rows; r0 += RB) {
        const int8_t *q[RB];
        int32_t qsum[RB];
        int seen[RB], keys = 0;
        for (int r = 0; r < RB; r++) {
            const int rr = r0 + r < rows ? r0 + r : r0;   /* past the last row: the first again, unused */
            const int64_t vis = r0 + r < rows ? pos0 + rr % qn - j0 + 1 : 0;
            seen[r] = vis > BK ? BK : vis < 0 ? 0 : (int)vis;
            keys = seen[r] > keys ? seen[r] : keys;
            const int64_t at = (int64_t)(i0 + rr % qn) * H + g * G + rr / qn;
            q[r] = Q->qi + at * D;
            qsum[r] = Q->qsum[at];
        }
        if (!keys) continue;
        const int n = rows - r0 < RB ? rows - r0 : RB;
        block_dots(q, qsum, n, b, transposed, (keys + 15) / 16 * 16, D, b->dots);
        int need[RB], pairs = 0;
        float ws[RB], corr[RB];
        for (int r = 0; r < n; r++) {
            const int rr = r0 + r;
            const int64_t at = (int64_t)(i0 + rr % qn) * H + g * G + rr / qn;
            need[r] = seen[r] && row_weights(b->dots + r * BK, Q->qc[at], b, seen[r], D, &mx[rr], &sum[rr],
                                             o + (int64_t)rr * D, b->wq + r * BK, &ws[r], &corr[r]);
            if (!need[r]) memset(b->wq + r * BK, 0, sizeof(int16_t) * BK);   /* adds nothing below */
            else if ((seen[r] + 1) / 2 > pairs) pairs = (seen[r] + 1) / 2;
        }
        if (!pairs) continue;
        block_values(b->wq, n, b, pairs, D, b->acc);
        for (int r = 0; r < n; r++)
            if (need[r]) row_output(b->acc + (int64_t)r * D, ws[r], corr[r], D, o + (int64_t)(r0 + r) * D);
    }
}

/* The rows of KV heads g0 .. g1 - 1 (head_block's rows, each head's) over key blocks kb0 .. kb1 - 1 (one segment),
 * block by block, each block's heads in turn (a slot's rows of every head are adjacent: the block is read from
 * memory once, while all of its work runs): fresh state per head at st + (g - g0) * hstride (head_block's layout);
 * a row the segment shows nothing keeps max -inf. */
__attribute__((noinline, noclone))
static void segment(const keys8 *kv, int g0, int g1, const queries8 *Q, int64_t pos0, int i0, int qn, int kb0,
                    int kb1, block8 *b, float *st, size_t hstride) {
    const int rows = kv->G * qn, D = kv->D;
    for (int g = g0; g < g1; g++) {
        float *o = st + (g - g0) * hstride, *mx = o + (size_t)rows * D, *sum = mx + rows;
        for (int r = 0; r < rows; r++) { mx[r] = -INFINITY; sum[r] = 0.f; }
        memset(o, 0, sizeof(float) * (size_t)rows * D);
    }
    for (int kb = kb0; kb < kb1; kb++) {
        if ((int64_t)kb * BK > pos0 + qn - 1) break;   /* no row sees this block or any later */
        for (int g = g0; g < g1; g++) head_block(kv, g, kb, Q, pos0, i0, qn, b, st + (g - g0) * hstride);
    }
}

#if KV8_AVX512
/* a row's segment (mx, sum, o) into its running total (amx, asum, ao), segments in key order */
__attribute__((noinline, noclone))
static void merge(float *amx, float *asum, float *ao, float mx, float sum, const float *o, int D) {
    if (mx == -INFINITY) return;
    const float top = mx > *amx ? mx : *amx;
    const float a = *amx == -INFINITY ? 0.f : _mm512_cvtss_f32(exp512(_mm512_set1_ps(*amx - top)));
    const float c = _mm512_cvtss_f32(exp512(_mm512_set1_ps(mx - top)));
    const __m512 av = _mm512_set1_ps(a), cv = _mm512_set1_ps(c);
    for (int d = 0; d < D; d += 16)
        _mm512_storeu_ps(ao + d, _mm512_fmadd_ps(_mm512_loadu_ps(ao + d), av, _mm512_mul_ps(_mm512_loadu_ps(o + d), cv)));
    *asum = *asum * a + sum * c;
    *amx = top;
}

__attribute__((noinline, noclone))
static void finish(const float *ao, float asum, float *dst, int D) {
    const __m512 inv = _mm512_set1_ps(1.f / asum);
    for (int d = 0; d < D; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_loadu_ps(ao + d), inv));
}
#endif

static int shape_ok(int H, int KVH, int D) { return D % 64 == 0 && D > 0 && D <= MAX_D && KVH > 0 && H % KVH == 0; }

/* a thread's block buffers (NULL when out of memory) */
static void *block_buffers(block8 *b, int D) {
    const size_t kd = (size_t)BK * D;   /* ku, then vp (2 kd), kt (kd), acc (4 RB D) bytes */
    uint8_t *buf = (uint8_t *)aligned_alloc(64, 4 * kd + 4 * (size_t)RB * D);
    b->ku = buf;   /* AVX2: K widened to int16 [BK][D] (2 kd bytes), then vp; no kt */
    b->vp = buf ? (int16_t *)(buf + (KV8_AVX2 ? 2 : 1) * kd) : NULL;
    b->kt = buf && !KV8_AVX2 ? (int32_t *)(buf + 3 * kd) : NULL;
    b->acc = buf ? (int32_t *)(buf + 4 * kd) : NULL;
    return buf;
}

/* Segmented items (decode rows, a short chunk): item it is row r's segment sg (first[r] <= it < first[r + 1]), its
 * KV heads in turn (a slot's rows of every head are adjacent: one stream from memory), or one head of it where
 * segments are too few to keep every thread busy (the same segment() calls either way); parts [item][KVH][G * qn]
 * x (D outputs, max, sum), then merged per row in segment order. A decode row is a chunk of one (qn = 1). */
static int segmented(const keys8 *base, const int64_t *slots, int64_t Lmax, const int64_t *lens, const queries8 *Q,
                     int R, int qn, float *out, int64_t os) {
    const int D = base->D, G = base->G, H = base->H, KVH = base->KVH, rows = G * qn;
    const size_t pstride = (size_t)rows * (D + 2);
    int64_t *first = (int64_t *)malloc(sizeof(int64_t) * ((size_t)R + 1));
    if (!first) return -1;
    first[0] = 0;
    for (int r = 0; r < R; r++) first[r + 1] = first[r] + (lens[r] + SEG - 1) / SEG;
    const int64_t items = first[R];
    float *parts = (float *)malloc(sizeof(float) * (size_t)items * KVH * pstride);
    if (!parts) { free(first); return -1; }
    int failed = 0;
    #pragma omp parallel
    {
        block8 b;
        void *buf = block_buffers(&b, D);
        float *ao = (float *)malloc(sizeof(float) * (size_t)D);
        if (!buf || !ao) {
            #pragma omp atomic write
            failed = 1;
        }
        int r = 0;
        /* with fewer segments than twice the threads (short contexts), an item is one head of a segment */
        const int per_head = items < 2 * omp_get_num_threads() && KVH > 1, heads = per_head ? KVH : 1;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t ih = 0; ih < items * heads; ih++) {
            if (!buf || !ao) continue;
            const int64_t it = ih / heads;
            while (first[r + 1] <= it) r++;
            while (first[r] > it) r--;
            keys8 kv = *base;
            kv.slots = slots + (int64_t)r * Lmax;
            kv.m = (int)lens[r];
            const int sg = (int)(it - first[r]);
            const int g0 = per_head ? (int)(ih % heads) : 0, g1 = per_head ? g0 + 1 : KVH;
            const int64_t at = (int64_t)r * qn * H;   /* row r's queries */
            const queries8 Qr = {Q->qi + at * D, Q->qc + at, Q->qsum + at};
            segment(&kv, g0, g1, &Qr, kv.m - qn, 0, qn, sg * SEG_BLOCKS, (sg + 1) * SEG_BLOCKS, &b,
                    parts + ((size_t)it * KVH + g0) * pstride, pstride);
        }
        #pragma omp for schedule(static)
        for (int64_t it = 0; it < (int64_t)R * KVH * rows; it++) {
            if (!buf || !ao) continue;
            const int rq = (int)(it / ((int64_t)KVH * rows)), g = (int)(it / rows % KVH), rr = (int)(it % rows);
            float top = -INFINITY, total = 0.f;
            memset(ao, 0, sizeof(float) * (size_t)D);
            for (int64_t item = first[rq]; item < first[rq + 1]; item++) {
                const float *part = parts + ((size_t)item * KVH + g) * pstride;
                merge(&top, &total, ao, part[(size_t)rows * D + rr], part[(size_t)rows * D + rows + rr],
                      part + (size_t)rr * D, D);
            }
            finish(ao, total, out + rq * os + ((int64_t)(rr % qn) * H + g * G + rr / qn) * D, D);
        }
        free(buf);
        free(ao);
    }
    free(parts);
    free(first);
    return failed ? -1 : 0;
}

/* A long chunk: items (KV head, FQ query positions), the last positions (the most keys) first, each merging its
 * segments as they end (the same segment() and merge() calls a short chunk makes, in the same order). */
static int blocked(const keys8 *kv, const queries8 *Q, int n, float *out) {
    const int D = kv->D, G = kv->G, H = kv->H, KVH = kv->KVH, nqb = (n + FQ - 1) / FQ, rows_max = G * FQ;
    const int64_t pos0 = (int64_t)kv->m - n;
    int failed = 0;
    #pragma omp parallel
    {
        block8 b;
        void *buf = block_buffers(&b, D);
        float *f = (float *)malloc(sizeof(float) * (size_t)rows_max * (2 * D + 4));
        if (!buf || !f) {
            #pragma omp atomic write
            failed = 1;
        }
        float *st = f, *ao = st + (size_t)rows_max * (D + 2), *amx = ao + (size_t)rows_max * D, *asum = amx + rows_max;
        #pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < nqb * KVH; it++) {
            if (!buf || !f) continue;
            const int g = it / nqb, qb = nqb - 1 - it % nqb, i0 = qb * FQ;
            const int qn = n - i0 < FQ ? n - i0 : FQ, rows = G * qn;
            const int64_t p0 = pos0 + i0;
            for (int r = 0; r < rows; r++) { amx[r] = -INFINITY; asum[r] = 0.f; }
            memset(ao, 0, sizeof(float) * (size_t)rows * D);
            const int segs = (int)((p0 + qn - 1) / SEG) + 1;
            const float *o = st, *mx = st + (size_t)rows * D, *sum = mx + rows;   /* segment()'s layout */
            for (int sg = 0; sg < segs; sg++) {
                segment(kv, g, g + 1, Q, p0, i0, qn, sg * SEG_BLOCKS, (sg + 1) * SEG_BLOCKS, &b, st, 0);
                for (int rr = 0; rr < rows; rr++)
                    merge(&amx[rr], &asum[rr], ao + (size_t)rr * D, mx[rr], sum[rr], o + (size_t)rr * D, D);
            }
            for (int rr = 0; rr < rows; rr++)
                finish(ao + (size_t)rr * D, asum[rr], out + ((int64_t)(i0 + rr % qn) * H + g * G + rr / qn) * D, D);
        }
        free(buf);
        free(f);
    }
    return failed ? -1 : 0;
}

/* the queries as int8 with their factors and sums (one allocation), or NULL when out of memory */
static void *queries(const float *q, int64_t qs, int n, int H, int D, float scale, queries8 *Q) {
    const size_t rows = (size_t)n * H;
    void *mem = malloc((sizeof(float) + sizeof(int32_t) + (size_t)D) * rows + 64);
    if (!mem) return NULL;
    float *qc = (float *)mem;
    int32_t *qsum = (int32_t *)(qc + rows);
    int8_t *qi = (int8_t *)(qsum + rows);
    quantize_queries(q, qs, n, H, D, scale, qi, qc, qsum);
    Q->qi = qi;
    Q->qc = qc;
    Q->qsum = qsum;
    return mem;
}

int kv8_attention(const float *q, int64_t qs, const int8_t *k, const int8_t *v, const float *ks, const float *vs,
                  const int64_t *slots, float *out, int n, int m, int H, int KVH, int D, float scale) {
    if (!shape_ok(H, KVH, D) || m < n) return -3;
    if (n <= 0) return 0;
    queries8 Q;
    void *mem = queries(q, qs, n, H, D, scale, &Q);
    if (!mem) return -1;
    const keys8 kv = {k, v, ks, vs, slots, m, KVH, D, H / KVH, H};
    int rc;
    if (n <= FQ) {
        const int64_t lens = m;
        rc = segmented(&kv, slots, m, &lens, &Q, 1, n, out, 0);
    } else {
        rc = blocked(&kv, &Q, n, out);
    }
    free(mem);
    return rc;
}

int kv8_decode(const float *q, int64_t qs, const int8_t *k, const int8_t *v, const float *ks, const float *vs,
               const int64_t *slots, int64_t Lmax, const int64_t *lens, float *out, int64_t os, int R, int H, int KVH,
               int D, float scale) {
    if (!shape_ok(H, KVH, D)) return -3;
    for (int r = 0; r < R; r++)
        if (lens[r] < 1 || lens[r] > Lmax) return -3;
    if (R <= 0) return 0;
    queries8 Q;
    void *mem = queries(q, qs, R, H, D, scale, &Q);
    if (!mem) return -1;
    const keys8 kv = {k, v, ks, vs, slots, 0, KVH, D, H / KVH, H};
    const int rc = segmented(&kv, slots, Lmax, lens, &Q, R, 1, out, os);
    free(mem);
    return rc;
}
#else
int kv8_ready(void) { return 0; }

int kv8_store(const float *src, int64_t ss, int8_t *buf, float *scales, const int64_t *slots, int R, int KVH, int D) {
    (void)src; (void)ss; (void)buf; (void)scales; (void)slots; (void)R; (void)KVH; (void)D;
    return -2;
}

int kv8_attention(const float *q, int64_t qs, const int8_t *k, const int8_t *v, const float *ks, const float *vs,
                  const int64_t *slots, float *out, int n, int m, int H, int KVH, int D, float scale) {
    (void)q; (void)qs; (void)k; (void)v; (void)ks; (void)vs; (void)slots; (void)out; (void)n; (void)m; (void)H;
    (void)KVH; (void)D; (void)scale;
    return -2;
}

int kv8_decode(const float *q, int64_t qs, const int8_t *k, const int8_t *v, const float *ks, const float *vs,
               const int64_t *slots, int64_t Lmax, const int64_t *lens, float *out, int64_t os, int R, int H, int KVH,
               int D, float scale) {
    (void)q; (void)qs; (void)k; (void)v; (void)ks; (void)vs; (void)slots; (void)Lmax; (void)lens; (void)out; (void)os;
    (void)R; (void)H; (void)KVH; (void)D; (void)scale;
    return -2;
}
#endif
