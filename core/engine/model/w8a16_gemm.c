/* int8 projections with int16 activations on AVX512-VNNI (and AMX-INT8 tiles for many rows): exact integer sums.
 *
 * Why: on a CPU whose FMA units do 16 fp32 multiply-adds a cycle (AMD Zen 4), `w8_panel_gemm` already runs at the
 * FMA peak, and a 1,024-token prefill of the default model was 1.1x HF's. VPDPWSSD does 32 int16 products a cycle
 * on the same units: twice the rate. Each row of x is rounded once to int16 (one scale per row: xq = round(x *
 * A16_MAX / max|x|)), and every output is the integer sum of xq[k] * q[n, k], exact in any order, then times
 * (max|x| / A16_MAX) * scale[n], plus bias[n], in double and rounded to fp32 by one epilogue. So a row's output is
 * the same bits whatever batch, chunk or kernel path it ran in (a decode step, a mixed step, a prefill chunk):
 * cache on == cache off needs no agreed order of sums at all.
 *
 * |xq| <= A16_MAX = 2^14 - 1 so that a 32-bit lane holds BLOCK_K products (2 * 16383 * 127 * 512 < 2^31); longer
 * rows are summed in blocks of BLOCK_K into 64-bit totals (exact too). The weights are panels of 16 channels, GROUP
 * side by side as `w8_panel_gemm`'s, with k in pairs (native_int8.pack_pairs): a k pair of a panel is 32 bytes
 * (w[k][j], w[k + 1][j]) for its 16 channels j, widened to int16 by one instruction. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define A16_VNNI 1
#define A16_AVX2 0
#elif defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)   /* AVX-512 without VNNI keeps its panels */
#include <immintrin.h>
#define A16_VNNI 0
#define A16_AVX2 1      /* VPMADDWD + VPADDD: the same exact sums, 8 lanes (w8a16_avx2.h) */
#else
#define A16_VNNI 0
#define A16_AVX2 0
#endif
#include "native_kernels.h"

#define A16_MAX 16383
#define A16_TINY 7.8886091e-31f   /* 2^-100: a row whose largest value is below it counts as zero */
#define BLOCK_K 1024    /* products per 32-bit lane before it is added into the 64-bit total (see above) */
#if A16_VNNI
#define A16_ROWS 12     /* rows of a many-rows register block (12 accumulators + the weights) */
#else
#define A16_ROWS 6      /* AVX2: 6 rows x 2 halves = 12 sums, 2 weight halves and a broadcast (16 registers) */
#endif
#define A16_BLOCK 96    /* rows of xq kept in L2 while every panel passes over them (a multiple of A16_ROWS) */
#define A16_PREFETCH 8192   /* bytes ahead of a decode row's weight stream: a decode step at 128 tokens 1.09x /
                             * 1.13x / 1.11x faster with 4,096 / 8,192 / 16,384 than with 1,024 (Intel Xeon, Emerald
                             * Rapids; bench_kernels_ab.py); 512-4,096 alike on AMD Zen 3 */
#define A16_FEW 32      /* below this many rows: the decode blocking (rows x panels) */
#define GROUP 8         /* panels side by side: panel_gemm.c's layout */

int w8a16_ready(void) { return A16_VNNI || A16_AVX2; }

#if A16_VNNI
/* each row of x as int16 (xq) and its scale (max|x| / A16_MAX; NaN when the row holds a NaN or an infinity, so the
 * outputs are NaN as fp32 arithmetic would make them, not finite garbage; 0 for a row below A16_TINY, whose
 * A16_MAX / max|x| would overflow: zero, as x16 flushes values below 2^-111). Rounding half to even (the MXCSR
 * default, as torch.round). */
