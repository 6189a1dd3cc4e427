/* Attention over an int8 KV pool: K and V stored as int8 with one fp32 scale per (slot, KV head) row, attended
 * to in exact integer sums on AVX512-VNNI.
 *
 * Why: a decode step reads every K and V row of its context once per layer. In fp32 that is 189 MB a step at
 * 4,096 tokens of the default model, and on a 2-core CPU the step was memory-bound (decode at 4,096 tokens ran at
 * 0.37x the speed at 128). int8 rows with their scales are 3.8x fewer bytes (llama.cpp's q8_0 cache and LMDeploy's
 * int8 KV store them alike, per token and head), and a pool of the same GiB holds 3.8x the tokens.
 *
 * Storing (kv8_store): a row x of D values gets scale s = max|x| / 127 and values round(x / s) (nearest, ties to
 * even; a zero row scale 0; a row with NaN or inf scale NaN, values 0): the bits KVPool.set_kv gives in torch.
 *
 * Attending: a query row is rounded once to int8 (scale max|q| / 127, as K's rows; quantize_q: as SageAttention
 * quantizes Q and K). A score is the exact int32 sum of q x k over D (VPDPBUSD: 64 products an instruction, on
 * K + 128 as unsigned bytes, less 128 x the sum of q) times (q scale x softmax scale) times the key's scale. int8
 * queries made a 4,096-token chunk ~20 % faster than int16 ones (VPDPWSSD) and moved greedy agreement with HF by one
 * prompt of 50 (benchmarks/README.md, "int8 KV pool").
 * Softmax runs online over blocks of BK keys aligned to absolute positions 0, BK, 2 BK, ...; in a block each weight
 * p_j x (V scale of key j) is rounded to int16 against the block's largest, and the block's output is the exact
 * int32 sum over its keys of weight x v (VPDPWSSD on key pairs), scaled once into fp32. Integer sums have no order,
 * and every fp32 step runs in one compiled function (noinline: the module's flags let the compiler reassociate, and
 * two inlined copies could round apart), so a row's result is the same bits whichever rows share its call, however
 * its prompt was chunked or cached, decoded or prefilled (the promise fma_attention.c keeps in fp32).
 *
 * Layouts: q rows [n][H][D] fp32 (row stride qs floats); k, v [slots][KVH][D] int8, ks, vs [slots][KVH] fp32, key j
 * at slot slots[j]; out [n][H][D] fp32; query i at position m - n + i. D % 64 == 0, D <= 256, H % KVH == 0, m >= n.
 * Returns -1 when out of memory, -2 where built without AVX512-VNNI or AVX2 (kv8_avx2*.h), -3 for shapes it cannot
 * run. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "native_simd.h"
#include "native_kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#define KV8_AVX512 1
#define KV8_AVX2 0
#elif defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)   /* AVX-512 without VNNI: fp32 pool */
#define KV8_AVX512 0
#define KV8_AVX2 1      /* the same integer sums on 8 lanes (kv8_avx2.h) */
#else
#define KV8_AVX512 0
#define KV8_AVX2 0
#endif

#if KV8_AVX512 && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define KV8_AMX 1       /* a prompt chunk's many rows on AMX-INT8 tiles (kv8_amx_block.h), where the CPU has them */
#else
#define KV8_AMX 0
#endif

int kv8_amx = 1;   /* native_kernels.set_amx's switch (set_kv8_amx): 0 keeps many rows on the AVX-512 kernels */

/* whether a prompt chunk's many rows run on AMX tiles here: built with AMX-INT8, Linux granted the tiles, and
 * set_amx left them on */
int kv8_tiles(void) { return KV8_AMX && kv8_amx && amx_ready(); }

#if KV8_AVX512 || KV8_AVX2

#define BK 64           /* keys per block (64: a 4,096-token chunk 15-20 % faster than with 32, the per-block
                         * softmax steps over more keys) */
#define NG (BK / 16)    /* 16-key groups a block */
#define FQ 32           /* query positions per work item of a long chunk */
#define SEG_BLOCKS 8    /* key blocks per segment: the work items of decode rows and short chunks */
#define SEG (SEG_BLOCKS * BK)
#define MAX_D 256
#define PREFETCH_BLOCKS 1   /* key blocks ahead whose rows are asked for */
#define RB 4                /* rows whose scores are summed together on transposed keys */
#define NOT_FINITE 0x99  /* fpclass: QNaN, +inf, -inf, SNaN */

int kv8_ready(void) { return 1; }

#if KV8_AVX512
#include "kv8_avx512.h"
#else
#include "kv8_avx2.h"
#endif

/* one row of D values into int8 + its scale (the module docstring's rule) */
__attribute__((noinline, noclone))
static void store_row(const float *x, int D, int8_t *dst, float *scale) {
    const float a = abs_max(x, D), s = a / 127.f;
    if (!(s > 0.f)) {   /* NaN (a value not finite), zero, or below fp32's range */
        memset(dst, 0, (size_t)D);
        *scale = s != s ? NAN : 0.f;
        return;
    }
    round_to_int8(x, D, s, dst);
    *scale = s;
}

