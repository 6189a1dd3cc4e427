"""Prefill attention on AMX tiles (pool_attention.amx_attention, amx_attention.c): within ~2^-15 of exact attention
(each operand as two bf16), and a query row's result the same bits however its prompt was chunked or cached and
whatever rows share its tile. On a CPU without AMX the kernel refuses and the model keeps torch's attention."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.engine.model import native_kernels, pool_attention
from tests.engine.model.require_kernels import require_kernels


@pytest.fixture(autouse=True)
def kernels():
    require_kernels()


def qkv(n: int, m: int, heads: int, kv_heads: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, heads, d, generator=g) * 2, torch.randn(m, kv_heads, d, generator=g) * 2,
            torch.randn(m, kv_heads, d, generator=g))


def exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention in float64, query i at position m - n + i."""
    n, m = q.shape[0], k.shape[0]
    mask = torch.ones(n, m, dtype=torch.bool).tril(m - n)
    o = F.scaled_dot_product_attention(q.double().transpose(0, 1)[None], k.double().transpose(0, 1)[None],
                                       v.double().transpose(0, 1)[None], attn_mask=mask, scale=scale,
                                       enable_gqa=True)
    return o[0].transpose(0, 1)


def amx_here() -> bool:
    """Whether this CPU runs the kernel; where not, it must refuse (what the model then checks to keep torch's)."""
    if pool_attention.amx_attention_fits(torch.device("cpu"), 9, 3, 64):
        return True
    with pytest.raises(ValueError, match="use torch's attention"):
        pool_attention.amx_attention(*qkv(4, 4, 9, 3, 64, 0), 0.125)
    return False


SHAPES = [  # n, m, heads, kv heads, head_dim: SmolLM2's 9 over 3 at 64, MHA at 128, 32; tails of 16 and 32
    (1, 1, 9, 3, 64), (5, 5, 9, 3, 64), (37, 37, 9, 3, 64), (20, 100, 9, 3, 64), (100, 100, 4, 4, 128),
    (300, 333, 9, 3, 64), (64, 64, 2, 1, 32), (17, 545, 9, 3, 64),
    (3, 1100, 9, 3, 64), (40, 1500, 9, 3, 64), (11, 1025, 4, 4, 128)]   # keys over 2-3 segments of 512


@pytest.mark.parametrize("n,m,heads,kv_heads,d", SHAPES)
def test_amx_attention_is_within_2_to_the_minus_15_of_exact_causal_attention(n, m, heads, kv_heads, d):
    q, k, v = qkv(n, m, heads, kv_heads, d, n + m)
    if not amx_here():
        pytest.skip("this CPU has no AMX: amx_attention refuses, as checked")
    got = pool_attention.amx_attention(q, k, v, d ** -0.5)
    want = exact(q, k, v, d ** -0.5)
    assert got.shape == (n, heads, d) and got.dtype == torch.float32
    err = float((got.double() - want).abs().max() / v.abs().max())
    assert err < 2.0 ** -11                      # measured 1e-5 .. 5e-5 on these scores (|s| up to ~20)
    one_bf16 = exact(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), d ** -0.5)
    assert err < float((one_bf16 - want).abs().max() / v.abs().max()) / 8   # far better than plain bf16


def test_a_rows_result_is_the_same_bits_whole_in_chunks_or_after_a_cached_prefix():
    """Keys in blocks aligned to absolute positions, per-row running max and sum: a row does not see how its
    prompt was cut (cut points off the 16-row tiles and 32-key blocks on purpose)."""
    if not amx_here():
        pytest.skip("this CPU has no AMX: amx_attention refuses, as checked")
    q, k, v = qkv(300, 300, 9, 3, 64, 1)
    whole = pool_attention.amx_attention(q, k, v, 0.125)
    for cut in (1, 13, 47, 100, 299):
        rest = pool_attention.amx_attention(q[cut:], k, v, 0.125)
        head = pool_attention.amx_attention(q[:cut], k[:cut], v[:cut], 0.125)
        assert torch.equal(torch.cat([head, rest]), whole)
    for i in (0, 31, 150, 299):
        alone = pool_attention.amx_attention(q[i:i + 1], k[:i + 1], v[:i + 1], 0.125)
        assert torch.equal(alone[0], whole[i])


