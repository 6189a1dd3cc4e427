"""The int8 model's prefill attention on its C kernel (AMX tiles, pool_attention.amx_attention; AVX-512 FMAs
without AMX, fma_attention) inside NativeLlama ("tiles" below, for both): near torch's fp32 attention, the same logits however the prompt is chunked or cached, greedy cache on == cache off through the
Engine, and fp32 mode untouched (still HF's logits). A model with head_dim 64, as SmolLM2's: the tiny models of
the other tests (head_dim 16) do not fit the tiles. With an fp32 pool: over the int8 pool (int8's default where
its kernels run) every attention runs on kv8_attention.c instead (tests/engine/model/test_kv8.py)."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from core.engine.engine import Engine
from core.engine.model import pool_attention
from core.engine.model.forward_batch import ForwardBatch
from core.engine.model.native_llama import NativeLlama
from core.engine.model.runner import ModelRunner
from core.engine.sampling import SamplingParams
from tests.engine.model.require_kernels import require_kernels

ATOL = 1e-5
# K/V that differ by fp32 rounding (~1e-7: a chunk's projections sum in another order) can fall on either side of
# a 16-bit split step of the tiles, so a cached or chunked prompt's logits may move by ~2^-16 of their size
TILES_ATOL = 5e-5
# w8a16_gemm beside torch's attention (a CPU with AVX2 only has no C prefill kernel): attention outputs that differ
# by fp32 rounding between chunkings can round an activation to the neighbouring int16 step (2^-14 of its row's
# largest value), so the logits may move by a few such steps
A16_TORCH_ATOL = 2e-4


@pytest.fixture(autouse=True)
def kernels():
    require_kernels()


def make_ref(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=192, intermediate_size=256, num_hidden_layers=2, num_attention_heads=3,
                      num_key_value_heads=1, vocab_size=128, max_position_embeddings=512)
    cfg.eos_token_id = None
    ref = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ref.generation_config.eos_token_id = None
    return ref


IDS = torch.randint(1, 128, (96,), generator=torch.Generator().manual_seed(4)).tolist()
SLOTS = torch.randperm(120, generator=torch.Generator().manual_seed(5))[:96] + 1


def last_logits(native: NativeLlama, cut: int) -> torch.Tensor:
    """The prompt's last logits: whole (cut 0), or its first `cut` tokens first and the rest after them."""
    pool = native.make_pool(128)
    if cut:
        native.forward(ForwardBatch.build([(IDS[:cut], [], SLOTS[:cut])]), pool)
    return native.forward(ForwardBatch.build([(IDS[cut:], SLOTS[:cut], SLOTS[cut:])]), pool)[-1]


def torch_attention(monkeypatch) -> None:
    monkeypatch.setattr(pool_attention, "prefill_kernel", lambda *a: None)


def tiles_here() -> bool:
    """Whether a C kernel attends the test model's prompt chunks here (its 3 heads over 1 KV head of 64)."""
    return pool_attention.prefill_kernel(torch.device("cpu"), 3, 1, 64) is not None


def chunk_atol(native: NativeLlama, atol: float = TILES_ATOL) -> float:
    """How far a chunked or cached prompt's logits may move here: `atol`, or A16_TORCH_ATOL where w8a16_gemm runs
    beside torch's attention (no C kernel attends this model's prompt chunks)."""
    torch_attention = pool_attention.prefill_kernel(torch.device("cpu"), native.num_heads, native.num_kv_heads,
                                                    native.head_dim) is None
    return A16_TORCH_ATOL if native.a16 and torch_attention else atol


def tile_calls(monkeypatch, native: NativeLlama) -> list:
    """Record each tile attention's query count (the real kernels still run): proof the tiles ran. The Python loop
    calls attention_pool once a layer; a short chunk's step in one C call (DecodeLayers.run: its decodes and one
    chunk) calls the kernel once a layer from C, counted here as that many entries."""
    calls, real = [], pool_attention.attention_pool

    def counted(kernel, q, *rest):
        calls.append(q.shape[0])
        return real(kernel, q, *rest)
    monkeypatch.setattr(pool_attention, "attention_pool", counted)
    if native.decode_layers is not None:
        real_run = native.decode_layers.run

        def run(x, y, cos, sin, out_slots, plan, pool):
            calls.extend(n for _ in range(native.num_layers) for _, n, _ in plan.tiled)
            return real_run(x, y, cos, sin, out_slots, plan, pool)
        monkeypatch.setattr(native.decode_layers, "run", run)
    return calls


def expect_tiles(calls: list, want: list) -> None:
    assert calls == (want if tiles_here() else [])


@pytest.mark.parametrize("cut", [0, 24])   # a fresh prompt, and 72 tokens after a 24-token cached prefix
def test_int8_prefill_attention_on_tiles_stays_near_torch_attention(cut, monkeypatch):
    native = NativeLlama.from_hf(make_ref(), dtype="int8", kv_dtype="fp32")
    here = tiles_here()
    tiles = last_logits(native, cut)
    torch_attention(monkeypatch)
    plain = last_logits(native, cut)
    diff = float((tiles - plain).abs().max() / plain.abs().max())
    if here:
        assert 0 < diff < 1e-3        # another kernel ran (~2^-15 per score on AMX), and moved nothing that matters
    else:
        assert diff == 0              # no tiles here: torch's attention both times