int kv8_store(const float *src, int64_t ss, int8_t *buf, float *scales, const int64_t *slots, int R, int KVH, int D) {
    if (D % 32 || D <= 0 || D > MAX_D || KVH <= 0) return -3;
    #pragma omp parallel for schedule(static) if (R * KVH >= 256)
    for (int64_t it = 0; it < (int64_t)R * KVH; it++) {
        const int64_t r = it / KVH, g = it % KVH, row = slots[r] * KVH + g;
        store_row(src + r * ss + g * D, D, buf + row * D, scales + row);
    }
    return 0;
}

/* a query row to int8 (scale max|q| / 127, as K's rows) and the sum of those values (VPDPBUSD multiplies K + 128,
 * unsigned: the scores subtract 128 x that sum); returns the scale x the softmax scale (NaN for a row not finite,
 * 0 for a zero row: its scores are then all 0) */
__attribute__((noinline, noclone))
static float quantize_q(const float *q, int D, float scale, int8_t *dst, int32_t *qsum) {
    const float a = abs_max(q, D), s = a / 127.f;
    *qsum = 0;
    if (!(s > 0.f)) {
        memset(dst, 0, (size_t)D);
        return s != s ? NAN : 0.f;
    }
    *qsum = round_to_int8(q, D, s, dst);
    return s * scale;
}

/* every query row of q ([n][H][D], row stride qs) to int8 qi [n][H][D], its factor qc and sum qsum [n][H] */
static void quantize_queries(const float *q, int64_t qs, int n, int H, int D, float scale, int8_t *qi, float *qc,
                             int32_t *qsum) {
    #pragma omp parallel for schedule(static) if (n * H >= 256)
    for (int64_t it = 0; it < (int64_t)n * H; it++)
        qc[it] = quantize_q(q + (it / H) * qs + (it % H) * D, D, scale, qi + it * D, qsum + it);
}

/* The keys of one request in one pool layer. */
typedef struct {
    const int8_t *k, *v;
    const float *ks, *vs;
    const int64_t *slots;
    int m, KVH, D, G, H;
} keys8;

/* The queries of a call: int8 rows qi [n][H][D], each row's factor qc (quantize_q) and sum qsum [n][H]. */
typedef struct {
    const int8_t *qi;
    const float *qc;
    const int32_t *qsum;
} queries8;

/* A KV head g's rows for queries i0 .. i0 + qn - 1 come head by head: row rr is query head g G + rr / qn at query
 * i0 + rr % qn. Its index in the call's [n][H] query rows: */
static inline int64_t row_at(const keys8 *kv, int g, int i0, int qn, int rr) {
    return (int64_t)(i0 + rr % qn) * kv->H + g * kv->G + rr / qn;
}

/* how many keys of the block starting at key j0 row rr sees (it sits at position pos0 + rr % qn) */
static inline int row_seen(int64_t pos0, int qn, int rr, int64_t j0) {
    const int64_t vis = pos0 + rr % qn - j0 + 1;
    return vis > BK ? BK : vis < 0 ? 0 : (int)vis;
}

/* Few rows: the next block's K and V lines, asked for into L2 a few at a time while this block's scores and V sums
 * run (ask_ahead, from the block headers' loops). Few rows' keys come from memory (a decode step at 4,096 tokens
 * reads 47 MB of them, past the caches once the weights have streamed), and the block's own lines asked for at once
 * (unpack_keys) leave the memory idle while the block's arithmetic runs. */
typedef struct {
    const int8_t *k, *v;   /* the next line of each to ask for */
    int lines;             /* lines of each left */
    const int8_t *block;   /* the K row of the block these lines are (its first key's, head 0's), or NULL */
} ahead8;
_Static_assert(sizeof(ahead8) <= 64, "block_buffers keeps 64 bytes for ahead8");

/* One block of one KV head: each key's int8 K and V rows and their scales, found once for the rows that read it
 * (few rows read the int8 rows in place: unpack_keys), and for many rows unpacked once (unpack_block): K transposed
 * to d quads (AVX-512: + 128, or as int8 for AMX tiles), or widened to int16 d pairs (AVX2), V as key pairs
 * [BK/2][D][2] int16; zeros past the last key. */