def test_strided_query_rows_are_read_in_place_like_contiguous_ones():
    if not amx_here():
        pytest.skip("this CPU has no AMX: amx_attention refuses, as checked")
    q, k, v = qkv(40, 40, 9, 3, 64, 2)
    fused = torch.cat([q.reshape(40, -1), torch.randn(40, 3 * 64 * 2)], dim=1)     # a QKV row's q columns
    strided = fused[:, :9 * 64].view(40, 9, 64)
    assert not strided.is_contiguous()
    assert torch.equal(pool_attention.amx_attention(strided, k, v, 0.125), pool_attention.amx_attention(q, k, v, 0.125))


def test_amx_attention_refuses_shapes_it_cannot_run_with_what_to_change():
    q, k, v = qkv(8, 8, 4, 2, 48, 3)
    with pytest.raises(ValueError, match="head_dim a multiple of 32"):
        pool_attention.amx_attention(q, k, v, 0.1)
    q, k, v = qkv(8, 4, 4, 2, 64, 3)
    error = "at least as many keys" if amx_here() else "use torch's attention"
    with pytest.raises(ValueError, match=error):
        pool_attention.amx_attention(q, k, v, 0.1)
    q, k, v = qkv(8, 8, 4, 2, 64, 3)
    with pytest.raises(ValueError, match="fp32 CPU q, k, v" if amx_here() else "use torch's attention"):
        pool_attention.amx_attention(q.double(), k, v, 0.1)
    with pytest.raises(ValueError, match=r"k, v \[m, KVH, D\]"):
        pool_attention.amx_attention(q, k, v[:, :1], 0.1)
    previous = native_kernels.set_amx(False)
    try:
        assert not pool_attention.amx_attention_fits(torch.device("cpu"), 4, 2, 64)
        with pytest.raises(ValueError, match="use torch's attention"):
            pool_attention.amx_attention(q, k, v, 0.1)
    finally:
        native_kernels.set_amx(previous)


def test_a_nan_query_or_key_stays_where_it_belongs():
    """A NaN query makes its own (row, head) NaN only; a NaN key makes NaN exactly the rows that see it. (A
    non-finite value V is another matter: 0 * inf is nan for the rows of its tiles that do not see it;
    amx_attention.c says so.)"""
    if not amx_here():
        pytest.skip("this CPU has no AMX: amx_attention refuses, as checked")
    q, k, v = qkv(40, 40, 9, 3, 64, 4)
    q[10, 4, 7] = float("nan")
    out = pool_attention.amx_attention(q, k, v, 0.125)
    assert out.isnan().any(-1).nonzero().tolist() == [[10, 4]]
    q, k, v = qkv(40, 40, 9, 3, 64, 4)
    k[20, 1, 3] = float("nan")
    bad = pool_attention.amx_attention(q, k, v, 0.125).isnan().any(-1)
    assert bad.nonzero().tolist() == [[r, h] for r in range(20, 40) for h in (3, 4, 5)]   # KV head 1's group


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keys_read_from_the_pool_by_slot_equal_the_same_keys_gathered(dtype):
    """amx_attention_pool reads K/V straight out of a pool layer in slot order (the model's path, no gathered
    copy): the same bits as amx_attention on those rows gathered; a bf16 pool's values widen exactly."""
    if not amx_here():
        pytest.skip("this CPU has no AMX: amx_attention refuses, as checked")
    g = torch.Generator().manual_seed(5)
    k_buf, v_buf = (torch.randn(300, 3, 64, generator=g).to(dtype) for _ in range(2))
    slots = torch.randperm(299, generator=g)[:150] + 1
    q = torch.randn(40, 9, 64, generator=g)
    got = pool_attention.amx_attention_pool(q, k_buf, v_buf, slots, 0.125)
    assert torch.equal(got, pool_attention.amx_attention(q, k_buf[slots].float(), v_buf[slots].float(), 0.125))
    with pytest.raises(ValueError, match="slots must lie in 0 .. 299"):
        pool_attention.amx_attention_pool(q, k_buf, v_buf, torch.cat([slots, torch.tensor([300])]), 0.125)
    with pytest.raises(ValueError, match="int64 CPU slots"):
        pool_attention.amx_attention_pool(q, k_buf, v_buf, slots.int(), 0.125)


