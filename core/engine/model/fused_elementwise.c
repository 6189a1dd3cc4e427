/* The fused elementwise kernels of the native Llama path: add_rms_norm, silu_mul, rope.
 *
 * Built with -O3 -march=native -fopenmp and fast-math's reassociation and contraction (not -ffast-math itself:
 * native_kernels.py says why). rope turns both off for itself (its bits are native_layers.apply_rope's). */
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

/* Elementwise work of every fp32 forward, one call instead of 6-8 torch ops (~5 us of dispatch each at decode,
 * 3-5 passes over memory at prefill). A row's result does not depend on M (rows split across threads only): these
 * kernels add no batch dependence of their own (the int8 projections' sum order still differs between a decode
 * step and a prefill chunk, by fp32 rounding).
 * add_rms_norm: if delta: x += delta (in place); then y = x * rsqrt(mean(x^2) + eps) * w. fp32. */

void add_rms_norm(float *x, const float *delta, const float *w, float *y, int M, int N, float eps) {
    #pragma omp parallel for schedule(static) if (M >= PAR_ROWS)
    for (int m = 0; m < M; m++) {
        float *xr = x + (int64_t)m * N;
        float *yr = y + (int64_t)m * N;
        if (delta) {
            const float *dr = delta + (int64_t)m * N;
            #pragma omp simd
            for (int i = 0; i < N; i++) xr[i] += dr[i];
        }
        float ss = 0.f;
        #pragma omp simd reduction(+:ss)
        for (int i = 0; i < N; i++) ss += xr[i] * xr[i];
        const float r = 1.f / sqrtf(ss / (float)N + eps);
        #pragma omp simd
        for (int i = 0; i < N; i++) yr[i] = w[i] * (xr[i] * r);
    }
}

/* gu: [M, 2I] (gate | up) -> out [M, I] = silu(gate) * up. fp32. */
void silu_mul(const float *gu, float *out, int M, int I) {
    #pragma omp parallel for schedule(static) if (M >= PAR_ROWS)
    for (int m = 0; m < M; m++) {
        const float *g = gu + (int64_t)m * 2 * I, *u = g + I;
        float *o = out + (int64_t)m * I;
        int i = 0;
#if defined(__AVX512F__)   /* exp512: scalar expf per element cost ~1 ms a layer at 1,024 rows */
        const __m512 one = _mm512_set1_ps(1.f);
        for (; i + 16 <= I; i += 16) {
            const __m512 gv = _mm512_loadu_ps(g + i);
            const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
            _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
        }
#elif defined(__AVX2__) && defined(__FMA__)   /* exp256, the same polynomial on 8 lanes (1,024 rows: 5 % of prefill) */
        const __m256 one = _mm256_set1_ps(1.f), top = _mm256_set1_ps(88.3f), inf = _mm256_set1_ps(INFINITY);
        for (; i + 8 <= I; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i), x = _mm256_sub_ps(_mm256_setzero_ps(), gv);
            /* exp256 stops at 88.3; past it exp overflows to inf, as exp512's and expf's do: silu's -0 */
            const __m256 e = _mm256_blendv_ps(exp256(x), inf, _mm256_cmp_ps(x, top, _CMP_GT_OQ));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < I; i++) o[i] = g[i] / (1.f + expf(-g[i])) * u[i];
    }
}

/* RoPE of the q and k heads of T rows: out[t, h] = x * cos[t] + roll(x, D/2) * sin[t] with x = the NH heads of D
 * at qk + t * row_stride (the q and k columns of a fused QKV row), cos / sin [T, D] (rope_tables: sin
 * sign-folded); out [T, NH, D]. Three roundings, no contraction: the bits of native_layers.apply_rope. */
__attribute__((optimize("no-associative-math", "fp-contract=off")))
void rope(const float *qk, int64_t row_stride, const float *cos, const float *sin, float *out, int T, int NH, int D) {
    const int half = D / 2;
    #pragma omp parallel for schedule(static) if (T >= PAR_ROWS)
    for (int t = 0; t < T; t++) {
        const float *c = cos + (int64_t)t * D, *sn = sin + (int64_t)t * D;
        for (int h = 0; h < NH; h++) {
            const float *x = qk + t * row_stride + (int64_t)h * D;
            float *o = out + ((int64_t)t * NH + h) * D;
            #pragma omp simd
            for (int i = 0; i < half; i++) {
                const float a = x[i] * c[i], b = x[i + half] * sn[i];
                o[i] = a + b;
            }
            #pragma omp simd
            for (int i = half; i < D; i++) {
                const float a = x[i] * c[i], b = x[i - half] * sn[i];
                o[i] = a + b;
            }
        }
    }
}
