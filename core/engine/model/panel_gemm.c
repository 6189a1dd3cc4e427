/* int8 projections on weight panels, for CPUs with AVX-512 and without AMX: one sum order for every row count.
 *
 * Why: a token's K/V must be the same bits whether the token was computed in a prefill chunk, a decode step or a
 * mixed step, or a rounded (bf16) KV pool turns the last-bit differences of the sums into whole bf16 steps and
 * cache on != cache off (49/50 prompts with w8_gemv for decode rows and these panels for prefill rows). Here
 * every output is the exact products x16[k] * q[n, k] (w8_x16.c's round16) added in k order from zero,
 * then times its scale plus its bias, whatever register block a row falls in: many rows run blocks of
 * PANEL_ROWS rows x 16 channels (GEMM speed), few rows (decode) blocks of up to 2 rows x 8 panels (enough
 * independent sums to hide the FMA latency while the weights stream from memory once).
 *
 * Weights in panels of 16 output channels, GROUP panels side by side (native_int8.pack_panels): a k step of a
 * group is 128 contiguous bytes, so a decode row streams the weights in one pass. It pays with AVX-512 (32 vector
 * registers hold a block): panel_gemm_fast. Built for AVX2 it is correct but 1.3-1.5x slower than w8_gemv (the
 * block does not fit 16 registers), so Linear keeps w8_gemv there. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include "native_kernels.h"

int panel_gemm_fast(void) {
#if defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}

typedef float v16f __attribute__((vector_size(64)));
typedef int8_t v16b __attribute__((vector_size(16)));
typedef int32_t v16i __attribute__((vector_size(64)));
#define PANEL_ROWS 12   /* 12 accumulators + the weights: one int8 -> fp32 conversion per 12 FMAs (with 6
                         * the conversions took a quarter of the FP work: 1,024-token prefill ~10 % slower, AMD) */
#define PANEL_BLOCK 96  /* rows of x16 (a multiple of PANEL_ROWS) kept in L2 while every panel passes over them */
#define FEW_ROWS 32     /* below this many rows: the decode blocking (rows x panels) */
#define GROUP 8         /* panels stored side by side (one stream of 128 bytes a k step for a decode row) */

/* the k-th 16 weights of a panel (at p, k steps `stride` bytes apart: its group's width) as fp32 */
static inline v16f panel_weights(const int8_t *p, int64_t stride, int k) {
#if defined(__AVX512F__)
    return (v16f)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + (int64_t)k * stride))));
#else   /* int8 -> int32 -> float: GCC 12 turns a direct int8 -> float conversion into scalar code */
    v16b b;
    memcpy(&b, p + (int64_t)k * stride, 16);
    return __builtin_convertvector(__builtin_convertvector(b, v16i), v16f);
#endif
}

/* panel np of N/16 in the grouped layout: GROUP panels side by side for each k ([K][GROUP * 16] bytes a group;
 * the last group as wide as the panels left). Its first byte, and the stride between its k steps. */
static inline const int8_t *panel_at(const int8_t *panels, int np, int NP, int K, int64_t *stride) {
    const int g = np / GROUP, width = (NP - g * GROUP < GROUP ? NP - g * GROUP : GROUP) * 16;
    *stride = width;
    return panels + (int64_t)g * GROUP * 16 * K + (np - g * GROUP) * 16;
}

/* the one epilogue: y[0..16) = acc * scale + bias (compiled once, so every path rounds it alike) */
__attribute__((noinline)) static void panel_store(v16f acc, const float *scales, const float *bias, float *y) {
    v16f sc, bi = (v16f){0};
    memcpy(&sc, scales, sizeof sc);
    if (bias) memcpy(&bi, bias, sizeof bi);
    const v16f out = acc * sc + bi;
    memcpy(y, &out, sizeof out);
}

/* acc[r] = sum over k in order of x16[r][k] * panel[k][0..16) for PANEL_ROWS rows (the accumulators stay in
 * registers) */
static void panel_block(const float *x, const int8_t *panel, int64_t stride, int K, v16f *acc) {
    v16f a[PANEL_ROWS];
    for (int r = 0; r < PANEL_ROWS; r++) a[r] = (v16f){0};
    for (int k = 0; k < K; k++) {
        const v16f w = panel_weights(panel, stride, k);
        for (int r = 0; r < PANEL_ROWS; r++) a[r] += x[(int64_t)r * K + k] * w;
    }
    for (int r = 0; r < PANEL_ROWS; r++) acc[r] = a[r];
}

/* the same for one row (the last rows < PANEL_ROWS of a block) */
static v16f panel_row(const float *x, const int8_t *panel, int64_t stride, int K) {
    v16f a = {0};
    for (int k = 0; k < K; k++) a += x[k] * panel_weights(panel, stride, k);
    return a;
}

/* many rows: (row block, panel) pairs dealt out one by one, so the threads share a row block (in each one's L2)
 * while they take its panels in turn, and a short last block does not leave one thread with all the work */
