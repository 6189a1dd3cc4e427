/* Prefill attention on AMX tiles: one request's n new queries over its m keys (the cached prefix's and their own),
 * causal, in fp32 precision from bf16 tiles.
 *
 * Why: a long prompt's prefill spent 60 % of its time in attention (torch's CPU flash kernel, fp32 FMAs, ~230
 * GFLOP/s here), and AMX multiplies bf16 tiles ~16x faster than AVX-512 multiplies fp32. One bf16 holds 8
 * significant bits, too few: each operand is split in two bf16, x = hi + lo (16 bits, relative error <= 2^-16),
 * and a product is hi*hi' + hi*lo' + lo*hi' (the lo*lo' term, up to 2^-14 of the product, dropped: the main
 * error), each exact in the fp32 accumulators. So outputs are within ~2^-15 of fp32 attention's, not bit for bit.
 * A bf16 pool's K/V have no lo half: their terms are skipped, a third fewer tile products.
 *
 * A query row's result depends only on its own scores: keys run in blocks of 32 aligned to absolute positions
 * 0, 32, 64, ..., grouped in segments of SEG_BLOCKS blocks (keys 0-511, 512-1023, ...); within a segment each row
 * keeps its own running max and sum (online softmax), and a block with no visible key for a row adds exactly
 * nothing to it; the segments' partial results are then merged in segment order (part_merge). So, given the same
 * K/V, a token's attention is the same bits whether its prompt came whole, in chunks or after a cached prefix,
 * and whatever rows share its tile. (One limit: a non-finite V reaches every row of the 32-row tiles whose blocks
 * hold it, seen or not: 0 * inf is nan.) The segments are what lets a short chunk after a long prefix use every
 * core: its work items are segments (each reading whole pool rows, every KV head), where one item per KV head
 * left a core idle a third of the time on 3 KV heads and read each pool row in strided thirds.
 *
 * Layouts (bf16 as uint16): q rows [n][H][D] fp32 (row stride qs floats); the keys and values read straight out
 * of one pool layer, k/v [slots][KVH][D] fp32 or bf16 (kv_bf16), key j at slot slots[j] (no gathered copy);
 * out [n][H][D] fp32 contiguous. Query i sits at position m - n + i and sees keys 0 .. m - n + i. D % 32 == 0,
 * D <= 256, H % KVH == 0. Returns -1 when out of memory, -2 where built without AMX, -3 for shapes it cannot run. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "native_simd.h"
#include "native_kernels.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__linux__)

#define QROWS 32   /* query rows per work item: two row tiles */
#define KBLK 32    /* keys per block (two score tiles, one value tile pass) */
#define STALE 8.f  /* how far a score may pass the running max before the max moves (softmax_row) */
#define SEG_BLOCKS 16   /* key blocks per segment (512 keys): the unit of a short chunk's work items */
#define PF_KEYS 32      /* how far ahead the few-rows driver's packing prefetches pool rows (keys) */
#define PART_PAD 32     /* a row's partial result: sumv[16], o[D], then mx (padded to 16 floats) */

/* 16 fp32 -> hi (their top 16 bits: a truncated bf16) and lo (x - hi rounded to the nearest bf16), each as 16
 * bf16 in the low halves of 32-bit lanes */
static inline void split_bf16x2(__m512 x, __m512i *hi, __m512i *lo) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i h = _mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u));
    const __m512i r = _mm512_castps_si512(_mm512_sub_ps(x, _mm512_castsi512_ps(h)));
    const __m512i rnd = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                         _mm512_and_si512(_mm512_srli_epi32(r, 16), _mm512_set1_epi32(1)));
    *hi = _mm512_srli_epi32(h, 16);
    *lo = _mm512_srli_epi32(_mm512_add_epi32(r, rnd), 16);
}

/* queries as A tiles: qh/ql [H][np][D], row-major (np = n rounded up to QROWS, extra rows zero) */
static void pack_queries(const float *q, int64_t qs, int n, int np, int H, int D, uint16_t *qh, uint16_t *ql) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < np; i++) {
        for (int h = 0; h < H; h++) {
            uint16_t *dh = qh + ((int64_t)h * np + i) * D, *dl = ql + ((int64_t)h * np + i) * D;
            if (i >= n) { memset(dh, 0, (size_t)D * 2); memset(dl, 0, (size_t)D * 2); continue; }
            const float *row = q + (int64_t)i * qs + (int64_t)h * D;
            for (int d = 0; d < D; d += 16) {
                __m512i hi, lo;
                split_bf16x2(_mm512_loadu_ps(row + d), &hi, &lo);
                _mm256_storeu_si256((__m256i *)(dh + d), _mm512_cvtepi32_epi16(hi));
                _mm256_storeu_si256((__m256i *)(dl + d), _mm512_cvtepi32_epi16(lo));
            }
        }
    }
}

