"""w8a16_gemm (w8a16_gemm.c): int8 weights times int16 activations on AVX512-VNNI (or AVX2), what int8 runs on a CPU
with either (and w8a16_amx_gemm, the same sums on AMX-INT8 tiles, for a prompt chunk's rows where the CPU has
them). Each row of x is rounded once to int16 with one scale, the integer sums are exact, and one epilogue scales
them: so the result is a formula, checked here bit for bit against torch's int64 arithmetic, and a row's output
cannot depend on the batch, the chunk or the kernel path it ran in."""
from __future__ import annotations

import pytest
import torch

from core.engine.model import native_int8, native_kernels
from core.engine.model.native_llama import NativeLlama
from tests.engine.model.require_kernels import require_kernels
from tests.engine.model.test_decode_layers import make_ref


def require_a16() -> None:
    """The kernels built with AVX512-VNNI or AVX2 alone, or (elsewhere) w8a16_gemm refuses with what to use instead."""
    require_kernels()
    if native_int8.w8a16_available():
        return
    q = torch.zeros(16, 32, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="AVX512-VNNI"):
        native_int8.w8a16_gemm(torch.zeros(1, 32), native_int8.pack_pairs(q), torch.ones(16), None)
    assert not NativeLlama.from_hf(make_ref(0), dtype="int8").a16
    pytest.skip("built with neither AVX512-VNNI nor AVX2 alone: w8a16_gemm refuses, and int8 keeps the x16 kernels")


def reference(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias) -> torch.Tensor:
    """The formula in torch: xq = round(x * A16_MAX / max|x|) (fp32, half to even), integer sums in int64, then
    (double)sum * ((double)max|x| / A16_MAX * scale) rounded once to fp32, plus bias."""
    amax = x.abs().amax(dim=1)
    inv = torch.tensor(float(native_int8.A16_MAX)) / amax
    xq = torch.round(x * inv[:, None]).clamp(-native_int8.A16_MAX, native_int8.A16_MAX).to(torch.int64)
    sums = xq @ q.to(torch.int64).t()
    sx = amax.double() / native_int8.A16_MAX
    y = (sums.double() * (sx[:, None] * scales.double()[None, :])).float()
    return y if bias is None else y + bias


def weights(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    scales = w.abs().amax(dim=1) / 127
    return torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8), scales


@pytest.mark.parametrize("m,k,n,with_bias", [(1, 576, 832, False), (2, 576, 832, True), (3, 1536, 576, True),
                                             (31, 576, 144, False), (32, 64, 48, True), (100, 1536, 576, False),
                                             (13, 2050, 48, True), (1, 3000, 16, False)])
def test_w8a16_gemm_is_the_exact_integer_sum_of_int16_rows_and_int8_weights(m, k, n, with_bias):
    """Decode rows (< 32: rows x 8 panels) and prefill rows (12-row blocks), K past the 1,024 products a 32-bit
    lane holds (summed in 64 bits), an outlier channel 50x the rest: the formula's bits exactly."""
    require_a16()
    q, scales = weights(n, k, seed=m + k)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 10
    x[:, 3] *= 50
    bias = torch.randn(n, generator=g) if with_bias else None
    y = native_int8.w8a16_gemm(x, native_int8.pack_pairs(q), scales, bias)
    assert torch.equal(y, reference(x, q, scales, bias))
    dense = x @ (q.float() * scales[:, None]).t() + (0 if bias is None else bias)
    assert (y - dense).abs().max() <= 2e-3 * dense.abs().max()   # int16 rows: ~2^-14 of a row's largest value


def test_a_rows_output_is_the_same_bits_in_any_batch_and_order():
    require_a16()
    q, scales = weights(96, 576, seed=1)
    pairs = native_int8.pack_pairs(q)
    x = torch.randn(70, 576, generator=torch.Generator().manual_seed(2))
    whole = native_int8.w8a16_gemm(x, pairs, scales, None)
    alone = torch.cat([native_int8.w8a16_gemm(x[i:i + 1], pairs, scales, None) for i in range(70)])
    perm = torch.randperm(70, generator=torch.Generator().manual_seed(3))
    shuffled = native_int8.w8a16_gemm(x[perm], pairs, scales, None)
    assert torch.equal(whole, alone) and torch.equal(shuffled, whole[perm])
    assert torch.equal(native_int8.w8a16_gemm(x[:33], pairs, scales, None), whole[:33])   # 33 rows: a block of 12


