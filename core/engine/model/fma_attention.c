/* Prefill attention with FMAs (AVX-512, or AVX2), for CPUs without AMX: amx_attention's interface and its promise (a query
 * row's result is the same bits however its prompt was chunked or cached, and whatever rows share its work item),
 * in plain fp32.
 *
 * Why: without AMX the int8 model's prompt chunks ran torch's CPU flash attention, 110-155 GFLOP/s on an AMD EPYC
 * (its blocks are MKL's sgemm), and its results moved with the chunking (its blocks start where a call's keys
 * start): cache on == cache off held for 49 of 50 prompts there.
 *
 * How: a work item is one KV head's query heads at FQ consecutive positions. Keys run in blocks of FK aligned to
 * absolute positions 0, FK, 2 FK, ...; each row visits the blocks up to its own position in order, keeping its
 * running max, sum and output (online softmax); a key past the row's position gets weight exactly 0 (a V row it
 * multiplies must be finite, as amx_attention's must). Scores: per row, 16 keys at a time, 16 lanes of partial
 * sums over D reduced by one fixed tree (scores16); outputs: 4 rows x 64 of D per step over the block's keys, in
 * key order. Many rows read a block packed once (fp32 copies); one register block of rows (a decode row, a
 * short chunk of one position) reads it straight from the pool: the same values, so the same bits, and a
 * decode row costs one pass over its keys (fma_decode below).
 *
 * Layouts as amx_attention's: q rows [n][H][D] fp32 (row stride qs floats); k/v [slots][KVH][D] fp32 or bf16
 * (kv_bf16), key j at slot slots[j]; out [n][H][D] fp32. Query i sits at position m - n + i. D % 16 == 0,
 * D <= 256, H % KVH == 0, m >= n. Returns -1 when out of memory, -2 where built without AVX-512 or AVX2, -3 for
 * shapes it cannot run. On AVX2 (fma_avx2.h) the same drivers run the lanes path's arithmetic on 8 lanes for every
 * chunk: that build has no transposed path. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "native_simd.h"
#include "native_kernels.h"

#if defined(__AVX512F__)
#define FMA_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define FMA_AVX512 0   /* fma_avx2.h: the lanes path on 8 lanes */
#endif

#ifdef FMA_AVX512

#define FQ 32   /* query positions per work item */
#define FK 32   /* keys per block */
#define RB_T 6  /* rows per register block, keys across lanes (6 measured 9.5 % faster than 4 at a 4,096-token
                 * prefill: the transposed keys loaded once for more rows) */
#define RB_L 4  /* rows per register block, d across lanes (with 6 a one-query decode ran ~8 % slower) */
#define RB 6    /* the larger of the two: the buffers' rows */
_Static_assert(RB >= RB_T && RB >= RB_L, "RB holds a register block of either kind");
#define SEG_BLOCKS 16   /* key blocks per segment: the work items of a short chunk */
#define SEG (SEG_BLOCKS * FK)
#define PREFETCH_BLOCKS 1   /* key blocks ahead whose K/V rows are asked for */

int fma_attention_ready(void) { return 1; }

/* K/V rows of block kb PREFETCH_BLOCKS ahead asked for now: a decode row's keys come from memory, once */
static void prefetch_block(const void *k, const void *v, int bf16, const int64_t *slots, int m, int kb, int g,
                           int KVH, int D) {
    const int64_t row = (int64_t)D * (bf16 ? 2 : 4);
    for (int j = kb * FK; j < (kb + 1) * FK && j < m; j++) {
        const int64_t at = (slots[j] * KVH + g) * row;
        for (int64_t b = 0; b < row; b += 64) {
            __builtin_prefetch((const char *)k + at + b, 0, 2);
            __builtin_prefetch((const char *)v + at + b, 0, 2);
        }
    }
}

#if FMA_AVX512
#include "fma_avx512.h"
#else
#include "fma_avx2.h"
#endif

/* the rows (g's query heads at positions pos0 .. pos0 + qn - 1, queries i0 ..) over key blocks kb0 .. kb1 - 1 (one
 * segment): fresh running max, sum and output per row in mx, sum, o; a row the segment shows nothing keeps mx -inf.
 * segment and merge are compiled once each (noinline): the module's flags let the compiler reassociate sums, and
 * two inlined copies (a short chunk's path and a long one's) could then give a row different bits. */