typedef struct {
    uint8_t *ku;   /* AVX2: K widened to int16 d pairs [D/2][BK] (AVX-512: NULL, kt is read from the rows) */
    int16_t *vp;
    int32_t *kt;   /* AVX-512, many rows: K transposed, [D/4][BK], each 4 values (d .. d + 3) of one key */
    int32_t dots[RB * BK];   /* a register block of rows' scores */
    int16_t wq[RB * BK];     /* their softmax weights as int16 */
    int32_t *acc;            /* their exact weighted sums of V: [RB][D] */
    const int8_t *kslot[BK], *vslot[BK];   /* each key's int8 K and V rows of head g0 (head g at + (g - g0) D; few
                                            * rows widen them as they read them) */
    float *kscs, *vscs;   /* heads g0 .. g1 - 1's scales, [g - g0][BK] each (block_buffers; many rows: g0 = g) */
    const int8_t *zrow;   /* KVH rows of zeros: the rows of keys past the last, for every head */
    int g0, head;         /* the block's first head, and the head attended now (its scales' row, its rows' offset) */
    struct amx8 *amx;     /* many rows' buffers on AMX tiles (kv8_amx_block.h), or NULL: the AVX-512 kernels */
    ahead8 *ahead;        /* few rows: the next block's lines left to ask for (in block_buffers' memory: the kernels
                           * take the block read-only and move this on) */
} block8;

/* n of the next block's K and V lines asked for into L2 (none left: nothing) */
static inline void ask_ahead(const block8 *b, int n) {
    ahead8 *a = b->ahead;
    for (; n > 0 && a->lines > 0; n--, a->lines--, a->k += 64, a->v += 64) {
        __builtin_prefetch(a->k, 0, 2);
        __builtin_prefetch(a->v, 0, 2);
    }
}

/* ask for key j's K and V rows of heads g .. g + heads - 1 (adjacent in its slot; and their scales, where `scales`:
 * a line holds 16 of them) a block before they are unpacked: a key at a time, as a block is unpacked (a burst of a
 * block's prefetches was dropped) */
static inline void prefetch_key(const keys8 *kv, int g, int heads, int64_t j, int scales) {
    const int D = kv->D;
    const int64_t next = kv->slots[j] * kv->KVH + g;
    for (int d = 0; d < heads * D; d += 64) {
        __builtin_prefetch(kv->k + next * D + d, 0, 2);
        __builtin_prefetch(kv->v + next * D + d, 0, 2);
    }
    if (scales) {
        __builtin_prefetch(kv->ks + next, 0, 2);
        __builtin_prefetch(kv->vs + next, 0, 2);
    }
}

/* the scales of kn keys in a run of slots of every head ([kn][KVH] at ks and vs), as the kernels read them: kscs
 * and vscs [KVH][BK] */
static inline __attribute__((always_inline)) void copy_scales(const float *ks, const float *vs, int kn, int KVH,
                                                              float *kscs, float *vscs) {
    for (int h = 0; h < KVH; h++)
        for (int j = 0; j < kn; j++) {
            kscs[h * BK + j] = ks[(int64_t)j * KVH + h];
            vscs[h * BK + j] = vs[(int64_t)j * KVH + h];
        }
}

/* copy_scales, with the block's size and KVH constants where a full block has 1-4 KV heads: GCC then moves them by
 * vectors (permutes), where one by one this was a third of a decode step's bookkeeping a block (segment's samples,
 * hot caches). For 8 KV heads the AVX2 build's permutes were slower than the copy, which they keep
 * (benchmarks/README.md, "Run (2026-12-07, thirteenth)"). */
static void split_scales(const float *ks, const float *vs, int kn, int KVH, float *kscs, float *vscs) {
    if (kn == BK)
        switch (KVH) {
        case 1: copy_scales(ks, vs, BK, 1, kscs, vscs); return;
        case 2: copy_scales(ks, vs, BK, 2, kscs, vscs); return;
        case 3: copy_scales(ks, vs, BK, 3, kscs, vscs); return;
        case 4: copy_scales(ks, vs, BK, 4, kscs, vscs); return;
        default: break;
        }
    copy_scales(ks, vs, kn, KVH, kscs, vscs);
}

/* whether the n keys at `slots` sit in consecutive slots (a pool allocated in order: the common case) */
static inline int slot_run(const int64_t *slots, int n) {
    int64_t off = 0;
    for (int j = 0; j < n; j++) off |= slots[j] - slots[0] - j;   /* no branch a key: GCC vectorises it */
    return off == 0;
}

