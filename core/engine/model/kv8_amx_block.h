/* kv8_attention.c's many-rows block on AMX-INT8 tiles (a prompt chunk's rows, more than FEW_MAX of them), for CPUs
 * with AMX: the same exact integer sums the AVX-512 kernels add, so the same bits (tests/engine/model/test_kv8.py
 * compares both paths), at tile speed.
 *   scores  [rows][BK] = q (int8) . K (int8): TDPBSSD on the rows' int8 queries against the block's K transposed
 *           to d quads (kt), exact in int32: the value (K + 128) . q - 128 sum q that VPDPBUSD gives;
 *   values  [rows][D]  = wq (int16) . V (int8): each weight as 256 wh + wl (wh = wq >> 8 signed, wl = wq & 255
 *           unsigned), TDPBSSD and TDPBUSD against V in key quads (vq), combined exactly in int32 (|sum| < 64 x
 *           32,767 x 127): VPDPWSSD's sum over key pairs;
 *   between them the rows' softmax steps run as before (block_weights, RB rows a call), and each row's output is
 *   scaled by the same row_output.
 * Why: in a 4,096-token prefill on AMX the int8 pool's block_dots and block_values were 21 % of the time, the
 * projections (already on AMX) 20 %. Included by kv8_attention.c after kv8_avx512_block.h. */

/* the AMX buffers of a thread's block8 (block_buffers): the call's rows at most, padded to whole tiles of 16 */
typedef struct amx8 {
    int8_t *qa;          /* the rows' int8 queries [rows][D], head_block's row order */
    int32_t *dots;       /* their scores [rows][BK] */
    int16_t *wq;         /* their int16 weights [rows][BK] */
    int8_t *wh;          /* wq >> 8 [rows][BK] */
    uint8_t *wl;         /* wq & 255 [rows][BK] */
    int8_t *vq;          /* V in key quads: [D/16 tiles][BK/4 quads][16 d][4 keys] */
    int32_t *acc;        /* the exact weighted sums of V [rows][D] */
    int32_t (*c)[256];   /* 4 tiles' results [4][16 x 16] */
    float *ws, *corr;    /* per row: its weights' scale, its output's factor (block_weights) */
    int *need;
    const int8_t *qsrc;  /* whose rows qa holds: the queries (a request's, in a batch of decodes), their KV head, */
    int qg, qi0, qn;     /* first query and count (qn 0: none yet) */
} amx8;

/* `bytes` of `mem` from offset *at on (NULL while only counting: mem NULL) */
static void *amx8_take(uint8_t *mem, size_t *at, size_t bytes) {
    void *p = mem ? mem + *at : NULL;
    *at += bytes;
    return p;
}

/* amx8's buffers for `rows` rows carved out of `mem` (64-byte aligned; every size a multiple of 64), or with mem
 * NULL only counted: returns the bytes they take, one layout for both */
static size_t amx8_carve(amx8 *a, uint8_t *mem, int rows, int D) {
    const size_t r = (size_t)(rows + 15) / 16 * 16;
    size_t at = 0;
    a->c = (int32_t (*)[256])amx8_take(mem, &at, 4 * 1024);
    a->dots = (int32_t *)amx8_take(mem, &at, r * BK * 4);
    a->acc = (int32_t *)amx8_take(mem, &at, r * D * 4);
    a->wq = (int16_t *)amx8_take(mem, &at, r * BK * 2);
    a->qa = (int8_t *)amx8_take(mem, &at, r * D);
    a->wh = (int8_t *)amx8_take(mem, &at, r * BK);
    a->wl = (uint8_t *)amx8_take(mem, &at, r * BK);
    a->vq = (int8_t *)amx8_take(mem, &at, (size_t)BK * D);
    a->ws = (float *)amx8_take(mem, &at, r * 4);
    a->corr = (float *)amx8_take(mem, &at, r * 4);
    a->need = (int *)amx8_take(mem, &at, r * 4);
    a->qn = 0;
    return at;
}

