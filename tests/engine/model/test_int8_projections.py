"""The int8 projections (w8_x16.c `w8_gemv` and `w8_amx_gemm`), the fused elementwise kernels and the
long-extend attention (native_layers.attend_prefixed), on SmolLM2's shapes, against float64 written out.

Why the numbers must agree this closely: a token's K/V are computed by whichever kernel its batch size picks
(a decode step: the FMA kernel; a prefill chunk: AMX tiles), and cache on == cache off holds only if the two
add the same products, x16[k] times an int8 weight, differing in the order of the fp32 sums. x16 is x rounded
to 16 significant bits: exact products in fp32, and exactly two bf16 (hi + lo) for the tiles; with one bf16 per
x the tiles would be ~1e-3 off."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from core.engine.model import native_int8, native_kernels
from core.engine.model.forward_batch import ForwardBatch
from core.engine.model.native_layers import AttentionPlan, attend_prefixed
from core.engine.model.native_linear import AMX_MIN_ROWS, PANEL_MIN_ROWS, Linear
from tests.engine.model.require_kernels import require_kernels

SHAPES = [(960, 576), (3072, 576), (576, 1536)]   # SmolLM2-135M: QKV, gate+up, down
ROWS = [1, 3, 8, 9, 31, 32, 40, 100]


@pytest.fixture(autouse=True)
def kernels():
    require_kernels()


def weights(n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    return w, torch.rand(n, generator=g) * 0.01 + 1e-3, torch.randn(n, generator=g)


def round16(x: torch.Tensor) -> torch.Tensor:
    """x to 16 significant bits, to nearest, ties to even, written with frexp (not the kernels' bit trick);
    results below 2^-111 in magnitude flushed to a signed zero, from 2^128 up (past fp32) made inf."""
    m, e = torch.frexp(x.double())                     # x = m * 2^e, 0.5 <= |m| < 1
    r = torch.ldexp(torch.round(m * 2.0 ** 16), (e - 16).double())
    r = torch.where(r.abs() < 2.0 ** -111, r * 0.0, r)
    return torch.where(r.abs() >= 2.0 ** 128, r * math.inf, r)


def exact(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x16 @ (w * scales)^T + bias in float64: what both kernels compute up to fp32 sums."""
    return (round16(x) @ w.double().t()) * scales.double() + bias.double()


def test_activations_are_rounded_to_16_significant_bits_to_nearest_even_keeping_inf_and_nan():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 10
    assert torch.equal(native_int8.x16(x).double(), round16(x))
    one = 1.0 + 2.0 ** -15                              # the last bit x16 keeps, just above 1
    ties = torch.tensor([1.0 + 2.0 ** -16, one + 2.0 ** -16, -(1.0 + 2.0 ** -16), (1.0 + 2.0 ** -16) * 2.0 ** -100])
    assert native_int8.x16(ties).tolist() == [1.0, one + 2.0 ** -15, -1.0, 2.0 ** -100]
    above_a_tie = torch.tensor([1.0 + 2.0 ** -16 + 2.0 ** -20, 3.0 * 2.0 ** -17])     # not ties: to nearest
    assert native_int8.x16(above_a_tie).tolist() == [one, 3.0 * 2.0 ** -17]
    special = native_int8.x16(torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0]))
    assert special[:2].tolist() == [float("inf"), -float("inf")] and special[2].isnan()
    assert special[3:].tolist() == [0.0, 0.0] and math.copysign(1, special[4]) == -1
    assert float((native_int8.x16(x) - x).abs().div(x.abs()).max()) <= 2.0 ** -16


def test_activations_too_small_for_two_normal_bf16_flush_to_zero_and_past_flt_max_round_to_inf():
    """Below 2^-111 the low bf16 of x16 would be subnormal (AMX reads it as zero): flushed, sign kept."""
    x = torch.tensor([2.0 ** -111, (2 - 2.0 ** -17) * 2.0 ** -112, (2 - 2.0 ** -15) * 2.0 ** -112, -2.0 ** -112,
                      1e-40, 3.4028235e38, -3.4028235e38, 3.4027e38])
    y = native_int8.x16(x)
    assert y.tolist() == [2.0 ** -111, 2.0 ** -111, 0.0, 0.0, 0.0, math.inf, -math.inf, round16(x[7:]).item()]
    assert [math.copysign(1, v) for v in y[2:5].tolist()] == [1, -1, 1]
    assert torch.equal(y.double(), round16(x))