/* Few rows (a decode step's G query heads, a short chunk's tokens x G): one block's keys for KV heads g0 .. g1 - 1 at
 * once, before their head_block calls. A slot's rows of every head are adjacent, so one pass reads each key's slot
 * once for all heads: its rows' address (head g0's; head g's are (g - g0) D bytes on) and every head's scales. Per
 * head, as many rows still do (the block headers' unpack_block), the slot was read, the addresses computed and the
 * scales' lines asked for again for each head: a decode step's attention at 4,096 tokens (30 layers from DRAM, 2
 * threads) 4-6 % slower (AMD Zen 3).
 * The block's K and V rows are asked into L1 here, line by line in address order, before the first head's scores
 * read them: a decode step at 4,096 tokens 4-6 % faster on an Intel Xeon (Emerald Rapids) than with V alone asked for
 * (K then came from memory as the scores read it, and stalled them), and 2-3 % faster with both asked for in one pass
 * over the block's lines than K's lines and then V's. Only where the block was not asked for ahead (below: a
 * segment's first block, or a run that starts in it): once it was, the pass was a sixth of the bookkeeping with K/V
 * in L2 or L3 and bought nothing from memory.
 * The block ahead: where it is one run of slots of every head, its lines are asked for into L2 a few at a time while
 * this block's arithmetic runs (ahead8): a decode step at 4,096 tokens 4-6 % faster on that Xeon, where all of them
 * asked for at once (here, or a head's share after each head) made it no faster or slower. Elsewhere only where a
 * run of slots starts: asking for every key's lines (and GCC spilling the loop's state around them) was ~100
 * instructions a key (decode attention at 4,096 tokens 8-9 % faster without, AMD Zen 3; on shuffled slots 3 %). */
static void unpack_keys(const keys8 *kv, int g0, int g1, int kb, int few, block8 *b) {
    if (!few) return;
    const int D = kv->D, KVH = kv->KVH, heads = g1 - g0, span = heads * D, j0 = kb * BK;
    const int kn = kv->m - j0 < BK ? kv->m - j0 : BK;
    const int8_t *k = kv->k, *v = kv->v;
    const float *ks = kv->ks, *vs = kv->vs;
    const int64_t *slots = kv->slots + j0;
    b->g0 = g0;
    if (heads == KVH && slot_run(slots, kn)) {   /* the block's rows of every head: one span of memory */
        const int64_t row0 = slots[0] * KVH;
        if (b->ahead->block != k + row0 * D)   /* not asked for ahead (a segment's first block) */
            for (int64_t d = 0; d < (int64_t)kn * span; d += 64) {
                __builtin_prefetch(k + row0 * D + d, 0, 3);
                __builtin_prefetch(v + row0 * D + d, 0, 3);
            }
        for (int j = 0; j < kn; j++) {   /* no load a key: GCC vectorises these */
            b->kslot[j] = k + (row0 + (int64_t)j * KVH) * D;
            b->vslot[j] = v + (row0 + (int64_t)j * KVH) * D;
        }
        split_scales(ks + row0, vs + row0, kn, KVH, b->kscs, b->vscs);
    }
    else
        for (int j = 0; j < kn; j++) {
            const int64_t row = slots[j] * KVH + g0;   /* key j's row of head g0 */
            b->kslot[j] = k + row * D;
            b->vslot[j] = v + row * D;
            for (int d = 0; d < span; d += 64) {
                __builtin_prefetch(b->kslot[j] + d, 0, 3);
                __builtin_prefetch(b->vslot[j] + d, 0, 3);
            }
            for (int h = 0; h < heads; h++) {
                b->kscs[h * BK + j] = ks[row + h];
                b->vscs[h * BK + j] = vs[row + h];
            }
        }
    for (int j = kn; j < BK; j++) b->kslot[j] = b->vslot[j] = b->zrow;
    for (int h = 0; h < heads; h++)
        for (int j = kn; j < BK; j++) b->kscs[h * BK + j] = b->vscs[h * BK + j] = 0.f;
    /* the block ahead: one run of slots of every head, its lines a few at a time as this block runs (ahead8); else
     * the rows of a key that does not follow the slot before it (where a run of slots starts) */
    const int64_t jn = j0 + PREFETCH_BLOCKS * BK, kn_next = kv->m - jn < BK ? kv->m - jn : BK;
    b->ahead->lines = 0;
    b->ahead->block = NULL;
    if (kn_next > 0 && slot_run(kv->slots + jn, (int)kn_next)) {
        if (heads == KVH) {
            b->ahead->k = b->ahead->block = k + kv->slots[jn] * KVH * D;
            b->ahead->v = v + kv->slots[jn] * KVH * D;
            b->ahead->lines = (int)(kn_next * span / 64);
        }
        else prefetch_key(kv, g0, heads, jn, 1);   /* its first key alone */
        return;
    }
    int64_t after = -1;
    for (int j = 0; j < kn_next; j++) {
        const int64_t s = kv->slots[jn + j];
        if (s != after) prefetch_key(kv, g0, heads, jn + j, 1);
        after = s + 1;
    }
}

/* Many rows (`transposed`): one block's keys for head g alone, as a block of one head (g0 = g), before its
 * unpack_block unpacks them: each key's K and V rows (zrow past the last key) and scales, the rows of the block ahead
 * asked for a key at a time (prefetch_key), and with `v_to_l1` each key's V row into L1. */
