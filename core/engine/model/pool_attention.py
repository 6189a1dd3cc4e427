"""Attention over the KV pool for prompt chunks, and one order's decode rows: which C kernel runs a chunk here
(prefill_kernel: AMX tiles, amx_attention.c; FMAs without AMX, fma_attention.c: AVX-512, or AVX2's lanes path), their checked wrappers
reading K/V straight out of a pool layer by slot, and fma_decode (decode rows on fma_attention.c's arithmetic, for
NativeLlama.one_order). The build and the decode kernel are native_kernels.py's."""
from __future__ import annotations

import math
from typing import Optional

import torch

from core.engine.model.native_kernels import F32, MAX_D, amx_available, available, built


def amx_attention_fits(device: torch.device, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether `amx_attention` runs this attention here: AMX available, a CPU tensor, head_dim a multiple of 32
    up to MAX_D, whole groups of query heads per KV head."""
    return (device.type == "cpu" and head_dim % 32 == 0 and head_dim <= MAX_D and kv_heads > 0
            and heads % kv_heads == 0 and amx_available() and bool(built().amx_attention_ready()))


def amx_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of a prefill's n new queries over its m keys, on AMX tiles (amx_attention.c says how:
    each operand as two bf16, fp32 accumulators, ~2^-15 relative to fp32 attention; given the same K/V a row's
    result does not depend on how its prompt was chunked). q [n, H, D] fp32 (rows may be strided, heads and D
    contiguous); k, v [m, KVH, D] fp32, m >= n: the cached prefix's keys then the queries' own, query i at
    position m - n + i seeing keys 0 .. m - n + i. Returns [n, H, D] fp32."""
    if k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"amx_attention takes k, v [m, KVH, D], got {tuple(k.shape)}, {tuple(v.shape)}")
    if k.dtype is not F32 or v.dtype is not F32:
        raise ValueError(f"amx_attention takes fp32 CPU q, k, v, got {q.dtype}, {k.dtype}, {v.dtype}")
    return amx_attention_pool(q, k.contiguous(), v.contiguous(), torch.arange(k.shape[0]), scale)