static void quantize_rows(const float *x, int16_t *xq, double *sx, int M, int K) {
    #pragma omp parallel for schedule(static) if (M >= 4)
    for (int m = 0; m < M; m++) {
        const float *r = x + (int64_t)m * K;
        int16_t *q = xq + (int64_t)m * K;
        __m512 vmax = _mm512_setzero_ps();
        __mmask16 bad = 0;
        const __m512 big = _mm512_set1_ps(3.4028235e38f);
        for (int k = 0; k < K; k += 16) {
            const __mmask16 in = K - k >= 16 ? 0xffff : (__mmask16)((1u << (K - k)) - 1);
            const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(in, r + k));
            bad |= _mm512_mask_cmp_ps_mask(in, a, big, _CMP_NLE_UQ);   /* NaN or infinity */
            vmax = _mm512_max_ps(vmax, a);
        }
        const float amax = _mm512_reduce_max_ps(vmax);
        if (bad || amax < A16_TINY) {
            memset(q, 0, sizeof(int16_t) * (size_t)K);
            sx[m] = bad ? NAN : 0.0;
            continue;
        }
        const __m512 inv = _mm512_set1_ps((float)A16_MAX / amax);
        const __m512i hi = _mm512_set1_epi32(A16_MAX), lo = _mm512_set1_epi32(-A16_MAX);
        for (int k = 0; k < K; k += 16) {
            const __mmask16 in = K - k >= 16 ? 0xffff : (__mmask16)((1u << (K - k)) - 1);
            __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(in, r + k), inv));
            v = _mm512_max_epi32(_mm512_min_epi32(v, hi), lo);
            _mm256_mask_storeu_epi16(q + k, in, _mm512_cvtepi32_epi16(v));
        }
        sx[m] = (double)amax / A16_MAX;
    }
}
#endif

/* panel np of N/16 in the grouped pair layout: GROUP panels side by side for each k pair ([K/2][GROUP * 32] bytes a
 * group; the last group as wide as the panels left). Its first byte, and the bytes between k and k + 2 over 2. */
static inline const int8_t *panel_at(const int8_t *panels, int np, int NP, int K, int64_t *stride) {
    const int g = np / GROUP, width = (NP - g * GROUP < GROUP ? NP - g * GROUP : GROUP) * 16;
    *stride = width;
    return panels + (int64_t)g * GROUP * 16 * K + (np - g * GROUP) * 32;
}

#if A16_VNNI
/* the one epilogue: y[0..16) = (float)(total * (sx * scale)) + bias, in double until the one rounding to fp32
 * (compiled once, so every path rounds alike) */
__attribute__((noinline)) static void a16_store(const int64_t *total, double sx, const float *scales,
                                                const float *bias, float *y) {
    const __m512d s = _mm512_set1_pd(sx);
    const __m512d lo = _mm512_mul_pd(_mm512_cvtepi64_pd(_mm512_loadu_si512((const void *)total)),
                                     _mm512_mul_pd(s, _mm512_cvtps_pd(_mm256_loadu_ps(scales))));
    const __m512d hi = _mm512_mul_pd(_mm512_cvtepi64_pd(_mm512_loadu_si512((const void *)(total + 8))),
                                     _mm512_mul_pd(s, _mm512_cvtps_pd(_mm256_loadu_ps(scales + 8))));
    __m512 v = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1);
    if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias));
    _mm512_storeu_ps(y, v);
}
#endif

#if A16_VNNI
/* channels 0-15 of a panel at k steps k and k + 1 (k even) as 16 int16 pairs (w[k][j], w[k + 1][j]) */
static inline __m512i pair_weights(const int8_t *p, int64_t stride, int k) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p + (int64_t)k * stride)));
}

static inline __m512i pair_of(const int16_t *x, int k) {
    int32_t v;
    memcpy(&v, x + k, sizeof v);
    return _mm512_set1_epi32(v);
}

/* total[0..16) = acc widened to 64 bits (the first k block), or += it (the next ones) */
static inline void add_total(int64_t *total, __m512i acc, int first) {
    __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(acc));
    __m512i hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(acc, 1));
    if (!first) {
        lo = _mm512_add_epi64(lo, _mm512_loadu_si512((const void *)total));
        hi = _mm512_add_epi64(hi, _mm512_loadu_si512((const void *)(total + 8)));
    }
    _mm512_storeu_si512((void *)total, lo);
    _mm512_storeu_si512((void *)(total + 8), hi);
}

