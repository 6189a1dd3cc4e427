"""The int8 projections' kernels (w8_x16.c, panel_gemm.c), their checked wrappers and the weight layouts they read:
`w8_gemv` for a decode step's few rows, `w8_amx_gemm` on AMX tiles and `w8_panel_gemm` on weight panels for a
prefill's many (with one order, NativeLlama.one_order, for every row count). All three round the activations to 16 significant bits first (`x16`), so every product
x16[k] * q[n, k] is exact in fp32 and the kernels differ only in the order of their sums. native_linear.Linear
picks one per call by its row count."""
from __future__ import annotations

from typing import Optional

import torch

from core.engine.model import native_kernels
from core.engine.model.native_kernels import F32

X16_MIN_EXP = 16  # x16 below 2^(X16_MIN_EXP - 127) = 2^-111 flushes to zero (w8_x16.c X16_MIN_EXP)


def set_w8_prefetch(nbytes: int) -> int:
    """How far ahead `w8_gemv` prefetches the weight rows, in bytes (4096 by default; 0: not at all); returns the
    previous setting. For benchmarks: bench_int8_gemm.py times a decode step's projections both ways in one
    process."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 <= nbytes <= 1 << 20:
        raise ValueError(f"set_w8_prefetch takes a whole number of bytes from 0 to 1 MiB, got {nbytes!r}")
    return int(native_kernels.built().set_w8_prefetch(nbytes)) if native_kernels.available() else 0


# As w8_x16.c's w8_gemv runs rows when built with AVX-512 (`gemv_blocks`): one at a time up to GEMV_ROW_MAX
# rows (w8_row_max's default; set_w8_row_max moves it, for benchmarks), from there in blocks of GEMV_BLOCK_ROWS rows
# (x 4 channels) where K is a multiple of 16, so 3 rows cost what 4 do. Built for AVX2, every row costs the same.
GEMV_ROW_MAX = 2
GEMV_BLOCK_ROWS = 4


def gemv_blocks(k: int) -> bool:
    """Whether w8_gemv runs rows of K inputs in blocks of GEMV_BLOCK_ROWS (the kernels built with AVX-512)."""
    return k % 16 == 0 and native_kernels.available() and bool(native_kernels.built().panel_gemm_fast())


def set_w8_row_max(rows: int) -> int:
    """Up to how many rows `w8_gemv` runs one output channel at a time before blocks of 4 channels x 4 rows (2 by
    default, measured); returns the previous setting. For benchmarks: bench_int8_gemm.py times decode batches
    both ways in one process. The two add the same products in other orders (fp32 rounding apart)."""
    if isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows <= 1 << 16:
        raise ValueError(f"set_w8_row_max takes a whole number of rows from 0 to 65536, got {rows!r}")
    return int(native_kernels.built().set_w8_row_max(rows)) if native_kernels.available() else 0


def check_rows(name: str, x: torch.Tensor, k: int) -> None:
    """The kernels read raw pointers: a wrong dtype, device or width would be read as garbage, so refuse it."""
    if x.dtype is not F32 or x.dim() != 2 or not x.is_cpu or x.shape[1] != k:
        raise ValueError(f"{name} takes fp32 CPU rows [M, {k}], got {x.dtype} {tuple(x.shape)} on {x.device}")


class Int8Matrix:
    """int8 weights w [N, K] with one fp32 scale (and bias) per output channel, checked once: `gemv` then checks
    only the rows. Linear holds one per int8 projection (a decode step makes ~120 calls; checking the weights on
    every call cost ~2 us each)."""

    __slots__ = ("weight", "scales", "bias", "n", "k", "_ptrs")

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        if (weight.dtype is not torch.int8 or weight.dim() != 2 or not weight.is_contiguous()
                or not weight.is_cpu):
            raise ValueError(f"w8_gemv takes contiguous int8 CPU weights [N, K], "
                             f"got {weight.dtype} {tuple(weight.shape)} on {weight.device}")
        self.n, self.k = weight.shape
        native_kernels.check_channels("w8_gemv", self.n, scales, bias)
        self.weight, self.scales, self.bias = weight, scales, bias       # kept alive for the pointers below
        self._ptrs = (weight.data_ptr(), scales.data_ptr(), native_kernels.ptr(bias))

    @property
    def pointers(self) -> tuple[int, int, int]:
        """(weight, scales, bias or 0) addresses, for C code that runs `w8_gemv` itself (decode_layers.c); valid
        while this matrix lives."""
        return self._ptrs

    def gemv(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] fp32 -> [M, N] fp32: x16 @ (w * scales)^T (+ bias), on the FMA kernel (`w8_gemv`)."""
        if x.dtype is not F32 or x.dim() != 2 or x.shape[1] != self.k or not x.is_cpu:
            check_rows("w8_gemv", x, self.k)
        x = x.contiguous()
        m = x.shape[0]
        y = torch.empty((m, self.n), dtype=torch.float32)
        w, s, b = self._ptrs
        native_kernels.built().w8_gemv(x.data_ptr(), w, s, b, y.data_ptr(), m, self.n, self.k)
        return y


