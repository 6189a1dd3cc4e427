"""Prefill attention in AVX-512 FMAs (native_kernels.attention_pool("fma", ...), fma_attention.c), what the int8 model's
prompt chunks attend on where the CPU has no AMX: within fp32 rounding of exact attention, and a query row's
result the same bits however its prompt was chunked or cached (a short chunk's work items are key segments, a long
one's query blocks: both give a row the same bits). It runs on any CPU whose kernels built with AVX-512, AMX ones
included; where the build has no AVX-512 it must refuse."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.engine.model import native_kernels
from tests.engine.model.require_kernels import require_kernels


@pytest.fixture(autouse=True)
def kernels():
    require_kernels()
    if not native_kernels.fma_attention_fits(torch.device("cpu"), 9, 3, 64):
        with pytest.raises(ValueError, match="use torch's attention"):
            native_kernels.attention_pool("fma", torch.zeros(1, 9, 64), torch.zeros(2, 3, 64), torch.zeros(2, 3, 64),
                                              torch.tensor([1]), 0.125)
        pytest.skip("these kernels were built without AVX-512: fma_attention refuses, as checked")


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
def test_fma_attention_is_exact_attention_to_fp32_rounding(n, m, heads, kv_heads, d, bf16):
    q, k_buf, v_buf, slots = pool_case(n, m, heads, kv_heads, d, seed=n * 7 + m, bf16=bf16)
    out = native_kernels.attention_pool("fma", q, k_buf, v_buf, slots, d ** -0.5)
    assert out.shape == (n, heads, d) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), exact(q, k_buf.float(), v_buf.float(), slots), atol=3e-6, rtol=0)


@pytest.mark.parametrize("m,n", [(1500, 100), (1300, 1300), (600, 64)])
def test_a_rows_result_is_the_same_bits_however_its_prompt_is_chunked(m, n):
    """The last n queries whole, then in chunks of 1, 2, 3, 31, 32, 33 ... tokens, each after the keys before it:
    short chunks run as key segments, long ones as query blocks, and every row comes out the same bits."""
    q, k_buf, v_buf, slots = pool_case(n, m, 9, 3, 64, seed=m + n)
    whole = native_kernels.attention_pool("fma", q, k_buf, v_buf, slots, 0.125)
    pieces, at, sizes = [], 0, [1, 2, 3, 31, 32, 33, 5, 100, 7]
    while at < n:
        c = min(sizes[len(pieces) % len(sizes)], n - at)
        pieces.append(native_kernels.attention_pool("fma", q[at:at + c], k_buf, v_buf, slots[:m - n + at + c], 0.125))
        at += c
    assert torch.equal(torch.cat(pieces), whole)


def test_bad_inputs_are_refused_with_what_to_change():
    q, k_buf, v_buf, slots = pool_case(4, 8, 9, 3, 64, seed=1)
    with pytest.raises(ValueError, match="at least as many keys as queries"):
        native_kernels.attention_pool("fma", q, k_buf, v_buf, slots[:3], 0.125)
    with pytest.raises(ValueError, match="slots must lie in 0 .. 16"):
        native_kernels.attention_pool("fma", q, k_buf, v_buf, slots + 100, 0.125)
    with pytest.raises(ValueError, match="positive finite scale"):
        native_kernels.attention_pool("fma", q, k_buf, v_buf, slots, float("nan"))
    with pytest.raises(ValueError, match="head_dim a multiple of 16"):
        native_kernels.attention_pool("fma", torch.zeros(1, 9, 24), torch.zeros(2, 3, 24), torch.zeros(2, 3, 24),
                                          torch.tensor([1]), 0.2)
    with pytest.raises(ValueError, match="fp32 CPU q"):
        native_kernels.attention_pool("fma", q.double(), k_buf, v_buf, slots, 0.125)
