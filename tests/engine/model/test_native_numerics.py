"""The native path's reduced numerics (core/engine/model/native_llama.py): bf16 and weight-only int8 near fp32 HF,
the radix cache changing no token within a mode, int8's projections and chunk attention on AMX tiles or, without
AMX, on weight panels and AVX-512 FMAs against the plain kernels, and the KV pool's dtype. fp32's exactness against
HF is test_native_llama.py's."""
from __future__ import annotations

import copy

import pytest
import torch

from core.engine.model import native_int8, native_kernels, pool_attention
from core.engine.engine import Engine
from core.engine.model.forward_batch import ForwardBatch
from core.engine.model.runner import ModelRunner
from core.engine.model.native_llama import NativeLlama
from core.engine.sampling import SamplingParams
from tests.engine.model.require_kernels import require_kernels
from tests.engine.model.test_int8_attention_tiles import chunk_atol
from tests.engine.model.test_native_llama import ATOL, _prompts, hf_last_logits, make_ref


@pytest.mark.parametrize("mode", ["bf16", "int8"])
def test_reduced_numerics_close_and_cache_consistent(mode):
    """bf16 / int8 modes: logits near fp32 HF (no exactness claimed), and within the mode the radix
    cache changes nothing (cache on == cache off through the Engine)."""
    ref = make_ref("llama")
    native = NativeLlama.from_hf(ref, dtype=mode)
    ids = torch.randint(1, 128, (40,), generator=torch.Generator().manual_seed(10)).tolist()
    got = native.forward(ForwardBatch.build([(ids, [], torch.arange(1, 41))]), native.make_pool(48))
    expected = hf_last_logits(ref, ids)
    assert (got[0] - expected).abs().max() < 0.05 * expected.abs().max()
    runner = ModelRunner.from_hf(copy.deepcopy(ref), device="cpu", impl="native", numerics=mode)
    prompts = _prompts(4, shared=24, seed=2)
    outs = []
    for disable in (False, True):
        e = Engine(runner, pool_slots=400, max_prefill_tokens=16, disable_radix_cache=disable)
        outs.append([c.token_ids for c in e.generate(prompts, SamplingParams(max_new_tokens=8))])
    assert outs[0] == outs[1]



