"""Build (once, with the system C compiler) and call the CPU kernels of core/engine/model/*.c (SOURCES).

`available()` is False where there is no compiler, the build fails, or RADIX_NATIVE_KERNELS=0;
callers then use their torch fallbacks. The shared library lands in the model cache folder under a
name that hashes the source, the flags and the CPU's feature flags (it is built with
-march=native), so an edit or another machine builds a new one; building takes about a second.

It is built as a tiny CPython extension module (pointers travel as Python ints: ~0.1 us a call,
where ctypes cost ~4 us, and a decode step makes ~240 calls). It links libgomp, the OpenMP runtime
torch itself loads (same soname), so its parallel regions run on torch's threads and follow
torch.set_num_threads.

Here: the build, decode attention, the fused elementwise kernels and AMX's availability; prompt chunks' attention
over the pool (AMX tiles, FMAs) and one order's decode rows are pool_attention.py's, the int8
projections' wrappers native_int8.py's.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import types
from typing import Optional

import torch

from core import env

SOURCE = pathlib.Path(__file__).with_name("native_kernels.c")
# compiled together into one module (SOURCE holds its Python bindings); the header is hashed, not compiled
SOURCES = [SOURCE, *(SOURCE.with_name(f) for f in ("decode_attention.c", "w8_x16.c", "fused_elementwise.c",
                                                    "panel_gemm.c", "w8a16_gemm.c", "amx_attention.c",
                                                    "fma_attention.c", "kv8_attention.c", "decode_layers.c"))]
HEADERS = [SOURCE.with_name(f) for f in ("native_simd.h", "native_kernels.h", "w8a16_avx2.h", "kv8_avx2.h",
                                          "kv8_avx2_block.h", "online_softmax_avx2.h", "fma_avx2.h", "kv8_avx512.h",
                                          "kv8_avx512_block.h", "kv8_amx_block.h", "fma_avx512.h",
                                          "online_softmax_avx512.h")]
# Not -ffast-math: linking with it pulls in crtfastmath.o, which turns on flush-to-zero for the whole
# process at load time (numpy, hypothesis and every float in Python then lose subnormals). These flags
# give the vectoriser what it needs (reassociated sums, fused multiply-add) without touching FP state.
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
         "-fassociative-math", "-ffp-contract=fast", "-shared", "-fPIC", "-std=c11"]
MAX_D, MAX_G, MAX_CHUNK = 256, 16, 512
F32 = torch.float32
SEG_CHUNK = 64   # keys per work item of an extend run (decode_attention.c)

_lib = None   # the compiled extension module
_tried = False
_build_lock = threading.Lock()
_error: Optional[str] = None


def cpu_flags() -> str:
    """The CPU's feature flags line of /proc/cpuinfo ("" where there is none): part of the build's key (the kernels
    are built with -march=native), and what a benchmark checks before timing one instruction set."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def _cache_dir() -> pathlib.Path:
    from core.engine.model.loader import model_cache_root
    return model_cache_root().parent / "kernels"