def edge_rows(k: int) -> torch.Tensor:
    """Rows of finite values where the rounding has corners: ties, carries into the exponent, values around
    2^-111, subnormals, the largest finite values, both signs."""
    g = torch.Generator().manual_seed(k)
    tiny = torch.tensor([2.0 ** -111, (2 - 2.0 ** -17) * 2.0 ** -112, (2 - 2.0 ** -15) * 2.0 ** -112, 1e-40,
                         (1 + 2.0 ** -8 + 2.0 ** -15) * 2.0 ** -111, 9.2864e-37, 1.0 + 2.0 ** -16, 2 - 2.0 ** -17])
    rows = [torch.randn(k, generator=g) * 10.0 ** e for e in (-36, -33, -3, 0, 30, 37)]
    rows.append(tiny.repeat(k // 8 + 1)[:k] * torch.where(torch.rand(k, generator=g) < 0.5, -1.0, 1.0))
    return torch.stack(rows)


def test_the_kernels_round_exactly_as_x16_in_vector_lanes_and_in_the_scalar_tail():
    """Identity weights make each kernel output its x16 itself: bit for bit what the Python x16 gives. K = 40:
    the FMA kernel rounds 16 values per vector and the last ones one by one."""
    k = 40
    eye = torch.eye(k, dtype=torch.int8)
    x = edge_rows(k)
    y = native_int8.w8_gemv(x, eye, torch.ones(k), torch.zeros(k))
    assert torch.equal(y, native_int8.x16(x)) and torch.equal(y.double(), round16(x))


def test_every_int8_kernel_gives_the_same_bits_at_the_edges_of_x16():
    """AMX tiles, weight panels and the FMA kernel on identity weights: the same x16 (no subnormal low bf16 that
    AMX would drop, no nan from inf - inf), and inf and nan reach the outputs the same way."""
    k = 64
    eye, ones, zeros = torch.eye(k, dtype=torch.int8), torch.ones(k), torch.zeros(k)
    x = torch.cat([edge_rows(k), torch.zeros(2, k)])
    x[-2, 5], x[-1, 9] = math.inf, math.nan
    want = native_int8.w8_gemv(x, eye, ones, zeros)
    assert torch.equal(want[:-2], native_int8.x16(x[:-2]))
    assert want[-2, 5] == math.inf and want[-1, 9].isnan()
    kernels = [native_int8.w8_panel_gemm(x, native_int8.pack_panels(eye), ones, zeros)]
    if native_kernels.amx_available():
        kernels.append(native_int8.w8_amx_gemm(x, native_int8.pack_amx(eye), ones, zeros))
    for y in kernels:
        torch.testing.assert_close(y, want, rtol=0, atol=0, equal_nan=True)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", ROWS)
def test_the_fma_kernel_sums_the_exact_products_in_fp32(n, k, m):
    w, s, b = weights(n, k, m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(100 + m)) * 3
    y = native_int8.w8_gemv(x, w, s, b)
    assert rel(y, exact(x, w, s, b)) < 1e-6
    unrounded = (x.double() @ w.double().t()) * s.double() + b.double()
    assert 1e-6 < rel(y, unrounded) < 5e-5          # x16 is measurably not x, and costs little


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", ROWS)
def test_amx_tiles_add_the_same_products_as_the_fma_kernel(n, k, m):
    w, s, b = weights(n, k, m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(200 + m))
    if not native_kernels.amx_available():   # a CPU without AMX-BF16: the FMA kernel runs every row
        with pytest.raises(RuntimeError, match="use w8_gemv"):
            native_int8.w8_amx_gemm(x, native_int8.pack_amx(w), s, b)
        return
    y = native_int8.w8_amx_gemm(x, native_int8.pack_amx(w), s, b)
    assert y.shape == (m, n)
    assert rel(y, exact(x, w, s, b)) < 1e-6
    assert rel(y, native_int8.w8_gemv(x, w, s, b)) < 2e-6
    one_bf16 = (x.bfloat16().double() @ w.double().t()) * s.double() + b.double()
    assert rel(y, one_bf16) > 1e-4           # what rows rounded to one bf16 would have given: far off


@pytest.mark.parametrize("m", [1, 8, 9])   # the one-channel rows path, and blocks of four channels
def test_prefetching_the_weights_changes_no_bit(m):
    w, s, b = weights(3072, 576, m)
    x = torch.randn(m, 576, generator=torch.Generator().manual_seed(m))
    with_prefetch = native_int8.w8_gemv(x, w, s, b)
    previous = native_int8.set_w8_prefetch(0)
    try:
        without = native_int8.w8_gemv(x, w, s, b)
    finally:
        assert native_int8.set_w8_prefetch(previous) == 0
    assert previous == 4096 and torch.equal(with_prefetch, without)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", ROWS)
def test_weight_panels_add_the_same_products_as_the_fma_kernel(n, k, m):
    """The prefill kernel of a CPU without AMX: the exact products again, summed one k after another per lane."""
    w, s, b = weights(n, k, m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(300 + m))
    panels = native_int8.pack_panels(w)
    width = 16 * native_int8.PANEL_GROUP      # a group of panels: [K, 128] bytes, the last one narrower
    last = (n - 1) // width * width
    assert panels.shape == (n // 16, k, 16)
    assert torch.equal(panels.view(-1)[:k * width].view(k, width), w[:width].t())
    assert torch.equal(panels.view(-1)[last * k:].view(k, n - last), w[last:].t())
    y = native_int8.w8_panel_gemm(x, panels, s, b)
    assert y.shape == (m, n)
    assert rel(y, exact(x, w, s, b)) < 3e-6
    assert rel(y, native_int8.w8_gemv(x, w, s, b)) < 4e-6


@pytest.mark.parametrize("n,k", SHAPES)
def test_weight_panels_give_a_row_the_same_bits_whatever_the_rows_beside_it(n, k):
    """One order of sums for every row count (decode blocks of 1-2 rows x 8 panels, prefill blocks of 12 rows):
    a row alone, among 1-40 rows, or at any place of a block is the same bits."""
    w, s, b = weights(n, k, 7)
    x = torch.randn(41, k, generator=torch.Generator().manual_seed(301))
    panels = native_int8.pack_panels(w)
    alone = torch.cat([native_int8.w8_panel_gemm(x[i:i + 1], panels, s, b) for i in range(41)])
    for m in (2, 3, 5, 12, 13, 31, 32, 33, 41):
        assert torch.equal(native_int8.w8_panel_gemm(x[:m], panels, s, b), alone[:m]), m
    assert torch.equal(native_int8.w8_panel_gemm(x[7:40], panels, s, b), alone[7:40])


def test_weight_panels_refuse_sizes_and_rows_that_do_not_fit():
    w, s, b = weights(40, 64, 0)
    with pytest.raises(ValueError, match="multiple of 16"):
        native_int8.pack_panels(w)
    w, s, b = weights(64, 64, 0)
    with pytest.raises(ValueError, match="make them with pack_panels"):
        native_int8.w8_panel_gemm(torch.randn(40, 96), native_int8.pack_panels(w), s, b)
    with pytest.raises(ValueError, match="fp32 rows"):
        native_int8.w8_panel_gemm(torch.randn(40, 64).double(), native_int8.pack_panels(w), s, b)


def test_the_int8_kernels_refuse_what_they_would_misread_and_take_any_layout_of_rows():
    w, s, b = weights(64, 64, 0)
    panels = native_int8.pack_panels(w)
    x = torch.randn(5, 64)
    with pytest.raises(ValueError, match="make them with pack_panels"):
        native_int8.w8_panel_gemm(x, panels.transpose(0, 1).contiguous().transpose(0, 1), s, b)
    for short in ((s[:48], b), (s, b[:63])):
        with pytest.raises(ValueError, match="must be 64 contiguous fp32 CPU values"):
            native_int8.w8_panel_gemm(x, panels, *short)
        with pytest.raises(ValueError, match="must be 64 contiguous fp32 CPU values"):
            native_int8.w8_gemv(x, w, *short)
    with pytest.raises(ValueError, match=r"fp32 CPU rows \[M, 64\]"):
        native_int8.w8_gemv(x.double(), w, s, b)
    with pytest.raises(ValueError, match="contiguous int8"):
        native_int8.w8_gemv(x, w.t(), s, b)
    strided = torch.randn(64, 5).t()
    assert torch.equal(native_int8.w8_gemv(strided, w, s, b), native_int8.w8_gemv(strided.contiguous(), w, s, b))
    assert native_int8.w8_panel_gemm(torch.empty(0, 64), panels, s, b).shape == (0, 64)


def test_without_amx_a_prefill_runs_on_weight_panels_and_keeps_its_rows():
    """set_amx(False): what a CPU without AMX runs. From PANEL_MIN_ROWS rows the projection packs its panels (with
    AVX-512; else the FMA kernel runs them too) and agrees with the same rows one at a time to fp32 rounding."""
    g = torch.Generator().manual_seed(6)
    lin = Linear(torch.randn(960, 576, generator=g) * 0.05, torch.randn(960, generator=g), "int8")
    x = torch.randn(PANEL_MIN_ROWS + 9, 576, generator=g)
    previous = native_kernels.set_amx(False)
    try:
        assert not native_kernels.amx_available()
        many = lin(x)
    finally:
        native_kernels.set_amx(previous)
    assert lin.tiles is None and (lin.panels is not None) == native_int8.panels_fit(lin.weight)
    for i in (0, 20, PANEL_MIN_ROWS + 8):
        assert rel(lin(x[i:i + 1])[0], many[i]) < 4e-6


def test_amx_tiles_refuse_sizes_that_are_not_whole_tiles_and_rows_that_do_not_fit():
    w, s, b = weights(48, 64, 0)
    with pytest.raises(ValueError, match="multiples of 32"):
        native_int8.pack_amx(w)
    w, s, b = weights(64, 64, 0)
    error = (ValueError, "make them with pack_amx") if native_kernels.amx_available() else (RuntimeError, "w8_gemv")
    with pytest.raises(error[0], match=error[1]):
        native_int8.w8_amx_gemm(torch.randn(40, 96), native_int8.pack_amx(w), s, b)
    if native_kernels.amx_available():
        with pytest.raises(ValueError, match="fp32 rows"):
            native_int8.w8_amx_gemm(torch.randn(40, 64).bfloat16(), native_int8.pack_amx(w), s, b)
        half = native_int8.pack_amx(torch.cat([w, w[:32]]))[:5].contiguous()      # 80 columns: not whole pairs
        short = native_int8.pack_amx(w)[:, :, :1].contiguous()                     # the tiles cut short
        for packed in (half, short):
            with pytest.raises(ValueError, match="make them with pack_amx"):
                native_int8.w8_amx_gemm(torch.randn(40, 64), packed, s, b)


def test_interleaving_gate_up_puts_16_gate_then_16_up_channels_side_by_side_and_refuses_odd_sizes():
    t = torch.arange(64)                                   # I = 32: gate 0..31, up 32..63
    assert native_int8.interleave_gate_up(t).tolist() == [*range(16), *range(32, 48), *range(16, 32), *range(48, 64)]
    rows = torch.arange(64 * 3).view(64, 3)
    assert torch.equal(native_int8.interleave_gate_up(rows)[16], rows[32])
    with pytest.raises(ValueError, match="multiple of 16"):
        native_int8.interleave_gate_up(torch.arange(48))


@pytest.mark.parametrize("m", [AMX_MIN_ROWS, 31, 33, 100])
@pytest.mark.parametrize("with_bias", [False, True])
def test_silu_in_the_gate_up_epilogue_gives_the_bits_of_the_projection_then_silu_mul(m, with_bias):
    """Linear.silu_mul on AMX rows (w8_amx_gemm_silu on interleaved tiles) against the unfused path it replaces:
    the gate_up projection, then native_kernels.silu_mul, bit for bit (rows past a 16-row tile included)."""
    g = torch.Generator().manual_seed(m)
    w = torch.randn(2 * 1536, 576, generator=g) * 0.05
    lin = Linear(w, torch.randn(2 * 1536, generator=g) if with_bias else None, "int8")
    x = torch.randn(m, 576, generator=g) * 3
    x[0, :5] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])   # non-finite rows too
    want = native_kernels.silu_mul(lin(x))
    got = lin.silu_mul(x)
    assert got.shape == (m, 1536)
    assert torch.equal(got[1:], want[1:]) and torch.equal(got[0].isnan(), want[0].isnan())
    assert torch.equal(got[0].nan_to_num(), want[0].nan_to_num())
    if native_kernels.amx_available():
        assert lin.silu_tiles is not None and lin.nbytes() > lin.weight.numel() * 3   # int8 + twice that in bf16
    few = lin.silu_mul(x[:AMX_MIN_ROWS - 1])                                       # below: the FMA kernel then silu_mul
    assert torch.equal(few[1:], native_kernels.silu_mul(lin(x[:AMX_MIN_ROWS - 1]))[1:])


def test_an_int8_projection_switches_kernels_at_amx_min_rows_without_moving_its_rows():
    """The same row computed alone (FMA kernel) and inside AMX_MIN_ROWS rows (AMX where present) agrees to fp32
    rounding: what lets a token's K/V not depend on the size of the batch it was computed in."""
    g = torch.Generator().manual_seed(5)
    lin = Linear(torch.randn(960, 576, generator=g) * 0.05, None, "int8")
    x = torch.randn(AMX_MIN_ROWS, 576, generator=g)
    many = lin(x)
    for i in (0, AMX_MIN_ROWS // 2, AMX_MIN_ROWS - 1):
        assert rel(lin(x[i:i + 1])[0], many[i]) < 2e-6
    assert rel(lin(x[:AMX_MIN_ROWS - 1]), many[:AMX_MIN_ROWS - 1]) < 2e-6


@pytest.mark.parametrize("prefix,n", [(1, 2), (7, 33), (300, 64), (64, 300)])
def test_a_long_extend_after_a_prefix_attends_like_one_masked_call(prefix, n):
    """attend_prefixed (prefix keys unmasked + own keys causal, merged by log-sum-exp) against float64 attention
    over prefix + own keys with the causal mask written out; slots in random pool order."""
    h, kvh, d, total = 9, 3, 64, prefix + n
    g = torch.Generator().manual_seed(prefix * 1000 + n)
    k_buf, v_buf = torch.randn(total + 20, kvh, d, generator=g), torch.randn(total + 20, kvh, d, generator=g)
    seq = torch.randperm(total + 19, generator=g)[:total] + 1
    batch = ForwardBatch.build([(list(range(n)), seq[:prefix], seq[prefix:])])
    plan = AttentionPlan.build(batch)
    assert plan.prefixed == (0, n, prefix)
    q = torch.randn(n, h, d, generator=g)
    k_new, v_new = k_buf[seq[prefix:]], v_buf[seq[prefix:]]
    out = attend_prefixed(plan.extends[0], prefix, q, k_new, v_new, k_buf, v_buf, 1 / math.sqrt(d))
    kk = k_buf[seq].double().repeat_interleave(h // kvh, dim=1).transpose(0, 1)     # [H, L, D]
    vv = v_buf[seq].double().repeat_interleave(h // kvh, dim=1).transpose(0, 1)
    visible = torch.arange(total)[None, :] <= prefix + torch.arange(n)[:, None]
    ref = F.scaled_dot_product_attention(q.double().transpose(0, 1), kk, vv, attn_mask=visible,
                                         scale=1 / math.sqrt(d)).transpose(0, 1)
    assert out.shape == (n, h, d)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=0)


def test_a_bf16_extend_after_a_prefix_comes_back_in_bf16():
    """A bf16 model's long extend after a cached prefix: the log-sum-exp merge runs in fp32, and its result must
    come back in bf16 (an fp32 result made the next projection fail, and every bf16 request after a prefix hit on
    a CPU aborted)."""
    h, kvh, d, prefix, n = 9, 3, 64, 40, 24
    g = torch.Generator().manual_seed(7)
    k_buf = torch.randn(prefix + n + 1, kvh, d, generator=g).bfloat16()
    v_buf = torch.randn(prefix + n + 1, kvh, d, generator=g).bfloat16()
    seq = torch.arange(1, prefix + n + 1)
    batch = ForwardBatch.build([(list(range(n)), seq[:prefix], seq[prefix:])])
    plan = AttentionPlan.build(batch)
    q = torch.randn(n, h, d, generator=g).bfloat16()
    out = attend_prefixed(plan.extends[0], prefix, q, k_buf[seq[prefix:]], v_buf[seq[prefix:]], k_buf, v_buf,
                          1 / math.sqrt(d))
    assert out.dtype == torch.bfloat16 and out.shape == (n, h, d)
    kk = k_buf[seq].double().repeat_interleave(h // kvh, dim=1).transpose(0, 1)
    vv = v_buf[seq].double().repeat_interleave(h // kvh, dim=1).transpose(0, 1)
    visible = torch.arange(prefix + n)[None, :] <= prefix + torch.arange(n)[:, None]
    ref = F.scaled_dot_product_attention(q.double().transpose(0, 1), kk, vv, attn_mask=visible,
                                         scale=1 / math.sqrt(d)).transpose(0, 1)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=0)   # bf16 outputs: 8 significant bits