/* totals[r][0..16) += sum over k in [k0, k1) of xq[r][k] * panel[k][0..16), `rows` (<= A16_ROWS) rows */
static void a16_block(const int16_t *xq, int K, const int8_t *panel, int64_t stride, int k0, int k1, int rows,
                      int64_t (*total)[16]) {
    if (rows == A16_ROWS) {
        __m512i a[A16_ROWS];
        for (int r = 0; r < A16_ROWS; r++) a[r] = _mm512_setzero_si512();
        for (int k = k0; k < k1; k += 2) {
            const __m512i w = pair_weights(panel, stride, k);
            for (int r = 0; r < A16_ROWS; r++) a[r] = _mm512_dpwssd_epi32(a[r], w, pair_of(xq + (int64_t)r * K, k));
        }
        for (int r = 0; r < A16_ROWS; r++) add_total(total[r], a[r], k0 == 0);
        return;
    }
    for (int r = 0; r < rows; r++) {
        __m512i a = _mm512_setzero_si512();
        for (int k = k0; k < k1; k += 2) a = _mm512_dpwssd_epi32(a, pair_weights(panel, stride, k),
                                                                 pair_of(xq + (int64_t)r * K, k));
        add_total(total[r], a, k0 == 0);
    }
}

/* totals[r * pb + p] += the sums of `rows` (1 or 2) rows over pb (<= 8) side-by-side panels, k in [k0, k1) */
static void a16_few(const int16_t *xq, int K, const int8_t *panel, int64_t stride, int k0, int k1, int rows, int pb,
                    int64_t (*total)[16]) {
    __m512i a[2][GROUP];
    for (int r = 0; r < 2; r++) for (int p = 0; p < GROUP; p++) a[r][p] = _mm512_setzero_si512();
    for (int k = k0; k < k1; k += 2) {
        for (int64_t b = 0; b < pb * 32; b += 64) __builtin_prefetch(panel + (int64_t)k * stride + b + A16_PREFETCH);
        const __m512i x0 = pair_of(xq, k), x1 = rows > 1 ? pair_of(xq + K, k) : x0;
        for (int p = 0; p < pb; p++) {
            const __m512i w = pair_weights(panel + p * 32, stride, k);
            a[0][p] = _mm512_dpwssd_epi32(a[0][p], w, x0);
            if (rows > 1) a[1][p] = _mm512_dpwssd_epi32(a[1][p], w, x1);
        }
    }
    for (int r = 0; r < rows; r++) for (int p = 0; p < pb; p++) add_total(total[r * pb + p], a[r][p], k0 == 0);
}

#endif

#if A16_AVX2
#include "w8a16_avx2.h"
#endif

#if A16_VNNI || A16_AVX2
/* the drivers both builds share: row blocks of A16_ROWS against each panel, or (decode) pairs of rows against a
 * group of panels; a16_block, a16_few, a16_store are the build's own */
static void many_rows(const int16_t *xq, const double *sx, const int8_t *panels, const float *scales,
                      const float *bias, float *y, int M, int N, int K) {
    const int NP = N / 16, MBLK = (M + A16_BLOCK - 1) / A16_BLOCK;
    #pragma omp parallel for collapse(2) schedule(static, 1)
    for (int mb = 0; mb < MBLK; mb++) {
        for (int np = 0; np < NP; np++) {
            int64_t stride;
            const int8_t *panel = panel_at(panels, np, NP, K, &stride);
            const int m_end = (mb + 1) * A16_BLOCK < M ? (mb + 1) * A16_BLOCK : M;
            for (int m0 = mb * A16_BLOCK; m0 < m_end; m0 += A16_ROWS) {
                const int rows = m_end - m0 < A16_ROWS ? m_end - m0 : A16_ROWS;
                int64_t total[A16_ROWS][16];
                for (int k0 = 0; k0 < K; k0 += BLOCK_K)
                    a16_block(xq + (int64_t)m0 * K, K, panel, stride, k0, k0 + BLOCK_K < K ? k0 + BLOCK_K : K, rows,
                              total);
                for (int r = 0; r < rows; r++)
                    a16_store(total[r], sx[m0 + r], scales + np * 16, bias ? bias + np * 16 : NULL,
                              y + (int64_t)(m0 + r) * N + np * 16);
            }
        }
    }
}