def test_few_query_rows_and_many_give_the_same_bits_on_a_bf16_pool_too():
    """Up to FEW_QBLOCKS query blocks each work item packs its KV head's key blocks itself (no packed copy); more
    rows pack every block once for all: the same tiles, the same steps, so the same bits, also without lo halves."""
    if not amx_here():
        pytest.skip("this CPU has no AMX: amx_attention refuses, as checked")
    g = torch.Generator().manual_seed(8)
    k_buf, v_buf = (torch.randn(400, 3, 64, generator=g).bfloat16() for _ in range(2))
    slots = torch.randperm(399, generator=g)[:300] + 1
    q = torch.randn(300, 9, 64, generator=g)
    whole = pool_attention.amx_attention_pool(q, k_buf, v_buf, slots, 0.125)       # 10 query blocks
    for cut in (172, 250, 299):                                                      # the rest: 4, 2, 1 blocks
        rest = pool_attention.amx_attention_pool(q[cut:], k_buf, v_buf, slots, 0.125)
        assert torch.equal(rest, whole[cut:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [700, 1300])
def test_segments_of_keys_merge_to_the_same_bits_in_every_driver_and_chunking(m, dtype):
    """Keys in segments of 512 (a short chunk's work items: every core busy on 3 KV heads), each row's segments
    merged in order: 300 queries whole (the packed driver), then the same rows as chunks of 100 (few query blocks),
    15 (one state per head), 10 and 1 (the heads of a KV head sharing tiles) and alone, with rows on both sides of
    a segment's start (positions 400..699 cross 512; 1000..1299 cross 1024): the same bits every way."""
    if not amx_here():
        pytest.skip("this CPU has no AMX: amx_attention refuses, as checked")
    g = torch.Generator().manual_seed(m)
    k_buf, v_buf = (torch.randn(m + 100, 3, 64, generator=g).to(dtype) for _ in range(2))
    slots = torch.randperm(m + 99, generator=g)[:m] + 1
    q = torch.randn(300, 9, 64, generator=g) * 2
    whole = pool_attention.amx_attention_pool(q, k_buf, v_buf, slots, 0.125)
    for n in (100, 15, 10, 1):
        got = pool_attention.amx_attention_pool(q[300 - n:], k_buf, v_buf, slots, 0.125)
        assert torch.equal(got, whole[300 - n:]), n
        keys = m - 300 + 112 + n                      # the same n rows at positions 112.. of the chunk
        got = pool_attention.amx_attention_pool(q[112:112 + n], k_buf, v_buf, slots[:keys], 0.125)
        assert torch.equal(got, whole[112:112 + n]), n
    for i in (0, 111, 112, 299):                      # a row alone: its keys only
        alone = pool_attention.amx_attention_pool(q[i:i + 1], k_buf, v_buf, slots[:m - 300 + i + 1], 0.125)
        assert torch.equal(alone[0], whole[i]), i
    want = exact(q, k_buf[slots].float(), v_buf[slots].float(), 0.125)
    assert float((whole.double() - want).abs().max() / v_buf.float().abs().max()) < 2.0 ** -11


def test_a_rows_bits_do_not_depend_on_how_many_threads_run_it():
    """Work items are segments over every KV head, or (segment, KV head) where threads outnumber segments (1, 2 and 8
    threads over 5 segments take both ways): the items only divide the work, so the same bits every time."""
    if not amx_here():
        pytest.skip("this CPU has no AMX: amx_attention refuses, as checked")
    g = torch.Generator().manual_seed(11)
    k_buf, v_buf = (torch.randn(3000, 3, 64, generator=g) for _ in range(2))
    slots = torch.randperm(2999, generator=g)[:2500] + 1
    q = torch.randn(300, 9, 64, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        whole = pool_attention.amx_attention_pool(q, k_buf, v_buf, slots, 0.125)
        for t in (1, 2, 8):
            torch.set_num_threads(t)
            for n in (1, 10, 100):
                assert torch.equal(pool_attention.amx_attention_pool(q[300 - n:], k_buf, v_buf, slots, 0.125),
                                   whole[300 - n:]), (t, n)
    finally:
        torch.set_num_threads(threads)
