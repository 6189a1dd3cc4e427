"""One order of sums (int8 on AVX-512 without AMX, or on AVX2 with w8a16_gemm; native_llama.one_order): a token's K/V and logits are the same
bits whether it was decoded (alone, beside other decodes, beside a prompt chunk, in one C call or the Python loop)
or prefilled (whole, in chunks, after a cached prefix). That is what keeps cache on == cache off exact with a bf16
pool, whose rounding would otherwise turn last-bit differences into whole bf16 steps. On a CPU with AMX, set_amx(False) runs what a CPU without it runs; each test runs with the x16 arithmetic and with w8a16_gemm's (int16 activations,
exact integer sums, where the CPU has AVX512-VNNI or AVX2)."""
from __future__ import annotations

import pytest
import torch

from core.engine.engine import Engine
from core.engine.model import native_int8, native_kernels, pool_attention
from core.engine.model.forward_batch import ForwardBatch
from core.engine.model.native_llama import NativeLlama
from core.engine.model.runner import ModelRunner
from core.engine.sampling import SamplingParams
from tests.engine.model.require_kernels import require_kernels
from tests.engine.model.test_decode_layers import make_ref as decode_layers_ref


@pytest.fixture(autouse=True, params=[False, True], ids=["x16", "a16-where-vnni"])
def no_amx(request):
    """Kernels built, AMX off (a CPU without it), either arithmetic: x16 on the panels, or w8a16_gemm's exact
    integer sums (where the CPU has AVX512-VNNI; elsewhere x16 again); fma_attention runs every row."""
    require_kernels()
    previous = native_kernels.set_amx(False)
    request.addfinalizer(lambda: native_kernels.set_amx(previous))
    previous_a16 = native_int8.set_w8a16(request.param)
    request.addfinalizer(lambda: native_int8.set_w8a16(previous_a16))


def make_ref(seed: int = 0) -> torch.nn.Module:
    return decode_layers_ref(seed, max_position_embeddings=1024)   # 3 layers, 6 heads over 2 KV heads of 32


def one_order_here(native: NativeLlama) -> bool:
    """Whether this CPU runs one order: fma_attention for every chunk (AVX-512, or AVX2's lanes path) and every
    projection off the plain matrix (on AVX-512 panels, or w8a16_gemm's exact sums); the model with a bf16 pool
    says so. AVX2 with the x16 arithmetic runs prompt rows on a matrix, so not one order there."""
    fma = pool_attention.prefill_kernel(torch.device("cpu"), native.num_heads, native.num_kv_heads,
                                        native.head_dim) == "fma"
    panels = fma and native_kernels.built().panel_gemm_fast()   # AVX-512 without AMX: every projection on panels
    assert native.kv_dtype is torch.bfloat16 and native.one_order == (fma and (panels or native.a16))
    assert [lin.matrix is None for L in native.layers for lin in (L.qkv, L.o, L.gate_up, L.down)] == \
        [panels or native.a16] * 4 * len(native.layers)
    return native.one_order


PROMPT = torch.randint(1, 160, (600,), generator=torch.Generator().manual_seed(2)).tolist()
OTHER = torch.randint(1, 160, (45,), generator=torch.Generator().manual_seed(3)).tolist()
SLOTS = torch.randperm(1500, generator=torch.Generator().manual_seed(4)) + 1   # scattered, as a radix pool's


def decode_by_steps(native: NativeLlama, pool, steps: int, company: bool, one_call: bool) -> list[int]:
    """PROMPT prefilled, then `steps` greedy tokens one decode step at a time (beside OTHER's decode when
    `company`; its prefill is a mixed step's chunk beside the first decode); PROMPT's tokens at SLOTS[:n]."""
    layers = native.decode_layers
    native.decode_layers = layers if one_call else None
    try:
        logits = native.forward(ForwardBatch.build([(PROMPT, [], SLOTS[:600])]), pool)
        out = [int(logits[-1].argmax())]
        other = SLOTS[1000:1060]
        other_len = 0
        for i in range(steps - 1):
            n = 600 + i
            reqs = [([out[-1]], SLOTS[:n], SLOTS[n:n + 1])]
            if company and i == 0:   # a prompt chunk beside the decode: a mixed step
                reqs.append((OTHER[:40], [], other[:40]))
                other_len = 40
            elif company:
                reqs.append(([OTHER[other_len % 45]], other[:other_len], other[other_len:other_len + 1]))
                other_len += 1
            batch = ForwardBatch.build(reqs, prompt=[False, True] if company and i == 0 else None)
            logits = native.forward(batch, pool)
            out.append(int(logits[0].argmax()))
        return out
    finally:
        native.decode_layers = layers