/* the block's keys for head g (head_keys), then K transposed to d quads as int8 (kt [D/4][BK], no + 128: TDPBSSD
 * multiplies two signed sides) and V in key quads (vq: for 4 keys and 16 d, the 4 keys' bytes of each d) */
static void amx8_unpack(const keys8 *kv, int g, int kb, block8 *b, amx8 *a) {
    const int D = kv->D;
    head_keys(kv, g, kb, 0, b);
    transpose_keys(b, D, 0);
    for (int p = 0; p < BK / 4; p++)   /* keys 4p .. 4p + 3 */
        for (int d = 0; d < D; d += 64) {
            const __m512i k0 = _mm512_loadu_si512(b->vslot[4 * p] + d), k1 = _mm512_loadu_si512(b->vslot[4 * p + 1] + d);
            const __m512i k2 = _mm512_loadu_si512(b->vslot[4 * p + 2] + d), k3 = _mm512_loadu_si512(b->vslot[4 * p + 3] + d);
            const __m512i lo01 = _mm512_unpacklo_epi8(k0, k1), hi01 = _mm512_unpackhi_epi8(k0, k1);
            const __m512i lo23 = _mm512_unpacklo_epi8(k2, k3), hi23 = _mm512_unpackhi_epi8(k2, k3);
            /* x[i], 128-bit lane L: d + 16 L + 4 i .. + 3, each d's 4 keys */
            const __m512i x0 = _mm512_unpacklo_epi16(lo01, lo23), x1 = _mm512_unpackhi_epi16(lo01, lo23);
            const __m512i x2 = _mm512_unpacklo_epi16(hi01, hi23), x3 = _mm512_unpackhi_epi16(hi01, hi23);
            const __m512i t0 = _mm512_shuffle_i64x2(x0, x1, 0x44), t1 = _mm512_shuffle_i64x2(x0, x1, 0xEE);
            const __m512i t2 = _mm512_shuffle_i64x2(x2, x3, 0x44), t3 = _mm512_shuffle_i64x2(x2, x3, 0xEE);
            const __m512i y[4] = {_mm512_shuffle_i64x2(t0, t2, 0x88), _mm512_shuffle_i64x2(t0, t2, 0xDD),
                                  _mm512_shuffle_i64x2(t1, t3, 0x88), _mm512_shuffle_i64x2(t1, t3, 0xDD)};
            for (int L = 0; L < 4; L++)   /* d tile d / 16 + L, its row p */
                _mm512_storeu_si512(a->vq + ((int64_t)(d / 16 + L) * (BK / 4) + p) * 64, y[L]);
        }
}

/* scores of `tiles` x 16 rows (qa) against the block's 64 keys (kt), two 16-key tiles at a time: dots [rows][BK]
 * (with D = 64 the two key tiles load once for every row tile) */
static void amx8_dots(const block8 *b, amx8 *a, int tiles, int D) {
    for (int h = 0; h < NG; h += 2) {
        if (D == 64) {
            _tile_loadd(4, b->kt + 16 * h, BK * 4);
            _tile_loadd(5, b->kt + 16 * (h + 1), BK * 4);
        }
        for (int mt = 0; mt < tiles; mt++) {
            _tile_zero(2);
            _tile_zero(3);
            for (int d = 0; d < D; d += 64) {
                _tile_loadd(0, a->qa + (int64_t)mt * 16 * D + d, D);
                if (D != 64) {
                    _tile_loadd(4, b->kt + (int64_t)(d / 4) * BK + 16 * h, BK * 4);
                    _tile_loadd(5, b->kt + (int64_t)(d / 4) * BK + 16 * (h + 1), BK * 4);
                }
                _tile_dpbssd(2, 0, 4);
                _tile_dpbssd(3, 0, 5);
            }
            _tile_stored(2, a->dots + (int64_t)mt * 16 * BK + 16 * h, BK * 4);
            _tile_stored(3, a->dots + (int64_t)mt * 16 * BK + 16 * (h + 1), BK * 4);
        }
    }
}

