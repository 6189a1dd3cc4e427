"""Prefill attention in FMAs (pool_attention.attention_pool("fma", ...), fma_attention.c), what the int8 model's
prompt chunks attend on where the CPU has no AMX: within fp32 rounding of exact attention, and a query row's
result the same bits however its prompt was chunked or cached (a short chunk's work items are key segments, a long
one's query blocks: both give a row the same bits). It runs on any CPU whose kernels built with AVX-512 (AMX ones
included) or AVX2 (the lanes path on 8 lanes, fma_avx2.h); where the build has neither it must refuse."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.engine.model import native_kernels, pool_attention
from tests.engine.model.require_kernels import require_kernels


@pytest.fixture(autouse=True)
def kernels():
    require_kernels()
    if not pool_attention.fma_attention_fits(torch.device("cpu"), 9, 3, 64):
        with pytest.raises(ValueError, match="use torch's attention"):
            pool_attention.attention_pool("fma", torch.zeros(1, 9, 64), torch.zeros(2, 3, 64), torch.zeros(2, 3, 64),
                                              torch.tensor([1]), 0.125)
        pytest.skip("these kernels were built without AVX-512 or AVX2: fma_attention refuses, as checked")


def pool_case(n: int, m: int, heads: int, kv_heads: int, d: int, seed: int, bf16: bool = False):
    """(q [n, H, D], k_buf, v_buf [S, KVH, D], slots [m]): keys in random pool order, slot 0 unused."""
    g = torch.Generator().manual_seed(seed)
    k_buf, v_buf = torch.randn(m + 9, kv_heads, d, generator=g) * 2, torch.randn(m + 9, kv_heads, d, generator=g)
    if bf16:
        k_buf, v_buf = k_buf.bfloat16(), v_buf.bfloat16()
    slots = torch.randperm(m + 8, generator=g)[:m] + 1
    return torch.randn(n, heads, d, generator=g), k_buf, v_buf, slots


def exact(q, k_buf, v_buf, slots) -> torch.Tensor:
    """Causal attention in float64 over the slots' keys, query i at position m - n + i."""
    n, m, d = q.shape[0], slots.shape[0], q.shape[2]
    k, v = k_buf[slots].double(), v_buf[slots].double()
    mask = torch.ones(n, m, dtype=torch.bool).tril(m - n)
    o = F.scaled_dot_product_attention(q.double().transpose(0, 1)[None], k.transpose(0, 1)[None],
                                       v.transpose(0, 1)[None], attn_mask=mask, scale=d ** -0.5, enable_gqa=True)
    return o[0].transpose(0, 1)


@pytest.mark.parametrize("n,m,heads,kv_heads,d,bf16", [
    (100, 100, 9, 3, 64, False),     # a fresh prompt, several query blocks
    (37, 300, 9, 3, 64, False),      # a chunk after a prefix
    (1, 65, 4, 4, 16, False),        # one query (a short chunk: key segments as work items)
    (200, 1300, 8, 2, 128, True),    # past 512 keys: segments merged; a bf16 pool
    (3, 2000, 9, 3, 64, False),      # a 3-token chunk deep in a long prompt
    (1, 1, 9, 3, 64, False),         # one key
    (40, 90, 6, 3, 80, False),       # head_dim 80 (a multiple of 16, not of 32)
])
@pytest.mark.parametrize("kernel", ["fma", "one_order"])
def test_fma_attention_is_exact_attention_to_fp32_rounding(n, m, heads, kv_heads, d, bf16, kernel):
    q, k_buf, v_buf, slots = pool_case(n, m, heads, kv_heads, d, seed=n * 7 + m, bf16=bf16)
    out = pool_attention.attention_pool(kernel, q, k_buf, v_buf, slots, d ** -0.5)
    assert out.shape == (n, heads, d) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), exact(q, k_buf.float(), v_buf.float(), slots), atol=3e-6, rtol=0)


@pytest.mark.parametrize("kernel", ["fma", "one_order"])
@pytest.mark.parametrize("m,n", [(1500, 100), (1300, 1300), (600, 64)])
def test_a_rows_result_is_the_same_bits_however_its_prompt_is_chunked(m, n, kernel):
    """The last n queries whole, then in chunks of 1, 2, 3, 31, 32, 33 ... tokens, each after the keys before it:
    short chunks run as key segments, long ones as query blocks (one order: a one-query chunk reads its keys in
    place, more are packed), and every row comes out the same bits."""
    q, k_buf, v_buf, slots = pool_case(n, m, 9, 3, 64, seed=m + n)
    whole = pool_attention.attention_pool(kernel, q, k_buf, v_buf, slots, 0.125)
    pieces, at, sizes = [], 0, [1, 2, 3, 31, 32, 33, 5, 100, 7]
    while at < n:
        c = min(sizes[len(pieces) % len(sizes)], n - at)
        pieces.append(pool_attention.attention_pool(kernel, q[at:at + c], k_buf, v_buf, slots[:m - n + at + c], 0.125))
        at += c
    assert torch.equal(torch.cat(pieces), whole)
    if kernel == "one_order":
        other = pool_attention.attention_pool("fma", q, k_buf, v_buf, slots, 0.125)
        if native_kernels.built().panel_gemm_fast():   # AVX-512: "fma" keys across lanes, another order
            assert not torch.equal(other, whole) and float((other - whole).abs().max()) < 1e-5
        else:                                          # AVX2: every chunk on the lanes path, one order
            assert torch.equal(other, whole)


