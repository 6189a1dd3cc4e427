/* CPU kernels of the native Llama path (core/engine/model/native_kernels.py builds and loads this file with the
 * system C compiler on first use; without one, the torch fallbacks in core/engine/model/native_layers.py run).
 *
 * decode_attention: attention of one query token per request over its KV slots, read straight out
 *   of the pool ([slots, kv_heads, head_dim] per layer) by slot index: no gathered copy of K/V, one
 *   pass over each key and value row, all G = H / KVH query heads of a KV head together, keys split
 *   into chunks (flash-decoding) so that even one request keeps every thread busy.
 * w8_gemv: y = x16 @ (q * scale)^T (+ bias) for a few rows of x (decode), int8 weights, fp32 maths, where x16 is
 *   x rounded to 16 significant bits: then each product x16[k] * q[n, k] is exact in fp32.
 * w8_amx_gemm: the same products for many rows (prefill) on AMX tiles (where the CPU and compiler have them);
 * w8_amx_gemm_silu the same for gate_up, with silu(gate) * up in its epilogue.
 * w8_panel_gemm (panel_gemm.c): the same products for any number of rows without AMX, one sum order for all.
 * amx_attention (amx_attention.c, compiled into the same module): a prefill's causal attention on AMX tiles.
 * fma_attention (fma_attention.c, likewise): the same attention in FMAs (AVX-512, or AVX2), for CPUs without AMX; with
 *   fma_attention_lanes and fma_decode, one order's prompt chunks and decode rows (NativeLlama.one_order).
 *
 * Built with -O3 -march=native -fopenmp and fast-math's reassociation and contraction (not -ffast-math itself:
 * native_kernels.py says why): this file never relies on inf or nan (empty chunks are flagged, not -inf), so
 * those flags only license vectorised reductions; the one place that must not reassociate says so.
 * (amx_attention.c starts each row's running max at -inf: without -ffinite-math-only that is well defined.)
 */
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
#define MAX_CHUNK 512

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

/* Elementwise work of every fp32 forward, one call instead of 6-8 torch ops (~5 us of dispatch each at decode,
 * 3-5 passes over memory at prefill). A row's result does not depend on M (rows split across threads only): these
 * kernels add no batch dependence of their own (the int8 projections' sum order still differs between a decode
 * step and a prefill chunk, by fp32 rounding).
 * add_rms_norm: if delta: x += delta (in place); then y = x * rsqrt(mean(x^2) + eps) * w. fp32. */
#define PAR_ROWS 64   /* from this many rows the rows are split across the OpenMP threads */

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

/* ---------------------------------------------------------------- Python module
 * A thin CPython wrapper (METH_FASTCALL, pointers passed as ints): a call costs ~0.1 us against
 * ~4 us through ctypes, and a decode step makes ~240 of them. The GIL is released while a kernel
 * runs, as ctypes would. */
#ifdef NATIVE_PYMODULE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static int args_ok(Py_ssize_t n, Py_ssize_t want, const char *name) {
    if (n != want) { PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, want, n); return 0; }
    return 1;
}
#define PTR(i) PyLong_AsVoidPtr(args[i])
#define INT(i) ((int)PyLong_AsLong(args[i]))
#define I64(i) ((int64_t)PyLong_AsLongLong(args[i]))
#define FLT(i) ((float)PyFloat_AsDouble(args[i]))
/* prefill-sized calls let other threads run; decode-sized ones keep the GIL (cheaper than dropping it) */
#define UNLOCKED_IF(big, call) do { if (big) { Py_BEGIN_ALLOW_THREADS call; Py_END_ALLOW_THREADS } else { call; } } while (0)

static PyObject *row_chunks_error(void) {
    PyErr_Format(PyExc_ValueError, "decode_attention: row_chunks must be 1 .. %d keys each, with nchunks of them "
                 "covering each row's keys (native_layers.decode_chunks makes them)", MAX_CHUNK);
    return NULL;
}

