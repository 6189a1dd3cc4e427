/* decode_attention: attention of one query token per request over its KV slots (an fp32 or bf16 pool), read straight
 * out of the pool ([slots, kv_heads, head_dim] per layer) by slot index: no gathered copy of K/V, one pass over each
 * key and value row, all G = H / KVH query heads of a KV head together, keys split into chunks (flash-decoding) so
 * that even one request keeps every thread busy; an extend's new tokens as runs of rows (seg_chunk).
 *
 * Built with -O3 -march=native -fopenmp and fast-math's reassociation and contraction (not -ffast-math itself:
 * native_kernels.py says why). This file never relies on inf or nan (empty chunks are flagged, not -inf), so those flags only
 * license vectorised reductions. */
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

static inline void load_row(const void *base, int bf16, int64_t offset, int d, float *dst) {
    if (bf16) {
        const uint16_t *p = (const uint16_t *)base + offset;
        #pragma omp simd
        for (int i = 0; i < d; i++) dst[i] = bf16_to_f32(p[i]);
    } else {
        memcpy(dst, (const float *)base + offset, (size_t)d * sizeof(float));
    }
}

#define MAX_D 256
#define MAX_G 16

/* One (request, KV head, key chunk) of decode attention: scores of the G query heads against keys
 * sl[0..n-1], their softmax numerators, and the weighted sum of values. Writes m[G] (max score),
 * l[G] (sum of exp(score - m)) and o[G][D] (unnormalised output). */
typedef void (*chunk_fn)(const float *qf, const void *kbuf, const void *vbuf, int kv_bf16, const int64_t *sl,
                         int n, int KVH, int kh, int G, int D, float *s, float *pm, float *pl, float *po);


/* Row-wise softmax numerators of scores s[g][0..n-1] (stride MAX_CHUNK), in place; m[g] = max, l[g] = sum.
 * AVX-512: 16 scores a step (max, exp512); a NaN score makes its row's m, l NaN (combine propagates it). */
static void softmax_rows(float *s, int G, int n, float *pm, float *pl) {
    for (int g = 0; g < G; g++) {
        float *sg = s + (int64_t)g * MAX_CHUNK;
#if defined(__AVX512F__)
        __m512 mv = _mm512_set1_ps(-INFINITY);
        int j = 0;
        for (; j + 16 <= n; j += 16) mv = _mm512_max_ps(_mm512_loadu_ps(sg + j), mv);   /* NaN operand wins */
        if (j < n) {
            const __mmask16 k = (__mmask16)((1u << (n - j)) - 1u);
            mv = _mm512_mask_max_ps(mv, k, _mm512_maskz_loadu_ps(k, sg + j), mv);
        }
        const float m = _mm512_reduce_max_ps(mv);   /* a NaN score may be dropped here: exp512 keeps it NaN */
        const __m512 mb = _mm512_set1_ps(m);
        __m512 lv = _mm512_setzero_ps();
        for (j = 0; j + 16 <= n; j += 16) {
            const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(sg + j), mb));
            _mm512_storeu_ps(sg + j, e);
            lv = _mm512_add_ps(lv, e);
        }
        if (j < n) {
            const __mmask16 k = (__mmask16)((1u << (n - j)) - 1u);
            const __m512 e = _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sg + j), mb)));
            _mm512_mask_storeu_ps(sg + j, k, e);
            lv = _mm512_add_ps(lv, e);
        }
        pm[g] = m;
        pl[g] = _mm512_reduce_add_ps(lv);
#else
        float m = sg[0];
        for (int j = 1; j < n; j++) m = sg[j] > m ? sg[j] : m;
        float sum = 0.f;
        #pragma omp simd reduction(+:sum)
        for (int j = 0; j < n; j++) { float e = expf(sg[j] - m); sg[j] = e; sum += e; }
        pm[g] = m;
        pl[g] = sum;
#endif
    }
}

