#include "native_simd.h"   /* abs_max8 */

/* w8a16_gemm's AVX2 primitives, for CPUs without AVX-512 (AMD Zen 2 and 3, Intel before Ice Lake): included by
 * w8a16_gemm.c, whose formula, pair layout and drivers (many_rows, few_rows) it keeps; only the register blocks and
 * the row rounding are this build's.
 *
 * Why: with AVX2 only, the x16 kernels ran a prompt's rows one at a time (w8_gemv: a 1,024-token prefill 4x slower
 * than HF fp32's MKL GEMM on an AMD Zen 3). VPMADDWD multiplies 16 int16 pairs and adds each pair (8 int32 sums an
 * instruction, 16 products: twice an FMA's 8) and VPADDD accumulates them: VPDPWSSD's exact sum in two
 * instructions. A panel's 16 channels are two halves of 8 lanes; 16 registers hold a block of 6 rows x 16 channels
 * (12 sums) for many rows; a decode row sums a whole group of 8 panels in one pass (16 sums, 2 of them in memory:
 * a16_one_group), the next row of a pair then from L2 (a group of SmolLM2's down projection is 196 KB); the part
 * of a group where a thread's share starts or ends mid-group, 8 sums a pass (1 row x 4 panels, or 2 rows x 2). */

/* each row of x as int16 and its scale: quantize_rows' rule (w8a16_gemm.c), 8 lanes then the tail one by one (the
 * same fp32 product and the same rounding, half to even, either way) */
static void quantize_rows(const float *x, int16_t *xq, double *sx, int M, int K) {
    const int K8 = K & ~7;
    #pragma omp parallel for schedule(static) if (M >= 4)
    for (int m = 0; m < M; m++) {
        const float *r = x + (int64_t)m * K;
        int16_t *q = xq + (int64_t)m * K;
        float amax = abs_max8(r, K8);   /* NaN if one of them is not finite */
        int bad = amax != amax;
        for (int k = K8; k < K; k++) {
            const float a = fabsf(r[k]);
            bad |= !(a <= 3.4028235e38f);
            amax = a > amax ? a : amax;
        }
        if (bad || amax < A16_TINY) {
            memset(q, 0, sizeof(int16_t) * (size_t)K);
            sx[m] = bad ? NAN : 0.0;
            continue;
        }
        const float inv1 = (float)A16_MAX / amax;
        const __m256 inv = _mm256_set1_ps(inv1);
        const __m256i hi = _mm256_set1_epi32(A16_MAX), lo = _mm256_set1_epi32(-A16_MAX);
        for (int k = 0; k < K8; k += 8) {
            __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(r + k), inv));
            v = _mm256_max_epi32(_mm256_min_epi32(v, hi), lo);
            /* 8 int32 -> 8 int16 (values within int16: packs saturates nothing) */
            const __m128i packed = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            _mm_storeu_si128((__m128i *)(q + k), packed);
        }
        for (int k = K8; k < K; k++) {
            const long v = lrintf(r[k] * inv1);
            q[k] = (int16_t)(v > A16_MAX ? A16_MAX : v < -A16_MAX ? -A16_MAX : v);
        }
        sx[m] = (double)amax / A16_MAX;
    }
}

/* the one epilogue: y[0..16) = (float)(total * (sx * scale)) + bias (w8a16_gemm.c's, 4 doubles at a time) */
__attribute__((noinline)) static void a16_store(const int64_t *total, double sx, const float *scales,
                                                const float *bias, float *y) {
    const __m256d s = _mm256_set1_pd(sx);
    for (int j = 0; j < 16; j += 4) {
        const __m256d t = _mm256_set_pd((double)total[j + 3], (double)total[j + 2], (double)total[j + 1],
                                        (double)total[j]);
        __m128 v = _mm256_cvtpd_ps(_mm256_mul_pd(t, _mm256_mul_pd(s, _mm256_cvtps_pd(_mm_loadu_ps(scales + j)))));
        if (bias) v = _mm_add_ps(v, _mm_loadu_ps(bias + j));
        _mm_storeu_ps(y + j, v);
    }
}

/* channels 8h .. 8h + 7 of a panel at k steps k and k + 1 (k even) as 8 int16 pairs */
static inline __m256i pair_weights(const int8_t *p, int64_t stride, int k, int h) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + (int64_t)k * stride + 16 * h)));
}

static inline __m256i pair_of(const int16_t *x, int k) {
    int32_t v;
    memcpy(&v, x + k, sizeof v);
    return _mm256_set1_epi32(v);
}

