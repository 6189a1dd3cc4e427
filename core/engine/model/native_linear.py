"""Linear: one (possibly fused) projection of the native Llama-family forward in the model's numerics (fp32, bf16,
weight-only int8), and which kernel runs it: for int8 on a CPU the C kernels of w8_x16.c, panel_gemm.c and w8a16_gemm.c, chosen by the
number of rows (a decode step's few, a prefill chunk's many) so that every choice adds the same exact products."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from core.engine.model import native_int8, native_kernels

# From AMX_MIN_ROWS rows an int8 projection runs on AMX tiles where the CPU has them (w8_amx_gemm), else from
# PANEL_MIN_ROWS on weight panels with AVX-512 (w8_panel_gemm); below it the FMA kernel (w8_gemv), whose every row
# costs its own pass of int8 -> fp32 work over the weights (~0.6-1 ms a row for SmolLM2) where the tiles' price is
# flat up to 32 rows: one step's projections, all 30 layers, 5.3 / 12.4 / 16.6 / 21.2 / 30.8 ms at 1 / 8 / 12 / 16 /
# 24 rows on the FMA kernel against 13.8-14.7 ms on the tiles (bench_int8_gemm.py --only step-rows;
# benchmarks/README.md, "mixed steps").
# With a16 (w8a16_gemm's exact integer sums, the CPU default) every row count runs its panels, and from
# PANEL_MIN_ROWS rows, where the CPU has AMX-INT8, w8a16_amx_gemm: the same sums, the same bits, on int8 tiles.
AMX_MIN_ROWS = 12
PANEL_MIN_ROWS = 32


def many_rows(a16: bool = False) -> int:
    """The rows from which an int8 projection leaves the FMA kernel (for the tiles or the panels); with `a16`
    (w8a16_gemm for every row count, AMX or not) the panels' threshold: no tiles."""
    return AMX_MIN_ROWS if native_kernels.amx_available() and not a16 else PANEL_MIN_ROWS


def a16_here(device: torch.device) -> bool:
    """Whether int8 runs `w8a16_gemm` on this device: int16 activations and exact integer sums on AVX512-VNNI or
    AVX2 (twice the FMA kernels' products a cycle), on every CPU, AMX too. Why on AMX: the tiles' x16 products are
    exact but their fp32 sums are not in the FMA kernel's order, so a token's K/V moved with the rows it was
    computed beside, and greedy tokens could part cache on from cache off (the capacity lab's random-id prompts
    did, 1 of 6, on an Intel Xeon with AMX); w8a16_gemm's integer sums are the same bits in any batch (and its
    decode rows were 1.4-1.7x the FMA kernel's there). With AMX a prompt chunk's rows run `w8a16_amx_gemm`: the same
    integer sums on int8 tiles, so the tiles' speed is kept too."""
    return device.type == "cpu" and native_int8.w8a16_enabled()


def a16_fits(weight: torch.Tensor) -> bool:
    """Whether this int8 weight [N, K] fits `w8a16_gemm`'s panels: a CPU tensor, N a multiple of 16, K even (pairs
    of k per VPDPWSSD or VPMADDWD), and the kernel built here (AVX512-VNNI or AVX2)."""
    return (weight.is_cpu and weight.shape[0] % 16 == 0 and weight.shape[1] % 2 == 0
            and native_int8.w8a16_available())


def one_order_fits(weight: torch.Tensor) -> bool:
    """Whether this int8 weight [N, K] can run every row count on `w8_panel_gemm` here (a CPU with AVX-512 and
    without AMX): one order of sums, so a row's output is the same bits in a decode step, a mixed step and a
    prefill chunk (panel_gemm.c). With AMX the prefill rows go to the tiles, whose order FMAs cannot reproduce."""
    return not native_kernels.amx_available() and native_int8.panels_fit(weight)