static void many_rows(const float *x16, const int8_t *panels, const float *scales, const float *bias, float *y,
                      int M, int N, int K) {
    const int NP = N / 16, MBLK = (M + PANEL_BLOCK - 1) / PANEL_BLOCK;
    #pragma omp parallel for collapse(2) schedule(static, 1)
    for (int mb = 0; mb < MBLK; mb++) {
        for (int np = 0; np < NP; np++) {
            int64_t stride;
            const int8_t *panel = panel_at(panels, np, NP, K, &stride);
            const int m_end = (mb + 1) * PANEL_BLOCK < M ? (mb + 1) * PANEL_BLOCK : M;
            for (int m0 = mb * PANEL_BLOCK; m0 < m_end; m0 += PANEL_ROWS) {
                const int rows = m_end - m0 < PANEL_ROWS ? m_end - m0 : PANEL_ROWS;
                v16f acc[PANEL_ROWS];
                if (rows == PANEL_ROWS) panel_block(x16 + (int64_t)m0 * K, panel, stride, K, acc);
                else for (int r = 0; r < rows; r++) acc[r] = panel_row(x16 + (int64_t)(m0 + r) * K, panel, stride, K);
                for (int r = 0; r < rows; r++)
                    panel_store(acc[r], scales + np * 16, bias ? bias + np * 16 : NULL,
                                y + (int64_t)(m0 + r) * N + np * 16);
            }
        }
    }
}

#define FEW_PREFETCH 1024   /* bytes ahead of a decode row's weight stream (512-8192 measured alike, 0 ~10 % slower) */

/* RB rows x PB side-by-side panels of a group (k steps `stride` bytes apart): acc[r * PB + p], each the same
 * k-ordered sum as panel_block's */
#define FEW_BLOCK(RB, PB)                                                                                    \
static void few_r##RB##_p##PB(const float *x, const int8_t *panel, int64_t stride, int K, v16f *acc) {       \
    v16f a[RB][PB];                                                                                          \
    for (int r = 0; r < RB; r++) for (int p = 0; p < PB; p++) a[r][p] = (v16f){0};                           \
    for (int k = 0; k < K; k++) {                                                                            \
        for (int64_t b = 0; b < PB * 16; b += 64)                                                            \
            __builtin_prefetch(panel + (int64_t)k * stride + b + FEW_PREFETCH);                              \
        v16f w[PB];                                                                                          \
        for (int p = 0; p < PB; p++) w[p] = panel_weights(panel + p * 16, stride, k);                        \
        for (int r = 0; r < RB; r++) {                                                                       \
            const float xv = x[(int64_t)r * K + k];                                                          \
            for (int p = 0; p < PB; p++) a[r][p] += xv * w[p];                                               \
        }                                                                                                    \
    }                                                                                                        \
    for (int r = 0; r < RB; r++) for (int p = 0; p < PB; p++) acc[r * PB + p] = a[r][p];                     \
}
FEW_BLOCK(1, 8) FEW_BLOCK(1, 4) FEW_BLOCK(1, 2) FEW_BLOCK(1, 1)
FEW_BLOCK(2, 8) FEW_BLOCK(2, 4) FEW_BLOCK(2, 2) FEW_BLOCK(2, 1)

typedef void (*few_fn)(const float *, const int8_t *, int64_t, int, v16f *);
static const few_fn FEW[2][4] = {   /* [rows 1, 2][panels 8, 4, 2, 1] */
    {few_r1_p8, few_r1_p4, few_r1_p2, few_r1_p1},
    {few_r2_p8, few_r2_p4, few_r2_p2, few_r2_p1},
};

/* few rows (decode): each thread takes its share of the panels (panel_share, run_end) and runs every row over each
 * group's part in blocks of 2 and 1 rows x 8, 4, 2 and 1 panels (4 rows x 4 panels measured 1.4x slower than two
 * blocks of 2 x 8); a group's weights come from memory once a step, one stream, and from cache for the next rows.
 * A panel's sums are the same whichever block computes it. */
static void few_rows(const float *x16, const int8_t *panels, const float *scales, const float *bias, float *y,
                     int M, int N, int K) {
    const int NP = N / 16;
    #pragma omp parallel
    {
        const int threads = omp_get_num_threads(), t = omp_get_thread_num(), end = panel_share(NP, t + 1, threads);
        for (int start = panel_share(NP, t, threads); start < end;) {
            const int p_end = run_end(start, end, GROUP);
            for (int m0 = 0; m0 < M;) {
                const int rb = M - m0 >= 2 ? 2 : 1, ri = rb - 1;
                for (int p0 = start; p0 < p_end;) {
                    int pb = 8, pi = 0;
                    while (pb > p_end - p0) { pb /= 2; pi++; }
                    v16f acc[2 * 8];
                    int64_t stride;
                    const int8_t *panel = panel_at(panels, p0, NP, K, &stride);
                    FEW[ri][pi](x16 + (int64_t)m0 * K, panel, stride, K, acc);
                    for (int r = 0; r < rb; r++)
                        for (int p = 0; p < pb; p++)
                            panel_store(acc[r * pb + p], scales + (p0 + p) * 16, bias ? bias + (p0 + p) * 16 : NULL,
                                        y + (int64_t)(m0 + r) * N + (p0 + p) * 16);
                    p0 += pb;
                }
                m0 += rb;
            }
            start = p_end;
        }
    }
}

/* y[M, N] = x16 @ (q * scales)^T (+ bias), q in panels; N % 16 == 0. Returns -1 when out of memory (the x16
 * copy of x). */
int w8_panel_gemm(const float *x, const int8_t *panels, const float *scales, const float *bias, float *y,
                  int M, int N, int K) {
    if (M <= 0) return 0;
    float stack[4096];
    const int64_t n = (int64_t)M * K;
    float *x16 = n <= 4096 ? stack : (float *)malloc((size_t)n * sizeof(float));
    if (!x16) return -1;
    round16(x, x16, n);
    (M < FEW_ROWS ? few_rows : many_rows)(x16, panels, scales, bias, y, M, N, K);
    if (x16 != stack) free(x16);
    return 0;
}