static void chunk_generic(const float *qf, const void *kbuf, const void *vbuf, int kv_bf16, const int64_t *sl,
                          int n, int KVH, int kh, int G, int D, float *s, float *pm, float *pl, float *po) {
    float row[MAX_D];
    for (int j = 0; j < n; j++) {
        load_row(kbuf, kv_bf16, (sl[j] * KVH + kh) * D, D, row);
        for (int g = 0; g < G; g++) {
            const float *qg = qf + (int64_t)g * D;
            float acc = 0.f;
            #pragma omp simd reduction(+:acc)
            for (int i = 0; i < D; i++) acc += qg[i] * row[i];
            s[(int64_t)g * MAX_CHUNK + j] = acc;
        }
    }
    softmax_rows(s, G, n, pm, pl);
    memset(po, 0, sizeof(float) * (size_t)G * D);
    for (int j = 0; j < n; j++) {
        load_row(vbuf, kv_bf16, (sl[j] * KVH + kh) * D, D, row);
        for (int g = 0; g < G; g++) {
            const float p = s[(int64_t)g * MAX_CHUNK + j];
            float *og = po + (int64_t)g * D;
            #pragma omp simd
            for (int i = 0; i < D; i++) og[i] += p * row[i];
        }
    }
}

#if defined(__AVX512F__)
/* G query heads, D = 16 * ND. Scores 16 keys at a time per head: 16 partial vectors reduced together
 * (reduce16) and stored as one vector; then p x V with the G x ND accumulators in registers. */
#define CHUNK_KERNEL(GG, ND)                                                                             \
static void chunk_g##GG##_d##ND(const float *qf, const void *kbuf, const void *vbuf, int kv_bf16,        \
                                const int64_t *sl, int n, int KVH, int kh, int G, int D, float *s,       \
                                float *pm, float *pl, float *po) {                                       \
    (void)G; (void)D;                                                                                    \
    __m512 acc[GG][ND], kv[ND];                                                                          \
    const int64_t esz = kv_bf16 ? 2 : 4;                                                                 \
    for (int j0 = 0; j0 < n; j0 += 16) {                                                                 \
        const int nj = n - j0 < 16 ? n - j0 : 16;                                                        \
        int64_t off[16];                                                                                 \
        for (int i = 0; i < 16; i++) off[i] = (sl[j0 + (i < nj ? i : 0)] * KVH + kh) * (int64_t)(16 * ND); \
        for (int i = 0; i < 16 && j0 + 16 + i < n; i++)                                                  \
            for (int d = 0; d < 16 * ND * (int)esz; d += 64)                                             \
                _mm_prefetch((const char *)kbuf + (sl[j0 + 16 + i] * KVH + kh) * (int64_t)(16 * ND) * esz + d, _MM_HINT_T0); \
        for (int g = 0; g < GG; g++) {                                                                   \
            __m512 part[16], q[ND];                                                                      \
            for (int d = 0; d < ND; d++) q[d] = _mm512_loadu_ps(qf + g * 16 * ND + d * 16);              \
            for (int i = 0; i < 16; i++) {                                                               \
                __m512 a = _mm512_mul_ps(q[0], load16(kbuf, kv_bf16, off[i]));                           \
                for (int d = 1; d < ND; d++) a = _mm512_fmadd_ps(q[d], load16(kbuf, kv_bf16, off[i] + d * 16), a); \
                part[i] = a;                                                                             \
            }                                                                                            \
            _mm512_mask_storeu_ps(s + g * MAX_CHUNK + j0, (__mmask16)((1u << nj) - 1u), reduce16(part)); \
        }                                                                                                \
    }                                                                                                    \
    softmax_rows(s, GG, n, pm, pl);                                                                      \
    for (int g = 0; g < GG; g++)                                                                         \
        for (int d = 0; d < ND; d++) acc[g][d] = _mm512_setzero_ps();                                    \
    for (int j = 0; j < n; j++) {                                                                        \
        if (j + 4 < n) {                                                                                 \
            const char *nv = (const char *)vbuf + (sl[j + 4] * KVH + kh) * (int64_t)(16 * ND) * (kv_bf16 ? 2 : 4); \
            _mm_prefetch(nv, _MM_HINT_T0);                                                               \
        }                                                                                                \
        const int64_t off = (sl[j] * KVH + kh) * (int64_t)(16 * ND);                                     \
        for (int d = 0; d < ND; d++) kv[d] = load16(vbuf, kv_bf16, off + d * 16);                        \
        for (int g = 0; g < GG; g++) {                                                                   \
            const __m512 p = _mm512_set1_ps(s[g * MAX_CHUNK + j]);                                       \
            for (int d = 0; d < ND; d++) acc[g][d] = _mm512_fmadd_ps(p, kv[d], acc[g][d]);               \
        }                                                                                                \
    }                                                                                                    \
    for (int g = 0; g < GG; g++)                                                                         \
        for (int d = 0; d < ND; d++) _mm512_storeu_ps(po + g * 16 * ND + d * 16, acc[g][d]);             \
}
#define CHUNK_KERNELS_G(GG) CHUNK_KERNEL(GG, 1) CHUNK_KERNEL(GG, 2) CHUNK_KERNEL(GG, 4) CHUNK_KERNEL(GG, 8)
CHUNK_KERNELS_G(1) CHUNK_KERNELS_G(2) CHUNK_KERNELS_G(3) CHUNK_KERNELS_G(4)
CHUNK_KERNELS_G(5) CHUNK_KERNELS_G(6) CHUNK_KERNELS_G(7) CHUNK_KERNELS_G(8)
#define ROW_G(GG) {chunk_g##GG##_d1, chunk_g##GG##_d2, 0, chunk_g##GG##_d4, 0, 0, 0, chunk_g##GG##_d8}
static const chunk_fn CHUNK_TABLE[8][8] = {ROW_G(1), ROW_G(2), ROW_G(3), ROW_G(4), ROW_G(5), ROW_G(6), ROW_G(7), ROW_G(8)};
#endif