def test_a_row_with_nan_or_infinity_gives_nan_and_a_zero_row_gives_the_bias():
    """fp32 arithmetic would make NaN of such a row; int16 rounding must not turn it into finite garbage, nor touch
    the other rows. A row of subnormals (below A16_TINY) counts as zero, as x16 flushes them."""
    require_a16()
    q, scales = weights(32, 64, seed=4)
    bias = torch.randn(32, generator=torch.Generator().manual_seed(5))
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(6))
    x[1, 7], x[2, 0], x[3] = float("nan"), float("-inf"), 0.0
    x[4] = torch.randn(64, generator=torch.Generator().manual_seed(7)) * 1e-38   # subnormal: below A16_TINY
    y = native_int8.w8a16_gemm(x, native_int8.pack_pairs(q), scales, bias)
    assert torch.isnan(y[1]).all() and torch.isnan(y[2]).all()
    assert torch.equal(y[3], bias) and torch.equal(y[4], bias)
    assert torch.equal(y[0], reference(x[:1], q, scales, bias)[0])
    tiny = x[:1] * 2.0 ** -90   # small but above A16_TINY: scaled, not flushed
    assert torch.equal(native_int8.w8a16_gemm(tiny, native_int8.pack_pairs(q), scales, None),
                       reference(tiny, q, scales, None))


def test_w8a16_refuses_what_it_cannot_read_with_what_to_change():
    require_a16()
    q, scales = weights(32, 64, seed=7)
    pairs = native_int8.pack_pairs(q)
    with pytest.raises(ValueError, match="fp32 rows"):
        native_int8.w8a16_gemm(torch.zeros(2, 64, dtype=torch.float64), pairs, scales, None)
    with pytest.raises(ValueError, match="pack_pairs"):   # pack_panels' layout is another order of the same bytes
        native_int8.w8a16_gemm(torch.zeros(2, 64), native_int8.pack_panels(q), scales, None)
    with pytest.raises(ValueError, match="pack_pairs"):
        native_int8.w8a16_gemm(torch.zeros(2, 62), pairs, scales, None)
    with pytest.raises(ValueError, match="input size even"):
        native_int8.pack_pairs(torch.zeros(16, 33, dtype=torch.int8))
    with pytest.raises(ValueError):
        native_int8.w8a16_gemm(torch.zeros(2, 64), pairs, scales[:16], None)


@pytest.mark.parametrize("m,k,n", [(32, 576, 960), (33, 1536, 576), (100, 64, 32), (1, 576, 64), (47, 128, 3072)])
def test_w8a16_amx_gemm_gives_w8a16_gemms_bits_on_int8_tiles(m, k, n):
    """On AMX-INT8 tiles each int16 row is summed as two int8 parts (256 xh + xl), exactly, and stored by the
    panels' epilogue: w8a16_gemm's result bit for bit, rows with NaN, zeros or subnormals included, K past the
    1,024 products of a 32-bit lane, rows past a whole tile. Where the CPU has no AMX-INT8 it refuses and says what
    to use instead."""
    require_a16()
    q, scales = weights(n, k, seed=m + n)
    quads = native_int8.pack_quads(q)
    g = torch.Generator().manual_seed(k)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 10
    x[:, 3] *= 50
    if m > 3:
        x[1, 2], x[2] = float("nan"), 0.0
        x[3] *= 1e-38
    bias = torch.randn(n, generator=g)
    if not native_int8.a16_amx_fits(q):
        assert not native_kernels.amx_available() or not native_kernels.built().w8a16_amx_ready()
        with pytest.raises(RuntimeError, match="AMX-INT8 tiles"):
            native_int8.w8a16_amx_gemm(x, quads, scales, bias)
        return
    pairs = native_int8.pack_pairs(q)
    for b in (bias, None):
        y = native_int8.w8a16_amx_gemm(x, quads, scales, b)
        assert torch.equal(y.view(torch.int32), native_int8.w8a16_gemm(x, pairs, scales, b).view(torch.int32))
    assert torch.equal(native_int8.w8a16_amx_gemm(x[-1:], quads, scales, None),
                       native_int8.w8a16_amx_gemm(x, quads, scales, None)[-1:])


@pytest.mark.parametrize("m,i,k,with_bias", [(32, 1536, 576, False), (33, 256, 192, True), (100, 64, 1536, True)])
def test_gate_up_on_int8_tiles_with_silu_in_the_epilogue_is_the_gemm_then_silu_mul_bit_for_bit(m, i, k, with_bias):
    """w8a16_amx_gemm_silu on gate_up's tiles (gate rows, then up) writes silu(gate) * up with silu_mul's operations
    on the outputs w8a16_gemm gives: the same bits as the two calls (a NaN row and a zero row included), or, without
    AMX-INT8, a refusal that says what to use."""
    require_a16()
    q, scales = weights(2 * i, k, seed=m + i)
    g = torch.Generator().manual_seed(i)
    x = torch.randn(m, k, generator=g) * 3
    x[1, 3], x[2] = float("nan"), 0.0
    bias = torch.randn(2 * i, generator=g) if with_bias else None
    tiles = native_int8.pack_quads(q)
    args = (scales, bias)
    if not native_int8.a16_amx_fits(q):
        with pytest.raises(RuntimeError, match="AMX-INT8 tiles"):
            native_int8.w8a16_amx_gemm_silu(x, tiles, *args)
        return
    y = native_int8.w8a16_amx_gemm_silu(x, tiles, *args)
    ref = native_kernels.silu_mul(native_int8.w8a16_gemm(x, native_int8.pack_pairs(q), scales, bias))
    assert y.shape == (m, i) and torch.equal(y.view(torch.int32), ref.view(torch.int32))