static void head_keys(const keys8 *kv, int g, int kb, int v_to_l1, block8 *b) {
    const int D = kv->D, j0 = kb * BK, kn = kv->m - j0 < BK ? kv->m - j0 : BK;
    const int jn = j0 + PREFETCH_BLOCKS * BK, kn_next = kv->m - jn < BK ? kv->m - jn : BK;
    b->g0 = g;
    b->head = 0;
    for (int j = 0; j < BK; j++) {
        if (j < kn_next) prefetch_key(kv, g, 1, jn + j, (j & 3) == 0);
        if (j < kn) {
            const int64_t row = kv->slots[j0 + j] * kv->KVH + g;
            b->kslot[j] = kv->k + row * D;
            b->vslot[j] = kv->v + row * D;
            b->kscs[j] = kv->ks[row];
            b->vscs[j] = kv->vs[row];
            if (v_to_l1)
                for (int d = 0; d < D; d += 64) __builtin_prefetch(b->vslot[j] + d, 0, 3);
        } else {
            b->kslot[j] = b->vslot[j] = b->zrow;   /* k = 0, v = 0 */
            b->kscs[j] = b->vscs[j] = 0.f;
        }
    }
}

#if KV8_AVX512
#include "kv8_avx512_block.h"
#else
#include "kv8_avx2_block.h"
#endif
#if KV8_AMX
#include "kv8_amx_block.h"
#endif

/* the weighted V sums of a block for R (<= RB) rows: the build's values_rows on the int8 V rows in place (few rows),
 * or values_d on the block unpacked as key pairs (`transposed`: many rows), specialised for the common shapes */
static void block_values(const int16_t *wq, int R, const block8 *b, int transposed, int pairs, int D, int32_t *acc) {
    if (!transposed) {
        if (R == 3) values_rows(wq, 3, b, pairs, D, acc);
        else if (R == 4) values_rows(wq, 4, b, pairs, D, acc);
        else if (R == 2) values_rows(wq, 2, b, pairs, D, acc);
        else values_rows(wq, 1, b, pairs, D, acc);
    }
    else if (D == 64) values_d(wq, R, b, pairs, 64, acc);
    else if (D == 128) values_d(wq, R, b, pairs, 128, acc);
    else values_d(wq, R, b, pairs, D, acc);
}

/* One block for the rows of KV head g (its G query heads at positions pos0 .. pos0 + qn - 1, queries i0 ..: row
 * rr is head g * G + rr / qn at query i0 + rr % qn): their running max, sum and output (st: [rows][D] outputs, then
 * rows maxes, rows sums) updated. */
static void head_block(const keys8 *kv, int g, int kb, const queries8 *Q, int64_t pos0, int i0, int qn, block8 *b,
                       float *st) {
    const int D = kv->D, G = kv->G, rows = G * qn;
    float *o = st, *mx = st + (size_t)rows * D, *sum = mx + rows;
    const int64_t j0 = (int64_t)kb * BK;
    const int transposed = rows > FEW_MAX;   /* many rows: the unpacked copy pays (the block header's FEW_MAX) */
#if KV8_AMX
    if (transposed && b->amx) {
        head_block_amx(kv, g, kb, Q, pos0, i0, qn, b, b->amx, st);
        return;
    }
#endif
    unpack_block(kv, g, kb, transposed, b);
    for (int r0 = 0; r0 < rows; r0 += RB) {
        const int8_t *q[RB];
        int32_t qsum[RB];
        int seen[RB], keys = 0;
        for (int r = 0; r < RB; r++) {
            const int rr = r0 + r < rows ? r0 + r : r0;   /* past the last row: the first again, unused */
            seen[r] = r0 + r < rows ? row_seen(pos0, qn, rr, j0) : 0;
            keys = seen[r] > keys ? seen[r] : keys;
            const int64_t at = row_at(kv, g, i0, qn, rr);
            q[r] = Q->qi + at * D;
            qsum[r] = Q->qsum[at];
        }
        if (!keys) continue;
        const int n = rows - r0 < RB ? rows - r0 : RB;
        block_dots(q, qsum, n, b, transposed, (keys + 15) / 16 * 16, D, b->dots);
        int need[RB], pairs = 0;
        float ws[RB], corr[RB], qc[RB];
        for (int r = 0; r < n; r++) qc[r] = Q->qc[row_at(kv, g, i0, qn, r0 + r)];
        /* the rows' softmax steps; a row without weights gets zeros in wq (adds nothing below) */
        block_weights(b->dots, qc, b, seen, n, D, mx + r0, sum + r0, o + (int64_t)r0 * D, b->wq, ws, corr, need);
        for (int r = 0; r < n; r++)
            if (need[r] && (seen[r] + 1) / 2 > pairs) pairs = (seen[r] + 1) / 2;
        if (!pairs) continue;
        block_values(b->wq, n, b, transposed, pairs, D, b->acc);
        for (int r = 0; r < n; r++)
            if (need[r]) row_output(b->acc + (int64_t)r * D, ws[r], corr[r], D, o + (int64_t)(r0 + r) * D);
    }
}

