/* One decode step's decoder layers in one C call, or a mixed step's (its decodes and one prompt chunk attending on
 * AMX tiles): int8 projections, fp32 activations, the KV pool written and read by slot.
 *
 * Why: a decode step of the default model (30 layers) made ~12 kernel calls a layer from Python, each behind a
 * wrapper that checks its tensors and allocates its output: ~2 ms of a ~9 ms step went to the interpreter, and
 * the GIL was held in between, so the server's event loop competed with the step. Here the same kernels run in
 * the same order on the same inputs (w8_gemv, rope, decode_attention, add_rms_norm, silu_mul), so the result is
 * the same bits as NativeLlama's Python loop (tested); the caller checks every tensor once per step. A mixed step
 * (chunk_n > 0: a long prompt's small chunk beside decoding streams, ~40 ms deep into the prompt) gathers its
 * decode rows' queries as the loop's index_select does and attends its chunk with amx_attention, as the loop's
 * attention_pool call does: the loop's ~3 ms of Python a step, and the GIL held through it, go. Over an int8 pool
 * the K/V are stored by kv8_store and attended by kv8_decode / kv8_attention, as the loop does.
 *
 * Layout of `layer_ptrs`: DL_PTRS pointers per layer (see the enum below); `ws` a workspace of
 * decode_layers_workspace(R, ...) floats. x [R, hidden] (the residual stream, updated in place) and y [R, hidden]
 * (the normed input of layer 0 on entry, written as each layer's input). Returns 0, -1 when out of memory, -2 when
 * row_chunk is refused (decode_attention), -3 when amx_attention refuses the chunk, -4 when a16 (the projections on
 * w8a16_gemm) or an int8 pool (kv_kind KV_INT8: kv8_attention.c's kernels) is asked of a build without
 * AVX512-VNNI or AVX2. */
#include <stdint.h>
#include <string.h>
#include "native_simd.h"
#include "native_kernels.h"

enum { DL_WQKV, DL_SQKV, DL_BQKV, DL_WO, DL_SO, DL_BO, DL_WGU, DL_SGU, DL_BGU, DL_WD, DL_SD, DL_BD,
       DL_POST_NORM, DL_NEXT_NORM, DL_K, DL_V, DL_KS, DL_VS, DL_PTRS };   /* KS, VS: an int8 pool's scales */

enum { KV_FP32, KV_BF16, KV_INT8 };   /* kv_kind: what the pool holds */

/* rows of KVH heads x D floats (src, row stride ss) into the pool layer at slots[r] ([S][KVH][D] fp32, bf16, or
 * int8 with scales [S][KVH]: kv8_store) */
static void write_rows(const float *src, int64_t ss, void *buf, float *scales, int kind, const int64_t *slots, int R,
                       int KVH, int D) {
    if (kind == KV_INT8) {
        kv8_store(src, ss, (int8_t *)buf, scales, slots, R, KVH, D);   /* shapes checked with the pool */
        return;
    }
    const int bf16 = kind == KV_BF16, n = KVH * D;
    for (int r = 0; r < R; r++) {
        const float *s = src + (int64_t)r * ss;
        if (bf16) {
            uint16_t *d = (uint16_t *)buf + slots[r] * (int64_t)n;
            for (int i = 0; i < n; i++) d[i] = f32_to_bf16(s[i]);
        } else {
            memcpy((float *)buf + slots[r] * (int64_t)n, s, sizeof(float) * (size_t)n);
        }
    }
}

int64_t decode_layers_workspace(int R, int hidden, int H, int KVH, int D, int I) {
    return (int64_t)R * ((H + 2 * KVH) * D + (H + KVH) * D + 3 * H * D + hidden + 3 * I);
}

/* R decode rows' attention (queries at q, row stride qs) into out [R][H*D]: over an int8 pool on kv8_decode, one
 * order's on fma_attention's arithmetic (fma_decode), else on the decode kernel. Returns 0 or that kernel's error. */
static int decode_rows(const float *q, int64_t qs, const void *kb, const void *vb, const float *ks, const float *vs,
                       int kind, const int64_t *slots, const int64_t *first, const int64_t *lens, int64_t Lmax,
                       const int64_t *row_chunk, int nchunks, float *scratch, float *out, int R, int H, int KVH, int D,
                       float scale, int one_order) {
    const int kv_bf16 = kind == KV_BF16;
    if (kind == KV_INT8)
        return kv8_decode(q, qs, kb, vb, ks, vs, slots, Lmax, lens, out, (int64_t)H * D, R, H, KVH, D, scale);
    if (one_order)
        return fma_decode(q, qs, kb, vb, kv_bf16, slots, Lmax, lens, out, (int64_t)H * D, R, H, KVH, D, scale);
    decode_attention(q, 0, qs, kb, vb, kv_bf16, slots, first, lens, R, H, KVH, D, Lmax, scale, 0, row_chunk,
                     nchunks, scratch, out, 0, NULL, 0);   /* row_chunk checked by the caller */
    return 0;
}

/* One layer's attention for every row into att [R][H*D]: the decodes (rows dec_idx[0..Rd-1]; all R rows, queries in
 * place, when there is no chunk) by decode_rows, the chunk (rows chunk_at .. +chunk_n, keys at chunk_slots[0 ..
 * chunk_m-1]) on the tiles (amx), else on FMAs (fma_attention.c; one order: its lanes order), as the
 * loop's prefill kernel. Returns 0 or that kernel's error. */