static PyObject *py_decode_attention(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 23, "decode_attention")) return NULL;
    const void *q = PTR(0); int qb = INT(1); int64_t qs = I64(2); const void *k = PTR(3), *v = PTR(4);
    int kvb = INT(5); const int64_t *sl = PTR(6), *fi = PTR(7), *le = PTR(8);
    int R = INT(9), H = INT(10), KVH = INT(11), D = INT(12); int64_t Lmax = I64(13); float sc = FLT(14);
    int chunk = INT(15), nch = INT(16); float *scr = PTR(17); void *out = PTR(18); int ob = INT(19);
    const int64_t *seg = PTR(20); int nseg = INT(21); const int64_t *rch = PTR(22);
    if (PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = decode_attention(q, qb, qs, k, v, kvb, sl, fi, le, R, H, KVH, D, Lmax, sc, chunk, rch, nch, scr, out, ob,
                          seg, nseg);
    Py_END_ALLOW_THREADS
    if (rc) return row_chunks_error();
    Py_RETURN_NONE;
}

/* w8_gemv, w8_panel_gemm and w8a16_gemm: the same arguments, -1 when out of memory, -2 when not built here */
typedef int (*w8_fn)(const float *, const int8_t *, const float *, const float *, float *, int, int, int);

static PyObject *call_w8(w8_fn fn, const char *name, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 8, name)) return NULL;
    const float *x = PTR(0); const int8_t *w = PTR(1); const float *s = PTR(2), *b = PTR(3); float *y = PTR(4);
    int M = INT(5), N = INT(6), K = INT(7);
    if (PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fn(x, w, s, b, y, M, N, K);
    Py_END_ALLOW_THREADS
    if (rc == -2) {
        PyErr_Format(PyExc_RuntimeError, "%s: these kernels were built without AVX512-VNNI or AVX2", name);
        return NULL;
    }
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_w8_gemv(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return call_w8(w8_gemv, "w8_gemv", args, n);
}

static PyObject *py_panel_gemm_fast(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 0, "panel_gemm_fast")) return NULL;
    return PyBool_FromLong(panel_gemm_fast());
}

static PyObject *py_w8_panel_gemm(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return call_w8(w8_panel_gemm, "w8_panel_gemm", args, n);
}

static PyObject *py_w8a16_ready(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 0, "w8a16_ready")) return NULL;
    return PyBool_FromLong(w8a16_ready());
}

static PyObject *py_w8a16_gemm(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return call_w8(w8a16_gemm, "w8a16_gemm", args, n);
}

typedef int (*amx_gemm_fn)(const float *, uint16_t *, const uint16_t *, const float *, const float *, float *,
                           int, int, int);

static PyObject *call_amx_gemm(amx_gemm_fn fn, const char *name, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 9, name)) return NULL;
    const float *x = PTR(0); uint16_t *xb = PTR(1); const uint16_t *w = PTR(2); const float *s = PTR(3), *b = PTR(4);
    float *y = PTR(5);
    int M = INT(6), N = INT(7), K = INT(8);
    if (PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fn(x, xb, w, s, b, y, M, N, K);
    Py_END_ALLOW_THREADS
    if (rc) { PyErr_Format(PyExc_RuntimeError, "%s: these kernels were built without AMX", name); return NULL; }
    Py_RETURN_NONE;
}

static PyObject *py_w8_amx_gemm(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return call_amx_gemm(w8_amx_gemm, "w8_amx_gemm", args, n);
}

static PyObject *py_w8_amx_gemm_silu(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return call_amx_gemm(w8_amx_gemm_silu, "w8_amx_gemm_silu", args, n);
}

static PyObject *py_amx_attention_ready(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 0, "amx_attention_ready")) return NULL;
    return PyBool_FromLong(amx_attention_ready());
}

typedef int (*prefill_attention_fn)(const float *, int64_t, const void *, const void *, int, const int64_t *, float *,
                                    int, int, int, int, int, float);

/* amx_attention and fma_attention: the same arguments and return codes; `dims` and `isa` name what each needs */
static PyObject *call_prefill_attention(prefill_attention_fn fn, const char *name, const char *dims, const char *isa,
                                        PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 13, name)) return NULL;
    const float *q = PTR(0); int64_t qs = I64(1); const void *k = PTR(2), *v = PTR(3); int kvb = INT(4);
    const int64_t *sl = PTR(5); float *out = PTR(6);
    int N = INT(7), M = INT(8), H = INT(9), KVH = INT(10), D = INT(11); float sc = FLT(12);
    if (PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fn(q, qs, k, v, kvb, sl, out, N, M, H, KVH, D, sc);
    Py_END_ALLOW_THREADS
    if (rc == -1) return PyErr_NoMemory();
    if (rc == -3) { PyErr_Format(PyExc_ValueError, "%s: head_dim must be a multiple of %s up to 256, heads a multiple "
                                 "of kv_heads, keys >= queries", name, dims); return NULL; }
    if (rc) { PyErr_Format(PyExc_RuntimeError, "%s: these kernels were built without %s", name, isa); return NULL; }
    Py_RETURN_NONE;
}