static chunk_fn pick_chunk_fn(int G, int D) {
#if defined(__AVX512F__)
    if (D % 16 == 0 && D / 16 <= 8 && G >= 1 && G <= 8) {
        chunk_fn f = CHUNK_TABLE[G - 1][D / 16 - 1];
        if (f) return f;
    }
#endif
    return chunk_generic;
}

/* Which kernel decode_attention uses for (G, D): 1 = registers-resident AVX-512, 0 = generic loops. */
int decode_attention_fast(int G, int D) { return pick_chunk_fn(G, D) != chunk_generic; }

/* ---------------------------------------------------------------- extend runs
 * The new tokens of one extend (a run of consecutive rows sharing one slot row; row i sees one key more
 * than row i-1) against one chunk of SEG_CHUNK keys for one KV head. Up to 16 query vectors (rows x G
 * heads) sit in the 16 lanes of a register, so each key is read from the pool once for all of them:
 * scores are 16 keys x 16 lanes of FMAs, the softmax runs lane-wise (each lane masked to its own causal
 * and window range), and p x V is 16 dims x 16 lanes. A per-row loop would read the chunk once per row.
 * Writes each row's m, l, o like the decode chunks, so the same combine step finishes both. */
#define SEG_CHUNK 64

#if defined(__AVX512F__)

/* rows r0..r1-1 ((r1 - r0) * G <= 16) of one run, keys [lo, hi) (hi - lo <= SEG_CHUNK) of its slot row sl;
 * fp32 or bf16 K/V (kv_bf16). */