@pytest.mark.parametrize("mode", ["fp32", "bf16", "int8"])
def test_a_request_alone_after_a_cached_prefix_completes_in_every_mode(mode):
    """One request at a time, so the second runs alone after its cached prefix (the lone-extend path that attends
    the prefix and its own keys in two calls): it must finish with all its tokens in every mode (in bf16 it used to
    abort on a dtype mismatch after every prefix hit)."""
    ref = make_ref("llama")
    runner = ModelRunner.from_hf(copy.deepcopy(ref), device="cpu", impl="native", numerics=mode)
    e = Engine(runner, pool_slots=400, max_prefill_tokens=64)
    first, second = _prompts(2, shared=24, seed=4)
    done = [e.generate([p], SamplingParams(max_new_tokens=8))[0] for p in (first, second)]
    e.check_invariants()
    assert [(c.error, c.finish_reason, len(c.token_ids)) for c in done] == [(None, "length", 8)] * 2
    assert done[1].cached_tokens >= 24


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_int8_logits_do_not_depend_on_how_the_prompt_was_chunked_or_cached(family):
    """int8 runs every row through one kernel, so a prompt computed whole, in two chunks, or all but its last
    token cached gives the same logits to fp32 rounding (a bf16 GEMM for the many-row chunks moved them by
    ~1e-2 and flipped greedy tokens between cache on and off)."""
    native = NativeLlama.from_hf(make_ref(family), dtype="int8")
    ids = torch.randint(1, 128, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    slots = torch.arange(1, 41)

    def last_logits(cut: int) -> torch.Tensor:
        pool = native.make_pool(48)
        if cut:
            native.forward(ForwardBatch.build([(ids[:cut], [], slots[:cut])]), pool)
        return native.forward(ForwardBatch.build([(ids[cut:], slots[:cut], slots[cut:])]), pool)[-1]

    whole = last_logits(0)
    for cut in (7, 17, 39):   # chunk_atol: a16's int16 steps beside torch's attention
        torch.testing.assert_close(last_logits(cut), whole, atol=chunk_atol(native, ATOL), rtol=0)


@pytest.mark.parametrize("amx", [True, False], ids=["amx-where-present", "no-amx"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_int8_prefill_rows_on_amx_tiles_give_the_fma_kernels_logits(family, amx, monkeypatch, request):
    """A 72-token prompt after a 24-token cached prefix: its projections on AMX tiles (where this CPU has them)
    or on weight panels (no AMX, as set_amx(False) runs it) and its attention on the C kernel (AMX tiles, or
    FMAs without AMX), against every row through the FMA kernel and one masked torch call (AMX_MIN_ROWS, PANEL_MIN_ROWS and the split turned off): the
    same logits to fp32 rounding, and the same K/V written into the pool. (The x16 arithmetic: w8a16_gemm, which a
    CPU with AVX512-VNNI and without AMX runs instead, is test_w8a16.py's.)"""
    from core.engine.model import native_layers, native_linear
    require_kernels()
    previous = native_kernels.set_amx(amx)
    request.addfinalizer(lambda: native_kernels.set_amx(previous))
    previous_a16 = native_int8.set_w8a16(False)
    request.addfinalizer(lambda: native_int8.set_w8a16(previous_a16))
    native = NativeLlama.from_hf(make_ref(family), dtype="int8")
    ids = torch.randint(1, 128, (96,), generator=torch.Generator().manual_seed(4)).tolist()
    slots = torch.randperm(120, generator=torch.Generator().manual_seed(5))[:96] + 1

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        pool = native.make_pool(128)
        native.forward(ForwardBatch.build([(ids[:24], [], slots[:24])]), pool)
        logits = native.forward(ForwardBatch.build([(ids[24:], slots[:24], slots[24:])]), pool)
        return logits[0], pool.k_buffer[:, slots].clone()

    build = native_layers.AttentionPlan.build
    fast_tiled = []

    def spy(batch, row_kernel=False, tiles=False):
        plan = build(batch, row_kernel, tiles)
        fast_tiled.append([(s, n) for s, n, _slots in plan.tiled])
        return plan

    monkeypatch.setattr(native_layers.AttentionPlan, "build", staticmethod(spy))
    fast, fast_k = run()
    # every chunk's attention on the C kernel (AMX tiles, or FMAs without AMX: AVX-512, or AVX2's lanes path), the
    # second after its prefix; kernels built with neither: torch's attention, nothing tiled
    cpu, shape = torch.device("cpu"), (native.num_heads, native.num_kv_heads, native.head_dim)
    kernel = pool_attention.prefill_kernel(cpu, *shape)
    assert kernel == ("amx" if pool_attention.amx_attention_fits(cpu, *shape) else   # tiles: head_dim % 32 == 0
                      "fma" if pool_attention.fma_attention_fits(cpu, *shape) else None)
    assert fast_tiled == ([[(0, 24)], [(0, 72)]] if kernel else [[], []])
    lins = [lin for L in native.layers for lin in (L.qkv, L.o, L.gate_up, L.down)]
    tiles = native_kernels.amx_available()
    on_tiles = [(lin.silu_tiles if lin is L.gate_up else lin.tiles) is not None       # gate_up: with silu fused
                for L in native.layers for lin in (L.qkv, L.o, L.gate_up, L.down)]
    assert on_tiles == [tiles] * len(lins)                                     # the 72 rows ran on tiles, or
    panels = not tiles and native_int8.panels_fit(lins[0].weight)
    assert [lin.panels is not None for lin in lins] == [panels] * len(lins)   # on panels
    split = []

    def without_split(batch, row_kernel=False, tiles=False):
        plan = build(batch, row_kernel, False)    # the plain reference: torch's attention, no C kernel
        if plan.prefixed is not None:
            split.append(plan.prefixed)
            plan.prefixed = None                  # the extend goes through one masked call instead
        return plan

    monkeypatch.setattr(native_linear, "AMX_MIN_ROWS", 10 ** 9)
    monkeypatch.setattr(native_linear, "PANEL_MIN_ROWS", 10 ** 9)
    monkeypatch.setattr(native_layers.AttentionPlan, "build", staticmethod(without_split))
    plain, plain_k = run()
    assert split == [(0, 72, 24)]
    torch.testing.assert_close(fast, plain, atol=ATOL, rtol=0)
    torch.testing.assert_close(fast_k, plain_k, atol=ATOL, rtol=0)


def test_kv_cache_dtype_auto_is_the_activations_dtype_and_bf16_is_one_setting_away():
    """The pool a runner makes holds what its native model writes; an HF-path pool cannot change dtype."""
    ref = make_ref("llama")
    pools = {(mode, kv): ModelRunner.from_hf(copy.deepcopy(ref), device="cpu", impl="native", numerics=mode,
                                             kv_cache_dtype=kv).make_pool(4).dtype
             for mode, kv in [("int8", "auto"), ("int8", "bf16"), ("fp32", "auto"), ("fp32", "bf16"),
                              ("bf16", "auto")]}
    assert pools == {("int8", "auto"): torch.float32, ("int8", "bf16"): torch.bfloat16,
                     ("fp32", "auto"): torch.float32, ("fp32", "bf16"): torch.bfloat16,
                     ("bf16", "auto"): torch.bfloat16}
    with pytest.raises(ValueError, match="only the native path stores K/V in another dtype"):
        ModelRunner.from_hf(copy.deepcopy(ref), device="cpu", impl="hf", numerics="fp32", kv_cache_dtype="bf16")
    with pytest.raises(ValueError, match="choose one of: auto, fp32, bf16"):
        ModelRunner.from_hf(copy.deepcopy(ref), device="cpu", impl="native", kv_cache_dtype="fp8")


@pytest.mark.parametrize("mode", ["fp32", "int8"])
def test_a_bf16_kv_pool_moves_logits_by_bf16_rounding_only(mode):
    """kv_dtype="bf16": K/V are rounded once, when written, and every read (the new tokens' own included) sees
    the rounded values: prefill + decode logits stay within bf16 rounding of the fp32 pool's (the pool's dtype
    is the one asked for, and the logits do move)."""
    ref = make_ref("llama")
    ids = torch.randint(1, 128, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    slots = torch.arange(1, 31)
    logits = {}
    for kv in ("fp32", "bf16"):
        native = NativeLlama.from_hf(ref, dtype=mode, kv_dtype=kv)
        pool = native.make_pool(40)
        assert pool.k_buffer.dtype == (torch.bfloat16 if kv == "bf16" else torch.float32)
        first = native.forward(ForwardBatch.build([(ids[:20], [], slots[:20])]), pool)[-1]
        steps = [native.forward(ForwardBatch.build([([t], slots[:i], slots[i:i + 1])]), pool)[-1]
                 for i, t in enumerate(ids[20:], start=20)]
        logits[kv] = torch.stack([first] + steps)
    diff = (logits["bf16"] - logits["fp32"]).abs().max()
    assert 0 < diff < 0.004 * logits["fp32"].abs().max()     # measured 0.0007x