/* The 16 keys key0 .. key0+15 of KV head g, d from ds * 32 (one tile): each key's 32 d as a row of 16 dwords (one
 * per pair of d), transposed so that tile row r holds d pair r for the 16 keys (VNNI). Keys past m are zeros;
 * tl NULL: a bf16 pool, no lo halves. */
static void pack_key_tile(const void *k, int bf16, const int64_t *slots, int m, int key0, int g, int ds, int KVH,
                          int D, int pf_end, uint16_t *th, uint16_t *tl) {
    __m512i hi[16], lo[16];
    const int esz = bf16 ? 2 : 4;
    for (int j = 0; j < 16; j++) {
        const int key = key0 + j;
        if (key + PF_KEYS < pf_end) {   /* the same bytes PF_KEYS keys on, one load per load: a steady stream */
            const char *ahead = (const char *)k + ((slots[key + PF_KEYS] * KVH + g) * D + ds * 32) * esz;
            _mm_prefetch(ahead, _MM_HINT_T0);
            if (!bf16) _mm_prefetch(ahead + 64, _MM_HINT_T0);
        }
        if (key >= m) { hi[j] = lo[j] = _mm512_setzero_si512(); continue; }
        const int64_t at = (slots[key] * KVH + g) * D + ds * 32;
        __m512i h0, l0, h1, l1;
        split_bf16x2(load16(k, bf16, at), &h0, &l0);
        split_bf16x2(load16(k, bf16, at + 16), &h1, &l1);
        /* 32 bf16 in d order = 16 dwords, dword r = (d 2r, d 2r+1) */
        hi[j] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(h0)), _mm512_cvtepi32_epi16(h1), 1);
        lo[j] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(l0)), _mm512_cvtepi32_epi16(l1), 1);
    }
    transpose16(hi);
    for (int r = 0; r < 16; r++) _mm512_storeu_si512((void *)(th + r * 32), hi[r]);
    if (!tl) return;
    transpose16(lo);
    for (int r = 0; r < 16; r++) _mm512_storeu_si512((void *)(tl + r * 32), lo[r]);
}

/* The KBLK keys of block kb of KV head g as value tiles [D/16] of [16 pairs of keys][16 d][2] (VNNI); keys past m
 * are zeros; vl NULL: no lo halves. */
