"""The int8 KV pool's kernels (kv8_attention.c), checked: kv8_store writes rows of K or V into a pool layer as int8
and their scales, kv8_attention attends a prompt chunk, kv8_decode decode rows, each reading the int8 rows straight
out of the pool by slot. Where they run: `kv8_fits` (AVX512-VNNI or AVX2, head_dim a multiple of 64); a prompt chunk's
many rows on AMX-INT8 tiles where the CPU has them (`tiles_here`)."""
from __future__ import annotations

import math

import torch

from core.engine.model.native_kernels import F32, MAX_D, available, built

I8 = torch.int8


def kv8_fits(device: torch.device, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether the int8 pool's kernels run this attention here: built with AVX512-VNNI or AVX2 alone, a CPU tensor,
    head_dim a multiple of 64 up to MAX_D, whole groups of query heads per KV head."""
    return (device.type == "cpu" and head_dim % 64 == 0 and 0 < head_dim <= MAX_D and kv_heads > 0
            and heads % kv_heads == 0 and available() and bool(built().kv8_ready()))


def tiles_here() -> bool:
    """Whether a prompt chunk's many rows (more than 12: kv8_avx512_block.h's FEW_MAX) run on AMX-INT8 tiles here
    (kv8_amx_block.h: the same exact integer sums, the same bits): the kernels built with AMX-INT8, Linux granted the
    tiles, and neither native_kernels.set_amx nor set_tiles turned them off."""
    return available() and bool(built().kv8_tiles())


def set_tiles(flag: bool) -> bool:
    """Run a prompt chunk's many rows on AMX-INT8 tiles where they exist (True, the default) or on the AVX-512
    kernels (False), at once, the model's projections untouched (native_kernels.set_amx switches both, and sets this
    too); returns the previous setting. The same bits either way: benchmarks compare the two with it."""
    if not available():
        return False
    return bool(built().set_kv8_amx(int(bool(flag))))


def why_not(device: torch.device, heads: int, kv_heads: int, head_dim: int) -> str:
    """What an int8 pool needs that this model or machine lacks (for the error that refuses it)."""
    if device.type != "cpu":
        return f"the int8 KV pool runs on CPUs only (this model is on {device.type}); use kv_cache_dtype fp32 or bf16"
    if head_dim % 64 or head_dim > MAX_D or kv_heads <= 0 or heads % kv_heads:
        return (f"the int8 KV pool needs head_dim a multiple of 64 up to {MAX_D} and whole head groups (this model: "
                f"head_dim {head_dim}, {heads} heads over {kv_heads}); use kv_cache_dtype fp32 or bf16")
    return ("the int8 KV pool needs the native kernels built with AVX512-VNNI, or AVX2 on a CPU without AVX-512 "
            "(this CPU or build has neither); use kv_cache_dtype fp32 or bf16")


def default_here(numerics: str, device: torch.device, heads: int, kv_heads: int, head_dim: int,
                 windows: list) -> bool:
    """Whether NativeLlama's pool is int8 when none is asked for: for the int8 model where these kernels run every
    attention (measured faster at every context and batch, 3.8x fewer KV bytes, the same agreement with HF:
    benchmarks/README.md, "int8 KV pool"); fp32 keeps Hugging Face's bits, so its pool stays fp32."""
    return (numerics == "int8" and all(w is None for w in windows)
            and kv8_fits(device, heads, kv_heads, head_dim))


def check_model(fp32_activations: bool, device: torch.device, heads: int, kv_heads: int, head_dim: int,
                windows: list) -> None:
    """Refuses an int8 pool where these kernels cannot run every attention of the model, saying what to change."""
    if not fp32_activations:
        raise ValueError("kv_dtype 'int8' needs fp32 activations (dtype fp32 or int8); use kv_dtype bf16 with "
                         "dtype bf16")
    if any(w is not None for w in windows):
        raise ValueError("kv_dtype 'int8' runs full attention only (this model has sliding-window layers); "
                         "use kv_dtype fp32 or bf16")
    if not kv8_fits(device, heads, kv_heads, head_dim):
        raise ValueError(why_not(device, heads, kv_heads, head_dim))


def _check_layer(name: str, k_buf: torch.Tensor, v_buf: torch.Tensor, k_scale: torch.Tensor,
                 v_scale: torch.Tensor) -> None:
    if (k_buf.dim() != 3 or v_buf.shape != k_buf.shape or k_buf.dtype is not I8 or v_buf.dtype is not I8
            or k_scale.shape != k_buf.shape[:2] or v_scale.shape != k_scale.shape
            or k_scale.dtype is not F32 or v_scale.dtype is not F32
            or not all(t.is_cpu and t.is_contiguous() for t in (k_buf, v_buf, k_scale, v_scale))):
        raise ValueError(f"{name} reads one int8 pool layer: contiguous CPU int8 k, v [slots, KVH, D] and fp32 "
                         f"scales [slots, KVH] (KVPool(dtype=torch.int8)), got {k_buf.dtype} {tuple(k_buf.shape)}, "
                         f"{v_buf.dtype} {tuple(v_buf.shape)}, scales {k_scale.dtype} {tuple(k_scale.shape)}, "
                         f"{v_scale.dtype} {tuple(v_scale.shape)}")


def _check_slots(name: str, slots: torch.Tensor, rows: int) -> None:
    if slots.dtype is not torch.int64 or not slots.is_cpu or not slots.is_contiguous():
        raise ValueError(f"{name} takes contiguous int64 CPU slots, got {slots.dtype} on {slots.device}")
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= rows):
        raise ValueError(f"{name}: slots must lie in 0 .. {rows - 1} (the pool layer's rows)")


