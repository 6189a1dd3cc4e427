/* The CPython module of the native Llama path's CPU kernels (core/engine/model/native_kernels.py builds it with the
 * system C compiler on first use, from this file and the kernels' files; without a compiler, the torch fallbacks in
 * core/engine/model/native_layers.py run). One thin binding a kernel; the kernels live in:
 *
 * decode_attention.c: decode attention over an fp32 or bf16 pool, by slot, flash-decoding chunks; extend runs.
 * w8_x16.c: the int8 projections on x16 activations: w8_gemv (few rows), w8_amx_gemm(_silu) (many, AMX tiles).
 * panel_gemm.c: w8_panel_gemm, the same products for any number of rows without AMX, one sum order for all.
 * w8a16_gemm.c: int8 projections on int16 activations, exact integer sums (VPDPWSSD, or VPMADDWD on AVX2).
 * amx_attention.c: a prefill's causal attention on AMX tiles.
 * fma_attention.c: the same attention in FMAs (AVX-512, or AVX2), for CPUs without AMX; with fma_attention_lanes and
 *   fma_decode, one order's prompt chunks and decode rows (NativeLlama.one_order).
 * kv8_attention.c: the int8 KV pool: kv8_store, kv8_attention, kv8_decode.
 * decode_layers.c: a decode step's layers in one call.
 * fused_elementwise.c: add_rms_norm, silu_mul, rope.
 *
 * Built with -O3 -march=native -fopenmp and fast-math's reassociation and contraction (not -ffast-math itself:
 * native_kernels.py says why).
 */
#include <stdint.h>
#include "native_kernels.h"

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
/* py_NAME: the C question NAME(void) (what this build or CPU runs) as a Python bool, taking no arguments */
#define FLAG_QUERY(name)                                                                 \
    static PyObject *py_##name(PyObject *self, PyObject *const *args, Py_ssize_t n) {   \
        if (!args_ok(n, 0, #name)) return NULL;                                          \
        return PyBool_FromLong(name());                                                  \
    }
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

FLAG_QUERY(panel_gemm_fast)

static PyObject *py_w8_panel_gemm(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return call_w8(w8_panel_gemm, "w8_panel_gemm", args, n);
}

FLAG_QUERY(w8a16_ready)

static PyObject *py_w8a16_gemm(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return call_w8(w8a16_gemm, "w8a16_gemm", args, n);
}

FLAG_QUERY(w8a16_amx_ready)

static PyObject *py_w8a16_amx_gemm(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return call_w8(w8a16_amx_gemm, "w8a16_amx_gemm", args, n);
}

static PyObject *py_w8a16_amx_gemm_silu(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return call_w8(w8a16_amx_gemm_silu, "w8a16_amx_gemm_silu", args, n);
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

FLAG_QUERY(amx_attention_ready)

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

FLAG_QUERY(fma_attention_ready)

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

FLAG_QUERY(kv8_ready)

FLAG_QUERY(kv8_tiles)

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

FLAG_QUERY(amx_ready)

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

static PyObject *py_set_kv8_amx(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    return swap_setting(&kv8_amx, "set_kv8_amx", args, n);
}

static PyMethodDef METHODS[] = {
    {"decode_attention", (PyCFunction)(void (*)(void))py_decode_attention, METH_FASTCALL, NULL},
    {"w8_gemv", (PyCFunction)(void (*)(void))py_w8_gemv, METH_FASTCALL, NULL},
    {"fma_decode", (PyCFunction)(void (*)(void))py_fma_decode, METH_FASTCALL, NULL},
    {"kv8_ready", (PyCFunction)(void (*)(void))py_kv8_ready, METH_FASTCALL, NULL},
    {"kv8_tiles", (PyCFunction)(void (*)(void))py_kv8_tiles, METH_FASTCALL, NULL},
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
    {"w8a16_amx_gemm", (PyCFunction)(void (*)(void))py_w8a16_amx_gemm, METH_FASTCALL, NULL},
    {"w8a16_amx_gemm_silu", (PyCFunction)(void (*)(void))py_w8a16_amx_gemm_silu, METH_FASTCALL, NULL},
    {"w8a16_amx_ready", (PyCFunction)(void (*)(void))py_w8a16_amx_ready, METH_FASTCALL, NULL},
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
    {"set_kv8_amx", (PyCFunction)(void (*)(void))py_set_kv8_amx, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_radix_native_kernels", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__radix_native_kernels(void) { return PyModule_Create(&MODULE); }
#endif
