"""The radix_pool attention against stock transformers, on tiny random models of four families.

Every check compares our pool-backed path (prefix K/V read back from shuffled, non-contiguous
slots) with a full recompute by the unchanged eager model, in fp32.
"""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from core.cache.allocator import SlotAllocator
from core.engine.model.hf_attention import ForwardBatch, radix_pool_attention
from core.engine.model.runner import ModelRunner

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
WINDOW = 8
FAMILIES = {
    "llama": lambda: LlamaConfig(**TINY),
    "qwen2": lambda: Qwen2Config(**TINY),
    "qwen3": lambda: Qwen3Config(**TINY, head_dim=16),
    "mistral": lambda: MistralConfig(**TINY, sliding_window=WINDOW),
    # Sliding window on the second layer only: the window arrives per layer, not per model.
    "qwen2-sliding": lambda: Qwen2Config(**{**TINY, "num_hidden_layers": 3}, use_sliding_window=True,
                                         sliding_window=WINDOW, max_window_layers=1),
}
ATOL = 1e-4
NUM_SLOTS = 128


def _tiny(name: str) -> tuple[torch.nn.Module, ModelRunner]:
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(FAMILIES[name](), attn_implementation="eager").eval()
    return ref, ModelRunner.from_hf(copy.deepcopy(ref), device="cpu", impl="hf")


@pytest.fixture(scope="module", params=list(FAMILIES))
def models(request) -> tuple[torch.nn.Module, ModelRunner]:
    return _tiny(request.param)


def _shuffled_slots(n: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(NUM_SLOTS, generator=gen)[:n] + 1


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (n,), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _reference(ref: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return ref(ids[None]).logits[0]


def test_cached_prefix_extend_matches_full_recompute(models):
    ref, runner = models
    ids, slots = _ids(24, seed=2), _shuffled_slots(24)
    pool = runner.make_pool(NUM_SLOTS)
    first = runner.forward(ForwardBatch.build([(ids[:15], [], slots[:15])]), pool)
    second = runner.forward(ForwardBatch.build([(ids[15:], slots[:15], slots[15:])]), pool)
    full = _reference(ref, ids)
    torch.testing.assert_close(first[0], full[14], atol=ATOL, rtol=0)
    torch.testing.assert_close(second[0], full[23], atol=ATOL, rtol=0)


def test_mixed_batch_extend_and_decodes(models):
    ref, runner = models
    pool = runner.make_pool(NUM_SLOTS)
    slots = _shuffled_slots(NUM_SLOTS, seed=3)
    a, b, c = _ids(20, seed=4), _ids(13, seed=5), _ids(6, seed=6)
    sa, sb, sc = slots[:20], slots[20:33], slots[33:39]
    # Cache a's prefix and all but the last token of b and c.
    runner.forward(ForwardBatch.build([(a[:9], [], sa[:9]), (b[:12], [], sb[:12]), (c[:5], [], sc[:5])]), pool)
    reqs = [(a[9:], sa[:9], sa[9:]), (b[12:], sb[:12], sb[12:]), (c[5:], sc[:5], sc[5:])]
    mixed = runner.forward(ForwardBatch.build(reqs), pool)
    alone = torch.cat([runner.forward(ForwardBatch.build([req]), pool) for req in reqs])
    expected = torch.stack([_reference(ref, seq)[-1] for seq in (a, b, c)])
    torch.testing.assert_close(mixed, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(mixed, alone, atol=ATOL, rtol=0)


def _greedy(runner: ModelRunner, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """The engine's loop in miniature: alloc slots, forward the new tokens, append argmax."""
    alloc = SlotAllocator(64)
    alloc.alloc(7)  # start mid-pool so the slots are not 1..n
    pool = runner.make_pool(64)
    seq_slots = torch.empty(0, dtype=torch.int64)
    pending, out = prompt, []
    for _ in range(new_tokens):
        new = alloc.alloc(pending.numel())
        logits = runner.forward(ForwardBatch.build([(pending, seq_slots, new)]), pool)
        seq_slots = torch.cat([seq_slots, new])
        token = int(logits[0].argmax())
        out.append(token)
        pending = torch.tensor([token])
    return out


def test_greedy_generation_matches_generate(models):
    ref, runner = models
    prompt, n = _ids(10, seed=7), 16  # 26 tokens: well past the window of 8
    with torch.no_grad():
        expected = ref.generate(prompt[None], max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                pad_token_id=0)[0, prompt.numel():].tolist()
    assert _greedy(runner, prompt, n) == expected


def test_sliding_window_actually_bites():
    ref, _ = _tiny("mistral")
    no_window = copy.deepcopy(ref)
    no_window.config.sliding_window = None
    ids = _ids(24, seed=8)
    assert (_reference(ref, ids)[-1] - _reference(no_window, ids)[-1]).abs().max() > 1e-3


def test_build_indexes_requests():
    batch = ForwardBatch.build([([5, 6, 7], [9, 4], [3, 8, 2]), ([1], [10, 11], [12])])
    assert batch.input_ids.tolist() == [5, 6, 7, 1]
    assert batch.positions.tolist() == [2, 3, 4, 2]
    assert batch.out_slots.tolist() == [3, 8, 2, 12]
    assert [s.tolist() for s in batch.seq_slots] == [[9, 4, 3, 8, 2], [10, 11, 12]]
    assert batch.logits_indices.tolist() == [2, 3]
    assert batch.extend_rows == [0] and batch.decode_rows == [1]
    assert batch.decode_slot_table.tolist() == [[10, 11, 12]]


@pytest.mark.parametrize("bad, match", [
    ([([1, 2], [], [3])], "2 new tokens but 1 new slots"),
    ([([], [4], [])], "no new tokens"),
    ([], "at least one request"),
])
def test_build_rejects_bad_requests(bad, match):
    with pytest.raises(ValueError, match=match):
        ForwardBatch.build(bad)


def test_attention_without_batch_says_how_to_call():
    q = torch.zeros(1, 4, 1, 16)
    with pytest.raises(ValueError, match="radix_batch"):
        radix_pool_attention(torch.nn.Module(), q, q[:, :2], q[:, :2], None)