def test_int8_logits_with_tiled_attention_do_not_depend_on_chunking_or_caching(monkeypatch):
    native = NativeLlama.from_hf(make_ref(), dtype="int8", kv_dtype="fp32")
    calls = tile_calls(monkeypatch, native)
    whole = last_logits(native, 0)
    expect_tiles(calls, [96, 96])                          # both layers
    for cut in (7, 17, 40):
        calls.clear()
        torch.testing.assert_close(last_logits(native, cut), whole, atol=chunk_atol(native), rtol=0)
        expect_tiles(calls, [cut, cut, 96 - cut, 96 - cut])


def test_a_one_token_prompt_chunk_is_attended_on_the_tiles_not_as_a_decode(monkeypatch):
    """A full radix hit computes only the prompt's last token: flagged as a prompt row it stays on the tiles, as
    it was inside the whole prompt; unflagged (a decode) it goes to the decode kernel (which, with one order of sums
    where there is no AMX, gives the same bits)."""
    native = NativeLlama.from_hf(make_ref(), dtype="int8", kv_dtype="fp32")
    whole = last_logits(native, 0)
    pool = native.make_pool(128)
    native.forward(ForwardBatch.build([(IDS[:95], [], SLOTS[:95])]), pool)
    calls = tile_calls(monkeypatch, native)
    batch = ForwardBatch.build([(IDS[95:], SLOTS[:95], SLOTS[95:])], prompt=[True])
    assert batch.decode_rows == [0] and batch.prompt_rows == {0}
    last = native.forward(batch, pool)[-1]
    expect_tiles(calls, [1, 1])
    torch.testing.assert_close(last, whole, atol=chunk_atol(native), rtol=0)
    calls.clear()
    as_decode = native.forward(ForwardBatch.build([(IDS[95:], SLOTS[:95], SLOTS[95:])]), pool)[-1]
    assert calls == [] and ForwardBatch.build([([1], [2], [3])]).prompt_rows == frozenset()
    if native.one_order:
        assert torch.equal(as_decode, last)                 # one order of sums: decoded or prefilled, the same bits
    elif tiles_here() and not native.a16:
        assert not torch.equal(as_decode, last)             # the other kernels: ~1e-5 apart (with a16 only the
                                                            # attention's order differs, which may round alike)
    with pytest.raises(ValueError, match="one per request"):
        ForwardBatch.build([([1], [2], [3])], prompt=[True, False])


def test_int8_greedy_with_tiled_attention_is_the_same_with_the_cache_on_and_off(monkeypatch):
    runner = ModelRunner.from_hf(make_ref(1), device="cpu", impl="native", numerics="int8",
                                 kv_cache_dtype="fp32")
    calls = tile_calls(monkeypatch, runner.native)
    g = torch.Generator().manual_seed(6)
    system = torch.randint(1, 128, (70,), generator=g).tolist()
    prompts = [system + torch.randint(1, 128, (int(n),), generator=g).tolist() for n in (5, 40, 17, 33, 1)]
    outs = []
    for disable in (False, True):
        engine = Engine(runner, pool_slots=1024, max_prefill_tokens=48, disable_radix_cache=disable)
        outs.append([c.token_ids for c in engine.generate(prompts, SamplingParams(max_new_tokens=12))])
        assert (engine.metrics.cached_tokens == 0) == disable
    assert outs[0] == outs[1]
    assert (len(calls) > 0) == tiles_here()
    again = Engine(runner, pool_slots=1024, max_prefill_tokens=48)       # a full radix hit: only the last token
    first = again.generate([prompts[0]], SamplingParams(max_new_tokens=12))[0].token_ids
    calls.clear()
    assert again.generate([prompts[0]], SamplingParams(max_new_tokens=12))[0].token_ids == first == outs[0][0]
    expect_tiles(calls[:2], [1, 1])                          # its one prompt token, on the tiles in both layers


def test_fp32_mode_keeps_torch_attention_and_hf_logits():
    ref = make_ref()
    native = NativeLlama.from_hf(ref, dtype="fp32")
    with torch.no_grad():
        want = ref(torch.tensor([IDS])).logits[0, -1]
    for cut in (0, 24):
        torch.testing.assert_close(last_logits(native, cut), want, atol=ATOL, rtol=0)


def test_a_short_extend_beside_a_decode_attends_on_tiles_like_its_prompt_whole(monkeypatch):
    """Every prompt token's attention runs on the tiles, a 3-token extend sharing a step with another
    request's decode included (before, short extends joined the decode kernel's rows: ~1e-5 apart)."""
    native = NativeLlama.from_hf(make_ref(), dtype="int8", kv_dtype="fp32")
    calls = tile_calls(monkeypatch, native)
    whole = last_logits(native, 0)
    pool = native.make_pool(256)
    other = [5, 9, 2, 7]
    other_slots = torch.arange(200, 205)
    native.forward(ForwardBatch.build([(other, [], other_slots[:4])]), pool)
    native.forward(ForwardBatch.build([(IDS[:93], [], SLOTS[:93])]), pool)
    calls.clear()
    mixed = native.forward(ForwardBatch.build([([3], other_slots[:4], other_slots[4:]),
                                               (IDS[93:], SLOTS[:93], SLOTS[93:])]), pool)
    expect_tiles(calls, [3, 3])                              # the extend's 3 tokens; the decode not
    torch.testing.assert_close(mixed[-1], whole, atol=chunk_atol(native), rtol=0)