def compiler() -> str:
    """The C compiler the kernels are built with: $CC, else gcc, else cc (RuntimeError: none on PATH)."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc/cc) on PATH")
    return cc


def compile_module(sources: list[pathlib.Path], out: pathlib.Path) -> None:
    """Compile `sources` (SOURCES, or another revision's copies of them beside their headers) as one CPython extension
    module at `out`, with FLAGS (RuntimeError with the compiler's message where it fails)."""
    cc = compiler()
    include = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python.h in {include} (install the Python development headers)")
    res = subprocess.run([cc, *FLAGS, "-DNATIVE_PYMODULE", f"-I{include}", *map(str, sources), "-o", str(out), "-lm"],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{cc} failed: {res.stderr.strip()[:2000]}")


def load_module(path: pathlib.Path) -> types.ModuleType:
    """The extension module compiled at `path`: a separate copy for each file, so two builds can sit side by side."""
    loader = importlib.machinery.ExtensionFileLoader("_radix_native_kernels", str(path))
    spec = importlib.util.spec_from_file_location("_radix_native_kernels", str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _build():
    """Compile SOURCES as one CPython extension module (once per source/flags/CPU) and import it."""
    cc = compiler()
    flags = FLAGS + ["-DNATIVE_PYMODULE", f"-I{sysconfig.get_paths()['include']}"]
    src = b"".join(f.read_bytes() for f in SOURCES + HEADERS)
    key = hashlib.sha256(src + " ".join([cc, sys.version] + flags).encode() + cpu_flags().encode()).hexdigest()[:16]
    folder = _cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / f"native_kernels-{key}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    if not lib.is_file():
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        try:
            compile_module(SOURCES, pathlib.Path(tmp))
            os.chmod(tmp, 0o755)
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return load_module(lib)


def _follow_set_amx(module: types.ModuleType) -> None:
    """kv8_attention.c's tiles (its own switch, set_kv8_amx) follow set_amx in `module` (a build from before that
    switch has none)."""
    if hasattr(module, "set_kv8_amx"):
        module.set_kv8_amx(int(_amx_enabled))


def use_module(module: types.ModuleType) -> Optional[types.ModuleType]:
    """Make `module` (load_module's: another build of these kernels, such as another revision's) the one every
    wrapper calls, with set_amx's setting; returns the one used before (this tree's build first, None where it could
    not build). For benchmarks that switch two builds within one process (benchmarks/bench_kernels_ab.py)."""
    global _lib, _tried
    if not isinstance(module, types.ModuleType) or not hasattr(module, "decode_layers"):
        raise TypeError(f"use_module takes a build of these kernels (load_module's, or built()'s), got {module!r}")
    previous = lib()
    _follow_set_amx(module)
    _lib, _tried = module, True
    return previous


def lib():
    """The compiled module, built on first use (None where it cannot be: `error` says why). Threads that ask
    while the first build runs wait for it rather than see None."""
    global _lib, _tried, _error
    if not _tried:
        with _build_lock:
            if not _tried:
                if not env.native_kernels():
                    _error = "disabled by RADIX_NATIVE_KERNELS=0"
                else:
                    try:
                        _lib = _build()
                        _follow_set_amx(_lib)
                    except Exception as exc:  # no compiler, a failed build: the torch fallbacks run
                        _error = f"{type(exc).__name__}: {exc}"
                        print(f"native kernels unavailable ({_error}); using torch fallbacks", file=sys.stderr)
                _tried = True
    return _lib


def fast_attention(group: int, head_dim: int) -> bool:
    """Whether decode_attention has a register-resident AVX-512 kernel for this shape."""
    return available() and bool(_lib.decode_attention_fast(group, head_dim))


_enabled = True


def set_enabled(flag: bool) -> bool:
    """Use the C kernels (True, the default where they build) or the torch fallbacks (False);
    returns the previous setting. Tests compare the two paths with it."""
    global _enabled
    previous, _enabled = _enabled, bool(flag)
    return previous


def available() -> bool:
    return _enabled and (_lib is not None or lib() is not None)


def attention_fits(device: torch.device, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether decode_attention can run this attention: the kernels built, a CPU tensor, head_dim <= MAX_D and
    at most MAX_G query heads per KV head."""
    return device.type == "cpu" and head_dim <= MAX_D and heads // kv_heads <= MAX_G and available()


def error() -> Optional[str]:
    lib()
    return _error


def built():
    """The compiled module, for the kernel wrappers below: a clear error where it did not build (or is turned off)
    rather than an AttributeError on None. (~240 calls a decode step: the common case tests two globals.)"""
    if _enabled and _lib is not None:
        return _lib
    if not available():
        raise RuntimeError(f"the C kernels are not available here ({error() or 'turned off by set_enabled'}); "
                           f"check native_kernels.available() and use the torch ops instead")
    return _lib


def ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def check_channels(name: str, n: int, scales: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
    for label, t in (("scales", scales), ("bias", bias)):
        if t is not None and (t.dtype is not F32 or t.numel() != n or not t.is_contiguous() or not t.is_cpu):
            raise ValueError(f"{name}: {label} must be {n} contiguous fp32 CPU values (one per output channel), "
                             f"got {t.dtype} {tuple(t.shape)} on {t.device}")


def decode_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor,
                     first: torch.Tensor, lens: torch.Tensor, scale: float, chunk: int, nchunks: int,
                     scratch: torch.Tensor, out: torch.Tensor, segments: Optional[torch.Tensor] = None,
                     row_chunks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q [R, H, D] (rows may be strided, heads and D contiguous); k_buf/v_buf [S, KVH, D] contiguous;
    slots [R, Lmax] int64 contiguous; row r attends keys first[r] .. lens[r]-1 of its row;
    scratch >= R*KVH*nchunks*G*(D+2) fp32; out [R, H, D] contiguous.
    segments: None, or int64 [nseg + 1] row starts of runs of rows that share one slot row (an extend's new
    tokens, first and lens non-decreasing along the run); with chunk == SEG_CHUNK each run reads a chunk's
    keys once for all its rows.
    row_chunks: None (every row's keys split every `chunk`), or int64 [R] keys per chunk of each row (1 ..
    MAX_CHUNK, nchunks of them covering the row; the kernel checks the values): then a row's bits depend on its own
    keys alone, not on the other rows of the batch (`native_layers.decode_launch`)."""
    r, h, d = q.shape
    kvh = k_buf.shape[1]
    _check_decode_attention(q, k_buf, v_buf, slots, first, lens, chunk, nchunks, scratch, out, segments, row_chunks)
    if row_chunks is None:
        row_chunks = torch.full((r,), chunk, dtype=torch.int64)
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    built().decode_attention(q.data_ptr(), int(q.dtype == torch.bfloat16), q.stride(0), k_buf.data_ptr(),
                              v_buf.data_ptr(), int(k_buf.dtype == torch.bfloat16), slots.data_ptr(), first.data_ptr(),
                              lens.data_ptr(), r, h, kvh, d, slots.shape[1], scale, chunk, nchunks, scratch.data_ptr(),
                              out.data_ptr(), int(out.dtype == torch.bfloat16), ptr(segments),
                              0 if segments is None else segments.numel() - 1, ptr(row_chunks))
    return out


def _check_decode_attention(q, k_buf, v_buf, slots, first, lens, chunk, nchunks, scratch, out, segments,
                            row_chunks) -> None:
    """decode_attention's inputs, as the C kernel reads them (raw pointers): wrong ones must not reach it.
    Plain tests first, messages only on failure (30 calls a decode step)."""
    r, h, d = q.shape
    bf16 = torch.bfloat16
    if not (q.dtype is F32 or q.dtype is bf16) or not q.is_cpu:
        raise ValueError(f"decode_attention: q must be fp32 or bf16 on the CPU, got {q.dtype} on {q.device}")
    if (k_buf.dim() != 3 or v_buf.shape != k_buf.shape or not (k_buf.dtype is F32 or k_buf.dtype is bf16)
            or v_buf.dtype is not k_buf.dtype or not (k_buf.is_contiguous() and v_buf.is_contiguous())
            or not (k_buf.is_cpu and v_buf.is_cpu)):
        raise ValueError(f"decode_attention: k_buf, v_buf must be one contiguous CPU pool layer [slots, KVH, D] "
                         f"each, fp32 or bf16, got {k_buf.dtype} {tuple(k_buf.shape)} and {v_buf.dtype} "
                         f"{tuple(v_buf.shape)}")
    kvh = k_buf.shape[1]
    if kvh <= 0 or h % kvh or k_buf.shape[2] != d or d > MAX_D or h // kvh > MAX_G:
        raise ValueError(f"decode_attention: {h} query heads of size {d} do not fit KV heads "
                         f"{tuple(k_buf.shape[1:])} (at most {MAX_G} per KV head, head_dim <= {MAX_D})")
    for t in (slots, first, lens):
        if t.dtype is not torch.int64 or not t.is_contiguous() or not t.is_cpu:
            raise ValueError("decode_attention: slots, first, lens must be contiguous int64 CPU tensors")
    if slots.dim() != 2 or slots.shape[0] != r or first.numel() != r or lens.numel() != r:
        raise ValueError(f"decode_attention: slots [{r}, Lmax], first [{r}], lens [{r}] for {r} query rows, got "
                         f"{tuple(slots.shape)}, {tuple(first.shape)}, {tuple(lens.shape)}")
    if row_chunks is None:
        if not 0 < chunk <= MAX_CHUNK or nchunks <= 0:
            raise ValueError(f"decode_attention: chunk must be 1..{MAX_CHUNK} keys and nchunks > 0")
    elif (row_chunks.dtype is not torch.int64 or row_chunks.shape != (r,) or not row_chunks.is_contiguous()
            or not row_chunks.is_cpu or nchunks <= 0):
        raise ValueError(f"decode_attention: row_chunks must be None or {r} contiguous int64 CPU chunk sizes, "
                         f"and nchunks > 0")
    need = r * kvh * nchunks * (h // kvh) * (d + 2)
    if scratch.dtype is not F32 or not scratch.is_contiguous() or scratch.numel() < need:
        raise ValueError(f"decode_attention: scratch needs {need} contiguous fp32 values (R*KVH*nchunks*G*(D+2))")
    if (out.shape != q.shape or not out.is_contiguous() or not (out.dtype is F32 or out.dtype is bf16)
            or not out.is_cpu):
        raise ValueError(f"decode_attention: out must be a contiguous [{r}, {h}, {d}] fp32 or bf16 tensor")
    if segments is not None and (segments.dtype is not torch.int64 or not segments.is_contiguous()
                                 or segments.numel() < 2):
        raise ValueError("decode_attention: segments must be None or contiguous int64 run starts [runs + 1]")


def add_rms_norm(x: torch.Tensor, delta: Optional[torch.Tensor], w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [M, N] fp32 contiguous, updated in place to x + delta (when given); returns rms_norm(x) * w."""
    if x.dtype is not F32 or x.dim() != 2 or not x.is_contiguous() or not x.is_cpu:
        raise ValueError(f"add_rms_norm updates x in place: it takes contiguous fp32 CPU rows [M, N], "
                         f"got {x.dtype} {tuple(x.shape)}")
    m, n = x.shape
    if delta is not None:
        if delta.dtype is not F32 or delta.shape != x.shape or not delta.is_cpu:
            raise ValueError(f"add_rms_norm: delta must be fp32 {tuple(x.shape)} like x, "
                             f"got {delta.dtype} {tuple(delta.shape)}")
        delta = delta.contiguous()
    check_channels("add_rms_norm", n, w, None)
    y = torch.empty_like(x)
    built().add_rms_norm(x.data_ptr(), ptr(delta), w.data_ptr(), y.data_ptr(), m, n, eps)
    return y


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """gu [M, 2I] fp32 -> silu(gu[:, :I]) * gu[:, I:]."""
    if gu.dtype is not F32 or gu.dim() != 2 or gu.shape[1] % 2 or not gu.is_cpu:
        raise ValueError(f"silu_mul takes fp32 CPU rows [M, 2I] (gate | up), got {gu.dtype} {tuple(gu.shape)}")
    gu = gu.contiguous()
    m, two_i = gu.shape
    out = torch.empty((m, two_i // 2), dtype=torch.float32)
    built().silu_mul(gu.data_ptr(), out.data_ptr(), m, two_i // 2)
    return out


def rope(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """native_layers.apply_rope in one pass, bit for bit: qk [T, heads, D] fp32 (rows may be strided, heads and D
    contiguous: the q and k columns of a fused QKV output), cos / sin [T, D] fp32 contiguous -> [T, heads, D]."""
    if qk.dtype is not F32 or qk.dim() != 3 or qk.shape[2] % 2 or not qk.is_cpu:
        raise ValueError(f"rope takes fp32 CPU rows [T, heads, D] with D even, got {qk.dtype} {tuple(qk.shape)}")
    t, nh, d = qk.shape
    for label, table in (("cos", cos), ("sin", sin)):
        if table.dtype is not F32 or table.shape != (t, d) or not table.is_contiguous() or not table.is_cpu:
            raise ValueError(f"rope: {label} must be contiguous fp32 [{t}, {d}] (one row per token), "
                             f"got {table.dtype} {tuple(table.shape)}")
    if qk.stride(2) != 1 or qk.stride(1) != d:
        qk = qk.contiguous()
    out = torch.empty((t, nh, d), dtype=torch.float32)
    built().rope(qk.data_ptr(), qk.stride(0), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), t, nh, d)
    return out


_amx_enabled = True


def set_amx(flag: bool) -> bool:
    """Use AMX tiles where they exist (True, the default) or run as a CPU without them (False: prefill rows on
    `w8_panel_gemm`, the int8 pool's prompt rows on its AVX-512 kernels); returns the previous setting. Tests and
    benchmarks reach the no-AMX path here with it. Projections choose at model build, the int8 pool's attention at
    each call."""
    global _amx_enabled
    previous, _amx_enabled = _amx_enabled, bool(flag)
    if _lib is not None:
        _follow_set_amx(_lib)
    return previous


def amx_available() -> bool:
    """Whether `w8_amx_gemm` runs here: the kernels built with AMX (the CPU has AMX-BF16 and the compiler knows
    it), Linux granted this process the tile registers, and set_amx did not turn them off."""
    return _amx_enabled and available() and bool(_lib.amx_ready())
