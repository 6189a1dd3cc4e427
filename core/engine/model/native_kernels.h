/* The functions one C file of the native kernels calls in another (compiled into one module by native_kernels.py,
 * whose SOURCES lists the files; native_kernels.c holds the Python bindings): declared once here, and included by
 * the file that defines each, so that the compiler checks every caller against the definition. */
#ifndef NATIVE_KERNELS_H
#define NATIVE_KERNELS_H
#include <stdint.h>

/* w8_x16.c */
void round16(const float *src, float *dst, int64_t n);
int w8_gemv(const float *x, const int8_t *w, const float *scales, const float *bias, float *y, int M, int N, int K);
extern int w8_prefetch, w8_row_max;   /* benchmark knobs (set_w8_prefetch, set_w8_row_max) */
int amx_ready(void);
int w8_amx_gemm(const float *x, uint16_t *xb, const uint16_t *wp, const float *scales, const float *bias, float *y,
                int M, int N, int K);
int w8_amx_gemm_silu(const float *x, uint16_t *xb, const uint16_t *wp, const float *scales, const float *bias,
                     float *y, int M, int N, int K);

/* fused_elementwise.c */
#define PAR_ROWS 64   /* from this many rows the rows are split across the OpenMP threads (and the GIL let go) */
void rope(const float *qk, int64_t row_stride, const float *cos, const float *sin, float *out, int T, int NH, int D);
void add_rms_norm(float *x, const float *delta, const float *w, float *y, int M, int N, float eps);
void silu_mul(const float *gu, float *out, int M, int I);

/* decode_attention.c */
#define MAX_CHUNK 512   /* most keys a decode row's chunk holds (its score buffer) */
int decode_attention_fast(int G, int D);
int row_chunks_ok(const int64_t *row_chunk, const int64_t *lens, int R, int nchunks);
int decode_attention(const void *q, int q_bf16, int64_t q_stride, const void *kbuf, const void *vbuf, int kv_bf16,
                      const int64_t *slots, const int64_t *first, const int64_t *lens,
                      int R, int H, int KVH, int D, int64_t Lmax, float scale, int chunk, const int64_t *row_chunk,
                      int nchunks, float *scratch, void *out, int out_bf16, const int64_t *seg, int nseg);

/* panel_gemm.c */
int panel_gemm_fast(void);
int w8_panel_gemm(const float *x, const int8_t *panels, const float *scales, const float *bias, float *y,
                  int M, int N, int K);

/* w8a16_gemm.c */
int w8a16_ready(void);
int w8a16_gemm(const float *x, const int8_t *panels, const float *scales, const float *bias, float *y,
               int M, int N, int K);
int w8a16_amx_ready(void);
int w8a16_amx_gemm(const float *x, const int8_t *quads, const float *scales, const float *bias, float *y,
                   int M, int N, int K);
int w8a16_amx_gemm_silu(const float *x, const int8_t *quads, const float *scales, const float *bias, float *y,
                        int M, int N, int K);

/* amx_attention.c */
int amx_attention_ready(void);
int amx_attention(const float *q, int64_t qs, const void *k, const void *v, int kv_bf16, const int64_t *slots,
                  float *out, int n, int m, int H, int KVH, int D, float scale);

/* fma_attention.c */
int fma_attention_ready(void);
int fma_attention(const float *q, int64_t qs, const void *k, const void *v, int kv_bf16, const int64_t *slots,
                  float *out, int n, int m, int H, int KVH, int D, float scale);
int fma_attention_lanes(const float *q, int64_t qs, const void *k, const void *v, int kv_bf16, const int64_t *slots,
                        float *out, int n, int m, int H, int KVH, int D, float scale);
int fma_decode(const float *q, int64_t qs, const void *k, const void *v, int kv_bf16, const int64_t *slots,
               int64_t Lmax, const int64_t *lens, float *out, int64_t os, int R, int H, int KVH, int D, float scale);

/* kv8_attention.c */
extern int kv8_amx;   /* native_kernels.set_amx's switch for the int8 pool's tiles (set_kv8_amx) */
int kv8_ready(void);
int kv8_tiles(void);
int kv8_store(const float *src, int64_t ss, int8_t *buf, float *scales, const int64_t *slots, int R, int KVH, int D);
int kv8_attention(const float *q, int64_t qs, const int8_t *k, const int8_t *v, const float *ks, const float *vs,
                  const int64_t *slots, float *out, int n, int m, int H, int KVH, int D, float scale);
int kv8_decode(const float *q, int64_t qs, const int8_t *k, const int8_t *v, const float *ks, const float *vs,
               const int64_t *slots, int64_t Lmax, const int64_t *lens, float *out, int64_t os, int R, int H, int KVH,
               int D, float scale);

/* decode_layers.c */
int64_t decode_layers_workspace(int R, int hidden, int H, int KVH, int D, int I);
int decode_layers(float *x, float *y, const int64_t *layer_ptrs, int L, const float *cos, const float *sin,
                  const int64_t *out_slots, const int64_t *slots, const int64_t *first, const int64_t *lens,
                  int64_t Lmax, const int64_t *row_chunk, int nchunks, float *scratch, int kv_kind, float *ws,
                  int R, int hidden, int H, int KVH, int D, int I, float eps, float scale, const int64_t *dec_idx,
                  int Rd, int chunk_at, int chunk_n, const int64_t *chunk_slots, int chunk_m, int amx,
                  int one_order, int a16);

/* panel_gemm.c, w8a16_gemm.c: a decode GEMV's thread t of `threads` (in an OpenMP region) takes an equal share of the
 * NP weight panels, [panel_share(NP, t, threads), panel_share(NP, t + 1, threads)), in whole panels (a static split
 * of whole groups gave SmolLM2's 36-panel projections 24 : 12), walked in runs that stop where each group of `group`
 * panels ends (a run reads its group with the group's stride). Each channel's sum is the same whoever computes it. */
static inline int panel_share(int np, int t, int threads) { return (int)((int64_t)np * t / threads); }
static inline int run_end(int p0, int end, int group) {
    const int group_end = (p0 / group + 1) * group;
    return group_end < end ? group_end : end;
}
#endif
