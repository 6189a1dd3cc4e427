/* The int8 projections on x16 activations (each row rounded to 16 significant bits, round16: then every product
 * x16[k] * q[n, k] is exact in fp32): w8_gemv for a few rows (decode) in FMAs, w8_amx_gemm for many (prefill) on AMX
 * tiles where the CPU and compiler have them, and w8_amx_gemm_silu, the same for gate_up with silu(gate) * up in its
 * epilogue. (w8_panel_gemm, panel_gemm.c, adds the same products for any number of rows without AMX.)
 *
 * Built with -O3 -march=native -fopenmp and fast-math's reassociation and contraction (not -ffast-math itself:
 * native_kernels.py says why). */
#ifndef _GNU_SOURCE   /* a harness may define it (benchmarks/bench_kv8_phases.py) */
#define _GNU_SOURCE   /* syscall() (amx_ready) under -std=c11: gcc 14 refuses an implicit declaration */
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include "native_simd.h"
#include "native_kernels.h"

/* An int8 projection's activations, rounded to 16 significant bits (to nearest, ties to even): a 16-bit
 * significand times an int8 (7 bits and a sign) fits fp32's 24 bits, so every product is exact, and the same
 * x16 is exactly two bf16 (hi: its top 8 bits; lo: the next 8), which AMX tiles multiply exactly. inf and nan
 * pass through; a finite x that rounds past FLT_MAX becomes inf (as any rounding to 16 bits would). x16 below
 * X16_MIN in magnitude is flushed to a signed zero: there lo would be a subnormal bf16, which AMX reads as zero,
 * so the kernels would no longer add the same products (activations that small carry nothing anyway). Both
 * kernels round first, so they add the same products. */
#define X16_MIN_EXP 16u   /* biased fp32 exponent of X16_MIN = 2^-111: lo's last bit (2^-15 below) is >= 2^-126 */
static inline uint32_t round16_bits(uint32_t u) {
    if ((u & 0x7F800000u) == 0x7F800000u) return u;
    const uint32_t r = (u + 0x7Fu + ((u >> 8) & 1u)) & 0xFFFFFF00u;
    return (r & 0x7F800000u) < (X16_MIN_EXP << 23) ? (u & 0x80000000u) : r;
}

#if defined(__AVX512F__)
static inline __m512i round16_epi32(__m512i u) {
    const __m512i expo = _mm512_set1_epi32(0x7F800000);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 8), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7F))),
                                 _mm512_set1_epi32((int)0xFFFFFF00u));
    const __mmask16 tiny = _mm512_cmplt_epu32_mask(_mm512_and_si512(r, expo), _mm512_set1_epi32((int)(X16_MIN_EXP << 23)));
    r = _mm512_mask_mov_epi32(r, tiny, _mm512_and_si512(u, _mm512_set1_epi32((int)0x80000000u)));
    return _mm512_mask_mov_epi32(r, _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, expo), expo), u);
}
#endif

/* dst[0..n) = x16 of src[0..n) */
void round16(const float *src, float *dst, int64_t n) {
    const uint32_t *s = (const uint32_t *)src;
    uint32_t *d = (uint32_t *)dst;
    #pragma omp parallel for schedule(static) if (n >= 65536)
    for (int64_t b = 0; b < (n + 4095) / 4096; b++) {
        int64_t i = b * 4096;
        const int64_t end = i + 4096 < n ? i + 4096 : n;
#if defined(__AVX512F__)
        for (; i + 16 <= end; i += 16)
            _mm512_storeu_si512((void *)(d + i), round16_epi32(_mm512_loadu_si512((const void *)(s + i))));
#endif
        for (; i < end; i++) d[i] = round16_bits(s[i]);
    }
}

/* y[M, N] = x[M, K] @ (w[N, K] * scales[N])^T (+ bias[N]); x (already x16), y, scales, bias fp32. */
static void w8_rows_generic(const float *x, const int8_t *w, const float *scales, const float *bias, float *y,
                            int M, int N, int K, int n0, int n1) {
    for (int n = n0; n < n1; n++) {
        const int8_t *wr = w + (int64_t)n * K;
        for (int m = 0; m < M; m++) {
            const float *xr = x + (int64_t)m * K;
            float acc = 0.f;
            #pragma omp simd reduction(+:acc)
            for (int k = 0; k < K; k++) acc += xr[k] * (float)wr[k];
            y[(int64_t)m * N + n] = acc * scales[n] + (bias ? bias[n] : 0.f);
        }
    }
}