static void pack_value_block(const void *v, int bf16, const int64_t *slots, int m, int kb, int g, int KVH, int D,
                             int pf_end, uint16_t *vt, uint16_t *vlt) {
    const int DC = D / 16, esz = bf16 ? 2 : 4;
    for (int r = 0; r < KBLK / 2; r++) {
        const int k0 = kb * KBLK + 2 * r;
        for (int j = k0 + PF_KEYS; j < k0 + 2 + PF_KEYS && j < pf_end; j++) {   /* as pack_key_tile */
            const char *ahead = (const char *)v + (slots[j] * KVH + g) * D * esz;
            for (int off = 0; off < D * esz; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
        }
        for (int dc = 0; dc < DC; dc++) {
            const int64_t at = (int64_t)dc * 512 + r * 32;
            __m512i h0 = _mm512_setzero_si512(), l0 = h0, h1 = h0, l1 = h0;
            if (k0 < m) split_bf16x2(load16(v, bf16, (slots[k0] * KVH + g) * D + dc * 16), &h0, &l0);
            if (k0 + 1 < m) split_bf16x2(load16(v, bf16, (slots[k0 + 1] * KVH + g) * D + dc * 16), &h1, &l1);
            _mm512_storeu_si512((void *)(vt + at), _mm512_or_si512(h0, _mm512_slli_epi32(h1, 16)));
            if (vlt) _mm512_storeu_si512((void *)(vlt + at), _mm512_or_si512(l0, _mm512_slli_epi32(l1, 16)));
        }
    }
}

/* Every key block of every KV head, packed once for all query blocks: keys [KVH][mp/KBLK] blocks of 2 x D/32
 * tiles (the block's two 16-key halves), values [KVH][mp/KBLK] blocks of D/16 tiles; kl, vl NULL for a bf16 pool */
static void pack_all(const void *k, const void *v, int bf16, const int64_t *slots, int m, int mp, int KVH, int D,
                     uint16_t *kh, uint16_t *kl, uint16_t *vh, uint16_t *vl) {
    const int DS = D / 32, nkb = mp / KBLK;
    const int64_t kstep = (int64_t)2 * DS * 512, vstep = (int64_t)(D / 16) * 512;   /* one block's tiles */
    #pragma omp parallel for collapse(2) schedule(static)
    for (int g = 0; g < KVH; g++) {
        for (int kb = 0; kb < nkb; kb++) {
            const int64_t b = (int64_t)g * nkb + kb;
            for (int half = 0; half < 2; half++)
                for (int ds = 0; ds < DS; ds++) {
                    const int64_t t = b * kstep + (int64_t)(half * DS + ds) * 512;
                    pack_key_tile(k, bf16, slots, m, kb * KBLK + half * 16, g, ds, KVH, D, 0, kh + t, kl ? kl + t : 0);
                }
            pack_value_block(v, bf16, slots, m, kb, g, KVH, D, 0, vh + b * vstep, vl ? vl + b * vstep : 0);
        }
    }
}

/* The softmax of one row's block of KBLK scores: running max mx and sums sumv (16 lanes, added up at the end),
 * o rescaled when the max grows, the block's weights p as two bf16 (ph, pl). seen: keys of the block the row
 * sees (>= 1). */
static inline void softmax_row(const float *s, int seen, float scale, float *mx, float *sumv, float *o, int D,
                               uint16_t *ph, uint16_t *pl) {
    const uint32_t bits = seen >= KBLK ? 0xFFFFFFFFu : (1u << seen) - 1u;
    const __mmask16 k0 = (__mmask16)bits, k1 = (__mmask16)(bits >> 16);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512 s0 = _mm512_mask_loadu_ps(ninf, k0, s), s1 = _mm512_mask_loadu_ps(ninf, k1, s + 16);
    /* the running max moves only when a score passes it by STALE (FlashAttention-4's lazy rescale): weights up
     * to e^STALE, no horizontal max and no rescale in most blocks */
    const __m512 lim = _mm512_set1_ps((*mx + STALE) / scale);
    if (_mm512_cmp_ps_mask(s0, lim, _CMP_GT_OQ) | _mm512_cmp_ps_mask(s1, lim, _CMP_GT_OQ)) {
        const float bmax = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1)) * scale;
        const __m512 a = _mm512_set1_ps(expf(*mx - bmax));            /* 0 on the first block */
        _mm512_store_ps(sumv, _mm512_mul_ps(_mm512_load_ps(sumv), a));
        for (int d = 0; d < D; d += 16) _mm512_store_ps(o + d, _mm512_mul_ps(_mm512_load_ps(o + d), a));
        *mx = bmax;
    }
    const __m512 sc = _mm512_set1_ps(scale), mv = _mm512_set1_ps(*mx);
    const __m512 p0 = _mm512_maskz_mov_ps(k0, exp512(_mm512_fmsub_ps(s0, sc, mv)));
    const __m512 p1 = _mm512_maskz_mov_ps(k1, exp512(_mm512_fmsub_ps(s1, sc, mv)));
    _mm512_store_ps(sumv, _mm512_add_ps(_mm512_load_ps(sumv), _mm512_add_ps(p0, p1)));
    __m512i hi, lo;
    split_bf16x2(p0, &hi, &lo);
    _mm256_store_si256((__m256i *)ph, _mm512_cvtepi32_epi16(hi));
    _mm256_store_si256((__m256i *)pl, _mm512_cvtepi32_epi16(lo));
    split_bf16x2(p1, &hi, &lo);
    _mm256_store_si256((__m256i *)(ph + 16), _mm512_cvtepi32_epi16(hi));
    _mm256_store_si256((__m256i *)(pl + 16), _mm512_cvtepi32_epi16(lo));
}

/* One head's QROWS query rows and their online-softmax state across key blocks. */
typedef struct {
    float o[QROWS][256] __attribute__((aligned(64)));   /* unnormalised output */
    float sumv[QROWS][16] __attribute__((aligned(64)));
    uint16_t ph[QROWS][KBLK] __attribute__((aligned(64)));   /* the block's weights (hi, lo); rows past the */
    uint16_t pl[QROWS][KBLK] __attribute__((aligned(64)));   /* queries stay zero */
    float mx[QROWS];
} rows_state;