/* (decode) pairs of rows against every panel, each thread its share of the panels (panel_share, run_end) */
static void few_rows(const int16_t *xq, const double *sx, const int8_t *panels, const float *scales,
                     const float *bias, float *y, int M, int N, int K) {
    const int NP = N / 16;
    #pragma omp parallel
    {
        const int threads = omp_get_num_threads(), t = omp_get_thread_num(), end = panel_share(NP, t + 1, threads);
        for (int p0 = panel_share(NP, t, threads); p0 < end;) {
            const int pb = run_end(p0, end, GROUP) - p0;
            int64_t stride;
            const int8_t *panel = panel_at(panels, p0, NP, K, &stride);
            for (int m0 = 0; m0 < M; m0 += 2) {
                const int rows = M - m0 >= 2 ? 2 : 1;
                int64_t total[2 * GROUP][16];
                for (int k0 = 0; k0 < K; k0 += BLOCK_K)
                    a16_few(xq + (int64_t)m0 * K, K, panel, stride, k0, k0 + BLOCK_K < K ? k0 + BLOCK_K : K, rows,
                            pb, total);
                for (int r = 0; r < rows; r++)
                    for (int p = 0; p < pb; p++)
                        a16_store(total[r * pb + p], sx[m0 + r], scales + (p0 + p) * 16,
                                  bias ? bias + (p0 + p) * 16 : NULL, y + (int64_t)(m0 + r) * N + (p0 + p) * 16);
            }
            p0 += pb;
        }
    }
}
#endif

#if A16_VNNI && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define A16_AMX 1
#include "native_simd.h"   /* load_full_tiles, split_int16 */

int w8a16_amx_ready(void) { return amx_ready(); }

/* Many rows on AMX tiles, the same exact integer sums: each xq = 256 xh + xl with xh = xq >> 8 (int8, -64 .. 63) and
 * xl = xq & 255 (uint8), so sum xq q = 256 sum xh q + sum xl q, each an int8 tile product (TDPBSSD, TDPBUSD) summed
 * exactly in int32 (|sum| < 255 x 127 x K < 2^31 for K < 66,000), then combined in 64 bits and stored by a16_store,
 * the panels' epilogue: the same bits as w8a16_gemm, on a CPU with AMX at tile speed (a prompt chunk's projections).
 * The weights as int8 tiles `quads` [N/16][K/64][16 k quads][16 channels][4] (native_int8.pack_quads); a block of
 * 16 rows x 32 channels takes all 8 tiles (2 x 2 sums, xh and xl, 2 weight tiles). */
static void split_rows_s8(const int16_t *xq, int8_t *xh, uint8_t *xl, int M, int Mp, int K) {
    #pragma omp parallel for schedule(static)
    for (int m = 0; m < Mp; m++) {
        int8_t *h = xh + (int64_t)m * K;
        uint8_t *l = xl + (int64_t)m * K;
        if (m >= M) { memset(h, 0, (size_t)K); memset(l, 0, (size_t)K); continue; }
        for (int k = 0; k < K; k += 32) split_int16(xq + (int64_t)m * K + k, h + k, l + k);   /* K % 64 == 0 */
    }
}

/* the 16 rows' lines of the next k step's xh and xl tiles into L1 while this step's tile products run: the tile
 * loads of a chunk's rows (from L2) otherwise wait for them in turn (the projections of a 4,096-token prefill ran
 * 1.03-1.07x faster, the same bits) */
