"""A decode step's layers in one C call (native_decode.DecodeLayers, decode_layers.c), and a mixed step's (decodes
beside one prompt chunk on AMX tiles): the same logits and the same K/V in the pool, bit for bit, as NativeLlama's
Python loop over the same kernels (below many_rows(), where the loop runs those kernels); steps from max_rows()
rows or with other kernels stay in the loop; bad input refused before anything is written."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen3Config

from core.engine.engine import Engine
from core.engine.model.forward_batch import ForwardBatch
from core.engine.model import pool_attention
from core.engine.model.native_decode import max_rows
from core.engine.model.native_linear import many_rows
from core.engine.model.native_layers import AttentionPlan
from core.engine.model.native_llama import NativeLlama
from core.engine.model.runner import ModelRunner
from core.engine.sampling import SamplingParams
from tests.engine.model.require_kernels import require_kernels


@pytest.fixture(autouse=True)
def kernels():
    require_kernels()


def make_ref(seed: int = 0, **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    kw = dict(hidden_size=192, intermediate_size=256, num_hidden_layers=3, num_attention_heads=6,
              num_key_value_heads=2, vocab_size=160, max_position_embeddings=512)
    kw.update(overrides)
    cfg = LlamaConfig(**kw)
    cfg.eos_token_id = None
    ref = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ref.generation_config.eos_token_id = None
    return ref


def counted(native: NativeLlama) -> list:
    """Count DecodeLayers.run calls (the real one still runs): proof of which path a step took."""
    calls, real = [], native.decode_layers.run

    def run(*args):
        calls.append(args[0].shape[0])
        return real(*args)
    native.decode_layers.run = run
    return calls


PROMPTS = [torch.randint(1, 160, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 37, 70)]


def prefilled(native: NativeLlama, kv_dtype_pool) -> tuple:
    """A pool holding the three prompts (slots scattered), and the decode batch of their next tokens."""
    pool = kv_dtype_pool(native)
    slots = (torch.randperm(400, generator=torch.Generator().manual_seed(1)) + 1).tolist()
    seqs, at = [], 0
    for p in PROMPTS:
        s = torch.tensor(slots[at:at + len(p)])
        at += len(p)
        native.forward(ForwardBatch.build([(p, [], s)]), pool)
        seqs.append(s)
    nxt = torch.tensor(slots[at:at + len(PROMPTS)])
    batch = ForwardBatch.build([([7 + i], seqs[i], nxt[i:i + 1]) for i in range(len(PROMPTS))])
    return pool, batch


@pytest.mark.parametrize("kv", ["fp32", "bf16"])
def test_one_call_decode_step_gives_the_python_loops_logits_and_kv_bit_for_bit(kv):
    native = NativeLlama.from_hf(make_ref(), dtype="int8", kv_dtype=kv)
    assert native.decode_layers is not None
    make = lambda m: m.make_pool(512)   # noqa: E731
    pool_c, batch = prefilled(native, make)
    pool_py, _ = prefilled(native, make)
    calls = counted(native)
    fused = native.forward(batch, pool_c)
    assert calls == [3]
    layers, native.decode_layers = native.decode_layers, None
    loop = native.forward(batch, pool_py)
    native.decode_layers = layers
    assert calls == [3]
    assert torch.equal(fused, loop)
    assert torch.equal(pool_c.k_buffer, pool_py.k_buffer) and torch.equal(pool_c.v_buffer, pool_py.v_buffer)
    assert bool((pool_c.k_buffer[:, batch.out_slots].abs().sum(-1) > 0).all())   # the step's own K/V written


def test_an_int8_pool_one_call_gives_the_loops_logits_kv_and_scales_bit_for_bit():
    native = NativeLlama.from_hf(make_ref(hidden_size=384), dtype="int8", kv_dtype="int8")   # head_dim 64
    assert native.decode_layers is not None and native.kv8
    make = lambda m: m.make_pool(512)   # noqa: E731
    pool_c, batch = prefilled(native, make)
    pool_py, _ = prefilled(native, make)
    calls = counted(native)
    fused = native.forward(batch, pool_c)
    layers, native.decode_layers = native.decode_layers, None
    loop = native.forward(batch, pool_py)
    native.decode_layers = layers
    assert calls == [3] and torch.equal(fused, loop)
    for name in ("k_buffer", "v_buffer", "k_scale", "v_scale"):
        assert torch.equal(getattr(pool_c, name), getattr(pool_py, name)), name
    assert bool((pool_c.k_scale[:, batch.out_slots] > 0).all())       # the step's own scales written


def test_a_new_int8_pool_at_a_freed_pools_kv_addresses_gets_its_own_scales():
    """The one call's address table was keyed on the K/V buffers' addresses alone: a pool allocated where a
    freed one's K/V had been, with its scales elsewhere, had C read and write the freed scales (wrong tokens,
    then a corrupted heap). Here the second pool shares the first's K/V buffers outright."""
    native = NativeLlama.from_hf(make_ref(hidden_size=384), dtype="int8", kv_dtype="int8")
    make = lambda m: m.make_pool(512)   # noqa: E731
    pool_a, batch = prefilled(native, make)
    pool_b, _ = prefilled(native, make)
    pool_b.k_buffer, pool_b.v_buffer = pool_a.k_buffer, pool_a.v_buffer
    calls = counted(native)
    native.forward(batch, pool_a)                                      # the table now names pool_a's addresses
    pool_a.k_scale.zero_()
    pool_a.v_scale.zero_()
    native.forward(batch, pool_b)
    assert calls == [3, 3]
    assert bool((pool_b.k_scale[:, batch.out_slots] > 0).all()) and bool((pool_b.v_scale[:, batch.out_slots] > 0).all())
    assert not pool_a.k_scale.any() and not pool_a.v_scale.any()      # the first pool's scales untouched