static void seg_chunk(const void *q, int q_bf16, int64_t q_stride, const void *kbuf, const void *vbuf, int kv_bf16,
                      const int64_t *sl, const int64_t *first, const int64_t *lens, int r0, int r1, int kh, int KVH,
                      int G, int D, float scale, int64_t lo, int64_t hi, float *scratch, int64_t part, int nchunks,
                      int c) {
    const int nq = (r1 - r0) * G, n = (int)(hi - lo);
    float qt[MAX_D * 16];                 /* qt[d][lane]: the block's query vectors, scaled */
    float st[SEG_CHUNK * 16];             /* st[j][lane]: scores, then probabilities */
    float ot[MAX_D * 16];                 /* ot[d][lane]: unnormalised outputs */
    float row[MAX_D];
    float kblk[16 * MAX_D];               /* 16 key rows of the chunk */
    int32_t beg[16], end[16];
    for (int lane = 0; lane < 16; lane++) {
        if (lane < nq) {
            const int r = r0 + lane / G, g = lane % G;
            load_row(q, q_bf16, (int64_t)r * q_stride + ((int64_t)kh * G + g) * D, D, row);
            for (int d = 0; d < D; d++) qt[d * 16 + lane] = row[d] * scale;
            const int64_t b = first[r] - lo, e = lens[r] - lo;
            beg[lane] = (int32_t)(b < 0 ? 0 : b);
            end[lane] = (int32_t)(e > n ? n : e);
        } else {
            for (int d = 0; d < D; d++) qt[d * 16 + lane] = 0.f;
            beg[lane] = 0;
            end[lane] = 0;
        }
    }
    for (int j0 = 0; j0 < n; j0 += 16) {             /* scores: 16 keys x 16 lanes */
        const int nj = n - j0 < 16 ? n - j0 : 16;
        for (int i = 0; i < 16; i++)             /* the 16 keys' rows, contiguous: one base pointer below */
            load_row(kbuf, kv_bf16, (sl[lo + j0 + (i < nj ? i : 0)] * KVH + kh) * D, D, kblk + i * D);
        __m512 acc[16];
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        for (int d = 0; d < D; d++) {
            const __m512 qd = _mm512_loadu_ps(qt + d * 16);
            const float *kd = kblk + d;
            for (int i = 0; i < 16; i++) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(kd[i * D]), qd, acc[i]);
        }
        for (int i = 0; i < nj; i++) _mm512_storeu_ps(st + (j0 + i) * 16, acc[i]);
    }
    const __m512i bv = _mm512_loadu_si512(beg), ev = _mm512_loadu_si512(end);
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < n; j++) {
        const __m512i jv = _mm512_set1_epi32(j);
        const __mmask16 vis = _mm512_cmpge_epi32_mask(jv, bv) & _mm512_cmplt_epi32_mask(jv, ev);
        m = _mm512_mask_max_ps(m, vis, m, _mm512_loadu_ps(st + j * 16));   /* a NaN score makes m NaN */
    }
    __m512 l = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        const __m512i jv = _mm512_set1_epi32(j);
        const __mmask16 vis = _mm512_cmpge_epi32_mask(jv, bv) & _mm512_cmplt_epi32_mask(jv, ev);
        const __m512 p = _mm512_maskz_mov_ps(vis, exp512(_mm512_sub_ps(_mm512_loadu_ps(st + j * 16), m)));
        l = _mm512_add_ps(l, p);
        _mm512_storeu_ps(st + j * 16, p);
    }
    for (int d0 = 0; d0 < D; d0 += 16) {             /* o = p x V: 16 dims x 16 lanes */
        __m512 acc[16];
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        for (int j = 0; j < n; j++) {
            const __m512i jv = _mm512_set1_epi32(j);   /* masked: a NaN value a lane cannot see stays out */
            const __mmask16 vis = _mm512_cmpge_epi32_mask(jv, bv) & _mm512_cmplt_epi32_mask(jv, ev);
            const __m512 pj = _mm512_loadu_ps(st + j * 16);
            float vr[16];
            _mm512_storeu_ps(vr, load16(vbuf, kv_bf16, (sl[lo + j] * KVH + kh) * D + d0));
            for (int i = 0; i < 16; i++) acc[i] = _mm512_mask3_fmadd_ps(_mm512_set1_ps(vr[i]), pj, acc[i], vis);
        }
        for (int i = 0; i < 16; i++) _mm512_storeu_ps(ot + (d0 + i) * 16, acc[i]);
    }
    float ms[16], ls[16];
    _mm512_storeu_ps(ms, m);
    _mm512_storeu_ps(ls, l);
    for (int lane = 0; lane < nq; lane++) {
        const int r = r0 + lane / G, g = lane % G;
        float *pm = scratch + (((int64_t)r * KVH + kh) * nchunks + c) * part;
        const int empty = beg[lane] >= end[lane];
        pm[g] = empty ? 0.f : ms[lane];
        pm[G + g] = empty ? 0.f : ls[lane];
        float *po = pm + 2 * G + (int64_t)g * D;
        for (int d = 0; d < D; d++) po[d] = ot[d * 16 + lane];
    }
}
#endif

/* One work item of a single row: its keys in chunk c (clipped to first .. lens-1) for KV head kh, through the
 * decode chunk kernel `fn`; pm: the item's m[G], l[G], o[G][D]. An empty item gets l = 0 (weight 0 when combined). */