/* acc += the exact pair sums of w and x (VPDPWSSD's result: the pair sums are exact in 32 bits, see BLOCK_K) */
static inline __m256i dp(__m256i acc, __m256i w, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
}

/* total[0..16) = the two halves' sums widened to 64 bits (the first k block), or += them (the next ones) */
static inline void add_total(int64_t *total, __m256i lo, __m256i hi, int first) {
    int32_t v[16];
    _mm256_storeu_si256((__m256i *)v, lo);
    _mm256_storeu_si256((__m256i *)(v + 8), hi);
    for (int j = 0; j < 16; j++) total[j] = (first ? 0 : total[j]) + v[j];
}

/* one row's two sums at a k pair: named variables, not an array (GCC kept an array's sums on the stack: a store
 * and a reload in every step, ~1.6x slower) */
#define A16_ROW(r) do { const __m256i x = pair_of(xq + (int64_t)(r) * K, k); \
                        s##r##0 = dp(s##r##0, w0, x); s##r##1 = dp(s##r##1, w1, x); } while (0)

/* totals[r][0..16) += sum over k in [k0, k1) of xq[r][k] * panel[k][0..16), `rows` (<= A16_ROWS) rows
 * (noinline: inlined into the OpenMP body, its sums were kept on the stack) */
_Static_assert(A16_ROWS == 6, "a16_block's named sums hold 6 rows");
__attribute__((noinline)) static void a16_block(const int16_t *xq, int K, const int8_t *panel, int64_t stride,
                                                int k0, int k1, int rows, int64_t (*total)[16]) {
    if (rows == A16_ROWS) {
        __m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00, s20 = s00, s21 = s00, s30 = s00,
                s31 = s00, s40 = s00, s41 = s00, s50 = s00, s51 = s00;
        for (int k = k0; k < k1; k += 2) {
            const __m256i w0 = pair_weights(panel, stride, k, 0), w1 = pair_weights(panel, stride, k, 1);
            A16_ROW(0); A16_ROW(1); A16_ROW(2); A16_ROW(3); A16_ROW(4); A16_ROW(5);
        }
        const int first = k0 == 0;
        add_total(total[0], s00, s01, first);
        add_total(total[1], s10, s11, first);
        add_total(total[2], s20, s21, first);
        add_total(total[3], s30, s31, first);
        add_total(total[4], s40, s41, first);
        add_total(total[5], s50, s51, first);
        return;
    }
    for (int r = 0; r < rows; r++) {
        __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
        for (int k = k0; k < k1; k += 2) {
            const __m256i x = pair_of(xq + (int64_t)r * K, k);
            a0 = dp(a0, pair_weights(panel, stride, k, 0), x);
            a1 = dp(a1, pair_weights(panel, stride, k, 1), x);
        }
        add_total(total[r], a0, a1, k0 == 0);
    }
}

/* totals[r * pb + p] += the sums of `rows` (1 or 2) rows over panels p0 .. p0 + ps - 1 of a group of pb (ps <= 4 for
 * one row, <= 2 for two: 8 sums), k in [k0, k1); the first pass over a group (p0 == 0) asks for all of its bytes
 * ahead, the later ones find them in cache */