def test_greedy_decoding_through_the_engine_is_the_same_tokens_either_way():
    outs = {}
    for on in (True, False):
        runner = ModelRunner.from_hf(make_ref(3), device="cpu", impl="native", numerics="int8")
        calls = counted(runner.native)
        if not on:
            runner.native.decode_layers = None
        engine = Engine(runner, pool_slots=1024)
        outs[on] = [c.token_ids for c in engine.generate(PROMPTS + [PROMPTS[1][:20] + [3, 4]],
                                                         SamplingParams(max_new_tokens=24, ignore_eos=True))]
        assert (len(calls) > 20) == on   # the decode steps took the one call when it was there
    assert outs[True] == outs[False]
    assert all(len(o) == 24 for o in outs[True])


def test_steps_the_loop_runs_on_other_kernels_stay_in_the_loop():
    native = NativeLlama.from_hf(make_ref(), dtype="int8")
    calls = counted(native)
    pool = native.make_pool(512)
    mixed = ForwardBatch.build([(PROMPTS[1], [], torch.arange(1, 38)), ([5], torch.arange(40, 45), torch.tensor([45]))])
    native.forward(mixed, pool)                         # an extend in the batch: prompt attention on other kernels
    rows = max_rows(native.a16)
    many = ForwardBatch.build([([3], torch.tensor([100 + i]), torch.tensor([200 + i])) for i in range(rows)])
    native.forward(many, pool)                          # from max_rows() rows: the loop (tiles or panels)
    assert calls == []
    native.forward(ForwardBatch.build([([3], torch.tensor([100 + i]), torch.tensor([300 + i]))
                                       for i in range(rows - 1)]), pool)
    assert calls == [rows - 1]


def test_models_whose_loop_differs_do_not_get_the_one_call():
    assert NativeLlama.from_hf(make_ref(), dtype="fp32").decode_layers is None        # torch projections
    assert NativeLlama.from_hf(make_ref(), dtype="bf16").decode_layers is None
    torch.manual_seed(0)
    qwen3 = AutoModelForCausalLM.from_config(Qwen3Config(
        hidden_size=192, intermediate_size=256, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
        head_dim=32, vocab_size=160, max_position_embeddings=512), attn_implementation="eager").eval()
    assert NativeLlama.from_hf(qwen3, dtype="int8").decode_layers is None             # q/k norm per head
    torch.manual_seed(0)
    mistral = AutoModelForCausalLM.from_config(MistralConfig(
        hidden_size=192, intermediate_size=256, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
        vocab_size=160, max_position_embeddings=512, sliding_window=16), attn_implementation="eager").eval()
    native = NativeLlama.from_hf(mistral, dtype="int8")
    assert not native.full_attention and native.decode_layers is None                   # a sliding window


