"""NativeLlama (core/engine/model/native_llama.py) against stock Hugging Face models: logits, greedy tokens, and the
engine paths (chunked prefill, mixed decode/extend batches, pages, the radix cache), on tiny random
models of every supported family, plus one check on the real default model.

Tolerances: fp32 native vs HF eager differ by ~1e-7 on these tiny models (different op order in
attention and the GEMV kernels); 1e-5 leaves room for other BLAS builds and still catches any
masking, RoPE or slot mistake (those move logits by 1e-2 or more).
"""
from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from core import env
from core.engine.model import native_kernels
from core.engine.engine import Engine
from core.engine.model.forward_batch import ForwardBatch
from core.engine.model.runner import ModelRunner
from core.engine.model.native_layers import rope_tables
from core.engine.model.native_llama import NativeLlama
from core.engine.model.native_support import unsupported_reason
from core.engine.sampling import SamplingParams
from tests.engine.model.require_kernels import require_kernels
from tests.tiny_models import CONFIGS, TINY, reference_greedy

ATOL = 1e-5
# Prompts avoid token 0: it is the pad token, and HF generate would mask it out of the prompt.

EXTRA = {
    "llama-tied-bias": lambda: LlamaConfig(**TINY, tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
    "llama3-rope": lambda: LlamaConfig(**TINY, rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "qwen2-sliding-layers": lambda: Qwen2Config(**{**TINY, "num_hidden_layers": 3}, use_sliding_window=True,
                                                sliding_window=8, max_window_layers=1),
}
ALL = {**CONFIGS, **EXTRA}


def make_ref(family: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = ALL[family]()
    cfg.eos_token_id = None
    ref = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ref.generation_config.eos_token_id = None
    ref.generation_config.pad_token_id = 0
    return ref


@pytest.fixture(scope="module", params=list(ALL))
def pair(request):
    ref = make_ref(request.param)
    return request.param, ref, NativeLlama.from_hf(ref)


def hf_last_logits(ref, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0, -1]


def native_greedy(native: NativeLlama, prompt: list[int], n: int, slots: torch.Tensor) -> list[int]:
    pool = native.make_pool(int(slots.max()) + 1)
    p = len(prompt)
    logits = native.forward(ForwardBatch.build([(prompt, [], slots[:p])]), pool)
    out = []
    for i in range(n):
        out.append(int(logits[0].argmax()))
        logits = native.forward(ForwardBatch.build([([out[-1]], slots[:p + i], slots[p + i:p + i + 1])]), pool)
    return out


def test_logits_match_hf_fresh_and_cached(pair):
    family, ref, native = pair
    ids = torch.randint(1, 128, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    slots = torch.randperm(300, generator=torch.Generator().manual_seed(2))[:40] + 1   # scattered slots
    expected = hf_last_logits(ref, ids)
    pool = native.make_pool(301)
    got = native.forward(ForwardBatch.build([(ids, [], slots)]), pool)
    torch.testing.assert_close(got[0], expected, atol=ATOL, rtol=0)
    pool = native.make_pool(301)
    native.forward(ForwardBatch.build([(ids[:23], [], slots[:23])]), pool)
    got = native.forward(ForwardBatch.build([(ids[23:], slots[:23], slots[23:])]), pool)   # cached prefix
    torch.testing.assert_close(got[0], expected, atol=ATOL, rtol=0)


def test_greedy_equals_hf_generate(pair):
    family, ref, native = pair
    prompt = torch.randint(1, 128, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    slots = torch.randperm(200, generator=torch.Generator().manual_seed(4))[:50] + 1
    assert native_greedy(native, prompt, 16, slots) == reference_greedy(ref, prompt, 16)


def test_chunked_prefill_equals_whole(pair):
    family, ref, native = pair
    ids = torch.randint(1, 128, (37,), generator=torch.Generator().manual_seed(5)).tolist()
    slots = torch.arange(1, 38)
    whole_pool, chunk_pool = native.make_pool(40), native.make_pool(40)
    whole = native.forward(ForwardBatch.build([(ids, [], slots)]), whole_pool)
    for a, b in ((0, 10), (10, 11), (11, 30), (30, 37)):     # chunks of 10, 1 (a decode), 19, 7 tokens
        last = native.forward(ForwardBatch.build([(ids[a:b], slots[:a], slots[a:b])]), chunk_pool)
    torch.testing.assert_close(last, whole, atol=ATOL, rtol=0)
    torch.testing.assert_close(chunk_pool.k_buffer, whole_pool.k_buffer, atol=ATOL, rtol=0)
    torch.testing.assert_close(chunk_pool.v_buffer, whole_pool.v_buffer, atol=ATOL, rtol=0)


def test_mixed_batch_equals_requests_alone(pair):
    """Decodes, a cached-prefix extend and a fresh extend in one forward; each row equals its
    request run alone (and HF on the full sequence)."""
    family, ref, native = pair
    g = torch.Generator().manual_seed(6)
    seqs = [torch.randint(1, 128, (n,), generator=g).tolist() for n in (21, 34, 15, 9, 26)]
    pool = native.make_pool(200)
    slots, start = [], 1
    for s in seqs:
        slots.append(torch.arange(start, start + len(s)))
        start += len(s) + 3
    # state before the mixed step: seq 0, 1: all but the last token cached (they decode);
    # seq 2: 6 tokens cached (it extends 9); seq 3: nothing (fresh extend); seq 4: 25 cached (decode)
    cached = [20, 33, 6, 0, 25]
    for s, sl, c in zip(seqs, slots, cached):
        if c:
            native.forward(ForwardBatch.build([(s[:c], [], sl[:c])]), pool)
    batch = ForwardBatch.build([(s[c:], sl[:c], sl[c:]) for s, sl, c in zip(seqs, slots, cached)])
    assert batch.decode_rows == [0, 1, 4] and batch.extend_rows == [2, 3]
    mixed = native.forward(batch, pool)
    for r, s in enumerate(seqs):
        torch.testing.assert_close(mixed[r], hf_last_logits(ref, s), atol=ATOL, rtol=0)


def test_padded_extends_equal_alone(pair):
    """Several cached-prefix extends of different lengths share one padded attention call."""
    family, ref, native = pair
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(1, 128, (n,), generator=g).tolist() for n in (30, 28, 33)]
    cached = [22, 20, 26]
    pool = native.make_pool(120)
    slots = [torch.arange(1 + 40 * i, 1 + 40 * i + len(s)) for i, s in enumerate(seqs)]
    for s, sl, c in zip(seqs, slots, cached):
        native.forward(ForwardBatch.build([(s[:c], [], sl[:c])]), pool)
    out = native.forward(ForwardBatch.build([(s[c:], sl[:c], sl[c:]) for s, sl, c in zip(seqs, slots, cached)]), pool)
    for r, s in enumerate(seqs):
        torch.testing.assert_close(out[r], hf_last_logits(ref, s), atol=ATOL, rtol=0)


def test_kernels_and_torch_fallback_agree(pair):
    """The C kernels (decode attention, fused norms) and the torch fallbacks give the same logits."""
    require_kernels()
    family, ref, native = pair
    prompt = torch.randint(1, 128, (25,), generator=torch.Generator().manual_seed(8)).tolist()
    slots = torch.randperm(100, generator=torch.Generator().manual_seed(9))[:40] + 1
    with_kernels = native_greedy(native, prompt, 10, slots)
    previous = native_kernels.set_enabled(False)
    try:
        without = native_greedy(native, prompt, 10, slots)
        pool = native.make_pool(101)
        native.forward(ForwardBatch.build([(prompt, [], slots[:25])]), pool)
        step = ForwardBatch.build([([with_kernels[0]], slots[:25], slots[25:26])])
        torch_logits = native.forward(step, pool)
    finally:
        native_kernels.set_enabled(previous)
    pool = native.make_pool(101)
    native.forward(ForwardBatch.build([(prompt, [], slots[:25])]), pool)
    kernel_logits = native.forward(step, pool)
    assert with_kernels == without
    torch.testing.assert_close(kernel_logits, torch_logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("attention", ["sdpa", "sum"])
def test_decode_step_fn_equals_forward(pair, attention):
    """The pure decode step (what CUDA graphs capture and torch.compile traces) equals forward() on a
    batch of two decodes of different lengths, padded to one slot table."""
    family, ref, native = pair
    ids = list(range(1, 31))
    pool = native.make_pool(200)
    slots = [torch.arange(1, 40), torch.arange(50, 90)]
    for sl in slots:
        native.forward(ForwardBatch.build([(ids, [], sl[:30])]), pool)
    saved = pool.k_buffer.clone(), pool.v_buffer.clone()
    eager = native.forward(ForwardBatch.build([([5], slots[0][:30], slots[0][30:31]),
                                               ([7], slots[1][:20], slots[1][20:21])]), pool)
    pool.k_buffer.copy_(saved[0])
    pool.v_buffer.copy_(saved[1])
    table = torch.zeros((2, 31), dtype=torch.int64)
    table[0] = slots[0][:31]
    table[1, :21] = slots[1][:21]
    with torch.inference_mode():
        got = native.decode_step_fn(attention)(torch.tensor([5, 7]), torch.tensor([30, 20]),
                                               torch.stack([slots[0][30], slots[1][20]]), table,
                                               torch.tensor([31, 21]), pool.k_buffer, pool.v_buffer)
    torch.testing.assert_close(got, eager, atol=ATOL, rtol=0)


def _prompts(n: int, shared: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(1, 128) for _ in range(shared)]
    return [system + [rng.randrange(1, 128) for _ in range(rng.randrange(1, 12))] for _ in range(n)]


@pytest.mark.parametrize("family", list(CONFIGS))
@pytest.mark.parametrize("page_size", [1, 16])
def test_engine_native_equals_generate(family, page_size):
    """Through the Engine: requests arrive one per step (extends mixed with decodes), a small
    prefill budget chunks prompts, the radix cache serves the shared prefix; cache on == cache off
    == HF generate, token for token."""
    ref = make_ref(family)
    runner = ModelRunner.from_hf(copy.deepcopy(ref), device=env.test_device(), impl="native",  # gpu_check.sh: cuda
                                 numerics="fp32")
    prompts = _prompts(4, shared=20, seed=1)
    outs = {}
    for disable in (False, True):
        e = Engine(runner, pool_slots=640, page_size=page_size, max_prefill_tokens=16, disable_radix_cache=disable)
        handles = []
        for p in prompts:
            handles.append(e.submit(p, SamplingParams(max_new_tokens=8)))
            e.step()
        while e.has_work():
            e.step()
        e.check_invariants()
        outs[disable] = [h.result(0).token_ids for h in handles]
        if not disable:
            assert sum(h.result(0).cached_tokens for h in handles) > 0   # the prefix was served from cache
    assert outs[False] == outs[True]
    assert outs[False] == [reference_greedy(ref, p, 8) for p in prompts]


def test_refuses_what_it_cannot_run():
    torch.manual_seed(0)
    dyn = AutoModelForCausalLM.from_config(LlamaConfig(**TINY, rope_parameters={
        "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}))
    assert "rope type 'dynamic'" in unsupported_reason(dyn)
    with pytest.raises(ValueError, match="Hugging Face path"):
        NativeLlama.from_hf(dyn)
    with pytest.raises(ValueError, match="dtype"):
        NativeLlama.from_hf(make_ref("llama"), dtype="fp16")
    native = NativeLlama.from_hf(make_ref("llama"), dtype="bf16")
    with pytest.raises(ValueError, match="make the pool with NativeLlama.make_pool"):
        native.forward(ForwardBatch.build([([1, 2], [], [1, 2])]), NativeLlama.from_hf(make_ref("llama")).make_pool(8))


def test_default_model_greedy_matches_generate():
    """SmolLM2-135M-Instruct (30 layers, GQA 9/3, tied embeddings): native fp32 == HF generate."""
    from core.engine.model.loader import resolve_model
    from transformers import AutoTokenizer
    path = resolve_model("default")
    stock = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    stock.generation_config.eos_token_id = None
    native = NativeLlama.from_hf(stock)   # reads the weights; the stock model stays as it was
    prompt = AutoTokenizer.from_pretrained(path).apply_chat_template(
        [{"role": "user", "content": "What is a radix tree?"}], add_generation_prompt=True, tokenize=True,
        return_dict=True)["input_ids"]
    n = 12
    with torch.inference_mode():
        expected = stock.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                                  pad_token_id=0)[0, len(prompt):].tolist()
    assert native_greedy(native, prompt, n, torch.arange(1, len(prompt) + n + 1)) == expected


def test_loading_the_kernels_keeps_subnormal_floats_for_the_whole_process():
    """The C kernels are built without -ffast-math: linking with it turns on flush-to-zero process-wide
    at load time, and then numpy, hypothesis and plain Python floats lose every subnormal."""
    import subprocess
    import sys
    code = ("import sys; from core.engine.model import native_kernels as k; ok = k.available(); "
            "x = sys.float_info.min; print(ok, x / 2 != 0.0, x / 2)")
    require_kernels()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "True", "the native kernels did not load in a fresh process"
    assert out[1] == "True", f"sys.float_info.min / 2 gave {out[2]} after the kernels loaded"


def test_rope_tables_grow_with_the_positions_run_not_the_models_limit():
    """A 1M-position config loads 4,096 RoPE rows (the whole table was 986 MB for a Qwen2.5-1M); a prompt
    past them doubles the table, and its logits still equal HF's, the rows the same bits as a full table."""
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(LlamaConfig(**{**TINY, "max_position_embeddings": 1_000_000}),
                                           attn_implementation="eager").eval()
    native = NativeLlama.from_hf(ref)
    assert native.cos.shape[0] == 4096 and native.max_positions == 1_000_000
    ids = [random.Random(1).randrange(1, 128) for _ in range(4500)]
    pool = native.make_pool(4600)
    got = native.forward(ForwardBatch.build([(ids, [], torch.arange(1, 4501))]), pool)[0]
    assert native.cos.shape[0] == 8192
    torch.testing.assert_close(got, hf_last_logits(ref, ids), atol=ATOL, rtol=0)
    rotary = ref.model.rotary_emb                               # the table built whole at once
    cos, sin = rope_tables(rotary.inv_freq, float(rotary.attention_scaling), 8192, torch.float32)
    assert torch.equal(native.cos, cos) and torch.equal(native.sin, sin)
    again = NativeLlama.from_hf(ref, max_positions=8192)
    with pytest.raises(ValueError, match="position 8192 is past the model's 8192 positions"):
        again.forward(ForwardBatch.build([([5], torch.arange(1, 8193), torch.tensor([8193]))]), again.make_pool(8200))


def test_auto_says_why_a_model_leaves_the_native_path_and_swish_stays_on_it(capsys):
    """A gelu Llama runs on the HF path, and the load says so with the reason (it was silent: a user who
    expected the native path's speed or int8 could not tell). transformers' "swish" is nn.SiLU: native."""
    torch.manual_seed(0)
    gelu = AutoModelForCausalLM.from_config(LlamaConfig(**TINY, hidden_act="gelu"))
    assert ModelRunner.from_hf(gelu, device="cpu").impl == "hf"
    assert capsys.readouterr().err == "model path: hf (the native path cannot run this model: hidden_act 'gelu' " \
                                      "(only silu))\n"
    torch.manual_seed(0)
    cfg = LlamaConfig(**TINY, hidden_act="swish")
    cfg.eos_token_id = None
    ref = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ref.generation_config.eos_token_id, ref.generation_config.pad_token_id = None, 0
    runner = ModelRunner.from_hf(copy.deepcopy(ref), device="cpu", numerics="fp32")
    assert runner.impl == "native" and capsys.readouterr().err == ""
    prompt = [5, 17, 33, 2, 90, 61]
    got = Engine(runner, pool_slots=64).generate([prompt], SamplingParams(max_new_tokens=8))[0].token_ids
    assert got == reference_greedy(ref, prompt, 8)