#if defined(__AVX512F__)
static inline __m512 cvt_i8x16(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
/* 4 output channels x MB rows of x, K % 16 == 0: each weight vector is converted once per MB rows. */
#define W8_BLOCK(MB)                                                                                     \
static void w8_block_m##MB(const float *x, const int8_t *w, const float *scales, const float *bias,      \
                           float *y, int N, int K, int n, int m0) {                                      \
    __m512 acc[MB][4];                                                                                   \
    for (int i = 0; i < MB; i++) for (int c = 0; c < 4; c++) acc[i][c] = _mm512_setzero_ps();           \
    const int8_t *w0 = w + (int64_t)n * K;                                                               \
    for (int k = 0; k < K; k += 16) {                                                                    \
        __m512 wv[4];                                                                                    \
        for (int c = 0; c < 4; c++) wv[c] = cvt_i8x16(w0 + (int64_t)c * K + k);                          \
        for (int i = 0; i < MB; i++) {                                                                   \
            const __m512 xv = _mm512_loadu_ps(x + (int64_t)(m0 + i) * K + k);                            \
            for (int c = 0; c < 4; c++) acc[i][c] = _mm512_fmadd_ps(xv, wv[c], acc[i][c]);               \
        }                                                                                                \
    }                                                                                                    \
    for (int i = 0; i < MB; i++)                                                                         \
        for (int c = 0; c < 4; c++)                                                                      \
            y[(int64_t)(m0 + i) * N + n + c] = _mm512_reduce_add_ps(acc[i][c]) * scales[n + c]          \
                                               + (bias ? bias[n + c] : 0.f);                             \
}
W8_BLOCK(1) W8_BLOCK(2) W8_BLOCK(3) W8_BLOCK(4)

/* One output channel against MB rows of x, K % 32 == 0: the channel's weights are converted once
 * (two independent accumulators per row hide the FMA latency). */
#define W8_ROW(MB)                                                                                       \
static void w8_row_m##MB(const float *x, const int8_t *wr, int K, float *out) {                          \
    __m512 a[MB][2];                                                                                     \
    for (int i = 0; i < MB; i++) { a[i][0] = _mm512_setzero_ps(); a[i][1] = _mm512_setzero_ps(); }       \
    for (int k = 0; k < K; k += 32) {                                                                    \
        const __m512i b = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wr + k)));          \
        const __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(b)));          \
        const __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(b, 1)));    \
        for (int i = 0; i < MB; i++) {                                                                   \
            a[i][0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + (int64_t)i * K + k), w0, a[i][0]);             \
            a[i][1] = _mm512_fmadd_ps(_mm512_loadu_ps(x + (int64_t)i * K + k + 16), w1, a[i][1]);        \
        }                                                                                                \
    }                                                                                                    \
    for (int i = 0; i < MB; i++) out[i] = _mm512_reduce_add_ps(_mm512_add_ps(a[i][0], a[i][1]));        \
}
W8_ROW(1) W8_ROW(2) W8_ROW(3) W8_ROW(4)
#endif

/* The weight rows are streamed once per decode step (134 MB for the default model, not cached): the hardware
 * prefetcher alone kept one row at a time at 10-13 GB/s; fetching the lines 4 KB ahead by hand reached 15-21 GB/s
 * (bench_int8_gemm.py's decode step; 1, 2, 6 and 8 KB measured no better). 0: no prefetch (benchmarks). */
int w8_prefetch = 4096;
/* Up to this many rows one channel at a time (w8_row_m*), from there blocks of 4 channels x 4 rows (w8_block_m*):
 * bench_int8_gemm.py's decode batches, 30 layers of SmolLM2's shapes side by side: blocks won from 3 rows (3 rows
 * 4.64 vs 5.29 ms, 8 rows 9.13 vs 13.45 ms: 1.14x to 1.47x), one channel at a time at 1 and 2 (8 was the limit).
 * The two sum in other orders (two accumulators over 32 k a step vs one over 16), so a decode row's projections
 * differ by fp32 rounding between steps of 1-2 rows and of 3 or more; one accumulator in the row kernel too made
 * one row 10-15 % slower (tried). */