static PyObject *py_amx_attention(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return call_prefill_attention(amx_attention, "amx_attention", "32", "AMX", args, n);
}

static PyObject *py_fma_attention_ready(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 0, "fma_attention_ready")) return NULL;
    return PyBool_FromLong(fma_attention_ready());
}

static PyObject *py_fma_attention(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return call_prefill_attention(fma_attention, "fma_attention", "16", "AVX-512", args, n);
}

static PyObject *py_fma_attention_lanes(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return call_prefill_attention(fma_attention_lanes, "fma_attention_lanes", "16", "AVX-512", args, n);
}

static PyObject *py_fma_decode(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 15, "fma_decode")) return NULL;
    const float *q = PTR(0); int64_t qs = I64(1); const void *k = PTR(2), *v = PTR(3); int kvb = INT(4);
    const int64_t *sl = PTR(5); int64_t lmax = I64(6); const int64_t *lens = PTR(7); float *out = PTR(8);
    int64_t os = I64(9); int R = INT(10), H = INT(11), KVH = INT(12), D = INT(13); float sc = FLT(14);
    if (PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fma_decode(q, qs, k, v, kvb, sl, lmax, lens, out, os, R, H, KVH, D, sc);
    Py_END_ALLOW_THREADS
    if (rc == -1) return PyErr_NoMemory();
    if (rc == -3) { PyErr_SetString(PyExc_ValueError, "fma_decode: head_dim must be a multiple of 16 up to 256, "
                                    "heads a multiple of kv_heads, each row's keys 1 .. Lmax"); return NULL; }
    if (rc) { PyErr_SetString(PyExc_RuntimeError, "fma_decode: these kernels were built without AVX-512"); return NULL; }
    Py_RETURN_NONE;
}

static PyObject *py_kv8_ready(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 0, "kv8_ready")) return NULL;
    return PyBool_FromLong(kv8_ready());
}

static PyObject *kv8_error(int rc, const char *name) {
    if (rc == -1) return PyErr_NoMemory();
    if (rc == -3) PyErr_Format(PyExc_ValueError, "%s: head_dim must be a multiple of 64 up to 256, heads a multiple of "
                               "kv_heads, keys >= queries (each decode row's 1 .. Lmax)", name);
    else PyErr_Format(PyExc_RuntimeError, "%s: these kernels were built without AVX512-VNNI or AVX2", name);
    return NULL;
}

static PyObject *py_kv8_store(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 8, "kv8_store")) return NULL;
    const float *src = PTR(0); int64_t ss = I64(1); int8_t *buf = PTR(2); float *sc = PTR(3);
    const int64_t *sl = PTR(4); int R = INT(5), KVH = INT(6), D = INT(7);
    if (PyErr_Occurred()) return NULL;
    int rc;
    UNLOCKED_IF(R >= 64, rc = kv8_store(src, ss, buf, sc, sl, R, KVH, D));
    if (rc) return kv8_error(rc, "kv8_store");
    Py_RETURN_NONE;
}

static PyObject *py_kv8_attention(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 14, "kv8_attention")) return NULL;
    const float *q = PTR(0); int64_t qs = I64(1); const int8_t *k = PTR(2), *v = PTR(3);
    const float *ks = PTR(4), *vs = PTR(5); const int64_t *sl = PTR(6); float *out = PTR(7);
    int N = INT(8), M = INT(9), H = INT(10), KVH = INT(11), D = INT(12); float sc = FLT(13);
    if (PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kv8_attention(q, qs, k, v, ks, vs, sl, out, N, M, H, KVH, D, sc);
    Py_END_ALLOW_THREADS
    if (rc) return kv8_error(rc, "kv8_attention");
    Py_RETURN_NONE;
}

