/* What the C kernels of the native path share (decode_attention.c, w8_x16.c, fused_elementwise.c, amx_attention.c,
 * decode_layers.c, the AVX2 headers): bf16 <-> fp32, the vector exp (16 lanes, or 8 on AVX2 only) and the AMX tile
 * configuration. native_kernels.py hashes this header with the sources, so a change here rebuilds them. */
#ifndef NATIVE_SIMD_H
#define NATIVE_SIMD_H
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    const uint32_t u = ((uint32_t)h) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* fp32 -> bf16 to nearest, ties to even, as torch rounds; a nan becomes 0x7FC0 (torch's scalar rounding; rounding
 * its bits instead could carry a nan into inf) */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
#if defined(__AVX512F__)
#include <immintrin.h>

/* exp(x), 1-2 ulp for x up to 88.7 (inf beyond, 0 below -87.3), Cephes' expf polynomial; NaN stays NaN. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.3f), x);       /* second operand returned for a NaN x */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(y, n);
}
/* 16 values of a pool row (K or V, fp32 or bf16) at element `at`, as fp32: a bf16 value widens exactly */
static inline __m512 load16(const void *base, int bf16, int64_t at) {
    if (bf16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + at))), 16));
    return _mm512_loadu_ps((const float *)base + at);
}

/* r[i] = sum of the 16 lanes of a[i], for 16 vectors at once (45 shuffles and adds instead of 16 reductions); the
 * same tree of adds for every i */
static inline __m512 reduce16(__m512 a[16]) {
    __m512 b[8], c[4];
    for (int k = 0; k < 8; k++)   /* per 128-bit quarter: [a2k 0+2, a2k+1 0+2, a2k 1+3, a2k+1 1+3] */
        b[k] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]), _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]));
    for (int k = 0; k < 4; k++)   /* per quarter: the quarter's sum of a4k .. a4k+3 */
        c[k] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0x44), _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], 0xEE));
    const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x44), _mm512_shuffle_f32x4(c[0], c[1], 0xEE));
    const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x44), _mm512_shuffle_f32x4(c[2], c[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xDD));
}

/* transpose16's first two steps alone (32 shuffles of its 64): in each 128-bit lane L, r[4 a + c]'s dword k becomes
 * r[4 a + k]'s dword c, so r[4 a + c] holds quad 4 L + c of rows 4 a .. 4 a + 3 (no dword leaves its lane) */
static inline void transpose4x4(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
}

/* a[0 .. 3]'s four 128-bit lanes added: dword 4 b + k of the result is the sum of a[b]'s dword k over its lanes */
static inline __m512i lane_sums(const __m512i a[4]) {
    const __m512i s01 = _mm512_add_epi32(_mm512_shuffle_i32x4(a[0], a[1], 0x44), _mm512_shuffle_i32x4(a[0], a[1], 0xEE));
    const __m512i s23 = _mm512_add_epi32(_mm512_shuffle_i32x4(a[2], a[3], 0x44), _mm512_shuffle_i32x4(a[2], a[3], 0xEE));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(s01, s23, 0x88), _mm512_shuffle_i32x4(s01, s23, 0xDD));
}

/* r[j][i] -> r[i][j] for a 16 x 16 block of dwords (unpacks then 128-bit lane shuffles: ~64 shuffles, where
 * 16 scatters of 16 dwords each cost ~4x that) */
static inline void transpose16(__m512i r[16]) {
    __m512i v[16];
    transpose4x4(r);   /* r[4 a + c]: quad 4 L + c of rows 4 a .. 4 a + 3, in 128-bit lane L */
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            v[8 * h + i] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + i + 4], 0x88);
            v[8 * h + i + 4] = _mm512_shuffle_i32x4(r[8 * h + i], r[8 * h + i + 4], 0xDD);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(v[i], v[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(v[i], v[i + 8], 0xDD);
    }
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>

/* exp512's polynomial on 8 lanes, for x <= 88.3 (0 below -87.3, NaN stays NaN); 2^n built in the exponent field */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);    /* second operand returned for a NaN x */
    x = _mm256_min_ps(_mm256_set1_ps(88.3f), x);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static inline float hmax8(__m256 a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* max |x| over the first n values (n % 8 == 0; 0 for n = 0), NaN when any is NaN or inf */
static inline float abs_max8(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.f), big = _mm256_set1_ps(3.4028235e38f);
    __m256 a = _mm256_setzero_ps();
    int bad = 0;
    for (int d = 0; d < n; d += 8) {
        const __m256 v = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + d));
        bad |= _mm256_movemask_ps(_mm256_cmp_ps(v, big, _CMP_NLE_UQ));   /* NaN or infinity */
        a = _mm256_max_ps(a, v);
    }
    return bad ? NAN : hmax8(a);
}
#endif

/* the 64-byte block LDTILECFG reads (palette 1: 8 tiles, each up to 16 rows of 64 bytes) */
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } tile_config;

#if defined(__AMX_TILE__)
#include <immintrin.h>
/* this thread's 8 tiles, each 16 rows of 64 bytes (16 fp32 or 32 bf16 a row): every AMX kernel here uses them so */
static inline void load_full_tiles(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    /* not _tile_loadconfig: GCC 12's tells the compiler that LDTILECFG reads 8 bytes of the 64, so it may drop the
     * stores of the rest (it did, inlined into kv8_attention.c's block_buffers: a #GP, SIGSEGV) */
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

#if defined(__AVX512BW__)
/* 32 int16 values x as the two int8 parts the tiles multiply exactly, x = 256 hi + lo: hi = x >> 8 (signed), lo =
 * x & 255 (unsigned) (w8a16_amx_gemm's activations, kv8_amx_block.h's softmax weights) */
static inline void split_int16(const int16_t *x, int8_t *hi, uint8_t *lo) {
    const __m512i v = _mm512_loadu_si512((const void *)x);
    _mm256_storeu_si256((__m256i *)hi, _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
    _mm256_storeu_si256((__m256i *)lo, _mm512_cvtepi16_epi8(_mm512_and_si512(v, _mm512_set1_epi16(255))));
}
#endif
#endif

#endif /* NATIVE_SIMD_H */