int w8_row_max = 2;

static void w8_gemv_x16(const float *x, const int8_t *w, const float *scales, const float *bias, float *y,
                        int M, int N, int K) {
#if defined(__AVX512F__)
    /* Measured on SmolLM2's shapes (30 layers, int8 weights): one output channel at a time (w8_row_m*)
     * streams 13-15 GB/s for one row (the plain loop: 11-13); from w8_row_max + 1 rows on, blocks of 4
     * channels x 4 rows (w8_block_m*) win (w8_row_max says by how much). */
    if (K % 32 == 0 && M <= w8_row_max) {
        #pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const int8_t *wr = w + (int64_t)n * K;
            if (w8_prefetch)   /* w8_prefetch bytes ahead (a prefetch never faults) */
                for (int k = 0; k < K; k += 64) _mm_prefetch((const char *)(wr + w8_prefetch + k), _MM_HINT_T0);
            for (int m0 = 0; m0 < M; m0 += 4) {
                float out[4];
                const int mb = M - m0 >= 4 ? 4 : M - m0;
                const float *xb = x + (int64_t)m0 * K;
                switch (mb) {
                    case 4: w8_row_m4(xb, wr, K, out); break;
                    case 3: w8_row_m3(xb, wr, K, out); break;
                    case 2: w8_row_m2(xb, wr, K, out); break;
                    default: w8_row_m1(xb, wr, K, out); break;
                }
                for (int i = 0; i < mb; i++)
                    y[(int64_t)(m0 + i) * N + n] = out[i] * scales[n] + (bias ? bias[n] : 0.f);
            }
        }
        return;
    }
    if (K % 16 == 0 && M > w8_row_max) {
        const int blocks = N / 4;
        #pragma omp parallel for schedule(static)
        for (int b = 0; b < blocks; b++) {
            const int8_t *wb = w + (int64_t)b * 4 * K;
            if (w8_prefetch)
                for (int k = 0; k < 4 * K; k += 64) _mm_prefetch((const char *)(wb + w8_prefetch + k), _MM_HINT_T0);
            for (int m0 = 0; m0 < M; m0 += 4) {
                switch (M - m0 >= 4 ? 4 : M - m0) {
                    case 4: w8_block_m4(x, w, scales, bias, y, N, K, b * 4, m0); break;
                    case 3: w8_block_m3(x, w, scales, bias, y, N, K, b * 4, m0); break;
                    case 2: w8_block_m2(x, w, scales, bias, y, N, K, b * 4, m0); break;
                    default: w8_block_m1(x, w, scales, bias, y, N, K, b * 4, m0); break;
                }
            }
        }
        w8_rows_generic(x, w, scales, bias, y, M, N, K, blocks * 4, N);
        return;
    }
#endif
    const int NB = 16;
    const int blocks = (N + NB - 1) / NB;
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < blocks; b++) {
        const int n0 = b * NB, n1 = n0 + NB < N ? n0 + NB : N;
        w8_rows_generic(x, w, scales, bias, y, M, N, K, n0, n1);
    }
}

/* Returns -1 when out of memory (the x16 copy of x). */
int w8_gemv(const float *x, const int8_t *w, const float *scales, const float *bias, float *y, int M, int N, int K) {
    float stack[4096];
    const int64_t n = (int64_t)M * K;
    float *x16 = n <= 4096 ? stack : (float *)malloc((size_t)n * sizeof(float));
    if (!x16) return -1;
    round16(x, x16, n);
    w8_gemv_x16(x16, w, scales, bias, y, M, N, K);
    if (x16 != stack) free(x16);
    return 0;
}

/* Many rows (prefill) on AMX tiles, with the FMA kernel's products: x16 (round16 above) is exactly hi + lo, two
 * bf16, and a bf16 times an int8 is exact in fp32, so the two TDPBF16PS per tile step add exactly the products
 * x16[k] * q[n, k] that the FMA kernel adds, in another order of the fp32 sums (a token's K/V then differ
 * between batch sizes by the rounding of those sums only). xb: scratch [Mp][2][K] bf16 (hi, lo of each row; Mp = M
 * rounded up to 32, rows past M zero); wp: the int8 weights as bf16 (exact), in the layout TDPBF16PS reads,
 * [N/16][K/32][16 pairs of k][16 columns][2] (native_int8.pack_amx). Blocks of rows that fit in L2 against
 * every 32 output columns: 2 x 2 tiles of 16 x 16 fp32 accumulators, K in steps of 32. */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