/* the exact weighted sums of V for `rows` rows (wq split into wh, wl first): acc [rows][D] */
static void amx8_values(amx8 *a, int rows, int D) {
    const int tiles = (rows + 15) / 16;
    for (int64_t j = 0; j < (int64_t)rows * BK; j += 32) split_int16(a->wq + j, a->wh + j, a->wl + j);
    for (int mt = 0; mt < tiles; mt++) {
        _tile_loadd(0, a->wh + (int64_t)mt * 16 * BK, BK);
        _tile_loadd(1, a->wl + (int64_t)mt * 16 * BK, BK);
        for (int t = 0; t < D / 16; t += 2) {
            _tile_loadd(2, a->vq + (int64_t)t * (BK / 4) * 64, 64);
            _tile_loadd(3, a->vq + (int64_t)(t + 1) * (BK / 4) * 64, 64);
            _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
            _tile_dpbssd(4, 0, 2); _tile_dpbssd(5, 0, 3);   /* wh x V */
            _tile_dpbusd(6, 1, 2); _tile_dpbusd(7, 1, 3);   /* wl x V */
            _tile_stored(4, a->c[0], 64); _tile_stored(5, a->c[1], 64);
            _tile_stored(6, a->c[2], 64); _tile_stored(7, a->c[3], 64);
            const int r_end = rows - mt * 16 < 16 ? rows - mt * 16 : 16;
            for (int r = 0; r < r_end; r++)
                for (int u = 0; u < 2; u++) {
                    const __m512i hi = _mm512_load_si512(a->c[u] + r * 16), lo = _mm512_load_si512(a->c[2 + u] + r * 16);
                    _mm512_storeu_si512(a->acc + (int64_t)(mt * 16 + r) * D + 16 * (t + u),
                                        _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo));
                }
        }
    }
}

/* head_block's many rows on tiles: the block's scores for all rows at once, their softmax steps RB rows a call
 * (block_weights), the weighted V sums for all rows, each row's output (row_output). */
static void head_block_amx(const keys8 *kv, int g, int kb, const queries8 *Q, int64_t pos0, int i0, int qn,
                           block8 *b, amx8 *a, float *st) {
    const int D = kv->D, rows = kv->G * qn;
    float *o = st, *mx = st + (size_t)rows * D, *sum = mx + rows;
    const int64_t j0 = (int64_t)kb * BK;
    amx8_unpack(kv, g, kb, b, a);
    if (a->qsrc != Q->qi || a->qg != g || a->qi0 != i0 || a->qn != qn) {   /* they change with the item, not the block */
        for (int rr = 0; rr < rows; rr++)
            memcpy(a->qa + (int64_t)rr * D, Q->qi + row_at(kv, g, i0, qn, rr) * D, (size_t)D);
        a->qsrc = Q->qi;
        a->qg = g;
        a->qi0 = i0;
        a->qn = qn;
    }
    amx8_dots(b, a, (rows + 15) / 16, D);
    for (int r0 = 0; r0 < rows; r0 += RB) {
        const int n = rows - r0 < RB ? rows - r0 : RB;
        int seen[RB];
        float qc[RB];
        for (int r = 0; r < n; r++) {
            seen[r] = row_seen(pos0, qn, r0 + r, j0);
            qc[r] = Q->qc[row_at(kv, g, i0, qn, r0 + r)];
        }
        block_weights(a->dots + (int64_t)r0 * BK, qc, b, seen, n, D, mx + r0, sum + r0, o + (int64_t)r0 * D,
                      a->wq + (int64_t)r0 * BK, a->ws + r0, a->corr + r0, a->need + r0);
    }
    amx8_values(a, rows, D);
    for (int r = 0; r < rows; r++)
        if (a->need[r]) row_output(a->acc + (int64_t)r * D, a->ws[r], a->corr[r], D, o + (int64_t)r * D);
}
