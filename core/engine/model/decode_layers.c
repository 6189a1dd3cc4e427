/* One decode step's decoder layers in one C call: int8 projections, fp32 activations, the KV pool written and
 * read by slot.
 *
 * Why: a decode step of the default model (30 layers) made ~12 kernel calls a layer from Python, each behind a
 * wrapper that checks its tensors and allocates its output: ~2 ms of a ~9 ms step went to the interpreter, and
 * the GIL was held in between, so the server's event loop competed with the step. Here the same kernels run in
 * the same order on the same inputs (w8_gemv, rope, decode_attention, add_rms_norm, silu_mul), so the result is
 * the same bits as NativeLlama's Python loop (tested); the caller checks every tensor once per step.
 *
 * Layout of `layer_ptrs`: DL_PTRS pointers per layer (see the enum below); `ws` a workspace of
 * decode_layers_workspace(R, ...) floats. x [R, hidden] (the residual stream, updated in place) and y [R, hidden]
 * (the normed input of layer 0 on entry, written as each layer's input). Returns 0, -1 when out of memory, -2 when
 * row_chunk is refused (decode_attention). */
#include <stdint.h>
#include <string.h>
#include "native_simd.h"
#include "native_kernels.h"

enum { DL_WQKV, DL_SQKV, DL_BQKV, DL_WO, DL_SO, DL_BO, DL_WGU, DL_SGU, DL_BGU, DL_WD, DL_SD, DL_BD,
       DL_POST_NORM, DL_NEXT_NORM, DL_K, DL_V, DL_PTRS };

/* rows of n floats (src, row stride ss) into the pool layer at slots[r] ([S][n] fp32 or bf16) */
static void write_rows(const float *src, int64_t ss, void *buf, int bf16, const int64_t *slots, int R, int n) {
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
    return (int64_t)R * ((H + 2 * KVH) * D + (H + KVH) * D + H * D + hidden + 3 * I);
}

int decode_layers(float *x, float *y, const int64_t *layer_ptrs, int L, const float *cos, const float *sin,
                  const int64_t *out_slots, const int64_t *slots, const int64_t *first, const int64_t *lens,
                  int64_t Lmax, const int64_t *row_chunk, int nchunks, float *scratch, int kv_bf16, float *ws,
                  int R, int hidden, int H, int KVH, int D, int I, float eps, float scale) {
    const int QKV = (H + 2 * KVH) * D, QK = (H + KVH) * D;
    float *qkv = ws, *qk = qkv + (int64_t)R * QKV, *att = qk + (int64_t)R * QK, *delta = att + (int64_t)R * H * D;
    float *gu = delta + (int64_t)R * hidden, *act = gu + (int64_t)R * 2 * I;
    if (!row_chunks_ok(row_chunk, lens, R, nchunks)) return -2;   /* before anything is written */
    for (int l = 0; l < L; l++) {
        const int64_t *p = layer_ptrs + (int64_t)l * DL_PTRS;
#define P(i) ((void *)(intptr_t)p[i])
        if (w8_gemv(y, P(DL_WQKV), P(DL_SQKV), P(DL_BQKV), qkv, R, QKV, hidden)) return -1;
        rope(qkv, QKV, cos, sin, qk, R, H + KVH, D);
        write_rows(qk + H * D, QK, P(DL_K), kv_bf16, out_slots, R, KVH * D);
        write_rows(qkv + QK, QKV, P(DL_V), kv_bf16, out_slots, R, KVH * D);
        decode_attention(qk, 0, QK, P(DL_K), P(DL_V), kv_bf16, slots, first, lens, R, H, KVH, D, Lmax, scale, 0,
                         row_chunk, nchunks, scratch, att, 0, NULL, 0);   /* row_chunk checked above */
        if (w8_gemv(att, P(DL_WO), P(DL_SO), P(DL_BO), delta, R, hidden, H * D)) return -1;
        add_rms_norm(x, delta, P(DL_POST_NORM), y, R, hidden, eps);
        if (w8_gemv(y, P(DL_WGU), P(DL_SGU), P(DL_BGU), gu, R, 2 * I, hidden)) return -1;
        silu_mul(gu, act, R, I);
        if (w8_gemv(act, P(DL_WD), P(DL_SD), P(DL_BD), delta, R, hidden, I)) return -1;
        if (p[DL_NEXT_NORM]) {
            add_rms_norm(x, delta, P(DL_NEXT_NORM), y, R, hidden, eps);
        } else {   /* the last layer: the residual only (the final norm runs with the head) */
            for (int64_t i = 0; i < (int64_t)R * hidden; i++) x[i] += delta[i];
        }
#undef P
    }
    return 0;
}