__attribute__((noinline, noclone))
static void segment(const float *q, int64_t qs, const void *k, const void *v, int bf16, const int64_t *slots, int m,
                    int g, int G, int KVH, int D, int64_t pos0, int i0, int qn, int kb0, int kb1, float scale,
                    int lanes, float *kp, float *vb, float *s, float *p, float *mx, float *sum, float *o) {
    const int rows = G * qn;
    for (int r = 0; r < rows; r++) { mx[r] = -INFINITY; sum[r] = 0.f; }
    memset(o, 0, (size_t)rows * D * sizeof(float));
    /* scores with keys across lanes (a transposed block, packed once for all rows: the fastest prefill) or, with
     * one order (lanes), d across lanes: then a block's keys are read where they are when one register block of
     * rows reads them once (decode rows), else copied once for all the row blocks; the same values either way,
     * so the same bits */
    const int rb = lanes ? RB_L : RB_T;   /* rows a register block (a row's bits do not depend on it) */
    const int packed = !lanes || rows > RB_L;
    for (int kb = kb0; kb < kb1; kb++) {
        const int64_t j0 = (int64_t)kb * FK;
        if (j0 > pos0 + qn - 1) break;                            /* no row sees this block or any later */
        const int kn = m - j0 < FK ? (int)(m - j0) : FK;
        int64_t at[FK];
        prefetch_block(k, v, bf16, slots, m, kb + PREFETCH_BLOCKS, g, KVH, D);
        if (packed) pack_block(lanes, k, v, bf16, slots, m, kb, g, KVH, D, kp, vb);
        for (int j = 0; j < FK; j++)
            at[j] = j >= kn ? -1 : packed ? (int64_t)j * D : (slots[j0 + j] * KVH + g) * (int64_t)D;
        const void *ks = packed ? (const void *)kp : k, *vs = packed ? (const void *)vb : v;
        const int sb = packed ? 0 : bf16;
        for (int r0 = 0; r0 < rows; r0 += rb) {
            const float *qr[RB];
            float *dst[RB], corr[RB], spare[256] __attribute__((aligned(64)));
            int seen[RB], any = 0;
            for (int r = 0; r < rb; r++) {
                const int rr = r0 + r < rows ? r0 + r : r0;       /* past the last row: the first again, unused */
                const int64_t vis = pos0 + rr % qn - j0 + 1;      /* keys of this block the row sees */
                seen[r] = r0 + r < rows ? (vis > FK ? FK : vis < 0 ? 0 : (int)vis) : 0;
                qr[r] = q + (int64_t)(i0 + rr % qn) * qs + (int64_t)(g * G + rr / qn) * D;
                dst[r] = r0 + r < rows ? o + (int64_t)rr * D : spare;
                any |= seen[r] > 0;
            }
            if (!any) continue;
            block_scores(lanes, qr, seen, ks, sb, at, kp, D, s);
            for (int r = 0; r < rb; r++) {
                if (seen[r] > 0) {
                    softmax_step(s + r * FK, seen[r], scale, &mx[r0 + r], &sum[r0 + r], p + r * FK, &corr[r]);
                } else {   /* nothing to add: weight 0, the output written back unchanged (o * 1 + 0) */
                    memset(p + r * FK, 0, FK * sizeof(float));
                    corr[r] = 1.f;
                }
            }
            if (r0 + rb > rows) memset(spare, 0, (size_t)D * sizeof(float));
            block_outputs(lanes, dst, p, corr, vs, sb, at, D);
        }
    }
}