def test_pack_quads_and_w8a16_amx_gemm_refuse_what_they_cannot_read_with_what_to_change():
    require_a16()
    q, scales = weights(32, 64, seed=9)
    with pytest.raises(ValueError, match="K of 64"):
        native_int8.pack_quads(torch.zeros(32, 96, dtype=torch.int8))
    with pytest.raises(ValueError, match="K of 64"):
        native_int8.pack_quads(q.float())
    with pytest.raises(ValueError, match="pack_quads"):   # pack_pairs' layout is another order of the same bytes
        native_int8.w8a16_amx_gemm(torch.zeros(2, 64), native_int8.pack_pairs(q), scales, None)
    with pytest.raises(ValueError, match="multiple of 32"):
        native_int8.w8a16_amx_gemm(torch.zeros(2, 64), native_int8.pack_quads(q[:16]), scales[:16], None)
    with pytest.raises(ValueError, match="fp32 CPU rows"):
        native_int8.w8a16_amx_gemm(torch.zeros(2, 128), native_int8.pack_quads(q), scales, None)


def test_int8_runs_every_projection_on_w8a16_where_the_cpu_has_vnni_or_avx2(request):
    """AMX or not, every projection, the LM head included, holds only its pairs (and, with AMX-INT8, the int8 tiles
    a prompt chunk's rows run on: the same bits), and a decode step's one C call runs them too. (Before 2026-12-06
    a CPU with AMX kept the x16 arithmetic, whose tiles summed in another order than the decode kernel.)"""
    require_a16()
    native = NativeLlama.from_hf(make_ref(0), dtype="int8")
    lins = [lin for L in native.layers for lin in (L.qkv, L.o, L.gate_up, L.down)] + [native.lm_head]
    assert native.a16 and all(lin.a16 and lin.weight is None and lin.matrix is None for lin in lins)
    amx_int8 = native_kernels.amx_available() and bool(native_kernels.built().w8a16_amx_ready())
    assert [lin.quads is not None for lin in lins] == [amx_int8] * len(lins)
    assert native.decode_layers is not None
    previous = native_kernels.set_amx(False)
    request.addfinalizer(lambda: native_kernels.set_amx(previous))
    native = NativeLlama.from_hf(make_ref(0), dtype="int8")
    lins = [lin for L in native.layers for lin in (L.qkv, L.o, L.gate_up, L.down)] + [native.lm_head]
    assert native.a16 and all(lin.a16 and lin.quads is None for lin in lins)
    previous_a16 = native_int8.set_w8a16(False)
    try:
        assert not NativeLlama.from_hf(make_ref(0), dtype="int8").a16
    finally:
        native_int8.set_w8a16(previous_a16)
    assert not NativeLlama.from_hf(make_ref(0), dtype="fp32").a16


def test_many_threads_at_once_get_each_their_own_rows_bits():
    """The kernel lets the GIL go: eight Python threads multiplying their own rows at once, over and over, each get
    the bits a lone call gives."""
    import threading
    require_a16()
    q, scales = weights(832, 576, seed=8)
    pairs = native_int8.pack_pairs(q)
    xs = [torch.randn(rows, 576, generator=torch.Generator().manual_seed(rows)) for rows in (1, 2, 5, 12, 31, 33, 64, 97)]
    alone = [native_int8.w8a16_gemm(x, pairs, scales, None) for x in xs]
    wrong: list[int] = []

    def work(i: int) -> None:
        for _ in range(20):
            if not torch.equal(native_int8.w8a16_gemm(xs[i], pairs, scales, None), alone[i]):
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_cache_on_and_off_give_the_same_tokens_over_two_turns_with_a16_and_an_fp32_pool(request):
    """The default int8 model where a16 runs (fp32 pool): a second turn reuses the first turn's prompt and decoded
    K/V; the same tokens with the radix cache on and off."""
    from core.engine.model.runner import ModelRunner
    from tests.engine.model.test_one_order import two_turns
    require_a16()
    previous = native_kernels.set_amx(False)
    request.addfinalizer(lambda: native_kernels.set_amx(previous))
    runner = ModelRunner.from_hf(make_ref(5, max_position_embeddings=1024), device="cpu", impl="native",
                                 numerics="int8")
    assert runner.native.a16 and runner.native.kv_dtype is torch.float32
    outs = {on: two_turns(runner, on) for on in (True, False)}
    assert outs[True] == outs[False]