/* A fresh state for `rows` query rows of head_dim D: only what rows_block reads (the weight rows of the row
 * tiles it loads stay zero past the queries), so a segment's start costs ~rows * D, not the whole struct. */
static void rows_init(rows_state *st, int rows, int D) {
    for (int r = 0; r < rows; r++) {
        st->mx[r] = -INFINITY;
        memset(st->o[r], 0, (size_t)D * sizeof(float));
        memset(st->sumv[r], 0, sizeof st->sumv[r]);
    }
    const size_t tile_rows = rows > 16 ? QROWS : 16;
    memset(st->ph, 0, tile_rows * sizeof st->ph[0]);
    memset(st->pl, 0, tile_rows * sizeof st->pl[0]);
}

/* One row's partial result [sumv 16][o D][mx, pad], PART_PAD + D floats: a segment's, or the merge of segments */
static inline void part_empty(float *acc, int D) {
    memset(acc, 0, (size_t)(16 + D) * sizeof(float));
    acc[16 + D] = -INFINITY;
}

static inline void part_store(const rows_state *st, int r, int D, float *p) {
    memcpy(p, st->sumv[r], 16 * sizeof(float));
    memcpy(p + 16, st->o[r], (size_t)D * sizeof(float));
    p[16 + D] = st->mx[r];
}

/* acc += a segment's partial (mx, sumv, o) of one row, both rescaled to the larger max. The one place segments
 * meet: both drivers call it on the same values in segment order, for the segments the row sees, so they agree
 * to the bit. Into an empty acc it is an exact copy (o * 1 + 0 * 0); a NaN row stays NaN. */
static void part_merge(float *acc, float mx, const float *sumv, const float *o, int D) {
    float *amx = acc + 16 + D;
    const float top = mx > *amx ? mx : *amx;
    const __m512 a = _mm512_set1_ps(expf(*amx - top)), b = _mm512_set1_ps(expf(mx - top));
    _mm512_storeu_ps(acc, _mm512_fmadd_ps(_mm512_loadu_ps(sumv), b, _mm512_mul_ps(_mm512_loadu_ps(acc), a)));
    for (int d = 0; d < D; d += 16)
        _mm512_storeu_ps(acc + 16 + d, _mm512_fmadd_ps(_mm512_loadu_ps(o + d), b,
                                                       _mm512_mul_ps(_mm512_loadu_ps(acc + 16 + d), a)));
    *amx = top;
}

/* The rows of a state that see segment seg (row r sits at position pos0 + r) into their accumulators: the end of
 * a segment in the many-rows driver */
static void rows_merge(const rows_state *st, int rows, int D, int64_t pos0, int seg, float *acc) {
    for (int r = 0; r < rows; r++)
        if (pos0 + r >= (int64_t)seg * SEG_BLOCKS * KBLK)
            part_merge(acc + (int64_t)r * (PART_PAD + D), st->mx[r], st->sumv[r], st->o[r], D);
}

/* a row's merged result, normalised, into dst [D] */
static void part_finish(const float *acc, float *dst, int D) {
    const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(_mm512_loadu_ps(acc)));
    for (int d = 0; d < D; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_loadu_ps(acc + 16 + d), inv));
}

/* One key block for one head's rows: qa/qb (hi) and la/lb (lo) the two row tiles of the queries (row stride
 * qstride bytes); kt the block's key tiles [2 halves][D/32] (klt its lo halves, NULL for none), vt its value
 * tiles [D/16] (vlt likewise). seen0: keys of the block the first row sees; row r is query r % period (period
 * QROWS: row r is query r; a short chunk's heads share tiles with period n) and sees seen0 + r % period. Tiles: 0-3
 * accumulators (two row tiles x two column tiles, so consecutive TDPBF16PS never wait on one another), 4-5 row
 * operands, 6-7 column operands. The same steps, in the same order, whichever driver packed kt and vt. */