/* The rows of KV heads g0 .. g1 - 1 (head_block's rows, each head's) over key blocks kb0 .. kb1 - 1 (one segment),
 * block by block, each block's heads in turn (a slot's rows of every head are adjacent: the block is read from
 * memory once, while all of its work runs): fresh state per head at st + (g - g0) * hstride (head_block's layout);
 * a row the segment shows nothing keeps max -inf. */
__attribute__((noinline, noclone))
static void segment(const keys8 *kv, int g0, int g1, const queries8 *Q, int64_t pos0, int i0, int qn, int kb0,
                    int kb1, block8 *b, float *st, size_t hstride) {
    const int rows = kv->G * qn, D = kv->D;
    for (int g = g0; g < g1; g++) {
        float *o = st + (g - g0) * hstride, *mx = o + (size_t)rows * D, *sum = mx + rows;
        for (int r = 0; r < rows; r++) { mx[r] = -INFINITY; sum[r] = 0.f; }
        memset(o, 0, sizeof(float) * (size_t)rows * D);
    }
    for (int kb = kb0; kb < kb1; kb++) {
        if ((int64_t)kb * BK > pos0 + qn - 1) break;   /* no row sees this block or any later */
        unpack_keys(kv, g0, g1, kb, rows <= FEW_MAX, b);   /* few rows: the block's keys for every head at once */
        for (int g = g0; g < g1; g++) head_block(kv, g, kb, Q, pos0, i0, qn, b, st + (g - g0) * hstride);
    }
}

static int shape_ok(int H, int KVH, int D) { return D % 64 == 0 && D > 0 && D <= MAX_D && KVH > 0 && H % KVH == 0; }

/* whether a call whose items hold up to `rows` rows runs its many rows on AMX tiles (before its parallel region:
 * amx_ready asks Linux for the tiles once) */
static int amx_rows(int rows) {
    return rows > FEW_MAX && kv8_tiles();
}

/* a thread's block buffers (NULL when out of memory); with `amx` rows (amx_rows said yes) also the tiles' buffers,
 * and this thread's tiles configured (block_free releases them) */
static void *block_buffers(block8 *b, int D, int KVH, int amx) {
    const size_t kd = (size_t)BK * D;   /* ku, then vp (2 kd), kt (kd), acc (4 RB D) bytes; AVX2: 2 KVH BK scales */
    const size_t scales = 2 * sizeof(float) * (size_t)KVH * BK + (size_t)KVH * D;   /* kscs, vscs, zrow */
    const size_t base = (4 * kd + 4 * (size_t)RB * D + scales + 63) / 64 * 64 + 64;   /* + ahead8, 64 bytes */
    b->amx = NULL;
#if KV8_AMX
    amx8 count;
    const size_t tiles = amx ? amx8_carve(&count, NULL, amx, D) : 0;
    uint8_t *buf = (uint8_t *)aligned_alloc(64, base + (amx ? tiles + sizeof(amx8) : 0));
    if (buf && amx) {
        b->amx = (amx8 *)(buf + base + tiles);
        amx8_carve(b->amx, buf + base, amx, D);
        load_full_tiles();
    }
#else
    (void)amx;
    uint8_t *buf = (uint8_t *)aligned_alloc(64, base);
#endif
    b->ku = KV8_AVX2 ? buf : NULL;   /* AVX2: K widened to int16 d pairs [D/2][BK] (2 kd bytes), then vp; no kt */
    b->vp = buf ? (int16_t *)(buf + (KV8_AVX2 ? 2 : 1) * kd) : NULL;
    b->kt = buf && !KV8_AVX2 ? (int32_t *)(buf + 3 * kd) : NULL;
    b->acc = buf ? (int32_t *)(buf + 4 * kd) : NULL;
    b->kscs = buf ? (float *)(buf + 4 * kd + 4 * (size_t)RB * D) : NULL;
    b->vscs = buf ? b->kscs + (size_t)KVH * BK : NULL;
    b->zrow = buf ? memset(b->vscs + (size_t)KVH * BK, 0, (size_t)KVH * D) : NULL;
    b->ahead = buf ? (ahead8 *)(buf + base - 64) : NULL;
    if (buf) {
        b->ahead->lines = 0;
        b->ahead->block = NULL;
    }
    return buf;
}

/* block_buffers' memory freed, and the tiles released where it configured them */
static void block_free(block8 *b, void *buf) {
#if KV8_AMX
    if (b->amx) _tile_release();
#endif
    (void)b;
    free(buf);
}

/* Segmented items (decode rows, a short chunk): item it is row r's segment sg (first[r] <= it < first[r + 1]), its
 * KV heads in turn (a slot's rows of every head are adjacent: one stream from memory), or one head of it where
 * segments are too few to keep every thread busy (the same segment() calls either way); parts [item][KVH][G * qn]
 * x (D outputs, max, sum), then merged per row in segment order. A decode row is a chunk of one (qn = 1). */