static int layer_attention(const float *qk, int QK, const void *kb, const void *vb, const float *ks, const float *vs,
                           int kind, const int64_t *slots,
                           const int64_t *first, const int64_t *lens, int64_t Lmax, const int64_t *row_chunk,
                           int nchunks, float *scratch, const int64_t *dec_idx, int Rd, int chunk_at, int chunk_n,
                           const int64_t *chunk_slots, int chunk_m, float *qd, float *attd, float *att, int R, int H,
                           int KVH, int D, float scale, int amx, int one_order) {
    const int HD = H * D;
    if (!chunk_n)
        return decode_rows(qk, QK, kb, vb, ks, vs, kind, slots, first, lens, Lmax, row_chunk, nchunks, scratch, att,
                           R, H, KVH, D, scale, one_order);
    if (Rd) {   /* gathered, as the loop's q.index_select(0, decode_idx) */
        for (int i = 0; i < Rd; i++) memcpy(qd + (int64_t)i * HD, qk + dec_idx[i] * QK, sizeof(float) * (size_t)HD);
        const int rc = decode_rows(qd, HD, kb, vb, ks, vs, kind, slots, first, lens, Lmax, row_chunk, nchunks,
                                   scratch, attd, Rd, H, KVH, D, scale, one_order);
        if (rc) return rc;
        for (int i = 0; i < Rd; i++) memcpy(att + dec_idx[i] * HD, attd + (int64_t)i * HD, sizeof(float) * (size_t)HD);
    }
    if (kind == KV_INT8)
        return kv8_attention(qk + (int64_t)chunk_at * QK, QK, kb, vb, ks, vs, chunk_slots, att + (int64_t)chunk_at * HD,
                             chunk_n, chunk_m, H, KVH, D, scale);
    return (amx ? amx_attention : one_order ? fma_attention_lanes : fma_attention)(
        qk + (int64_t)chunk_at * QK, QK, kb, vb, kind == KV_BF16, chunk_slots, att + (int64_t)chunk_at * HD, chunk_n, chunk_m,
        H, KVH, D, scale);
}

int decode_layers(float *x, float *y, const int64_t *layer_ptrs, int L, const float *cos, const float *sin,
                  const int64_t *out_slots, const int64_t *slots, const int64_t *first, const int64_t *lens,
                  int64_t Lmax, const int64_t *row_chunk, int nchunks, float *scratch, int kv_kind, float *ws,
                  int R, int hidden, int H, int KVH, int D, int I, float eps, float scale, const int64_t *dec_idx,
                  int Rd, int chunk_at, int chunk_n, const int64_t *chunk_slots, int chunk_m, int amx,
                  int one_order, int a16) {
    /* a16: the projections on w8a16_gemm (exact integer sums, any order); one order of sums: on their panels, the
     * decode rows on fma_attention's arithmetic */
    int (*const w8)(const float *, const int8_t *, const float *, const float *, float *, int, int, int) =
        a16 ? w8a16_gemm : one_order ? w8_panel_gemm : w8_gemv;
    if (a16 && !w8a16_ready()) return -4;
    const int QKV = (H + 2 * KVH) * D, QK = (H + KVH) * D;
    float *qkv = ws, *qk = qkv + (int64_t)R * QKV, *att = qk + (int64_t)R * QK, *delta = att + (int64_t)R * H * D;
    float *gu = delta + (int64_t)R * hidden, *act = gu + (int64_t)R * 2 * I;
    float *qd = act + (int64_t)R * I, *attd = qd + (int64_t)R * H * D;   /* a mixed step's gathered decode rows */
    if (!chunk_n) Rd = R;   /* a pure decode step */
    if (Rd && kv_kind != KV_INT8 && !row_chunks_ok(row_chunk, lens, Rd, nchunks)) return -2;   /* before anything is written */
    if (kv_kind == KV_INT8 && !kv8_ready()) return -4;
    for (int l = 0; l < L; l++) {
        const int64_t *p = layer_ptrs + (int64_t)l * DL_PTRS;
#define P(i) ((void *)(intptr_t)p[i])
        if (w8(y, P(DL_WQKV), P(DL_SQKV), P(DL_BQKV), qkv, R, QKV, hidden)) return -1;
        rope(qkv, QKV, cos, sin, qk, R, H + KVH, D);
        write_rows(qk + H * D, QK, P(DL_K), P(DL_KS), kv_kind, out_slots, R, KVH, D);
        write_rows(qkv + QK, QKV, P(DL_V), P(DL_VS), kv_kind, out_slots, R, KVH, D);
        const int rc = layer_attention(qk, QK, P(DL_K), P(DL_V), P(DL_KS), P(DL_VS), kv_kind, slots, first, lens, Lmax, row_chunk, nchunks,
                                       scratch, dec_idx, Rd, chunk_at, chunk_n, chunk_slots, chunk_m, qd, attd, att,
                                       R, H, KVH, D, scale, amx, one_order);
        if (rc) return rc == -1 ? -1 : -3;
        if (w8(att, P(DL_WO), P(DL_SO), P(DL_BO), delta, R, hidden, H * D)) return -1;
        add_rms_norm(x, delta, P(DL_POST_NORM), y, R, hidden, eps);
        if (w8(y, P(DL_WGU), P(DL_SGU), P(DL_BGU), gu, R, 2 * I, hidden)) return -1;
        silu_mul(gu, act, R, I);
        if (w8(act, P(DL_WD), P(DL_SD), P(DL_BD), delta, R, hidden, I)) return -1;
        if (p[DL_NEXT_NORM]) {
            add_rms_norm(x, delta, P(DL_NEXT_NORM), y, R, hidden, eps);
        } else {   /* the last layer: the residual only (the final norm runs with the head) */
            for (int64_t i = 0; i < (int64_t)R * hidden; i++) x[i] += delta[i];
        }
#undef P
    }
    return 0;
}