static int attention(const float *q, int64_t qs, const void *k, const void *v, int kv_bf16, const int64_t *slots,
                     float *out, int n, int m, int H, int KVH, int D, float scale, int lanes) {
    if (D % 16 || D > 256 || D <= 0 || KVH <= 0 || H % KVH || m < n) return -3;   /* the wrapper checks these */
    if (n <= 0) return 0;
    lanes |= !FMA_AVX512;   /* AVX2 has the lanes path only */
    const int G = H / KVH, nqb = (n + FQ - 1) / FQ, rows_max = G * FQ, nseg = (m + SEG - 1) / SEG;
    const int64_t pos0 = (int64_t)m - n;                          /* the first query's position */
    /* one query block (a short chunk, a few decoding rows' worth): its work items are (KV head, segment), each
     * segment's rows kept, then merged in order; else (KV head, query block), segments merged as they end */
    const int few = nqb == 1;
    const size_t pstride = (size_t)rows_max * (D + 2);
    float *parts = few ? (float *)malloc(sizeof(float) * (size_t)KVH * nseg * pstride) : NULL;
    if (few && !parts) return -1;
    int failed = 0;
    #pragma omp parallel
    {
        const size_t floats = (size_t)2 * FK * D + (size_t)2 * rows_max * (D + 2) + 2 * RB * FK + 64;
        float *buf = (float *)aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        if (!buf) {
            #pragma omp atomic write
            failed = 1;
        }
        float *kp = buf, *vb = kp + FK * D, *o = vb + FK * D, *mx = o + (size_t)rows_max * D, *sum = mx + rows_max;
        float *ao = sum + rows_max, *amx = ao + (size_t)rows_max * D, *asum = amx + rows_max;
        float *s = (float *)(((uintptr_t)(asum + rows_max) + 63) & ~(uintptr_t)63), *p = s + RB * FK;
        if (few) {
            /* with segments enough for every thread, an item is a segment and its KV heads in turn (a key's
             * K/V rows of all heads are adjacent in the pool: one stream from memory instead of KVH strided
             * ones), else (KV head, segment); the same segment() calls either way, so the same bits */
            const int by_segment = nseg >= 2 * omp_get_num_threads();
            const int items = by_segment ? nseg : KVH * nseg, per_item = by_segment ? KVH : 1;
            #pragma omp for schedule(dynamic, 1)
            for (int it = 0; it < items; it++) {
                if (!buf) continue;
                for (int h = 0; h < per_item; h++) {
                    const int g = by_segment ? h : it / nseg, sg = by_segment ? it : it % nseg;
                    float *part = parts + ((size_t)g * nseg + sg) * pstride;   /* [rows][D] outputs, maxes, sums */
                    const int rows = G * n;
                    segment(q, qs, k, v, kv_bf16, slots, m, g, G, KVH, D, pos0, 0, n, sg * SEG_BLOCKS,
                            (sg + 1) * SEG_BLOCKS, scale, lanes, kp, vb, s, p, part + (size_t)rows * D,
                            part + (size_t)rows * D + rows, part);
                }
            }
            #pragma omp for schedule(static)
            for (int it = 0; it < KVH * G * n; it++) {
                if (!buf) continue;
                const int g = it / (G * n), rr = it % (G * n), rows = G * n;
                float top = -INFINITY, total = 0.f;
                memset(ao, 0, (size_t)D * sizeof(float));
                for (int sg = 0; sg < nseg; sg++) {
                    const float *part = parts + ((size_t)g * nseg + sg) * pstride;
                    merge(&top, &total, ao, part[(size_t)rows * D + rr], part[(size_t)rows * D + rows + rr],
                          part + (size_t)rr * D, D);
                }
                finish(ao, total, out + ((int64_t)(rr % n) * H + g * G + rr / n) * D, D);
            }
        } else {
            /* one KV head's items together, and within it the last query blocks (the most keys) first */
            #pragma omp for schedule(dynamic, 1)
            for (int it = 0; it < nqb * KVH; it++) {
                if (!buf) continue;
                const int g = it / nqb, qb = nqb - 1 - it % nqb, i0 = qb * FQ;
                const int qn = n - i0 < FQ ? n - i0 : FQ, rows = G * qn;
                const int64_t p0 = pos0 + i0;
                for (int r = 0; r < rows; r++) { amx[r] = -INFINITY; asum[r] = 0.f; }
                memset(ao, 0, (size_t)rows * D * sizeof(float));
                const int segs = (int)((p0 + qn - 1) / SEG) + 1;
                for (int sg = 0; sg < segs; sg++) {
                    segment(q, qs, k, v, kv_bf16, slots, m, g, G, KVH, D, p0, i0, qn, sg * SEG_BLOCKS,
                            (sg + 1) * SEG_BLOCKS, scale, lanes, kp, vb, s, p, mx, sum, o);
                    for (int rr = 0; rr < rows; rr++)
                        merge(&amx[rr], &asum[rr], ao + (size_t)rr * D, mx[rr], sum[rr], o + (size_t)rr * D, D);
                }
                for (int rr = 0; rr < rows; rr++)
                    finish(ao + (size_t)rr * D, asum[rr], out + ((int64_t)(i0 + rr % qn) * H + g * G + rr / qn) * D, D);
            }
        }
        free(buf);
    }
    free(parts);
    return failed ? -1 : 0;
}

int fma_attention(const float *q, int64_t qs, const void *k, const void *v, int kv_bf16, const int64_t *slots,
                  float *out, int n, int m, int H, int KVH, int D, float scale) {
    return attention(q, qs, k, v, kv_bf16, slots, out, n, m, H, KVH, D, scale, 0);
}

/* the same attention with one order's scores (d across lanes): fma_decode's arithmetic for prompt chunks */
int fma_attention_lanes(const float *q, int64_t qs, const void *k, const void *v, int kv_bf16, const int64_t *slots,
                        float *out, int n, int m, int H, int KVH, int D, float scale) {
    return attention(q, qs, k, v, kv_bf16, slots, out, n, m, H, KVH, D, scale, 1);
}

/* Decode rows: row r's one query (q + r * qs, [H][D], at position lens[r] - 1) over its keys slots[r * Lmax ..
 * + lens[r]) into out + r * os. Each row is exactly what fma_attention gives that query as a chunk of one (the
 * same segment() and merge() calls, in the same order), so a token's attention, hence its next layer's K/V, is
 * the same bits in a decode step as in a prefill chunk. */