static void rows_block(rows_state *st, const uint16_t *qa, const uint16_t *qb, const uint16_t *la,
                       const uint16_t *lb, int qstride, const uint16_t *kt, const uint16_t *klt, const uint16_t *vt,
                       const uint16_t *vlt, int rows, int period, int seen0, int D, float scale) {
    const int DS = D / 32, DC = D / 16;
    /* rows <= 16 (a short chunk): the second row tile holds no query, so its products are skipped (each row's
     * products are its own: the same bits either way) */
    const int two = rows > 16;
    float s[QROWS][KBLK] __attribute__((aligned(64)));
    float pv[QROWS][32] __attribute__((aligned(64)));
    uint16_t (*ph)[KBLK] = st->ph, (*pl)[KBLK] = st->pl;
    _tile_zero(0); _tile_zero(1);
    if (two) { _tile_zero(2); _tile_zero(3); }
    for (int ds = 0; ds < DS; ds++) {   /* scores: qh.kh + ql.kh + qh.kl */
        const int64_t t0 = (int64_t)ds * 512, t1 = t0 + (int64_t)DS * 512;
        _tile_loadd(6, kt + t0, 64); _tile_loadd(7, kt + t1, 64);
        _tile_loadd(4, qa + ds * 32, qstride);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        if (two) { _tile_loadd(5, qb + ds * 32, qstride); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
        _tile_loadd(4, la + ds * 32, qstride);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        if (two) { _tile_loadd(5, lb + ds * 32, qstride); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
        if (!klt) continue;   /* a bf16 pool: k has no lo part */
        _tile_loadd(6, klt + t0, 64); _tile_loadd(7, klt + t1, 64);
        _tile_loadd(4, qa + ds * 32, qstride);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        if (two) { _tile_loadd(5, qb + ds * 32, qstride); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
    }
    _tile_stored(0, &s[0][0], KBLK * 4); _tile_stored(1, &s[0][16], KBLK * 4);
    if (two) { _tile_stored(2, &s[16][0], KBLK * 4); _tile_stored(3, &s[16][16], KBLK * 4); }
    for (int r = 0; r < rows; r++) {
        const int seen = seen0 + r % period;   /* keys of this block row r sees */
        if (seen <= 0) {                   /* none: no change, and a zero row of weights */
            memset(ph[r], 0, sizeof ph[r]);
            memset(pl[r], 0, sizeof pl[r]);
            continue;
        }
        softmax_row(s[r], seen, scale, &st->mx[r], st->sumv[r], st->o[r], D, ph[r], pl[r]);
    }
    for (int dc = 0; dc < DC; dc += 2) {   /* weighted values: ph.vh + ph.vl + pl.vh, 32 columns a pass */
        const int64_t t0 = (int64_t)dc * 512, t1 = t0 + 512;
        _tile_zero(0); _tile_zero(1);
        if (two) { _tile_zero(2); _tile_zero(3); }
        _tile_loadd(4, &ph[0][0], KBLK * 2);
        if (two) _tile_loadd(5, &ph[16][0], KBLK * 2);
        _tile_loadd(6, vt + t0, 64); _tile_loadd(7, vt + t1, 64);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        if (two) { _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
        if (vlt) {   /* a bf16 pool: v has no lo part */
            _tile_loadd(6, vlt + t0, 64); _tile_loadd(7, vlt + t1, 64);
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
            if (two) { _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
            _tile_loadd(6, vt + t0, 64); _tile_loadd(7, vt + t1, 64);
        }
        _tile_loadd(4, &pl[0][0], KBLK * 2);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        if (two) { _tile_loadd(5, &pl[16][0], KBLK * 2); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
        _tile_stored(0, &pv[0][0], 128); _tile_stored(1, &pv[0][16], 128);
        if (two) { _tile_stored(2, &pv[16][0], 128); _tile_stored(3, &pv[16][16], 128); }
        for (int r = 0; r < rows; r++) {
            float *od = st->o[r] + dc * 16;
            _mm512_store_ps(od, _mm512_add_ps(_mm512_load_ps(od), _mm512_load_ps(pv[r])));
            _mm512_store_ps(od + 16, _mm512_add_ps(_mm512_load_ps(od + 16), _mm512_load_ps(pv[r] + 16)));
        }
    }
}

int amx_attention_ready(void) { return 1; }

/* Query blocks (of QROWS rows) of one request up to which a work item packs the key blocks it reads itself, in
 * L1, for all of them (KVH x FEW_QBLOCKS x G row states live at once): a short chunk after a long cached prefix
 * then reads each K/V row once (no packed copy written and read back: 2.3 -> ~0.7 ms a layer at 6,000 keys). */
#define FEW_QBLOCKS 4

static inline int qblock_rows(int qb, int n) { return n - qb * QROWS < QROWS ? n - qb * QROWS : QROWS; }

/* Key block kb of KV heads g0 .. g1-1, packed for the tiles into buf [KVH] of [2 halves x D/32 key tiles][same,
 * lo][D/16 value tiles][same, lo] (a bf16 pool: the lo parts left unwritten, never read) */
static void pack_block(const void *k, const void *v, int bf16, const int64_t *slots, int m, int kb, int g0, int g1,
                       int KVH, int D, int pf_end, uint16_t *buf) {
    const int DS = D / 32, DC = D / 16;
    const size_t tiles_n = (size_t)2 * (2 * DS + DC) * 512;
    for (int g = g0; g < g1; g++) {
        uint16_t *kt = buf + g * tiles_n, *klt = kt + 2 * DS * 512, *vt = klt + 2 * DS * 512, *vlt = vt + DC * 512;
        for (int half = 0; half < 2; half++)
            for (int ds = 0; ds < DS; ds++) {
                const int64_t at = (int64_t)(half * DS + ds) * 512;
                pack_key_tile(k, bf16, slots, m, kb * KBLK + half * 16, g, ds, KVH, D, pf_end, kt + at, bf16 ? 0 : klt + at);
            }
        pack_value_block(v, bf16, slots, m, kb, g, KVH, D, pf_end, vt, bf16 ? 0 : vlt);
    }
}

/* Few query blocks: one work item per segment of keys, every KV head (whole pool rows, read once, and as many
 * items as the prefix has segments: both cores busy on 3 KV heads; where cores outnumber segments, one per
 * segment and KV head, so no core waits); per key block and KV head, pack it once, then
 * every (query block, head) of the group takes its step. `grouped` (G * n <= QROWS, queries packed [H][n][D]): the
 * G heads of a KV head share one state, their rows head after head in the same tiles (row r: head r / n, query
 * r % n), a third of the tile products on SmolLM2's 3 heads a KV head; a row's products and softmax are its own,
 * so the same bits. Each segment's partial results land in parts [segment][H][n] and are merged in segment order
 * afterwards. Returns -1 when out of memory. */
static int attend_few(const uint16_t *qh, const uint16_t *ql, const void *k, const void *v, int bf16,
                      const int64_t *slots, float *out, int n, int m, int np, int grouped, int H, int KVH, int D,
                      float scale) {
    const int G = H / KVH, nqb = grouped ? 1 : np / QROWS, p0 = m - n, DS = D / 32, DC = D / 16, qstride = D * 2;
    const int nkb = (m + KBLK - 1) / KBLK, nseg = (nkb + SEG_BLOCKS - 1) / SEG_BLOCKS;
    const int nst = grouped ? KVH : KVH * nqb * G;
    const int64_t row_bytes = (int64_t)KVH * D * (bf16 ? 2 : 4), PS = PART_PAD + D;
    const int cores = omp_get_max_threads(), split = nseg < cores ? KVH : 1, items = nseg * split;
    const int T = cores < items ? cores : items;
    const size_t tiles_n = (size_t)2 * (2 * DS + DC) * 512;   /* one block's K and V tiles, hi and lo, one KV head */
    const size_t per_thread = tiles_n * 2 * (size_t)KVH;        /* two blocks' worth: this one and the next */
    rows_state *st_all = (rows_state *)aligned_alloc(64, sizeof(rows_state) * (size_t)nst * (size_t)T);
    uint16_t *tiles_all = (uint16_t *)aligned_alloc(64, per_thread * sizeof(uint16_t) * (size_t)T);
    float *parts = (float *)malloc(sizeof(float) * (size_t)nseg * (size_t)H * (size_t)n * (size_t)PS);
    if (!st_all || !tiles_all || !parts) { free(st_all); free(tiles_all); free(parts); return -1; }
    #pragma omp parallel num_threads(T)
    {
        const int t = omp_get_thread_num();
        rows_state *st = st_all + (size_t)t * (size_t)nst;
        uint16_t *mine = tiles_all + (size_t)t * per_thread;
        load_full_tiles();
        #pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < items; item++) {
            const int seg = item / split, g0 = split > 1 ? item % split : 0, g1 = split > 1 ? g0 + 1 : KVH;
            const int kb0 = seg * SEG_BLOCKS, kb1 = kb0 + SEG_BLOCKS < nkb ? kb0 + SEG_BLOCKS : nkb;
            const int st0 = grouped ? g0 : g0 * nqb * G, st1 = grouped ? g1 : g1 * nqb * G;   /* its heads' states */
            for (int i = st0; i < st1; i++) rows_init(&st[i], grouped ? G * n : qblock_rows(i / G % nqb, n), D);
            const int pf_end = kb1 * KBLK < m ? kb1 * KBLK : m;   /* prefetch within the segment */
            pack_block(k, v, bf16, slots, m, kb0, g0, g1, KVH, D, pf_end, mine);
            for (int kb = kb0; kb < kb1; kb++) {
                /* the next block packed before this one is multiplied: tile loads of freshly stored tiles
                 * waited for the stores (half of rows_block's time went to its first tile product) */
                if (kb + 1 < kb1)
                    pack_block(k, v, bf16, slots, m, kb + 1, g0, g1, KVH, D, pf_end,
                               mine + ((kb + 1) & 1) * KVH * tiles_n);
                for (int g = g0; g < g1; g++) {
                    const uint16_t *kt = mine + ((kb & 1) * KVH + g) * tiles_n, *klt = kt + 2 * DS * 512;
                    const uint16_t *vt = klt + 2 * DS * 512, *vlt = vt + DC * 512;
                    if (grouped) {   /* the group's G x n rows, head after head */
                        const uint16_t *qa = qh + (int64_t)g * G * n * D, *la = ql + (int64_t)g * G * n * D;
                        rows_block(&st[g], qa, qa + 16 * D, la, la + 16 * D, qstride, kt, bf16 ? 0 : klt, vt,
                                   bf16 ? 0 : vlt, G * n, n, p0 - kb * KBLK + 1, D, scale);
                        continue;
                    }
                    for (int qb = 0; qb < nqb; qb++) {
                        const int q0 = qb * QROWS, rows = qblock_rows(qb, n);
                        if (kb * KBLK > p0 + q0 + rows - 1) continue;   /* no row of this block sees it */
                        for (int gi = 0; gi < G; gi++) {
                            const int h = g * G + gi;
                            const uint16_t *qa = qh + ((int64_t)h * np + q0) * D, *la = ql + ((int64_t)h * np + q0) * D;
                            rows_block(&st[(g * nqb + qb) * G + gi], qa, qa + 16 * D, la, la + 16 * D, qstride, kt,
                                       bf16 ? 0 : klt, vt, bf16 ? 0 : vlt, rows, QROWS, p0 + q0 - kb * KBLK + 1, D,
                                       scale);
                        }
                    }
                }
            }
            for (int i = st0; i < st1; i++) {   /* the rows that see this segment: their partials */
                const int rows = grouped ? G * n : qblock_rows(i / G % nqb, n);
                for (int r = 0; r < rows; r++) {
                    const int h = grouped ? i * G + r / n : i / (nqb * G) * G + i % G;
                    const int q = grouped ? r % n : i / G % nqb * QROWS + r;
                    if (p0 + q >= kb0 * KBLK)
                        part_store(&st[i], r, D, parts + (((int64_t)seg * H + h) * n + q) * PS);
                }
            }
        }
        _tile_release();
    }
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < (int64_t)H * n; i++) {   /* each (head, row): its segments in order */
        const int h = (int)(i / n), row = (int)(i % n);
        float acc[PART_PAD + 256] __attribute__((aligned(64)));
        part_empty(acc, D);
        for (int seg = 0; seg <= (p0 + row) / (SEG_BLOCKS * KBLK); seg++) {
            const float *p = parts + (((int64_t)seg * H + h) * n + row) * PS;
            part_merge(acc, p[16 + D], p, p + 16, D);
        }
        part_finish(acc, out + ((int64_t)row * H + h) * D, D);
    }
    free(st_all);
    free(tiles_all);
    free(parts);
    return 0;
}

int amx_attention(const float *q, int64_t qs, const void *k, const void *v, int kv_bf16, const int64_t *slots,
                  float *out, int n, int m, int H, int KVH, int D, float scale) {
    if (D % 32 || D > 256 || D <= 0 || KVH <= 0 || H % KVH || m < n) return -3;   /* the wrapper checks these */
    if (n <= 0) return 0;
    const int np = (n + QROWS - 1) / QROWS * QROWS, mp = (m + KBLK - 1) / KBLK * KBLK, G = H / KVH;
    const int nqb = np / QROWS, DS = D / 32;
    /* grouped (attend_few): rows [H][n][D] unpadded, plus QROWS zero rows for the last group's tiles */
    const int grouped = G * n <= QROWS, qrows = grouped ? H * n + QROWS : H * np;
    const size_t qn = (size_t)qrows * D;
    uint16_t *qbuf = (uint16_t *)malloc(2 * qn * sizeof(uint16_t));
    if (!qbuf) return -1;
    uint16_t *qh = qbuf, *ql = qh + qn;
    if (grouped) {
        pack_queries(q, qs, n, n, H, D, qh, ql);
        memset(qh + (size_t)H * n * D, 0, (size_t)QROWS * D * 2);
        memset(ql + (size_t)H * n * D, 0, (size_t)QROWS * D * 2);
    } else {
        pack_queries(q, qs, n, np, H, D, qh, ql);
    }
    if (nqb <= FEW_QBLOCKS) {
        const int rc = attend_few(qh, ql, k, v, kv_bf16, slots, out, n, m, np, grouped, H, KVH, D, scale);
        free(qbuf);
        return rc;
    }
    /* a bf16 pool's K/V are whole bf16: no lo halves to pack or multiply (a third fewer tile products, the same
     * bits as an fp32 pool holding those values, whose lo halves are zeros) */
    const int lo = !kv_bf16;
    const size_t kn = (size_t)KVH * mp * D;
    uint16_t *buf = (uint16_t *)malloc((2 + 2 * lo) * kn * sizeof(uint16_t));
    if (!buf) { free(qbuf); return -1; }
    uint16_t *kh = buf, *vh = kh + kn, *kl = lo ? vh + kn : 0, *vl = lo ? kl + kn : 0;
    pack_all(k, v, kv_bf16, slots, m, mp, KVH, D, kh, kl, vh, vl);
    const int nkb_all = mp / KBLK, DC = D / 16;
    const int64_t kstep = (int64_t)2 * DS * 512, vstep = (int64_t)DC * 512;
    #pragma omp parallel
    {
        load_full_tiles();
        rows_state st;
        float acc[QROWS * (PART_PAD + 256)] __attribute__((aligned(64)));   /* the rows' merged segments */
        /* one KV head's work items together (its packed K/V stay in cache), and within it the last query
         * blocks, which see the most keys, first */
        #pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < nqb * H; it++) {
            const int per_g = nqb * G, gg = it / per_g, rest = it % per_g;
            const int qb = nqb - 1 - rest / G, h = gg * G + rest % G, q0 = qb * QROWS, rows = qblock_rows(qb, n);
            const int nkb = (m - n + q0 + rows - 1) / KBLK + 1;
            const uint16_t *qa = qh + ((int64_t)h * np + q0) * D, *la = ql + ((int64_t)h * np + q0) * D;
            rows_init(&st, rows, D);
            for (int r = 0; r < rows; r++) part_empty(acc + (int64_t)r * (PART_PAD + D), D);
            for (int kb = 0; kb < nkb; kb++) {
                if (kb && kb % SEG_BLOCKS == 0) {   /* a segment ends: the same merge as attend_few's */
                    rows_merge(&st, rows, D, m - n + q0, kb / SEG_BLOCKS - 1, acc);
                    rows_init(&st, rows, D);
                }
                const int64_t b = (int64_t)gg * nkb_all + kb;
                rows_block(&st, qa, qa + 16 * D, la, la + 16 * D, D * 2, kh + b * kstep, kl ? kl + b * kstep : 0,
                           vh + b * vstep, vl ? vl + b * vstep : 0, rows, QROWS, m - n + q0 - kb * KBLK + 1, D,
                           scale);
            }
            rows_merge(&st, rows, D, m - n + q0, (nkb - 1) / SEG_BLOCKS, acc);
            for (int r = 0; r < rows; r++)
                part_finish(acc + (int64_t)r * (PART_PAD + D), out + ((int64_t)(q0 + r) * H + h) * D, D);
        }
        _tile_release();
    }
    free(buf);
    free(qbuf);
    return 0;
}
#else
int amx_attention_ready(void) { return 0; }

int amx_attention(const float *q, int64_t qs, const void *k, const void *v, int kv_bf16, const int64_t *slots,
                  float *out, int n, int m, int H, int KVH, int D, float scale) {
    (void)q; (void)qs; (void)k; (void)v; (void)kv_bf16; (void)slots; (void)out; (void)n; (void)m; (void)H; (void)KVH; (void)D; (void)scale;
    return -2;
}
#endif