class Linear:
    """y = x @ W^T (+ b) for one (possibly fused) projection, in the model's numerics.

    kind "fp32": the weight stored transposed ([in, out]); `x @ Wt` measured 1.5-1.9x faster than
        F.linear's `x @ W^T` for one row on this CPU (MKL's gemv on the transposed layout), the same
        for many rows.
    kind "bf16": bf16 weight [out, in] and bf16 activations (oneDNN, AVX512-BF16).
    kind "int8": weight-only int8, symmetric, one fp32 scale per output channel (w ~= q * scale),
        fp32 activations. On a CPU the decode-sized batches run the FMA kernel `w8_gemv` and, from
        AMX_MIN_ROWS rows where the CPU has AMX, the prefill-sized ones run `w8_amx_gemm` on AMX tiles. Both
        round x to 16 significant bits first (`native_int8.x16`: exactly two bf16 for the tiles, and a
        product with an int8 that is exact in fp32), so both add exactly the products x16[k] * q[n, k] and
        differ in the order of the fp32 sums only: how a prompt was chunked or cached moves its K/V by that
        rounding alone, and cache on == cache off held within the mode (benchmarks/README.md,
        "Numerics"; one bf16 per x and bf16(q * scale) gave 42/50). The AMX kernel reads the weights as
        bf16 tiles (`tiles`), made on the first prefill (twice the int8 bytes). Without AMX (with AVX-512) the
        prefill-sized batches run `w8_panel_gemm` (FMAs on weight panels, `panels`: the same products again,
        ~2x the GEMV kernel at 1,024 rows). Where the CPU has AVX512-VNNI or AVX2 (AMX or not), NativeLlama asks for
        `a16` (a16_here says why): every row count then runs `w8a16_gemm` on the panels (int16 activations, one
        scale a row, exact integer sums: 1.9x the panels' speed at 1,024 rows on AMD Zen 4, and the same bits in any
        batch), and with AMX-INT8 a prompt chunk's rows `w8a16_amx_gemm` (`quads`: the same sums on int8 tiles).
        Without the C kernels `_weight_int8pack_mm` runs on bf16 activations; on other devices a bf16 GEMM on the
        dequantized weight (bf16(q * scale)) runs every row.
    """

    __slots__ = ("kind", "weight", "scales", "bias", "dense", "dense_bias", "out_features", "tiles", "panels",
                 "matrix", "silu_tiles", "a16", "quads")

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], kind: str, one_order: bool = False,
                 a16: bool = False) -> None:
        weight = weight.detach()
        self.kind = kind
        self.out_features = weight.shape[0]
        self.dense = self.dense_bias = None
        self.tiles: Optional[torch.Tensor] = None   # int8: the bf16 AMX tiles, packed on the first prefill
        self.panels: Optional[torch.Tensor] = None  # int8 without AMX: the weight panels, packed likewise
        self.matrix: Optional[native_int8.Int8Matrix] = None   # int8 on a CPU: what the decode kernel reads
        self.silu_tiles: Optional[tuple] = None   # gate_up, int8 with AMX: interleaved tiles, scales, bias (silu_mul)
        self.a16 = False   # int8 on AVX512-VNNI or AVX2: every row on w8a16_gemm (int16 rows, exact integer sums)
        self.quads: Optional[torch.Tensor] = None   # a16 with AMX: the int8 tiles a prompt chunk's rows run on
        if kind == "int8":
            w = weight.float()
            scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
            self.weight = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
            self.scales = scales.contiguous()
            self.bias = None if bias is None else bias.detach().float().contiguous()
            self.a16 = a16 and a16_fits(self.weight)   # the caller asked where a16_here()
            if self.a16:   # every row count reads these (pack_pairs: the panels with k in pairs), and only these
                self.panels = native_int8.pack_pairs(self.weight)
                if native_int8.a16_amx_fits(self.weight):   # and from PANEL_MIN_ROWS rows, these (same bits)
                    self.quads = native_int8.pack_quads(self.weight)
                self.weight = None
            elif weight.device.type == "cpu" and one_order and one_order_fits(self.weight):
                self.panels = native_int8.pack_panels(self.weight)   # every row count reads these, and only
                self.weight = None   # these: the [N, K] copies, never read, were 134 MB of the default model's
            elif weight.device.type == "cpu":
                self.matrix = native_int8.Int8Matrix(self.weight, self.scales, self.bias)
            else:
                self.dense = (self.weight.float() * scales[:, None]).to(torch.bfloat16).contiguous()
                self.dense_bias = None if bias is None else bias.detach().to(torch.bfloat16)
        elif kind == "fp32":
            self.weight = weight.float().t().contiguous()          # [in, out]
            self.scales = None
            self.bias = None if bias is None else bias.detach().float().contiguous()
        elif kind == "bf16":
            self.weight = weight.to(torch.bfloat16).contiguous()
            self.scales = None
            self.bias = None if bias is None else bias.detach().to(torch.bfloat16).contiguous()
        else:
            raise ValueError(f"unknown weight kind {kind!r}")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        kind = self.kind
        if kind == "fp32":
            if self.bias is None:
                return torch.matmul(x, self.weight)
            return torch.addmm(self.bias, x, self.weight)
        if kind == "bf16":
            return F.linear(x, self.weight, self.bias)
        if self.a16:   # a prompt chunk's rows on AMX tiles where they are: w8a16_gemm's bits, ~3x its panels' speed
            if self._on_quads(x):
                return native_int8.w8a16_amx_gemm(x, self.quads, self.scales, self.bias)
            return native_int8.w8a16_gemm(x, self.panels, self.scales, self.bias)
        if self.dense is None:
            if native_kernels.available():
                rows = x.shape[0]
                if self._on_tiles(x):
                    if self.tiles is None:
                        self.tiles = native_int8.pack_amx(self.weight)
                    return native_int8.w8_amx_gemm(x, self.tiles, self.scales, self.bias)
                if self.matrix is None or (rows >= PANEL_MIN_ROWS and native_int8.panels_fit(self.weight)):
                    if self.panels is None:
                        self.panels = native_int8.pack_panels(self.weight)
                    return native_int8.w8_panel_gemm(x, self.panels, self.scales, self.bias)
                return self.matrix.gemv(x)
            y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.weight,
                                                   self.scales.to(torch.bfloat16)).float()
            return y if self.bias is None else y.add_(self.bias)
        return F.linear(x.to(torch.bfloat16), self.dense, self.dense_bias).float()

    def decode_pointers(self) -> tuple[int, int, int]:
        """(weights, scales, bias or 0) addresses for decode_layers.c: the panels where every row runs on them
        (one order, a16), else w8_gemv's matrix; valid while this projection lives."""
        if self.matrix is None and self.panels is not None:
            return (self.panels.data_ptr(), self.scales.data_ptr(), native_kernels.ptr(self.bias))
        if self.matrix is None:
            raise ValueError("decode_pointers: only an int8 projection on a CPU with the C kernels has them")
        return self.matrix.pointers

    def _on_tiles(self, x: torch.Tensor) -> bool:
        """Whether these rows of an int8 projection run on AMX tiles (prefill-sized, whole tiles, AMX here; never
        with one order, whose panels are all it keeps)."""
        return x.shape[0] >= AMX_MIN_ROWS and self.weight is not None and native_int8.amx_fits(self.weight)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for a fused gate_up projection (fp32 rows on a CPU with the C kernels). Prefill-sized
        int8 batches on AMX tiles do it in the GEMM's epilogue (`w8a16_amx_gemm_silu` with a16, `w8_amx_gemm_silu`
        with x16: the same bits, without writing and rereading the [M, 2I] gate_up output, ~1 ms a layer at 1,024
        rows); the rest is this projection, then `native_kernels.silu_mul`."""
        if self._on_quads(x):
            return native_int8.w8a16_amx_gemm_silu(x, self.quads, self.scales, self.bias)
        if self.kind == "int8" and self.dense is None and native_kernels.available() and self._on_tiles(x):
            if self.silu_tiles is None:
                il = native_int8.interleave_gate_up
                self.silu_tiles = (native_int8.pack_amx(il(self.weight)), il(self.scales),
                                   None if self.bias is None else il(self.bias))
            return native_int8.w8_amx_gemm_silu(x, *self.silu_tiles)
        return native_kernels.silu_mul(self(x))

    def _on_quads(self, x: torch.Tensor) -> bool:
        """Whether rows x run w8a16_amx_gemm: a16 with AMX-INT8 quads, a prompt chunk's PANEL_MIN_ROWS or more."""
        return self.quads is not None and x.shape[0] >= PANEL_MIN_ROWS

    def nbytes(self) -> int:
        parts = (self.weight, self.scales, self.bias, self.dense, self.tiles, self.panels, self.quads,
                 *(self.silu_tiles or ()))
        return sum(t.numel() * t.element_size() for t in parts if t is not None)