def _check_fits(name: str, q: torch.Tensor, kvh: int, d: int) -> None:
    if q.dtype is not F32 or not q.is_cpu or q.dim() != 3 or q.shape[2] != d:
        raise ValueError(f"{name} takes fp32 CPU queries [n, H, {d}], got {q.dtype} {tuple(q.shape)} on {q.device}")
    if not kv8_fits(q.device, q.shape[1], kvh, d):
        raise ValueError(f"{name}: {why_not(q.device, q.shape[1], kvh, d)}")


def kv8_store(x: torch.Tensor, buf: torch.Tensor, scales: torch.Tensor, slots: torch.Tensor) -> None:
    """x [T, KVH, D] fp32 (rows may be strided, heads and D contiguous) into pool layer `buf` [S, KVH, D] int8 and
    `scales` [S, KVH] at `slots` [T]: KVPool.set_kv's bits (core/cache/kv_pool.quantize_int8), in one C call."""
    t = slots.shape[0] if slots.dim() == 1 else -1
    if (x.dtype is not F32 or x.dim() != 3 or x.shape[0] != t or x.shape[1:] != buf.shape[1:]
            or buf.dtype is not I8 or scales.dtype is not F32 or scales.shape != buf.shape[:2]
            or not (buf.is_contiguous() and scales.is_contiguous() and x.is_cpu and buf.is_cpu)):
        raise ValueError(f"kv8_store takes fp32 x [T, KVH, D], slots [T] and an int8 pool layer [S, KVH, D] with fp32 "
                         f"scales [S, KVH], got x {x.dtype} {tuple(x.shape)}, slots {tuple(slots.shape)}, buffer "
                         f"{buf.dtype} {tuple(buf.shape)}, scales {scales.dtype} {tuple(scales.shape)}")
    _check_slots("kv8_store", slots, buf.shape[0])
    if x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        x = x.contiguous()
    built().kv8_store(x.data_ptr(), x.stride(0), buf.data_ptr(), scales.data_ptr(), slots.data_ptr(), t,
                      buf.shape[1], buf.shape[2])


def kv8_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, k_scale: torch.Tensor,
                  v_scale: torch.Tensor, slots: torch.Tensor, scale: float) -> torch.Tensor:
    """A prompt chunk's causal attention over an int8 pool layer: q [n, H, D] fp32, key j at slot slots[j] (int64
    [m]: the cached prefix then the chunk's own tokens, already stored), query i at position m - n + i. [n, H, D]
    fp32; each row the bits kv8_decode gives the same query (kv8_attention.c says why)."""
    _check_layer("kv8_attention", k_buf, v_buf, k_scale, v_scale)
    _check_fits("kv8_attention", q, k_buf.shape[1], k_buf.shape[2])
    if slots.dim() != 1 or slots.shape[0] < q.shape[0]:
        raise ValueError(f"kv8_attention needs slots [m] with m >= the {q.shape[0]} queries (their own keys), got "
                         f"{tuple(slots.shape)}")
    _check_slots("kv8_attention", slots, k_buf.shape[0])
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"kv8_attention takes a positive finite scale (1/sqrt(head_dim) as a rule), got {scale!r}")
    n, h, d = q.shape
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    out = torch.empty((n, h, d), dtype=F32)
    built().kv8_attention(q.data_ptr(), q.stride(0), k_buf.data_ptr(), v_buf.data_ptr(), k_scale.data_ptr(),
                          v_scale.data_ptr(), slots.data_ptr(), out.data_ptr(), n, slots.shape[0], h,
                          k_buf.shape[1], d, float(scale))
    return out


def kv8_decode(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, k_scale: torch.Tensor,
               v_scale: torch.Tensor, slots: torch.Tensor, lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Decode rows over an int8 pool layer: q [R, H, D] fp32 (one query per request, at position lens[r] - 1) over
    keys slots[r, :lens[r]] -> [R, H, D] fp32, each row what kv8_attention gives that query as a chunk of one."""
    _check_layer("kv8_decode", k_buf, v_buf, k_scale, v_scale)
    _check_fits("kv8_decode", q, k_buf.shape[1], k_buf.shape[2])
    r, h, d = q.shape
    if (slots.dim() != 2 or slots.shape[0] != r or lens.dtype is not torch.int64 or lens.shape != (r,)
            or not lens.is_contiguous()):
        raise ValueError(f"kv8_decode takes slots [{r}, Lmax] and contiguous int64 lens [{r}], got "
                         f"{tuple(slots.shape)}, {lens.dtype} {tuple(lens.shape)}")
    _check_slots("kv8_decode", slots, k_buf.shape[0])
    if r and (int(lens.min()) < 1 or int(lens.max()) > slots.shape[1]):
        raise ValueError(f"kv8_decode: each row's keys must number 1 .. {slots.shape[1]}")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"kv8_decode takes a positive finite scale, got {scale!r}")
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    out = torch.empty((r, h, d), dtype=F32)
    built().kv8_decode(q.data_ptr(), q.stride(0), k_buf.data_ptr(), v_buf.data_ptr(), k_scale.data_ptr(),
                       v_scale.data_ptr(), slots.data_ptr(), slots.shape[1], lens.data_ptr(), out.data_ptr(), h * d,
                       r, h, k_buf.shape[1], d, float(scale))
    return out