def w8_gemv(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x [M, K] fp32, w [N, K] int8, scales [N] fp32 -> [M, N] fp32: x16 @ (w * scales)^T (+ bias),
    x16 being x rounded to 16 significant bits (so every product is exact in fp32; `x16` below)."""
    return Int8Matrix(w, scales, bias).gemv(x)


def x16(x: torch.Tensor) -> torch.Tensor:
    """x (fp32) rounded to 16 significant bits, to nearest, ties to even (inf and nan kept): the activations all
    int8 kernels multiply. Why 16: a 16-bit significand times an int8 weight is exact in fp32, and it is exactly
    two bf16, which AMX tiles multiply exactly; the rounding (at most 2^-16 relative) is far below the int8 weights'.
    Results below X16_MIN (2^-111) in magnitude become a signed zero (there the low bf16 would be subnormal, which
    AMX reads as zero); a finite x that rounds past FLT_MAX becomes inf."""
    u = x.float().contiguous().view(torch.int32)
    r = (u + 0x7F + ((u >> 8) & 1)) & -256
    r = torch.where((r & 0x7F800000) < (X16_MIN_EXP << 23), u & -(1 << 31), r)
    return torch.where((u & 0x7F800000) == 0x7F800000, u, r).view(torch.float32)


def amx_fits(w: torch.Tensor) -> bool:
    """Whether the int8 weights `w` [N, K] can run on AMX tiles here: AMX available, a CPU tensor, both sizes
    multiples of 32 (whole tiles)."""
    return w.is_cpu and w.shape[0] % 32 == 0 and w.shape[1] % 32 == 0 and native_kernels.amx_available()


def pack_amx(w: torch.Tensor) -> torch.Tensor:
    """int8 weights [N, K] (N, K multiples of 32) as the bf16 tiles `w8_amx_gemm` reads (int8 is exact in bf16):
    [N/16, K/32, 16 pairs of k, 16 columns, 2]. Twice the int8 bytes: made on a model's first AMX use."""
    n, k = w.shape
    if n % 32 or k % 32:
        raise ValueError(f"w8_amx_gemm needs both weight sizes multiples of 32, got {n} x {k}")
    return w.to(torch.bfloat16).view(n // 16, 16, k // 32, 16, 2).permute(0, 2, 3, 1, 4).contiguous()


def interleave_gate_up(t: torch.Tensor) -> torch.Tensor:
    """gate_up's rows (or scales, bias) [2I, ...] as [gate 0-15, up 0-15, gate 16-31, up 16-31, ...] (I a multiple of
    16): a 32-column block of `w8_amx_gemm_silu` then holds the gate and up channels that its epilogue multiplies."""
    two_i = t.shape[0]
    if two_i % 32:
        raise ValueError(f"gate_up needs its intermediate size a multiple of 16, got {two_i // 2}")
    i = two_i // 2
    return torch.stack([t[:i].reshape(i // 16, 16, *t.shape[1:]), t[i:].reshape(i // 16, 16, *t.shape[1:])],
                       dim=1).reshape(t.shape).contiguous()


def panels_fit(w: torch.Tensor) -> bool:
    """Whether prefill rows of the int8 weights `w` [N, K] should run `w8_panel_gemm`: a CPU tensor, N a multiple
    of 16, and kernels built with AVX-512 (built for AVX2 it ran slower than `w8_gemv`, w8_x16.c)."""
    return (w.is_cpu and w.shape[0] % 16 == 0 and native_kernels.available()
            and bool(native_kernels.built().panel_gemm_fast()))


PANEL_GROUP = 8   # panels side by side (panel_gemm.c's GROUP)


def pack_panels(w: torch.Tensor) -> torch.Tensor:
    """int8 weights [N, K] (N a multiple of 16) as the panels `w8_panel_gemm` reads: panels of 16 output channels,
    PANEL_GROUP of them side by side for each k (a group's bytes [K, 128], the last group as wide as the channels
    left), so a decode row streams a group in one pass. The same bytes as `w`, reordered; shaped [N/16, K, 16] so
    that the wrapper can tell them from `w` itself."""
    n, k = w.shape
    if n % 16:
        raise ValueError(f"w8_panel_gemm needs the output size a multiple of 16, got {n}")
    width = PANEL_GROUP * 16
    groups = [w[g:g + width].t().contiguous().view(-1) for g in range(0, n, width)]
    return torch.cat(groups).view(n // 16, k, 16)


def pack_pairs(w: torch.Tensor) -> torch.Tensor:
    """int8 weights [N, K] (N a multiple of 16, K even) as the panels `w8a16_gemm` reads: pack_panels' groups with k
    in pairs, a k pair of a panel 32 bytes (w[k][j], w[k + 1][j]) for its 16 channels j (what VPDPWSSD multiplies
    with a pair of activations). The same bytes as `w`, reordered; shaped [N/16, K/2, 32]."""
    n, k = w.shape
    if n % 16 or k % 2:
        raise ValueError(f"w8a16_gemm needs the output size a multiple of 16 and the input size even, got [{n}, {k}]")
    width = PANEL_GROUP * 16
    groups = [w[g:g + width].t().reshape(k // 2, 2, -1).transpose(1, 2).contiguous().view(-1)
              for g in range(0, n, width)]
    return torch.cat(groups).view(n // 16, k // 2, 32)


def w8_panel_gemm(x: torch.Tensor, panels: torch.Tensor, scales: torch.Tensor,
                  bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x [M, K] fp32 -> x16 @ (w * scales)^T (+ bias), [M, N] fp32, with FMAs on weight panels (`panels` =
    pack_panels(w)): the products `w8_gemv` adds, summed in another order, at GEMM speed for many rows on a CPU
    without AMX tiles."""
    return _on_panels("w8_panel_gemm", x, panels, 1, scales, bias)


def _on_panels(name: str, x: torch.Tensor, panels: torch.Tensor, pair: int, scales: torch.Tensor,
               bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The checks and the call both panel kernels share: `panels` [N/16, K/pair, 16 * pair] (pack_panels for
    pair 1, pack_pairs for 2) fit rows x [M, K], the channels fit scales and bias."""
    if x.dtype is not F32 or x.dim() != 2:
        raise ValueError(f"{name} takes fp32 rows [M, K], got {x.dtype} {tuple(x.shape)}")
    m, k = x.shape
    if (panels.dtype is not torch.int8 or panels.dim() != 3 or panels.shape[1] * pair != k
            or panels.shape[2] != 16 * pair or not panels.is_contiguous()):
        raise ValueError(f"weights {tuple(panels.shape)} {panels.dtype} do not fit rows of {k}; "
                         f"make them with {'pack_pairs' if pair == 2 else 'pack_panels'}")
    check_rows(name, x, k)
    n = panels.shape[0] * 16
    native_kernels.check_channels(name, n, scales, bias)
    x = x.contiguous()
    y = torch.empty((m, n), dtype=torch.float32)
    getattr(native_kernels.built(), name)(x.data_ptr(), panels.data_ptr(), scales.data_ptr(),
                                          native_kernels.ptr(bias), y.data_ptr(), m, n, k)
    return y


A16_MAX = 16383   # w8a16_gemm.c's int16 range: |xq| <= 2^14 - 1
A16_TINY = 2.0 ** -100   # a row whose largest value is below this counts as zero (A16_MAX / it would overflow)
A16_ROW_BLOCK = 2   # w8a16_gemm's few-rows blocks: rows in pairs, each pair one pass over the weights


def w8a16_available() -> bool:
    """Whether `w8a16_gemm` runs here: the kernels built with AVX512-VNNI (VPDPWSSD), or with AVX2 and without
    AVX-512 (VPMADDWD; AVX-512 without VNNI keeps its FMA panels, measured there)."""
    return native_kernels.available() and bool(native_kernels.built().w8a16_ready())


_a16_enabled = True


def set_w8a16(flag: bool) -> bool:
    """Let models built from now on use `w8a16_gemm` where it runs (True, the default) or keep the x16 kernels
    (False); returns the previous setting. Tests and benchmarks compare the two arithmetics with it."""
    global _a16_enabled
    previous, _a16_enabled = _a16_enabled, bool(flag)
    return previous


def w8a16_enabled() -> bool:
    """w8a16_available() and not turned off by set_w8a16."""
    return _a16_enabled and w8a16_available()


def w8a16_gemm(x: torch.Tensor, pairs: torch.Tensor, scales: torch.Tensor,
               bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x [M, K] fp32 -> [M, N] fp32 with int16 activations (w8a16_gemm.c): each row rounded once to int16 with one
    scale (xq = round(x * A16_MAX / max|x|)), the integer sums of xq * q exact, then times (max|x| / A16_MAX) *
    scales (+ bias). A row's output is the same bits in any batch; `pairs` = pack_pairs(w)."""
    if not w8a16_available():
        raise RuntimeError("w8a16_gemm needs the kernels built with AVX512-VNNI, or AVX2 on a CPU without AVX-512 "
                           "(this CPU or compiler has neither); use w8_panel_gemm or w8_gemv")
    return _on_panels("w8a16_gemm", x, pairs, 2, scales, bias)


def a16_amx_fits(w: torch.Tensor) -> bool:
    """Whether `w8a16_amx_gemm` can run the int8 weights `w` [N, K] here: AMX-INT8 tiles granted (the kernels built
    with them, and a16 on), a CPU tensor, N a multiple of 32 and K of 64 (whole tiles)."""
    return (w.is_cpu and w.dim() == 2 and w.shape[0] % 32 == 0 and w.shape[1] % 64 == 0
            and native_kernels.amx_available() and w8a16_available()
            and bool(native_kernels.built().w8a16_amx_ready()))


def pack_quads(w: torch.Tensor) -> torch.Tensor:
    """int8 weights [N, K] (N a multiple of 16, K of 64) as the int8 tiles `w8a16_amx_gemm` reads: [N/16, K/64, 16
    quads of k, 16 channels, 4] (a tile row holds 4 adjacent k of each of 16 channels, what TDPBSSD multiplies with
    4 activations). The same bytes as `w`, reordered."""
    n, k = w.shape
    if w.dtype is not torch.int8 or n % 16 or k % 64:
        raise ValueError(f"w8a16_amx_gemm needs int8 weights [N, K] with N a multiple of 16 and K of 64, got "
                         f"{w.dtype} [{n}, {k}]")
    return w.reshape(n // 16, 16, k // 64, 16, 4).permute(0, 2, 3, 1, 4).contiguous()


def w8a16_amx_gemm(x: torch.Tensor, quads: torch.Tensor, scales: torch.Tensor,
                   bias: Optional[torch.Tensor]) -> torch.Tensor:
    """`w8a16_gemm`'s result, the same bits, on AMX tiles (`quads` = pack_quads(w)): each int16 activation split in
    two int8 parts, the tiles' int8 products summed exactly, `w8a16_gemm`'s epilogue. For a prompt chunk's rows on a
    CPU with AMX (its decode rows stay on `w8a16_gemm`'s panels)."""
    return _a16_amx("w8a16_amx_gemm", x, quads, scales, bias, silu=False)


def w8a16_amx_gemm_silu(x: torch.Tensor, quads: torch.Tensor, scales: torch.Tensor,
                        bias: Optional[torch.Tensor]) -> torch.Tensor:
    """silu(gate) * up [M, I] of gate_up ([2I, K]: gate rows, then up) on AMX tiles, the same bits as `w8a16_gemm`
    then `silu_mul`, without the [M, 2I] output; `quads` = pack_quads(w), as `w8a16_amx_gemm` reads."""
    return _a16_amx("w8a16_amx_gemm_silu", x, quads, scales, bias, silu=True)


def _a16_amx(name: str, x: torch.Tensor, quads: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor],
             silu: bool) -> torch.Tensor:
    """The checks and the call of both AMX-INT8 kernels."""
    if quads.dtype is not torch.int8 or quads.dim() != 5 or quads.shape[2:] != (16, 16, 4) or not quads.is_contiguous():
        raise ValueError(f"weights {tuple(quads.shape)} {quads.dtype} are not int8 tiles; make them with pack_quads")
    n, k = quads.shape[0] * 16, quads.shape[1] * 64
    if n % 32:
        raise ValueError(f"{name} needs the output size a multiple of 32, got {n}")
    check_rows(name, x, k)
    native_kernels.check_channels(name, n, scales, bias)
    if not (native_kernels.amx_available() and native_kernels.built().w8a16_amx_ready()):
        raise RuntimeError(f"{name} needs AMX-INT8 tiles (this CPU, compiler or kernel setting has none); "
                           f"use w8a16_gemm")
    x = x.contiguous()
    y = torch.empty((x.shape[0], n // 2 if silu else n), dtype=torch.float32)
    getattr(native_kernels.built(), name)(x.data_ptr(), quads.data_ptr(), scales.data_ptr(),
                                          native_kernels.ptr(bias), y.data_ptr(), x.shape[0], n, k)
    return y


def w8_amx_gemm(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x [M, K] fp32 -> x16 @ (w * scales)^T (+ bias), [M, N] fp32, on AMX tiles; `packed` = pack_amx(w). Each
    row's x16 is exactly two bf16 (hi + lo), so the tiles add exactly the products `w8_gemv` adds, in another
    order: fp32 rounding apart, a row's result does not depend on the batch size."""
    return _amx_gemm("w8_amx_gemm", x, packed, scales, bias, 1)


def w8_amx_gemm_silu(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                     bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x [M, K] fp32 -> silu(gate) * up, [M, I], for gate_up's weights, scales and bias interleaved by
    `interleave_gate_up` (`packed` = pack_amx of the interleaved weights): the bits of `w8_amx_gemm` on the plain
    weights followed by `native_kernels.silu_mul`, without writing the [M, 2I] gate_up output."""
    return _amx_gemm("w8_amx_gemm_silu", x, packed, scales, bias, 2)


def _amx_gemm(name: str, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
              bias: Optional[torch.Tensor], per_out: int) -> torch.Tensor:
    if not native_kernels.amx_available():
        raise RuntimeError("AMX tiles are not available here (the CPU, the compiler or Linux lacks them); "
                           "use w8_gemv, which adds the same products")
    if x.dtype is not F32 or x.dim() != 2:
        raise ValueError(f"{name} takes fp32 rows [M, K], got {x.dtype} {tuple(x.shape)}")
    m, k = x.shape
    n = packed.shape[0] * 16
    if (packed.dtype != torch.bfloat16 or packed.dim() != 5 or packed.shape[1] * 32 != k
            or packed.shape[0] % 2 or tuple(packed.shape[2:]) != (16, 16, 2) or not packed.is_contiguous()):
        raise ValueError(f"packed weights {tuple(packed.shape)} {packed.dtype} do not fit rows of {k}; "
                         f"make them with pack_amx")
    check_rows(name, x, k)
    native_kernels.check_channels(name, n, scales, bias)
    x = x.contiguous()
    xb = torch.empty((-(-m // 32) * 32, 2, k), dtype=torch.bfloat16)      # hi, lo of each row
    y = torch.empty((m, n // per_out), dtype=torch.float32)
    getattr(native_kernels.built(), name)(x.data_ptr(), xb.data_ptr(), packed.data_ptr(), scales.data_ptr(),
                                          native_kernels.ptr(bias), y.data_ptr(), m, n, k)
    return y