static int amx_state = 0;   /* 0 not asked yet, 1 granted, -1 refused */

int amx_ready(void) {   /* Linux hands out the tile registers on request only (arch_prctl, once per process) */
    if (amx_state == 0)
        amx_state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0 ? 1 : -1;
    return amx_state == 1;
}


/* xb[m] = hi, lo of x16 of row m of x (rows M..Mp-1 zero), K % 32 == 0: hi keeps x16's top 16 bits (8
 * significant), lo = x16 - hi (exact, the other 8). */
static void split_rows_bf16x2(const float *x, uint16_t *xb, int M, int Mp, int K) {
    #pragma omp parallel for schedule(static)
    for (int m = 0; m < Mp; m++) {
        uint16_t *d = xb + (int64_t)m * 2 * K;
        if (m >= M) { memset(d, 0, (size_t)2 * K * sizeof(uint16_t)); continue; }
        const float *row = x + (int64_t)m * K;
        const __m512i expo = _mm512_set1_epi32(0x7F800000);
        for (int k = 0; k < K; k += 16) {
            __m512i v = round16_epi32(_mm512_loadu_si512((const void *)(row + k)));
            /* inf and nan: hi carries them (a nan keeps its quiet bit, so it stays a nan in 16 bits), lo = 0
             * (inf - inf would be a nan) */
            const __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(v, expo), expo);
            v = _mm512_mask_or_epi32(v, _mm512_mask_test_epi32_mask(special, v, _mm512_set1_epi32(0x007FFFFF)), v,
                                     _mm512_set1_epi32(0x00400000));
            const __m512i hi = _mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u));
            __m512i lo = _mm512_castps_si512(_mm512_sub_ps(_mm512_castsi512_ps(v), _mm512_castsi512_ps(hi)));
            lo = _mm512_maskz_mov_epi32((__mmask16)~special, lo);
            _mm256_storeu_si256((__m256i *)(d + k), _mm512_cvtepi32_epi16(_mm512_srli_epi32(hi, 16)));
            _mm256_storeu_si256((__m256i *)(d + K + k), _mm512_cvtepi32_epi16(_mm512_srli_epi32(lo, 16)));
        }
    }
}

/* silu: the weights are gate_up's with gate and up interleaved by 16 output channels (native_int8.interleave_gate_up),
 * so a 32-column block holds gate channels j..j+16 in its first tile column and up channels j..j+16 in its second;
 * the block's epilogue writes silu(gate) * up to y [M, N/2] with silu_mul's operations on the same fp32 values (the
 * same bits as the GEMM then silu_mul), and the [M, N] gate_up output is never written (half the bytes stored, one
 * pass over them less). */