static inline void ask_rows(const int8_t *h, const uint8_t *l, int K) {
    for (int r = 0; r < 16; r++) {
        _mm_prefetch((const char *)(h + (int64_t)r * K), _MM_HINT_T0);
        _mm_prefetch((const char *)(l + (int64_t)r * K), _MM_HINT_T0);
    }
}

/* A block's two channel tiles: channels 32 nb .. + 31, or with silu (gate_up: gate channels 0 .. N/2 - 1, then up)
 * gate channels 16 nb .. + 15 and their up channels N/2 + 16 nb .., whose epilogue stores both as w8a16_gemm would
 * (a16_store) and writes silu(gate) * up to y [M, N/2] with silu_mul's operations on those fp32 values: the same bits
 * as the GEMM then silu_mul, without writing and rereading the [M, N] gate_up output. */
static int a16_amx(const int16_t *xq, const double *sx, const int8_t *quads, const float *scales, const float *bias,
                   float *y, int M, int N, int K, int silu) {
    const int KB = K / 64, NB = N / 32, MB = (M + 15) / 16;
    /* 16-row blocks per chunk: a chunk's xh and xl rows (2 K bytes a row) stay in L2 while every channel block runs;
     * chunks of equal size, so that (chunk, channel block) items deal out evenly (w8_x16.c's amx_gemm) */
    const int fit = (int)((1 << 20) / ((int64_t)2 * K * 16)), per = fit > 1 ? fit : 1;
    const int MC = (MB + per - 1) / per, BM = (MB + MC - 1) / MC;
    int8_t *xh = (int8_t *)malloc((size_t)MB * 16 * K);
    uint8_t *xl = (uint8_t *)malloc((size_t)MB * 16 * K);
    if (!xh || !xl) { free(xh); free(xl); return -1; }
    split_rows_s8(xq, xh, xl, M, MB * 16, K);
    #pragma omp parallel
    {
        load_full_tiles();
        int32_t c[4][16 * 16] __attribute__((aligned(64)));   /* xh x w0, xh x w1, xl x w0, xl x w1 */
        #pragma omp for collapse(2) schedule(static)
        for (int mc = 0; mc < MC; mc++) {
            for (int nb = 0; nb < NB; nb++) {
                const int n0[2] = {silu ? nb * 16 : nb * 32, silu ? N / 2 + nb * 16 : nb * 32 + 16};
                const int8_t *b0 = quads + (int64_t)(n0[0] / 16) * KB * 1024;   /* a channel tile's K/64 tiles */
                const int8_t *b1 = quads + (int64_t)(n0[1] / 16) * KB * 1024;
                const int mb_end = (mc + 1) * BM < MB ? (mc + 1) * BM : MB;
                for (int mb = mc * BM; mb < mb_end; mb++) {
                    const int8_t *ah = xh + (int64_t)mb * 16 * K;
                    const uint8_t *al = xl + (int64_t)mb * 16 * K;
                    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                    for (int kb = 0; kb < KB; kb++) {
                        if (kb + 1 < KB) ask_rows(ah + (kb + 1) * 64, al + (kb + 1) * 64, K);
                        _tile_loadd(6, b0 + (int64_t)kb * 1024, 64);
                        _tile_loadd(7, b1 + (int64_t)kb * 1024, 64);
                        _tile_loadd(4, ah + kb * 64, K);
                        _tile_loadd(5, al + kb * 64, K);
                        _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7);
                        _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7);
                    }
                    _tile_stored(0, c[0], 64); _tile_stored(1, c[1], 64);
                    _tile_stored(2, c[2], 64); _tile_stored(3, c[3], 64);
                    for (int r = 0; r < 16 && mb * 16 + r < M; r++) {
                        const int m = mb * 16 + r;
                        float out[2][16] __attribute__((aligned(64)));   /* silu: gate, up */
                        for (int t = 0; t < 2; t++) {
                            int64_t total[16] __attribute__((aligned(64)));
                            for (int j = 0; j < 16; j++)
                                total[j] = 256 * (int64_t)c[t][r * 16 + j] + c[2 + t][r * 16 + j];
                            a16_store(total, sx[m], scales + n0[t], bias ? bias + n0[t] : NULL,
                                      silu ? out[t] : y + (int64_t)m * N + n0[t]);
                        }
                        if (silu) {   /* silu_mul's operations (fused_elementwise.c) */
                            const __m512 g = _mm512_load_ps(out[0]);
                            const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
                            _mm512_storeu_ps(y + (int64_t)m * (N / 2) + nb * 16,
                                             _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)),
                                                           _mm512_load_ps(out[1])));
                        }
                    }
                }
            }
        }
        _tile_release();
    }
    free(xh);
    free(xl);
    return 0;
}
#else
#define A16_AMX 0
int w8a16_amx_ready(void) { return 0; }
#endif

