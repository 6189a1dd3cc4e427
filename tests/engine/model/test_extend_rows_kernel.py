"""The C kernel's extend runs (decode_attention.c `seg_chunk`): the new tokens of an extend attend as rows of the
decode kernel, each key chunk read once for all of them. Checked against attention written out in torch,
on SmolLM2's shapes (9 query heads over 3 KV heads, head_dim 64), slots in random pool order, prefixes
that cross several 64-key chunks, a run longer than one 16-lane block, a sliding window, and NaN keys, for an
fp32 and a bf16 pool (the reference reads the same bf16 values, widened)."""
from __future__ import annotations

import math
from typing import Optional

import pytest
import torch

from core.engine.model.forward_batch import ForwardBatch
from core.engine.model.native_layers import AttentionPlan, attend_decodes
from tests.engine.model.require_kernels import require_kernels

H, KVH, D = 9, 3, 64


@pytest.fixture(autouse=True)
def kernels():
    require_kernels()


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_slots: torch.Tensor, prefix: int,
              window: Optional[int]) -> torch.Tensor:
    """Token i of an extend (prefix `prefix`) over keys max(0, prefix+i+1-window) .. prefix+i, in float64."""
    out = torch.empty(q.shape, dtype=torch.float64)
    g = H // KVH
    for i in range(q.shape[0]):
        end = prefix + i + 1
        start = 0 if window is None else max(0, end - window)
        keys = seq_slots[start:end]
        kk = k[keys].double().repeat_interleave(g, dim=1)          # [L, H, D]
        vv = v[keys].double().repeat_interleave(g, dim=1)
        s = torch.einsum("hd,lhd->hl", q[i].double(), kk) / math.sqrt(D)
        out[i] = torch.einsum("hl,lhd->hd", torch.softmax(s, dim=-1), vv)
    return out


def run(batch: ForwardBatch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: Optional[int]):
    plan = AttentionPlan.build(batch, row_kernel=True)
    assert plan.extends == [] and plan.fresh is None          # every token went to the kernel
    p = plan.decodes
    qq = q if plan.decode_idx is None else q.index_select(0, plan.decode_idx)
    return p, attend_decodes(p, qq, k, v, window, 1 / math.sqrt(D))


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 40])
def test_extend_runs_and_a_decode_in_one_call_match_attention_written_out(window, kv_dtype):
    g = torch.Generator().manual_seed(0)
    pool = 600
    k = torch.randn(pool, KVH, D, generator=g).to(kv_dtype)
    v = torch.randn(pool, KVH, D, generator=g).to(kv_dtype)
    order = torch.randperm(pool - 1, generator=g) + 1
    # request 0: 150 cached + 7 new (two 16-lane blocks: 5 rows + 2); 1: a decode at 90 keys; 2: 0 + 12 new
    shapes = [(150, 7), (89, 1), (0, 12)]
    reqs, seqs, at = [], [], 0
    for prefix, n in shapes:
        sl = order[at:at + prefix + n]
        at += prefix + n
        seqs.append(sl)
        reqs.append((list(range(1, n + 1)), sl[:prefix], sl[prefix:]))
    batch = ForwardBatch.build(reqs)
    q = torch.randn(batch.num_tokens, H, D, generator=g)
    p, out = run(batch, q, k, v, window)
    assert p.segments is not None and p.segments.tolist() == [0, 7, 8, 20]
    start = 0
    for (prefix, n), sl in zip(shapes, seqs):
        expected = reference(q[start:start + n], k, v, sl, prefix, window)
        torch.testing.assert_close(out[start:start + n].double(), expected, atol=2e-6, rtol=0)
        start += n


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_a_nan_key_poisons_exactly_the_rows_that_attend_to_it(kv_dtype):
    """A NaN in the pool (a poisoned request's K) must come out as NaN where it is attended (the engine then
    fails that request), not vanish in the softmax, and must not touch rows that never see it."""
    g = torch.Generator().manual_seed(1)
    k = torch.randn(400, KVH, D, generator=g).to(kv_dtype)
    v = torch.randn(400, KVH, D, generator=g).to(kv_dtype)
    sl = torch.arange(1, 201)
    k[sl[120]] = float("nan")                 # key and value 120 of the sequence
    v[sl[120]] = float("nan")
    batch = ForwardBatch.build([(list(range(1, 11)), sl[:115], sl[115:125])])   # tokens see keys up to 115..124
    q = torch.randn(10, H, D, generator=g)
    _, out = run(batch, q, k, v, None)
    nan_rows = [i for i in range(10) if torch.isnan(out[i]).any()]
    assert nan_rows == [5, 6, 7, 8, 9]        # token i sees keys 0 .. 115 + i: 120 from i = 5 on
    assert torch.isfinite(out[:5]).all()
    _, windowed = run(batch, q, k, v, 3)       # window 3: token i sees 113+i .. 115+i; 120 for i = 5..7
    assert [i for i in range(10) if torch.isnan(windowed[i]).any()] == [5, 6, 7]