int fma_decode(const float *q, int64_t qs, const void *k, const void *v, int kv_bf16, const int64_t *slots,
               int64_t Lmax, const int64_t *lens, float *out, int64_t os, int R, int H, int KVH, int D, float scale) {
    if (D % 16 || D > 256 || D <= 0 || KVH <= 0 || H % KVH) return -3;
    for (int r = 0; r < R; r++)
        if (lens[r] < 1 || lens[r] > Lmax) return -3;
    if (R <= 0) return 0;
    const int G = H / KVH;
    const size_t pstride = (size_t)G * (D + 2);
    int64_t *first = (int64_t *)malloc(sizeof(int64_t) * ((size_t)R + 1));   /* row r's items start here */
    if (!first) return -1;
    first[0] = 0;
    for (int r = 0; r < R; r++) first[r + 1] = first[r] + (lens[r] + SEG - 1) / SEG;   /* row r's segments */
    const int64_t items = first[R];
    float *parts = (float *)malloc(sizeof(float) * (size_t)items * KVH * pstride);   /* [segment][KV head] */
    if (!parts) { free(first); return -1; }
    int failed = 0;
    #pragma omp parallel
    {
        const size_t floats = (size_t)2 * FK * D + (size_t)G * (D + 2) + 2 * RB * FK + 64;
        float *buf = (float *)aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        if (!buf) {
            #pragma omp atomic write
            failed = 1;
        }
        float *kp = buf, *vb = kp + FK * D, *ao = vb + FK * D;
        float *s = (float *)(((uintptr_t)(ao + (size_t)G * (D + 2)) + 63) & ~(uintptr_t)63), *p = s + RB * FK;
        int r = 0;
        /* an item is one row's segment, its KV heads in turn: a slot's K (or V) rows of every head are contiguous,
         * so a segment's memory is read in order, as the decode kernel reads it (items of (segment, head)
         * measured alike at 4,096 keys) */
        #pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!buf) continue;
            while (first[r + 1] <= it) r++;                         /* items come in order within a thread */
            while (first[r] > it) r--;
            const int64_t m = lens[r];
            const int sg = (int)(it - first[r]);
            for (int g = 0; g < KVH; g++) {
                float *part = parts + ((size_t)it * KVH + g) * pstride;   /* [G][D] outputs, maxes, sums */
                segment(q + (int64_t)r * qs, qs, k, v, kv_bf16, slots + (int64_t)r * Lmax, (int)m, g, G, KVH, D,
                        m - 1, 0, 1, sg * SEG_BLOCKS, (sg + 1) * SEG_BLOCKS, scale, 1, kp, vb, s, p,
                        part + (size_t)G * D, part + (size_t)G * D + G, part);
            }
        }
        #pragma omp for schedule(static)
        for (int64_t it = 0; it < (int64_t)R * H; it++) {
            if (!buf) continue;
            const int rr = (int)(it / H), h = (int)(it % H), g = h / G, i = h % G;
            const int64_t nseg = (lens[rr] + SEG - 1) / SEG;
            float top = -INFINITY, total = 0.f;
            memset(ao, 0, (size_t)D * sizeof(float));
            for (int sg = 0; sg < nseg; sg++) {
                const float *part = parts + ((size_t)(first[rr] + sg) * KVH + g) * pstride;
                merge(&top, &total, ao, part[(size_t)G * D + i], part[(size_t)G * D + G + i], part + (size_t)i * D, D);
            }
            finish(ao, total, out + (int64_t)rr * os + (int64_t)h * D, D);
        }
        free(buf);
    }
    free(parts);
    free(first);
    return failed ? -1 : 0;
}
#else
int fma_attention_ready(void) { return 0; }

int fma_attention(const float *q, int64_t qs, const void *k, const void *v, int kv_bf16, const int64_t *slots,
                  float *out, int n, int m, int H, int KVH, int D, float scale) {
    (void)q; (void)qs; (void)k; (void)v; (void)kv_bf16; (void)slots; (void)out; (void)n; (void)m; (void)H; (void)KVH; (void)D; (void)scale;
    return -2;
}

int fma_attention_lanes(const float *q, int64_t qs, const void *k, const void *v, int kv_bf16, const int64_t *slots,
                        float *out, int n, int m, int H, int KVH, int D, float scale) {
    return fma_attention(q, qs, k, v, kv_bf16, slots, out, n, m, H, KVH, D, scale);
}

int fma_decode(const float *q, int64_t qs, const void *k, const void *v, int kv_bf16, const int64_t *slots,
               int64_t Lmax, const int64_t *lens, float *out, int64_t os, int R, int H, int KVH, int D, float scale) {
    (void)q; (void)qs; (void)k; (void)v; (void)kv_bf16; (void)slots; (void)Lmax; (void)lens; (void)out; (void)os;
    (void)R; (void)H; (void)KVH; (void)D; (void)scale;
    return -2;
}
#endif