def prefill_in_chunks(native: NativeLlama, pool, ids: list[int], cuts: list[int]) -> torch.Tensor:
    """ids prefilled at SLOTS[:len] in chunks ending at `cuts` (then the rest): the last chunk's last logits."""
    start = 0
    for end in cuts + [len(ids)]:
        logits = native.forward(ForwardBatch.build([(ids[start:end], SLOTS[:start], SLOTS[start:end])],
                                                   prompt=[True]), pool)
        start = end
    return logits[-1]


@pytest.mark.parametrize("company,one_call", [(False, True), (True, True), (True, False)],
                         ids=["alone-one-call", "with-company-one-call", "with-company-python-loop"])
def test_decoded_tokens_have_the_bits_a_prefill_of_the_same_tokens_gives(company, one_call):
    native = NativeLlama.from_hf(make_ref(), dtype="int8", kv_dtype="bf16")
    if not one_order_here(native):
        pytest.skip("this CPU runs no one-order kernels: the model keeps its own path, as checked")
    assert native.decode_layers is not None
    pool = native.make_pool(1600)
    out = decode_by_steps(native, pool, 12, company, one_call)
    n = 600 + len(out) - 1                           # tokens whose K/V the pool now holds at SLOTS[:n]
    ids = PROMPT + out[:-1]
    for cuts in ([], [7, 300, 601], [599, 605]):    # whole; chunks across the prompt and decoded tokens
        fresh = native.make_pool(1600)
        last = prefill_in_chunks(native, fresh, ids, cuts)
        assert int(last.argmax()) == out[-1]
        at = SLOTS[:n]
        assert torch.equal(fresh.k_buffer[:, at], pool.k_buffer[:, at]), cuts
        assert torch.equal(fresh.v_buffer[:, at], pool.v_buffer[:, at]), cuts
    assert fresh.k_buffer.dtype is torch.bfloat16


def test_an_fp32_pool_keeps_the_decode_kernels():
    """One order costs decode speed (fma_attention's arithmetic for decode rows): only a bf16 pool, where it
    matters, takes it. The projections stay on w8_gemv, or on w8a16_gemm where it runs (any order is its order)."""
    for kv in (None, "fp32"):
        native = NativeLlama.from_hf(make_ref(), dtype="int8", kv_dtype=kv)
        assert not native.one_order and native.kv_dtype is torch.float32
        lins = [lin for L in native.layers for lin in (L.qkv, L.o, L.gate_up, L.down)]
        assert native.a16 == native_int8.w8a16_enabled()
        assert all((lin.a16, lin.matrix is None) == (native.a16, native.a16) for lin in lins)


def test_cache_on_and_off_give_the_same_tokens_over_two_turns_with_a_bf16_pool():
    """A second turn reuses K/V computed in the first turn's decode steps: the same tokens with and without the
    radix cache, turn after turn (requests batched together, prompts of 20-300 tokens)."""
    runner = ModelRunner.from_hf(make_ref(5), device="cpu", impl="native", numerics="int8", kv_cache_dtype="bf16")
    if not one_order_here(runner.native):
        pytest.skip("this CPU runs no one-order kernels: the model keeps its own path, as checked")
    outs = {on: two_turns(runner, on) for on in (True, False)}
    assert outs[True] == outs[False]


def two_turns(runner: ModelRunner, cache_on: bool) -> tuple[list, list]:
    """Four prompts sharing a 250-token system prompt, 16 greedy tokens each, then each conversation's second
    turn: (first turns' tokens, second turns' tokens), with the radix cache on or off."""
    g = torch.Generator().manual_seed(9)
    system = torch.randint(1, 160, (250,), generator=g).tolist()
    first = [system + torch.randint(1, 160, (n,), generator=g).tolist() for n in (3, 20, 41, 50)]
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    engine = Engine(runner, pool_slots=4096, disable_radix_cache=not cache_on)
    turn1 = [c.token_ids for c in engine.generate(first, params)]
    done = engine.generate([p + o + [7, 8, 9] for p, o in zip(first, turn1)], params)
    # cache on: each second turn hit its first turn's prompt and decoded tokens (all but the last, whose K/V were
    # never computed); off: nothing
    assert [c.cached_tokens for c in done] == ([len(p) + 15 for p in first] if cache_on else [0] * 4)
    return turn1, [c.token_ids for c in done]
