"""Extends attended in padded groups (core.engine.model.hf_attention.ExtendGroup) against stock transformers.

Several extends with cached prefixes of different lengths, plus fresh prompts and decodes, in one
batch: every request's logits must equal a full recompute by the eager model, window included.
"""
from __future__ import annotations

import pytest
import torch

from core.engine.model.hf_attention import ForwardBatch
from tests.engine.model.test_hf_attention import ATOL, FAMILIES, NUM_SLOTS, _ids, _reference, _shuffled_slots, _tiny


@pytest.mark.parametrize("family", list(FAMILIES))
def test_grouped_extends_match_full_recompute(family):
    ref, runner = _tiny(family)
    pool = runner.make_pool(NUM_SLOTS)
    slots = _shuffled_slots(NUM_SLOTS, seed=11)
    # (cached prefix, new tokens): similar shapes are grouped, the decode and the long fresh one are not
    shapes = [(9, 6), (12, 5), (10, 6), (0, 6), (0, 5), (14, 1), (0, 20)]
    seqs, reqs, used = [], [], 0
    for i, (p, n) in enumerate(shapes):
        ids, sl = _ids(p + n, seed=20 + i), slots[used:used + p + n]
        used += p + n
        if p:
            runner.forward(ForwardBatch.build([(ids[:p], [], sl[:p])]), pool)
        seqs.append(ids)
        reqs.append((ids[p:], sl[:p], sl[p:]))
    batch = ForwardBatch.build(reqs)
    assert batch.extend_groups, "similar extends should share one padded call"
    grouped = {r for g in batch.extend_groups for r in g.rows}
    assert 6 not in grouped and 5 not in grouped  # the long fresh prefill alone; the decode with the decodes
    logits = runner.forward(batch, pool)
    expected = torch.stack([_reference(ref, s)[-1] for s in seqs])
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_every_token_of_a_group_is_exact():
    """Not just the last token: the logits at every position of grouped extends (logits_to_keep=all)."""
    ref, runner = _tiny("mistral")  # sliding window 8, crossed by the prefixes below
    pool = runner.make_pool(NUM_SLOTS)
    slots = _shuffled_slots(NUM_SLOTS, seed=12)
    a, b = _ids(19, seed=31), _ids(16, seed=32)
    sa, sb = slots[:19], slots[19:35]
    runner.forward(ForwardBatch.build([(a[:12], [], sa[:12]), (b[:10], [], sb[:10])]), pool)
    batch = ForwardBatch.build([(a[12:], sa[:12], sa[12:]), (b[10:], sb[:10], sb[10:])])
    assert len(batch.extend_groups) == 1
    batch.logits_indices = torch.arange(batch.num_tokens)
    logits = runner.forward(batch, pool)
    expected = torch.cat([_reference(ref, a)[12:], _reference(ref, b)[10:]])
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_decodes_sharing_a_prefix_match_full_recompute(family):
    """Three decodes on one cached prefix (the same slots, as radix-tree hits), another pair on a
    second prefix, a plain decode and an extend, in one batch: shared-prefix attention is exact."""
    ref, runner = _tiny(family)
    pool = runner.make_pool(4 * NUM_SLOTS)
    free = iter((_shuffled_slots(NUM_SLOTS, seed=13).tolist() + list(range(NUM_SLOTS + 1, 4 * NUM_SLOTS + 1))))
    take = lambda n: torch.tensor([next(free) for _ in range(n)])  # noqa: E731
    prefixes = [(_ids(40, seed=40), take(40)), (_ids(36, seed=41), take(36))]
    for ids, sl in prefixes:
        runner.forward(ForwardBatch.build([(ids, [], sl)]), pool)
    seqs, reqs = [], []
    for j, (which, own) in enumerate([(0, 5), (0, 3), (0, 7), (1, 4), (1, 2)]):
        ids, sl = prefixes[which]
        tail, tail_slots = _ids(own, seed=50 + j), take(own)
        if own > 1:
            runner.forward(ForwardBatch.build([(tail[:-1], sl, tail_slots[:-1])]), pool)
        seqs.append(torch.cat([ids, tail]))
        reqs.append((tail[-1:], torch.cat([sl, tail_slots[:-1]]), tail_slots[-1:]))
    alone, alone_slots = _ids(45, seed=60), take(45)  # a decode that shares nothing
    runner.forward(ForwardBatch.build([(alone[:-1], [], alone_slots[:-1])]), pool)
    seqs.append(alone)
    reqs.append((alone[-1:], alone_slots[:-1], alone_slots[-1:]))
    ext, ext_slots = _ids(12, seed=61), take(12)
    seqs.append(ext)
    reqs.append((ext, [], ext_slots))
    batch = ForwardBatch.build(reqs)
    sd = batch.shared_decodes
    assert sd is not None and sd.num_groups == 2 and sd.prefix_len == 40 and sd.members == 3
    logits = runner.forward(batch, pool)
    expected = torch.stack([_reference(ref, s)[-1] for s in seqs])
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)