static PyObject *py_kv8_decode(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 16, "kv8_decode")) return NULL;
    const float *q = PTR(0); int64_t qs = I64(1); const int8_t *k = PTR(2), *v = PTR(3);
    const float *ks = PTR(4), *vs = PTR(5); const int64_t *sl = PTR(6); int64_t lmax = I64(7);
    const int64_t *lens = PTR(8); float *out = PTR(9); int64_t os = I64(10);
    int R = INT(11), H = INT(12), KVH = INT(13), D = INT(14); float sc = FLT(15);
    if (PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kv8_decode(q, qs, k, v, ks, vs, sl, lmax, lens, out, os, R, H, KVH, D, sc);
    Py_END_ALLOW_THREADS
    if (rc) return kv8_error(rc, "kv8_decode");
    Py_RETURN_NONE;
}

static PyObject *py_decode_layers_workspace(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 6, "decode_layers_workspace")) return NULL;
    const int64_t need = decode_layers_workspace(INT(0), INT(1), INT(2), INT(3), INT(4), INT(5));
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(need);
}

/* a whole decode step's layers (~8 ms; a mixed step's ~40): the GIL is let go, so the server's other threads run
 * meanwhile */
static PyObject *py_decode_layers(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 33, "decode_layers")) return NULL;
    float *x = PTR(0), *y = PTR(1); const int64_t *lp = PTR(2); int L = INT(3);
    const float *c = PTR(4), *sn = PTR(5);
    const int64_t *os = PTR(6), *sl = PTR(7), *fi = PTR(8), *le = PTR(9); int64_t Lmax = I64(10);
    const int64_t *rch = PTR(11); int nchunks = INT(12); float *scratch = PTR(13); int kvb = INT(14); float *ws = PTR(15);
    int R = INT(16), hid = INT(17), H = INT(18), KVH = INT(19), D = INT(20), I = INT(21);
    float eps = FLT(22), sc = FLT(23);
    const int64_t *di = PTR(24); int Rd = INT(25), cat = INT(26), cn = INT(27); const int64_t *cs = PTR(28);
    int cm = INT(29), amx = INT(30), one_order = INT(31), a16 = INT(32);
    if (PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = decode_layers(x, y, lp, L, c, sn, os, sl, fi, le, Lmax, rch, nchunks, scratch, kvb, ws, R, hid, H, KVH,
                       D, I, eps, sc, di, Rd, cat, cn, cs, cm, amx, one_order, a16);
    Py_END_ALLOW_THREADS
    if (rc == -2) return row_chunks_error();
    if (rc == -3) {
        PyErr_SetString(PyExc_RuntimeError, "decode_layers: the chunk's attention kernel refused it (built without "
                        "AMX or AVX-512, or its shapes); DecodeLayers.fits_step keeps such steps in the Python loop");
        return NULL;
    }
    if (rc == -4) {
        PyErr_SetString(PyExc_RuntimeError, "decode_layers: a16 or an int8 pool asked of kernels built without "
                        "AVX512-VNNI; NativeLlama sets them only where those kernels run");
        return NULL;
    }
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_amx_ready(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 0, "amx_ready")) return NULL;
    return PyBool_FromLong(amx_ready());
}

static PyObject *py_add_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 7, "add_rms_norm")) return NULL;
    float *x = PTR(0); const float *d = PTR(1), *w = PTR(2); float *y = PTR(3);
    int M = INT(4), N = INT(5); float eps = FLT(6);
    if (PyErr_Occurred()) return NULL;
    UNLOCKED_IF(M >= PAR_ROWS, add_rms_norm(x, d, w, y, M, N, eps));
    Py_RETURN_NONE;
}

static PyObject *py_silu_mul(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 4, "silu_mul")) return NULL;
    const float *gu = PTR(0); float *o = PTR(1); int M = INT(2), I = INT(3);
    if (PyErr_Occurred()) return NULL;
    UNLOCKED_IF(M >= PAR_ROWS, silu_mul(gu, o, M, I));
    Py_RETURN_NONE;
}

static PyObject *py_rope(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 8, "rope")) return NULL;
    const float *x = PTR(0); int64_t rs = I64(1); const float *c = PTR(2), *sn = PTR(3); float *o = PTR(4);
    int T = INT(5), NH = INT(6), D = INT(7);
    if (PyErr_Occurred()) return NULL;
    UNLOCKED_IF(T >= PAR_ROWS, rope(x, rs, c, sn, o, T, NH, D));
    Py_RETURN_NONE;
}

static PyObject *py_decode_attention_fast(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 2, "decode_attention_fast")) return NULL;
    return PyBool_FromLong(decode_attention_fast(INT(0), INT(1)));
}