static void row_item(chunk_fn fn, const void *q, int q_bf16, int64_t q_off, const void *kbuf, const void *vbuf,
                     int kv_bf16, const int64_t *sl, int64_t first, int64_t lens, int c, int chunk, int kh, int KVH,
                     int G, int D, float scale, float *pm) {
    int64_t lo = (int64_t)c * chunk, hi = lo + chunk;
    if (lo < first) lo = first;
    if (hi > lens) hi = lens;
    if (lo >= hi) {
        for (int g = 0; g < G; g++) { pm[g] = 0.f; pm[G + g] = 0.f; }
        return;
    }
    float qf[MAX_G * MAX_D];
    float s[MAX_G * MAX_CHUNK];
    for (int g = 0; g < G; g++) {
        load_row(q, q_bf16, q_off + ((int64_t)kh * G + g) * D, D, qf + (int64_t)g * D);
        for (int i = 0; i < D; i++) qf[(int64_t)g * D + i] *= scale;
    }
    fn(qf, kbuf, vbuf, kv_bf16, sl + lo, (int)(hi - lo), KVH, kh, G, D, s, pm, pm + G, pm + 2 * G);
}

/* Whether every row's chunk size is 1 .. MAX_CHUNK keys (row_item's score buffer holds MAX_CHUNK) and nchunks of
 * them cover the row's keys. */
int row_chunks_ok(const int64_t *row_chunk, const int64_t *lens, int R, int nchunks) {
    for (int r = 0; r < R; r++)
        if (row_chunk[r] < 1 || row_chunk[r] > MAX_CHUNK || row_chunk[r] * nchunks < lens[r]) return 0;
    return 1;
}

/* q: [R, H, D] (q_bf16: bf16, else fp32), q_stride elements from one request's row to the next; kbuf, vbuf: [S, KVH, D] (kv_bf16); slots: [R, Lmax] int64;
 * keys of row r are slots[r, first[r] .. lens[r]-1]; scratch: R*KVH*nchunks*G*(D+2) floats;
 * out: [R, H, D] (out_bf16). Requires D <= MAX_D, G <= MAX_G, chunk <= MAX_CHUNK.
 * row_chunk: [R] keys per chunk of each one-row item (1 .. MAX_CHUNK, nchunks of them covering the row's keys): a
 * row's chunks, and so its result's bits, depend on that row alone, not on the batch it came in (decodes, also
 * beside seg runs; a run of several rows splits every `chunk` = SEG_CHUNK). Returns 0, or -2 (nothing read) when a
 * row_chunk is out of range or does not cover its row. */