static void a16_few_part(const int16_t *xq, int K, const int8_t *panel, int64_t stride, int k0, int k1, int rows,
                         int pb, int p0, int ps, int64_t (*total)[16]) {
    __m256i a[2][4][2];
    for (int r = 0; r < 2; r++)
        for (int p = 0; p < 4; p++) a[r][p][0] = a[r][p][1] = _mm256_setzero_si256();
    for (int k = k0; k < k1; k += 2) {
        if (p0 == 0)
            for (int64_t b = 0; b < pb * 32; b += 64) __builtin_prefetch(panel + (int64_t)k * stride + b + A16_PREFETCH);
        const __m256i x0 = pair_of(xq, k);
        if (rows == 1) {
            for (int p = 0; p < ps; p++) {
                a[0][p][0] = dp(a[0][p][0], pair_weights(panel + (p0 + p) * 32, stride, k, 0), x0);
                a[0][p][1] = dp(a[0][p][1], pair_weights(panel + (p0 + p) * 32, stride, k, 1), x0);
            }
        } else {
            const __m256i x1 = pair_of(xq + K, k);
            for (int p = 0; p < ps; p++) {
                const __m256i w0 = pair_weights(panel + (p0 + p) * 32, stride, k, 0);
                const __m256i w1 = pair_weights(panel + (p0 + p) * 32, stride, k, 1);
                a[0][p][0] = dp(a[0][p][0], w0, x0);
                a[0][p][1] = dp(a[0][p][1], w1, x0);
                a[1][p][0] = dp(a[1][p][0], w0, x1);
                a[1][p][1] = dp(a[1][p][1], w1, x1);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < ps; p++) add_total(total[r * pb + p0 + p], a[r][p][0], a[r][p][1], k0 == 0);
}

/* a16_one_group's step for one sum: 8 channels of the k pair's row at byte `off`, widened, times x, added into a
 * register (A16_REG) or into a sum kept in memory (A16_MEM) */
#define A16_REG(off, a) "vpmovsxbw " #off "(%[row]), %[w]\n\tvpmaddwd %[x], %[w], %[w]\n\t" \
                        "vpaddd %[w], %[" #a "], %[" #a "]\n\t"
#define A16_MEM(off, a) "vpmovsxbw " #off "(%[row]), %[w]\n\tvpmaddwd %[x], %[w], %[w]\n\t" \
                        "vpaddd %[" #a "], %[w], %[w]\n\tvmovdqu %[w], %[" #a "]\n\t"

/* One row over a whole group of 8 panels (panel at the group's first, so a k pair's row is 256 bytes), in one pass:
 * each row's bytes read once, in order. In two passes of 4 panels (a16_few_part) the first read half of each row's
 * lines and the second the other half from cache, while nothing came from memory: a decode step's projections
 * streamed their weights ~15 % slower (30 layers' from DRAM, 2 threads, alternating builds); 2 rows in 4 passes of
 * 2 x 2 panels were 7-18 % slower than each row in one pass (2 to 16 rows). The 16 sums, the
 * broadcast x and a widened weight need 18 of AVX2's 16 registers: 14 sums stay in registers and 2 in memory, added
 * and stored back each step (asm, in two statements for GCC's 30 operands: in C GCC kept most sums on the stack). */
static void a16_one_group(const int16_t *xq, const int8_t *panel, int64_t stride, int k0, int k1,
                          int64_t (*total)[16]) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
            a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, m0 = a0, m1 = a0;
    for (int k = k0; k < k1; k += 2) {
        const int8_t *row = panel + (int64_t)k * stride;
        for (int b = 0; b < 256; b += 64) __builtin_prefetch(row + A16_PREFETCH + b);
        const __m256i x = pair_of(xq, k);
        const int8_t (*bytes)[256] = (const int8_t (*)[256])row;   /* what the asm reads, told to the compiler */
        __m256i w;
        __asm__(A16_REG(0, a0) A16_REG(16, a1) A16_REG(32, a2) A16_REG(48, a3) A16_REG(64, a4) A16_REG(80, a5)
                A16_REG(96, a6) A16_REG(112, a7)
                : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                  [a6] "+x"(a6), [a7] "+x"(a7), [w] "=&x"(w)
                : [x] "x"(x), [row] "r"(row), "m"(*bytes));
        __asm__(A16_REG(128, a8) A16_REG(144, a9) A16_REG(160, a10) A16_REG(176, a11) A16_REG(192, a12)
                A16_REG(208, a13) A16_MEM(224, m0) A16_MEM(240, m1)
                : [a8] "+x"(a8), [a9] "+x"(a9), [a10] "+x"(a10), [a11] "+x"(a11), [a12] "+x"(a12), [a13] "+x"(a13),
                  [m0] "+m"(m0), [m1] "+m"(m1), [w] "=&x"(w)
                : [x] "x"(x), [row] "r"(row), "m"(*bytes));
    }
    const __m256i s[16] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, m0, m1};
    for (int p = 0; p < 8; p++) add_total(total[p], s[2 * p], s[2 * p + 1], k0 == 0);
}

static void a16_few(const int16_t *xq, int K, const int8_t *panel, int64_t stride, int k0, int k1, int rows, int pb,
                    int64_t (*total)[16]) {
    const int per = rows == 1 ? 4 : 2;
    if (pb == GROUP) {   /* a whole group (a run of GROUP panels starts at one): each row in one pass */
        for (int r = 0; r < rows; r++) a16_one_group(xq + (int64_t)r * K, panel, stride, k0, k1, total + r * pb);
        return;
    }
    for (int p0 = 0; p0 < pb; p0 += per) {
        const int ps = pb - p0 < per ? pb - p0 : per;
        if (rows == 1 && ps == 4) a16_few_part(xq, K, panel, stride, k0, k1, 1, pb, p0, 4, total);   /* unrolled */
        else if (rows == 2 && ps == 2) a16_few_part(xq, K, panel, stride, k0, k1, 2, pb, p0, 2, total);
        else a16_few_part(xq, K, panel, stride, k0, k1, rows, pb, p0, ps, total);
    }
}