def fma_attention_fits(device: torch.device, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether `fma_attention` (fma_attention.c: the same attention in FMAs, for CPUs without AMX) runs this
    attention here: built with AVX-512 or AVX2 (fma_avx2.h: every chunk on the lanes path, 8 lanes), a CPU tensor,
    head_dim a multiple of 16 up to MAX_D, whole groups."""
    return (device.type == "cpu" and head_dim % 16 == 0 and head_dim <= MAX_D and kv_heads > 0
            and heads % kv_heads == 0 and available() and bool(built().fma_attention_ready()))


def prefill_kernel(device: torch.device, heads: int, kv_heads: int, head_dim: int) -> Optional[str]:
    """The C kernel a prompt chunk's attention over the pool runs on here: "amx" (tiles), else "fma" (AVX-512 or AVX2),
    else None (torch's attention). Both give a row the same bits however its prompt was chunked or cached."""
    if amx_attention_fits(device, heads, kv_heads, head_dim):
        return "amx"
    if fma_attention_fits(device, heads, kv_heads, head_dim):
        return "fma"
    return None


def amx_attention_pool(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor,
                       scale: float) -> torch.Tensor:
    """attention_pool on the AMX tiles."""
    return attention_pool("amx", q, k_buf, v_buf, slots, scale)


# attention_pool's kernels: (whether it runs here, its binding in the C module)
KERNELS = {"amx": (amx_attention_fits, "amx_attention"), "fma": (fma_attention_fits, "fma_attention"),
           "one_order": (fma_attention_fits, "fma_attention_lanes")}


def attention_pool(kernel: str, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor,
                   scale: float) -> torch.Tensor:
    """A prompt chunk's causal attention on `kernel` ("amx": amx_attention.c, "fma": fma_attention.c, "one_order":
    fma_attention.c with fma_decode's scores, d across lanes) over keys
    read straight out of one pool layer: k_buf, v_buf [S, KVH, D] fp32 or bf16 (contiguous), key j at slot
    slots[j] (int64 [m]: the request's cached prefix, then its new tokens, whose K/V are already written). No
    gathered copy of the prefix: a short chunk after a long one costs one pass over its keys."""
    name = f"{kernel}_attention"
    if q.dim() != 3 or k_buf.dim() != 3 or v_buf.shape != k_buf.shape or slots.dim() != 1:
        raise ValueError(f"{name} takes q [n, H, D], k, v [slots, KVH, D] and slots [m], got "
                         f"{tuple(q.shape)}, {tuple(k_buf.shape)}, {tuple(v_buf.shape)}, {tuple(slots.shape)}")
    n, h, d = q.shape
    m, kvh = slots.shape[0], k_buf.shape[1]
    fits, binding = KERNELS.get(kernel, (None, None))
    if fits is None:
        raise ValueError(f"attention_pool: kernel {kernel!r}; choose amx, fma or one_order (prefill_kernel picks "
                         f"amx or fma for this CPU; one_order is fma with fma_decode's arithmetic)")
    if not fits(q.device, h, kvh, d) or k_buf.shape[2] != d:
        need = "AMX, head_dim a multiple of 32" if kernel == "amx" else "AVX-512 or AVX2, head_dim a multiple of 16"
        raise ValueError(f"{name} does not fit {h} heads over {kvh} KV heads of size {d} here (needs {need} up to "
                         f"{MAX_D}, whole head groups); use torch's attention")
    if m < n:
        raise ValueError(f"{name} needs at least as many keys as queries (their own), got {m} < {n}")
    kv_bf16 = k_buf.dtype is torch.bfloat16
    if (q.dtype is not F32 or not q.is_cpu or not (k_buf.dtype is F32 or kv_bf16) or v_buf.dtype is not k_buf.dtype
            or not (k_buf.is_cpu and v_buf.is_cpu and k_buf.is_contiguous() and v_buf.is_contiguous())):
        raise ValueError(f"{name} takes fp32 CPU q, k, v (a pool layer may be bf16, contiguous), got "
                         f"{q.dtype}, {k_buf.dtype}, {v_buf.dtype} on {q.device}, {k_buf.device}, {v_buf.device}")
    if slots.dtype is not torch.int64 or not slots.is_cpu:
        raise ValueError(f"{name} takes int64 CPU slots, got {slots.dtype} on {slots.device}")
    if m and (int(slots.min()) < 0 or int(slots.max()) >= k_buf.shape[0]):
        raise ValueError(f"{name}: slots must lie in 0 .. {k_buf.shape[0] - 1} (the pool layer's rows)")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"{name} takes a positive finite scale (1/sqrt(head_dim) as a rule), got {scale!r}")
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    slots = slots.contiguous()
    out = torch.empty((n, h, d), dtype=torch.float32)
    getattr(built(), binding)(q.data_ptr(), q.stride(0), k_buf.data_ptr(), v_buf.data_ptr(), int(kv_bf16),
                              slots.data_ptr(), out.data_ptr(), n, m, h, kvh, d, float(scale))
    return out


def fma_decode(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor, lens: torch.Tensor,
               scale: float) -> torch.Tensor:
    """Decode rows on fma_attention.c's arithmetic: q [R, H, D] fp32 (one query per request, at position
    lens[r] - 1) over keys slots[r, :lens[r]] of one pool layer -> [R, H, D]. Each row is the bits
    attention_pool("one_order", ...) gives that query as a chunk of one, so a token's attention does not depend on
    whether it was decoded or prefilled (NativeLlama.one_order)."""
    r, h, d = q.shape
    kvh = k_buf.shape[1] if k_buf.dim() == 3 else 0
    if not fma_attention_fits(q.device, h, kvh, d) or k_buf.shape[2] != d:
        raise ValueError(f"fma_decode does not fit {h} heads over KV heads {tuple(k_buf.shape[1:])} here "
                         f"(needs AVX-512 or AVX2, head_dim a multiple of 16 up to {MAX_D}, whole head groups)")
    if (q.dtype is not F32 or not q.is_cpu or v_buf.shape != k_buf.shape or v_buf.dtype is not k_buf.dtype
            or k_buf.dtype not in (F32, torch.bfloat16) or not (k_buf.is_contiguous() and v_buf.is_contiguous())):
        raise ValueError(f"fma_decode takes fp32 CPU q and one contiguous fp32 or bf16 pool layer, got {q.dtype}, "
                         f"{k_buf.dtype} {tuple(k_buf.shape)}, {v_buf.dtype} {tuple(v_buf.shape)}")
    if (slots.dtype is not torch.int64 or slots.dim() != 2 or slots.shape[0] != r or not slots.is_contiguous()
            or lens.dtype is not torch.int64 or lens.shape != (r,) or not lens.is_contiguous()):
        raise ValueError(f"fma_decode takes contiguous int64 slots [{r}, Lmax] and lens [{r}], got {slots.dtype} "
                         f"{tuple(slots.shape)}, {lens.dtype} {tuple(lens.shape)}")
    if r and (int(lens.min()) < 1 or int(lens.max()) > slots.shape[1]
              or int(slots.min()) < 0 or int(slots.max()) >= k_buf.shape[0]):
        raise ValueError(f"fma_decode: each row's keys must number 1 .. {slots.shape[1]} and its slots lie in "
                         f"0 .. {k_buf.shape[0] - 1}")
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    out = torch.empty((r, h, d), dtype=F32)
    built().fma_decode(q.data_ptr(), q.stride(0), k_buf.data_ptr(), v_buf.data_ptr(),
                       int(k_buf.dtype is torch.bfloat16), slots.data_ptr(), slots.shape[1], lens.data_ptr(),
                       out.data_ptr(), h * d, r, h, kvh, d, float(scale))
    return out