def test_out_of_range_out_slots_are_refused_before_anything_is_written():
    native = NativeLlama.from_hf(make_ref(), dtype="int8")
    pool, batch = prefilled(native, lambda m: m.make_pool(512))
    before = pool.k_buffer.clone(), pool.v_buffer.clone()
    x = torch.zeros(3, 192)
    cos = torch.ones(3, 32)
    plan = AttentionPlan.build(batch, row_kernel=True)
    n = pool.k_buffer.shape[1]
    for bad in (torch.tensor([1, 2, n]), torch.tensor([-1, 2, 3]), torch.tensor([1, 2]), torch.tensor([1., 2., 3.])):
        with pytest.raises(ValueError, match="out_slots must be 3 contiguous int64 slots of the pool"):
            native.decode_layers.run(x, x.clone(), cos, cos, bad, plan, pool)
    with pytest.raises(ValueError, match="cos must be contiguous fp32"):
        native.decode_layers.run(x, x.clone(), cos.double(), cos, torch.tensor([1, 2, 3]), plan, pool)
    wide = torch.zeros(3, 200)
    with pytest.raises(ValueError, match="3 rows of 200 for a model of hidden size 192"):
        native.decode_layers.run(wide, wide.clone(), cos, cos, torch.tensor([1, 2, 3]), plan, pool)
    assert torch.equal(pool.k_buffer, before[0]) and torch.equal(pool.v_buffer, before[1])