static int segmented(const keys8 *base, const int64_t *slots, int64_t Lmax, const int64_t *lens, const queries8 *Q,
                     int R, int qn, float *out, int64_t os) {
    const int D = base->D, G = base->G, H = base->H, KVH = base->KVH, rows = G * qn;
    const size_t pstride = (size_t)rows * (D + 2);
    int64_t *first = (int64_t *)malloc(sizeof(int64_t) * ((size_t)R + 1));
    if (!first) return -1;
    first[0] = 0;
    for (int r = 0; r < R; r++) first[r + 1] = first[r] + (lens[r] + SEG - 1) / SEG;
    const int64_t items = first[R];
    float *parts = (float *)malloc(sizeof(float) * (size_t)items * KVH * pstride);
    if (!parts) { free(first); return -1; }
    int failed = 0;
    const int tile_rows = amx_rows(rows) ? rows : 0;
    #pragma omp parallel
    {
        block8 b;
        void *buf = block_buffers(&b, D, KVH, tile_rows);
        float *ao = (float *)malloc(sizeof(float) * (size_t)D);
        if (!buf || !ao) {
            #pragma omp atomic write
            failed = 1;
        }
        int r = 0;
        /* with fewer segments than twice the threads (short contexts), an item is one head of a segment */
        const int per_head = items < 2 * omp_get_num_threads() && KVH > 1, heads = per_head ? KVH : 1;
        /* guided: each thread takes runs of adjacent items first (its keys one stream from memory, the CPU's prefetcher
         * carried across segments: decode attention at 4,096 tokens 2-4 % faster than items one at a time), then
         * smaller ones, so the threads still end together */
        #pragma omp for schedule(guided)
        for (int64_t ih = 0; ih < items * heads; ih++) {
            if (!buf || !ao) continue;
            const int64_t it = ih / heads;
            while (first[r + 1] <= it) r++;
            while (first[r] > it) r--;
            keys8 kv = *base;
            kv.slots = slots + (int64_t)r * Lmax;
            kv.m = (int)lens[r];
            const int sg = (int)(it - first[r]);
            const int g0 = per_head ? (int)(ih % heads) : 0, g1 = per_head ? g0 + 1 : KVH;
            const int64_t at = (int64_t)r * qn * H;   /* row r's queries */
            const queries8 Qr = {Q->qi + at * D, Q->qc + at, Q->qsum + at};
            segment(&kv, g0, g1, &Qr, kv.m - qn, 0, qn, sg * SEG_BLOCKS, (sg + 1) * SEG_BLOCKS, &b,
                    parts + ((size_t)it * KVH + g0) * pstride, pstride);
        }
        #pragma omp for schedule(static)
        for (int64_t it = 0; it < (int64_t)R * KVH * rows; it++) {
            if (!buf || !ao) continue;
            const int rq = (int)(it / ((int64_t)KVH * rows)), g = (int)(it / rows % KVH), rr = (int)(it % rows);
            float top = -INFINITY, total = 0.f;
            memset(ao, 0, sizeof(float) * (size_t)D);
            for (int64_t item = first[rq]; item < first[rq + 1]; item++) {
                const float *part = parts + ((size_t)item * KVH + g) * pstride;
                merge(&top, &total, ao, part[(size_t)rows * D + rr], part[(size_t)rows * D + rows + rr],
                      part + (size_t)rr * D, D);
            }
            finish(ao, total, out + rq * os + row_at(base, g, 0, qn, rr) * D, D);
        }
        block_free(&b, buf);
        free(ao);
    }
    free(parts);
    free(first);
    return failed ? -1 : 0;
}

/* A long chunk: items (KV head, FQ query positions), the last positions (the most keys) first, each merging its
 * segments as they end (the same segment() and merge() calls a short chunk makes, in the same order). */