int decode_attention(const void *q, int q_bf16, int64_t q_stride, const void *kbuf, const void *vbuf, int kv_bf16,
                      const int64_t *slots, const int64_t *first, const int64_t *lens,
                      int R, int H, int KVH, int D, int64_t Lmax, float scale, int chunk, const int64_t *row_chunk,
                      int nchunks, float *scratch, void *out, int out_bf16, const int64_t *seg, int nseg) {
    if (!row_chunks_ok(row_chunk, lens, R, nchunks)) return -2;
    const int G = H / KVH;
    const int64_t part = (int64_t)G * (D + 2);      /* per item: m[G], l[G], o[G][D] */
    const chunk_fn fn = pick_chunk_fn(G, D);

#if defined(__AVX512F__)
    /* Extends as runs (seg[s] .. seg[s+1]-1: rows sharing a slot row), chunk == SEG_CHUNK: one work
     * item per (chunk, block of a run's rows) runs every row of the block against the chunk's keys at once;
     * one-row runs (decodes) keep the decode chunk kernel. */
    if (seg != NULL && chunk == SEG_CHUNK && D % 16 == 0 && G <= 16) {
        const int rows_per_block = 16 / G;
        int64_t nblocks = 0;
        for (int sg = 0; sg < nseg; sg++) nblocks += (seg[sg + 1] - seg[sg] + rows_per_block - 1) / rows_per_block;
        int64_t *blocks = (int64_t *)malloc(sizeof(int64_t) * 2 * (size_t)(nblocks ? nblocks : 1));
        int64_t b = 0;
        for (int sg = 0; sg < nseg; sg++)
            for (int64_t r = seg[sg]; r < seg[sg + 1]; r += rows_per_block, b++) {
                blocks[2 * b] = r;
                blocks[2 * b + 1] = r + rows_per_block < seg[sg + 1] ? r + rows_per_block : seg[sg + 1];
            }
        #pragma omp parallel for schedule(dynamic, 1)
        for (int64_t cb = 0; cb < (int64_t)nchunks * nblocks; cb++)
        for (int kh = 0; kh < KVH; kh++) {
            const int c = (int)(cb / nblocks);
            const int r0 = (int)blocks[2 * (cb % nblocks)], r1 = (int)blocks[2 * (cb % nblocks) + 1];
            if (r1 - r0 == 1) {   /* a decode: the decode chunk kernel, in the row's own chunks (row_chunk) */
                row_item(fn, q, q_bf16, (int64_t)r0 * q_stride, kbuf, vbuf, kv_bf16, slots + (int64_t)r0 * Lmax,
                         first[r0], lens[r0], c, (int)row_chunk[r0], kh, KVH, G, D, scale,
                         scratch + (((int64_t)r0 * KVH + kh) * nchunks + c) * part);
                continue;
            }
            int64_t lo = (int64_t)c * chunk, hi = lo + chunk;
            if (lo < first[r0]) lo = first[r0];           /* along a run first and lens grow with the row */
            if (hi > lens[r1 - 1]) hi = lens[r1 - 1];
            if (lo >= hi) {
                for (int r = r0; r < r1; r++) {
                    float *pm = scratch + (((int64_t)r * KVH + kh) * nchunks + c) * part;
                    for (int g = 0; g < G; g++) { pm[g] = 0.f; pm[G + g] = 0.f; }
                }
                continue;
            }
            seg_chunk(q, q_bf16, q_stride, kbuf, vbuf, kv_bf16, slots + (int64_t)r0 * Lmax,
                      first, lens, r0, r1, kh, KVH, G, D, scale, lo, hi, scratch, part, nchunks, c);
        }
        free(blocks);
        goto combine;
    }
#else
    (void)seg; (void)nseg;
#endif

    /* Work items are (chunk, row); each walks the KV heads in turn, so a chunk's rows
     * ([KVH, D] contiguous per slot) come from DRAM once, in order, and the later heads hit L2.
     * Chunk-major: the query rows of one extend share their keys, and read a chunk while it is in cache. */
    #pragma omp parallel for schedule(dynamic, 1)
    for (int64_t rc = 0; rc < (int64_t)R * nchunks; rc++)
    for (int kh = 0; kh < KVH; kh++) {
        const int c = (int)(rc / R);
        const int r = (int)(rc % R);
        row_item(fn, q, q_bf16, (int64_t)r * q_stride, kbuf, vbuf, kv_bf16, slots + (int64_t)r * Lmax, first[r],
                 lens[r], c, (int)row_chunk[r], kh, KVH, G, D, scale,
                 scratch + (((int64_t)r * KVH + kh) * nchunks + c) * part);
    }

combine:
    /* combine the chunks of each (request, head) */
    #pragma omp parallel for schedule(static)
    for (int64_t rh = 0; rh < (int64_t)R * H; rh++) {
        const int r = (int)(rh / H), h = (int)(rh % H), kh = h / G, g = h % G;
        float m = -3.0e38f;
        int any = 0;
        for (int c = 0; c < nchunks; c++) {
            const float *pm = scratch + (((int64_t)r * KVH + kh) * nchunks + c) * part;
            /* l == 0: an empty chunk (a real one has l >= 1); a NaN l (a poisoned key) must propagate */
            if (pm[G + g] != 0.f) { any = 1; if (pm[g] > m) m = pm[g]; }
        }
        float o[MAX_D];
        memset(o, 0, sizeof(float) * (size_t)D);
        float total = 0.f;
        if (any) {
            for (int c = 0; c < nchunks; c++) {
                const float *pm = scratch + (((int64_t)r * KVH + kh) * nchunks + c) * part;
                if (pm[G + g] == 0.f) continue;
                const float w = expf(pm[g] - m);
                total += w * pm[G + g];
                const float *po = pm + 2 * G + (int64_t)g * D;
                #pragma omp simd
                for (int i = 0; i < D; i++) o[i] += w * po[i];
            }
        }
        const float inv = total > 0.f ? 1.f / total : 0.f;
        if (out_bf16) {
            uint16_t *dst = (uint16_t *)out + rh * D;
            for (int i = 0; i < D; i++) dst[i] = f32_to_bf16(o[i] * inv);
        } else {
            float *dst = (float *)out + rh * D;
            for (int i = 0; i < D; i++) dst[i] = o[i] * inv;
        }
    }
    return 0;
}