@pytest.mark.parametrize("one_call", [True, False])
def test_a_decode_steps_logits_do_not_depend_on_the_other_rows_of_the_batch(one_call):
    """Request 0's next-token logits alone and beside a 300-token request: the same bits (each row's decode
    attention splits its keys by its own length), in the one C call and in the Python loop."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)        # the batch-sized chunks it replaced differed here (32 vs 64 keys) on 2 threads
    try:
        check_batch_invariance(one_call)
    finally:
        torch.set_num_threads(threads)


def check_batch_invariance(one_call: bool) -> None:
    native = NativeLlama.from_hf(make_ref(), dtype="int8")
    if not one_call:
        native.decode_layers = None
    pool = native.make_pool(512)
    native.forward(ForwardBatch.build([(PROMPTS[2], [], torch.arange(1, 71))]), pool)
    long_prompt = torch.randint(1, 160, (300,), generator=torch.Generator().manual_seed(9)).tolist()
    native.forward(ForwardBatch.build([(long_prompt, [], torch.arange(100, 400))]), pool)
    a = ([5], torch.arange(1, 71), torch.tensor([71]))
    b = ([6], torch.arange(100, 400), torch.tensor([400]))
    alone = native.forward(ForwardBatch.build([a]), pool)
    both = native.forward(ForwardBatch.build([a, b]), pool)
    assert torch.equal(alone[0], both[0])


def test_a_pool_of_another_shape_is_refused_with_what_to_use():
    native = NativeLlama.from_hf(make_ref(), dtype="int8")
    pool, batch = prefilled(native, lambda m: m.make_pool(512))
    plan = AttentionPlan.build(batch, row_kernel=True)
    other = NativeLlama.from_hf(make_ref(num_key_value_heads=3), dtype="int8").make_pool(512)
    x = torch.zeros(3, 192)
    with pytest.raises(ValueError, match=r"K/V buffers \[3, slots, 2, 32\] in the dtype the model writes \(NativeLlama.make_pool\)"):
        native.decode_layers.run(x, x.clone(), torch.ones(3, 32), torch.ones(3, 32), torch.tensor([1, 2, 3]), plan,
                                 other)


def tiles_here(native: NativeLlama) -> bool:
    """Whether prompt chunks attend on a C kernel here (AMX tiles, or AVX-512 FMAs without AMX)."""
    return pool_attention.prefill_kernel(torch.device("cpu"), native.num_heads, native.num_kv_heads,
                                         native.head_dim) is not None


def mixed_batches(native: NativeLlama, pool) -> list:
    """Steps a long prompt's chunks take beside decoding streams: 2 decodes around a 3-token chunk after 60 cached
    tokens of PROMPTS[2] (the chunk's rows between the decodes), and a 2-token chunk alone."""
    slots = (torch.randperm(400, generator=torch.Generator().manual_seed(1)) + 1).tolist()
    seqs, at = [], 0
    for p in PROMPTS[:2]:
        s = torch.tensor(slots[at:at + len(p)])
        at += len(p)
        native.forward(ForwardBatch.build([(p, [], s)]), pool)
        seqs.append(s)
    long_slots = torch.tensor(slots[at:at + 70])
    native.forward(ForwardBatch.build([(PROMPTS[2][:60], [], long_slots[:60])]), pool)
    nxt = torch.tensor(slots[at + 70:at + 72])
    return [ForwardBatch.build([([7], seqs[0], nxt[:1]), (PROMPTS[2][60:63], long_slots[:60], long_slots[60:63]),
                                ([8], seqs[1], nxt[1:])]),
            ForwardBatch.build([(PROMPTS[2][63:65], long_slots[:63], long_slots[63:65])])]


@pytest.mark.parametrize("kv", ["fp32", "bf16"])
def test_a_mixed_step_in_one_call_gives_the_python_loops_logits_and_kv_bit_for_bit(kv):
    """Decodes beside a short prompt chunk on the C prefill kernel (AMX tiles, or AVX-512 FMAs without AMX), and a
    chunk alone: the one C call gathers the decode rows' queries and attends the chunk as the loop does, so the
    same logits and K/V, bit for bit. Where neither kernel runs such steps attend in torch and stay in the loop."""
    native = NativeLlama.from_hf(make_ref(), dtype="int8", kv_dtype=kv)
    pool_c, pool_py = native.make_pool(512), native.make_pool(512)
    batches_c, batches_py = mixed_batches(native, pool_c), mixed_batches(native, pool_py)
    calls = counted(native)
    fused = [native.forward(b, pool_c) for b in batches_c]
    assert calls == ([5, 2] if tiles_here(native) else [])
    layers, native.decode_layers = native.decode_layers, None
    loop = [native.forward(b, pool_py) for b in batches_py]
    native.decode_layers = layers
    assert all(torch.equal(a, b) for a, b in zip(fused, loop))
    assert torch.equal(pool_c.k_buffer, pool_py.k_buffer) and torch.equal(pool_c.v_buffer, pool_py.v_buffer)
    assert fused[0].shape == (3, 160) and fused[1].shape == (1, 160)


def test_a_mixed_step_from_many_rows_stays_in_the_loop_and_a_bad_plan_is_refused():
    """From many_rows() rows the loop's projections leave w8_gemv, so such a mixed step stays in the loop; a plan
    whose chunk and decodes do not cover the rows once is refused before anything is written."""
    native = NativeLlama.from_hf(make_ref(), dtype="int8")
    if not tiles_here(native):
        return   # no tiled chunks here: test_a_mixed_step_in_one_call_... checks they stay in the loop
    pool = native.make_pool(512)
    calls = counted(native)
    rows = many_rows(native.a16)
    native.forward(ForwardBatch.build([(PROMPTS[1][:rows - 1], [], torch.arange(1, rows)),
                                       ([5], torch.arange(40, 45), torch.tensor([45]))]), pool)
    assert calls == []
    batch = mixed_batches(native, pool)[0]
    plan = AttentionPlan.build(batch, row_kernel=True, tiles=True)
    keys = plan.tiled[0][2]
    before = pool.k_buffer.clone()
    x = torch.zeros(5, 192)
    for bad in ((0, 3, keys), (1, 3, keys[:2]), (1, 3, keys + 1000), (3, 3, keys)):   # overlap, keys, past the rows
        plan.tiled = [bad]
        with pytest.raises(ValueError, match="must cover its rows once"):
            native.decode_layers.run(x, x.clone(), torch.ones(5, 32), torch.ones(5, 32), batch.out_slots, plan, pool)
    plan.tiled, plan.decode_idx = [(1, 3, keys)], torch.tensor([0, 9])                 # a decode row past them
    with pytest.raises(ValueError, match="must cover its rows once"):
        native.decode_layers.run(x, x.clone(), torch.ones(5, 32), torch.ones(5, 32), batch.out_slots, plan, pool)
    assert torch.equal(pool.k_buffer, before)