static int blocked(const keys8 *kv, const queries8 *Q, int n, float *out) {
    const int D = kv->D, G = kv->G, KVH = kv->KVH, nqb = (n + FQ - 1) / FQ, rows_max = G * FQ;
    const int64_t pos0 = (int64_t)kv->m - n;
    int failed = 0;
    const int tile_rows = amx_rows(rows_max) ? rows_max : 0;
    #pragma omp parallel
    {
        block8 b;
        void *buf = block_buffers(&b, D, KVH, tile_rows);
        float *f = (float *)malloc(sizeof(float) * (size_t)rows_max * (2 * D + 4));
        if (!buf || !f) {
            #pragma omp atomic write
            failed = 1;
        }
        float *st = f, *ao = st + (size_t)rows_max * (D + 2), *amx = ao + (size_t)rows_max * D, *asum = amx + rows_max;
        #pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < nqb * KVH; it++) {
            if (!buf || !f) continue;
            const int g = it / nqb, qb = nqb - 1 - it % nqb, i0 = qb * FQ;
            const int qn = n - i0 < FQ ? n - i0 : FQ, rows = G * qn;
            const int64_t p0 = pos0 + i0;
            for (int r = 0; r < rows; r++) { amx[r] = -INFINITY; asum[r] = 0.f; }
            memset(ao, 0, sizeof(float) * (size_t)rows * D);
            const int segs = (int)((p0 + qn - 1) / SEG) + 1;
            const float *o = st, *mx = st + (size_t)rows * D, *sum = mx + rows;   /* segment()'s layout */
            for (int sg = 0; sg < segs; sg++) {
                segment(kv, g, g + 1, Q, p0, i0, qn, sg * SEG_BLOCKS, (sg + 1) * SEG_BLOCKS, &b, st, 0);
                for (int rr = 0; rr < rows; rr++)
                    merge(&amx[rr], &asum[rr], ao + (size_t)rr * D, mx[rr], sum[rr], o + (size_t)rr * D, D);
            }
            for (int rr = 0; rr < rows; rr++)
                finish(ao + (size_t)rr * D, asum[rr], out + row_at(kv, g, i0, qn, rr) * D, D);
        }
        block_free(&b, buf);
        free(f);
    }
    return failed ? -1 : 0;
}

/* the queries as int8 with their factors and sums (one allocation), or NULL when out of memory */
static void *queries(const float *q, int64_t qs, int n, int H, int D, float scale, queries8 *Q) {
    const size_t rows = (size_t)n * H;
    void *mem = malloc((sizeof(float) + sizeof(int32_t) + (size_t)D) * rows + 64);
    if (!mem) return NULL;
    float *qc = (float *)mem;
    int32_t *qsum = (int32_t *)(qc + rows);
    int8_t *qi = (int8_t *)(qsum + rows);
    quantize_queries(q, qs, n, H, D, scale, qi, qc, qsum);
    Q->qi = qi;
    Q->qc = qc;
    Q->qsum = qsum;
    return mem;
}

int kv8_attention(const float *q, int64_t qs, const int8_t *k, const int8_t *v, const float *ks, const float *vs,
                  const int64_t *slots, float *out, int n, int m, int H, int KVH, int D, float scale) {
    if (!shape_ok(H, KVH, D) || m < n) return -3;
    if (n <= 0) return 0;
    queries8 Q;
    void *mem = queries(q, qs, n, H, D, scale, &Q);
    if (!mem) return -1;
    const keys8 kv = {k, v, ks, vs, slots, m, KVH, D, H / KVH, H};
    int rc;
    if (n <= FQ) {
        const int64_t lens = m;
        rc = segmented(&kv, slots, m, &lens, &Q, 1, n, out, 0);
    } else {
        rc = blocked(&kv, &Q, n, out);
    }
    free(mem);
    return rc;
}

int kv8_decode(const float *q, int64_t qs, const int8_t *k, const int8_t *v, const float *ks, const float *vs,
               const int64_t *slots, int64_t Lmax, const int64_t *lens, float *out, int64_t os, int R, int H, int KVH,
               int D, float scale) {
    if (!shape_ok(H, KVH, D)) return -3;
    for (int r = 0; r < R; r++)
        if (lens[r] < 1 || lens[r] > Lmax) return -3;
    if (R <= 0) return 0;
    queries8 Q;
    void *mem = queries(q, qs, R, H, D, scale, &Q);
    if (!mem) return -1;
    const keys8 kv = {k, v, ks, vs, slots, 0, KVH, D, H / KVH, H};
    const int rc = segmented(&kv, slots, Lmax, lens, &Q, R, 1, out, os);
    free(mem);
    return rc;
}
#else
int kv8_ready(void) { return 0; }

int kv8_store(const float *src, int64_t ss, int8_t *buf, float *scales, const int64_t *slots, int R, int KVH, int D) {
    (void)src; (void)ss; (void)buf; (void)scales; (void)slots; (void)R; (void)KVH; (void)D;
    return -2;
}

int kv8_attention(const float *q, int64_t qs, const int8_t *k, const int8_t *v, const float *ks, const float *vs,
                  const int64_t *slots, float *out, int n, int m, int H, int KVH, int D, float scale) {
    (void)q; (void)qs; (void)k; (void)v; (void)ks; (void)vs; (void)slots; (void)out; (void)n; (void)m; (void)H;
    (void)KVH; (void)D; (void)scale;
    return -2;
}

int kv8_decode(const float *q, int64_t qs, const int8_t *k, const int8_t *v, const float *ks, const float *vs,
               const int64_t *slots, int64_t Lmax, const int64_t *lens, float *out, int64_t os, int R, int H, int KVH,
               int D, float scale) {
    (void)q; (void)qs; (void)k; (void)v; (void)ks; (void)vs; (void)slots; (void)Lmax; (void)lens; (void)out; (void)os;
    (void)R; (void)H; (void)KVH; (void)D; (void)scale;
    return -2;
}
#endif