static int amx_gemm(const float *x, uint16_t *xb, const uint16_t *wp, const float *scales, const float *bias, float *y,
                    int M, int N, int K, int silu) {
    const int KB = K / 32, NB = N / 32, MB = (M + 31) / 32;
    /* rows per block: a block's hi and lo rows (4 K bytes each) stay in L2 while every column block runs */
    int rows = (int)((1 << 20) / ((int64_t)4 * K)) / 32 * 32;
    const int BM_MAX = rows < 32 ? 1 : rows / 32;      /* 32-row pairs of tiles per block, at most */
    const int MC = (MB + BM_MAX - 1) / BM_MAX;
    /* blocks of equal size: (block, column) items are dealt out evenly by count, so with blocks of 14, 14 and 4
     * pairs (1,024 rows, K 576) one thread got 2,016 pair-items and the other 1,056 (the GEMM 1.16x slower) */
    const int BM = (MB + MC - 1) / MC;
    split_rows_bf16x2(x, xb, M, MB * 32, K);
    #pragma omp parallel
    {
        load_full_tiles();
        float c[4][16 * 16] __attribute__((aligned(64)));
        #pragma omp for collapse(2) schedule(static)
        for (int mc = 0; mc < MC; mc++) {
            for (int nb = 0; nb < NB; nb++) {
                const uint16_t *b0 = wp + (int64_t)(2 * nb) * KB * 512, *b1 = b0 + (int64_t)KB * 512;
                const int mb_end = (mc + 1) * BM < MB ? (mc + 1) * BM : MB;
                for (int mb = mc * BM; mb < mb_end; mb++) {
                    const uint16_t *a0 = xb + (int64_t)mb * 32 * 2 * K, *a1 = a0 + (int64_t)16 * 2 * K;
                    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                    for (int kb = 0; kb < KB; kb++) {
                        _tile_loadd(6, b0 + kb * 512, 64);
                        _tile_loadd(7, b1 + kb * 512, 64);
                        for (int part = 0; part < 2; part++) {   /* hi, lo */
                            _tile_loadd(4, a0 + (int64_t)part * K + kb * 32, K * 4);
                            _tile_loadd(5, a1 + (int64_t)part * K + kb * 32, K * 4);
                            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
                            _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
                        }
                    }
                    _tile_stored(0, c[0], 64); _tile_stored(1, c[1], 64);
                    _tile_stored(2, c[2], 64); _tile_stored(3, c[3], 64);
                    if (silu) {
                        const int n0 = nb * 32, I = N / 2;
                        const __m512 sg = _mm512_loadu_ps(scales + n0), su = _mm512_loadu_ps(scales + n0 + 16);
                        const __m512 bg = bias ? _mm512_loadu_ps(bias + n0) : _mm512_setzero_ps();
                        const __m512 bu = bias ? _mm512_loadu_ps(bias + n0 + 16) : _mm512_setzero_ps();
                        const __m512 one = _mm512_set1_ps(1.f);
                        for (int h = 0; h < 2; h++) {
                            const int r0 = mb * 32 + h * 16;
                            for (int r = 0; r < 16 && r0 + r < M; r++) {
                                const __m512 g = _mm512_fmadd_ps(_mm512_load_ps(c[2 * h] + r * 16), sg, bg);
                                const __m512 u = _mm512_fmadd_ps(_mm512_load_ps(c[2 * h + 1] + r * 16), su, bu);
                                const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
                                _mm512_storeu_ps(y + (int64_t)(r0 + r) * I + nb * 16,
                                                 _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u));
                            }
                        }
                        continue;
                    }
                    for (int t = 0; t < 4; t++) {
                        const int r0 = mb * 32 + (t >> 1) * 16, n0 = nb * 32 + (t & 1) * 16;
                        const __m512 sc = _mm512_loadu_ps(scales + n0);
                        const __m512 bi = bias ? _mm512_loadu_ps(bias + n0) : _mm512_setzero_ps();
                        for (int r = 0; r < 16 && r0 + r < M; r++)
                            _mm512_storeu_ps(y + (int64_t)(r0 + r) * N + n0,
                                             _mm512_fmadd_ps(_mm512_load_ps(c[t] + r * 16), sc, bi));
                    }
                }
            }
        }
        _tile_release();
    }
    return 0;
}
int w8_amx_gemm(const float *x, uint16_t *xb, const uint16_t *wp, const float *scales, const float *bias, float *y,
                int M, int N, int K) {
    return amx_gemm(x, xb, wp, scales, bias, y, M, N, K, 0);
}

int w8_amx_gemm_silu(const float *x, uint16_t *xb, const uint16_t *wp, const float *scales, const float *bias,
                     float *y, int M, int N, int K) {
    return amx_gemm(x, xb, wp, scales, bias, y, M, N, K, 1);
}
#else
int amx_ready(void) { return 0; }
int w8_amx_gemm(const float *x, uint16_t *xb, const uint16_t *wp, const float *scales, const float *bias, float *y,
                int M, int N, int K) { (void)x; (void)xb; (void)wp; (void)scales; (void)bias; (void)y; (void)M; (void)N; (void)K; return -2; }
int w8_amx_gemm_silu(const float *x, uint16_t *xb, const uint16_t *wp, const float *scales, const float *bias,
                     float *y, int M, int N, int K) { return w8_amx_gemm(x, xb, wp, scales, bias, y, M, N, K); }
#endif