static int amx_gemm_rows(const float *x, const int8_t *quads, const float *scales, const float *bias, float *y,
                         int M, int N, int K, int silu) {
#if A16_AMX
    if (M <= 0) return 0;
    if (!amx_ready()) return -2;
    int16_t *xq = (int16_t *)malloc((size_t)M * K * sizeof(int16_t));
    double *sx = (double *)malloc((size_t)M * sizeof(double));
    int rc = -1;
    if (xq && sx) {
        quantize_rows(x, xq, sx, M, K);
        rc = a16_amx(xq, sx, quads, scales, bias, y, M, N, K, silu);
    }
    free(xq);
    free(sx);
    return rc;
#else
    (void)x; (void)quads; (void)scales; (void)bias; (void)y; (void)M; (void)N; (void)K; (void)silu;
    return -2;
#endif
}

/* y[M, N] = xq @ q^T * (sx * scales) (+ bias) on AMX tiles, q as `quads`; N % 32 == 0, K % 64 == 0 (the wrapper
 * checks). The same bits as w8a16_gemm. Returns -1 when out of memory, -2 when built without AMX-INT8. */
int w8a16_amx_gemm(const float *x, const int8_t *quads, const float *scales, const float *bias, float *y,
                   int M, int N, int K) {
    return amx_gemm_rows(x, quads, scales, bias, y, M, N, K, 0);
}

/* gate_up's rows on AMX tiles with silu(gate) * up in the epilogue: y [M, N/2] (a16_amx) */
int w8a16_amx_gemm_silu(const float *x, const int8_t *quads, const float *scales, const float *bias, float *y,
                        int M, int N, int K) {
    return amx_gemm_rows(x, quads, scales, bias, y, M, N, K, 1);
}

/* y[M, N] = xq @ q^T * (sx * scales) (+ bias), q in panels; N % 16 == 0, K even. Returns -1 when out of memory (the
 * int16 rows), -2 when built without AVX512-VNNI or AVX2. */
int w8a16_gemm(const float *x, const int8_t *panels, const float *scales, const float *bias, float *y,
               int M, int N, int K) {
#if A16_VNNI || A16_AVX2
    if (M <= 0) return 0;
    int16_t stack_q[8192];
    double stack_s[32];
    const int64_t n = (int64_t)M * K;
    int16_t *xq = n <= 8192 ? stack_q : (int16_t *)malloc((size_t)n * sizeof(int16_t));
    double *sx = M <= 32 ? stack_s : (double *)malloc((size_t)M * sizeof(double));
    if (!xq || !sx) {
        if (xq != stack_q) free(xq);
        if (sx != stack_s) free(sx);
        return -1;
    }
    quantize_rows(x, xq, sx, M, K);
    (M < A16_FEW ? few_rows : many_rows)(xq, sx, panels, scales, bias, y, M, N, K);
    if (xq != stack_q) free(xq);
    if (sx != stack_s) free(sx);
    return 0;
#else
    (void)x; (void)panels; (void)scales; (void)bias; (void)y; (void)M; (void)N; (void)K;
    return -2;
#endif
}