/* a benchmark knob: set it, return the previous value */
static PyObject *swap_setting(int *setting, const char *name, PyObject *const *args, Py_ssize_t n) {
    if (!args_ok(n, 1, name)) return NULL;
    const int previous = *setting, want = INT(0);
    if (PyErr_Occurred()) return NULL;
    *setting = want;
    return PyLong_FromLong(previous);
}

static PyObject *py_set_w8_row_max(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return swap_setting(&w8_row_max, "set_w8_row_max", args, n);
}

static PyObject *py_set_w8_prefetch(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return swap_setting(&w8_prefetch, "set_w8_prefetch", args, n);
}

static PyMethodDef METHODS[] = {
    {"decode_attention", (PyCFunction)(void (*)(void))py_decode_attention, METH_FASTCALL, NULL},
    {"w8_gemv", (PyCFunction)(void (*)(void))py_w8_gemv, METH_FASTCALL, NULL},
    {"fma_decode", (PyCFunction)(void (*)(void))py_fma_decode, METH_FASTCALL, NULL},
    {"kv8_ready", (PyCFunction)(void (*)(void))py_kv8_ready, METH_FASTCALL, NULL},
    {"kv8_store", (PyCFunction)(void (*)(void))py_kv8_store, METH_FASTCALL, NULL},
    {"kv8_attention", (PyCFunction)(void (*)(void))py_kv8_attention, METH_FASTCALL, NULL},
    {"kv8_decode", (PyCFunction)(void (*)(void))py_kv8_decode, METH_FASTCALL, NULL},
    {"fma_attention_lanes", (PyCFunction)(void (*)(void))py_fma_attention_lanes, METH_FASTCALL, NULL},
    {"w8_amx_gemm", (PyCFunction)(void (*)(void))py_w8_amx_gemm, METH_FASTCALL, NULL},
    {"w8_amx_gemm_silu", (PyCFunction)(void (*)(void))py_w8_amx_gemm_silu, METH_FASTCALL, NULL},
    {"w8_panel_gemm", (PyCFunction)(void (*)(void))py_w8_panel_gemm, METH_FASTCALL, NULL},
    {"panel_gemm_fast", (PyCFunction)(void (*)(void))py_panel_gemm_fast, METH_FASTCALL, NULL},
    {"w8a16_gemm", (PyCFunction)(void (*)(void))py_w8a16_gemm, METH_FASTCALL, NULL},
    {"w8a16_ready", (PyCFunction)(void (*)(void))py_w8a16_ready, METH_FASTCALL, NULL},
    {"amx_ready", (PyCFunction)(void (*)(void))py_amx_ready, METH_FASTCALL, NULL},
    {"amx_attention", (PyCFunction)(void (*)(void))py_amx_attention, METH_FASTCALL, NULL},
    {"amx_attention_ready", (PyCFunction)(void (*)(void))py_amx_attention_ready, METH_FASTCALL, NULL},
    {"fma_attention", (PyCFunction)(void (*)(void))py_fma_attention, METH_FASTCALL, NULL},
    {"fma_attention_ready", (PyCFunction)(void (*)(void))py_fma_attention_ready, METH_FASTCALL, NULL},
    {"decode_layers", (PyCFunction)(void (*)(void))py_decode_layers, METH_FASTCALL, NULL},
    {"decode_layers_workspace", (PyCFunction)(void (*)(void))py_decode_layers_workspace, METH_FASTCALL, NULL},
    {"add_rms_norm", (PyCFunction)(void (*)(void))py_add_rms_norm, METH_FASTCALL, NULL},
    {"silu_mul", (PyCFunction)(void (*)(void))py_silu_mul, METH_FASTCALL, NULL},
    {"rope", (PyCFunction)(void (*)(void))py_rope, METH_FASTCALL, NULL},
    {"decode_attention_fast", (PyCFunction)(void (*)(void))py_decode_attention_fast, METH_FASTCALL, NULL},
    {"set_w8_row_max", (PyCFunction)(void (*)(void))py_set_w8_row_max, METH_FASTCALL, NULL},
    {"set_w8_prefetch", (PyCFunction)(void (*)(void))py_set_w8_prefetch, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_radix_native_kernels", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__radix_native_kernels(void) { return PyModule_Create(&MODULE); }
#endif