@pytest.mark.parametrize("kernel", ["fma", "one_order"])
def test_a_short_chunk_after_many_segments_is_the_same_bits_on_any_thread_count(kernel, request):
    """A 3-token chunk after 3,000 keys (6 segments): with segments enough for every thread a work item is a
    segment and its KV heads in turn (one stream from memory), with fewer (more threads) a (KV head, segment);
    either way every row is the bits the whole prompt gives it."""
    previous = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(previous))
    m, n = 3000, 3
    q, k_buf, v_buf, slots = pool_case(m, m, 9, 3, 64, seed=11)
    whole = pool_attention.attention_pool(kernel, q, k_buf, v_buf, slots, 0.125)[-n:]
    for threads in (1, 2, 4, 8):   # 6 segments: by segment up to 3 threads, by (KV head, segment) from 4
        torch.set_num_threads(threads)
        chunk = pool_attention.attention_pool(kernel, q[-n:], k_buf, v_buf, slots, 0.125)
        assert torch.equal(chunk, whole), threads


def test_bad_inputs_are_refused_with_what_to_change():
    q, k_buf, v_buf, slots = pool_case(4, 8, 9, 3, 64, seed=1)
    with pytest.raises(ValueError, match="at least as many keys as queries"):
        pool_attention.attention_pool("fma", q, k_buf, v_buf, slots[:3], 0.125)
    with pytest.raises(ValueError, match="slots must lie in 0 .. 16"):
        pool_attention.attention_pool("fma", q, k_buf, v_buf, slots + 100, 0.125)
    with pytest.raises(ValueError, match="positive finite scale"):
        pool_attention.attention_pool("fma", q, k_buf, v_buf, slots, float("nan"))
    with pytest.raises(ValueError, match="head_dim a multiple of 16"):
        pool_attention.attention_pool("fma", torch.zeros(1, 9, 24), torch.zeros(2, 3, 24), torch.zeros(2, 3, 24),
                                          torch.tensor([1]), 0.2)
    with pytest.raises(ValueError, match="fp32 CPU q"):
        pool_attention.attention_pool("fma", q.double(), k_buf, v_buf, slots, 0.125)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32-pool", "bf16-pool"])
def test_decode_rows_get_the_bits_a_chunk_of_one_query_gets(bf16):
    """fma_decode (one order's decode rows): each row of a batch of rows of different lengths (within a key block,
    on block and segment edges, several segments) is the bits attention_pool("one_order", ...) gives that query as
    a chunk of one and as the last row of a longer chunk, and within fp32 rounding of exact attention."""
    lens = [1, 5, 31, 32, 33, 511, 512, 513, 1500]
    q, k_buf, v_buf, _ = pool_case(len(lens), 1500, 9, 3, 64, 11, bf16)
    g = torch.Generator().manual_seed(12)
    slots = torch.zeros(len(lens), 1500, dtype=torch.int64)
    for i, n in enumerate(lens):
        slots[i, :n] = torch.randperm(1508, generator=g)[:n] + 1
    out = pool_attention.fma_decode(q, k_buf, v_buf, slots, torch.tensor(lens), 0.125)
    for i, n in enumerate(lens):
        alone = pool_attention.attention_pool("one_order", q[i:i + 1], k_buf, v_buf, slots[i, :n], 0.125)
        chunk = torch.cat([torch.randn(min(n, 40) - 1, 9, 64, generator=g), q[i:i + 1]])
        last = pool_attention.attention_pool("one_order", chunk, k_buf, v_buf, slots[i, :n], 0.125)[-1:]
        assert torch.equal(out[i:i + 1], alone) and torch.equal(alone, last), n
        torch.testing.assert_close(out[i:i + 1].double(), exact(q[i:i + 1], k_buf, v_buf, slots[i, :n]),
                                   atol=2e-6, rtol=2e-5)


def test_decode_rows_refuse_what_the_kernel_would_misread():
    q, k_buf, v_buf, _ = pool_case(2, 40, 9, 3, 64, 13)
    slots, lens = (torch.arange(80) % 48 + 1).view(2, 40), torch.tensor([40, 7])
    cases = [
        ((q.double(), k_buf, v_buf, slots, lens), "fp32 CPU q"),
        ((q, k_buf, v_buf.bfloat16(), slots, lens), "fp32 CPU q"),
        ((q, k_buf, v_buf, slots.int(), lens), "int64 slots"),
        ((q, k_buf, v_buf, slots, lens[:1]), "int64 slots"),
        ((q, k_buf, v_buf, slots, torch.tensor([41, 7])), "must number 1 .. 40"),
        ((q, k_buf, v_buf, slots, torch.tensor([0, 7])), "must number 1 .. 40"),
        ((q, k_buf, v_buf, slots + 100, lens), "lie in 0 .. 48"),
        ((torch.zeros(2, 8, 64), k_buf, v_buf, slots, lens), "does not fit 8 heads"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            pool_attention.fma_decode(*args, 0.125)
